//! The store's writer: one thread through which every write of the store
//! goes (migrations, audit batches, budget spend and limits, checkpoints,
//! forced WAL checkpoints), one job at a time, on its own connection —
//! plain synchronous calls into SQLite, prepared statements kept warm.
//!
//! Why a thread: on the host's tokio workers each wake-up of the writer
//! waits in the global queue behind hundreds of ready run actors; here a
//! caller waits for one reply per transaction. One thread also means one
//! writer at a time (no `SQLITE_BUSY` among our own writes).
//!
//! Why one file: the thread, its jobs and the statements each job runs
//! share one connection's life (opened, checked against the file's
//! identity, closed after a failure); what the statements encode is in
//! the store's other files (`audit/`, `budget.rs`, `checkpoint.rs`,
//! `session.rs`).
//!
//! # Guarantees
//!
//! - **A failed write leaves nothing behind.** Every job is one
//!   transaction, rolled back whole when any statement in it fails; after
//!   a failure the connection is closed and the next job opens a fresh one
//!   (so an `SQLITE_FULL`, an I/O error or a lock timeout in one job never
//!   leaves a half-open transaction for the next: once space returns,
//!   writes work again).
//! - **The file is the one that was opened.** Before each write the path's
//!   device and inode are compared with the file's at open: a database
//!   deleted or replaced under the host fails every later write (the audit
//!   actor then spools), rather than writing into an unlinked file; the
//!   store says so from then on (`AuditStats::store_lost`).
//! - **Order.** Jobs are handled in the order they were sent. The queue is
//!   unbounded, but every caller awaits its reply, so it holds at most one
//!   job per waiting caller. Dropping the last handle ends the thread after
//!   the queued jobs (`SqliteStore::close` also checkpoints the WAL first).
//! - **Another process's lock** is waited for at most
//!   [`APPEND_BUSY_TIMEOUT`] per write (then the write fails, and its
//!   caller spools or retries), so a lock held elsewhere holds a run's
//!   result that long at most; migrations at open wait [`BUSY_TIMEOUT`].

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rusqlite::{params, Connection, TransactionBehavior};
use tokio::sync::{mpsc, oneshot};

use super::background::BackgroundCheckpoints;
use super::{
    open_error, to_i64, BusyLimit, StoreError, Target, APPEND_BUSY_TIMEOUT, BUSY_TIMEOUT,
    MIGRATIONS, SCHEMA_VERSION,
};
use crate::ports::budget::Spend;

/// The SQL for `budget_spend.COL + excluded.COL`, stopping at `i64::MAX`
/// instead of overflowing (into a floating-point value, in SQLite).
macro_rules! saturating_sum {
    ($col:ident) => {
        concat!(
            "CASE WHEN budget_spend.",
            stringify!($col),
            " > 9223372036854775807 - excluded.",
            stringify!($col),
            " THEN 9223372036854775807 ELSE budget_spend.",
            stringify!($col),
            " + excluded.",
            stringify!($col),
            " END"
        )
    };
}

/// One audit segment (a run's consecutive records of one batch), ready to
/// bind (owned: moved into the query).
pub(super) struct SegmentRow {
    pub(super) run_id: String,
    pub(super) first_seq: i64,
    pub(super) last_seq: i64,
    /// How many records the segment holds.
    pub(super) records: i64,
    /// 1 if it holds the run's `run.start` record.
    pub(super) has_start: i64,
    /// `[[seq, at_ms, kind, payload], …]`, `at_ms` from `at_base`.
    pub(super) body: String,
    /// The time the segment's `at_ms` offsets count from.
    pub(super) at_base: i64,
}

/// One outbox row (a publish intent), ready to bind.
pub(super) struct OutboxRow {
    pub(super) key: String,
    pub(super) run_id: String,
    pub(super) idx: i64,
    pub(super) created_at: i64,
    /// The intent as JSON.
    pub(super) intent: String,
    /// `owed`, or `skipped`.
    pub(super) state: &'static str,
    /// Why it was skipped.
    pub(super) detail: Option<String>,
    pub(super) settled_at: i64,
}

