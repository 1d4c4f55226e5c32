//! The critic: one shard of many, each the supervisor and the host of its
//! runs. A run is an actor without a task of its own (see
//! [`crate::actors::run`]): its messages come through the shard's mailbox
//! (`CriticMsg::Run { key, msg }`) and the shard runs its handler, so the
//! critic's record of a run sits in the run's own state. Heartbeats
//! (step and tool start and finish) are field updates made as the run
//! handles a message; a spawned tool call or a retry reports through a
//! `Beat` message. Through the [`CriticPolicy`] port the critic decides to
//! steer, extend the deadline, raise the step ceiling, or kill with a typed
//! reason.
//!
//! # Handling a run's message
//! For each message of a run the shard reads the clock once, runs the
//! run's handler inside the run's span and under `catch_unwind`, then
//! reviews it: a tool call repeated up to `repeat_limit` is decided on
//! before the run's next step, so a run whose tools answer at once cannot
//! outrun the repeat decision. A step whose calls answered at once goes
//! straight on to the next one, up to [`INLINE_STEPS`] in one handler
//! (then through the mailbox, so other runs of the shard get their turn).
//! The records the handler made go to the audit actor as one message.
//!
//! # Timing
//! A streaming model call waits for its first token under its own bound
//! (`first_token_timeout`, default `stall_timeout`) instead of the stall
//! timeout; its streamed chunks are heartbeats (`Beat::Streaming`, which
//! also ends the wait). A stall kill during that wait is told apart:
//! `error_kind` [`FIRST_TOKEN_TIMEOUT`].
//!
//! Deadlines sit in one ordered timer set per shard (`BTreeSet<(Instant,
//! key)>`) and one sleeper task per shard wakes the critic at the earliest
//! one: no task per timer, no scan of every run per tick. Timers are lazy:
//! a heartbeat only stamps `last_beat` (O(1)); when a run's timer fires, its
//! deadlines are re-evaluated and the next one armed. A run that ends takes
//! its timer entry with it, so the set holds live runs only.
//!
//! # Kills
//! A kill is sticky: the first reason wins. The critic records the decision
//! (result, events, audit) and stops the run at once: its in-flight call is
//! aborted and the run finalizes in the same handler. A run's handler never
//! waits, so there is nothing to grant a grace period to (`kill_grace` is
//! kept for manifests written for actors that can be slow to stop).
//!
//! # Supervision
//! A panic in a run's handler (a model that panics when first polled, a
//! tool's argument check, a policy) is caught by the shard: that run ends
//! `error`/`panic` with the panic text, keeping the records it made before;
//! the shard and its other runs go on. A model call that panics in its task
//! comes back as `RunMsg::ModelPanicked` and ends its run the same way.
//!
//! # What a shard cannot do
//! It cannot preempt a handler. A model or tool call that blocks in its
//! first poll (synchronous work, a blocking call; wrong on any tokio
//! runtime) holds the shard, and its other runs' messages and timers wait
//! until it returns. A call that awaits is moved into a task and costs the
//! shard nothing while it waits.
//!
//! # Rate
//! One message per run start, one per spawned call's result, one per
//! heartbeat of a spawned tool call or a retry. W1 (every call answers at
//! once) costs the shard one message a run. A shard never awaits in
//! `handle`; a policy that consults a model runs as a task. Its mailbox is
//! unbounded: runs are admitted by the host (its run cap and the callers'
//! accounts), which bounds what the shards hold.

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::actors::run::{panic_text, RunAddr, RunArgs, RunMsg, RunState};
use crate::handle::{Ending, SUSPENDED};
use crate::ports::audit::AuditEntry;
use crate::ports::critic::{CriticPolicy, Decision, RunView, Trigger, Verdict};
use crate::ports::run::{CriticAction, CriticDecision, KillReason, RunEvent, RunStatus};
use crate::spec::{Limits, ABSOLUTE_DEADLINE};

/// The `error_kind` of a run killed while its streaming model call still
/// waited for its first token (see `Limits::first_token_timeout`).
pub const FIRST_TOKEN_TIMEOUT: &str = "first_token_timeout";

/// Steps a run takes in one handler at most when its calls answer at once.
pub const INLINE_STEPS: u32 = 8;

