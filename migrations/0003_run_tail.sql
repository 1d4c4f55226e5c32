-- agentvisor schema, version 3: a run's last segment lives in its `runs` row.
--
-- The segment that holds a run's `run.end` record (for a run that finishes
-- within one audit batch, all its records) is written in the run's `runs`
-- row, `tail`, instead of a row of its own in `audit_segments`: a typical
-- run costs one row. `tail` has the form of `audit_segments.body`, from
-- `tail_first_seq`, `tail_records` records. Payloads are compact: an
-- event's JSON without its `type` tag (the record's kind says it), a
-- `run.start`'s limits without the keys the built-in defaults give.
--
-- Rows of versions 1 and 2 are still read. The view `audit_log` gives one
-- row per record from the three places.
ALTER TABLE runs ADD COLUMN tail_first_seq BIGINT;
ALTER TABLE runs ADD COLUMN tail_records BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN tail TEXT;

DROP VIEW audit_log;

CREATE VIEW audit_log AS
    SELECT s.run_id AS run_id,
           json_extract(e.value, '$[0]') AS seq,
           json_extract(e.value, '$[1]') AS at_ms,
           json_extract(e.value, '$[2]') AS kind,
           json_extract(e.value, '$[3]') AS body
    FROM audit_segments s, json_each(s.body) e
    UNION ALL
    SELECT r.run_id,
           json_extract(e.value, '$[0]'),
           json_extract(e.value, '$[1]'),
           json_extract(e.value, '$[2]'),
           json_extract(e.value, '$[3]')
    FROM runs r, json_each(r.tail) e
    WHERE r.tail IS NOT NULL
    UNION ALL
    SELECT run_id, seq, at_ms, kind, body FROM audit_records;
