//! Durable runs' checkpoints on their own path: a task that owns the
//! [`Checkpointer`] port, beside the audit writer rather than inside it.
//!
#![doc = include_str!("../../../docs/audit-checkpoints.md")]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::ports::checkpoint::{Checkpoint, CheckpointError, Checkpointer, Lease};
use crate::ports::run::{unix_ms, RunId};
use crate::record::{Command, HostRuns, LEASE_LOST};

/// How soon failed checkpoint work is tried again.
pub(super) const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Who waits for a save.
pub(super) type SaveAck = oneshot::Sender<Result<(), CheckpointError>>;

/// A durable run waiting for its step's checkpoint to be written (see the
/// module's guarantees). Called from the checkpoint task: both must return
/// at once (send a message, beat).
pub(crate) trait SaveWaiter: Send + 'static {
    /// The checkpoint is written: the run goes on.
    fn saved(self: Box<Self>);
    /// A write failed and will be retried: the run still waits (and is
    /// alive: waiting for the store is no stall).
    fn still_waiting(&self);
}

/// Work for the checkpoint task.
pub(super) enum CheckpointJob {
    /// Save a run's state (the latest of a run wins).
    Save(Box<Checkpoint>, Option<SaveAck>),
    /// Save a run's state after a step; the run waits until it is written.
    SaveStep(Box<Checkpoint>, Box<dyn SaveWaiter>),
    /// These runs' terminal records are in the store.
    Clear(Vec<RunId>),
    /// Write what is pending, then answer.
    Flush(oneshot::Sender<()>),
    /// Renew now (the process was paused, or the audit writer is about to
    /// write past the last renewal's safe window); answers once done.
    Renew(Option<oneshot::Sender<()>>),
}

/// What the host knows of its leases, read by the audit writer before each
/// batch (atomics: one check per batch) and written by the checkpoint task.
#[derive(Debug, Default)]
pub(crate) struct LeaseWatch {
    /// Unix ms until which the last renewal keeps every lease of the host
    /// (less a third of the lease for safety); 0 before the first one and
    /// after a pause.
    safe_until_ms: AtomicU64,
    /// Unix ms before which no renewal is asked for again (one failed).
    retry_after_ms: AtomicU64,
    /// Unix ms of the last pause noticed (0: none): a renewal that
    /// started before it says nothing of the leases after it.
    paused_at_ms: AtomicU64,
    /// Durable runs the host holds (saved, not cleared).
    held: AtomicU64,
    /// Some run was fenced: the writer drops its records.
    any_fenced: AtomicBool,
    /// The runs fenced (rare; kept for the host's life).
    fenced: Mutex<HashSet<RunId>>,
}

impl LeaseWatch {
    /// Whether the host's leases may have expired (and it holds durable
    /// runs): the writer asks for a renewal before it writes.
    pub(crate) fn stale(&self) -> bool {
        if self.held.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let now = unix_ms();
        now >= self.safe_until_ms.load(Ordering::Relaxed)
            && now >= self.retry_after_ms.load(Ordering::Relaxed)
    }

    /// Whether some run of the host was fenced.
    pub(crate) fn any_fenced(&self) -> bool {
        self.any_fenced.load(Ordering::Relaxed)
    }

    /// The runs fenced so far.
    pub(crate) fn fenced_runs(&self) -> HashSet<RunId> {
        self.fenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A renewal at `started_ms` held for `ttl`. One that started before
    /// the last pause was noticed (it was in flight across the pause, or
    /// the pause fell in its millisecond) keeps nothing safe: the pause's
    /// renewal, queued behind it, decides.
    pub(crate) fn renewed(&self, started_ms: u64, ttl: Duration) {
        if started_ms <= self.paused_at_ms.load(Ordering::Relaxed) {
            return;
        }
        let ttl = ttl.as_millis() as u64;
        self.safe_until_ms
            .store(started_ms + ttl - ttl / 3, Ordering::Relaxed);
    }

    /// The process was not scheduled for a while: nothing is known.
    fn paused(&self) {
        self.paused_at_ms.store(unix_ms(), Ordering::Relaxed);
        self.safe_until_ms.store(0, Ordering::Relaxed);
        self.retry_after_ms.store(0, Ordering::Relaxed);
    }

    fn fence(&self, runs: &[RunId]) {
        if runs.is_empty() {
            return;
        }
        self.fenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(runs.iter().copied());
        self.any_fenced.store(true, Ordering::Relaxed);
    }
}

/// The handle the audit actor and its writer send work through.
#[derive(Clone)]
pub(super) struct Checkpoints {
    tx: mpsc::UnboundedSender<CheckpointJob>,
}

impl Checkpoints {
    /// Starts the task (the host took its lease as it was built: the
    /// first renewal is a third of the lease later).
    pub(super) fn start(
        checkpointer: Arc<dyn Checkpointer>,
        lease: Lease,
        watch: Arc<LeaseWatch>,
        live: Arc<HostRuns>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let renew_every = (lease.ttl / 3).max(Duration::from_millis(10));
        let task = Saver {
            checkpointer,
            renew_every,
            lease,
            renew_at: tokio::time::Instant::now() + renew_every,
            rx,
            unsaved: HashMap::new(),
            acks: Vec::new(),
            steps: HashMap::new(),
            uncleared: Vec::new(),
            held: HashSet::new(),
            watch,
            live,
        };
        (Checkpoints { tx }, tokio::spawn(task.run()))
    }

