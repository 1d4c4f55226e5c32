-- agentvisor on PostgreSQL, schema version 6: the outbox of scheduled
-- skills' publishes, the scheduler's state and parked memory writes (as
-- on SQLite: schema versions 15, 16 and 17 there).
--
-- `outbox`: one row per publish a run owes (`key`: the run's id, the
-- destination's index and name, the idempotency key sent to the
-- destination). Rows are written in the transaction of the audit batch
-- that holds the run's terminal record, so a run's intents are on file
-- exactly when its terminal record is; one written again (a spool replay)
-- keeps the row it has. `intent` is the intent as JSON: its target is the
-- destination as declared, secret references unresolved (never a secret's
-- value). `state`: owed | delivered | failed | skipped. `claimed_by` /
-- `claim_until` (Unix ms): the publisher delivering it; a claim is taken
-- in one `UPDATE … WHERE` it is owed and unclaimed (or its claim ran out),
-- so two hosts never both hold it.
CREATE TABLE outbox (
    key          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    run_id       TEXT COLLATE "C" NOT NULL,
    idx          INTEGER NOT NULL,
    created_at   BIGINT  NOT NULL,
    intent       TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    error        TEXT,
    detail       TEXT,
    settled_at   BIGINT  NOT NULL DEFAULT 0,
    claimed_by   TEXT,
    claim_until  BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX outbox_by_run ON outbox (run_id, idx);
-- Only what is owed: a publisher's scan at start reads this.
CREATE INDEX outbox_owed ON outbox (created_at, key) WHERE state = 'owed';

-- `schedules`: one row per schedule of the skills repository a host runs:
-- the hash of its effective configuration, its next and last fire, its
-- last outcome, its failure streak (one typed reason at a time), its
-- pause, and what it spent on the day `spent_day` (in its time zone).
-- Times are Unix ms.
CREATE TABLE schedules (
    name              TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    config_hash       TEXT    NOT NULL,
    next_fire_ms      BIGINT,
    last_fire_ms      BIGINT,
    last_outcome      TEXT,
    last_reason       TEXT,
    last_run_id       TEXT,
    streak            BIGINT  NOT NULL DEFAULT 0,
    streak_reason     TEXT,
    paused_why        TEXT,
    paused_at_ms      BIGINT,
    paused_auto       BOOLEAN NOT NULL DEFAULT FALSE,
    spent_day         TEXT,
    spent_tokens      BIGINT  NOT NULL DEFAULT 0,
    spent_cost_micros BIGINT  NOT NULL DEFAULT 0,
    updated_at_ms     BIGINT  NOT NULL
);

-- `writeback_intents`: a scheduled skill's memory that could not land in
-- its git repository (the push still failed after its retries) waits here
-- with its content until a retry lands it; only then is its row deleted.
-- One row per run and file (`intent_id` = `RUN_ID:PATH`); `seq` keeps the
-- order they were parked in, so writes to one file land in the order they
-- were made. The push token is named by its secret (`token_secret`),
-- never stored.
CREATE TABLE writeback_intents (
    intent_id     TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    seq           BIGINT GENERATED ALWAYS AS IDENTITY,
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
