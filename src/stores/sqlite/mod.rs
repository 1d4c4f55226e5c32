//! The embedded SQLite battery: one database file that holds the audit log
//! ([`AuditStore`](crate::ports::audit::AuditStore) and
//! [`RunIndex`](crate::ports::audit::RunIndex)) and the budget ledger
//! ([`BudgetLedger`](crate::ports::budget::BudgetLedger)) and durable runs'
//! checkpoints ([`Checkpointer`](crate::ports::checkpoint::Checkpointer)). It is the CLI's
//! default store; a library host opts in with
//! `Host::builder().audit_store(store.clone()).budget_ledger(store)`.
//!
//! # Guarantees
//!
//! - **Durability.** The file runs in WAL mode with `synchronous = NORMAL`:
//!   a committed batch survives a process crash; a power loss may lose the
//!   last transactions but never corrupts the file.
//! - **Atomic batches.** `append` writes one batch in one transaction (the
//!   records, and a `runs` row per terminal record), or nothing.
//! - **Idempotence.** `(run_id, seq)` is a record's key and `run_id` a run's:
//!   writing a record or a terminal row again is a no-op
//!   (`ON CONFLICT DO NOTHING`), so the audit actor's spool can be replayed
//!   after an outage without duplicates.
//! - **Opening never destroys.** A path that cannot be created or written, a
//!   file that is not a SQLite database (or is corrupt), a SQLite database
//!   that belongs to something else, or a schema newer than this build
//!   knows: each is a [`StoreError`] naming the path, and the file is left
//!   as it was.
//! - **Concurrency.** Every write of a store goes through its writer thread
//!   (`writer`), one transaction at a time, on its own connection: no
//!   `SQLITE_BUSY` between our own writes, and no store I/O queued behind
//!   run actors on the host's tokio workers. Other processes on the same
//!   file wait up to the busy timeout. Reads use a small pool and run in
//!   parallel with writes (WAL); the writer checkpoints the WAL every 64 MiB.
//!
//! # Schema and migrations
//!
//! The migrations are SQL files under `migrations/` at the crate root,
//! embedded in the binary with `include_str!` and applied in order inside
//! one `BEGIN IMMEDIATE` transaction; `schema_version` records each
//! version applied. `include_str!` rather than `sqlx::migrate!`: the macro
//! needs sqlx's `macros` and `migrate` features (a proc-macro build the CI
//! does not otherwise pay for), and its checksum table would not let us
//! refuse a newer schema with our own typed error. The SQL sticks to what
//! SQLite and Postgres share, so the Postgres battery can apply the same
//! files (less one `WITHOUT ROWID`).
//!
//! Sessions have their (empty) table already; its port comes with later work.

mod audit;
mod budget;
mod checkpoint;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Row;

use crate::ports::audit::AuditStats;
use crate::ports::budget::BudgetLimits;

