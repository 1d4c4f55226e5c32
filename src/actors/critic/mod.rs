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
//! reviews it: a loop one of its detectors saw (a tool call repeated up to
//! `critic.loops.repeat`, a poll, a cycle, …; see `crate::actors::watch`)
//! is decided on before the run's next step, so a run whose tools answer
//! at once cannot outrun the decision. One loop is decided a review; a
//! decision on a loop carries its kind (`loop`) into the decision, and a
//! kill into the result. A step whose calls answered at once goes
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
//! A sub-agent's run is capped at its parent's hard deadline as it is now:
//! a parent whose deadline moves tells its children, and a child that
//! reaches the cap while its parent is still in flight goes on (the parent
//! ends it when it ends); it ends `killed`/`parent` only once its parent
//! has ended (see `crate::actors::run::parent`).
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
//! (result, events, audit) and stops the run at once: its status is decided
//! and it finalizes in the same handler. An in-flight model call is
//! aborted; in-flight tool calls get a cancellation signal (their
//! `ToolContext::cancel`) and up to `kill_grace` to clean up before they
//! are dropped.
//!
//! # Supervision
//! A panic in a run's handler (a model that panics when first polled, a
//! tool's argument check, a policy) is caught by the shard: that run ends
//! `error`/`panic` with the panic text, keeping the records it made before;
//! the shard and its other runs go on. A model call that panics in its task
//! comes back as `RunMsg::ModelPanicked` and ends its run the same way.
//!
//! # A shard is never frozen
//! A shard cannot preempt a handler, so a run's model and tool calls make
//! their first poll on the shard only when the model or tool says it
//! answers at once without blocking (`answers_at_once`: the scripted model,
//! the pure built-ins); every other call starts in a task of its own, so a
//! tool that blocks its thread or a provider that encodes a long transcript
//! holds a worker thread, not the shard. A handler or an in-place call that
//! still takes longer than [`SLOW_HANDLER`] is reported (a `warning` event
//! `slow_handler` and a warn log naming the run and the call).
//!
//! Whatever a policy answers, a shard's handler returns, and no timer is
//! re-armed at the instant it fired: a stall that the policy lets go on
//! opens a fresh stall window; a hard deadline ends the run unless an
//! extension (within `max_extensions`) moved it past now; the 24 h cap
//! ends it regardless. A policy that answers later (`Verdict::Later`) gets
//! [`POLICY_TIMEOUT`], one pending question per run and
//! [`MAX_PENDING_DECISIONS`] per shard; past any of these the rules decide.
//!
//! # A model judge
//! An agent whose manifest asks for one (`critic: { policy: judge }`) has
//! its runs reviewed by a model on a cadence and at the soft timeout, as
//! tasks whose answers come back as `CriticMsg::Judged` (see `judge`). It
//! is the agent's, not the host's: the host's `CriticPolicy` still decides
//! stalls, repeats and the hard deadline, and decides for the judge when
//! it fails.
//!
//! # Pauses are not stalls
//! The shard's sleeper also wakes every [`PULSE`] while it has runs, and
//! measures the real (monotonic) time between its wake-ups: a gap far
//! longer than the pulse means the process was not scheduled (a VM pause, a
//! laptop sleep, SIGSTOP). The shard then moves every run's stall window by
//! the gap before any timer is judged; hard deadlines still hold.
//!
//! # Rate
//! One message per run start, one per spawned call's result, one per
//! heartbeat of a spawned tool call or a retry. W1 (every call answers at
//! once) costs the shard one message a run. A shard never awaits in
//! `handle`; a policy that consults a model runs as a task. Its mailbox is
//! unbounded: runs are admitted by the host (its run cap and the callers'
//! accounts), which bounds what the shards hold.
//!
//! The shard stays one file, as every actor does (its messages, state and
//! handlers together): its timers, reviews and decisions all act on the one
//! timer set and run table it owns.

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::actors::audit::AuditMsg;
use crate::actors::run::{panic_text, spans, RunAddr, RunArgs, RunMsg, RunState, ShardLink};
use crate::actors::watch::{Beat, SLOW_HANDLER};
use crate::policy::rules;
use crate::ports::critic::{CriticPolicy, Decision, RunView, Trigger, Verdict};
use crate::ports::event::RunEvent;
use crate::ports::run::{CriticAction, CriticDecision, KillReason, LoopKind, RunStatus};
use crate::record::{Command, Ending, Mailbox};

