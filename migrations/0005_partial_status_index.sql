-- agentvisor schema, version 5: the index by status holds only runs that
-- did not end `ok`; a result may leave its steps to its row's records.
--
-- Most runs end `ok`, and each row of `runs` cost an entry in four
-- B-trees (the key and three indices); the entries of `runs_by_status`
-- were nearly all under `ok`. Measured on a 100000-run swarm, a file
-- without that index's `ok` entries took about 15 % more runs a second.
-- The runs worth finding by status are the others: errors, kills, limits.
-- A listing of `ok` runs walks `runs_by_finish` newest first and keeps the
-- `ok` rows, which are most of them. Readers that filter on another status
-- say `status <> 'ok'` as well, so the planner may use this index (Postgres
-- has partial indices with the same syntax).
--
-- Rows (no DDL): when a run's `tail` holds all its records and its steps
-- are what its `tool.call` and `tool.result` records say, `runs.result`
-- holds `"steps":"tail"` instead of the steps, and readers rebuild them
-- from the tail (a hello run's row: 1.57 to 1.37 KB).
DROP INDEX runs_by_status;
CREATE INDEX runs_by_status ON runs (status, finished_at) WHERE status <> 'ok';