/// One `runs` row, ready to bind.
pub(super) struct RunRow {
    pub(super) run_id: String,
    pub(super) agent: String,
    pub(super) caller_id: Option<String>,
    pub(super) parent_run_id: Option<String>,
    pub(super) root_run_id: Option<String>,
    /// The fork's origin as JSON (schema version 13).
    pub(super) forked_from: Option<String>,
    pub(super) status: &'static str,
    pub(super) kill_reason: Option<&'static str>,
    pub(super) error_kind: Option<String>,
    pub(super) started_at: i64,
    pub(super) finished_at: i64,
    pub(super) result: String,
    /// The run's last segment (the one with its `run.end` record): the seq
    /// of its first record, how many it holds, `[[seq, at_ms, kind,
    /// payload], …]`.
    pub(super) tail_first_seq: i64,
    pub(super) tail_records: i64,
    pub(super) tail: String,
    /// The time the tail's `at_ms` offsets count from.
    pub(super) tail_at_base: i64,
    /// The template the tail is (see [`TemplateRow`]): written as this id
    /// instead, unless the file holds another text under it.
    pub(super) tail_ref: Option<i64>,
    /// Likewise for the result.
    pub(super) result_ref: Option<i64>,
}

/// A text runs repeat (schema version 11), stored once: `refs` rows of
/// this batch point at it.
pub(super) struct TemplateRow {
    pub(super) id: i64,
    pub(super) body: String,
    pub(super) refs: i64,
}

/// A manifest a batch's `run.start` records name (schema version 14):
/// inserted if the file does not hold it, its `used_ms` refreshed if it
/// does.
pub(super) struct ManifestRow {
    /// [`crate::ports::audit::RecordedManifest::id`], as SQLite's integer.
    pub(super) id: i64,
    /// Its JSON.
    pub(super) body: String,
}

type Reply<T> = oneshot::Sender<Result<T, WriteError>>;

/// A write to run on the writer's connection, in one transaction.
type WriteFn = Box<dyn FnOnce(&mut Connection) -> rusqlite::Result<()> + Send>;

/// Work for the writer thread.
enum Job {
    /// One audit batch: answers (records inserted, runs inserted).
    Append {
        records: Vec<SegmentRow>,
        runs: Vec<RunRow>,
        templates: Vec<TemplateRow>,
        manifests: Vec<ManifestRow>,
        /// The intents the batch brings (the outbox, schema version 15).
        outbox: Vec<OutboxRow>,
        /// Sent while the append before it had not answered: written only
        /// if that one was.
        chained: bool,
        reply: Reply<(u64, u64)>,
    },
    /// Any other write (budget, limits, checkpoints, leases).
    Write { write: WriteFn, reply: Reply<()> },
    /// Work outside a transaction (`PRAGMA incremental_vacuum`, `VACUUM`),
    /// waiting for another process's lock at most `busy`.
    Raw {
        work: WriteFn,
        busy: std::time::Duration,
        reply: Reply<()>,
    },
    /// `PRAGMA wal_checkpoint(MODE)`.
    WalCheckpoint {
        mode: &'static str,
        reply: Reply<()>,
    },
}

/// A handle to the writer thread. Cloning it shares the thread.
#[derive(Clone)]
pub(super) struct Writer {
    tx: mpsc::UnboundedSender<Job>,
    /// Appends sent and not answered yet (see [`Writer::append`]).
    appends_in_flight: Arc<AtomicUsize>,
    /// Set once a write found the file deleted or replaced (for good: the
    /// writer never writes to another file than the one it opened).
    file_lost: Arc<AtomicBool>,
}

/// Counts an append in flight until it answers or is dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a write did not happen.
pub(super) enum WriteError {
    /// SQLite refused it (the transaction was rolled back).
    Sql(rusqlite::Error),
    /// No connection could be opened.
    Connect(rusqlite::Error),
    /// The database file at the path is not the one opened.
    FileChanged(String),
    /// The writer thread is gone.
    Gone,
    /// Not written: the batch sent before it, while it was being written,
    /// failed (batches are applied in order or not at all).
    AfterFailure,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Sql(e) => e.fmt(f),
            WriteError::Connect(e) => write!(f, "cannot reopen the database: {e}"),
            WriteError::FileChanged(why) => f.write_str(why),
            WriteError::Gone => f.write_str("the SQLite writer thread has stopped"),
            WriteError::AfterFailure => {
                f.write_str("not written: the audit batch before it failed")
            }
        }
    }
}

