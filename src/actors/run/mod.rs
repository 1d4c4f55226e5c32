//! A run: one agent loop, an actor hosted on a critic shard. It drives the
//! loop as messages — `NextStep` → `ModelDone` → `ToolsDone` → `NextStep` …
//! → answer — and never awaits a model or tool call while it handles one.
//!
//! # An actor without a task of its own
//! A run has what makes an actor: its own state, its own message vocabulary
//! ([`RunMsg`]), one message handled at a time, in the order sent, and a
//! supervisor that sees it fail. It does not have a ractor actor (two
//! tasks, four channels, about 6.5 KB) of its own: its messages go through
//! the mailbox of the critic shard that supervises it
//! (`CriticMsg::Run { key, msg }`), and the shard runs its handler. So a
//! run costs its state and nothing else, its critic record sits inside that
//! state (heartbeats are field updates, not messages), and a critic
//! decision reaches it at once. A panic in a run's handler is caught by the
//! shard and ends that run alone `error`/`panic`.
//!
//! A call is polled once in place (a scripted or cached answer is ready at
//! once, and then costs no task); if it is not ready, it moves into a task
//! the run holds an abort handle for, and its result comes back as a
//! message tagged with an epoch, so a stale result after an abort is ignored.
//! A stop (kill, cancel, deadline) therefore lands between any two awaits
//! and aborts the in-flight HTTP request or tool at once.
//!
//! Before a model call the run estimates its prompt; past 0.7 × the model's
//! context window it first makes a summary call the same way (a task, its
//! result a `SummaryDone` message) and replaces the transcript's middle with
//! the summary, or keeps the transcript whole if the call fails (see
//! `crate::compaction`).
//!
//! A run on a model that streams hands each call an observer
//! (`observer`): streamed chunks are heartbeats, the
//! call's wait for its first token is bounded by `first_token_timeout`
//! instead of the stall timeout, streamed text is kept as partial output,
//! and a provider's fallbacks and estimates become `warning` events.
//!
//! Audit records are collected while a message is handled and sent to the
//! audit actor as one batch at the end of it. The partial result lives in
//! the shared record (`RunShared`) that the run's handle reads.
//!
//! Guarantees: the run finalizes exactly once (the shared finisher decides);
//! partial output, steps and usage are kept on every ending; a durable run
//! takes its next step only once its last step's checkpoint is written
//! (`checkpoint_then_step`).
//!
//! The loop stays in this file (its messages, its state and the step
//! handlers that read and write that state); what stands apart has a file
//! of its own under `run/`: a turn's tool calls (`tools`), the summary call
//! (`summary`), how a run ends (`ending`), what a model call reports
//! while it runs (`observer`), how a sub-agent's deadline follows its
//! parent's (`parent`), the guards a call and an answer pass (`guard`),
//! what a tool that works through its run reaches (`wait`) and what the
//! run tells and asks its model judges (`judging`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use ractor::ActorRef;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::actors::audit::{AuditMsg, SaveWaiter};
use crate::actors::budget::{BudgetMsg, Ticket};
use crate::actors::watch::{Beat, Watched, SLOW_HANDLER};
use crate::agent::Agent;
use crate::compaction::{self, Compaction};
use crate::output::OutputSchema;
use crate::ports::audit::{AuditEntry, AuditRecord, RunInfo};
use crate::ports::checkpoint::{Checkpoint, EncodedJson, ParkedCalls};
use crate::ports::event::RunEvent;
use crate::ports::model::{
    CallObserver, CallOptions, ChatRequest, ChatResponse, DeltaSink, Message, ModelError,
    RetrySink, Role,
};
use crate::ports::run::{unix_ms, KillReason, RunStatus, Usage};
use crate::record::{Ending, RunShared, STORE_UNAVAILABLE};
use crate::spec::Limits;

mod approval;
mod ending;
mod guard;
mod judging;
mod observer;
pub(crate) mod parent;
pub(crate) mod spans;
mod summary;
mod tools;
mod wait;

use observer::RunObserver;

pub use tools::ToolOutcome;

/// Audit records a handler's buffer has room for from its first record.
const AUDIT_RESERVE: usize = 16;

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
    pub(crate) limits: Limits,
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

/// What a durable run's checkpoints carry besides its progress: its
/// manifest and invocation encoded once (a save copies neither).
pub(crate) struct DurableRun {
    pub(crate) agent: Arc<str>,
    pub(crate) spec: EncodedJson,
    /// The invocation, with its run id and resolved prompt.
    pub(crate) invocation: EncodedJson,
    pub(crate) resumes: u32,
    pub(crate) started_at: u64,
}

