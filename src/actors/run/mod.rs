//! A run: one agent loop, an actor hosted on a critic shard. It drives the
//! loop as messages — `NextStep` → `ModelDone` → `ToolsDone` → `NextStep` …
//! → answer — and never awaits a model or tool call while it handles one.
//!
#![doc = include_str!("../../../docs/run.md")]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ractor::ActorRef;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::actors::audit::AuditMsg;
use crate::actors::budget::{BudgetMsg, Ticket};
use crate::actors::watch::{Beat, Watched};
use crate::agent::Agent;
use crate::compaction::{self, Compaction};
use crate::ports::audit::{AuditEntry, AuditRecord, RunInfo};
use crate::ports::checkpoint::{Checkpoint, ParkedCalls, Unchanged};
use crate::ports::event::RunEvent;
use crate::ports::model::{
    ChatRequest, ChatResponse, DeltaSink, Message, ModelError, RetrySink, Role,
};
use crate::ports::run::{unix_ms, KillReason, RunStatus};
use crate::record::{Ending, RunShared};
use crate::spec::Limits;

mod approval;
mod durable;
mod ending;
mod guard;
mod judging;
mod model_call;
mod observer;
pub(crate) mod parent;
mod recording;
pub(crate) mod spans;
mod summary;
mod tools;
mod wait;

use model_call::capped_options;
use observer::RunObserver;

pub(crate) use durable::DurableRun;
pub(crate) use model_call::checked_usage;
pub use tools::ToolOutcome;

/// The call a run has in flight.
enum Inflight {
    /// A model (or summary) call: aborted when the run stops.
    Model(AbortHandle),
    /// A turn's tool calls: signalled when the run stops (they get
    /// `kill_grace`), aborted when the run is dropped unfinished.
    Tools {
        task: AbortHandle,
        cancel: CancellationToken,
    },
    /// A durable run's checkpoint after a step, being written: the next
    /// step waits for it (`CheckpointSaved`).
    Checkpoint,
}

impl Inflight {
    fn abort(self) {
        match self {
            Inflight::Model(h) => h.abort(),
            Inflight::Tools { task, cancel } => {
                cancel.cancel();
                task.abort();
            }
            Inflight::Checkpoint => {}
        }
    }
}

/// Messages to a run (through its shard, addressed by its key).
pub enum RunMsg {
    /// Make the next model call (or end the run).
    NextStep,
    /// A model call ended.
    ModelDone {
        /// The call's epoch (stale results are ignored).
        epoch: u32,
        /// What the model said.
        result: Result<ChatResponse, ModelError>,
    },
    /// A summary call (context compaction) ended.
    SummaryDone {
        /// The call's epoch (stale results are ignored).
        epoch: u32,
        /// What the model said.
        result: Result<ChatResponse, ModelError>,
    },
    /// A model call panicked after its first poll (in its task): the run
    /// ends `error`/`panic`, like a run whose handler panicked.
    ModelPanicked {
        /// The call's epoch (stale results are ignored).
        epoch: u32,
        /// The panic's text.
        text: String,
    },
    /// A turn's tool calls ended.
    ToolsDone {
        /// The batch's epoch.
        epoch: u32,
        /// One outcome per call, in the model's order.
        outcomes: Vec<ToolOutcome>,
    },
    /// The model call in flight failed and is retried after a backoff
    /// (sent by the retry layer, through the shard, so the run records it
    /// in its own order).
    Retrying {
        /// The error's stable kind.
        kind: &'static str,
        /// The error.
        message: String,
        /// The backoff before the next attempt.
        delay: std::time::Duration,
    },
    /// A tool call in flight reported an event (an MCP server's start or
    /// exit, a call's outcome); recorded in the run's order, and a beat.
    ToolEvent(RunEvent),
    /// A model call went on despite something (a provider's fallback or
    /// estimate, through the run's call observer): a `warning` the run
    /// records in its own order.
    Warned {
        /// The warning's stable kind.
        kind: String,
        /// What happened.
        message: String,
    },
    /// The approval judge answered about the parked turn's calls (see
    /// `judging`).
    ApprovalJudged {
        /// What its question used.
        usage: crate::ports::run::CriticUsage,
        /// Its decisions, or why it gave none.
        outcome: Result<Vec<crate::judge::CallVerdict>, crate::judge::JudgeError>,
    },
    /// A durable run's checkpoint after a step is written: the next step
    /// may start.
    CheckpointSaved {
        /// The wait's epoch (a stale answer is ignored).
        epoch: u32,
    },
    /// A guard denied a call a tool made through the run (`wait`'s, from
    /// its task): the decision is recorded in the run's order.
    GuardDenied {
        /// The decision's detail.
        detail: String,
    },
}

