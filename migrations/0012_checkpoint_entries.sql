-- agentvisor schema, version 12: durable runs' checkpoints by delta.
--
-- A checkpoint's row keeps what does not grow with its run: `state` holds
-- its header as JSON (iteration, usage, cost, resumes, times, a turn
-- parked for approval), beside its lease. What grows is in
-- `checkpoint_entries`, one row per entry, `seq` its place in its list
-- from 0: list 0 holds the run's manifest (seq 0) and invocation (seq 1),
-- written once; list 1 the transcript's messages, list 2 the step
-- records, list 3 the critic decisions. A save after a step writes the
-- header and the entries appended since the run's last save, and deletes
-- the run's entries past those it keeps (a compacted transcript keeps its
-- head and rewrites the rest), so a run writes in proportion to its
-- steps, not their square. `messages`, `steps` and `decisions` count the
-- entries of lists 1 to 3 the row's checkpoint has.
--
-- `layout` 0: a row written before version 12, its whole checkpoint in
-- `state` (read as it is; its next save writes it whole in the new
-- layout); 1: a header, and its entries.
CREATE TABLE checkpoint_entries (
    run_id  TEXT    NOT NULL,
    list    BIGINT  NOT NULL,
    seq     BIGINT  NOT NULL,
    body    TEXT    NOT NULL,
    PRIMARY KEY (run_id, list, seq)
) WITHOUT ROWID;
ALTER TABLE checkpoints ADD COLUMN layout BIGINT NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN messages BIGINT NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN steps BIGINT NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN decisions BIGINT NOT NULL DEFAULT 0;