/// A heartbeat from a run.
#[derive(Debug, Clone, Copy)]
pub enum Beat {
    /// A model call started (1-based iteration).
    StepStarted,
    /// A model call finished.
    StepFinished {
        /// Tokens this call used.
        tokens: u64,
    },
    /// A tool call started (hash of tool name and arguments).
    ToolStarted {
        /// Hash of the tool name and its raw arguments.
        hash: u64,
    },
    /// A tool call finished.
    ToolFinished,
    /// Still alive (a retry, a caller's heartbeat).
    Alive,
    /// A model call streamed something (text, tool-call arguments,
    /// reasoning): alive, and past its wait for the first token.
    Streaming,
}

/// Messages to a critic shard.
pub enum CriticMsg {
    /// Host a new run (or a resumed one) and take its first step.
    Start(Box<RunArgs>),
    /// A message to one of the shard's runs.
    Run {
        /// The run's key.
        key: u64,
        /// The message.
        msg: RunMsg,
    },
    /// A heartbeat from a run's task (a spawned tool call, a retry).
    Beat {
        /// The run's key.
        key: u64,
        /// What happened.
        beat: Beat,
    },
    /// An operator pushes the deadline back.
    ExtendDeadline {
        /// The run's key.
        key: u64,
        /// By how much.
        by: Duration,
    },
    /// An operator kills (`Some(reason)`) or cancels (`None`) a run.
    StopRun {
        /// The run's key.
        key: u64,
        /// The kill reason, or `None` to cancel.
        reason: Option<KillReason>,
    },
    /// Cancel every run of the shard (host shutdown).
    CancelAll,
    /// The earliest timer is due.
    Tick,
    /// A policy that took its time has decided.
    Decided {
        /// The run's key.
        key: u64,
        /// What triggered the question.
        trigger: Trigger,
        /// The answer.
        decision: Decision,
    },
}

/// One critic shard.
pub struct Critic {
    pub(crate) policy: Arc<dyn CriticPolicy>,
}

impl Critic {
    /// A shard that decides with `policy` (a host spawns one per shard and
    /// starts its runs on them).
    pub fn new(policy: Arc<dyn CriticPolicy>) -> Self {
        Critic { policy }
    }
}

/// The critic's record of one run (C8: small; it lives in the run's state).
pub(crate) struct Watched {
    hard_deadline: Instant,
    next_soft: Instant,
    last_beat: Instant,
    armed: Option<Instant>,
    steps: u32,
    /// Model calls that came back: a call that hangs is no progress.
    steps_done: u32,
    tool_calls: u32,
    tokens: u64,
    progress_at_decision: u32,
    extensions: u32,
    steers: u32,
    last_call: u64,
    repeats: u32,
    runaway_steered: bool,
    /// A repeat reached the limit: decide before the next step.
    repeat_due: bool,
    /// A streaming model call waits for its first token: the stall bound
    /// is `first_token_timeout` until it comes (a queueing server is not a
    /// stalled one), and a kill then says `first_token_timeout`.
    awaiting_first: bool,
}

impl Watched {
    pub(crate) fn new(limits: &Limits, started: Instant) -> Self {
        let cap = started + ABSOLUTE_DEADLINE;
        Watched {
            hard_deadline: (started + limits.hard_timeout).min(cap),
            next_soft: started + limits.soft_timeout,
            last_beat: started,
            armed: None,
            steps: 0,
            steps_done: 0,
            tool_calls: 0,
            tokens: 0,
            progress_at_decision: 0,
            extensions: 0,
            steers: 0,
            last_call: 0,
            repeats: 0,
            runaway_steered: false,
            repeat_due: false,
            awaiting_first: false,
        }
    }

    /// The model call just started streams: it waits for its first token.
    pub(crate) fn await_first_token(&mut self) {
        self.awaiting_first = true;
    }

    /// The stall bound in force (see `awaiting_first`).
    fn stall_bound(&self, limits: &Limits) -> Duration {
        if self.awaiting_first {
            limits.first_token()
        } else {
            limits.stall_timeout
        }
    }