mod judge;

pub(crate) use judge::JudgeAnswer;

/// The `error_kind` of a run killed while its streaming model call still
/// waited for its first token (see `Limits::first_token_timeout`).
pub const FIRST_TOKEN_TIMEOUT: &str = "first_token_timeout";

/// Steps a run takes in one handler at most when its calls answer at once.
pub const INLINE_STEPS: u32 = 8;

/// How long a policy that answers later may take; then the rules decide.
pub const POLICY_TIMEOUT: Duration = Duration::from_secs(30);

/// Questions a shard leaves pending with policies that answer later; past
/// it the rules decide at once.
pub const MAX_PENDING_DECISIONS: usize = 4096;

/// How often a shard with runs checks that the process was scheduled.
pub const PULSE: Duration = Duration::from_millis(500);

/// A gap between pulses longer than this (beyond the pulse) is a pause.
pub const PAUSE_GAP: Duration = Duration::from_secs(1);

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
    /// A command from a run's handle or reference.
    Command {
        /// The run's key.
        key: u64,
        /// What is asked.
        cmd: Command,
    },
    /// Cancel every run of the shard (host shutdown).
    CancelAll,
    /// The earliest timer is due.
    Tick,
    /// The process was not scheduled for `gap` (measured on the real
    /// clock): stall windows move by it.
    Paused {
        /// How long.
        gap: Duration,
    },
    /// A policy that took its time has decided.
    Decided {
        /// The run's key.
        key: u64,
        /// What triggered the question.
        trigger: Trigger,
        /// The answer.
        decision: Decision,
    },
    /// A run's model judge has answered (see `judge`).
    Judged {
        /// The run's key.
        key: u64,
        /// The answer.
        answer: Box<JudgeAnswer>,
    },
    /// Test hook: make the shard fail (outside any run's handler), or stop
    /// handling runs' messages.
    #[doc(hidden)]
    InjectFault(Fault),
}

/// A fault a test injects into a shard ([`CriticMsg::InjectFault`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The shard's handler returns an error: the shard fails.
    Fail,
    /// The shard ignores every later message (a wedged shard).
    Wedge,
}

impl ShardLink for ActorRef<CriticMsg> {
    fn run_msg(&self, key: u64, msg: RunMsg) {
        let _ = self.cast(CriticMsg::Run { key, msg });
    }

    fn beat(&self, key: u64, beat: Beat) {
        let _ = self.cast(CriticMsg::Beat { key, beat });
    }
}

impl Mailbox for ActorRef<CriticMsg> {
    fn command(&self, key: u64, cmd: Command) {
        if let Err(ractor::MessagingErr::SendErr(CriticMsg::Command {
            cmd: Command::Barrier(tx),
            ..
        })) = self.cast(CriticMsg::Command { key, cmd })
        {
            let _ = tx.send(Default::default());
        }
    }
}

/// One critic shard.
pub struct Critic {
    pub(crate) policy: Arc<dyn CriticPolicy>,
    /// The audit actor (barriers for subscribers go through it).
    pub(crate) audit: ActorRef<AuditMsg>,
    /// Questions pending with policies, across the shard's runs.
    pub(crate) pending: Arc<AtomicUsize>,
}

