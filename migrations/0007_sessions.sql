-- agentvisor schema, version 7: chat sessions.
--
-- `sessions` was reserved (and left empty) by version 1; it is made again
-- with the columns the SessionStore port needs. One row per session: its
-- whole metadata as JSON in `meta` (the stored manifest, totals, last run),
-- with the fields one filters or sorts by beside it. `session_messages`
-- holds the history, one row per message, keyed by (session, seq): a seq
-- written twice is refused, so two writers of one session cannot
-- interleave unnoticed.
DROP TABLE IF EXISTS sessions;

CREATE TABLE sessions (
    session_id  TEXT    NOT NULL PRIMARY KEY,
    agent       TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    caller_id   TEXT,
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL,
    prompts     BIGINT  NOT NULL DEFAULT 0,
    messages    BIGINT  NOT NULL DEFAULT 0,
    meta        TEXT    NOT NULL
);

CREATE INDEX sessions_by_update ON sessions (updated_at, session_id);

CREATE TABLE session_messages (
    session_id  TEXT    NOT NULL,
    seq         BIGINT  NOT NULL,
    run_id      TEXT,
    at_ms       BIGINT  NOT NULL,
    role        TEXT    NOT NULL,
    message     TEXT    NOT NULL,
    PRIMARY KEY (session_id, seq)
);
