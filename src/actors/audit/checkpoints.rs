//! Durable runs' checkpoints on their own path: a task that owns the
//! [`Checkpointer`] port, beside the audit writer rather than inside it.
//!
//! Saves come from runs (through the audit actor's `Checkpoint` message,
//! forwarded here at once: a save never waits behind an audit batch, and
//! an audit batch never waits for a save, so the audit writer pipelines
//! batches of durable runs too). Clears come from the audit writer, once a
//! run's terminal record is in the store — not when it went to the spool
//! or is held in memory: a checkpoint whose run has no terminal record on
//! disk is what `recover` resumes.
//!
//! # Guarantees
//!
//! - **Latest wins.** Saves that queue up while one is written are
//!   coalesced: the latest per run is written, in one call.
//! - **Order per run.** A run's saves are sent before its terminal record,
//!   and its clear after that record is written: one queue, handled in
//!   order, so a clear is never overtaken by an older save.
//! - **A save that waits is answered.** A run being admitted (its first
//!   checkpoint) gets `Ok` once the save is written, or the error.
//! - **Leases.** Every save holds the run under the host's lease (see
//!   [`Lease`]); while it has saved any, the task renews the host's
//!   leases every third of their length, so a live host's runs are never
//!   claimed by a `recover` elsewhere.
//! - **Failures are retried**, every [`RETRY_EVERY`] and with the next
//!   job, until the work is done or the host stops. Lost on a crash:
//!   saves and clears not yet written (a resumed run repeats at most the
//!   step it was in; a run whose clear was lost is found finished by
//!   `recover` and cleared then).
//!
//! Rate: a save per step of a durable run; a clear per finished durable run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::ports::checkpoint::{Checkpoint, CheckpointError, Checkpointer, Lease};
use crate::ports::run::RunId;

/// How soon failed checkpoint work is tried again.
pub(super) const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Who waits for a save.
pub(super) type SaveAck = oneshot::Sender<Result<(), CheckpointError>>;

/// Work for the checkpoint task.
pub(super) enum CheckpointJob {
    /// Save a run's state (the latest of a run wins).
    Save(Box<Checkpoint>, Option<SaveAck>),
    /// These runs' terminal records are in the store.
    Clear(Vec<RunId>),
    /// Write what is pending, then answer.
    Flush(oneshot::Sender<()>),
}

/// The handle the audit actor and its writer send work through.
#[derive(Clone)]
pub(super) struct Checkpoints {
    tx: mpsc::UnboundedSender<CheckpointJob>,
}

impl Checkpoints {
    /// Starts the task.
    pub(super) fn start(
        checkpointer: Arc<dyn Checkpointer>,
        lease: Lease,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Saver {
            checkpointer,
            renew_every: (lease.ttl / 3).max(Duration::from_millis(10)),
            lease,
            renew_at: None,
            rx,
            unsaved: HashMap::new(),
            acks: Vec::new(),
            uncleared: Vec::new(),
        };
        (Checkpoints { tx }, tokio::spawn(task.run()))
    }

    /// Queues a save (answered on `ack` once written, if given).
    pub(super) fn save(&self, checkpoint: Box<Checkpoint>, ack: Option<SaveAck>) {
        if let Err(mpsc::error::SendError(CheckpointJob::Save(_, Some(ack)))) =
            self.tx.send(CheckpointJob::Save(checkpoint, ack))
        {
            let _ = ack.send(Err(CheckpointError::Unavailable(
                "the checkpoint task has stopped".into(),
            )));
        }
    }

    /// Queues clears (the runs' terminal records are in the store).
    pub(super) fn clear(&self, runs: Vec<RunId>) {
        if !runs.is_empty() {
            let _ = self.tx.send(CheckpointJob::Clear(runs));
        }
    }