impl Critic {
    /// A shard that decides with `policy` (a host spawns one per shard and
    /// starts its runs on them).
    pub(crate) fn new(policy: Arc<dyn CriticPolicy>, audit: ActorRef<AuditMsg>) -> Self {
        Critic {
            policy,
            audit,
            pending: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// The shard's state.
pub struct CriticState {
    /// Boxed: the table then costs a pointer a slot (it grows by doubling).
    runs: HashMap<u64, Box<RunState>>,
    timers: BTreeSet<(Instant, u64)>,
    wake_at: Option<Instant>,
    wake_tx: watch::Sender<Option<Instant>>,
    /// Test hook: the shard ignores its messages.
    wedged: bool,
    /// The shard as its runs' tasks reach it (one, shared by its runs).
    link: Arc<dyn ShardLink>,
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
        let link: Arc<dyn ShardLink> = Arc::new(myself.clone());
        tokio::spawn(sleeper(myself, wake_rx));
        Ok(CriticState {
            link,
            runs: HashMap::new(),
            timers: BTreeSet::new(),
            wake_at: None,
            wake_tx,
            wedged: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<CriticMsg>,
        msg: CriticMsg,
        st: &mut CriticState,
    ) -> Result<(), ActorProcessingErr> {
        if st.wedged {
            return Ok(());
        }
        match msg {
            CriticMsg::Start(args) => {
                let key = args.key;
                let addr = RunAddr {
                    shard: st.link.clone(),
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
            CriticMsg::Command { key, cmd } => self.command(&myself, st, key, cmd),
            CriticMsg::CancelAll => {
                let keys: Vec<u64> = st.runs.keys().copied().collect();
                for key in keys {
                    self.with_run(&myself, st, key, Instant::now(), |critic, run| {
                        critic.stop(run, Ending::suspended(), None);
                    });
                }
            }
            CriticMsg::Tick => self.tick(&myself, st),
            CriticMsg::Paused { gap } => {
                let now = Instant::now();
                tracing::warn!(
                    gap_ms = gap.as_millis() as u64,
                    runs = st.runs.len(),
                    "the process was not scheduled for a while: stall windows move by the gap"
                );
                for run in st.runs.values_mut() {
                    run.watch.shift(gap, now);
                }
                // The host's leases may have expired meanwhile: it checks
                // them before it writes more of its durable runs.
                let _ = self.audit.cast(AuditMsg::Paused { gap });
            }
            CriticMsg::Decided {
                key,
                trigger,
                decision,
            } => {
                self.with_run(&myself, st, key, Instant::now(), |critic, run| {
                    run.watch.pending = false;
                    critic.apply(run, trigger, decision);
                });
            }
            CriticMsg::Judged { key, answer } => {
                self.with_run(&myself, st, key, Instant::now(), |critic, run| {
                    critic.judged(run, *answer);
                });
            }
            CriticMsg::InjectFault(Fault::Fail) => {
                return Err("a fault injected into the critic shard".into());
            }
            CriticMsg::InjectFault(Fault::Wedge) => {
                st.wedged = true;
                return Ok(());
            }
        }
        rewake(st);
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<CriticMsg>,
        st: &mut CriticState,
    ) -> Result<(), ActorProcessingErr> {
        // The host finalizes the runs of a shard that stopped or failed
        // (`shard_failed`); their calls in flight go with them.
        for run in st.runs.values_mut() {
            run.abandon();
        }
        Ok(())
    }
}

impl Critic {
    /// A command from a run's handle or reference.
    fn command(&self, myself: &ActorRef<CriticMsg>, st: &mut CriticState, key: u64, cmd: Command) {
        let now = Instant::now();
        match cmd {
            Command::Barrier(tx) => {
                // The run's records of its last handler went to the audit
                // actor before this message: a drain covers them.
                let _ = self.audit.cast(AuditMsg::Drain(tx.into()));
            }
            Command::Steer(text) => {
                self.with_run(myself, st, key, now, |_, run| run.steer(text));
            }
            Command::Decide {
                call_id,
                approve,
                reason,
            } => {
                self.with_run(myself, st, key, now, |_, run| {
                    run.decide_approval(call_id.as_deref(), approve, reason)
                });
            }
            Command::ChildEnded(_) => {
                self.with_run(myself, st, key, now, |_, run| run.child_ended());
            }
            Command::Beat => {
                self.with_run(myself, st, key, now, |_, run| run.beat(Beat::Alive));
            }
            Command::Fence => {
                self.with_run(myself, st, key, now, |critic, run| {
                    critic.stop(run, Ending::fenced(), None);
                });
            }
            Command::Extend(by) => {
                self.with_run(myself, st, key, now, |critic, run| {
                    run.watch.extend(run.started, by);
                    run.tell_children_deadline();
                    let detail = Some(format!("{}ms", by.as_millis()));
                    let d = decision(run, CriticAction::Extend, "operator", detail);
                    critic.record(run, d);
                });
            }
            Command::ParentDeadline(at) => {
                self.with_run(myself, st, key, now, |_, run| run.parent_deadline_moved(at));
            }
            Command::Stop(reason) => {
                self.with_run(myself, st, key, now, |critic, run| match reason {
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
                });
            }
        }
    }

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
        let handled = crate::panics::catch(AssertUnwindSafe(|| {
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
            tracing::warn!(run_id = %run.shared.run_id, "run panicked: {text}");
            run.panicked(&text);
        }
        let took = Instant::now().saturating_duration_since(now);
        if took > SLOW_HANDLER {
            run.slow("the handler", took);
        }
        run.end();
        if run.finalized {
            if let Some(at) = run.watch.armed {
                st.timers.remove(&(at, key));
            }
            st.runs.remove(&key);
        } else {
            arm(&mut st.timers, key, run);
        }
    }

    /// Decides on a loop a detector saw (a repeat that reached the
    /// limit first), before the next step: one decision a review.
    fn review(&self, myself: &ActorRef<CriticMsg>, run: &mut RunState) {
        let repeat = std::mem::take(&mut run.watch.repeat_due);
        let other = run.watch.loops.due.take();
        if run.done {
            return;
        }
        if repeat {
            let count = run.watch.repeats;
            self.ask(myself, run, Trigger::Repeat { count });
        } else if let Some((kind, count)) = other {
            self.ask(myself, run, Trigger::Loop { kind, count });
        }
        if run.judging.is_some() {
            self.review_judge(myself, run);
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
        if let Some(at) = run.stop_deadline() {
            if now >= at {
                run.stop_now();
            }
            return;
        }
        if run.done {
            return;
        }
        if let Some((_, until)) = run.watch.parked {
            // Waiting for an operator: no deadline but the approval's.
            if now >= until {
                run.approval_timed_out();
            }
            return;
        }
        let w = &mut run.watch;
        let trigger = if now >= w.deadline() {
            Trigger::HardDeadline
        } else if now >= w.last_beat + w.stall_bound(&run.limits) {
            // Whatever is decided, the next stall is judged a whole stall
            // window from now: the timer never fires again at this instant.
            w.last_beat = now;
            if w.pending {
                return;
            }
            Trigger::Stall
        } else if now >= w.next_soft {
            w.next_soft = now + run.limits.extension.max(Duration::from_millis(1));
            if w.pending {
                return;
            }
            Trigger::SoftTimeout
        } else {
            return;
        };
        if trigger == Trigger::HardDeadline {
            if run.watch.at_parent_deadline() {
                return self.parent_deadline(run);
            }
            return self.hard_deadline(run);
        }
        if trigger == Trigger::SoftTimeout
            && run.judging.is_some()
            && self.judge_soft_timeout(myself, run)
        {
            return;
        }
        self.ask(myself, run, trigger);
    }

    /// The hard deadline: the policy may extend it once more (within
    /// `max_extensions` and the 24 h cap) or name another kill; anything
    /// else — continue, steer, an answer it would give later — ends the run
    /// `timeout`/`deadline`.
    fn hard_deadline(&self, run: &mut RunState) {
        let view = view_of(run);
        let asked = std::time::Instant::now();
        let verdict = self.policy.decide(Trigger::HardDeadline, &view);
        let took = asked.elapsed();
        if took > SLOW_HANDLER {
            run.slow("the critic policy", took);
        }
        let d = match verdict {
            Verdict::Now(d @ Decision::Extend(_))
                if run.watch.extensions < run.limits.max_extensions =>
            {
                d
            }
            Verdict::Now(d @ Decision::Kill(_)) => d,
            _ => Decision::Kill(KillReason::Deadline),
        };
        self.apply(run, Trigger::HardDeadline, d);
        if !run.done && run.now >= run.watch.deadline() {
            // The extension did not move it (the 24 h cap).
            let dec = decision(run, CriticAction::Kill, "deadline", None);
            self.stop(run, Ending::killed(KillReason::Deadline), Some(dec));
        }
    }

    /// A sub-agent's run reached its parent's deadline as it knows it: it
    /// ends `killed`/`parent` if the parent has ended, and goes on while
    /// the parent is in flight (see `crate::actors::run::parent`). No
    /// policy is asked: the cause is not the run's.
    fn parent_deadline(&self, run: &mut RunState) {
        if run.at_parent_cap() {
            let dec = decision(run, CriticAction::Kill, "parent", None);
            self.stop(run, Ending::killed(KillReason::Parent), Some(dec));
        }
    }

    fn ask(&self, myself: &ActorRef<CriticMsg>, run: &mut RunState, trigger: Trigger) {
        let view = view_of(run);
        let asked = std::time::Instant::now();
        let verdict = self.policy.decide(trigger, &view);
        let took = asked.elapsed();
        if took > SLOW_HANDLER {
            run.slow("the critic policy", took);
        }
        match verdict {
            Verdict::Now(d) => self.apply(run, trigger, d),
            Verdict::Later(fut) => {
                if run.watch.pending
                    || self.pending.load(Ordering::Relaxed) >= MAX_PENDING_DECISIONS
                {
                    // One question per run, a bounded number per shard:
                    // beyond that the rules decide now.
                    return self.apply(run, trigger, rules(trigger, &view));
                }
                run.watch.pending = true;
                self.pending.fetch_add(1, Ordering::Relaxed);
                let pending = self.pending.clone();
                let me = myself.clone();
                let key = run.addr.key;
                tokio::spawn(async move {
                    let decision = match tokio::time::timeout(POLICY_TIMEOUT, fut).await {
                        Ok(d) => d,
                        Err(_) => {
                            tracing::warn!(
                                ?trigger,
                                "the critic policy did not answer in time: the rules decide"
                            );
                            rules(trigger, &view)
                        }
                    };
                    pending.fetch_sub(1, Ordering::Relaxed);
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
        self.carry_out(run, Some(trigger), None, None, d);
    }

    /// Carries a decision out and records it: for `trigger` (`None`: the
    /// run's model judge decided on its own cadence), with `said` as the
    /// recorded reason when given (a judge's), else the trigger's name
    /// (a kill's: its kill reason), and `kill_detail` as a kill's detail.
    fn carry_out(
        &self,
        run: &mut RunState,
        trigger: Option<Trigger>,
        said: Option<&str>,
        kill_detail: Option<String>,
        d: Decision,
    ) {
        if run.done {
            return;
        }
        let named = match trigger {
            Some(Trigger::SoftTimeout) => "soft_timeout",
            Some(Trigger::Stall) => "stalled",
            Some(Trigger::Repeat { .. } | Trigger::Loop { .. }) => "runaway",
            Some(Trigger::HardDeadline) => "deadline",
            None => "judge",
        };
        let reason = said.unwrap_or(named);
        let looped = trigger.and_then(loop_of);
        match d {
            Decision::Continue => return,
            Decision::Steer(text) => {
                match trigger {
                    Some(Trigger::Repeat { .. }) => run.watch.runaway_steered = true,
                    _ => run.watch.steers += 1,
                }
                if let Some(kind) = looped {
                    run.watch.loops.steered.insert(kind);
                }
                let mut dec = decision(run, CriticAction::Steer, reason, Some(text.clone()));
                dec.loop_kind = looped;
                self.record(run, dec);
                run.steer(text);
            }
            Decision::Extend(by) => {
                if run.watch.extensions >= run.limits.max_extensions {
                    // C2: extensions are bounded, whatever a policy asks.
                    return;
                }
                run.watch.extensions += 1;
                run.watch.extend(run.started, by);
                run.tell_children_deadline();
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
                let mut detail = kill_detail;
                if matches!(trigger, Some(Trigger::Stall)) && run.watch.awaiting_first {
                    // Told apart from a stall: the server never started answering.
                    let waited = run.limits.first_token();
                    ending.error_kind = Some(FIRST_TOKEN_TIMEOUT.to_string());
                    ending.error = Some(format!(
                        "killed: no first token within {} (a server that queues requests, or one that does not answer; see `limits.first_token_timeout`)",
                        crate::spec::format_duration(waited)
                    ));
                    detail = Some(FIRST_TOKEN_TIMEOUT.to_string());
                }
                if let Some(kind) = looped {
                    ending.loop_kind = Some(kind);
                    ending.error = Some(format!("killed: {kill} (loop: {kind})"));
                }
                let mut dec = decision(
                    run,
                    CriticAction::Kill,
                    said.unwrap_or(kill.as_str()),
                    detail,
                );
                dec.loop_kind = looped;
                self.stop(run, ending, Some(dec));
            }
        }
        run.watch.progress_at_decision = run.watch.progress();
    }

    /// Records a decision where the caller sees it: the result, the event
    /// stream and the audit log (in the run's order of records).
    fn record(&self, run: &mut RunState, d: CriticDecision) {
        spans::decided(run.span(), &d);
        let event = RunEvent::from_decision(d.clone());
        run.shared.partial().critic.push(d);
        run.event(event);
    }

    /// Sticky stop: the first ending wins (a run that ended ignores it);
    /// the run stops its in-flight calls and finalizes now.
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

/// What a policy sees of a run.
fn view_of(run: &RunState) -> RunView {
    let w = &run.watch;
    RunView {
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
        trace: w.loops.trace.clone(),
        since_progress: run.now.saturating_duration_since(w.progress_at),
        tokens_since_progress: w.tokens.saturating_sub(w.tokens_at_progress),
        loops: w.loops.limits,
        loops_steered: w.loops.steered,
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
        loop_kind: None,
    }
}

/// The loop a trigger reports, if it is a loop detector's.
fn loop_of(trigger: Trigger) -> Option<LoopKind> {
    match trigger {
        Trigger::Repeat { .. } => Some(LoopKind::Repeat),
        Trigger::Loop { kind, .. } => Some(kind),
        _ => None,
    }
}

/// Arms the run's next timer if it is earlier than the one armed (a
/// stopping run's: the end of its children's grace).
fn arm(timers: &mut BTreeSet<(Instant, u64)>, key: u64, run: &mut RunState) {
    let due = run
        .stop_deadline()
        .unwrap_or_else(|| run.watch.next_due(&run.limits));
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
/// casts `Tick`. While the shard has runs it also wakes every [`PULSE`] and
/// measures the real time between wake-ups: a gap far past the pulse (the
/// process was not scheduled) is cast as `Paused` before the `Tick`, so the
/// shard moves stall windows before it judges them. (The real clock, not
/// tokio's: under a paused test clock, time that jumps is not a pause.)
/// Ends when the critic is gone.
async fn sleeper(critic: ActorRef<CriticMsg>, mut rx: watch::Receiver<Option<Instant>>) {
    let mut last_wake = std::time::Instant::now();
    let mut last_wake_at = Instant::now();
    loop {
        let next = *rx.borrow_and_update();
        match next {
            None => {
                if rx.changed().await.is_err() {
                    return;
                }
                last_wake = std::time::Instant::now();
                last_wake_at = Instant::now();
            }
            Some(at) => {
                // From the last wake-up, not from now: timer changes that
                // keep coming must not hold the pulse off.
                let pulse = last_wake_at + PULSE;
                tokio::select! {
                    _ = tokio::time::sleep_until(at.min(pulse)) => {
                        let real = std::time::Instant::now();
                        let paused = pause_gap(last_wake, real);
                        last_wake = real;
                        last_wake_at = Instant::now();
                        if let Some(gap) = paused {
                            if critic.cast(CriticMsg::Paused { gap }).is_err() {
                                return;
                            }
                        }
                        if Instant::now() < at {
                            continue;
                        }
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

/// How long the process was not scheduled between two pulses that the
/// real clock read at `last` and `now`: `None` for a gap within the pulse
/// and its slack.
fn pause_gap(last: std::time::Instant, now: std::time::Instant) -> Option<Duration> {
    let gap = now.saturating_duration_since(last);
    (gap > PULSE + PAUSE_GAP).then(|| gap - PULSE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_far_past_the_pulse_is_a_pause() {
        let t0 = std::time::Instant::now();
        assert_eq!(pause_gap(t0, t0 + PULSE), None);
        assert_eq!(pause_gap(t0, t0 + PULSE + PAUSE_GAP), None);
        assert_eq!(
            pause_gap(t0, t0 + Duration::from_secs(12)),
            Some(Duration::from_secs(12) - PULSE)
        );
        // A clock read out of order is no pause.
        assert_eq!(pause_gap(t0 + Duration::from_secs(5), t0), None);
    }

    #[test]
    fn a_pause_moves_the_stall_window_but_not_past_now() {
        use crate::actors::watch::Watched;
        use crate::spec::Limits;
        let t0 = Instant::now();
        let mut w = Watched::new(&Limits::default(), Default::default(), t0);
        let hard = w.hard_deadline;
        w.shift(Duration::from_secs(10), t0 + Duration::from_secs(30));
        assert_eq!(w.last_beat, t0 + Duration::from_secs(10));
        assert_eq!(w.hard_deadline, hard, "hard deadlines still hold");
        w.shift(Duration::from_secs(60), t0 + Duration::from_secs(30));
        assert_eq!(w.last_beat, t0 + Duration::from_secs(30));
    }
}
