-- agentvisor on PostgreSQL, schema version 3: durable runs' checkpoints,
-- their leases, and host leases (as SQLite's versions 6, 8 and 12).
--
-- `checkpoints`: one row per durable run not yet finished. `state` holds
-- its header as JSON (iteration, usage, cost, resumes, times, a turn
-- parked for approval); `messages`, `steps` and `decisions` count the
-- entries of lists 1 to 3 it has. `owner` (an id unique per host and
-- process) holds the run's lease until `lease_until` (Unix ms, the
-- writer's clock): a save other than the run's first is written only by
-- a statement conditional on `owner`, so a host that lost the run writes
-- nothing more of it (fencing). A clean shutdown releases its rows
-- (owner NULL).
--
-- `checkpoint_entries`: what grows with a run, one row per entry, `seq`
-- its place in its list from 0: list 0 the manifest (seq 0) and the
-- invocation (seq 1), list 1 the transcript's messages, list 2 the step
-- records, list 3 the critic decisions. A save after a step writes the
-- header and the entries appended since the run's last save.
--
-- `host_leases`: every host that runs durable runs holds a lease of its
-- own, renewed with its run leases; `taken_over` (Unix ms, 0 if not) says
-- a `recover` took the host over since it last renewed.
CREATE TABLE checkpoints (
    run_id       TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    agent        TEXT    NOT NULL,
    iteration    BIGINT  NOT NULL,
    attempts     BIGINT  NOT NULL,
    state        TEXT    NOT NULL,
    updated_at   BIGINT  NOT NULL,
    owner        TEXT,
    lease_until  BIGINT  NOT NULL DEFAULT 0,
    messages     INTEGER NOT NULL,
    steps        INTEGER NOT NULL,
    decisions    INTEGER NOT NULL
);
CREATE INDEX checkpoints_by_owner ON checkpoints (owner) WHERE owner IS NOT NULL;

CREATE TABLE checkpoint_entries (
    run_id  TEXT COLLATE "C" NOT NULL,
    list    SMALLINT NOT NULL,
    seq     INTEGER  NOT NULL,
    body    TEXT     NOT NULL,
    PRIMARY KEY (run_id, list, seq)
);

CREATE TABLE host_leases (
    owner        TEXT    NOT NULL PRIMARY KEY,
    lease_until  BIGINT  NOT NULL,
    taken_over   BIGINT  NOT NULL DEFAULT 0
);
