//! The background WAL checkpointer of a file-backed store: a thread of its
//! own that copies committed WAL frames into the database file, so the
//! writer thread (and the runs waiting on it) does not pay for the copying
//! and syncing. It never takes a lock a writer waits for.

use std::time::Duration;

use super::{BusyLimit, Target, BUSY_TIMEOUT};

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
pub(super) struct BackgroundCheckpoints {
    nudge: Option<std::sync::mpsc::SyncSender<()>>,
    /// Row bytes appended since the last nudge.
    unsynced: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BackgroundCheckpoints {
    /// Starts the thread (`None`, and a debug log line, if it cannot be:
    /// the writer's own checkpoints then do all the work, as before).
    pub(super) fn start(target: &Target) -> Option<Self> {
        let conn = match target.connect(false, &BusyLimit::new(BUSY_TIMEOUT, target.path.clone())) {
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
    pub(super) fn wrote(&mut self, bytes: usize) {
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
