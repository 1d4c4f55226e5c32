//! The critic: the ractor supervisor of the runs it watches, one shard of
//! many. It receives step and tool heartbeats (casts), keeps a small record
//! per run, and decides — through the [`CriticPolicy`] port — to steer, extend
//! the deadline, raise the step ceiling, or kill with a typed reason.
//!
//! # Timing
//! Deadlines sit in one ordered timer set per shard (`BTreeSet<(Instant,
//! run)>`) and one sleeper task per shard wakes the critic at the earliest
//! one: no task per timer, no scan of every run per tick. Timers are lazy: a
//! heartbeat only stamps `last_beat` (O(1)); when a run's timer fires, its
//! deadlines are re-evaluated and the next one armed. Stale timer entries are
//! skipped.
//!
//! # Kills
//! A kill is sticky: the first reason wins. The critic records the decision
//! (result, events, audit), asks the run to stop (it aborts its in-flight call
//! and finalizes), and arms a grace timer; if the run has not finalized when
//! it expires, the critic hard-kills the actor and finalizes the run itself
//! from the shared partial record.
//!
//! # Supervision
//! A run that panics reaches `handle_supervisor_evt` as `ActorFailed`; the
//! critic finalizes it as `error`/`panic` with the panic text. A failure can
//! overtake the run's own `Watch` message (supervision events are handled
//! before ordinary messages), so early failures are parked until it arrives.
//!
//! # Repeats
//! The run counts identical consecutive tool calls too; once a call reaches
//! `repeat_limit`, it sends `ReleaseStep` after its heartbeats instead of
//! stepping on by itself, so a run whose tools answer at once cannot outrun
//! the repeat decision. Only repeating runs pay this round trip.
//!
//! # Rate
//! About six heartbeats per model iteration per run. A shard never awaits in
//! `handle`; a policy that consults a model runs as a task.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::actors::audit::AuditMsg;
use crate::actors::run::RunMsg;
use crate::handle::{Ending, RunShared, SUSPENDED};
use crate::ports::audit::{AuditEntry, AuditRecord};
use crate::ports::critic::{CriticPolicy, Decision, RunView, Trigger, Verdict};
use crate::ports::run::{unix_ms, CriticAction, CriticDecision, KillReason, RunEvent, RunStatus};
use crate::spec::{Limits, ABSOLUTE_DEADLINE};

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
    /// Still alive (a retry, a streamed chunk).
    Alive,
}

/// What a run tells its critic when it starts.
pub struct Watch {
    pub(crate) run: ActorRef<RunMsg>,
    pub(crate) shared: Arc<RunShared>,
    pub(crate) limits: Limits,
    pub(crate) started: Instant,
}

impl Watch {
    /// A watch over `run`, an actor that no host submitted: the shard keeps
    /// its record and timer as for any run, but its result goes nowhere. For
    /// benches and tests that drive one shard alone (send it as
    /// `CriticMsg::Watch(Box::new(..))`); a host builds its own watches.
    pub fn unhosted(run: ActorRef<RunMsg>, limits: Limits) -> Self {
        let (shared, _result, _events) = RunShared::new(
            crate::ports::run::RunId::new(),
            Arc::from("unhosted"),
            None,
            None,
            limits.max_iterations,
            false,
            Arc::default(),
        );
        Watch {
            run,
            shared,
            limits,
            started: Instant::now(),
        }
    }
}

/// Messages to a critic shard.
pub enum CriticMsg {
    /// A run started: watch it.
    Watch(Box<Watch>),
    /// A heartbeat.
    Beat {
        /// The run actor's pid.
        run: u64,
        /// What happened.
        beat: Beat,
    },
    /// Heartbeats of one run, in order (one message per run handler).
    Beats {
        /// The run actor's pid.
        run: u64,
        /// What happened.
        beats: Vec<Beat>,
    },
    /// An operator pushes the deadline back.
    ExtendDeadline {
        /// The run actor's pid.
        run: u64,
        /// By how much.
        by: Duration,
    },
    /// An operator kills (`Some(reason)`) or cancels (`None`) a run.
    StopRun {
        /// The run actor's pid.
        run: u64,
        /// The kill reason, or `None` to cancel.
        reason: Option<KillReason>,
    },
    /// Cancel every watched run (host shutdown).
    CancelAll,
    /// A run that repeats a tool call asks for its next step through the
    /// critic, so the repeat decision (a steer, a `runaway` kill) reaches it
    /// before its next model call: the critic answers with `NextStep` after
    /// the heartbeats that came before (one mailbox, in order).
    ReleaseStep {
        /// The run to release.
        run: ActorRef<RunMsg>,
    },
    /// The earliest timer is due.
    Tick,
    /// A policy that took its time has decided.
    Decided {
        /// The run actor's pid.
        run: u64,
        /// What triggered the question.
        trigger: Trigger,
        /// The answer.
        decision: Decision,
    },
}