impl Writer {
    /// Starts the thread, connects, applies the missing migrations; returns
    /// once the database is ready for writes (or why it is not).
    pub(super) async fn start(target: Target) -> Result<Writer, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let path = target.path.clone();
        let file_lost = Arc::new(AtomicBool::new(false));
        let lost = file_lost.clone();
        let spawned = std::thread::Builder::new()
            .name("agentvisor-sqlite-writer".into())
            .spawn(move || run(target, rx, ready_tx, lost));
        if let Err(e) = spawned {
            return Err(StoreError::Open {
                path,
                reason: format!("cannot start the writer thread: {e}"),
            });
        }
        match ready_rx.await {
            Ok(Ok(())) => Ok(Writer {
                tx,
                appends_in_flight: Arc::new(AtomicUsize::new(0)),
                file_lost,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Open {
                path,
                reason: "the writer thread stopped while opening".into(),
            }),
        }
    }

    /// Whether a write found the database file deleted or replaced.
    pub(super) fn file_lost(&self) -> bool {
        self.file_lost.load(Ordering::Relaxed)
    }

    async fn ask<T>(&self, job: impl FnOnce(Reply<T>) -> Job) -> Result<T, WriteError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(job(reply)).map_err(|_| WriteError::Gone)?;
        rx.await.unwrap_or(Err(WriteError::Gone))
    }

    /// Writes one audit batch in one transaction. The batch is queued when
    /// this is first polled; batches are written in the order they were
    /// queued, and one queued while another was in flight is written only
    /// if that one was (so a caller may start the next batch before the
    /// last one answers, and never sees them applied out of order).
    pub(super) async fn append(
        &self,
        records: Vec<SegmentRow>,
        runs: Vec<RunRow>,
        templates: Vec<TemplateRow>,
        manifests: Vec<ManifestRow>,
        outbox: Vec<OutboxRow>,
    ) -> Result<(u64, u64), WriteError> {
        let chained = self.appends_in_flight.fetch_add(1, Ordering::AcqRel) > 0;
        let _in_flight = InFlight(self.appends_in_flight.clone());
        self.ask(|reply| Job::Append {
            records,
            runs,
            templates,
            manifests,
            outbox,
            chained,
            reply,
        })
        .await
    }

    /// Runs `write` in one `BEGIN IMMEDIATE` transaction on the writer's
    /// connection (committed if it returns `Ok`, rolled back otherwise);
    /// answers what it returned.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        write: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, WriteError> {
        let (done, value) = oneshot::channel();
        let write: WriteFn = Box::new(move |conn: &mut Connection| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let v = write(&tx)?;
            tx.commit()?;
            let _ = done.send(v);
            Ok(())
        });
        self.ask(|reply| Job::Write { write, reply }).await?;
        value.await.map_err(|_| WriteError::Gone)
    }

    /// Adds spend (one row per caller) in one transaction. One statement
    /// per caller: Postgres refuses an upsert that touches a row twice in
    /// one statement.
    pub(super) async fn commit(
        &self,
        spends: Vec<(String, Spend)>,
        minute: i64,
    ) -> Result<(), WriteError> {
        self.write(move |tx| {
            // Each column saturates at i64::MAX: SQLite turns an integer
            // sum that overflows into a floating-point value, which no
            // reader takes as a count.
            let mut add = tx.prepare_cached(concat!(
                "INSERT INTO budget_spend (caller, minute, tokens, cost_micros, runtime_ms, runs) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (caller, minute) DO UPDATE SET \
                 tokens = ",
                saturating_sum!(tokens),
                ", cost_micros = ",
                saturating_sum!(cost_micros),
                ", runtime_ms = ",
                saturating_sum!(runtime_ms),
                ", runs = ",
                saturating_sum!(runs),
            ))?;
            for (caller, s) in &spends {
                add.execute(params![
                    caller,
                    minute,
                    to_i64(s.tokens),
                    to_i64(s.cost_micros),
                    to_i64(s.runtime_ms),
                    to_i64(s.runs),
                ])?;
            }
            Ok(())
        })
        .await
    }

    /// Upserts a caller's limits.
    pub(super) async fn set_limits(
        &self,
        caller: String,
        limits: String,
    ) -> Result<(), WriteError> {
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO budget_limits (caller, limits) VALUES (?1, ?2) \
                 ON CONFLICT (caller) DO UPDATE SET limits = excluded.limits",
                params![caller, limits],
            )
            .map(drop)
        })
        .await
    }

    /// Runs `work` on the writer's connection outside a transaction (it
    /// opens its own, or needs none), waiting for another connection's
    /// lock (a reader's, for a WAL checkpoint) at most `busy`.
    pub(super) async fn raw(
        &self,
        busy: std::time::Duration,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<()> + Send + 'static,
    ) -> Result<(), WriteError> {
        let work: WriteFn = Box::new(work);
        self.ask(|reply| Job::Raw { work, busy, reply }).await
    }

    /// Runs a WAL checkpoint between two writes.
    pub(super) async fn checkpoint(&self, mode: &'static str) -> Result<(), WriteError> {
        self.ask(|reply| Job::WalCheckpoint { mode, reply }).await
    }
}

