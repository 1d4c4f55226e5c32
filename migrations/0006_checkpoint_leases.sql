-- agentvisor schema, version 6: leases on durable runs' checkpoints.
--
-- A host that runs a durable run holds a lease on it: `owner` (an id
-- unique per host and process) and `lease_until` (Unix ms), written with
-- every save and renewed while the host lives; a clean shutdown releases
-- them (owner NULL). `recover` resumes a run only after it claims it, in
-- one conditional UPDATE, which one caller at most wins while a lease is
-- live. Rows written before version 6 have no owner: free to claim.
ALTER TABLE checkpoints ADD COLUMN owner TEXT;
ALTER TABLE checkpoints ADD COLUMN lease_until BIGINT NOT NULL DEFAULT 0;
