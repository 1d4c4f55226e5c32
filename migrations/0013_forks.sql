-- agentvisor schema, version 13: forks.
--
-- `forked_from`: for a run forked from a recorded one (`agentvisor fork`,
-- `agentvisor eval`), where it came from, as JSON
-- (`{"run_id": "…", "step": K}`); NULL for any other run. A column, not
-- a key of the stored result, so a run's summary (`runs list`) says it
-- without reading the result.
ALTER TABLE runs ADD COLUMN forked_from TEXT;
