//! Connections to the database: where they open it ([`Target`]), the busy
//! handler every connection gets (waits for another process's lock up to a
//! limit, and says so past [`BUSY_WARN_AFTER`]), and the kept read
//! connections ([`Readers`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use super::{BUSY_WARN_AFTER, JOURNAL_SIZE_LIMIT, MAX_IDLE_READERS, WAL_AUTOCHECKPOINT_PAGES};
use crate::ports::audit::AuditStoreError;
use crate::ports::budget::BudgetLedgerError;
use crate::ports::checkpoint::CheckpointError;

/// Where connections open the database: a file, or an in-memory database
/// shared by name.
#[derive(Clone, Debug)]
pub(super) struct Target {
    /// The file's path, or the in-memory database's name.
    pub(super) name: PathBuf,
    /// The VFS (`memdb` for an in-memory database shared by name).
    pub(super) vfs: Option<&'static str>,
    /// The path errors and log lines name (`:memory:` for memdb).
    pub(super) path: PathBuf,
}

impl Target {
    /// Opens a connection with the store's settings. `limit`: how long it
    /// waits for another process's lock (changed later through it).
    pub(super) fn connect(
        &self,
        create: bool,
        limit: &Arc<BusyLimit>,
    ) -> Result<Connection, rusqlite::Error> {
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let mut conn = match self.vfs {
            Some(vfs) => Connection::open_with_flags_and_vfs(&self.name, flags, vfs)?,
            None => Connection::open_with_flags(&self.name, flags)?,
        };
        conn.busy_handler(Some(busy_handler(limit.clone())))?;
        if self.vfs.is_none() {
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
            conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
        }
        conn.pragma_update(None, "foreign_keys", "OFF")?;
        // A statement that may have to undo itself alone keeps a statement
        // journal: in a temp file it was 40% of the bytes a swarm of
        // multi-row inserts wrote; in memory it costs one batch's pages.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        Ok(conn)
    }
}

/// How long a connection waits for another process's lock; shared with its
/// busy handler so the writer can set it per job.
pub(super) struct BusyLimit {
    limit_ms: AtomicU64,
    path: PathBuf,
}

impl BusyLimit {
    pub(super) fn new(limit: Duration, path: PathBuf) -> Arc<Self> {
        Arc::new(BusyLimit {
            limit_ms: AtomicU64::new(limit.as_millis() as u64),
            path,
        })
    }

    pub(super) fn set(&self, limit: Duration) {
        self.limit_ms
            .store(limit.as_millis() as u64, Ordering::Relaxed);
    }

    fn get(&self) -> Duration {
        Duration::from_millis(self.limit_ms.load(Ordering::Relaxed))
    }
}

/// SQLite's busy handler: sleeps while another connection holds the lock,
/// up to the limit; a wait past [`BUSY_WARN_AFTER`] is logged once, and so
/// is giving up after one.
fn busy_handler(limit: Arc<BusyLimit>) -> impl FnMut(i32) -> bool + Send + 'static {
    let mut started = Instant::now();
    let mut warned = false;
    move |tries| {
        if tries == 0 {
            started = Instant::now();
            warned = false;
        }
        let waited = started.elapsed();
        if waited >= limit.get() {
            if warned || waited >= BUSY_WARN_AFTER {
                tracing::warn!(path = %limit.path.display(), waited_ms = waited.as_millis() as u64, "gave up waiting for the database: another process holds its lock");
            }
            return false;
        }
        if !warned && waited >= BUSY_WARN_AFTER {
            warned = true;
            tracing::warn!(path = %limit.path.display(), waited_ms = waited.as_millis() as u64, "waiting for the database: another process holds its lock");
        }
        std::thread::sleep(Duration::from_millis(match tries {
            0..=2 => 1,
            3..=9 => 5,
            _ => 20,
        }));
        true
    }
}

/// The read connections: kept idle between reads, opened on demand.
pub(super) struct Readers {
    pub(super) target: Target,
    pub(super) limit: Arc<BusyLimit>,
    pub(super) idle: Mutex<Vec<Connection>>,
}

/// A read that could not run (no connection, or its task was lost).
pub(super) struct ReadFailure(pub(super) String);

impl From<ReadFailure> for AuditStoreError {
    fn from(e: ReadFailure) -> Self {
        AuditStoreError::Unavailable(e.0)
    }
}

impl From<ReadFailure> for BudgetLedgerError {
    fn from(e: ReadFailure) -> Self {
        BudgetLedgerError::Unavailable(e.0)
    }
}

impl From<ReadFailure> for CheckpointError {
    fn from(e: ReadFailure) -> Self {
        CheckpointError::Unavailable(e.0)
    }
}

impl Readers {
    pub(super) fn take(&self) -> Result<Connection, rusqlite::Error> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(c) => Ok(c),
            None => self.target.connect(false, &self.limit),
        }
    }

    pub(super) fn put(&self, conn: Connection) {
        // A connection left inside a transaction (a failed read) is closed.
        if !conn.is_autocommit() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }
}