/// How a run's tasks reach the critic shard that hosts it (the shard
/// implements it; one is shared by all the shard's runs).
pub trait ShardLink: Send + Sync + 'static {
    /// Sends run `key` a message (dropped if the shard is gone).
    fn run_msg(&self, key: u64, msg: RunMsg);
    /// Tells the shard run `key` is alive.
    fn beat(&self, key: u64, beat: Beat);
}

/// Where a run's messages go: the shard that hosts it, and its key there.
#[derive(Clone)]
pub struct RunAddr {
    pub(crate) shard: Arc<dyn ShardLink>,
    pub(crate) key: u64,
}

impl RunAddr {
    /// Sends the run a message (dropped if its shard is gone: the run is
    /// then finalized by the host's shutdown or was never started).
    pub(crate) fn send(&self, msg: RunMsg) {
        self.shard.run_msg(self.key, msg);
    }

    /// Tells the run's critic it is alive (from a task of the run's).
    pub(crate) fn beat(&self, beat: Beat) {
        self.shard.beat(self.key, beat);
    }
}

/// What a run is started with (the shard's `Start` message).
pub struct RunArgs {
    /// Its key on the shard (the host gives every run one).
    pub(crate) key: u64,
    pub(crate) shared: Arc<RunShared>,
    pub(crate) agent: Agent,
    /// Its limits: the agent's own (shared) unless the invocation set some.
    pub(crate) limits: Arc<Limits>,
    /// The transcript to start from (system prompt and input, or a
    /// checkpoint's).
    pub(crate) transcript: Arc<Vec<Message>>,
    /// Set for a durable run: what its checkpoints are made of.
    pub(crate) durable: Option<Arc<DurableRun>>,
    /// The checkpoint a resumed run starts from.
    pub(crate) resumed: Option<Box<Checkpoint>>,
    pub(crate) info: Option<RunInfo>,
    pub(crate) audit: ActorRef<AuditMsg>,
    pub(crate) budget: ActorRef<BudgetMsg>,
    pub(crate) ticket: Option<Ticket>,
    /// A deadline the run may not outlive (its parent's).
    pub(crate) deadline_cap: Option<Instant>,
    /// The span the run's span is a child of (`otel` feature).
    pub(crate) parent_span: spans::Traced,
}

/// A run's state: the loop's, and its critic's record of it.
pub struct RunState {
    pub(crate) addr: RunAddr,
    pub(crate) shared: Arc<RunShared>,
    agent: Agent,
    /// Shared with the agent's other runs unless its invocation set some.
    pub(crate) limits: Arc<Limits>,
    audit: ActorRef<AuditMsg>,
    budget: ActorRef<BudgetMsg>,
    ticket: Option<Ticket>,
    transcript: Arc<Vec<Message>>,
    iteration: u32,
    max_iterations: u32,
    /// Messages queued for the next model call (an operator's steers, a
    /// repair prompt). Most runs never queue one: a boxed `Vec` is 8
    /// bytes in each of them, where a `Vec` is 24.
    #[allow(clippy::box_collection)]
    steers: Option<Box<Vec<String>>>,
    inflight: Option<Inflight>,
    epoch: u32,
    error_steps: u32,
    /// When to summarize the transcript, and the summary calls made.
    compaction: Compaction,
    pub(crate) started: Instant,
    /// The loop is over (the ending is decided): later messages are ignored.
    pub(crate) done: bool,
    /// The run is finalized (its terminal record handed over): the shard
    /// drops it.
    pub(crate) finalized: bool,
    /// Ended, waiting for its child runs to end (until the instant);
    /// boxed: few runs ever wait so.
    stopping: Option<Box<(Ending, Instant)>>,
    pending_audit: Vec<AuditRecord>,
    /// The next step is due: the shard takes it in the same handler (up
    /// to `INLINE_STEPS` of them), not through the mailbox.
    pub(crate) step_due: bool,
    durable: Option<Box<durable::Durable>>,
    /// The clock read once per handler: the records and heartbeats a
    /// handler makes share it (they are made within microseconds).
    pub(crate) now: Instant,
    /// `now` in Unix ms, read at the handler's first record (0: not yet).
    clock_ms: u64,
    /// What the retry layer reports through, made at the first call.
    retry: Option<RetrySink>,
    /// What a streaming model reports through (heartbeats, partial
    /// output, warnings), made at the first call.
    observer: Option<Arc<RunObserver>>,
    /// The critic's record of this run (C8: small).
    pub(crate) watch: Watched,
    /// A turn waiting for an operator's approval (see `approval`).
    parked: Option<Box<approval::ParkedTurn>>,
    /// A resumed run that was parked for approval when it was saved: its
    /// first step dispatches that turn again (see `approval`).
    resumed_turn: Option<Box<ParkedCalls>>,
    /// The guards' `max_calls` counters, made at the first guarded call
    /// of a run whose guards count (see `guard`).
    guard_counts: Option<Arc<[std::sync::atomic::AtomicU32]>>,
    /// Its model judges' state; `None` for an agent without one (see
    /// `crate::actors::judging`).
    pub(crate) judging: Option<Box<crate::actors::judging::Judging>>,
    span: tracing::Span,
}