    /// Counts a heartbeat (O(1)).
    pub(crate) fn beat(&mut self, now: Instant, beat: Beat, repeat_limit: u32) {
        self.last_beat = now;
        match beat {
            Beat::StepStarted => self.steps += 1,
            Beat::StepFinished { tokens } => {
                self.steps_done += 1;
                self.tokens += tokens;
                self.awaiting_first = false;
            }
            Beat::Streaming => self.awaiting_first = false,
            Beat::ToolFinished => self.tool_calls += 1,
            Beat::Alive => {}
            Beat::ToolStarted { hash } => {
                if hash == self.last_call {
                    self.repeats += 1;
                } else {
                    self.last_call = hash;
                    self.repeats = 1;
                }
                if self.repeats >= repeat_limit {
                    self.repeat_due = true;
                }
            }
        }
    }

    fn progress(&self) -> u32 {
        self.steps_done + self.tool_calls
    }

    fn next_due(&self, limits: &Limits) -> Instant {
        let stall = self.last_beat + self.stall_bound(limits);
        self.hard_deadline.min(stall).min(self.next_soft)
    }

    fn extend(&mut self, started: Instant, by: Duration) {
        let cap = started + ABSOLUTE_DEADLINE;
        self.hard_deadline = (self.hard_deadline + by).min(cap);
    }
}

/// The shard's state.
pub struct CriticState {
    /// Boxed: the table then costs a pointer a slot (it grows by doubling).
    runs: HashMap<u64, Box<RunState>>,
    timers: BTreeSet<(Instant, u64)>,
    wake_at: Option<Instant>,
    wake_tx: watch::Sender<Option<Instant>>,
}

impl Actor for Critic {
    type Msg = CriticMsg;
    type State = CriticState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<CriticMsg>,
        _: (),
    ) -> Result<CriticState, ActorProcessingErr> {
        let (wake_tx, wake_rx) = watch::channel(None);
        tokio::spawn(sleeper(myself, wake_rx));
        Ok(CriticState {
            runs: HashMap::new(),
            timers: BTreeSet::new(),
            wake_at: None,
            wake_tx,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<CriticMsg>,
        msg: CriticMsg,
        st: &mut CriticState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CriticMsg::Start(args) => {
                let key = args.key;
                let addr = RunAddr {
                    shard: myself.clone(),
                    key,
                };
                let run = RunState::start(*args, addr);
                let started = run.started;
                st.runs.insert(key, run);
                self.with_run(&myself, st, key, started, |_, _| {});
            }
            CriticMsg::Run { key, msg } => {
                self.with_run(&myself, st, key, Instant::now(), |_, run| {
                    run.on_message(msg)
                });
            }
            CriticMsg::Beat { key, beat } => {
                self.with_run(&myself, st, key, Instant::now(), |_, run| run.beat(beat));
            }
            CriticMsg::ExtendDeadline { key, by } => {
                self.with_run(&myself, st, key, Instant::now(), |critic, run| {
                    run.watch.extend(run.started, by);
                    let detail = Some(format!("{}ms", by.as_millis()));
                    let d = decision(run, CriticAction::Extend, "operator", detail);
                    critic.record(run, d);
                });
            }
            CriticMsg::StopRun { key, reason } => {
                self.with_run(
                    &myself,
                    st,
                    key,
                    Instant::now(),
                    |critic, run| match reason {
                        Some(r) => {
                            let d = decision(run, CriticAction::Kill, "operator", None);
                            critic.stop(run, Ending::killed(r), Some(d));
                        }
                        None => {
                            let e = Ending::failed(
                                RunStatus::Cancelled,
                                "cancelled",
                                "cancelled by the caller",
                            );
                            critic.stop(run, e, None);
                        }
                    },
                );
            }
            CriticMsg::CancelAll => {
                let keys: Vec<u64> = st.runs.keys().copied().collect();
                for key in keys {
                    self.with_run(&myself, st, key, Instant::now(), |critic, run| {
                        let e =
                            Ending::failed(RunStatus::Cancelled, SUSPENDED, "the host shut down");
                        critic.stop(run, e, None);
                    });
                }
            }
            CriticMsg::Tick => self.tick(&myself, st),
            CriticMsg::Decided {
                key,
                trigger,
                decision,
            } => {
                self.with_run(&myself, st, key, Instant::now(), |critic, run| {
                    critic.apply(run, trigger, decision);
                });
            }
        }
        rewake(st);
        Ok(())
    }
}

