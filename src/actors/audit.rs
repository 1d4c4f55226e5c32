//! The audit actor: receives every run's audit records (casts), buffers
//! them, and hands them in batches — at most `max_batch` records, at most
//! `max_age` old — to its writer, a task that owns the [`AuditStore`] port
//! and calls `append` (one transaction) per batch.
//!
//! Batches are cut by group commit: when the writer is idle, the actor
//! hands over what it holds as soon as the messages already in its mailbox
//! are buffered; while a write is under way, records gather, and the writer
//! asks for them when it is done. So a lone run (a chat turn, a sub-agent)
//! waits for its own write only, never for `max_age` (`agentvisor swarm`
//! of the hello agent one run at a time: p50 from 2.1 ms to 5 µs in
//! memory, from 6.3 ms to 0.09 ms on SQLite), and under load batches grow
//! with the write time. `max_age` bounds the wait only when the writer does
//! not ask.
//!
//! The writer is a separate task so that the actor keeps batching while a
//! write is in flight: encoding and the store's I/O of one batch overlap
//! with the runs producing the next. Between them sits a queue of at most
//! [`WRITER_QUEUE`] batches (the back-pressure: when it is full the actor
//! waits, and records wait in its mailbox); batches that queued up while
//! the writer was busy are written together, in order, in one `append`.
//! With a store that pipelines ([`AuditStore::pipelines`]: SQLite, whose
//! `append` encodes and queues in its first poll), the writer starts the
//! next batch while the last one is written, so encoding one overlaps the
//! SQL of the other; the store applies them in order or refuses the later
//! one, which then takes the failure path behind the earlier one. Batches
//! that carry checkpoint work, and all batches while the store fails or
//! the spool holds records, are written one at a time.
//!
//! A run's terminal record comes with the run's result channel: the result
//! is handed to the caller only once the batch holding its terminal record
//! was written — to the store, or to the spool while the store fails — so a
//! caller never sees a result that is not on record. Results are delivered
//! even when neither works (a run never blocks on bookkeeping).
//!
//! # When the store fails
//!
//! - **With a spool** (`HostConfig::audit_spool`): the batch is appended to
//!   the spool, an append-only file of JSON lines (one [`AuditRecord`] per
//!   line), and the store is retried with a backoff (100 ms doubling to
//!   5 s). While the spool holds records it is the queue: new batches are
//!   appended behind them, and each write replays a bounded slice of it into
//!   the store, in order, so the store receives every record in the order it
//!   was produced. Once all of it is replayed the file is truncated. A
//!   replay may repeat records a failed replay had already written; stores
//!   ignore a `(run_id, seq)` they hold. A spool left by a previous process
//!   is replayed when the actor starts. The spool is written without
//!   `fsync`: it survives a process crash, like the SQLite store in
//!   `synchronous = NORMAL`. One host per spool file.
//! - **Without a spool** (or while the spool cannot be written): the
//!   records are held in memory and retried with the same backoff, at most
//!   [`HELD_MAX`] of them; past that the oldest are dropped and counted (an
//!   error log line says how many).
//!
//! Rate: one cast per handled run message that produced records (a few per
//! model iteration). `Drain` writes everything buffered (replaying the whole
//! spool, ignoring the backoff) before it answers, so nothing is lost on a
//! clean shutdown while the store or the spool works; stopping the actor
//! gracefully does the same. Lost on a crash: the buffer and the writer's
//! queue (a few batches).

