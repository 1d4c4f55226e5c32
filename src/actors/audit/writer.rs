//! The audit writer: a task that owns the store side of the audit actor —
//! appends (pipelined when the store allows), the spool, the outage
//! backoff, the records held in memory — and tells the checkpoint task
//! which durable runs' terminal records reached the store.
//!
//! Guarantees (see the actor's module for the whole story): batches reach
//! the store in the order the actor cut them, behind whatever the spool or
//! memory still holds; a result is handed over once its batch was written
//! to the store or the spool (or, when neither works, held — a durable
//! run's result then waits for a write that works, until its deadline,
//! and is `off_record` past it); a durable run's checkpoint is cleared
//! only once its terminal record is in the store.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use ractor::ActorRef;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::checkpoints::{Checkpoints, LeaseWatch};
use super::spool;
use super::{
    deliver, Audit, AuditHealth, AuditMsg, Demand, Job, Waiter, BACKOFF_MAX, BACKOFF_MIN,
    COALESCE_BATCHES, HELD_MAX, REPLAY_CHUNKS_PER_WRITE,
};
use crate::ports::audit::{AuditEntry, AuditRecord, AuditStore, AuditStoreError, Unrecorded};
use crate::ports::run::{RunId, RunResult, RunStatus};
use crate::record::{off_record, Ending, LEASE_LOST};

/// The writer task: owns the store side — appends, the spool, the outage
/// backoff, the records held in memory.
pub(super) struct Writer {
    store: Arc<dyn AuditStore>,
    spool: Option<PathBuf>,
    /// Keeps other processes off `spool` while the writer lives.
    _spool_claim: Option<Arc<super::spool::SpoolClaim>>,
    max_batch: usize,
    /// How soon to come back to the spool when the store works.
    max_age: Duration,
    rx: mpsc::Receiver<Job>,
    /// Records not yet written anywhere (a batch, or held during an outage).
    held: Vec<AuditRecord>,
    failed_batches: u64,
    /// Set while the store fails.
    outage: Option<Outage>,
    /// The spool holds records not yet replayed.
    spool_pending: bool,
    /// Byte offset of the first spool record not yet replayed.
    spool_offset: u64,
    /// The last spool write failed.
    spool_broken: bool,
    /// Records dropped because they could be neither written nor held.
    dropped: u64,
    /// The runs whose terminal records were among them.
    dropped_terminal: Unrecorded,
    /// Durable runs' results waiting for their held terminal records to
    /// be written or spooled (each until its deadline).
    patient: Vec<Waiter>,
    /// Where checkpoint clears go.
    checkpoints: Checkpoints,
    /// What the host knows of its leases (fencing).
    lease_watch: Arc<LeaseWatch>,
    /// Reported to the host (see [`AuditHealth`]).
    health: Arc<AuditHealth>,
    /// Durable runs whose terminal record is not in the store yet (held,
    /// spooled, or in a batch being written): their checkpoints are
    /// cleared once it is.
    unsettled: HashSet<RunId>,
    /// The batch being written while the next one is started (stores that
    /// pipeline only).
    in_flight: Option<InFlight>,
    /// Tells the actor when this task waits for work.
    demand: Arc<Demand>,
    actor: ActorRef<AuditMsg>,
}

/// What an owned append answers: done, or why not and the batch back.
type AppendOutcome = Result<(), (AuditStoreError, Vec<AuditRecord>)>;

/// An `append` under way, and the results it holds back.
struct InFlight {
    append: Pin<Box<dyn Future<Output = AppendOutcome> + Send>>,
    waiting: Vec<Waiter>,
    /// Durable runs whose terminal record is in it.
    settles: Vec<RunId>,
}

struct Outage {
    retry_at: Instant,
    backoff: Duration,
}

