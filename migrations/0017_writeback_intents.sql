-- agentvisor schema, version 17: parked memory writes.
--
-- A scheduled skill's memory that could not land in its git repository
-- (the push still failed after its retries) waits here with its content
-- until a retry lands it; only then is its row deleted. One row per run
-- and file (`intent_id` = `RUN_ID:PATH`); `seq` (one more than the
-- largest, given by the insert: no SQLite-only AUTOINCREMENT) keeps the
-- order they were parked in, so writes to one file land in the order they were made. The
-- push token is named by its secret (`token_secret`), never stored.
CREATE TABLE writeback_intents (
    intent_id     TEXT    NOT NULL PRIMARY KEY,
    seq           BIGINT  NOT NULL,
    repo          TEXT    NOT NULL,
    path          TEXT    NOT NULL,
    mode          TEXT    NOT NULL,
    content       TEXT    NOT NULL,
    run_id        TEXT    NOT NULL,
    token_secret  TEXT,
    parked_at     BIGINT  NOT NULL,
    attempts      BIGINT  NOT NULL DEFAULT 1,
    last_error    TEXT    NOT NULL DEFAULT ''
);

CREATE INDEX writeback_intents_by_seq ON writeback_intents (seq);
