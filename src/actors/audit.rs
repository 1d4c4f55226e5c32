//! The audit actor: receives every run's audit records (casts), buffers
//! them, and writes them to the [`AuditStore`] port in batches — one
//! `append` (one transaction) per batch, at most `max_batch` records, at
//! most `max_age` old.
//!
//! A run's terminal record comes with the run's result channel: the result
//! is handed to the caller only once the batch holding its terminal record
//! was written, so a caller never sees a result that is not on record. If the
//! store fails, the batch stays buffered and is retried; results are still
//! delivered (a run never blocks on bookkeeping) and the failure is counted.
//!
//! Rate: one cast per handled run message that produced records (a few per
//! model iteration). `Drain` writes everything buffered before it answers,
//! so nothing is lost on a clean shutdown. Lost on a crash: the buffer (at
//! most `max_batch` records or `max_age` of them).

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::ports::audit::{AuditRecord, AuditStats, AuditStore};
use crate::ports::run::RunResult;

/// Messages to the audit actor.
pub enum AuditMsg {
    /// One record.
    Record(AuditRecord),
    /// Several records of one run, in order.
    Records(Vec<AuditRecord>),
    /// A run's terminal record, and where its result goes once written.
    Terminal {
        /// The terminal record.
        record: AuditRecord,
        /// The run's result channel.
        deliver: oneshot::Sender<Arc<RunResult>>,
    },
    /// Write the buffer (timer).
    Flush,
    /// Write the buffer and answer with the store's counts (shutdown).
    Drain(RpcReplyPort<AuditStats>),
}

/// The audit actor.
pub struct Audit {
    pub(crate) store: Arc<dyn AuditStore>,
    pub(crate) max_batch: usize,
    pub(crate) max_age: Duration,
}

/// Its state.
pub struct AuditState {
    buffer: Vec<AuditRecord>,
    waiting: Vec<(oneshot::Sender<Arc<RunResult>>, Arc<RunResult>)>,
    flush_armed: bool,
    failed_batches: u64,
}

impl Actor for Audit {
    type Msg = AuditMsg;
    type State = AuditState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<AuditMsg>,
        _: (),
    ) -> Result<AuditState, ActorProcessingErr> {
        Ok(AuditState {
            buffer: Vec::with_capacity(self.max_batch),
            waiting: Vec::new(),
            flush_armed: false,
            failed_batches: 0,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<AuditMsg>,
        msg: AuditMsg,
        st: &mut AuditState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AuditMsg::Record(r) => st.buffer.push(r),
            AuditMsg::Records(rs) => st.buffer.extend(rs),
            AuditMsg::Terminal { record, deliver } => {
                if let crate::ports::audit::AuditEntry::Terminal(res) = &record.entry {
                    st.waiting.push((deliver, res.clone()));
                }
                st.buffer.push(record);
            }
            AuditMsg::Flush => {
                st.flush_armed = false;
                self.flush(st).await;
            }
            AuditMsg::Drain(reply) => {
                self.flush(st).await;
                let stats = self.store.stats().await.unwrap_or_default();
                let _ = reply.send(stats);
                return Ok(());
            }
        }
        if st.buffer.len() >= self.max_batch {
            self.flush(st).await;
        } else if !st.buffer.is_empty() && !st.flush_armed {
            st.flush_armed = true;
            myself.send_after(self.max_age, || AuditMsg::Flush);
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<AuditMsg>,
        st: &mut AuditState,
    ) -> Result<(), ActorProcessingErr> {
        self.flush(st).await;
        Ok(())
    }
}

impl Audit {
    async fn flush(&self, st: &mut AuditState) {
        if !st.buffer.is_empty() {
            match self.store.append(&st.buffer).await {
                Ok(()) => st.buffer.clear(),
                Err(e) => {
                    st.failed_batches += 1;
                    tracing::warn!(error = %e, records = st.buffer.len(), failed_batches = st.failed_batches, "audit store write failed; keeping the batch for the next flush");
                }
            }
        }
        for (tx, res) in st.waiting.drain(..) {
            let _ = tx.send(res);
        }
    }
}