impl Writer {
    pub(super) async fn new(
        audit: &Audit,
        rx: mpsc::Receiver<Job>,
        demand: Arc<Demand>,
        actor: ActorRef<AuditMsg>,
        checkpoints: Checkpoints,
    ) -> Self {
        let mut spool_pending = false;
        if let Some(path) = &audit.spool {
            let p = path.clone();
            match tokio::task::spawn_blocking(move || super::spool::prepare(&p)).await {
                Ok(Ok(records)) => {
                    spool_pending = records > 0;
                    audit.health.spooled.store(records, Ordering::Relaxed);
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, path = %path.display(), "cannot read the audit spool")
                }
                Err(e) => {
                    tracing::error!(error = %e, path = %path.display(), "cannot read the audit spool")
                }
            }
            if spool_pending {
                tracing::info!(path = %path.display(), "the audit spool holds records of an earlier process; replaying them");
            }
        }
        Writer {
            store: audit.store.clone(),
            spool: audit.spool.clone(),
            _spool_claim: audit.spool_claim.clone(),
            max_batch: audit.max_batch,
            max_age: audit.max_age,
            rx,
            held: Vec::new(),
            failed_batches: 0,
            outage: None,
            spool_pending,
            spool_offset: 0,
            spool_broken: false,
            dropped: 0,
            dropped_terminal: Unrecorded::default(),
            patient: Vec::new(),
            checkpoints,
            lease_watch: audit.lease_watch.clone(),
            health: audit.health.clone(),
            unsettled: HashSet::new(),
            in_flight: None,
            demand,
            actor,
        }
    }

    /// Called with nothing in flight: if nothing is queued either, says so,
    /// and asks the actor for what it holds, if anything (the actor checks
    /// `idle` after it buffers, this checks `buffered` after it sets `idle`:
    /// one of the two sees the other, so no record waits for the timer with
    /// the writer idle).
    fn ask_for_work(&self) {
        if !self.rx.is_empty() {
            return;
        }
        self.demand.idle.store(true, Ordering::SeqCst);
        if self.demand.buffered.load(Ordering::SeqCst) {
            let _ = self.actor.cast(AuditMsg::Demand);
        }
    }

    pub(super) async fn run(mut self) {
        loop {
            let job = if let Some(fl) = &mut self.in_flight {
                // A batch is being written: deliver its results as soon as
                // it is, or start the next batch meanwhile.
                tokio::select! {
                    biased;
                    res = &mut fl.append => {
                        self.settle_in_flight(Some(res)).await;
                        continue;
                    }
                    job = self.rx.recv() => job,
                }
            } else {
                self.ask_for_work();
                match self.retry_delay() {
                    Some(delay) => match tokio::time::timeout(delay, self.rx.recv()).await {
                        Ok(job) => job,
                        Err(_) => {
                            // Time to retry the store (replay the spool, write what is held).
                            self.write(false).await;
                            continue;
                        }
                    },
                    None => self.rx.recv().await,
                }
            };
            if !self.handle(job).await {
                return;
            }
        }
    }

    /// Handles a job (`None`: the actor stopped); returns whether to go on.
    async fn handle(&mut self, job: Option<Job>) -> bool {
        match job {
            Some(Job::Batch {
                records,
                waiting,
                durable_ended,
            }) => {
                let mut batch = records;
                let mut waiting = waiting;
                self.unsettled.extend(durable_ended);
                let mut drain = None;
                // Batches that queued up while we wrote go in the same
                // append (if that saves the store work).
                let join = if self.store.joins_batches() {
                    COALESCE_BATCHES
                } else {
                    1
                };
                for _ in 1..join {
                    match self.rx.try_recv() {
                        Ok(Job::Batch {
                            records,
                            waiting: w,
                            durable_ended,
                        }) => {
                            batch.extend(records);
                            waiting.extend(w);
                            self.unsettled.extend(durable_ended);
                        }
                        Ok(Job::Drain(tx)) => {
                            drain = Some(tx);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                self.fence(&mut batch, &mut waiting).await;
                if drain.is_none() && !batch.is_empty() && self.may_pipeline() {
                    self.start_append(batch, waiting).await;
                    return true;
                }
                // The batch in flight goes first (its records, should it
                // fail, are older than these).
                self.settle_in_flight(None).await;
                self.hold(batch);
                self.write(drain.is_some()).await;
                self.hand_over(waiting);
                if let Some(tx) = drain {
                    self.note_unrecorded();
                    self.checkpoints.flush().await;
                    let _ = tx.send(());
                }
                true
            }
            Some(Job::Drain(tx)) => {
                self.settle_in_flight(None).await;
                self.write(true).await;
                self.note_unrecorded();
                self.checkpoints.flush().await;
                let _ = tx.send(());
                true
            }
            None => {
                // The actor stopped: write everything, then end; durable
                // results still waiting are told they are off the record.
                self.settle_in_flight(None).await;
                self.write(true).await;
                self.give_up(true);
                self.note_unrecorded();
                self.checkpoints.flush().await;
                false
            }
        }
    }

    /// Fencing: the records of durable runs another host took over are
    /// dropped (their callers get a `cancelled`/`lease_lost` result, and
    /// their checkpoints stay: they are the other host's). When the host's
    /// leases may have expired (a pause, an old renewal), they are renewed
    /// first, which finds such runs. Costs a batch three atomic loads
    /// otherwise.
    async fn fence(&mut self, batch: &mut Vec<AuditRecord>, waiting: &mut [Waiter]) {
        if self.lease_watch.stale() {
            self.checkpoints.renew_now().await;
        }
        if !self.lease_watch.any_fenced() {
            return;
        }
        let fenced = self.lease_watch.fenced_runs();
        let before = batch.len();
        batch.retain(|r| !fenced.contains(&r.run_id));
        if batch.len() == before {
            return;
        }
        tracing::warn!(
            records = before - batch.len(),
            "records of durable runs another host took over were not written"
        );
        self.unsettled.retain(|r| !fenced.contains(r));
        for Waiter { result, .. } in waiting.iter_mut() {
            if fenced.contains(&result.run_id) && result.error_kind.as_deref() != Some(LEASE_LOST) {
                let ending = Ending::fenced();
                *result = Arc::new(RunResult {
                    status: RunStatus::Cancelled,
                    kill_reason: None,
                    loop_kind: None,
                    error_kind: ending.error_kind,
                    error: ending.error,
                    output: None,
                    ..RunResult::clone(result)
                });
            }
        }
    }

    /// Whether a new batch may be written while an earlier one is: the
    /// store pipelines, it works, and nothing older waits in the spool or
    /// in memory (new records queue behind those).
    fn may_pipeline(&self) -> bool {
        self.store.pipelines()
            && self.outage.is_none()
            && !self.spool_pending
            && self.held.is_empty()
    }

    /// The durable runs whose terminal record is in `records` and whose
    /// checkpoint waits for it (none to look for: no scan).
    fn settled_by(&self, records: &[AuditRecord]) -> Vec<RunId> {
        if self.unsettled.is_empty() {
            return Vec::new();
        }
        records
            .iter()
            .filter(|r| r.is_terminal() && self.unsettled.contains(&r.run_id))
            .map(|r| r.run_id)
            .collect()
    }

    /// These runs' terminal records are in the store: their checkpoints go.
    fn settle_runs(&mut self, runs: Vec<RunId>) {
        if runs.is_empty() {
            return;
        }
        for run in &runs {
            self.unsettled.remove(run);
        }
        self.checkpoints.clear(runs);
    }

    /// Starts writing a batch behind the batch in flight: the store queues
    /// it in the first poll (encoding it there, while the SQL of the batch
    /// before runs), then the batch before is settled and this one becomes
    /// the batch in flight.
    async fn start_append(&mut self, batch: Vec<AuditRecord>, waiting: Vec<Waiter>) {
        let store = self.store.clone();
        let settles = self.settled_by(&batch);
        let mut append: InFlight = InFlight {
            append: Box::pin(async move { store.append_owned(batch).await }),
            waiting,
            settles,
        };
        let first = std::future::poll_fn(|cx| Poll::Ready(append.append.as_mut().poll(cx))).await;
        self.settle_in_flight(None).await;
        match first {
            Poll::Ready(res) => self.settle(res, append.waiting, append.settles).await,
            Poll::Pending => self.in_flight = Some(append),
        }
    }

    /// Waits for the batch in flight (unless its outcome is given) and
    /// settles it.
    async fn settle_in_flight(&mut self, outcome: Option<AppendOutcome>) {
        let Some(fl) = self.in_flight.take() else {
            return;
        };
        let res = match outcome {
            Some(res) => res,
            None => fl.append.await,
        };
        self.settle(res, fl.waiting, fl.settles).await;
    }

    /// A pipelined batch is written, or not: then its records take the
    /// serial path's way (spool, or held), behind those of batches before
    /// it. Its results are handed over as on the serial path.
    async fn settle(&mut self, res: AppendOutcome, waiting: Vec<Waiter>, settles: Vec<RunId>) {
        match res {
            Ok(()) => self.settle_runs(settles),
            Err((e, batch)) => {
                self.hold(batch);
                self.failed(&e);
                self.write(false).await;
            }
        }
        self.hand_over(waiting);
    }

    /// Hands over the results of a batch just written (or not): at once
    /// when nothing is held — their records are in the store or the spool.
    /// While records are held, a result that is not durable still goes at
    /// once (a run never blocks on bookkeeping; it is counted at shutdown
    /// if its record is still held), and a durable run's waits for a write
    /// that works, until its deadline (`give_up`).
    fn hand_over(&mut self, waiting: Vec<Waiter>) {
        if self.held.is_empty() {
            return deliver(waiting);
        }
        for w in waiting {
            if w.wait_until.is_some() {
                self.patient.push(w);
            } else {
                let _ = w.deliver.send(w.result);
            }
        }
        self.give_up(false);
    }

    /// Durable results waiting on held records: delivered once nothing is
    /// held (written or spooled); otherwise those past their deadline (or
    /// all, with `all`) are told they are off the record, and their held
    /// terminal records are changed to say what their callers were told.
    fn give_up(&mut self, all: bool) {
        if self.patient.is_empty() {
            return;
        }
        if self.held.is_empty() {
            return deliver(std::mem::take(&mut self.patient));
        }
        let now = Instant::now();
        let (due, wait): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.patient)
            .into_iter()
            .partition(|w| all || w.wait_until.is_some_and(|t| now >= t));
        self.patient = wait;
        for w in due {
            let told = Arc::new(off_record(&w.result));
            if let Some(r) = self
                .held
                .iter_mut()
                .rev()
                .find(|r| r.run_id == told.run_id && r.is_terminal())
            {
                r.entry = AuditEntry::Terminal(told.clone());
            }
            tracing::error!(run_id = %told.run_id, "a durable run's terminal record could be written neither to the audit store nor to its spool before its deadline: its caller is told error/store_unavailable");
            let _ = w.deliver.send(told);
        }
    }

    /// The runs whose terminal records are held or were dropped, by the
    /// status their callers were (or, waiting, will be) told: for the
    /// host's shutdown report.
    fn note_unrecorded(&self) {
        let mut u = self.dropped_terminal;
        for r in &self.held {
            if let AuditEntry::Terminal(res) = &r.entry {
                if self.patient.iter().any(|w| w.result.run_id == r.run_id) {
                    u.add(RunStatus::Error);
                } else {
                    u.add(res.status);
                }
            }
        }
        self.health.set_unrecorded(u);
    }

    /// Holds a batch to write: moved in when nothing else is held (no
    /// copy), appended otherwise.
    fn hold(&mut self, records: Vec<AuditRecord>) {
        if self.held.is_empty() {
            self.held = records;
        } else {
            self.held.extend(records);
        }
    }

    /// When to come back without new work: while the spool or memory holds
    /// records, at the retry time (or soon, when the store works).
    fn retry_delay(&self) -> Option<Duration> {
        if !self.spool_pending && self.held.is_empty() {
            return None;
        }
        let now = Instant::now();
        let mut delay = match &self.outage {
            Some(o) => o.retry_at.saturating_duration_since(now),
            None => self.max_age,
        };
        // A durable result waiting past its deadline is told so then.
        if let Some(first) = self.patient.iter().filter_map(|w| w.wait_until).min() {
            delay = delay.min(first.saturating_duration_since(now));
        }
        Some(delay.max(Duration::from_millis(1)))
    }

    /// Writes what is held: replays the spool first (a slice of it, or all
    /// of it when `force`), then the held records; what the store does not
    /// take goes to the spool, or stays held (bounded). `force` ignores the
    /// retry backoff.
    async fn write(&mut self, force: bool) {
        let may_try = force
            || self
                .outage
                .as_ref()
                .is_none_or(|o| Instant::now() >= o.retry_at);
        if may_try && (self.spool_pending || !self.held.is_empty()) {
            let mut ok = true;
            if self.spool_pending {
                let chunks = if force {
                    usize::MAX
                } else {
                    REPLAY_CHUNKS_PER_WRITE
                };
                ok = self.replay(chunks).await;
            }
            // While the spool still holds records, new ones queue behind them.
            if ok && !self.spool_pending && !self.held.is_empty() {
                let batch = std::mem::take(&mut self.held);
                let settles = self.settled_by(&batch);
                match self.store.append_owned(batch).await {
                    Ok(()) => self.settle_runs(settles),
                    Err((e, batch)) => {
                        self.held = batch;
                        ok = false;
                        self.failed(&e);
                    }
                }
            }
            if ok {
                if let Some(o) = self.outage.take() {
                    tracing::info!(
                        failed_batches = self.failed_batches,
                        last_backoff_ms = o.backoff.as_millis() as u64,
                        "audit store works again"
                    );
                }
            }
        }
        if self.held.is_empty() {
            self.report();
            self.give_up(false);
            return;
        }
        if let Some(path) = &self.spool {
            match spool::append(path, &self.held).await {
                Ok(()) => {
                    self.spool_pending = true;
                    self.spool_broken = false;
                    self.health
                        .spooled
                        .fetch_add(self.held.len() as u64, Ordering::Relaxed);
                    self.held.clear();
                }
                Err(e) => {
                    if !self.spool_broken {
                        tracing::error!(error = %e, path = %path.display(), records = self.held.len(), "cannot write the audit spool; holding the records in memory");
                    }
                    self.spool_broken = true;
                }
            }
        }
        self.bound();
        self.report();
        self.give_up(false);
        crate::telemetry::audit_held(self.held.len(), self.spool.as_deref());
    }

    /// Tells the host what is held (see [`AuditHealth`]).
    fn report(&self) {
        let h = &self.health;
        h.held.store(self.held.len() as u64, Ordering::Relaxed);
        h.dropped.store(self.dropped, Ordering::Relaxed);
        let unavailable = !self.held.is_empty();
        if h.unavailable.swap(unavailable, Ordering::Relaxed) != unavailable {
            if unavailable {
                tracing::error!(records = self.held.len(), spool = ?self.spool, "the audit store and the spool both fail: records are held in memory (bounded) and no run is admitted until one works again");
            } else {
                tracing::info!("audit records are written again; runs are admitted");
            }
        }
    }

    /// Replays up to `chunks` chunks of the spool into the store, in order.
    /// Returns whether the store took everything it was given; truncates
    /// the spool once all of it is replayed.
    async fn replay(&mut self, chunks: usize) -> bool {
        let Some(path) = self.spool.clone() else {
            self.spool_pending = false;
            return true;
        };
        for _ in 0..chunks {
            let chunk = match spool::read(&path, self.spool_offset, self.max_batch).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, path = %path.display(), "cannot read the audit spool");
                    return false;
                }
            };
            if chunk.skipped > 0 {
                tracing::error!(
                    lines = chunk.skipped,
                    path = %path.display(),
                    "audit spool lines that do not parse were skipped"
                );
            }
            if chunk.records.is_empty() && chunk.next_offset == self.spool_offset {
                // Everything is in the store.
                if let Err(e) = spool::truncate(&path).await {
                    tracing::error!(error = %e, path = %path.display(), "cannot truncate the audit spool; it will be replayed again (duplicates are ignored)");
                }
                self.spool_pending = false;
                self.spool_offset = 0;
                self.health.spooled.store(0, Ordering::Relaxed);
                tracing::info!(path = %path.display(), "audit spool replayed into the store");
                return true;
            }
            if !chunk.records.is_empty() {
                if let Err(e) = self.store.append(&chunk.records).await {
                    self.failed(&e);
                    return false;
                }
                let settles = self.settled_by(&chunk.records);
                self.settle_runs(settles);
                let n = chunk.records.len() as u64;
                let _ =
                    self.health
                        .spooled
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                            Some(v.saturating_sub(n))
                        });
            }
            self.spool_offset = chunk.next_offset;
        }
        true
    }

    /// Notes a store failure and schedules the next attempt.
    fn failed(&mut self, e: &AuditStoreError) {
        self.failed_batches += 1;
        let backoff = match &self.outage {
            Some(o) => (o.backoff * 2).min(BACKOFF_MAX),
            None => {
                let to = if self.spool.is_some() {
                    "the spool"
                } else {
                    "memory (bounded)"
                };
                tracing::warn!(error = %e, failed_batches = self.failed_batches, "audit store write failed; records go to {to} until it works again");
                BACKOFF_MIN
            }
        };
        self.outage = Some(Outage {
            retry_at: Instant::now() + backoff,
            backoff,
        });
    }

    /// Bounds what is held in memory, dropping the oldest records.
    fn bound(&mut self) {
        if self.held.len() > HELD_MAX {
            let cut = self.held.len() - HELD_MAX + HELD_MAX / 8;
            for r in self.held.drain(..cut) {
                if let AuditEntry::Terminal(res) = &r.entry {
                    // A durable result still waiting is told it is off the record.
                    let waits = self.patient.iter().any(|w| w.result.run_id == r.run_id);
                    self.dropped_terminal
                        .add(if waits { RunStatus::Error } else { res.status });
                }
            }
            self.dropped += cut as u64;
            tracing::error!(
                dropped = cut,
                dropped_total = self.dropped,
                "audit store unavailable and nowhere to spool: oldest audit records dropped"
            );
        }
    }
}
