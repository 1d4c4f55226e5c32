-- agentvisor schema, version 2: audit records are written in segments.
--
-- A segment is one run's consecutive records from one audit batch, one row:
-- a run that finishes within a batch (most do) costs one row here and one
-- in `runs` instead of a row per record. Records keep their identity inside
-- the segment: `body` is a JSON array of `[seq, at_ms, kind, payload]`, the
-- payload being the record's JSON as in version 1 (null for `run.end`,
-- whose result is `runs.result`). (run_id, first_seq) makes a replayed
-- segment a no-op; readers also drop a seq seen twice.
--
-- Rows written by version 1 stay in `audit_records` and are still read.
-- The view `audit_log` gives one row per record from both tables, for
-- queries by kind (`json_each`: the Postgres file uses
-- `jsonb_array_elements`).
CREATE TABLE audit_segments (
    run_id     TEXT    NOT NULL,
    first_seq  BIGINT  NOT NULL,
    last_seq   BIGINT  NOT NULL,
    records    BIGINT  NOT NULL,
    has_start  BIGINT  NOT NULL,
    body       TEXT    NOT NULL,
    PRIMARY KEY (run_id, first_seq)
) WITHOUT ROWID;

CREATE VIEW audit_log AS
    SELECT s.run_id AS run_id,
           json_extract(e.value, '$[0]') AS seq,
           json_extract(e.value, '$[1]') AS at_ms,
           json_extract(e.value, '$[2]') AS kind,
           json_extract(e.value, '$[3]') AS body
    FROM audit_segments s, json_each(s.body) e
    UNION ALL
    SELECT run_id, seq, at_ms, kind, body FROM audit_records;