/// One critic shard.
pub struct Critic {
    pub(crate) policy: Arc<dyn CriticPolicy>,
    pub(crate) audit: ActorRef<AuditMsg>,
}

impl Critic {
    /// A shard outside any host: it decides with `policy` and records its
    /// decisions and the runs it finalizes to `audit`. For benches and tests
    /// that drive one shard alone (`Actor::spawn(None, Critic::new(..), ())`);
    /// a host spawns its own shards.
    pub fn new(policy: Arc<dyn CriticPolicy>, audit: ActorRef<AuditMsg>) -> Self {
        Critic { policy, audit }
    }
}

/// Per-run record: small on purpose (C8).
struct Watched {
    run: ActorRef<RunMsg>,
    shared: Arc<RunShared>,
    limits: Limits,
    started: Instant,
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
    /// Set once a stop is decided (rare: boxed).
    stopping: Option<Box<(Ending, Instant)>>,
}

impl Watched {
    fn progress(&self) -> u32 {
        self.steps_done + self.tool_calls
    }

    fn next_due(&self) -> Instant {
        if let Some(s) = &self.stopping {
            return s.1;
        }
        let stall = self.last_beat + self.limits.stall_timeout;
        self.hard_deadline.min(stall).min(self.next_soft)
    }

    fn at_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.started).as_millis() as u64
    }
}

/// The shard's state.
pub struct CriticState {
    /// Boxed: the table then costs a pointer a slot (it grows by doubling).
    runs: HashMap<u64, Box<Watched>>,
    timers: BTreeSet<(Instant, u64)>,
    wake_at: Option<Instant>,
    wake_tx: watch::Sender<Option<Instant>>,
    early_failures: HashMap<u64, String>,
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
            early_failures: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<CriticMsg>,
        msg: CriticMsg,
        st: &mut CriticState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CriticMsg::Watch(w) => self.watch(st, *w),
            CriticMsg::Beat { run, beat } => self.beat(&myself, st, run, beat),
            CriticMsg::Beats { run, beats } => {
                for beat in beats {
                    self.beat(&myself, st, run, beat);
                }
            }
            CriticMsg::ExtendDeadline { run, by } => {
                let now = Instant::now();
                if let Some(w) = st.runs.get_mut(&run) {
                    let cap = w.started + ABSOLUTE_DEADLINE;
                    w.hard_deadline = (w.hard_deadline + by).min(cap);
                    let d = decision(
                        w,
                        now,
                        CriticAction::Extend,
                        "operator",
                        Some(format!("{}ms", by.as_millis())),
                    );
                    self.record(w, d);
                }
            }
            CriticMsg::StopRun { run, reason } => {
                let now = Instant::now();
                if let Some(w) = st.runs.get_mut(&run) {
                    match reason {
                        Some(r) => {
                            let d = decision(w, now, CriticAction::Kill, "operator", None);
                            self.begin_stop(w, now, Ending::killed(r), Some(d));
                        }
                        None => {
                            let e = Ending::failed(
                                RunStatus::Cancelled,
                                "cancelled",
                                "cancelled by the caller",
                            );
                            self.begin_stop(w, now, e, None);
                        }
                    }
                    arm(st, run);
                }
            }
            CriticMsg::CancelAll => {
                let now = Instant::now();
                let pids: Vec<u64> = st.runs.keys().copied().collect();
                for pid in pids {
                    if let Some(w) = st.runs.get_mut(&pid) {
                        let e =
                            Ending::failed(RunStatus::Cancelled, SUSPENDED, "the host shut down");
                        self.begin_stop(w, now, e, None);
                    }
                    arm(st, pid);
                }
            }
            CriticMsg::ReleaseStep { run } => {
                let _ = run.cast(RunMsg::NextStep);
            }
            CriticMsg::Tick => self.tick(&myself, st),
            CriticMsg::Decided {
                run,
                trigger,
                decision,
            } => {
                let now = Instant::now();
                if let Some(w) = st.runs.get_mut(&run) {
                    self.apply(w, now, trigger, decision);
                    arm(st, run);
                }
            }
        }
        rewake(st);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<CriticMsg>,
        evt: SupervisionEvent,
        st: &mut CriticState,
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorFailed(cell, err) => {
                let pid = cell.get_id().pid();
                let text = format!("run actor panicked: {err}");
                match st.runs.remove(&pid) {
                    Some(w) => {
                        tracing::error!(run_id = %w.shared.run_id, "{text}");
                        w.shared
                            .finish(Ending::failed(RunStatus::Error, "panic", text), &self.audit);
                    }
                    None => {
                        st.early_failures.insert(pid, text);
                    }
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let pid = cell.get_id().pid();
                if let Some(w) = st.runs.remove(&pid) {
                    // A run finalizes before it stops; this catches one that did not.
                    let text = format!(
                        "run actor stopped before finishing ({})",
                        reason.unwrap_or_default()
                    );
                    w.shared
                        .finish(Ending::failed(RunStatus::Error, "lost", text), &self.audit);
                }
            }
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => {}
        }
        Ok(())
    }
}

