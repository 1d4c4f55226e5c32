-- agentvisor schema, version 11: text that runs repeat is stored once.
--
-- A run's `tail` (its records) and `result` are most of its row, and runs
-- of one agent often write them byte for byte the same (a swarm of a
-- scripted agent, a soak: a `hello` run's row was 1.6 KB, 1.3 KB of it its
-- tail). A text the writer has seen before is stored once in
-- `run_templates` (keyed by a hash of it, `refs` counting the rows that
-- point at it) and the row holds its id in `tail_ref` (its `tail` NULL)
-- or `result_ref` (its `result` empty). Readers put it back; pruning
-- counts the references down and deletes a template nobody points at.
-- Rows without a reference are read as before.
CREATE TABLE run_templates (
    id    BIGINT  NOT NULL PRIMARY KEY,
    refs  BIGINT  NOT NULL DEFAULT 0,
    body  TEXT    NOT NULL
) WITHOUT ROWID;

ALTER TABLE runs ADD COLUMN tail_ref BIGINT;
ALTER TABLE runs ADD COLUMN result_ref BIGINT;

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
    FROM runs r,
         json_each(COALESCE(r.tail, (SELECT t.body FROM run_templates t WHERE t.id = r.tail_ref))) e
    WHERE r.tail IS NOT NULL OR r.tail_ref IS NOT NULL
    UNION ALL
    SELECT run_id, seq, at_ms, kind, body FROM audit_records;