    /// Renews the leases now; resolves once done (or the task is gone).
    pub(super) async fn renew_now(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(CheckpointJob::Renew(Some(tx))).is_ok() {
            let _ = rx.await;
        }
    }

    /// The process was paused: renew (and find lost runs) at once.
    pub(super) fn paused(&self, watch: &LeaseWatch) {
        watch.paused();
        let _ = self.tx.send(CheckpointJob::Renew(None));
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

    /// Queues a step's save; `waiter` is told once it is written.
    pub(super) fn save_step(&self, checkpoint: Box<Checkpoint>, waiter: Box<dyn SaveWaiter>) {
        // If the task is gone (the host stopped) the waiter goes with the
        // message: the run waits for its deadline or the host's shutdown.
        let _ = self.tx.send(CheckpointJob::SaveStep(checkpoint, waiter));
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
    /// When to renew the host's leases next.
    renew_at: tokio::time::Instant,
    rx: mpsc::UnboundedReceiver<CheckpointJob>,
    /// The latest unsaved checkpoint per run.
    unsaved: HashMap<RunId, Box<Checkpoint>>,
    /// Who waits for the unsaved ones.
    acks: Vec<SaveAck>,
    /// Runs waiting for their step's checkpoint (its unsaved one).
    steps: HashMap<RunId, Box<dyn SaveWaiter>>,
    /// Runs whose checkpoints are to be deleted.
    uncleared: Vec<RunId>,
    /// Runs saved under the host's lease and not cleared: those it holds.
    held: HashSet<RunId>,
    /// Shared with the audit writer.
    watch: Arc<LeaseWatch>,
    /// The host's runs in flight (a fenced one is stopped).
    live: Arc<HostRuns>,
}

impl Saver {
    async fn run(mut self) {
        loop {
            let pending = !(self.unsaved.is_empty() && self.uncleared.is_empty());
            let retry_at = pending.then(|| tokio::time::Instant::now() + RETRY_EVERY);
            let wake = retry_at.map_or(self.renew_at, |a| a.min(self.renew_at));
            let job = match tokio::time::timeout_at(wake, self.rx.recv()).await {
                Ok(job) => job,
                Err(_) => {
                    if tokio::time::Instant::now() >= self.renew_at {
                        self.renew().await;
                    }
                    if pending {
                        self.write().await;
                    }
                    continue;
                }
            };
            let Some(job) = job else {
                // The audit actor stopped: a last try, then end.
                self.write().await;
                return;
            };
            let mut flushes = Vec::new();
            let mut renew = None;
            self.take(job, &mut flushes, &mut renew);
            // Everything else queued meanwhile joins this write.
            while let Ok(job) = self.rx.try_recv() {
                self.take(job, &mut flushes, &mut renew);
            }
            if let Some(waiting) = renew {
                self.renew().await;
                for w in waiting.into_iter().flatten() {
                    let _ = w.send(());
                }
            }
            self.write().await;
            for f in flushes {
                let _ = f.send(());
            }
        }
    }

    fn take(
        &mut self,
        job: CheckpointJob,
        flushes: &mut Vec<oneshot::Sender<()>>,
        renew: &mut Option<Vec<Option<oneshot::Sender<()>>>>,
    ) {
        match job {
            CheckpointJob::Renew(w) => renew.get_or_insert_with(Vec::new).push(w),
            CheckpointJob::Save(c, ack) => {
                self.queue(c);
                self.acks.extend(ack);
            }
            CheckpointJob::SaveStep(c, waiter) => {
                self.steps.insert(c.run_id, waiter);
                self.queue(c);
            }
            CheckpointJob::Clear(runs) => {
                for run in &runs {
                    self.unsaved.remove(run);
                    self.steps.remove(run);
                }
                self.uncleared.extend(runs);
            }
            CheckpointJob::Flush(tx) => flushes.push(tx),
        }
    }

    /// Queues a run's latest checkpoint in place of an unsaved one: what
    /// it leaves unchanged is then counted from the last save written.
    fn queue(&mut self, mut c: Box<Checkpoint>) {
        if let Some(earlier) = self.unsaved.get(&c.run_id) {
            c.unchanged = earlier.unchanged.then(c.unchanged);
        }
        self.unsaved.insert(c.run_id, c);
    }

    /// Renews the host's leases, and stops the runs it finds it lost.
    async fn renew(&mut self) {
        let started = unix_ms();
        match self.checkpointer.renew(&self.lease).await {
            Ok(renewal) => {
                self.watch.renewed(started, self.lease.ttl);
                if renewal.taken_over {
                    tracing::warn!(
                        owner = %self.lease.owner,
                        "this host's lease had expired (the process was paused or cut off) and a `recover` elsewhere took the host over: runs in flight here that are not durable may have been ended `interrupted` there (the first terminal record of a run is the one kept)"
                    );
                }
                if renewal.runs < self.held.len() as u64 {
                    match self.checkpointer.held_by(&self.lease.owner).await {
                        Ok(still) => {
                            let still: HashSet<RunId> = still.into_iter().collect();
                            let lost: Vec<RunId> = self
                                .held
                                .iter()
                                .filter(|r| !still.contains(r))
                                .copied()
                                .collect();
                            self.lost(lost);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read which durable runs this host still holds")
                        }
                    }
                }
            }
            Err(e) => {
                self.watch
                    .retry_after_ms
                    .store(started + RETRY_EVERY.as_millis() as u64, Ordering::Relaxed);
                tracing::warn!(error = %e, "cannot renew this host's leases; retrying");
            }
        }
        self.renew_at = tokio::time::Instant::now() + self.renew_every;
    }

    /// Runs another host took over: stopped here, nothing more of them
    /// written (their records dropped by the audit writer).
    fn lost(&mut self, runs: Vec<RunId>) {
        if runs.is_empty() {
            return;
        }
        tracing::warn!(
            runs = runs.len(),
            owner = %self.lease.owner,
            "durable runs of this host were taken over by another host while this host's lease had expired (the process was paused or cut off): they are stopped here, without a terminal record ({LEASE_LOST})"
        );
        self.watch.fence(&runs);
        for run in &runs {
            self.held.remove(run);
            self.unsaved.remove(run);
            self.steps.remove(run);
            if let Some(shared) = self.live.get(run) {
                shared.command(Command::Fence);
            }
        }
        self.watch
            .held
            .store(self.held.len() as u64, Ordering::Relaxed);
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
                Ok(lost) => {
                    self.unsaved.clear();
                    self.held.extend(batch.iter().map(|c| c.run_id));
                    for ack in self.acks.drain(..) {
                        let _ = ack.send(Ok(()));
                    }
                    // The runs another host took over are stopped, not
                    // sent on (`lost` drops their waiters).
                    self.lost(lost);
                    for (_, waiter) in self.steps.drain() {
                        waiter.saved();
                    }
                    self.watch
                        .held
                        .store(self.held.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(error = %e, runs = batch.len(), "cannot save checkpoints; retrying");
                    // A run being admitted does not wait for a retry; a
                    // run between steps does (bounded by its deadline).
                    for ack in self.acks.drain(..) {
                        let _ = ack.send(Err(e.clone()));
                    }
                    for waiter in self.steps.values() {
                        waiter.still_waiting();
                    }
                }
            }
        }
        if !self.uncleared.is_empty() {
            match self.checkpointer.clear(&self.uncleared).await {
                Ok(()) => {
                    for run in self.uncleared.drain(..) {
                        self.held.remove(&run);
                    }
                    self.watch
                        .held
                        .store(self.held.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(error = %e, runs = self.uncleared.len(), "cannot clear checkpoints; retrying")
                }
            }
        }
    }
}

/// A lease owner id for this host: `HOSTNAME/PID/NONCE`, unique per host
/// and process: the nonce is the process's random salt (so a later process
/// that gets the same pid is another owner) and a count of the process's
/// hosts. Short: every run's `run.start` record names it.
pub(crate) fn lease_owner() -> String {
    static HOSTS: AtomicU64 = AtomicU64::new(0);
    // A run id's digits 12 to 19 are its process's random salt.
    let id = RunId::new().to_hex();
    let salt = std::str::from_utf8(&id[12..20]).unwrap_or("0");
    let n = HOSTS.fetch_add(1, Ordering::Relaxed);
    format!("{}/{}/{salt}{n}", hostname(), std::process::id())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal in flight across a pause (started before it, answered
    /// after it) keeps nothing safe: the writer still renews first. One
    /// started after the pause does.
    #[test]
    fn a_renewal_that_straddles_a_pause_keeps_nothing_safe() {
        let ttl = Duration::from_secs(30);
        let watch = LeaseWatch::default();
        watch.held.store(3, Ordering::Relaxed);
        let before = unix_ms();
        watch.renewed(before, ttl);
        assert!(!watch.stale(), "a fresh renewal is safe");
        watch.paused();
        assert!(watch.stale(), "nothing is known after a pause");
        // The renewal that started before the pause answers now.
        watch.renewed(before, ttl);
        assert!(watch.stale(), "a renewal from before the pause counted");
        // The pause's own renewal, a millisecond or more later.
        let after = watch.paused_at_ms.load(Ordering::Relaxed) + 1;
        watch.renewed(after, ttl);
        assert!(!watch.stale());
    }
}