impl Critic {
    fn watch(&self, st: &mut CriticState, w: Watch) {
        let pid = w.run.get_id().pid();
        if let Some(text) = st.early_failures.remove(&pid) {
            w.shared
                .finish(Ending::failed(RunStatus::Error, "panic", text), &self.audit);
            return;
        }
        if w.shared.partial().finished {
            return;
        }
        let cap = w.started + ABSOLUTE_DEADLINE;
        let watched = Watched {
            hard_deadline: (w.started + w.limits.hard_timeout).min(cap),
            next_soft: w.started + w.limits.soft_timeout,
            last_beat: Instant::now(),
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
            stopping: None,
            run: w.run,
            shared: w.shared,
            limits: w.limits,
            started: w.started,
        };
        st.runs.insert(pid, Box::new(watched));
        arm(st, pid);
    }

    fn beat(&self, myself: &ActorRef<CriticMsg>, st: &mut CriticState, pid: u64, beat: Beat) {
        let Some(w) = st.runs.get_mut(&pid) else {
            return;
        };
        let now = Instant::now();
        w.last_beat = now;
        match beat {
            Beat::StepStarted => w.steps += 1,
            Beat::StepFinished { tokens } => {
                w.steps_done += 1;
                w.tokens += tokens;
            }
            Beat::ToolFinished => w.tool_calls += 1,
            Beat::Alive => {}
            Beat::ToolStarted { hash } => {
                if hash == w.last_call {
                    w.repeats += 1;
                } else {
                    w.last_call = hash;
                    w.repeats = 1;
                }
                if w.repeats >= w.limits.repeat_limit && w.stopping.is_none() {
                    let trigger = Trigger::Repeat { count: w.repeats };
                    self.ask(myself, w, pid, now, trigger);
                    arm(st, pid);
                }
            }
        }
    }

    fn tick(&self, myself: &ActorRef<CriticMsg>, st: &mut CriticState) {
        let now = Instant::now();
        while let Some(&(at, pid)) = st.timers.first() {
            if at > now {
                break;
            }
            st.timers.pop_first();
            let Some(w) = st.runs.get_mut(&pid) else {
                continue;
            };
            if w.armed != Some(at) {
                continue;
            }
            w.armed = None;
            if self.evaluate(myself, w, pid, now) {
                st.runs.remove(&pid);
            } else {
                arm(st, pid);
            }
        }
        // Always answer the sleeper, which waits for a change after a tick.
        st.wake_at = None;
    }

    /// Re-evaluates one run's deadlines when its timer fires; true when the
    /// run is gone (hard-killed) and no longer watched.
    fn evaluate(
        &self,
        myself: &ActorRef<CriticMsg>,
        w: &mut Watched,
        pid: u64,
        now: Instant,
    ) -> bool {
        if let Some(stop) = &w.stopping {
            let (ending, grace) = &**stop;
            if *grace <= now {
                tracing::warn!(run_id = %w.shared.run_id, "run did not stop within the grace period: hard kill");
                w.run.kill();
                w.shared.finish(ending.clone(), &self.audit);
                return true;
            }
            return false;
        }
        if now >= w.hard_deadline {
            self.ask(myself, w, pid, now, Trigger::HardDeadline);
        } else if now >= w.last_beat + w.limits.stall_timeout {
            self.ask(myself, w, pid, now, Trigger::Stall);
        } else if now >= w.next_soft {
            w.next_soft = now + w.limits.extension.max(Duration::from_millis(1));
            self.ask(myself, w, pid, now, Trigger::SoftTimeout);
        }
        false
    }

