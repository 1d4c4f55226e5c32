//! The critic: one shard of many, each the supervisor and the host of its
//! runs (see [`crate::actors::run`]). Through the [`CriticPolicy`] port the
//! critic decides to steer, extend the deadline, raise the step ceiling, or
//! kill with a typed reason.
//!
#![doc = include_str!("../../../docs/critic-shard.md")]

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::actors::audit::AuditMsg;
use crate::actors::run::{panic_text, RunAddr, RunArgs, RunMsg, RunState, ShardLink};
use crate::actors::watch::{Beat, SLOW_HANDLER};
use crate::ports::critic::{CriticPolicy, Decision, Trigger};
use crate::ports::run::{CriticAction, RunStatus};
use crate::record::{Command, Ending, Mailbox};

mod decisions;
mod judge;
mod timers;

use decisions::decision;
use timers::{arm, rewake, sleeper};

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
    runs: HashMap<u64, Box<RunState>, foldhash::fast::RandomState>,
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
            runs: HashMap::default(),
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
}
