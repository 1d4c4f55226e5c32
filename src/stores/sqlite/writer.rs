//! The store's writer: one thread with its own current-thread runtime,
//! through which every write of the store goes (migrations, audit batches,
//! budget spend and limits, forced checkpoints), one job at a time.
//!
//! Two connections, never writing at once (jobs run one after another):
//! audit appends, the hot path, go through a synchronous `rusqlite`
//! connection on this thread — a prepared single-row `INSERT` per table,
//! stepped once per row; everything else goes through sqlx (migrations,
//! budget, checkpoints). Why: through sqlx each statement is a round trip
//! to the connection's own worker thread, and on two cores each of its
//! wake-ups waited for a core behind the host's busy workers — measured on
//! a 20000-run swarm, the `BEGIN` of a batch alone took 1 to 3 µs a run,
//! and binds and round trips half of the writer's time. Here a batch is
//! plain calls into SQLite on one thread.
//!
//! Why a thread: on the host's tokio workers each wake-up of the writer
//! waits in the global queue behind hundreds of ready run actors; here a
//! caller waits for one reply per transaction. One thread also means one
//! writer at a time (no `SQLITE_BUSY` among our own writes) and warm
//! prepared statements.
//!
//! Jobs are handled in the order they were sent. The queue is unbounded,
//! but every caller awaits its reply, so it holds at most one job per
//! waiting caller. Dropping the last handle ends the thread after the
//! queued jobs (`SqliteStore::close` also checkpoints the WAL first).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::Connection;
use tokio::sync::{mpsc, oneshot};

use super::{
    open_error, StoreError, BUSY_TIMEOUT, JOURNAL_SIZE_LIMIT, MIGRATIONS, SCHEMA_VERSION,
    WAL_AUTOCHECKPOINT_PAGES,
};
use crate::ports::budget::Spend;

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

/// One `runs` row, ready to bind.
pub(super) struct RunRow {
    pub(super) run_id: String,
    pub(super) agent: String,
    pub(super) caller_id: Option<String>,
    pub(super) parent_run_id: Option<String>,
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
}

/// One `checkpoints` row, ready to bind.
pub(super) struct CheckpointRow {
    pub(super) run_id: String,
    pub(super) agent: String,
    pub(super) iteration: i64,
    pub(super) attempts: i64,
    pub(super) state: String,
    pub(super) updated_at: i64,
}

type Reply<T> = oneshot::Sender<Result<T, sqlx::Error>>;

