//! What a caller holds for a run ([`RunHandle`], [`RunEvents`]) and the small
//! shared record (`RunShared`) that a run, its critic shard and its handle
//! all see.
//!
//! `RunShared` is the single source of truth for a run's partial result:
//! the run writes steps, usage and decisions into it as it goes, so when a
//! handler of the run panics, the shard still finalizes a full result from
//! it, and the handle reads the live state from it. Exactly one party finalizes: whoever takes the finisher
//! first; that party alone writes the terminal audit record.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use ractor::ActorRef;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::actors::audit::AuditMsg;
use crate::actors::critic::CriticMsg;
use crate::actors::run::{RunAddr, RunMsg};
use crate::ports::audit::{AuditEntry, AuditRecord};
use crate::ports::run::{
    unix_ms, CriticDecision, KillReason, RunEvent, RunId, RunResult, RunStatus, StepRecord, Usage,
};

/// The partial result of a run, as it grows.
#[derive(Debug, Default)]
pub(crate) struct Partial {
    pub(crate) steps: Vec<StepRecord>,
    pub(crate) critic: Vec<CriticDecision>,
    pub(crate) usage: Usage,
    pub(crate) iterations: u32,
    pub(crate) max_iterations: u32,
    pub(crate) last_text: Option<String>,
    pub(crate) started: Option<(Instant, u64)>,
    pub(crate) finished: bool,
    /// How long the run took, once it has finished.
    pub(crate) took: Option<Duration>,
    /// How many steps moved into the result at the end (so the live state
    /// still counts them afterwards).
    pub(crate) steps_taken: usize,
    /// Cost so far in micro-dollars (of the whole usage, priced once).
    pub(crate) cost_micros: u64,
}

/// How a run ends, before it becomes a [`RunResult`].
#[derive(Debug, Clone)]
pub struct Ending {
    pub(crate) status: RunStatus,
    pub(crate) kill_reason: Option<KillReason>,
    pub(crate) error_kind: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) output: Option<String>,
}

impl Ending {
    pub(crate) fn ok(output: String) -> Self {
        Ending {
            status: RunStatus::Ok,
            kill_reason: None,
            error_kind: None,
            error: None,
            output: Some(output),
        }
    }

    pub(crate) fn failed(status: RunStatus, kind: &str, error: impl Into<String>) -> Self {
        Ending {
            status,
            kill_reason: None,
            error_kind: Some(kind.to_string()),
            error: Some(error.into()),
            output: None,
        }
    }

    pub(crate) fn killed(reason: KillReason) -> Self {
        Ending {
            status: reason.status(),
            kill_reason: Some(reason),
            error_kind: Some(reason.as_str().to_string()),
            error: Some(format!("killed: {reason}")),
            output: None,
        }
    }
}

/// The `error_kind` of runs the host's shutdown cancels; a durable run
/// ending so is suspended, not finished (see [`RunShared::finish`]).
pub(crate) const SUSPENDED: &str = "shutdown";

/// Delivers the result (once) and closes the event stream.
pub(crate) struct Finisher {
    pub(crate) result_tx: oneshot::Sender<Arc<RunResult>>,
}

/// Shared by a run, its critic shard and its handle.
pub(crate) struct RunShared {
    pub(crate) run_id: RunId,
    pub(crate) agent: Arc<str>,
    pub(crate) caller_id: Option<Arc<str>>,
    pub(crate) parent_run_id: Option<RunId>,
    partial: Mutex<Partial>,
    finisher: Mutex<Option<Finisher>>,
    /// The listener's sender; taken when the run finishes, so the stream
    /// ends with the run even while a handle (which shares this record) lives.
    events: Mutex<Option<mpsc::UnboundedSender<RunEvent>>>,
    listening: bool,
    seq: AtomicU32,
    /// Checkpointed: its checkpoint is cleared with its terminal record, and
    /// a host shutdown suspends it (no terminal record, checkpoint kept).
    durable: AtomicBool,
    host_live: Arc<crate::host::LiveRuns>,
}