use std::future::Future;
use std::io::{BufRead, Seek, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ports::audit::{AuditEntry, AuditRecord, AuditStats, AuditStore, AuditStoreError};
use crate::ports::checkpoint::{Checkpoint, CheckpointError, Checkpointer};
use crate::ports::run::{RunId, RunResult};
use crate::record::{Delivery, Finished, Terminal};

/// Records held in memory at most while the store fails and no spool takes them.
pub const HELD_MAX: usize = 100_000;

/// Batches queued in front of the writer at most.
pub const WRITER_QUEUE: usize = 4;

/// Room past `max_batch` in the buffer: the batch is cut once a message
/// takes it to `max_batch`, so the message that does (one run's records)
/// fits without regrowing — and copying — the whole buffer.
const BATCH_SLACK: usize = 64;

/// Queued batches written together in one `append`, at most.
const COALESCE_BATCHES: usize = 8;

/// The first retry delay after a store failure; it doubles up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Spool chunks (of `max_batch` records) replayed per write, so a long
/// replay does not hold the writer (and the results waiting on it) for long.
const REPLAY_CHUNKS_PER_WRITE: usize = 8;

/// Messages to the audit actor.
pub enum AuditMsg {
    /// Several records of one run, in order.
    Records(Vec<AuditRecord>),
    /// A run's terminal record, and where its result goes once written.
    Terminal {
        /// The run's records not sent yet, in order, ahead of the terminal
        /// one (so a run that ends in one handler costs one message).
        preceding: Vec<AuditRecord>,
        /// The terminal record.
        record: AuditRecord,
        /// Where the result goes once the record is written.
        deliver: Delivery,
        /// The run is durable: clear its checkpoint once the record is written.
        durable: bool,
    },
    /// A durable run's checkpoint, saved with the next batch (only the
    /// latest of a run is written); `saved` answers once it is.
    Checkpoint {
        /// The state to save.
        checkpoint: Box<Checkpoint>,
        /// Who waits for the save (a run being accepted).
        saved: Option<oneshot::Sender<Result<(), CheckpointError>>>,
    },
    /// Write the buffer (timer).
    Flush,
    /// Write the buffer: the writer is idle (sent by the writer, or by the
    /// actor to itself so that the messages before it join the batch).
    Demand,
    /// Write the buffer and answer with the store's counts (shutdown).
    Drain(RpcReplyPort<AuditStats>),
}

/// Hands what finalizing a run produced to the audit actor: the terminal
/// package (records, then the terminal record; the result is delivered
/// once written), or the records alone. If the audit actor is gone (a host
/// torn down hard), the result is delivered anyway.
pub(crate) fn send_finished(audit: &ActorRef<AuditMsg>, finished: Finished) {
    match finished {
        Finished::Already(records) => send_records(audit, records),
        Finished::Suspended(records, run) => {
            send_records(audit, records);
            run.tell_parent();
        }
        Finished::Terminal(t) => {
            let Terminal {
                preceding,
                record,
                deliver,
                durable,
                run,
            } = *t;
            let result = match &record.entry {
                AuditEntry::Terminal(r) => Some(r.clone()),
                _ => None,
            };
            if let Err(ractor::MessagingErr::SendErr(AuditMsg::Terminal { deliver, .. })) = audit
                .cast(AuditMsg::Terminal {
                    preceding,
                    record,
                    deliver,
                    durable,
                })
            {
                if let Some(r) = result {
                    let _ = deliver.send(r);
                }
            }
            // After the cast: the parent's terminal record follows this one.
            run.tell_parent();
        }
    }
}

fn send_records(audit: &ActorRef<AuditMsg>, records: Vec<AuditRecord>) {
    if !records.is_empty() {
        let _ = audit.cast(AuditMsg::Records(records));
    }
}

/// The audit actor.
pub struct Audit {
    pub(crate) store: Arc<dyn AuditStore>,
    pub(crate) max_batch: usize,
    pub(crate) max_age: Duration,
    /// Where batches go while the store fails (`None`: held in memory).
    pub(crate) spool: Option<PathBuf>,
    /// Where durable runs' checkpoints go.
    pub(crate) checkpointer: Arc<dyn Checkpointer>,
}

type SaveAck = oneshot::Sender<Result<(), CheckpointError>>;

type Waiter = (Delivery, Arc<RunResult>);

/// Work for the writer.
enum Job {
    /// Records to write, and the results to deliver once they are.
    Batch {
        records: Vec<AuditRecord>,
        waiting: Vec<Waiter>,
        saves: Vec<(Box<Checkpoint>, Option<SaveAck>)>,
        clears: Vec<RunId>,
    },
    /// Write everything (spool included, backoff ignored), then answer.
    Drain(oneshot::Sender<()>),
}

/// Whether the writer waits for work, and whether the actor holds some:
/// the two sides of the hand-over that cuts a batch as soon as the writer
/// is idle (see [`Audit::handle`]).
#[derive(Default)]
struct Demand {
    /// The writer waits with nothing queued or in flight.
    idle: AtomicBool,
    /// The actor holds work it has not handed over.
    buffered: AtomicBool,
}

/// Its state.
pub struct AuditState {
    buffer: Vec<AuditRecord>,
    waiting: Vec<Waiter>,
    saves: Vec<(Box<Checkpoint>, Option<SaveAck>)>,
    clears: Vec<RunId>,
    flush_armed: bool,
    demand: Arc<Demand>,
    writer: Option<mpsc::Sender<Job>>,
    writer_task: Option<JoinHandle<()>>,
}

impl Actor for Audit {
    type Msg = AuditMsg;
    type State = AuditState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<AuditMsg>,
        _: (),
    ) -> Result<AuditState, ActorProcessingErr> {
        let (tx, rx) = mpsc::channel(WRITER_QUEUE);
        let demand = Arc::new(Demand::default());
        let writer = Writer::new(self, rx, demand.clone(), myself).await;
        Ok(AuditState {
            buffer: Vec::with_capacity(self.max_batch + BATCH_SLACK),
            waiting: Vec::new(),
            saves: Vec::new(),
            clears: Vec::new(),
            flush_armed: false,
            demand,
            writer: Some(tx),
            writer_task: Some(tokio::spawn(writer.run())),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<AuditMsg>,
        msg: AuditMsg,
        st: &mut AuditState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AuditMsg::Records(rs) => st.buffer.extend(rs),
            AuditMsg::Terminal {
                preceding,
                record,
                deliver,
                durable,
            } => {
                st.buffer.extend(preceding);
                if let AuditEntry::Terminal(res) = &record.entry {
                    st.waiting.push((deliver, res.clone()));
                }
                if durable {
                    st.clears.push(record.run_id);
                }
                st.buffer.push(record);
            }
            AuditMsg::Checkpoint { checkpoint, saved } => st.saves.push((checkpoint, saved)),
            AuditMsg::Flush => {
                st.flush_armed = false;
                self.flush(st).await;
            }
            AuditMsg::Demand => self.flush(st).await,
            AuditMsg::Drain(reply) => {
                self.flush(st).await;
                drain_writer(st).await;
                let stats = self.store.stats().await.unwrap_or_default();
                let _ = reply.send(stats);
                return Ok(());
            }
        }
        // Group commit: the batch is cut when it is full, or as soon as
        // the writer is idle — after the messages already queued here (a
        // `Demand` sent to itself), so a lone run's result is not held for
        // `max_age`, and a busy host still cuts large batches; while a write
        // is under way records gather, and the writer asks for them once it
        // is done (a `Demand`) — or the timer does, `max_age` after the first.
        if st.buffer.len() >= self.max_batch {
            self.flush(st).await;
        } else if st.has_work() {
            st.demand.buffered.store(true, Ordering::SeqCst);
            if st.demand.idle.swap(false, Ordering::SeqCst) {
                // Behind the messages already in the mailbox: under load
                // they join this batch.
                let _ = myself.cast(AuditMsg::Demand);
            } else if !st.flush_armed {
                st.flush_armed = true;
                myself.send_after(self.max_age, || AuditMsg::Flush);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<AuditMsg>,
        st: &mut AuditState,
    ) -> Result<(), ActorProcessingErr> {
        self.flush(st).await;
        // Closing the queue makes the writer write everything and end.
        st.writer = None;
        if let Some(task) = st.writer_task.take() {
            let _ = task.await;
        }
        Ok(())
    }
}

impl AuditState {
    fn has_work(&self) -> bool {
        !(self.buffer.is_empty()
            && self.waiting.is_empty()
            && self.saves.is_empty()
            && self.clears.is_empty())
    }
}

impl Audit {
    /// Hands the buffer to the writer (waits while its queue is full).
    async fn flush(&self, st: &mut AuditState) {
        if !st.has_work() {
            return;
        }
        st.demand.buffered.store(false, Ordering::SeqCst);
        st.demand.idle.store(false, Ordering::SeqCst);
        let job = Job::Batch {
            records: std::mem::replace(
                &mut st.buffer,
                Vec::with_capacity(self.max_batch + BATCH_SLACK),
            ),
            waiting: std::mem::take(&mut st.waiting),
            saves: std::mem::take(&mut st.saves),
            clears: std::mem::take(&mut st.clears),
        };
        let sent = match &st.writer {
            Some(w) => w.send(job).await.map_err(|e| e.0),
            None => Err(job),
        };
        if let Err(Job::Batch {
            records,
            waiting,
            saves,
            ..
        }) = sent
        {
            tracing::error!(
                records = records.len(),
                "the audit writer is gone; records dropped"
            );
            deliver(waiting);
            for (_, ack) in saves {
                if let Some(ack) = ack {
                    let _ = ack.send(Err(CheckpointError::Unavailable(
                        "the audit writer is gone".into(),
                    )));
                }
            }
        }
    }
}

/// Asks the writer to write everything and waits until it has.
async fn drain_writer(st: &mut AuditState) {
    let Some(w) = &st.writer else { return };
    let (tx, rx) = oneshot::channel();
    if w.send(Job::Drain(tx)).await.is_ok() {
        let _ = rx.await;
    }
}

/// Hands results to their callers.
fn deliver(waiting: Vec<Waiter>) {
    for (tx, res) in waiting {
        let _ = tx.send(res);
    }
}

/// The writer task: owns the store side — appends, the spool, the outage
/// backoff, the records held in memory.
struct Writer {
    store: Arc<dyn AuditStore>,
    spool: Option<PathBuf>,
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
    checkpointer: Arc<dyn Checkpointer>,
    /// Checkpoints not yet saved (the latest per run).
    unsaved: std::collections::HashMap<RunId, Box<Checkpoint>>,
    /// Checkpoints to clear once the runs' terminal records are written.
    uncleared: Vec<RunId>,
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
}

struct Outage {
    retry_at: Instant,
    backoff: Duration,
}

impl Writer {
    async fn new(
        audit: &Audit,
        rx: mpsc::Receiver<Job>,
        demand: Arc<Demand>,
        actor: ActorRef<AuditMsg>,
    ) -> Self {
        let mut spool_pending = false;
        if let Some(path) = &audit.spool {
            let p = path.clone();
            match tokio::task::spawn_blocking(move || spool::prepare(&p)).await {
                Ok(Ok(pending)) => spool_pending = pending,
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
            checkpointer: audit.checkpointer.clone(),
            unsaved: std::collections::HashMap::new(),
            uncleared: Vec::new(),
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

    async fn run(mut self) {
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
                            self.checkpoints(Vec::new()).await;
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
                saves,
                clears,
            }) => {
                let mut batch = records;
                let mut waiting = waiting;
                let mut acks = self.take_checkpoints(saves, clears);
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
                            saves,
                            clears,
                        }) => {
                            batch.extend(records);
                            waiting.extend(w);
                            acks.extend(self.take_checkpoints(saves, clears));
                        }
                        Ok(Job::Drain(tx)) => {
                            drain = Some(tx);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if drain.is_none() && acks.is_empty() && !batch.is_empty() && self.may_pipeline() {
                    self.start_append(batch, waiting).await;
                    return true;
                }
                // The batch in flight goes first (its records, should it
                // fail, are older than these).
                self.settle_in_flight(None).await;
                self.hold(batch);
                self.write(drain.is_some()).await;
                self.checkpoints(acks).await;
                deliver(waiting);
                if let Some(tx) = drain {
                    let _ = tx.send(());
                }
                true
            }
            Some(Job::Drain(tx)) => {
                self.settle_in_flight(None).await;
                self.write(true).await;
                self.checkpoints(Vec::new()).await;
                let _ = tx.send(());
                true
            }
            None => {
                // The actor stopped: write everything, then end.
                self.settle_in_flight(None).await;
                self.write(true).await;
                self.checkpoints(Vec::new()).await;
                false
            }
        }
    }

    /// Whether a new batch may be written while an earlier one is: the
    /// store pipelines, it works, nothing older waits in the spool or in
    /// memory (new records queue behind those), and no checkpoint work
    /// hangs on the write (a
    /// checkpoint is cleared only once its run's terminal record is
    /// written, which the serial path sees to).
    fn may_pipeline(&self) -> bool {
        self.store.pipelines()
            && self.outage.is_none()
            && !self.spool_pending
            && self.held.is_empty()
            && self.unsaved.is_empty()
            && self.uncleared.is_empty()
    }

    /// Starts writing a batch behind the batch in flight: the store queues
    /// it in the first poll (encoding it there, while the SQL of the batch
    /// before runs), then the batch before is settled and this one becomes
    /// the batch in flight.
    async fn start_append(&mut self, batch: Vec<AuditRecord>, waiting: Vec<Waiter>) {
        let store = self.store.clone();
        let mut append: InFlight = InFlight {
            append: Box::pin(async move { store.append_owned(batch).await }),
            waiting,
        };
        let first = std::future::poll_fn(|cx| Poll::Ready(append.append.as_mut().poll(cx))).await;
        self.settle_in_flight(None).await;
        match first {
            Poll::Ready(res) => self.settle(res, append.waiting).await,
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
        self.settle(res, fl.waiting).await;
    }

    /// A pipelined batch is written, or not: then its records take the
    /// serial path's way (spool, or held), behind those of batches before
    /// it. Its results are delivered either way, as on the serial path.
    async fn settle(&mut self, res: AppendOutcome, waiting: Vec<Waiter>) {
        if let Err((e, batch)) = res {
            self.hold(batch);
            self.failed(&e);
            self.write(false).await;
        }
        deliver(waiting);
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

    /// Takes a batch's checkpoint work: the latest save per run (a run that
    /// ended meanwhile is cleared instead); returns who waits for a save.
    fn take_checkpoints(
        &mut self,
        saves: Vec<(Box<Checkpoint>, Option<SaveAck>)>,
        clears: Vec<RunId>,
    ) -> Vec<SaveAck> {
        let mut acks = Vec::new();
        for (c, ack) in saves {
            self.unsaved.insert(c.run_id, c);
            acks.extend(ack);
        }
        for run in clears {
            self.unsaved.remove(&run);
            self.uncleared.push(run);
        }
        acks
    }

    /// Saves pending checkpoints (answering `acks`), then clears those of
    /// runs whose terminal records are written (to the store or the spool).
    /// What fails stays pending and is tried again with the next write.
    async fn checkpoints(&mut self, acks: Vec<SaveAck>) {
        if !self.unsaved.is_empty() {
            let batch: Vec<Checkpoint> = self
                .unsaved
                .values()
                .map(|c| Checkpoint::clone(c))
                .collect();
            match self.checkpointer.save(&batch).await {
                Ok(()) => {
                    self.unsaved.clear();
                    for ack in acks {
                        let _ = ack.send(Ok(()));
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, runs = batch.len(), "cannot save checkpoints; retrying with the next write");
                    for ack in acks {
                        let _ = ack.send(Err(e.clone()));
                    }
                }
            }
        } else {
            for ack in acks {
                let _ = ack.send(Ok(()));
            }
        }
        if !self.uncleared.is_empty() && self.held.is_empty() {
            match self.checkpointer.clear(&self.uncleared).await {
                Ok(()) => self.uncleared.clear(),
                Err(e) => {
                    tracing::error!(error = %e, runs = self.uncleared.len(), "cannot clear checkpoints; retrying with the next write")
                }
            }
        }
    }

    /// When to come back without new work: while the spool or memory holds
    /// records, at the retry time (or soon, when the store works). Failed
    /// checkpoint work is tried again with the next write.
    fn retry_delay(&self) -> Option<Duration> {
        if !self.spool_pending && self.held.is_empty() {
            return None;
        }
        let delay = match &self.outage {
            Some(o) => o.retry_at.saturating_duration_since(Instant::now()),
            None => self.max_age,
        };
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
                if let Err((e, batch)) = self.store.append_owned(batch).await {
                    self.held = batch;
                    ok = false;
                    self.failed(&e);
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
            return;
        }
        if let Some(path) = &self.spool {
            match spool::append(path, &self.held).await {
                Ok(()) => {
                    self.spool_pending = true;
                    self.spool_broken = false;
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
                tracing::info!(path = %path.display(), "audit spool replayed into the store");
                return true;
            }
            if !chunk.records.is_empty() {
                if let Err(e) = self.store.append(&chunk.records).await {
                    self.failed(&e);
                    return false;
                }
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
            self.held.drain(..cut);
            self.dropped += cut as u64;
            tracing::error!(
                dropped = cut,
                dropped_total = self.dropped,
                "audit store unavailable and nowhere to spool: oldest audit records dropped"
            );
        }
    }
}

/// The spool file: append-only JSON lines, read back from a byte offset.
/// File I/O runs on tokio's blocking pool.
mod spool {
    use super::*;

    /// One slice of the spool.
    pub(super) struct Chunk {
        pub(super) records: Vec<AuditRecord>,
        pub(super) next_offset: u64,
        pub(super) skipped: usize,
    }

    async fn blocking<T: Send + 'static>(
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        tokio::task::spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }

    /// Whether the spool holds records; ends a line cut by a crash so the
    /// next append starts on a line of its own.
    pub(super) fn prepare(path: &Path) -> std::io::Result<bool> {
        let mut f = match std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let len = f.metadata()?.len();
        if len == 0 {
            return Ok(false);
        }
        f.seek(std::io::SeekFrom::Start(len - 1))?;
        let mut last = [0u8; 1];
        std::io::Read::read_exact(&mut f, &mut last)?;
        if last[0] != b'\n' {
            f.write_all(b"\n")?;
        }
        Ok(true)
    }

    /// Appends `records` as JSON lines (one write).
    pub(super) async fn append(path: &Path, records: &[AuditRecord]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(records.len() * 256);
        for r in records {
            serde_json::to_writer(&mut buf, r)?;
            buf.push(b'\n');
        }
        let path = path.to_path_buf();
        blocking(move || {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            f.write_all(&buf)
        })
        .await
    }

    /// Reads up to `max` records from byte `offset`.
    pub(super) async fn read(path: &Path, offset: u64, max: usize) -> std::io::Result<Chunk> {
        let path = path.to_path_buf();
        blocking(move || {
            let mut f = std::fs::File::open(&path)?;
            f.seek(std::io::SeekFrom::Start(offset))?;
            let mut r = std::io::BufReader::new(f);
            let mut chunk = Chunk {
                records: Vec::new(),
                next_offset: offset,
                skipped: 0,
            };
            let mut line = Vec::new();
            while chunk.records.len() < max {
                line.clear();
                let n = r.read_until(b'\n', &mut line)?;
                if n == 0 {
                    break;
                }
                chunk.next_offset += n as u64;
                let text = line.strip_suffix(b"\n").unwrap_or(&line);
                if text.is_empty() {
                    continue;
                }
                match serde_json::from_slice::<AuditRecord>(text) {
                    Ok(rec) => chunk.records.push(rec),
                    Err(_) => chunk.skipped += 1,
                }
            }
            Ok(chunk)
        })
        .await
    }

    /// Empties the spool (everything in it is in the store).
    pub(super) async fn truncate(path: &Path) -> std::io::Result<()> {
        let path = path.to_path_buf();
        blocking(move || {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)?
                .set_len(0)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::run::{RunEvent, RunId};

    #[tokio::test]
    async fn spool_lines_round_trip_from_an_offset() {
        let dir = std::env::temp_dir().join(format!("agentvisor-spool-{}", RunId::new()));
        let path = dir.join("spool.jsonl");
        let run = RunId::new();
        let recs: Vec<AuditRecord> = (0..5)
            .map(|i| AuditRecord {
                run_id: run,
                seq: i,
                at_ms: 7,
                entry: AuditEntry::Event(RunEvent::StepStart { iteration: i }),
            })
            .collect();
        assert!(spool::append(&path, &recs[..3]).await.is_ok());
        assert!(spool::append(&path, &recs[3..]).await.is_ok());
        let first = spool::read(&path, 0, 2).await.ok();
        let first = first.as_ref().map(|c| (c.records.clone(), c.next_offset));
        let Some((got, next)) = first else {
            panic!("spool read failed")
        };
        assert_eq!(got, recs[..2].to_vec());
        let rest = spool::read(&path, next, 100).await.ok();
        assert_eq!(rest.map(|c| c.records), Some(recs[2..].to_vec()));
        assert!(spool::truncate(&path).await.is_ok());
        assert_eq!(spool::prepare(&path).ok(), Some(false));
        let _ = std::fs::remove_dir_all(dir);
    }
}