/// The schema migrations, in order: `(version, SQL)`.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../../migrations/0001_init.sql")),
    (2, include_str!("../../../migrations/0002_segments.sql")),
    (3, include_str!("../../../migrations/0003_run_tail.sql")),
    (4, include_str!("../../../migrations/0004_compact_rows.sql")),
    (
        5,
        include_str!("../../../migrations/0005_partial_status_index.sql"),
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 5;

/// How long a write waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Read connections per file-backed store (readers;
/// the writer has its own).
const MAX_READERS: u32 = 3;

/// The page size of a new database file.
const PAGE_SIZE: u32 = 16_384;

/// WAL pages past which a commit copies the WAL into the file (SQLite's
/// own `wal_autocheckpoint`, on the writer). There the checkpoint always
/// completes (no other connection writes; readers finish their statements),
/// so the next write starts the WAL over and it stays about this long
/// however long the host runs: 4096 pages of 16 KiB, 64 MiB. (A checkpoint
/// on another connection in parallel with the writer never completes under
/// a writer that does not pause: the WAL grew by gigabytes in a minute of
/// soak. The writer's background checkpointer does most of the copying and
/// syncing off the writer thread, and this one finishes the job.)
const WAL_AUTOCHECKPOINT_PAGES: u32 = 4096;

/// The WAL file is truncated to this many bytes when it restarts.
const JOURNAL_SIZE_LIMIT: u64 = 64 << 20;

/// Why a database could not be opened. Every variant names the path; none
/// means the file was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The directory that should hold the database could not be created.
    #[error("cannot create the directory for the database {}: {reason}", .path.display())]
    CreateDir {
        /// The database path.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// The database could not be opened or written (permissions, a
    /// directory in the way, a read-only file system).
    #[error("cannot open the database {}: {reason}", .path.display())]
    Open {
        /// The database path.
        path: PathBuf,
        /// SQLite's reason.
        reason: String,
    },
    /// The file is not a SQLite database, or it is corrupt.
    #[error("{} is not a usable database (corrupt, or not SQLite): {reason}; it was left unchanged", .path.display())]
    Corrupt {
        /// The database path.
        path: PathBuf,
        /// SQLite's reason.
        reason: String,
    },
    /// The file is a SQLite database, but not one of agentvisor's.
    #[error("{} is a SQLite database of another program (it has tables but no agentvisor schema); it was left unchanged", .path.display())]
    Foreign {
        /// The database path.
        path: PathBuf,
    },
    /// The database was written by a newer agentvisor.
    #[error("the database {} has schema version {found}, newer than the {supported} this agentvisor knows; upgrade agentvisor or use another --db", .path.display())]
    NewerSchema {
        /// The database path.
        path: PathBuf,
        /// The version in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// [`SqliteStore::open_existing`] found no file.
    #[error("no database at {}", .path.display())]
    Missing {
        /// The database path.
        path: PathBuf,
    },
    /// Applying a migration failed (the transaction was rolled back).
    #[error("cannot migrate the database {} to schema version {version}: {reason}", .path.display())]
    Migrate {
        /// The database path.
        path: PathBuf,
        /// The version that failed.
        version: i64,
        /// SQLite's reason.
        reason: String,
    },
}

/// The SQLite battery for the audit log and the budget ledger. Share it as
/// `Arc<SqliteStore>`: one handle per database file in a process (each
/// handle has its own writer thread).
pub struct SqliteStore {
    /// Reads (and the background checkpoints).
    pool: SqlitePool,
    /// Where it lives (`:memory:` for [`SqliteStore::open_memory`]).
    path: PathBuf,
    /// Every write goes through it.
    writer: writer::Writer,
    /// A file, whose WAL is truncated on close (not an in-memory database).
    file_backed: bool,
    /// Limits for callers without a `budget_limits` row (not persisted).
    default_limits: Mutex<BudgetLimits>,
    /// What this handle wrote (see [`AuditStore::stats`](crate::ports::audit::AuditStore::stats)).
    records: AtomicU64,
    terminal_records: AtomicU64,
    batches: AtomicU64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (or creates) the database at `path`, creating its parent
    /// directories, and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_file(path, true).await
    }

    /// Opens the database at `path` only if the file exists (for readers
    /// such as `agentvisor runs`, which should not create an empty one).
    pub async fn open_existing(path: &Path) -> Result<Self, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
            });
        }
        Self::open_file(path, false).await
    }

    /// A private in-memory database (tests, benches): gone when dropped.
    pub async fn open_memory() -> Result<Self, StoreError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = PathBuf::from(":memory:");
        // SQLite's `memdb` VFS: connections of this process that open the
        // same name share the database (unlike `:memory:`), with ordinary
        // locking; it lives while one of them is open.
        let name = format!(
            "/agentvisor-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let opts = SqliteConnectOptions::new()
            .filename(&name)
            .vfs("memdb")
            .create_if_missing(true)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts.clone())
            .await
            .map_err(|e| open_error(&path, &e))?;
        let target = writer::Target {
            name: PathBuf::from(&name),
            vfs: Some("memdb"),
        };
        let writer = writer::Writer::start(opts, target, path.clone()).await?;
        Ok(Self::assemble(pool, path, writer))
    }

    async fn open_file(path: &Path, create: bool) -> Result<Self, StoreError> {
        let owned = path.to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| StoreError::CreateDir {
                path: owned.clone(),
                reason: e.to_string(),
            })?;
        }
        if path.is_dir() {
            return Err(StoreError::Open {
                path: owned,
                reason: "it is a directory".into(),
            });
        }
        // No journal_mode here: switching to WAL writes the file header, and
        // nothing may be written before the file is known to be ours.
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(create)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(false)
            // Only takes effect in a new file: fewer, fuller pages for an
            // append-mostly log.
            .page_size(PAGE_SIZE)
            .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES.to_string())
            .pragma("journal_size_limit", JOURNAL_SIZE_LIMIT.to_string())
            // A statement that may have to undo itself alone keeps a
            // statement journal: in a temp file it was 40% of the bytes a
            // swarm of multi-row inserts wrote, in memory it costs a few MiB
            // at most (one batch's pages). The append connection sets it too.
            .pragma("temp_store", "memory");
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_READERS)
            .min_connections(0)
            .connect_with(opts.clone())
            .await
            .map_err(|e| open_error(path, &e))?;
        check_owner(&pool, path).await?;
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode = WAL")
            .fetch_one(&pool)
            .await
            .map_err(|e| open_error(path, &e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), %mode, "the database could not switch to WAL mode");
        }
        let target = writer::Target {
            name: owned.clone(),
            vfs: None,
        };
        let writer = writer::Writer::start(opts, target, owned.clone()).await?;
        let mut store = Self::assemble(pool, owned, writer);
        store.file_backed = true;
        Ok(store)
    }

    fn assemble(pool: SqlitePool, path: PathBuf, writer: writer::Writer) -> Self {
        SqliteStore {
            pool,
            path,
            writer,
            file_backed: false,
            default_limits: Mutex::new(BudgetLimits::default()),
            records: AtomicU64::new(0),
            terminal_records: AtomicU64::new(0),
            batches: AtomicU64::new(0),
        }
    }

    /// Where the database lives (`:memory:` for an in-memory one).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version in the file.
    pub async fn version(&self) -> Result<i64, StoreError> {
        schema_version(&self.pool, &self.path).await
    }

    /// Counts in the whole file (every process that ever wrote to it), as
    /// opposed to [`AuditStore::stats`](crate::ports::audit::AuditStore::stats),
    /// which counts what this handle wrote. `batches` is this handle's.
    pub async fn totals(&self) -> Result<AuditStats, crate::ports::audit::AuditStoreError> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM audit_records) \
                 + (SELECT COALESCE(SUM(records), 0) FROM audit_segments) \
                 + (SELECT COALESCE(SUM(tail_records), 0) FROM runs), \
                 (SELECT COUNT(*) FROM runs)",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(audit::unavailable)?;
        let records: i64 = row.try_get(0).map_err(audit::unavailable)?;
        let runs: i64 = row.try_get(1).map_err(audit::unavailable)?;
        Ok(AuditStats {
            records: to_u64(records),
            terminal_records: to_u64(runs),
            batches: self.batches.load(std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// Checkpoints the WAL into the database file and closes the read
    /// connections. Dropping the store without closing loses nothing: the
    /// WAL is replayed by the next open.
    pub async fn close(&self) {
        if self.file_backed {
            if let Err(e) = self.writer.checkpoint("TRUNCATE").await {
                tracing::debug!(error = %e, "final WAL checkpoint skipped");
            }
        }
        self.pool.close().await;
    }
}

/// Reads only: refuses a foreign database or a newer schema before anything
/// is written. The first read is also where SQLite notices a file that is
/// not a database.
async fn check_owner(pool: &SqlitePool, path: &Path) -> Result<(), StoreError> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    )
    .fetch_all(pool)
    .await
    .map_err(|e| open_error(path, &e))?;
    if tables.iter().any(|t| t == "schema_version") {
        let found = schema_version(pool, path).await?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: path.to_path_buf(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
    } else if !tables.is_empty() {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

async fn schema_version(pool: &SqlitePool, path: &Path) -> Result<i64, StoreError> {
    let v: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM schema_version")
        .fetch_one(pool)
        .await
        .map_err(|e| open_error(path, &e))?;
    Ok(v.unwrap_or(0))
}

/// Classifies an error of opening or first reading a file.
fn open_error(path: &Path, e: &sqlx::Error) -> StoreError {
    let corrupt = match e {
        // SQLITE_CORRUPT (11) and SQLITE_NOTADB (26), with extended codes.
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 11 | 26)),
        _ => false,
    };
    let reason = match e {
        sqlx::Error::Database(d) => d.message().to_string(),
        other => other.to_string(),
    };
    if corrupt {
        StoreError::Corrupt {
            path: path.to_path_buf(),
            reason,
        }
    } else {
        StoreError::Open {
            path: path.to_path_buf(),
            reason,
        }
    }
}

/// SQLite integers are signed: counters past `i64::MAX` saturate.
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A stored integer back to a counter (negative values read as 0).
fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}
