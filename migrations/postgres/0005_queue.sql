-- agentvisor on PostgreSQL, schema version 5: the run queue.
--
-- `run_queue`: one row per accepted run, kept after it is done (a run id
-- is accepted once). `state`: 0 queued, 1 leased, 2 done, 3 dead-lettered.
-- The lease is the row's `owner`, `fence`, `expires_at` (Unix ms) and
-- `deliveries`: a claim takes rows with `FOR UPDATE SKIP LOCKED` and
-- writes them in the same transaction; renew, complete and release match
-- `fence` in the statement that writes. A leased row whose `expires_at`
-- passed is claimable again (it stays `state = 1` until then).
-- `fence` comes from one sequence: every delivery's token is higher than
-- any before it. `released`: the last holder's release reason (JSON);
-- `dead_reason`: why it was dead-lettered (JSON). `agent` and `input` are
-- the job's JSON, which the queue does not read.
CREATE TABLE run_queue (
    run_id        TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    seq           BIGINT GENERATED ALWAYS AS IDENTITY,
    agent         TEXT     NOT NULL,
    input         TEXT     NOT NULL,
    caller_id     TEXT,
    durable       BOOLEAN  NOT NULL,
    submitted_at  BIGINT   NOT NULL,
    state         SMALLINT NOT NULL DEFAULT 0,
    owner         TEXT,
    fence         BIGINT   NOT NULL DEFAULT 0,
    expires_at    BIGINT,
    deliveries    INTEGER  NOT NULL DEFAULT 0,
    released      TEXT,
    dead_reason   TEXT,
    finished_at   BIGINT
);
-- What a claim scans: queued and leased rows in submission order (a live
-- lease is skipped by its `expires_at`; there are at most the in-flight
-- cap of those).
CREATE INDEX run_queue_active ON run_queue (seq) WHERE state < 2;
CREATE INDEX run_queue_dead ON run_queue (finished_at, seq) WHERE state = 3;
CREATE SEQUENCE run_queue_fence AS BIGINT;
