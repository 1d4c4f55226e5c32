//! What a caller holds for a run: the [`RunHandle`] that submitted it (await
//! it for the result; dropping it unfinished cancels the run), [`RunRef`]s
//! that reach any run in flight by its id, and [`RunEvents`], a run's event
//! stream for one subscriber.
//!
//! Both go through the run's shared record (`crate::record`): commands
//! reach the run through its critic shard; the result is the one its
//! terminal record holds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::oneshot;

use crate::ports::event::Event;
use crate::ports::run::{unix_ms, KillReason, RunId, RunResult, RunStatus};
use crate::record::{self, Command, RunShared, SUBSCRIBER_BUFFER};

pub use crate::record::{LiveState, PendingApproval};

/// Why an approval decision was not handed to a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// The run waits for no approval (it has none pending, or it ended).
    #[error("the run awaits no approval")]
    NotAwaiting,
    /// The run waits, but not for this call.
    #[error("the run awaits no approval of call `{0}`")]
    UnknownCall(String),
}

impl ApprovalError {
    /// A stable snake_case kind.
    pub fn kind(&self) -> &'static str {
        match self {
            ApprovalError::NotAwaiting => "not_awaiting_approval",
            ApprovalError::UnknownCall(_) => "unknown_call",
        }
    }
}

/// The caller's handle on a run: await it (or call [`RunHandle::result`]) for
/// the [`RunResult`]; steer, extend, kill or cancel it meanwhile. Dropping an
/// unfinished handle cancels the run (use [`RunHandle::detach`] to let it go
/// on: it stays reachable by id through `Host::run`).
pub struct RunHandle {
    pub(crate) run_id: RunId,
    pub(crate) shared: Arc<RunShared>,
    pub(crate) result_rx: oneshot::Receiver<Arc<RunResult>>,
    pub(crate) done: bool,
    pub(crate) detached: bool,
}

impl RunHandle {
    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// A reference to the run that outlives this handle (clone it, send it
    /// to other tasks).
    pub fn run_ref(&self) -> RunRef {
        RunRef {
            shared: self.shared.clone(),
        }
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
        self.shared.command(Command::Steer(text.into()));
    }

    /// Tells the run's critic the run is alive: work done on its behalf
    /// outside its model and tool calls (a caller's own processing, a
    /// long tool reporting progress) resets its stall timer.
    pub fn heartbeat(&self) {
        self.shared.command(Command::Beat);
    }

    /// Pushes the run's hard deadline back (recorded as an operator decision).
    pub fn extend(&self, by: Duration) {
        self.shared.command(Command::Extend(by));
    }

    /// Kills the run with reason `operator`.
    pub fn kill(&self) {
        self.shared
            .command(Command::Stop(Some(KillReason::Operator)));
    }

    /// Cancels the run: it ends `cancelled`, in-flight calls are aborted.
    pub fn cancel(&self) {
        self.shared.command(Command::Stop(None));
    }

    /// The run's live state, while it goes on (and after).
    pub fn live(&self) -> Option<LiveState> {
        Some(self.shared.live())
    }

    /// A new subscription to the run's events: what it recorded so far,
    /// then what it does next (see [`RunEvents`]).
    pub fn subscribe(&self) -> RunEvents {
        self.run_ref().subscribe()
    }

    /// Lets the run go on when this handle is dropped.
    pub fn detach(mut self) {
        self.detached = true;
    }
}

/// A reference to a run, by its id: cheap to clone, `Send + Sync`, usable
/// from anywhere while the run goes on (and for its result after). Get one
/// from `Host::run(&id)` or [`RunHandle::run_ref`]. Dropping it does
/// nothing to the run.
#[derive(Clone)]
pub struct RunRef {
    pub(crate) shared: Arc<RunShared>,
}

impl std::fmt::Debug for RunRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRef")
            .field("run_id", &self.shared.run_id)
            .field("agent", &self.shared.agent)
            .finish()
    }
}

impl RunRef {
    /// The run's id.
    pub fn run_id(&self) -> RunId {
        self.shared.run_id
    }

    /// The agent's name.
    pub fn agent(&self) -> &str {
        &self.shared.agent
    }

    /// Who submitted the run.
    pub fn caller_id(&self) -> Option<&str> {
        self.shared.caller_id.as_deref()
    }

    /// The run's parent, for a sub-agent run.
    pub fn parent_run_id(&self) -> Option<RunId> {
        self.shared.parent_run_id
    }

    /// Injects a message into the run before its next model call.
    pub fn steer(&self, text: impl Into<String>) {
        self.shared.command(Command::Steer(text.into()));
    }

    /// Pushes the run's hard deadline back (an operator decision; never
    /// past the run's 24 h cap).
    pub fn extend(&self, by: Duration) {
        self.shared.command(Command::Extend(by));
    }

    /// Kills the run with `reason` (the first kill wins).
    pub fn kill(&self, reason: KillReason) {
        self.shared.command(Command::Stop(Some(reason)));
    }

