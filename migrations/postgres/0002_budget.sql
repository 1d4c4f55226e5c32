-- agentvisor on PostgreSQL, schema version 2: the budget ledger.
--
-- Committed spend per caller and minute (a commit adds to its minute's
-- row, stopping at the largest BIGINT), and per-caller limits as JSON:
-- every host on the database reads the same limits and sums the same
-- spend.
CREATE TABLE budget_spend (
    caller       TEXT    NOT NULL,
    minute       BIGINT  NOT NULL,
    tokens       BIGINT  NOT NULL DEFAULT 0,
    cost_micros  BIGINT  NOT NULL DEFAULT 0,
    runtime_ms   BIGINT  NOT NULL DEFAULT 0,
    runs         BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (caller, minute)
);

CREATE TABLE budget_limits (
    caller  TEXT  NOT NULL PRIMARY KEY,
    limits  TEXT  NOT NULL
);