/// The file a path names: (device, inode), to notice a replaced file.
#[cfg(unix)]
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// Elsewhere a file is known by its path alone.
#[cfg(not(unix))]
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|_| (0, 0))
}

/// The writer thread's state: its connection (`None` after a failure,
/// until the next job opens one), and what it checks before each write.
struct WriterState {
    /// Set when the file is found deleted or replaced.
    file_lost: Arc<AtomicBool>,
    target: Target,
    limit: Arc<BusyLimit>,
    conn: Option<Connection>,
    /// The file's identity at open (`None` for an in-memory database).
    file: Option<(u64, u64)>,
    /// The last append failed (or was refused): a chained one is refused.
    append_failed: bool,
}

impl WriterState {
    /// Fails when the file at the path is not the one opened.
    fn check_file(&self) -> Result<(), WriteError> {
        let Some(opened) = self.file else {
            return Ok(());
        };
        let path = &self.target.path;
        let changed = match identity(path) {
            Ok(now) if now == opened => return Ok(()),
            Ok(_) => format!(
                "the database file {} was replaced by another file since it was opened",
                path.display()
            ),
            Err(e) => format!(
                "the database file {} is gone since it was opened ({e})",
                path.display()
            ),
        };
        if !self.file_lost.swap(true, Ordering::Relaxed) {
            tracing::error!("{changed}: nothing more is written to it");
        }
        Err(WriteError::FileChanged(changed))
    }

    /// Runs one write with the writer's connection (opened first if the
    /// last write failed). On failure whatever it left open is rolled
    /// back and the connection closed: the next write starts clean.
    fn write<T>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, WriteError> {
        self.check_file()?;
        self.limit.set(APPEND_BUSY_TIMEOUT);
        if self.conn.is_none() {
            let c = self
                .target
                .connect(false, &self.limit)
                .map_err(WriteError::Connect)?;
            self.conn = Some(c);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err(WriteError::Gone);
        };
        match f(conn) {
            Ok(v) => Ok(v),
            Err(e) => {
                self.reset();
                Err(WriteError::Sql(e))
            }
        }
    }

    /// Rolls back whatever the failed write left open and closes the
    /// connection.
    fn reset(&mut self) {
        if let Some(conn) = self.conn.take() {
            if !conn.is_autocommit() {
                if let Err(e) = conn.execute_batch("ROLLBACK") {
                    tracing::debug!(error = %e, "rollback after a failed write");
                }
            }
            if let Err((_, e)) = conn.close() {
                tracing::debug!(error = %e, "closing the writer's connection after a failed write");
            }
        }
    }
}