impl RunState {
    /// A new run (or a resumed one) at `addr`: its state, its critic record,
    /// its `run_started` record (and `resumed` event). Its first step is
    /// due; the shard takes it.
    pub(crate) fn start(args: RunArgs, addr: RunAddr) -> Box<RunState> {
        let started = Instant::now();
        let mut iteration = 0;
        let started_ms = match &args.resumed {
            Some(c) => c.started_at,
            None => unix_ms(),
        };
        {
            let mut p = args.shared.partial();
            p.started = Some((started, started_ms));
            p.max_iterations = args.limits.max_iterations;
            if let Some(c) = &args.resumed {
                iteration = c.iteration;
                p.iterations = c.iteration;
                p.steps = c.steps.clone();
                p.usage = c.usage;
                // What the earlier calls cost is charged already.
                p.cost_micros = c.cost_micros.unwrap_or_else(|| {
                    args.agent
                        .price()
                        .map_or(0, |price| price.cost_micros(&c.usage))
                });
                p.critic = c.critic.clone();
            }
        }
        let span = spans::run(
            args.parent_span,
            args.shared.run_id,
            &args.shared.agent,
            args.agent.model().name(),
        );
        let window = compaction::window(
            args.limits.context_window,
            args.agent.price().map(|p| p.context),
        );
        let compaction = Compaction::new(window).reply_room(args.agent.spec().max_tokens);
        let judging = crate::actors::judging::Judging::of(args.agent.judges());
        let durable = args.durable.map(|d| {
            // Its first checkpoint (or the one it resumes from) holds what
            // it starts with.
            let (steps, critic) = args
                .resumed
                .as_ref()
                .map_or((0, 0), |c| (c.steps.len(), c.critic.len()));
            durable::Durable::new(
                d,
                Unchanged {
                    messages: args.transcript.len(),
                    steps,
                    critic,
                },
            )
        });
        let mut st = Box::new(RunState {
            addr,
            max_iterations: args.limits.max_iterations,
            watch: Watched::new(
                &args.limits,
                args.agent
                    .spec()
                    .critic
                    .loops
                    .resolve(args.limits.repeat_limit),
                started,
            ),
            shared: args.shared,
            agent: args.agent,
            limits: args.limits,
            audit: args.audit,
            budget: args.budget,
            ticket: args.ticket,
            transcript: args.transcript,
            iteration,
            steers: None,
            inflight: None,
            epoch: 0,
            error_steps: 0,
            compaction,
            started,
            done: false,
            finalized: false,
            stopping: None,
            // Grown on demand: a run spends most of its life waiting on a
            // call, and a preallocated buffer would wait with it.
            pending_audit: Vec::new(),
            step_due: true,
            durable,
            now: started,
            clock_ms: 0,
            retry: None,
            observer: None,
            parked: None,
            resumed_turn: args
                .resumed
                .as_ref()
                .and_then(|c| c.parked.clone())
                .map(Box::new),
            guard_counts: None,
            judging,
            span,
        });
        if let Some(cap) = args.deadline_cap {
            st.watch.cap_at_parent(cap);
        }
        if let Some(info) = args.info {
            st.audit_entry(AuditEntry::RunStarted(Box::new(info)));
        }
        if let (Some(c), Some(d)) = (&args.resumed, &st.durable) {
            st.event(RunEvent::Resumed {
                attempt: d.run.resumes,
                iteration: c.iteration,
            });
        }
        st
    }

    /// The run's span (its handlers run inside it).
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Starts a handler: the clock it shares.
    pub(crate) fn begin(&mut self, now: Instant) {
        self.now = now;
        self.clock_ms = 0;
    }

    /// Ends a handler: the records and the tokens it made go out (one
    /// message each at most).
    pub(crate) fn end(&mut self) {
        self.flush_audit();
        self.flush_meter();
    }

