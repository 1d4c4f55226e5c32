//! The embedded SQLite battery: one database file that holds the audit log
//! ([`AuditStore`](crate::ports::audit::AuditStore) and
//! [`RunIndex`](crate::ports::audit::RunIndex)) and the budget ledger
//! ([`BudgetLedger`](crate::ports::budget::BudgetLedger)) and durable runs'
//! checkpoints ([`Checkpointer`](crate::ports::checkpoint::Checkpointer)) and the
//! scheduler's state ([`ScheduleStore`](crate::ports::schedule::ScheduleStore)). It is the CLI's
//! default store; a library host opts in with
//! `Host::builder().audit_store(store.clone()).budget_ledger(store)`.
//!
#![doc = include_str!("../../../docs/sqlite.md")]

mod audit;
mod background;
mod budget;
mod checkpoint;
mod connection;
mod outbox;
mod retention;
mod schedule;
mod session;
mod writeback;
mod writer;

use connection::{BusyLimit, ReadFailure, Readers, Target};
pub use retention::Footprint;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;

use crate::ports::audit::{AuditStats, AuditStoreError};
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
    (
        6,
        include_str!("../../../migrations/0006_checkpoint_leases.sql"),
    ),
    (7, include_str!("../../../migrations/0007_sessions.sql")),
    (8, include_str!("../../../migrations/0008_host_leases.sql")),
    (9, include_str!("../../../migrations/0009_run_trees.sql")),
    (10, include_str!("../../../migrations/0010_retention.sql")),
    (
        11,
        include_str!("../../../migrations/0011_run_templates.sql"),
    ),
    (
        12,
        include_str!("../../../migrations/0012_checkpoint_entries.sql"),
    ),
    (13, include_str!("../../../migrations/0013_forks.sql")),
    (14, include_str!("../../../migrations/0014_manifests.sql")),
    (15, include_str!("../../../migrations/0015_outbox.sql")),
    (16, include_str!("../../../migrations/0016_schedules.sql")),
    (
        17,
        include_str!("../../../migrations/0017_writeback_intents.sql"),
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 17;

/// How long a read, or opening the file, waits for another process's lock.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a write waits for another process's lock before it fails (an
/// audit batch then goes to the spool and its runs' results are delivered;
/// budget spend and checkpoints are tried again with the next write), so a
/// lock held elsewhere holds no result for longer than this.
pub const APPEND_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

/// A wait for another process's lock longer than this is logged (`warn`).
pub const BUSY_WARN_AFTER: Duration = Duration::from_secs(1);

/// Idle read connections kept per store (more are opened while reads
/// overlap, and closed after).
const MAX_IDLE_READERS: usize = 3;

/// The page size of a new database file.
const PAGE_SIZE: u32 = 16_384;

/// WAL pages past which a commit copies the WAL into the file (SQLite's
/// own `wal_autocheckpoint`, on the writer). There the checkpoint always
/// completes (no other connection writes; readers finish their statements),
/// so the next write starts the WAL over and it stays about this long
/// however long the host runs: 4096 pages of 16 KiB, 64 MiB. (A checkpoint
/// on another connection in parallel with the writer never completes under
/// a writer that does not pause. The writer's background checkpointer does
/// most of the copying and syncing off the writer thread, and this one
/// finishes the job.)
const WAL_AUTOCHECKPOINT_PAGES: u32 = 4096;

/// The WAL file is truncated to this many bytes when it restarts.
const JOURNAL_SIZE_LIMIT: i64 = 64 << 20;

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
    /// The file is not a SQLite database, or it is corrupt (also: what
    /// [`SqliteStore::check`] found).
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

/// The SQLite battery for the audit log, the budget ledger and
/// checkpoints. Share it as `Arc<SqliteStore>`: one handle per database
/// file in a process (each handle has its own writer thread).
pub struct SqliteStore {
    /// Read connections (reads run on tokio's blocking pool).
    readers: Arc<Readers>,
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
    /// Texts written lately, to store repeats once (see `audit::encode`).
    repeats: Mutex<audit::encode::Repeats>,
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
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let target = Target {
            name: PathBuf::from(name),
            vfs: Some("memdb"),
            path: path.clone(),
        };
        let limit = BusyLimit::new(BUSY_TIMEOUT, path.clone());
        let first = {
            let target = target.clone();
            let limit = limit.clone();
            blocking(move || {
                target
                    .connect(true, &limit)
                    .map_err(|e| open_error(&target.path, &e))
            })
            .await?
        };
        let writer = writer::Writer::start(target.clone()).await?;
        Ok(Self::assemble(target, limit, first, writer))
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
        let target = Target {
            name: owned.clone(),
            vfs: None,
            path: owned.clone(),
        };
        let limit = BusyLimit::new(BUSY_TIMEOUT, owned.clone());
        let first = {
            let target = target.clone();
            let limit = limit.clone();
            blocking(move || {
                let path = &target.path;
                let conn = target
                    .connect(create, &limit)
                    .map_err(|e| open_error(path, &e))?;
                // Only takes effect in a new file: fewer, fuller pages for
                // an append-mostly log. Writes nothing yet.
                conn.pragma_update(None, "page_size", PAGE_SIZE)
                    .map_err(|e| open_error(path, &e))?;
                check_owner(&conn, path)?;
                // A new file only (setting it writes the header, and takes
                // effect only before the first table): pruned runs' pages
                // go back to the file system (`incremental_vacuum`, see
                // `retention`).
                if user_tables(&conn).map_err(|e| open_error(path, &e))?.is_empty() {
                    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
                        .map_err(|e| open_error(path, &e))?;
                }
                // Switching to WAL writes the file header: only now that
                // the file is known to be ours (or new).
                let mode: String = conn
                    .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                    .map_err(|e| open_error(path, &e))?;
                if !mode.eq_ignore_ascii_case("wal") {
                    tracing::warn!(path = %path.display(), %mode, "the database could not switch to WAL mode");
                }
                Ok(conn)
            })
            .await?
        };
        let writer = writer::Writer::start(target.clone()).await?;
        let mut store = Self::assemble(target, limit, first, writer);
        store.file_backed = true;
        Ok(store)
    }

    fn assemble(
        target: Target,
        limit: Arc<BusyLimit>,
        first: Connection,
        writer: writer::Writer,
    ) -> Self {
        let path = target.path.clone();
        SqliteStore {
            readers: Arc::new(Readers {
                target,
                limit,
                idle: Mutex::new(vec![first]),
            }),
            path,
            writer,
            file_backed: false,
            default_limits: Mutex::new(BudgetLimits::default()),
            records: AtomicU64::new(0),
            terminal_records: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            repeats: Mutex::new(audit::encode::Repeats::default()),
        }
    }

    /// Runs `f` on a read connection, on tokio's blocking pool.
    async fn read<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<ReadFailure> + Send + 'static,
    {
        let readers = self.readers.clone();
        let done = tokio::task::spawn_blocking(move || {
            let conn = readers
                .take()
                .map_err(|e| E::from(ReadFailure(e.to_string())))?;
            let out = f(&conn);
            readers.put(conn);
            out
        })
        .await;
        match done {
            Ok(out) => out,
            Err(e) => Err(E::from(ReadFailure(format!("a database read failed: {e}")))),
        }
    }

    /// Where the database lives (`:memory:` for an in-memory one).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version in the file.
    pub async fn version(&self) -> Result<i64, StoreError> {
        let path = self.path.clone();
        self.read(move |c| schema_version(c, &path).map_err(OpenRead::Store))
            .await
            .map_err(|e| e.at(&self.path))
    }

    /// Checks the whole file (`PRAGMA quick_check`: every page and index
    /// entry readable and well-formed; not the index contents against their
    /// tables). Damage anywhere in the file is a [`StoreError::Corrupt`]
    /// naming the path and what SQLite found. Takes time in proportion to
    /// the file's size; writes nothing.
    pub async fn check(&self) -> Result<(), StoreError> {
        let path = self.path.clone();
        self.read(move |c| {
            let fail = |e: rusqlite::Error| OpenRead::Store(open_error(&path, &e));
            let mut stmt = c.prepare("PRAGMA quick_check(20)").map_err(fail)?;
            let rows: Vec<String> = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .and_then(|rows| rows.collect())
                .map_err(fail)?;
            if rows.len() == 1 && rows[0] == "ok" {
                Ok(())
            } else {
                Err(OpenRead::Store(StoreError::Corrupt {
                    path: path.clone(),
                    reason: format!("integrity check: {}", rows.join("; ")),
                }))
            }
        })
        .await
        .map_err(|e| e.at(&self.path))
    }

    /// Counts in the whole file (every process that ever wrote to it; runs
    /// pruned by retention included), as
    /// opposed to [`AuditStore::stats`](crate::ports::audit::AuditStore::stats),
    /// which counts what this handle wrote. `batches` is this handle's.
    pub async fn totals(&self) -> Result<AuditStats, AuditStoreError> {
        let (records, runs) = self
            .read(|c| {
                let (records, runs) = c
                    .query_row(
                        "SELECT (SELECT COUNT(*) FROM audit_records) \
                         + (SELECT COALESCE(SUM(records), 0) FROM audit_segments) \
                         + (SELECT COALESCE(SUM(tail_records), 0) FROM runs), \
                         (SELECT COUNT(*) FROM runs)",
                        [],
                        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
                    )
                    .map_err(audit::unavailable)?;
                // Pruned runs still count (see `retention`).
                let (pruned_runs, pruned_records) =
                    Self::pruned_sums(c).map_err(audit::unavailable)?;
                Ok::<_, AuditStoreError>((records + pruned_records, runs + pruned_runs))
            })
            .await?;
        Ok(AuditStats {
            records: to_u64(records),
            terminal_records: to_u64(runs),
            batches: self.batches.load(Ordering::Relaxed),
            ..AuditStats::default()
        })
    }

    /// Checkpoints the WAL into the database file and closes the idle read
    /// connections. Dropping the store without closing loses nothing: the
    /// WAL is replayed by the next open.
    pub async fn close(&self) {
        if self.file_backed {
            if let Err(e) = self.writer.checkpoint("TRUNCATE").await {
                tracing::debug!(error = %e, "final WAL checkpoint skipped");
            }
        }
        let idle =
            std::mem::take(&mut *self.readers.idle.lock().unwrap_or_else(|p| p.into_inner()));
        drop(idle);
    }
}

