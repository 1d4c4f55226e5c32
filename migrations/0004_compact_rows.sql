-- agentvisor schema, version 4: record times are offsets; a result leaves
-- out what its row's columns say.
--
-- A segment's (and a tail's) records hold `at_ms` as an offset from the
-- row's `at_base` (`tail_at_base` in `runs`): the first record's time, so
-- a record's time costs a digit or two instead of thirteen. Rows written
-- before version 4 have no base (NULL: their times are absolute).
--
-- `runs.result` from version 4 leaves out the keys the row's columns hold
-- (run_id, agent, caller_id, parent_run_id, status, kill_reason,
-- error_kind, started_at, finished_at) and those at their defaults (error
-- and output when null, steps and critic when empty, cost_micros when 0).
-- Such a result has no `run_id` key; readers put it all back.
ALTER TABLE audit_segments ADD COLUMN at_base BIGINT;
ALTER TABLE runs ADD COLUMN tail_at_base BIGINT;

DROP VIEW audit_log;

CREATE VIEW audit_log AS
    SELECT s.run_id AS run_id,
           json_extract(e.value, '$[0]') AS seq,
           COALESCE(s.at_base, 0) + json_extract(e.value, '$[1]') AS at_ms,
           json_extract(e.value, '$[2]') AS kind,
           json_extract(e.value, '$[3]') AS body
    FROM audit_segments s, json_each(s.body) e
    UNION ALL
    SELECT r.run_id,
           json_extract(e.value, '$[0]'),
           COALESCE(r.tail_at_base, 0) + json_extract(e.value, '$[1]'),
           json_extract(e.value, '$[2]'),
           json_extract(e.value, '$[3]')
    FROM runs r, json_each(r.tail) e
    WHERE r.tail IS NOT NULL
    UNION ALL
    SELECT run_id, seq, at_ms, kind, body FROM audit_records;
