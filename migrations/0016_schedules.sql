-- agentvisor schema, version 16: the scheduler's state of each schedule.
--
-- One row per schedule of the skills repository a host runs: the hash of
-- its effective configuration, its next and last fire, its last outcome,
-- its failure streak (one typed reason at a time), its pause, and what it
-- spent on the day `spent_day` (in its time zone). Times are Unix ms.
CREATE TABLE schedules (
    name              TEXT    NOT NULL PRIMARY KEY,
    config_hash       TEXT    NOT NULL,
    next_fire_ms      BIGINT,
    last_fire_ms      BIGINT,
    last_outcome      TEXT,
    last_reason       TEXT,
    last_run_id       TEXT,
    streak            BIGINT  NOT NULL DEFAULT 0,
    streak_reason     TEXT,
    paused_why        TEXT,
    paused_at_ms      BIGINT,
    paused_auto       BIGINT  NOT NULL DEFAULT 0,
    spent_day         TEXT,
    spent_tokens      BIGINT  NOT NULL DEFAULT 0,
    spent_cost_micros BIGINT  NOT NULL DEFAULT 0,
    updated_at_ms     BIGINT  NOT NULL
);