impl RunShared {
    pub(crate) fn new(
        run_id: RunId,
        agent: Arc<str>,
        caller_id: Option<Arc<str>>,
        parent_run_id: Option<RunId>,
        max_iterations: u32,
        with_events: bool,
        host_live: Arc<crate::host::LiveRuns>,
    ) -> (
        Arc<Self>,
        oneshot::Receiver<Arc<RunResult>>,
        Option<RunEvents>,
    ) {
        let (result_tx, result_rx) = oneshot::channel();
        let (events_tx, events_rx) = if with_events {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), Some(RunEvents { rx }))
        } else {
            (None, None)
        };
        host_live.enter();
        let shared = Arc::new(RunShared {
            run_id,
            agent,
            caller_id,
            parent_run_id,
            partial: Mutex::new(Partial {
                max_iterations,
                ..Default::default()
            }),
            finisher: Mutex::new(Some(Finisher { result_tx })),
            listening: events_tx.is_some(),
            events: Mutex::new(events_tx),
            seq: AtomicU32::new(0),
            durable: AtomicBool::new(false),
            host_live,
        });
        (shared, result_rx, events_rx)
    }

    /// The partial record (never poisoned in practice: a panic while holding
    /// it is recovered by taking the data as is).
    pub(crate) fn partial(&self) -> MutexGuard<'_, Partial> {
        self.partial.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether anyone listens to events.
    pub(crate) fn has_listener(&self) -> bool {
        self.listening
    }

    /// Sends an event to the listener, if any (and if the run has not ended).
    pub(crate) fn emit(&self, event: &RunEvent) {
        if !self.listening {
            return;
        }
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = events.as_ref() {
            let _ = tx.send(event.clone());
        }
    }

    /// Marks the run durable.
    pub(crate) fn set_durable(&self) {
        self.durable.store(true, Ordering::Relaxed);
    }

    /// Whether the run is durable.
    pub(crate) fn is_durable(&self) -> bool {
        self.durable.load(Ordering::Relaxed)
    }

    /// Continues the audit sequence of a resumed run after its last record.
    pub(crate) fn start_seq_at(&self, next: u32) {
        self.seq.store(next, Ordering::Relaxed);
    }

    /// The next audit sequence number.
    pub(crate) fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Finalizes the run if nobody did yet: builds the result from the
    /// partial record, hands the terminal record to the audit actor (which
    /// delivers the result once the record is written), closes the event
    /// stream. Returns the result when this call won.
    ///
    /// A durable run that the host's shutdown ends is suspended instead: its
    /// caller gets the `cancelled`/`shutdown` result at once, no terminal
    /// record is written and its checkpoint stays, so `Host::recover`
    /// resumes it.
    pub(crate) fn finish(
        &self,
        ending: Ending,
        audit: &ActorRef<AuditMsg>,
    ) -> Option<Arc<RunResult>> {
        self.finish_after(ending, audit, Vec::new())
    }

    /// [`finish`](Self::finish), with the run's last audit records (still
    /// unsent) going to the audit actor in the same message as the terminal
    /// record, ahead of it. If another finisher won, they are sent alone.
    pub(crate) fn finish_after(
        &self,
        ending: Ending,
        audit: &ActorRef<AuditMsg>,
        preceding: Vec<AuditRecord>,
    ) -> Option<Arc<RunResult>> {
        let Some(finisher) = self
            .finisher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            send_records(audit, preceding);
            return None;
        };
        let result = {
            let mut p = self.partial();
            p.finished = true;
            p.took = p.started.map(|(i, _)| i.elapsed());
            p.steps_taken = p.steps.len();
            let now = unix_ms();
            let started_at = p.started.map(|(_, ms)| ms).unwrap_or(now);
            let output = match ending.status {
                RunStatus::Ok => ending.output,
                _ => ending.output.or_else(|| p.last_text.clone()),
            };
            Arc::new(RunResult {
                run_id: self.run_id,
                agent: self.agent.to_string(),
                caller_id: self.caller_id.as_deref().map(str::to_string),
                parent_run_id: self.parent_run_id,
                status: ending.status,
                kill_reason: ending.kill_reason,
                error_kind: ending.error_kind,
                error: ending.error,
                output,
                steps: std::mem::take(&mut p.steps),
                iterations: p.iterations,
                usage: p.usage,
                cost_micros: p.cost_micros,
                critic: std::mem::take(&mut p.critic),
                started_at,
                finished_at: now.max(started_at),
            })
        };
        if self.listening {
            // Taking the sender ends the listener's stream after this event.
            let tx = self.events.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let (Some(tx), Some(kind)) = (tx, &result.error_kind) {
                if result.status != RunStatus::Ok {
                    let _ = tx.send(RunEvent::Error {
                        kind: kind.clone(),
                        message: result.error.clone().unwrap_or_default(),
                    });
                }
            }
        }
        let durable = self.is_durable();
        if durable && result.error_kind.as_deref() == Some(SUSPENDED) {
            send_records(audit, preceding);
            let _ = finisher.result_tx.send(result.clone());
            self.host_live.leave();
            return Some(result);
        }
        let record = AuditRecord {
            run_id: self.run_id,
            seq: self.next_seq(),
            at_ms: result.finished_at,
            entry: AuditEntry::Terminal(result.clone()),
        };
        // If the audit actor is gone (host shutting down hard): deliver anyway.
        if let Err(ractor::MessagingErr::SendErr(AuditMsg::Terminal { deliver, .. })) =
            audit.cast(AuditMsg::Terminal {
                preceding,
                record,
                deliver: finisher.result_tx,
                durable,
            })
        {
            let _ = deliver.send(result.clone());
        }
        self.host_live.leave();
        Some(result)
    }
}

/// A live view of a running run (B4).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveState {
    /// Model iterations started.
    pub iteration: u32,
    /// The current ceiling.
    pub max_iterations: u32,
    /// Time since the run started.
    pub elapsed_ms: u64,
    /// Tokens used so far.
    pub tokens: u64,
    /// Tool calls finished so far.
    pub tool_calls: u32,
    /// Whether the run has ended.
    pub finished: bool,
}