    fn ask(
        &self,
        myself: &ActorRef<CriticMsg>,
        w: &mut Watched,
        pid: u64,
        now: Instant,
        trigger: Trigger,
    ) {
        let view = RunView {
            agent: w.shared.agent.to_string(),
            elapsed: now.saturating_duration_since(w.started),
            steps: w.steps,
            steps_since_decision: w.progress().saturating_sub(w.progress_at_decision),
            tool_calls: w.tool_calls,
            tokens: w.tokens,
            extensions: w.extensions,
            steers: w.steers,
            runaway_steered: w.runaway_steered,
            limits: w.limits,
        };
        match self.policy.decide(trigger, &view) {
            Verdict::Now(d) => self.apply(w, now, trigger, d),
            Verdict::Later(fut) => {
                let me = myself.clone();
                tokio::spawn(async move {
                    let decision = fut.await;
                    let _ = me.cast(CriticMsg::Decided {
                        run: pid,
                        trigger,
                        decision,
                    });
                });
            }
        }
    }

    fn apply(&self, w: &mut Watched, now: Instant, trigger: Trigger, d: Decision) {
        if w.stopping.is_some() {
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
                    Trigger::Repeat { .. } => w.runaway_steered = true,
                    _ => w.steers += 1,
                }
                let dec = decision(w, now, CriticAction::Steer, reason, Some(text.clone()));
                self.record(w, dec);
                let _ = w.run.cast(RunMsg::Steer { text });
            }
            Decision::Extend(by) => {
                w.extensions += 1;
                let cap = w.started + ABSOLUTE_DEADLINE;
                w.hard_deadline = (w.hard_deadline + by).min(cap);
                let dec = decision(
                    w,
                    now,
                    CriticAction::Extend,
                    reason,
                    Some(format!("{}ms", by.as_millis())),
                );
                self.record(w, dec);
            }
            Decision::RaiseIterations(by) => {
                let dec = decision(
                    w,
                    now,
                    CriticAction::RaiseIterations,
                    reason,
                    Some(by.to_string()),
                );
                self.record(w, dec);
                let _ = w.run.cast(RunMsg::RaiseIterations { by });
            }
            Decision::Kill(kill) => {
                let dec = decision(w, now, CriticAction::Kill, kill.as_str(), None);
                self.begin_stop(w, now, Ending::killed(kill), Some(dec));
            }
        }
        w.progress_at_decision = w.progress();
    }

    /// Records a decision where the caller sees it: the result, the event
    /// stream and the audit log.
    fn record(&self, w: &Watched, d: CriticDecision) {
        let event = RunEvent::from_decision(d.clone());
        w.shared.partial().critic.push(d);
        w.shared.emit(&event);
        let _ = self.audit.cast(AuditMsg::Record(AuditRecord {
            run_id: w.shared.run_id,
            seq: w.shared.next_seq(),
            at_ms: unix_ms(),
            entry: AuditEntry::Event(event),
        }));
    }

    /// Sticky stop: the first reason wins; the run is asked to finalize and a
    /// grace timer guards it.
    fn begin_stop(&self, w: &mut Watched, now: Instant, ending: Ending, d: Option<CriticDecision>) {
        if w.stopping.is_some() {
            return;
        }
        if let Some(d) = d {
            self.record(w, d);
        }
        w.stopping = Some(Box::new((ending.clone(), now + w.limits.kill_grace)));
        if w.run
            .cast(RunMsg::Stop {
                ending: ending.clone(),
            })
            .is_err()
        {
            w.shared.finish(ending, &self.audit);
        }
    }
}

fn decision(
    w: &Watched,
    now: Instant,
    action: CriticAction,
    reason: &str,
    detail: Option<String>,
) -> CriticDecision {
    CriticDecision {
        action,
        reason: reason.to_string(),
        at_ms: w.at_ms(now),
        detail,
    }
}

/// Arms the run's next timer if it is earlier than the one armed.
fn arm(st: &mut CriticState, pid: u64) {
    let Some(w) = st.runs.get_mut(&pid) else {
        return;
    };
    let due = w.next_due();
    if w.armed.is_some_and(|a| a <= due) {
        return;
    }
    w.armed = Some(due);
    st.timers.insert((due, pid));
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