    /// Handles one message.
    pub(crate) fn on_message(&mut self, msg: RunMsg) {
        if self.done {
            return;
        }
        match msg {
            RunMsg::NextStep => self.next_step(),
            RunMsg::ModelDone { epoch, result } => {
                if epoch == self.epoch && self.inflight.is_some() {
                    self.inflight = None;
                    self.model_done(result);
                }
            }
            RunMsg::SummaryDone { epoch, result } => {
                if epoch == self.epoch && self.inflight.is_some() {
                    self.inflight = None;
                    self.summary_done(result);
                }
            }
            RunMsg::ModelPanicked { epoch, text } => {
                if epoch == self.epoch && self.inflight.is_some() {
                    self.inflight = None;
                    tracing::warn!(run_id = %self.shared.run_id, "model call panicked: {text}");
                    let e = Ending::failed(
                        RunStatus::Error,
                        "panic",
                        format!("model call panicked: {text}"),
                    );
                    self.finish(e);
                }
            }
            RunMsg::ToolsDone { epoch, outcomes } => {
                if epoch == self.epoch && self.inflight.is_some() {
                    self.inflight = None;
                    self.tools_done(outcomes);
                }
            }
            RunMsg::Retrying {
                kind,
                message,
                delay,
            } => {
                self.beat(Beat::Alive);
                let ev = RunEvent::ModelRetry {
                    iteration: self.iteration,
                    kind: kind.to_string(),
                    message,
                    delay_ms: delay.as_millis() as u64,
                };
                self.event(ev);
            }
            RunMsg::ToolEvent(ev) => {
                self.beat(Beat::Alive);
                self.event(ev);
            }
            RunMsg::Warned { kind, message } => {
                self.event(RunEvent::Warning { kind, message });
            }
            RunMsg::ApprovalJudged { usage, outcome } => self.approval_judged(usage, outcome),
            RunMsg::CheckpointSaved { epoch } => {
                if epoch == self.epoch && matches!(self.inflight, Some(Inflight::Checkpoint)) {
                    self.inflight = None;
                    self.step_due = true;
                }
            }
            RunMsg::GuardDenied { detail } => self.denied_through_run(detail),
        }
    }

    /// Queues a message for the next model call.
    pub(crate) fn steer(&mut self, text: String) {
        self.steers.get_or_insert_with(Box::default).push(text);
    }

    /// Raises the iteration ceiling.
    pub(crate) fn raise_iterations(&mut self, by: u32) {
        self.max_iterations = self.max_iterations.saturating_add(by);
        self.shared.partial().max_iterations = self.max_iterations;
    }

    /// A handler panicked: the run ends `error`/`panic` with the text,
    /// keeping the records it made before.
    pub(crate) fn panicked(&mut self, text: &str) {
        // A panic inside `finish` may have marked the run done before it
        // finalized: finish again (the shared finisher still decides once,
        // so a run that did finalize keeps its result).
        self.done = false;
        self.stopping = None;
        self.finish(Ending::failed(
            RunStatus::Error,
            "panic",
            format!("run panicked: {text}"),
        ));
    }

    pub(crate) fn next_step(&mut self) {
        // A resumed run that was parked goes back to its parked turn.
        if let Some(parked) = self.resumed_turn.take() {
            if self.resume_parked(*parked) {
                return;
            }
        }
        // Budget (see `actors::budget`): limits checked, tokens reserved.
        let mut room = None;
        if let Some(t) = &mut self.ticket {
            if let Some(spent) = t.begin_call(self.started) {
                let mut e = Ending::killed(KillReason::Budget);
                e.error = Some(spent.message());
                return self.finish(e);
            }
            room = t.room();
        }
        if self.iteration >= self.max_iterations {
            let e = Ending::failed(
                RunStatus::Error,
                "max_iterations",
                format!("stopped after {} model calls", self.iteration),
            );
            return self.finish(e);
        }
        if let Some(steers) = self.steers.take() {
            for text in *steers {
                self.push_message(Message::text(Role::User, text.clone()));
                self.event(RunEvent::MessageCreate {
                    role: "user".into(),
                    text,
                });
            }
        }
        if let Some(due) = self.compaction.due(self.iteration, &self.transcript) {
            return self.summarize(due);
        }
        self.iteration += 1;
        self.shared.partial().iterations = self.iteration;
        self.event(RunEvent::StepStart {
            iteration: self.iteration,
        });
        self.beat(Beat::StepStarted);

        // Deltas go straight to the listener, not through the mailbox: a
        // model that answers at once streams before `step.finish`, and its
        // deltas would otherwise queue behind the run's end and be dropped.
        // The sink is there whether or not anyone listens yet: a client
        // that subscribes while the call runs (a server's event stream,
        // opened after the submission) gets the deltas from then on; with
        // nobody listening a delta costs a load of the subscriber count.
        let shared = self.shared.clone();
        let iteration = self.iteration;
        let on_delta: Option<DeltaSink> = Some(Arc::new(move |text: &str| {
            if shared.wants_deltas() {
                shared.emit_delta(RunEvent::TextDelta {
                    iteration,
                    text: text.to_string(),
                });
            }
        }));
        let request = ChatRequest {
            messages: self.transcript.clone(),
            tools: self.agent.tools().specs(),
            call_index: self.compaction.call_index(self.iteration - 1),
            response_schema: self.agent.output().map(|o| o.schema().clone()),
            on_delta,
            // The deadline as this run knows it (the critic may extend it;
            // a retry layer then stops early rather than late).
            deadline: Some(self.watch.deadline()),
            on_retry: self.retry_sink(),
            options: capped_options(self.agent.call_options(), room),
            observer: self.call_observer(),
        };
        let done = |epoch, result| RunMsg::ModelDone { epoch, result };
        if let Some(result) = self.start_call(request, done) {
            self.model_done(result);
        }
    }