/// A run's state: the loop's, and its critic's record of it.
pub struct RunState {
    pub(crate) addr: RunAddr,
    pub(crate) shared: Arc<RunShared>,
    agent: Agent,
    pub(crate) limits: Limits,
    audit: ActorRef<AuditMsg>,
    budget: ActorRef<BudgetMsg>,
    ticket: Option<Ticket>,
    transcript: Arc<Vec<Message>>,
    iteration: u32,
    max_iterations: u32,
    steers: Vec<String>,
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
    /// Ended, waiting for its child runs to end (until the instant).
    stopping: Option<(Ending, Instant)>,
    pending_audit: Vec<AuditRecord>,
    /// The next step is due: the shard takes it in the same handler (up
    /// to `INLINE_STEPS` of them), not through the mailbox.
    pub(crate) step_due: bool,
    durable: Option<Arc<DurableRun>>,
    /// The clock read once per handler: the records and heartbeats a
    /// handler makes share it (they are made within microseconds).
    pub(crate) now: Instant,
    clock_ms: Option<u64>,
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
            steers: Vec::new(),
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
            durable: args.durable,
            now: started,
            clock_ms: None,
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
                attempt: d.resumes,
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
        self.clock_ms = None;
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
        self.steers.push(text);
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
        if !self.steers.is_empty() {
            for text in std::mem::take(&mut self.steers) {
                self.transcript_mut()
                    .push(Message::text(Role::User, text.clone()));
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
        let on_delta: Option<DeltaSink> = if self.shared.has_listener() {
            let shared = self.shared.clone();
            let iteration = self.iteration;
            Some(Arc::new(move |text: &str| {
                shared.emit_delta(RunEvent::TextDelta {
                    iteration,
                    text: text.to_string(),
                });
            }))
        } else {
            None
        };
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

    /// Starts a model call. A model that answers at once without blocking
    /// (`ChatModel::answers_at_once`) is polled once in place, and its
    /// result is returned when ready; any other call — and one that was not
    /// ready — runs in a task the run holds an abort handle for, its result
    /// coming back as `done(epoch, result)` (or `ModelPanicked`). So a
    /// provider's first poll (encoding a long transcript, connecting) never
    /// runs on the shard.
    fn start_call(
        &mut self,
        request: ChatRequest,
        done: fn(u32, Result<ChatResponse, ModelError>) -> RunMsg,
    ) -> Option<Result<ChatResponse, ModelError>> {
        let model = self.agent.model().clone();
        let in_place = model.answers_at_once();
        let span = spans::chat(&self.span, model.name());
        let call = async move { model.complete(request).await };
        let fut = Box::pin(spans::instrument(call, spans::fork(&span)));
        self.epoch += 1;
        let epoch = self.epoch;
        let fut = if in_place {
            let polled = poll_once(fut);
            let took = Instant::now().saturating_duration_since(self.now);
            if polled.is_ok() {
                crate::telemetry::model_call(self.agent.model().name(), took);
            }
            if took > SLOW_HANDLER {
                let what = format!("the model call ({})", self.agent.model().name());
                self.slow(&what, took);
            }
            match polled {
                Ok(result) => {
                    spans::chat_done(&span, &result);
                    return Some(result);
                }
                Err(fut) => fut,
            }
        } else {
            fut
        };
        let me = self.addr.clone();
        let timed =
            crate::telemetry::enabled().then(|| (self.agent.model().clone(), Instant::now()));
        let task = tokio::spawn(async move {
            let msg = match AssertUnwindSafe(crate::panics::quietly(fut))
                .catch_unwind()
                .await
            {
                Ok(result) => {
                    if let Some((model, t0)) = timed {
                        crate::telemetry::model_call(model.name(), t0.elapsed());
                    }
                    spans::chat_done(&span, &result);
                    done(epoch, result)
                }
                Err(panic) => RunMsg::ModelPanicked {
                    epoch,
                    text: panic_text(&panic),
                },
            };
            me.send(msg);
        });
        self.inflight = Some(Inflight::Model(task.abort_handle()));
        None
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

    /// Counts a call's usage in the run's usage and cost (and its answer,
    /// if substantive, as the partial output) and charges it to the caller's
    /// budget; returns its tokens.
    fn charge(&mut self, usage: &Usage, answer: Option<&str>) -> u64 {
        let tokens = usage.total();
        let mut cost = 0;
        {
            let mut p = self.shared.partial();
            p.usage.add(usage);
            if let Some(price) = self.agent.price() {
                let total = price.cost_micros(&p.usage);
                cost = total.saturating_sub(p.cost_micros);
                p.cost_micros = total;
            }
            if let Some(text) = answer.filter(|t| !t.trim().is_empty()) {
                p.last_text = Some(text.to_string());
            }
        }
        if let Some(t) = &mut self.ticket {
            // The account sees it now; the ledger with the handler's end.
            t.charge(tokens, cost);
        }
        tokens
    }

    /// Charges a streamed model call cut before its end with what arrived
    /// (see `observer`): its usage counts in the run's usage, cost and
    /// budgets like a finished call's.
    pub(crate) fn charge_cut_call(&mut self) {
        let Some(o) = &self.observer else {
            return;
        };
        if let Some(usage) = o.cut_usage(&self.transcript) {
            self.charge(&usage, None);
        }
    }

    fn model_done(&mut self, result: Result<ChatResponse, ModelError>) {
        if let Some(o) = &self.observer {
            o.call_ended();
        }
        let resp = match checked_usage(result) {
            Ok(r) => r,
            Err(e) => {
                self.beat(Beat::StepFinished { tokens: 0 });
                return self.finish(Ending::failed(RunStatus::Error, e.kind(), e.to_string()));
            }
        };
        // The transcript is still the one the call saw.
        let sent = self.transcript.len();
        self.compaction.observe(sent, resp.usage.input_tokens);
        let tokens = self.charge(&resp.usage, Some(&resp.text));
        let passed = self.ticket.as_ref().and_then(|t| t.passed());
        if let (1, Some(id)) = (self.iteration, self.agent.unpriced_model()) {
            let message = format!("the price table has no model `{id}`: its cost counts as 0");
            self.event(RunEvent::Warning {
                kind: "unknown_price".into(),
                message,
            });
        }
        self.beat(Beat::StepFinished { tokens });
        if !resp.tool_calls.is_empty() {
            // The critic reads the text of a reply the run goes on from
            // (one that ends it is not judged).
            self.watch.reply(self.now, &resp.text);
        }
        self.event(RunEvent::StepFinish {
            iteration: self.iteration,
            text: resp.text.clone(),
            tool_calls: resp.tool_calls.len() as u32,
            usage: resp.usage,
            calls: resp.tool_calls.clone(),
            finish_reason: resp.finish_reason.clone(),
        });
        if let Some(spent) = passed {
            // The reply passed a budget: the run ends here, the reply's
            // text kept as its output, its tool calls not run.
            let mut e = Ending::killed(KillReason::Budget);
            e.error = Some(spent.message());
            if !resp.text.trim().is_empty() {
                e.output = Some(resp.text);
            }
            return self.finish(e);
        }
        if resp.tool_calls.is_empty() {
            self.transcript_mut()
                .push(Message::text(Role::Assistant, resp.text.clone()));
            self.event(RunEvent::MessageCreate {
                role: "assistant".into(),
                text: resp.text.clone(),
            });
            // The output guard: one repair turn, then `guardrail`.
            if self.output_refused(&resp.text) {
                return;
            }
            // Structured output (M7): one repair turn, then `invalid_output`.
            if let Some(Err(why)) = self.agent.output().map(|o| o.check(&resp.text)) {
                if OutputSchema::repaired(&self.transcript) {
                    let mut e = Ending::failed(RunStatus::Error, "invalid_output", why);
                    e.output = Some(resp.text);
                    return self.finish(e);
                }
                let text = self
                    .agent
                    .output()
                    .map(|o| o.repair_prompt(&why))
                    .unwrap_or_default();
                self.steers.push(text);
                self.step_due = true;
                return;
            }
            return self.finish(Ending::ok(resp.text));
        }
        // The calls start (each polled once in place) before the assistant
        // message takes them into the transcript: no copy of the list.
        let ready = self.dispatch_tools(&resp.tool_calls, &[]);
        self.transcript_mut().push(Message {
            role: Role::Assistant,
            content: resp.text,
            tool_calls: resp.tool_calls,
            tool_call_id: None,
            attachments: Vec::new(),
        });
        if let Some(outcomes) = ready {
            self.tools_done(outcomes);
        } else if self.parked.is_some() {
            // Parked: saved with the turn, so a resumed run waits again.
            self.checkpoint();
        }
    }

    /// What the retry layer calls before each backoff sleep: a `Retrying`
    /// message to the run through its shard (a heartbeat, and a
    /// `model.retry` event the run records). Made once a run,
    /// and only for a model that reports retries (see
    /// `ChatModel::reports_retries`): `None` otherwise.
    fn retry_sink(&mut self) -> Option<RetrySink> {
        if let Some(sink) = &self.retry {
            return Some(sink.clone());
        }
        if !self.agent.model().reports_retries() {
            return None;
        }
        let addr = self.addr.clone();
        let sink: RetrySink = Arc::new(move |e: &ModelError, delay: std::time::Duration| {
            // The run records it in its own handler (so its `seq` is taken
            // in order); the message is also the heartbeat.
            addr.send(RunMsg::Retrying {
                kind: e.kind(),
                message: e.to_string(),
                delay,
            });
        });
        self.retry = Some(sink.clone());
        Some(sink)
    }

    /// The observer for the model call about to start (see
    /// `observer`): made once, for a model that streams, whose calls
    /// then have a first-token phase. `None` for other models.
    fn call_observer(&mut self) -> Option<Arc<dyn CallObserver>> {
        if self.observer.is_none() {
            if !self.agent.model().streams() {
                return None;
            }
            let throttle =
                RunObserver::throttle(self.limits.stall_timeout, self.limits.first_token());
            self.observer = Some(Arc::new(RunObserver::new(
                self.addr.clone(),
                self.shared.clone(),
                throttle,
            )));
        }
        let observer = self.observer.as_ref()?;
        observer.call_started();
        self.watch.await_first_token();
        Some(observer.clone())
    }

    /// A durable run's progress as a checkpoint (`None` for a run that is
    /// not durable).
    fn progress(&self) -> Option<Checkpoint> {
        let d = self.durable.as_ref()?;
        let (steps, usage, cost, critic) = {
            let p = self.shared.partial();
            (p.steps.clone(), p.usage, p.cost_micros, p.critic.clone())
        };
        Some(Checkpoint {
            run_id: self.shared.run_id,
            agent: d.agent.clone(),
            spec: d.spec.clone(),
            invocation: d.invocation.clone(),
            transcript: self.transcript.clone(),
            iteration: self.iteration,
            steps,
            usage,
            cost_micros: Some(cost),
            critic,
            // A run parked for approval is at rest, not crashing: its
            // resumes no longer count toward a crash loop.
            resumes: if self.parked.is_some() { 0 } else { d.resumes },
            started_at: d.started_at,
            saved_at: unix_ms(),
            parked: self.parked_calls(),
        })
    }

    /// Saves a parked durable run's state (its turn and the calls that
    /// wait) without waiting: the run takes no step until a decision, and
    /// the next step's checkpoint is waited for as usual.
    pub(crate) fn checkpoint(&mut self) {
        if let Some(checkpoint) = self.progress() {
            let _ = self.audit.cast(AuditMsg::Checkpoint {
                checkpoint: Box::new(checkpoint),
                saved: None,
            });
        }
    }

    /// A step is done: the next is due — for a durable run, once its
    /// progress is saved. The checkpoint goes to the audit actor's
    /// checkpoint task, and the run waits (`Inflight::Checkpoint`) until
    /// it is written: a run that goes on has its steps on record, so
    /// `recover` never runs them again. While the store refuses it, the
    /// wait is retried, beats, and ends at the run's deadline
    /// (`error`/`store_unavailable`, see `finish`). A run that is not
    /// durable goes on at once.
    fn checkpoint_then_step(&mut self) {
        let Some(checkpoint) = self.progress() else {
            self.step_due = true;
            return;
        };
        self.epoch += 1;
        let waiter = StepSaved {
            addr: self.addr.clone(),
            epoch: self.epoch,
        };
        let sent = self.audit.cast(AuditMsg::SaveStep {
            checkpoint: Box::new(checkpoint),
            waiter: Box::new(waiter),
        });
        if sent.is_err() {
            let e = Ending::failed(
                RunStatus::Error,
                STORE_UNAVAILABLE,
                "the run's checkpoint could not be saved: the audit actor is gone",
            );
            return self.finish(e);
        }
        self.inflight = Some(Inflight::Checkpoint);
    }

    /// A heartbeat: the critic's record of the run sees it at once.
    pub(crate) fn beat(&mut self, beat: Beat) {
        self.watch.beat(self.now, beat);
    }

    /// Sends the tokens charged since the last meter to the budget actor
    /// (once per handler; a finished run's go with its commit).
    fn flush_meter(&mut self) {
        if self.done {
            return;
        }
        if let Some(t) = &mut self.ticket {
            let spend = t.take_unmetered();
            if spend != Default::default() {
                let _ = self.budget.cast(BudgetMsg::Meter {
                    caller: t.caller_arc(),
                    spend,
                });
            }
        }
    }

    /// Records an event: its `seq` is taken, subscribers get it, and its
    /// audit record goes out with the handler's batch.
    pub(crate) fn event(&mut self, ev: RunEvent) {
        // A subscriber may decide the moment it reads `approval.requested`,
        // on another thread: the call must wait before anyone hears of it.
        // (A race no test can time; every test that gates a call checks it.)
        #[cfg(debug_assertions)]
        if let RunEvent::ApprovalRequested { call_id, .. } = &ev {
            let waits = self
                .shared
                .partial()
                .awaiting
                .iter()
                .any(|p| p.call_id == *call_id);
            debug_assert!(waits, "approval.requested for {call_id} before it waits");
        }
        let seq = self.shared.next_seq();
        self.shared.emit(seq, &ev);
        self.push_record(seq, AuditEntry::Event(ev));
    }

    pub(crate) fn audit_entry(&mut self, entry: AuditEntry) {
        let seq = self.shared.next_seq();
        self.push_record(seq, entry);
    }

    fn push_record(&mut self, seq: u32, entry: AuditEntry) {
        let at_ms = *self.clock_ms.get_or_insert_with(unix_ms);
        if self.pending_audit.capacity() == 0 {
            // Room for a whole run that answers at once (W1 makes 13
            // records): one allocation, not a chain of regrowths.
            self.pending_audit.reserve(AUDIT_RESERVE);
        }
        self.pending_audit.push(AuditRecord {
            run_id: self.shared.run_id,
            seq,
            at_ms,
            entry,
        });
    }

    /// Stops what the run has in flight without finalizing it (its shard
    /// is going away; the host finalizes the run).
    pub(crate) fn abandon(&mut self) {
        if let Some(f) = self.inflight.take() {
            f.abort();
        }
    }

    /// The transcript, to add to: copied first if it is shared (a request
    /// in flight, or the agent's starting transcript), with room to grow.
    fn transcript_mut(&mut self) -> &mut Vec<Message> {
        if Arc::get_mut(&mut self.transcript).is_none() {
            let mut own = Vec::with_capacity(self.transcript.len() + 4);
            own.extend(self.transcript.iter().cloned());
            self.transcript = Arc::new(own);
        }
        Arc::make_mut(&mut self.transcript)
    }

    fn flush_audit(&mut self) {
        if !self.pending_audit.is_empty() {
            let batch = std::mem::take(&mut self.pending_audit);
            let _ = self.audit.cast(AuditMsg::Records(batch));
        }
    }
}

/// A durable run waiting for its step's checkpoint: told through its
/// shard (see `checkpoint_then_step`).
struct StepSaved {
    addr: RunAddr,
    epoch: u32,
}

impl SaveWaiter for StepSaved {
    fn saved(self: Box<Self>) {
        self.addr
            .send(RunMsg::CheckpointSaved { epoch: self.epoch });
    }

    fn still_waiting(&self) {
        // Waiting for the store is no stall.
        self.addr.beat(Beat::Alive);
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

/// A model call's result with its usage checked (`Usage::check_call`): a
/// reply that claims more tokens than a call can use is malformed.
pub(crate) fn checked_usage(
    result: Result<ChatResponse, ModelError>,
) -> Result<ChatResponse, ModelError> {
    let resp = result?;
    match resp.usage.check_call() {
        Ok(()) => Ok(resp),
        Err(why) => Err(ModelError::Malformed(why)),
    }
}

/// The largest reply cap a budget sends on its own (a manifest with no
/// `max_tokens`): every chat model takes a cap this small, where a larger
/// one can exceed a model's output limit and be refused; it is also the
/// Anthropic provider's default. Above it, the budget is checked when the
/// reply's usage is known.
const BUDGET_CAP_MAX: u64 = 4096;

/// The call options with the reply's token cap no larger than what the
/// run's budgets leave (`room`, see `Ticket::room`), the manifest's own
/// `max_tokens` the upper bound. The agent's options as they are (no
/// copy) when no budget is tighter.
fn capped_options(
    options: Option<Arc<CallOptions>>,
    room: Option<u64>,
) -> Option<Arc<CallOptions>> {
    let Some(room) = room else {
        return options;
    };
    let set = options.as_ref().and_then(|o| o.max_tokens).map(u64::from);
    let bound = set.unwrap_or(BUDGET_CAP_MAX);
    if room >= bound {
        return options;
    }
    let mut o = options.as_deref().cloned().unwrap_or_default();
    // `room` is under a u32 bound here; at least 1 (0 means "no cap" to
    // some servers).
    o.max_tokens = Some(u32::try_from(room.max(1)).unwrap_or(u32::MAX));
    Some(Arc::new(o))
}
