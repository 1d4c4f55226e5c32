//! The PostgreSQL battery (capability X4): the audit log, the run index,
//! the budget ledger, durable runs' checkpoints with their run and host
//! leases, chat sessions, the outbox of scheduled skills' publishes,
//! schedules' state, parked git writes and the run queue
//! ([`PostgresQueue`]) on a PostgreSQL server, for hosts that share one
//! source of truth. The CLI takes it as `--db postgres://…`.
//!
//! Built on `tokio-postgres` with a `deadpool-postgres` pool (a connection
//! a call, returned after it). The schema is migrated at
//! [`PostgresStore::connect`] under an advisory lock, so hosts starting
//! together migrate once; a schema newer than this build is refused.
//!
//! # Layout
//!
//! `audit_records` holds one row per record, keyed by `(run_id, seq)`: a
//! record written again (a spool replayed after an outage, a batch retried)
//! is ignored, as the port asks. A record's JSON is the record itself; a
//! `run.start` names its manifest by id, the manifest's JSON being one
//! `manifests` row per distinct manifest (as on SQLite). `runs` holds one
//! row per finished run, the columns `runs list` filters and sorts on; the
//! run's result is its terminal record. A batch is one transaction.
//! `budget_spend` and `budget_limits` hold the ledger (schema version 2);
//! `checkpoints`, `checkpoint_entries` and `host_leases` the checkpoints
//! by delta and the leases (version 3: see the `checkpoint` module for
//! fencing); `sessions` and `session_messages` the sessions (version 4);
//! `run_queue` the queue's jobs with their leases (version 5); `outbox`
//! the publish intents of scheduled skills' runs with their outcomes and
//! claims, written in the transaction of the batch that holds the run's
//! terminal record (the `outbox` module), `schedules` the scheduler's
//! state and `writeback_intents` parked git writes (version 6).
//!
//! What PostgreSQL itself guarantees (durability at commit, isolation) is
//! left to it: `synchronous_commit` is the server's.
//!
//! # Not yet here
//!
//! Budget reservations across hosts and the workers that claim from the
//! run queue are still to come; until then `serve` refuses a PostgreSQL
//! `--db`.

mod audit;
mod budget;
mod checkpoint;
mod outbox;
mod queue;
mod schedule;
mod schema;
mod session;
mod writeback;

use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

pub use queue::PostgresQueue;
pub use schema::SCHEMA_VERSION;

/// Why the PostgreSQL store could not be opened. The target is named with
/// its password left out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresError {
    /// The URL does not parse.
    #[error("--db {target}: not a PostgreSQL URL: {reason}")]
    BadUrl {
        /// The URL, its password left out.
        target: String,
        /// Why.
        reason: String,
    },
    /// The server did not answer, or refused the connection.
    #[error("--db {target}: cannot connect: {reason}")]
    Connect {
        /// The URL, its password left out.
        target: String,
        /// Why.
        reason: String,
    },
    /// A migration failed (the schema is left as it was).
    #[error("--db {target}: migrating the schema to version {version} failed: {reason}")]
    Migrate {
        /// The URL, its password left out.
        target: String,
        /// The version being applied.
        version: i32,
        /// Why.
        reason: String,
    },
    /// The database holds a schema from a newer agentvisor.
    #[error(
        "--db {target}: the database has schema version {found}, newer than this agentvisor's {supported}: upgrade agentvisor"
    )]
    NewerSchema {
        /// The URL, its password left out.
        target: String,
        /// The version found.
        found: i32,
        /// The newest this build knows.
        supported: i32,
    },
}

/// The audit log, run index, budget ledger, checkpoints (with their
/// leases), sessions, outbox, schedules and parked git writes on
/// PostgreSQL. Share it with an `Arc`.
pub struct PostgresStore {
    pool: Pool,
    /// The URL, its password left out (for messages).
    target: String,
    records: AtomicU64,
    terminal_records: AtomicU64,
    batches: AtomicU64,
    /// The limits of a caller without limits of its own.
    default_limits: std::sync::Mutex<crate::ports::budget::BudgetLimits>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Whether `db` (a `--db` value) names a PostgreSQL server.
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// `url` with its password (if any) replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some((auth, host)) => (auth, host),
        None => return url.to_string(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user[:password]@host[:port]/db`),
    /// with a pool of up to 16 connections, and migrates the schema.
    pub async fn connect(url: &str) -> Result<Self, PostgresError> {
        let target = redact_url(url);
        let config: tokio_postgres::Config =
            url.parse()
                .map_err(|e: tokio_postgres::Error| PostgresError::BadUrl {
                    target: target.clone(),
                    reason: crate::secrets::redact_string(e.to_string()),
                })?;
        let manager = Manager::from_config(
            config,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool =
            Pool::builder(manager)
                .max_size(16)
                .build()
                .map_err(|e| PostgresError::Connect {
                    target: target.clone(),
                    reason: e.to_string(),
                })?;
        let store = PostgresStore {
            pool,
            target,
            records: AtomicU64::new(0),
            terminal_records: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            default_limits: std::sync::Mutex::default(),
        };
        schema::migrate(&store).await?;
        Ok(store)
    }

    /// The URL it was opened on, its password left out.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// A connection from the pool.
    async fn client(&self) -> Result<deadpool_postgres::Client, String> {
        self.pool.get().await.map_err(|e| described(&e))
    }

    fn count(&self, records: u64, terminal: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.terminal_records.fetch_add(terminal, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }
}

/// An error in words, with its causes: tokio-postgres says only `db
/// error` of what the server refused, the server's own message being its
/// cause. A cause its error already says (a wrapper that prints its
/// inner error) is said once.
fn described(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

/// A failure as the port errors say it (see [`described`]).
struct Cause(String);

impl From<tokio_postgres::Error> for Cause {
    fn from(e: tokio_postgres::Error) -> Self {
        Cause(described(&e))
    }
}

impl From<serde_json::Error> for Cause {
    fn from(e: serde_json::Error) -> Self {
        Cause(e.to_string())
    }
}

impl From<String> for Cause {
    fn from(text: String) -> Self {
        Cause(text)
    }
}

/// A count or Unix ms as a BIGINT, stopping at the largest.
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A BIGINT read back as a count or Unix ms (a negative one is 0).
fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_never_reaches_a_message() {
        assert_eq!(
            redact_url("postgres://bob:hunter2@db:5432/app"),
            "postgres://bob:***@db:5432/app"
        );
        assert_eq!(redact_url("postgres://bob@db/app"), "postgres://bob@db/app");
        assert_eq!(redact_url("postgres://db/app"), "postgres://db/app");
        assert!(is_postgres_url("postgresql://x/y"));
        assert!(!is_postgres_url("a.db"));
    }
}