    /// Waits until everything queued so far was tried.
    pub(super) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(CheckpointJob::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// The task's state.
struct Saver {
    checkpointer: Arc<dyn Checkpointer>,
    /// The host's lease.
    lease: Lease,
    renew_every: Duration,
    /// When to renew the host's leases next (`None`: it holds none yet).
    renew_at: Option<tokio::time::Instant>,
    rx: mpsc::UnboundedReceiver<CheckpointJob>,
    /// The latest unsaved checkpoint per run.
    unsaved: HashMap<RunId, Box<Checkpoint>>,
    /// Who waits for the unsaved ones.
    acks: Vec<SaveAck>,
    /// Runs whose checkpoints are to be deleted.
    uncleared: Vec<RunId>,
}

impl Saver {
    async fn run(mut self) {
        loop {
            let pending = !(self.unsaved.is_empty() && self.uncleared.is_empty());
            let retry_at = pending.then(|| tokio::time::Instant::now() + RETRY_EVERY);
            let wake = match (retry_at, self.renew_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let job = match wake {
                Some(at) => match tokio::time::timeout_at(at, self.rx.recv()).await {
                    Ok(job) => job,
                    Err(_) => {
                        self.renew().await;
                        if pending {
                            self.write().await;
                        }
                        continue;
                    }
                },
                None => self.rx.recv().await,
            };
            let Some(job) = job else {
                // The audit actor stopped: a last try, then end.
                self.write().await;
                return;
            };
            let mut flushes = Vec::new();
            self.take(job, &mut flushes);
            // Everything else queued meanwhile joins this write.
            while let Ok(job) = self.rx.try_recv() {
                self.take(job, &mut flushes);
            }
            self.write().await;
            for f in flushes {
                let _ = f.send(());
            }
        }
    }

    fn take(&mut self, job: CheckpointJob, flushes: &mut Vec<oneshot::Sender<()>>) {
        match job {
            CheckpointJob::Save(c, ack) => {
                self.unsaved.insert(c.run_id, c);
                self.acks.extend(ack);
            }
            CheckpointJob::Clear(runs) => {
                for run in &runs {
                    self.unsaved.remove(run);
                }
                self.uncleared.extend(runs);
            }
            CheckpointJob::Flush(tx) => flushes.push(tx),
        }
    }

    /// Renews the host's leases when it is time.
    async fn renew(&mut self) {
        let Some(at) = self.renew_at else { return };
        if tokio::time::Instant::now() < at {
            return;
        }
        if let Err(e) = self.checkpointer.renew(&self.lease).await {
            tracing::warn!(error = %e, "cannot renew the leases on durable runs; retrying");
        }
        self.renew_at = Some(tokio::time::Instant::now() + self.renew_every);
    }

    /// Saves what is unsaved (answering who waits), then clears. What
    /// fails stays pending.
    async fn write(&mut self) {
        if !self.unsaved.is_empty() {
            let batch: Vec<Checkpoint> = self
                .unsaved
                .values()
                .map(|c| Checkpoint::clone(c))
                .collect();
            match self.checkpointer.save(&batch, &self.lease).await {
                Ok(()) => {
                    if self.renew_at.is_none() {
                        self.renew_at = Some(tokio::time::Instant::now() + self.renew_every);
                    }
                    self.unsaved.clear();
                    for ack in self.acks.drain(..) {
                        let _ = ack.send(Ok(()));
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, runs = batch.len(), "cannot save checkpoints; retrying");
                    // A run being admitted does not wait for a retry.
                    for ack in self.acks.drain(..) {
                        let _ = ack.send(Err(e.clone()));
                    }
                }
            }
        }
        if !self.uncleared.is_empty() {
            match self.checkpointer.clear(&self.uncleared).await {
                Ok(()) => self.uncleared.clear(),
                Err(e) => {
                    tracing::error!(error = %e, runs = self.uncleared.len(), "cannot clear checkpoints; retrying")
                }
            }
        }
    }
}

/// A lease owner id for this host: `HOSTNAME/PID/NONCE`, unique per host
/// and process (the nonce tells two hosts of one process apart).
pub(crate) fn lease_owner() -> String {
    // A whole run id: its leading digits are a time, its rest random.
    let nonce = crate::ports::run::RunId::new();
    format!("{}/{}/{nonce}", hostname(), std::process::id())
}

/// Whether the owner of a lease is provably gone: a process of this
/// machine (same host name) that no longer runs (`/proc` has no entry for
/// its pid). Anything else (another machine, no `/proc`, this very
/// process) cannot be told apart from a live owner: its lease must expire.
pub(crate) fn owner_is_gone(owner: &str) -> bool {
    let mut parts = owner.split('/');
    let (Some(host), Some(pid)) = (parts.next(), parts.next()) else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    host == hostname()
        && pid != std::process::id()
        && std::path::Path::new("/proc/self").exists()
        && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The machine's name (`localhost` when it cannot be read).
fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|h| h.trim().replace('/', "_"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
