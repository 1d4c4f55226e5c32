-- agentvisor schema, version 14: the manifests runs ran.
--
-- A run's `run.start` record names its manifest by id (`"manifest":
-- "16 hex digits"`, a hash of the manifest's JSON); the JSON is kept
-- here once per id, so `fork`, `eval` and `replay` rebuild the agent a
-- run ran (its system prompt, script, tools and policies) without a
-- manifest file, at no cost a run. `used_ms` is refreshed (at most once a
-- minute) by every audit batch that starts a run of it; pruning deletes
-- a manifest unused since before the oldest run the file keeps.
CREATE TABLE manifests (
    id       BIGINT  NOT NULL PRIMARY KEY,
    body     TEXT    NOT NULL,
    used_ms  BIGINT  NOT NULL
) WITHOUT ROWID;