    /// Reports a handler, or a call polled in place, that held the shard
    /// for `took`: a warn log and a `warning` event (`slow_handler`) naming
    /// the run and the call.
    pub(crate) fn slow(&mut self, what: &str, took: std::time::Duration) {
        let ms = took.as_millis() as u64;
        tracing::warn!(run_id = %self.shared.run_id, took_ms = ms, "{what} held the critic shard for {ms} ms");
        if !self.done {
            self.event(RunEvent::Warning {
                kind: "slow_handler".into(),
                message: format!(
                    "{what} of run {} held its critic shard for {ms} ms (calls that can block must not answer at once)",
                    self.shared.run_id
                ),
            });
        }
    }

    /// A heartbeat: the critic's record of the run sees it at once.
    pub(crate) fn beat(&mut self, beat: Beat) {
        self.watch.beat(self.now, beat);
    }

    /// Stops what the run has in flight without finalizing it (its shard
    /// is going away; the host finalizes the run).
    pub(crate) fn abandon(&mut self) {
        if let Some(f) = self.inflight.take() {
            f.abort();
        }
    }

    /// Appends to the transcript: copied first if it is shared (a request
    /// in flight, or the agent's starting transcript), with room to grow.
    /// A transcript only grows this way, so a durable run's next
    /// checkpoint carries only the messages appended since its last.
    fn push_message(&mut self, message: Message) {
        if Arc::get_mut(&mut self.transcript).is_none() {
            let mut own = Vec::with_capacity(self.transcript.len() + 4);
            own.extend(self.transcript.iter().cloned());
            self.transcript = Arc::new(own);
        }
        Arc::make_mut(&mut self.transcript).push(message);
    }

    /// Replaces the transcript (compaction): the messages of its head that
    /// stay as they were are all a durable run's next checkpoint keeps of
    /// its last one's; it writes the rest anew.
    fn replace_transcript(&mut self, transcript: Vec<Message>) {
        if let Some(d) = &mut self.durable {
            let kept = self
                .transcript
                .iter()
                .zip(&transcript)
                .take_while(|(was, is)| was == is)
                .count();
            d.saved.messages = d.saved.messages.min(kept);
        }
        self.transcript = Arc::new(transcript);
    }
}

impl Drop for RunState {
    fn drop(&mut self) {
        // A run dropped with a call in flight (its shard failed) takes the
        // call with it: no task outlives its run.
        self.abandon();
    }
}

/// Polls a future once in place: `Ok(output)` when it is ready at once,
/// otherwise the future back, to be moved into a task (which polls it again
/// with a real waker).
fn poll_once<F: Future + Unpin>(mut fut: F) -> Result<F::Output, F> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match Pin::new(&mut fut).poll(&mut cx) {
        Poll::Ready(v) => Ok(v),
        Poll::Pending => Err(fut),
    }
}

/// The text of a panic payload.
pub(crate) fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    crate::panics::payload_text(p.as_ref()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_state_stays_in_its_size_class() {
        // A run's state is one allocation held for the run's whole life:
        // 768 bytes is a size class of the CLI's allocator (mimalloc),
        // and one byte more costs every run in flight the next (896).
        // Per-agent data is shared (`Arc`), rare data boxed.
        let size = std::mem::size_of::<RunState>();
        assert!(size <= 768, "RunState is {size} bytes");
    }
}
