-- agentvisor schema, version 10: retention.
--
-- Pruning (`--retain`, `agentvisor runs prune`) deletes the oldest
-- finished runs: their `runs` row, their `audit_segments` and
-- `audit_records` rows. What was pruned is counted here, per agent and
-- status, so totals over the file (runs, records) stay true.
--
-- A file created from version 10 on is in `auto_vacuum = INCREMENTAL`
-- mode (set before its first table), so pruning gives pages back to the
-- file system (`PRAGMA incremental_vacuum`); a file created before keeps
-- its pages for reuse: it stops growing but does not shrink until a
-- `VACUUM` (`agentvisor runs prune --vacuum`).
CREATE TABLE runs_pruned (
    agent    TEXT    NOT NULL,
    status   TEXT    NOT NULL,
    runs     BIGINT  NOT NULL DEFAULT 0,
    records  BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, status)
);
