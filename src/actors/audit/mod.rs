//! The audit actor: receives every run's audit records (casts), buffers
//! them, and hands them in batches — at most `max_batch` records, at most
//! `max_age` old — to its writer (`writer`), a task that owns the
//! [`AuditStore`] port and calls `append` (one transaction) per batch.
//! Durable runs' checkpoints take their own path (`checkpoints`): the actor
//! forwards each save at once, and the writer sends the clears.
//!
#![doc = include_str!("../../../docs/audit.md")]

pub(crate) mod checkpoints;
pub(crate) mod spool;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::ports::audit::{AuditEntry, AuditRecord, AuditStats, AuditStore, Unrecorded};
use crate::ports::checkpoint::{Checkpoint, CheckpointError, Checkpointer, Lease};
use crate::ports::run::{RunId, RunResult};
use crate::record::{Delivery, Finished, HostRuns, Terminal};
use checkpoints::{Checkpoints, LeaseWatch};

pub(crate) use checkpoints::SaveWaiter;

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
        /// The run is durable: clear its checkpoint once the record is
        /// written, and (see the module's guarantees) deliver its result
        /// once it is written or spooled, waiting at most
        /// `deliver.wait_ms`.
        durable: bool,
    },
    /// A durable run's checkpoint after a step: the run takes its next
    /// step once `waiter` is told it is written (told again each time a
    /// write fails and is retried, so the wait counts as alive).
    SaveStep {
        /// The state to save.
        checkpoint: Box<Checkpoint>,
        /// The run waiting for it.
        waiter: Box<dyn SaveWaiter>,
    },
    /// A durable run's checkpoint, handed to the checkpoint task at once
    /// (only the latest of a run is written); `saved` answers once it is.
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
    /// The process was not scheduled for `gap` (a critic shard noticed):
    /// the host's leases may have expired, so they are renewed (and lost
    /// runs found) before anything more is written.
    Paused {
        /// How long.
        gap: Duration,
    },
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
            run.leave_host();
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
            // After the cast: a host shutdown that saw no run in flight
            // finds this record with the audit actor before it drains it,
            // and the parent's terminal record follows this one.
            run.leave_host();
            run.tell_parent();
        }
    }
}

fn send_records(audit: &ActorRef<AuditMsg>, records: Vec<AuditRecord>) {
    if !records.is_empty() {
        let _ = audit.cast(AuditMsg::Records(records));
    }
}

/// What the audit actor reports while it runs, read without a message:
/// the host's admission reads [`AuditHealth::store_unavailable`] for every
/// run, so it is an atomic load.
#[derive(Debug, Default)]
pub struct AuditHealth {
    /// Records are held in memory: neither the store nor the spool takes them.
    unavailable: AtomicBool,
    /// Records dropped past [`HELD_MAX`].
    dropped: AtomicU64,
    /// Records held in memory now.
    held: AtomicU64,
    /// Records in the spool, not yet in the store.
    spooled: AtomicU64,
    /// Runs whose terminal records were held in memory or dropped when the
    /// writer last drained (see [`AuditStats::unrecorded`]).
    unrecorded: std::sync::Mutex<Unrecorded>,
}

impl AuditHealth {
    /// Whether neither the store nor the spool takes records now (they are
    /// held in memory, bounded): the host admits no run while it is so.
    pub fn store_unavailable(&self) -> bool {
        self.unavailable.load(Ordering::Relaxed)
    }

    /// Records lost so far or held in memory now: what would be lost if
    /// the process ended now.
    pub fn unwritten(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed) + self.held.load(Ordering::Relaxed)
    }

    /// Records in the spool not yet replayed into the store.
    pub fn spooled(&self) -> u64 {
        self.spooled.load(Ordering::Relaxed)
    }

    /// Runs whose terminal records reached neither the store nor the
    /// spool, as of the last drain, by the status their callers were told.
    pub fn unrecorded(&self) -> Unrecorded {
        *self.unrecorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_unrecorded(&self, u: Unrecorded) {
        *self.unrecorded.lock().unwrap_or_else(|p| p.into_inner()) = u;
    }
}

/// The audit actor.
pub struct Audit {
    pub(crate) store: Arc<dyn AuditStore>,
    pub(crate) max_batch: usize,
    pub(crate) max_age: Duration,
    /// Where batches go while the store fails (`None`: held in memory).
    pub(crate) spool: Option<PathBuf>,
    /// The lock on `spool`, held by the writer for its life (see
    /// `spool::claim`).
    pub(crate) spool_claim: Option<Arc<spool::SpoolClaim>>,
    /// Where durable runs' checkpoints go.
    pub(crate) checkpointer: Arc<dyn Checkpointer>,
    /// Shared with the host (admission) and the writer (which sets it).
    pub(crate) health: Arc<AuditHealth>,
    /// The host's lease on the durable runs it runs.
    pub(crate) lease: Lease,
    /// What the host knows of its leases (shared with the host).
    pub(crate) lease_watch: Arc<LeaseWatch>,
    /// The host's runs in flight (runs another host took over are stopped).
    pub(crate) live: Arc<HostRuns>,
}

