-- agentvisor on PostgreSQL, schema version 1: the audit log and the run
-- index.
--
-- `audit_records`: one row per record, keyed by (run_id, seq) so a replayed
-- record is ignored; `record` is the record's JSON (a `run.start` names its
-- manifest by id: the JSON is a `manifests` row). `kind`: 0 a run's start,
-- 1 an event, 2 its terminal record.
-- `runs`: one row per finished run, the columns `runs list` filters and
-- sorts on; its result is its terminal record.
CREATE TABLE audit_records (
    run_id  TEXT COLLATE "C" NOT NULL,
    seq     INTEGER NOT NULL,
    at_ms   BIGINT  NOT NULL,
    kind    SMALLINT NOT NULL,
    record  TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX audit_records_starts ON audit_records (run_id) WHERE kind = 0;

CREATE TABLE runs (
    run_id        TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    agent         TEXT    NOT NULL,
    caller_id     TEXT,
    parent_run_id TEXT,
    root_run_id   TEXT,
    forked_from   TEXT,
    status        TEXT    NOT NULL,
    kill_reason   TEXT,
    error_kind    TEXT,
    started_at    BIGINT  NOT NULL,
    finished_at   BIGINT  NOT NULL
);
CREATE INDEX runs_by_finish ON runs (finished_at DESC, run_id DESC);
CREATE INDEX runs_by_caller ON runs (caller_id, finished_at DESC, run_id DESC);
CREATE INDEX runs_by_status ON runs (status, finished_at DESC, run_id DESC);
CREATE INDEX runs_by_root ON runs (root_run_id, finished_at DESC, run_id DESC)
    WHERE root_run_id IS NOT NULL;

CREATE TABLE runs_pruned (
    agent   TEXT   NOT NULL,
    status  TEXT   NOT NULL,
    runs    BIGINT NOT NULL,
    records BIGINT NOT NULL,
    PRIMARY KEY (agent, status)
);

CREATE TABLE manifests (
    id       BIGINT NOT NULL PRIMARY KEY,
    body     TEXT   NOT NULL,
    used_ms  BIGINT NOT NULL
);