/// Work for the writer thread.
enum Job {
    /// One audit batch: answers (records inserted, runs inserted).
    Append {
        records: Vec<SegmentRow>,
        runs: Vec<RunRow>,
        /// Sent while the append before it had not answered: written only
        /// if that one was.
        chained: bool,
        reply: oneshot::Sender<Result<(u64, u64), WriteError>>,
    },
    /// Adds spend to each caller's minute bucket.
    Commit {
        spends: Vec<(String, Spend)>,
        minute: i64,
        reply: Reply<()>,
    },
    /// Upserts one caller's limits (JSON).
    SetLimits {
        caller: String,
        limits: String,
        reply: Reply<()>,
    },
    /// Upserts durable runs' checkpoints and deletes others', in one transaction.
    Checkpoints {
        save: Vec<CheckpointRow>,
        clear: Vec<String>,
        reply: Reply<()>,
    },
    /// `PRAGMA wal_checkpoint(MODE)`.
    Checkpoint {
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
}

/// Counts an append in flight until it answers or is dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where the append connection opens the database: the file, or the
/// in-memory database, the sqlx connections use.
pub(super) struct Target {
    /// The file's path, or the in-memory database's name.
    pub(super) name: PathBuf,
    /// The VFS (`memdb` for an in-memory database shared by name).
    pub(super) vfs: Option<&'static str>,
}

/// Why a write did not happen.
pub(super) enum WriteError {
    /// SQLite refused it.
    Sql(sqlx::Error),
    /// SQLite refused an audit append.
    Append(rusqlite::Error),
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
            WriteError::Append(e) => e.fmt(f),
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
    pub(super) async fn start(
        opts: SqliteConnectOptions,
        target: Target,
        path: PathBuf,
    ) -> Result<Writer, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let thread_path = path.clone();
        let spawned = std::thread::Builder::new()
            .name("agentvisor-sqlite-writer".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(StoreError::Open {
                            path: thread_path,
                            reason: format!("cannot start the writer's runtime: {e}"),
                        }));
                        return;
                    }
                };
                rt.block_on(run(opts, target, thread_path, rx, ready_tx));
            });
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
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Open {
                path,
                reason: "the writer thread stopped while opening".into(),
            }),
        }
    }

    async fn ask<T>(&self, job: impl FnOnce(Reply<T>) -> Job) -> Result<T, WriteError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(job(reply)).map_err(|_| WriteError::Gone)?;
        match rx.await {
            Ok(r) => r.map_err(WriteError::Sql),
            Err(_) => Err(WriteError::Gone),
        }
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
    ) -> Result<(u64, u64), WriteError> {
        let chained = self.appends_in_flight.fetch_add(1, Ordering::AcqRel) > 0;
        let _in_flight = InFlight(self.appends_in_flight.clone());
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Append {
                records,
                runs,
                chained,
                reply,
            })
            .map_err(|_| WriteError::Gone)?;
        rx.await.unwrap_or(Err(WriteError::Gone))
    }

    /// Adds spend (one row per caller) in one transaction.
    pub(super) async fn commit(
        &self,
        spends: Vec<(String, Spend)>,
        minute: i64,
    ) -> Result<(), WriteError> {
        self.ask(|reply| Job::Commit {
            spends,
            minute,
            reply,
        })
        .await
    }

    /// Upserts a caller's limits.
    pub(super) async fn set_limits(
        &self,
        caller: String,
        limits: String,
    ) -> Result<(), WriteError> {
        self.ask(|reply| Job::SetLimits {
            caller,
            limits,
            reply,
        })
        .await
    }

    /// Saves and clears checkpoints in one transaction.
    pub(super) async fn checkpoints(
        &self,
        save: Vec<CheckpointRow>,
        clear: Vec<String>,
    ) -> Result<(), WriteError> {
        self.ask(|reply| Job::Checkpoints { save, clear, reply })
            .await
    }

    /// Runs a WAL checkpoint between two writes.
    pub(super) async fn checkpoint(&self, mode: &'static str) -> Result<(), WriteError> {
        self.ask(|reply| Job::Checkpoint { mode, reply }).await
    }
}

/// The thread's body: connect, migrate, then one job at a time.
async fn run(
    opts: SqliteConnectOptions,
    target: Target,
    path: PathBuf,
    mut rx: mpsc::UnboundedReceiver<Job>,
    ready: oneshot::Sender<Result<(), StoreError>>,
) {
    let mut conn = match SqliteConnection::connect_with(&opts).await {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(open_error(&path, &e)));
            return;
        }
    };
    if let Err(e) = migrate(&mut conn, &path).await {
        let _ = ready.send(Err(e));
        let _ = conn.close().await;
        return;
    }
    let mut appender = match open_appender(&target) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(StoreError::Open {
                path: path.clone(),
                reason: e.to_string(),
            }));
            let _ = conn.close().await;
            return;
        }
    };
    if ready.send(Ok(())).is_err() {
        let _ = conn.close().await;
        return;
    }
    let mut background = match target.vfs {
        None => BackgroundCheckpoints::start(&target),
        Some(_) => None,
    };
    // The last append failed (or was refused): a chained one is refused.
    let mut append_failed = false;
    while let Some(job) = rx.recv().await {
        match job {
            Job::Append {
                records,
                runs,
                chained,
                reply,
            } => {
                let bytes = records.iter().map(|s| s.body.len()).sum::<usize>()
                    + runs
                        .iter()
                        .map(|r| r.result.len() + r.tail.len())
                        .sum::<usize>();
                let res = if chained && append_failed {
                    Err(WriteError::AfterFailure)
                } else {
                    append(&mut appender, records, runs).map_err(WriteError::Append)
                };
                append_failed = res.is_err();
                let written = res.is_ok();
                let _ = reply.send(res);
                if let Some(b) = &mut background {
                    if written {
                        b.wrote(bytes);
                    }
                }
            }
            Job::Commit {
                spends,
                minute,
                reply,
            } => {
                let _ = reply.send(commit(&mut conn, spends, minute).await);
            }
            Job::SetLimits {
                caller,
                limits,
                reply,
            } => {
                let r = sqlx::query(
                    "INSERT INTO budget_limits (caller, limits) VALUES (?, ?) \
                     ON CONFLICT (caller) DO UPDATE SET limits = excluded.limits",
                )
                .bind(caller)
                .bind(limits)
                .execute(&mut conn)
                .await
                .map(|_| ());
                let _ = reply.send(r);
            }
            Job::Checkpoints { save, clear, reply } => {
                let _ = reply.send(checkpoints(&mut conn, save, clear).await);
            }
            Job::Checkpoint { mode, reply } => {
                let sql = match mode {
                    "TRUNCATE" => "PRAGMA wal_checkpoint(TRUNCATE)",
                    "RESTART" => "PRAGMA wal_checkpoint(RESTART)",
                    _ => "PRAGMA wal_checkpoint(PASSIVE)",
                };
                // The row says whether it was blocked (busy = 1); read to
                // the end so no statement stays open.
                let done = sqlx::query(sql).fetch_all(&mut conn).await.map(|rows| {
                    let busy = rows
                        .first()
                        .and_then(|r| sqlx::Row::try_get::<i64, _>(r, 0).ok())
                        .unwrap_or(0);
                    if busy != 0 {
                        tracing::debug!(mode, "WAL checkpoint blocked by a reader");
                    }
                });
                let _ = reply.send(done);
            }
        }
    }
    drop(background);
    drop(appender);
    let _ = conn.close().await;
}