/// A result waiting for its terminal record to be written.
struct Waiter {
    deliver: Delivery,
    result: Arc<RunResult>,
    /// Set for a durable run: while its record is held in memory, its
    /// result waits until this instant (then it is told `off_record`).
    wait_until: Option<tokio::time::Instant>,
}

/// Work for the writer.
enum Job {
    /// Records to write, and the results to deliver once they are.
    Batch {
        records: Vec<AuditRecord>,
        waiting: Vec<Waiter>,
        /// Durable runs whose terminal record is in `records`.
        durable_ended: Vec<RunId>,
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
    durable_ended: Vec<RunId>,
    flush_armed: bool,
    demand: Arc<Demand>,
    writer: Option<mpsc::Sender<Job>>,
    writer_task: Option<JoinHandle<()>>,
    checkpoints: Checkpoints,
    checkpoints_task: Option<JoinHandle<()>>,
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
        let (checkpoints, checkpoints_task) = Checkpoints::start(
            self.checkpointer.clone(),
            self.lease.clone(),
            self.lease_watch.clone(),
            self.live.clone(),
        );
        let writer =
            writer::Writer::new(self, rx, demand.clone(), myself, checkpoints.clone()).await;
        Ok(AuditState {
            buffer: Vec::with_capacity(self.max_batch + BATCH_SLACK),
            waiting: Vec::new(),
            durable_ended: Vec::new(),
            flush_armed: false,
            demand,
            writer: Some(tx),
            writer_task: Some(tokio::spawn(writer.run())),
            checkpoints,
            checkpoints_task: Some(checkpoints_task),
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
                    let wait_until = durable.then(|| {
                        let wait = Duration::from_millis(u64::from(deliver.wait_ms));
                        tokio::time::Instant::now() + wait
                    });
                    st.waiting.push(Waiter {
                        deliver,
                        result: res.clone(),
                        wait_until,
                    });
                }
                if durable {
                    st.durable_ended.push(record.run_id);
                }
                st.buffer.push(record);
            }
            AuditMsg::Checkpoint { checkpoint, saved } => {
                st.checkpoints.save(checkpoint, saved);
                return Ok(());
            }
            AuditMsg::SaveStep { checkpoint, waiter } => {
                st.checkpoints.save_step(checkpoint, waiter);
                return Ok(());
            }
            AuditMsg::Paused { gap } => {
                tracing::debug!(
                    gap_ms = gap.as_millis() as u64,
                    "paused: renewing the host's leases"
                );
                st.checkpoints.paused(&self.lease_watch);
                return Ok(());
            }
            AuditMsg::Flush => {
                st.flush_armed = false;
                self.flush(st).await;
            }
            AuditMsg::Demand => self.flush(st).await,
            AuditMsg::Drain(reply) => {
                self.flush(st).await;
                drain_writer(st).await;
                let mut stats = self.store.stats().await.unwrap_or_default();
                stats.unwritten = self.health.unwritten();
                stats.spooled = self.health.spooled();
                stats.unrecorded = self.health.unrecorded();
                let _ = reply.send(stats);
                return Ok(());
            }
        }
        crate::telemetry::audit_queue(st.buffer.len());
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
        // Closing the queue makes the writer write everything and end;
        // then the checkpoint task (its last clears come from the writer).
        st.writer = None;
        if let Some(task) = st.writer_task.take() {
            let _ = task.await;
        }
        st.checkpoints.flush().await;
        if let Some(task) = st.checkpoints_task.take() {
            task.abort();
        }
        Ok(())
    }
}

impl AuditState {
    fn has_work(&self) -> bool {
        !(self.buffer.is_empty() && self.waiting.is_empty() && self.durable_ended.is_empty())
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
            durable_ended: std::mem::take(&mut st.durable_ended),
        };
        let sent = match &st.writer {
            Some(w) => w.send(job).await.map_err(|e| e.0),
            None => Err(job),
        };
        if let Err(Job::Batch {
            records, waiting, ..
        }) = sent
        {
            tracing::error!(
                records = records.len(),
                "the audit writer is gone; records dropped"
            );
            deliver(waiting);
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
    for w in waiting {
        let _ = w.deliver.send(w.result);
    }
}