/// The thread's body: connect, migrate, then one job at a time.
fn run(
    target: Target,
    mut rx: mpsc::UnboundedReceiver<Job>,
    ready: oneshot::Sender<Result<(), StoreError>>,
    file_lost: Arc<AtomicBool>,
) {
    let path = target.path.clone();
    let limit = BusyLimit::new(BUSY_TIMEOUT, path.clone());
    let mut conn = match target.connect(false, &limit) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(open_error(&path, &e)));
            return;
        }
    };
    if let Err(e) = migrate(&mut conn, &path) {
        let _ = ready.send(Err(e));
        return;
    }
    let file = match target.vfs {
        Some(_) => None,
        None => match identity(&path) {
            Ok(id) => Some(id),
            Err(e) => {
                let _ = ready.send(Err(StoreError::Open {
                    path,
                    reason: e.to_string(),
                }));
                return;
            }
        },
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    let mut background = match target.vfs {
        None => BackgroundCheckpoints::start(&target),
        Some(_) => None,
    };
    let mut st = WriterState {
        file_lost,
        target,
        limit,
        conn: Some(conn),
        file,
        append_failed: false,
    };
    while let Some(job) = rx.blocking_recv() {
        match job {
            Job::Append {
                records,
                runs,
                templates,
                manifests,
                outbox,
                chained,
                reply,
            } => {
                let bytes = records.iter().map(|s| s.body.len()).sum::<usize>()
                    + runs
                        .iter()
                        .map(|r| r.result.len() + r.tail.len())
                        .sum::<usize>();
                let res = if chained && st.append_failed {
                    Err(WriteError::AfterFailure)
                } else {
                    st.write(|c| append(c, records, runs, templates, manifests, outbox))
                };
                st.append_failed = res.is_err();
                let written = res.is_ok();
                let _ = reply.send(res);
                if let Some(b) = &mut background {
                    if written {
                        b.wrote(bytes);
                    }
                }
            }
            Job::Write { write, reply } => {
                let _ = reply.send(st.write(write));
            }
            Job::Raw { work, busy, reply } => {
                let limit = st.limit.clone();
                let done = st.write(|c| {
                    limit.set(busy);
                    work(c)
                });
                let _ = reply.send(done);
            }
            Job::WalCheckpoint { mode, reply } => {
                let sql = match mode {
                    "TRUNCATE" => "PRAGMA wal_checkpoint(TRUNCATE)",
                    "RESTART" => "PRAGMA wal_checkpoint(RESTART)",
                    _ => "PRAGMA wal_checkpoint(PASSIVE)",
                };
                // The row says whether it was blocked (busy = 1).
                let done = st.write(|c| {
                    let busy: i64 = c.query_row(sql, [], |r| r.get(0))?;
                    if busy != 0 {
                        tracing::debug!(mode, "WAL checkpoint blocked by a reader");
                    }
                    Ok(())
                });
                let _ = reply.send(done);
            }
        }
    }
    drop(background);
    st.reset_quietly();
}

impl WriterState {
    /// Closes the connection at the end of the thread.
    fn reset_quietly(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.close();
        }
    }
}

/// Applies the missing migrations in one immediate transaction (so two
/// processes opening a new file at once apply them once). A file already
/// at [`SCHEMA_VERSION`] is only read.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let open = |e: rusqlite::Error| open_error(path, &e);
    let current = |c: &Connection| -> Result<Option<i64>, rusqlite::Error> {
        let has_table: i64 = c.query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'",
            [],
            |r| r.get(0),
        )?;
        if has_table == 0 {
            return Ok(None);
        }
        c.query_row("SELECT MAX(version) FROM schema_version", [], |r| {
            r.get::<_, Option<i64>>(0)
        })
        .map(|v| Some(v.unwrap_or(0)))
    };
    let newer = |found: i64| StoreError::NewerSchema {
        path: path.to_path_buf(),
        found,
        supported: SCHEMA_VERSION,
    };
    match current(conn).map_err(open)? {
        Some(v) if v > SCHEMA_VERSION => return Err(newer(v)),
        Some(v) if v == SCHEMA_VERSION => return Ok(()),
        _ => {}
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(open)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version \
         (version BIGINT NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)",
    )
    .map_err(open)?;
    // Again under the lock: another process may have migrated meanwhile.
    let at = current(&tx).map_err(open)?.unwrap_or(0);
    if at > SCHEMA_VERSION {
        return Err(newer(at));
    }
    let mut applied = false;
    for &(version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > at) {
        let fail = |e: rusqlite::Error| StoreError::Migrate {
            path: path.to_path_buf(),
            version,
            reason: e.to_string(),
        };
        tx.execute_batch(sql).map_err(fail)?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            params![version, to_i64(crate::ports::run::unix_ms())],
        )
        .map_err(fail)?;
        applied = true;
    }
    tx.commit().map_err(open)?;
    if applied {
        tracing::info!(path = %path.display(), version = SCHEMA_VERSION, "database schema migrated");
    }
    Ok(())
}