/// How often the background checkpointer copies the WAL into the file, at
/// most.
const BACKGROUND_CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Bytes of audit rows appended between two background checkpoints, at
/// least: about a third of the WAL the writer's own checkpoint lets grow
/// (the WAL holds a row's bytes and then some), so a short burst of runs
/// leaves its copying for later and a long one leaves the writer a little.
const BACKGROUND_CHECKPOINT_BYTES: usize = 16 << 20;

/// A thread that copies committed WAL frames into the database file and
/// syncs it (`wal_checkpoint(PASSIVE)` on its own connection), at most every
/// [`BACKGROUND_CHECKPOINT_EVERY`] and every [`BACKGROUND_CHECKPOINT_BYTES`]
/// of appended rows. Without it the
/// writer's own checkpoint (every 64 MiB of WAL) copied and synced all of
/// it on the writer thread, every run of the swarm waiting: a second of
/// `fsync` in a 100000-run swarm. A passive checkpoint never waits for a
/// lock and never blocks the writer; it cannot restart the WAL while the
/// writer keeps writing, so the writer's own checkpoint still does, with
/// little left to copy. Dropping it ends the thread.
struct BackgroundCheckpoints {
    nudge: Option<std::sync::mpsc::SyncSender<()>>,
    /// Row bytes appended since the last nudge.
    unsynced: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BackgroundCheckpoints {
    /// Starts the thread (`None`, and a debug log line, if it cannot be:
    /// the writer's own checkpoints then do all the work, as before).
    fn start(target: &Target) -> Option<Self> {
        let conn = match open_appender(target) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "no background WAL checkpoints");
                return None;
            }
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("agentvisor-sqlite-checkpointer".into())
            .spawn(move || {
                use std::sync::mpsc::RecvTimeoutError;
                let mut last: Option<std::time::Instant> = None;
                // Each nudge: appends of some MiB were committed.
                while rx.recv().is_ok() {
                    if let Some(wait) = last
                        .map(|t| BACKGROUND_CHECKPOINT_EVERY.saturating_sub(t.elapsed()))
                        .filter(|w| !w.is_zero())
                    {
                        if let Err(RecvTimeoutError::Disconnected) = rx.recv_timeout(wait) {
                            return;
                        }
                    }
                    let done: Result<(i64, i64, i64), _> =
                        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                        });
                    if let Err(e) = done {
                        tracing::debug!(error = %e, "background WAL checkpoint failed");
                    }
                    last = Some(std::time::Instant::now());
                }
            });
        match thread {
            Ok(t) => Some(BackgroundCheckpoints {
                nudge: Some(tx),
                unsynced: 0,
                thread: Some(t),
            }),
            Err(e) => {
                tracing::debug!(error = %e, "no background WAL checkpoints");
                None
            }
        }
    }

    /// Counts an append's row bytes; past [`BACKGROUND_CHECKPOINT_BYTES`]
    /// nudges the thread (never waits: a nudge pending is enough).
    fn wrote(&mut self, bytes: usize) {
        self.unsynced += bytes;
        if self.unsynced >= BACKGROUND_CHECKPOINT_BYTES {
            self.unsynced = 0;
            if let Some(tx) = &self.nudge {
                let _ = tx.try_send(());
            }
        }
    }
}

