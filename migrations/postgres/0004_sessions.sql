-- agentvisor on PostgreSQL, schema version 4: chat sessions (as SQLite's
-- version 7).
--
-- `sessions`: one row per session, its whole metadata as JSON in `meta`,
-- with the fields one filters or sorts by beside it. `session_messages`:
-- the history, one row per message, keyed by (session, seq); an append
-- locks its session's row, so two writers of one session take turns and
-- the second finds its `seq` taken.
CREATE TABLE sessions (
    session_id  TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    agent       TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    caller_id   TEXT,
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL,
    prompts     BIGINT  NOT NULL DEFAULT 0,
    messages    BIGINT  NOT NULL DEFAULT 0,
    meta        TEXT    NOT NULL
);
CREATE INDEX sessions_by_update ON sessions (updated_at DESC, session_id DESC);

CREATE TABLE session_messages (
    session_id  TEXT COLLATE "C" NOT NULL,
    seq         INTEGER NOT NULL,
    run_id      TEXT,
    at_ms       BIGINT  NOT NULL,
    role        TEXT    NOT NULL,
    message     TEXT    NOT NULL,
    PRIMARY KEY (session_id, seq)
);