/// The caller's handle on a run: await it (or call [`RunHandle::result`]) for
/// the [`RunResult`]; steer, extend, kill or cancel it meanwhile. Dropping an
/// unfinished handle cancels the run (use [`RunHandle::detach`] to let it go on).
pub struct RunHandle {
    pub(crate) run_id: RunId,
    pub(crate) shared: Option<Arc<RunShared>>,
    pub(crate) result_rx: oneshot::Receiver<Arc<RunResult>>,
    /// Where the run's messages go (its shard and key there).
    pub(crate) addr: RunAddr,
    pub(crate) done: bool,
    pub(crate) detached: bool,
}

impl RunHandle {
    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// Waits for the result.
    pub async fn result(self) -> RunResult {
        self.await
    }

    /// Waits for the result without copying it out: the `Arc` is the one
    /// the run's terminal audit record holds (awaiting the handle itself
    /// returns an owned copy). For callers that read the result and let it
    /// go — a swarm counting statuses — this saves a copy of every step.
    pub async fn shared(mut self) -> Arc<RunResult> {
        let received = (&mut self.result_rx).await;
        self.done = true;
        received.unwrap_or_else(|_| Arc::new(lost_result(self.run_id)))
    }

    /// Injects a message into the run before its next model call.
    pub fn steer(&self, text: impl Into<String>) {
        self.addr.send(RunMsg::Steer { text: text.into() });
    }

    /// Tells the run's critic the run is alive: work done on its behalf
    /// outside its model and tool calls (a caller's own processing, a
    /// long tool reporting progress) resets its stall timer.
    pub fn heartbeat(&self) {
        self.addr.beat(crate::actors::critic::Beat::Alive);
    }

    /// Pushes the run's hard deadline back (recorded as an operator decision).
    pub fn extend(&self, by: Duration) {
        let _ = self.addr.shard.cast(CriticMsg::ExtendDeadline {
            key: self.addr.key,
            by,
        });
    }

    /// Kills the run with reason `operator`.
    pub fn kill(&self) {
        self.stop(Some(KillReason::Operator));
    }

    /// Cancels the run: it ends `cancelled`, in-flight calls are aborted.
    pub fn cancel(&self) {
        self.stop(None);
    }

    fn stop(&self, reason: Option<KillReason>) {
        let _ = self.addr.shard.cast(CriticMsg::StopRun {
            key: self.addr.key,
            reason,
        });
    }

    /// The run's live state, while it goes on (and after).
    pub fn live(&self) -> Option<LiveState> {
        let shared = self.shared.as_ref()?;
        let p = shared.partial();
        Some(LiveState {
            iteration: p.iterations,
            max_iterations: p.max_iterations,
            elapsed_ms: p
                .took
                .or_else(|| p.started.map(|(i, _)| i.elapsed()))
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            tokens: p.usage.total(),
            tool_calls: (p.steps.len() + p.steps_taken) as u32,
            finished: p.finished,
        })
    }

    /// Lets the run go on when this handle is dropped.
    pub fn detach(mut self) {
        self.detached = true;
    }
}

impl Future for RunHandle {
    type Output = RunResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<RunResult> {
        let run_id = self.run_id;
        match Pin::new(&mut self.result_rx).poll(cx) {
            Poll::Ready(r) => {
                self.done = true;
                Poll::Ready(match r {
                    Ok(res) => Arc::unwrap_or_clone(res),
                    Err(_) => lost_result(run_id),
                })
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        if !self.done && !self.detached {
            self.cancel();
        }
    }
}

/// The result a caller sees if the runtime dropped a run without finalizing
/// it (a bug, or a runtime torn down under it). Never a panic.
fn lost_result(run_id: RunId) -> RunResult {
    let now = unix_ms();
    RunResult {
        run_id,
        agent: String::new(),
        caller_id: None,
        parent_run_id: None,
        status: RunStatus::Error,
        kill_reason: None,
        error_kind: Some("lost".into()),
        error: Some("the runtime stopped before the run finished".into()),
        output: None,
        steps: Vec::new(),
        iterations: 0,
        usage: Usage::default(),
        cost_micros: 0,
        critic: Vec::new(),
        started_at: now,
        finished_at: now,
    }
}

/// The typed events of one run, in order; ends when the run ends.
pub struct RunEvents {
    rx: mpsc::UnboundedReceiver<RunEvent>,
}

impl RunEvents {
    /// A stream that has already ended.
    pub(crate) fn closed() -> Self {
        let (_, rx) = mpsc::unbounded_channel();
        RunEvents { rx }
    }

    /// The next event, or `None` once the run has ended.
    pub async fn next(&mut self) -> Option<RunEvent> {
        self.rx.recv().await
    }
}

impl futures_util::Stream for RunEvents {
    type Item = RunEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RunEvent>> {
        self.rx.poll_recv(cx)
    }
}

/// Sends a run's unsent records to the audit actor on their own (when they
/// cannot ride with a terminal record).
fn send_records(audit: &ActorRef<AuditMsg>, records: Vec<AuditRecord>) {
    if !records.is_empty() {
        let _ = audit.cast(AuditMsg::Records(records));
    }
}
