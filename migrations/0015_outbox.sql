-- agentvisor schema, version 15: the outbox of scheduled skills' publishes.
--
-- One row per publish a run owes (`key`: the run's id, the destination's
-- index and name, the idempotency key sent to the destination). Rows are
-- written in the transaction of the audit batch that holds the run's
-- terminal record, so a run's intents are on file exactly when its
-- terminal record is. `intent` is the intent as JSON: its target is the
-- destination as declared, secret references unresolved (never a
-- secret's value). `state`: owed | delivered | failed | skipped.
-- `claimed_by` / `claim_until`: the publisher delivering it (another
-- publisher leaves it alone until the claim runs out).
CREATE TABLE outbox (
    key TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    intent TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    detail TEXT,
    settled_at INTEGER NOT NULL DEFAULT 0,
    claimed_by TEXT,
    claim_until INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX outbox_by_run ON outbox (run_id, idx);
-- Only what is owed: the publisher's scan at start reads this.
CREATE INDEX outbox_owed ON outbox (created_at) WHERE state = 'owed';
