-- agentvisor schema, version 9: run trees.
--
-- `root_run_id`: the tree a finished run belongs to when it is not its
-- own root — the top run of a sub-agent's tree, or the pipeline of a phase
-- (and of the phase's sub-agents); NULL for a run that is its own root.
-- `runs list --root ID` reads a tree through `runs_by_root`, which holds
-- only the rows of runs inside a tree: a swarm of top-level runs adds no
-- entry to it.
ALTER TABLE runs ADD COLUMN root_run_id TEXT;
CREATE INDEX runs_by_root ON runs (root_run_id, finished_at) WHERE root_run_id IS NOT NULL;
