-- agentvisor schema, version 8: host leases.
--
-- Every host that writes to the file holds a lease of its own: `owner`
-- (the id its run leases use, which each run's `run.start` record names
-- as its `host`) and `lease_until` (Unix ms), taken when it starts and
-- renewed with its run leases while it lives; a clean shutdown deletes
-- the row. `recover` ends the unfinished runs of a host only once it has
-- taken that host over — in one conditional UPDATE, while the lease is
-- expired — and says so in `taken_over` (Unix ms, 0 if not), which the
-- host, should it come back, reads at its next renewal. Runs recorded
-- before version 8 name no host: `recover` ends them as before.
CREATE TABLE host_leases (
    owner        TEXT    NOT NULL PRIMARY KEY,
    lease_until  BIGINT  NOT NULL,
    taken_over   BIGINT  NOT NULL DEFAULT 0
);