impl Drop for BackgroundCheckpoints {
    fn drop(&mut self) {
        // Closing the channel ends the thread after its current checkpoint.
        self.nudge = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Opens the append connection, with the settings the sqlx connections get
/// from their options (the file is open and migrated by then).
fn open_appender(target: &Target) -> Result<rusqlite::Connection, rusqlite::Error> {
    use rusqlite::OpenFlags;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match target.vfs {
        Some(vfs) => rusqlite::Connection::open_with_flags_and_vfs(&target.name, flags, vfs)?,
        None => rusqlite::Connection::open_with_flags(&target.name, flags)?,
    };
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(conn)
}

/// Applies the missing migrations in one immediate transaction (so two
/// processes opening a new file at once apply them once).
async fn migrate(conn: &mut SqliteConnection, path: &std::path::Path) -> Result<(), StoreError> {
    let open = |e: sqlx::Error| open_error(path, &e);
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(open)?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS schema_version \
         (version BIGINT NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .map_err(open)?;
    let current: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM schema_version")
        .fetch_one(&mut *tx)
        .await
        .map_err(open)?;
    let current = current.unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found: current,
            supported: SCHEMA_VERSION,
        });
    }
    let mut applied = false;
    for &(version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        let fail = |e: sqlx::Error| StoreError::Migrate {
            path: path.to_path_buf(),
            version,
            reason: e.to_string(),
        };
        sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(fail)?;
        sqlx::query("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)")
            .bind(version)
            .bind(super::to_i64(crate::ports::run::unix_ms()))
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        applied = true;
    }
    tx.commit().await.map_err(open)?;
    if applied {
        tracing::info!(path = %path.display(), version = SCHEMA_VERSION, "database schema migrated");
    }
    Ok(())
}

/// One audit batch: segments, then terminal rows, in one transaction.
/// Returns the records and terminal rows actually inserted (a replayed
/// segment or run is not counted again).
fn append(
    conn: &mut rusqlite::Connection,
    segments: Vec<SegmentRow>,
    runs: Vec<RunRow>,
) -> Result<(u64, u64), rusqlite::Error> {
    use rusqlite::params;
    // Rolled back when dropped before the commit (an error below).
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
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
             tail_at_base) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
             ON CONFLICT (run_id) DO NOTHING",
        )?;
        for r in &runs {
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
                r.result,
                r.tail_first_seq,
                r.tail_records,
                r.tail,
                r.tail_at_base,
            ])?;
            if n > 0 {
                terminal += 1;
                inserted += r.tail_records.max(0) as u64;
            }
        }
    }
    tx.commit()?;
    Ok((inserted, terminal))
}

/// Adds each caller's spend to its minute bucket, in one transaction. One
/// statement per caller: Postgres refuses an upsert that touches a row
/// twice in one statement.
async fn commit(
    conn: &mut SqliteConnection,
    spends: Vec<(String, Spend)>,
    minute: i64,
) -> Result<(), sqlx::Error> {
    use super::to_i64;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    for (caller, s) in spends {
        sqlx::query(
            "INSERT INTO budget_spend (caller, minute, tokens, cost_micros, runtime_ms, runs) \
             VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (caller, minute) DO UPDATE SET \
             tokens = budget_spend.tokens + excluded.tokens, \
             cost_micros = budget_spend.cost_micros + excluded.cost_micros, \
             runtime_ms = budget_spend.runtime_ms + excluded.runtime_ms, \
             runs = budget_spend.runs + excluded.runs",
        )
        .bind(caller)
        .bind(minute)
        .bind(to_i64(s.tokens))
        .bind(to_i64(s.cost_micros))
        .bind(to_i64(s.runtime_ms))
        .bind(to_i64(s.runs))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// Upserts `save` and deletes `clear`, in one transaction.
async fn checkpoints(
    conn: &mut SqliteConnection,
    save: Vec<CheckpointRow>,
    clear: Vec<String>,
) -> Result<(), sqlx::Error> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    for c in save {
        sqlx::query(
            "INSERT INTO checkpoints (run_id, agent, iteration, attempts, state, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (run_id) DO UPDATE SET agent = excluded.agent, \
             iteration = excluded.iteration, attempts = excluded.attempts, \
             state = excluded.state, updated_at = excluded.updated_at",
        )
        .bind(c.run_id)
        .bind(c.agent)
        .bind(c.iteration)
        .bind(c.attempts)
        .bind(c.state)
        .bind(c.updated_at)
        .execute(&mut *tx)
        .await?;
    }
    for run_id in clear {
        sqlx::query("DELETE FROM checkpoints WHERE run_id = ?")
            .bind(run_id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}