/// A [`StoreError`] through [`SqliteStore::read`].
enum OpenRead {
    Store(StoreError),
    Failure(String),
}

impl OpenRead {
    fn at(self, path: &Path) -> StoreError {
        match self {
            OpenRead::Store(e) => e,
            OpenRead::Failure(reason) => StoreError::Open {
                path: path.to_path_buf(),
                reason,
            },
        }
    }
}

impl From<ReadFailure> for OpenRead {
    fn from(e: ReadFailure) -> Self {
        OpenRead::Failure(e.0)
    }
}

impl From<StoreError> for OpenRead {
    fn from(e: StoreError) -> Self {
        OpenRead::Store(e)
    }
}

/// Runs blocking open work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(StoreError::Open {
            path: PathBuf::new(),
            reason: format!("opening stopped: {e}"),
        })
    })
}

/// Reads only: refuses a foreign database or a newer schema before anything
/// is written. The first read is also where SQLite notices a file that is
/// not a database.
fn check_owner(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let tables = user_tables(conn).map_err(|e| open_error(path, &e))?;
    if tables.iter().any(|t| t == "schema_version") {
        let found = schema_version(conn, path)?;
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

/// The file's own tables (not SQLite's).
fn user_tables(conn: &Connection) -> Result<Vec<String>, rusqlite::Error> {
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    )?;
    let names = stmt.query_map([], |r| r.get::<_, String>(0))?;
    names.collect()
}

fn schema_version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    conn.query_row("SELECT MAX(version) FROM schema_version", [], |r| {
        r.get::<_, Option<i64>>(0)
    })
    .map(|v| v.unwrap_or(0))
    .map_err(|e| open_error(path, &e))
}

/// Classifies an error of opening or first reading a file.
pub(super) fn open_error(path: &Path, e: &rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    let corrupt = matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    );
    let reason = e.to_string();
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