    /// Cancels the run: it ends `cancelled`.
    pub fn cancel(&self) {
        self.shared.command(Command::Stop(None));
    }

    /// Tells the run's critic the run is alive (see [`RunHandle::heartbeat`]).
    pub fn heartbeat(&self) {
        self.shared.command(Command::Beat);
    }

    /// The run's live state.
    pub fn live(&self) -> LiveState {
        self.shared.live()
    }

    /// The tool calls waiting for an operator's approval (empty unless the
    /// run is parked on them).
    pub fn pending_approvals(&self) -> Vec<PendingApproval> {
        let p = self.shared.partial();
        if p.finished {
            Vec::new()
        } else {
            p.awaiting.clone()
        }
    }

    /// Approves the waiting tool call `call_id` (`None`: every waiting
    /// call): it runs, and once no call of its turn waits any more the run
    /// goes on, its deadlines moved by the time it waited. Returns the
    /// calls the decision covers; [`ApprovalError`] when the run waits for
    /// none (or not for that call). A decision that reaches the run after
    /// its calls were decided otherwise (a timeout) does nothing.
    pub fn approve(&self, call_id: Option<&str>) -> Result<Vec<PendingApproval>, ApprovalError> {
        self.decide(call_id, true, None)
    }

    /// Denies the waiting tool call `call_id` (`None`: every waiting
    /// call): the model reads `denied by operator: REASON` as the call's
    /// error result. Otherwise as [`approve`](Self::approve).
    pub fn deny(
        &self,
        call_id: Option<&str>,
        reason: impl Into<String>,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        self.decide(call_id, false, Some(reason.into()))
    }

    fn decide(
        &self,
        call_id: Option<&str>,
        approve: bool,
        reason: Option<String>,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        let pending = self.pending_approvals();
        if pending.is_empty() {
            return Err(ApprovalError::NotAwaiting);
        }
        let covered: Vec<PendingApproval> = pending
            .into_iter()
            .filter(|p| call_id.is_none_or(|c| *p.call_id == *c))
            .collect();
        let Some(first) = covered.first() else {
            let id: String = call_id.unwrap_or_default().chars().take(128).collect();
            return Err(ApprovalError::UnknownCall(id));
        };
        let call_id = call_id.map(|_| first.call_id.clone());
        self.shared.command(Command::Decide {
            call_id,
            approve,
            reason,
        });
        Ok(covered)
    }

    /// Whether the run has ended (its result may still be on its way to
    /// the audit log).
    pub fn is_finished(&self) -> bool {
        self.shared.partial().finished
    }

    /// A subscription to the run's events from its first record.
    pub fn subscribe(&self) -> RunEvents {
        self.subscribe_from(0)
    }

    /// A subscription from record `seq` on (a consumer that saw up to
    /// `seq - 1` resumes here without gaps or duplicates).
    pub fn subscribe_from(&self, seq: u32) -> RunEvents {
        RunEvents {
            inner: record::subscribe(self.shared.clone(), seq, SUBSCRIBER_BUFFER),
        }
    }

    /// A subscription with its own live buffer size (events it may fall
    /// behind by before it is told it lagged).
    pub fn subscribe_with_buffer(&self, seq: u32, buffer: usize) -> RunEvents {
        RunEvents {
            inner: record::subscribe(self.shared.clone(), seq, buffer),
        }
    }

    /// Waits for the run's result (once its terminal record is written).
    pub async fn result(&self) -> RunResult {
        RunResult::clone(&*self.shared.result().await)
    }

    /// The run's result, shared, once delivered (no copy).
    pub async fn shared_result(&self) -> Arc<RunResult> {
        self.shared.result().await
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
        root_run_id: None,
        status: RunStatus::Error,
        kill_reason: None,
        loop_kind: None,
        error_kind: Some("lost".into()),
        error: Some("the runtime stopped before the run finished".into()),
        output: None,
        steps: Vec::new(),
        iterations: 0,
        usage: Default::default(),
        cost_micros: 0,
        critic: Vec::new(),
        started_at: now,
        finished_at: now,
        forked_from: None,
    }
}

/// A run's events for one subscriber, in order, each with its `seq`: what
/// the run recorded before the subscription (read back from the audit log),
/// then its live events; ends after the run's `run.end`. Bounded: a
/// subscriber that falls behind gets a `lagged` event and catches up from
/// the store, so a slow reader never grows memory.
pub struct RunEvents {
    pub(crate) inner: Pin<Box<dyn Stream<Item = Event> + Send>>,
}

impl RunEvents {
    /// A stream that has already ended.
    pub(crate) fn closed() -> Self {
        RunEvents {
            inner: Box::pin(futures_util::stream::empty()),
        }
    }

    /// The next event, or `None` once the run has ended.
    pub async fn next(&mut self) -> Option<Event> {
        futures_util::StreamExt::next(&mut self.inner).await
    }
}

impl Stream for RunEvents {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.inner.as_mut().poll_next(cx)
    }
}