impl Critic {
    /// Runs `f` on the run `key` as one handler of that run: `now` its
    /// clock (read once, by the caller), the run's span entered, panics caught (the run ends
    /// `error`/`panic`), a due repeat decided, due steps taken (at most
    /// `INLINE_STEPS`), the handler's records sent; then the run is dropped
    /// if it ended, or its timer armed.
    fn with_run(
        &self,
        myself: &ActorRef<CriticMsg>,
        st: &mut CriticState,
        key: u64,
        now: Instant,
        f: impl FnOnce(&Critic, &mut RunState),
    ) {
        let Some(run) = st.runs.get_mut(&key) else {
            return;
        };
        let run: &mut RunState = run;
        run.begin(now);
        let span = run.span().clone();
        let _enter = span.enter();
        let handled = std::panic::catch_unwind(AssertUnwindSafe(|| {
            f(self, run);
            self.review(myself, run);
            let mut inline = 0;
            while std::mem::take(&mut run.step_due) && !run.done {
                if inline == INLINE_STEPS {
                    run.addr.send(RunMsg::NextStep);
                    break;
                }
                inline += 1;
                run.next_step();
                self.review(myself, run);
            }
        }));
        if let Err(panic) = handled {
            let text = panic_text(&panic);
            tracing::error!(run_id = %run.shared.run_id, "run panicked: {text}");
            run.panicked(&text);
        }
        run.end();
        if run.done {
            if let Some(at) = run.watch.armed {
                st.timers.remove(&(at, key));
            }
            st.runs.remove(&key);
        } else {
            arm(&mut st.timers, key, run);
        }
    }

    /// Decides on a repeat that reached the limit, before the next step.
    fn review(&self, myself: &ActorRef<CriticMsg>, run: &mut RunState) {
        if std::mem::take(&mut run.watch.repeat_due) && !run.done {
            let count = run.watch.repeats;
            self.ask(myself, run, Trigger::Repeat { count });
        }
    }

    fn tick(&self, myself: &ActorRef<CriticMsg>, st: &mut CriticState) {
        let now = Instant::now();
        while let Some(&(at, key)) = st.timers.first() {
            if at > now {
                break;
            }
            st.timers.pop_first();
            let Some(run) = st.runs.get_mut(&key) else {
                continue;
            };
            if run.watch.armed != Some(at) {
                continue;
            }
            run.watch.armed = None;
            self.with_run(myself, st, key, now, |critic, run| {
                critic.evaluate(myself, run)
            });
        }
        // Always answer the sleeper, which waits for a change after a tick.
        st.wake_at = None;
    }

    /// Re-evaluates one run's deadlines when its timer fires.
    fn evaluate(&self, myself: &ActorRef<CriticMsg>, run: &mut RunState) {
        let now = run.now;
        let w = &mut run.watch;
        let trigger = if now >= w.hard_deadline {
            Trigger::HardDeadline
        } else if now >= w.last_beat + w.stall_bound(&run.limits) {
            Trigger::Stall
        } else if now >= w.next_soft {
            w.next_soft = now + run.limits.extension.max(Duration::from_millis(1));
            Trigger::SoftTimeout
        } else {
            return;
        };
        self.ask(myself, run, trigger);
    }

    fn ask(&self, myself: &ActorRef<CriticMsg>, run: &mut RunState, trigger: Trigger) {
        let w = &run.watch;
        let view = RunView {
            agent: run.shared.agent.to_string(),
            elapsed: run.now.saturating_duration_since(run.started),
            steps: w.steps,
            steps_since_decision: w.progress().saturating_sub(w.progress_at_decision),
            tool_calls: w.tool_calls,
            tokens: w.tokens,
            extensions: w.extensions,
            steers: w.steers,
            runaway_steered: w.runaway_steered,
            limits: run.limits,
        };
        match self.policy.decide(trigger, &view) {
            Verdict::Now(d) => self.apply(run, trigger, d),
            Verdict::Later(fut) => {
                let me = myself.clone();
                let key = run.addr.key;
                tokio::spawn(async move {
                    let decision = fut.await;
                    let _ = me.cast(CriticMsg::Decided {
                        key,
                        trigger,
                        decision,
                    });
                });
            }
        }
    }

