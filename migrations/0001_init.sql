-- agentvisor schema, version 1.
--
-- Written in the subset of SQL that SQLite and Postgres share (TEXT and
-- BIGINT columns, composite primary keys, ON CONFLICT), so the Postgres
-- battery can apply the same files, less the one `WITHOUT ROWID`. Times are Unix milliseconds; JSON is
-- stored as TEXT. The schema_version table is created by the store before
-- this file runs; the store records version 1 after it.

-- One row per finished run, filled from its terminal audit record.
CREATE TABLE runs (
    run_id        TEXT    NOT NULL PRIMARY KEY,
    agent         TEXT    NOT NULL,
    caller_id     TEXT,
    parent_run_id TEXT,
    status        TEXT    NOT NULL,
    kill_reason   TEXT,
    error_kind    TEXT,
    started_at    BIGINT  NOT NULL,
    finished_at   BIGINT  NOT NULL,
    result        TEXT    NOT NULL
);
CREATE INDEX runs_by_finish ON runs (finished_at);
CREATE INDEX runs_by_status ON runs (status, finished_at);
CREATE INDEX runs_by_caller ON runs (caller_id, finished_at);

-- Every audit record of every run; (run_id, seq) makes a replayed record a
-- no-op. kind: run.start, run.end, or the event's wire name (step.start, …).
-- body: the payload's JSON; empty for run.end, whose result is runs.result.
-- WITHOUT ROWID (SQLite only; the one clause the Postgres file drops): the
-- rows live in the primary key's tree, one insert per record instead of two.
CREATE TABLE audit_records (
    run_id  TEXT    NOT NULL,
    seq     BIGINT  NOT NULL,
    at_ms   BIGINT  NOT NULL,
    kind    TEXT    NOT NULL,
    body    TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- Committed spend per caller and minute; a commit adds to its minute's row.
CREATE TABLE budget_spend (
    caller       TEXT    NOT NULL,
    minute       BIGINT  NOT NULL,
    tokens       BIGINT  NOT NULL DEFAULT 0,
    cost_micros  BIGINT  NOT NULL DEFAULT 0,
    runtime_ms   BIGINT  NOT NULL DEFAULT 0,
    runs         BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (caller, minute)
);

-- Per-caller limits (BudgetLimits as JSON).
CREATE TABLE budget_limits (
    caller  TEXT  NOT NULL PRIMARY KEY,
    limits  TEXT  NOT NULL
);

-- Reserved for durable runs (checkpoint after every step); empty until then.
CREATE TABLE checkpoints (
    run_id      TEXT    NOT NULL PRIMARY KEY,
    agent       TEXT    NOT NULL,
    iteration   BIGINT  NOT NULL,
    attempts    BIGINT  NOT NULL DEFAULT 0,
    state       TEXT    NOT NULL,
    updated_at  BIGINT  NOT NULL
);

-- Reserved for chat sessions (a session's message history); empty until then.
CREATE TABLE sessions (
    session_id  TEXT    NOT NULL PRIMARY KEY,
    status      TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL
);