/// One audit batch: segments, then terminal rows, in one transaction.
/// Returns the records and terminal rows actually inserted (a replayed
/// segment or run is not counted again).
fn append(
    conn: &mut Connection,
    segments: Vec<SegmentRow>,
    runs: Vec<RunRow>,
    templates: Vec<TemplateRow>,
    manifests: Vec<ManifestRow>,
    outbox: Vec<OutboxRow>,
) -> Result<(u64, u64), rusqlite::Error> {
    // Rolled back when dropped before the commit (an error below).
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // The manifests first, in the batch's transaction: a `run.start` is
    // never kept without the manifest it names. A held one's `used_ms` is
    // refreshed at most once a minute (pruning keeps a manifest used
    // within two minutes of the oldest kept run's start).
    if !manifests.is_empty() {
        let now = to_i64(crate::ports::run::unix_ms());
        let mut add = tx.prepare_cached(
            "INSERT INTO manifests (id, body, used_ms) VALUES (?1, ?2, ?3) \
             ON CONFLICT (id) DO UPDATE SET used_ms = excluded.used_ms \
             WHERE manifests.used_ms < excluded.used_ms - 60000",
        )?;
        for m in &manifests {
            add.execute(params![m.id, m.body, now])?;
        }
    }
    // Templates first: one the file holds with another text under its id
    // (a hash collision) is not used, its rows written whole.
    let mut refused: Vec<i64> = Vec::new();
    if !templates.is_empty() {
        let mut find = tx.prepare_cached("SELECT body FROM run_templates WHERE id = ?1")?;
        let mut add = tx.prepare_cached(
            "INSERT INTO run_templates (id, refs, body) VALUES (?1, ?2, ?3) \
             ON CONFLICT (id) DO UPDATE SET refs = run_templates.refs + excluded.refs",
        )?;
        for t in &templates {
            let held: Option<String> =
                find.query_row([t.id], |r| r.get(0))
                    .map(Some)
                    .or_else(|e| match e {
                        rusqlite::Error::QueryReturnedNoRows => Ok(None),
                        e => Err(e),
                    })?;
            if held.as_deref().is_some_and(|b| b != t.body) {
                refused.push(t.id);
                continue;
            }
            add.execute(params![t.id, t.refs, t.body])?;
        }
    }
    let kept = |r: Option<i64>| r.filter(|id| !refused.contains(id));
    let mut inserted = 0;
    let mut terminal = 0;
    if !segments.is_empty() {
        // A run with a `runs` row has all its records (the last ones in
        // that row's tail): a segment of it is a replay, neither written
        // nor counted; so is a segment already held.
        let mut insert = tx.prepare_cached(
            "INSERT INTO audit_segments \
             (run_id, first_seq, last_seq, records, has_start, body, at_base) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 \
             WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = ?1) \
             ON CONFLICT (run_id, first_seq) DO NOTHING",
        )?;
        for s in &segments {
            let n = insert.execute(params![
                s.run_id,
                s.first_seq,
                s.last_seq,
                s.records,
                s.has_start,
                s.body,
                s.at_base,
            ])?;
            if n > 0 {
                inserted += s.records.max(0) as u64;
            }
        }
    }
    if !runs.is_empty() {
        // As for segments: a replayed run is neither written nor counted.
        let mut insert = tx.prepare_cached(
            "INSERT INTO runs (run_id, agent, caller_id, parent_run_id, status, kill_reason, \
             error_kind, started_at, finished_at, result, tail_first_seq, tail_records, tail, \
             tail_at_base, root_run_id, tail_ref, result_ref, forked_from) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18) \
             ON CONFLICT (run_id) DO NOTHING",
        )?;
        for r in &runs {
            let (tail_ref, result_ref) = (kept(r.tail_ref), kept(r.result_ref));
            let n = insert.execute(params![
                r.run_id,
                r.agent,
                r.caller_id,
                r.parent_run_id,
                r.status,
                r.kill_reason,
                r.error_kind,
                r.started_at,
                r.finished_at,
                if result_ref.is_some() {
                    ""
                } else {
                    r.result.as_str()
                },
                r.tail_first_seq,
                r.tail_records,
                if tail_ref.is_some() {
                    None
                } else {
                    Some(r.tail.as_str())
                },
                r.tail_at_base,
                r.root_run_id,
                tail_ref,
                result_ref,
                r.forked_from,
            ])?;
            if n > 0 {
                terminal += 1;
                inserted += r.tail_records.max(0) as u64;
            }
        }
    }
    if !outbox.is_empty() {
        // In the batch's transaction: a run's intents are on file exactly
        // when its terminal record is. One written again (a spool replay)
        // is left as it stands.
        let mut insert = tx.prepare_cached(
            "INSERT INTO outbox (key, run_id, idx, created_at, intent, state, detail, settled_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (key) DO NOTHING",
        )?;
        for o in &outbox {
            insert.execute(params![
                o.key,
                o.run_id,
                o.idx,
                o.created_at,
                o.intent,
                o.state,
                o.detail,
                o.settled_at,
            ])?;
        }
    }
    tx.commit()?;
    Ok((inserted, terminal))
}