    fn apply(&self, run: &mut RunState, trigger: Trigger, d: Decision) {
        if run.done {
            return;
        }
        let reason = match trigger {
            Trigger::SoftTimeout => "soft_timeout",
            Trigger::Stall => "stalled",
            Trigger::Repeat { .. } => "runaway",
            Trigger::HardDeadline => "deadline",
        };
        match d {
            Decision::Continue => return,
            Decision::Steer(text) => {
                match trigger {
                    Trigger::Repeat { .. } => run.watch.runaway_steered = true,
                    _ => run.watch.steers += 1,
                }
                let dec = decision(run, CriticAction::Steer, reason, Some(text.clone()));
                self.record(run, dec);
                run.steer(text);
            }
            Decision::Extend(by) => {
                run.watch.extensions += 1;
                run.watch.extend(run.started, by);
                let detail = Some(format!("{}ms", by.as_millis()));
                let dec = decision(run, CriticAction::Extend, reason, detail);
                self.record(run, dec);
            }
            Decision::RaiseIterations(by) => {
                let dec = decision(
                    run,
                    CriticAction::RaiseIterations,
                    reason,
                    Some(by.to_string()),
                );
                self.record(run, dec);
                run.raise_iterations(by);
            }
            Decision::Kill(kill) => {
                let mut ending = Ending::killed(kill);
                let mut detail = None;
                if matches!(trigger, Trigger::Stall) && run.watch.awaiting_first {
                    // Told apart from a stall: the server never started answering.
                    let waited = run.limits.first_token();
                    ending.error_kind = Some(FIRST_TOKEN_TIMEOUT.to_string());
                    ending.error = Some(format!(
                        "killed: no first token within {} (a server that queues requests, or one that does not answer; see `limits.first_token_timeout`)",
                        crate::spec::format_duration(waited)
                    ));
                    detail = Some(FIRST_TOKEN_TIMEOUT.to_string());
                }
                let dec = decision(run, CriticAction::Kill, kill.as_str(), detail);
                self.stop(run, ending, Some(dec));
            }
        }
        run.watch.progress_at_decision = run.watch.progress();
    }

    /// Records a decision where the caller sees it: the result, the event
    /// stream and the audit log (in the run's order of records).
    fn record(&self, run: &mut RunState, d: CriticDecision) {
        let event = RunEvent::from_decision(d.clone());
        run.shared.partial().critic.push(d);
        run.shared.emit(&event);
        run.audit_entry(AuditEntry::Event(event));
    }

    /// Sticky stop: the first ending wins (a run that ended ignores it);
    /// the run aborts its in-flight call and finalizes now.
    fn stop(&self, run: &mut RunState, ending: Ending, d: Option<CriticDecision>) {
        if run.done {
            return;
        }
        if let Some(d) = d {
            self.record(run, d);
        }
        run.finish(ending);
    }
}

fn decision(
    run: &RunState,
    action: CriticAction,
    reason: &str,
    detail: Option<String>,
) -> CriticDecision {
    CriticDecision {
        action,
        reason: reason.to_string(),
        at_ms: run.now.saturating_duration_since(run.started).as_millis() as u64,
        detail,
    }
}

/// Arms the run's next timer if it is earlier than the one armed.
fn arm(timers: &mut BTreeSet<(Instant, u64)>, key: u64, run: &mut RunState) {
    let due = run.watch.next_due(&run.limits);
    if run.watch.armed.is_some_and(|a| a <= due) {
        return;
    }
    if let Some(old) = run.watch.armed.replace(due) {
        timers.remove(&(old, key));
    }
    timers.insert((due, key));
}

/// Points the sleeper at the earliest timer.
fn rewake(st: &mut CriticState) {
    let first = st.timers.first().map(|(at, _)| *at);
    if first != st.wake_at {
        st.wake_at = first;
        let _ = st.wake_tx.send(first);
    }
}

/// The shard's one timer task: sleeps until the earliest deadline, then
/// casts `Tick`. Ends when the critic is gone.
async fn sleeper(critic: ActorRef<CriticMsg>, mut rx: watch::Receiver<Option<Instant>>) {
    loop {
        let next = *rx.borrow_and_update();
        match next {
            None => {
                if rx.changed().await.is_err() {
                    return;
                }
            }
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {
                        if critic.cast(CriticMsg::Tick).is_err() {
                            return;
                        }
                        if rx.changed().await.is_err() {
                            return;
                        }
                    }
                    changed = rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}
