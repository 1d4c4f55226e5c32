//! The scheduler actor: runs the schedules of a skills repository.
//!
//! It keeps every schedule's next fire in one ordered set and one timer
//! task for the earliest (not a timer per schedule): when it wakes, every
//! schedule that is due fires through the [`ScheduleRunner`] it was given
//! (a task per run; the run's report comes back as a message), and its
//! next fire is computed from the schedule's clock (cron, time zone,
//! daylight saving, jitter: `crate::skills::ScheduleClock`).
//!
//! # Policies
//! - `overlap` (a fire while the schedule's previous run is still going):
//!   `skip` (default; recorded as `skipped`, reason `overlap`),
//!   `queue_one` (one fire waits for the run; a second is skipped),
//!   `cancel_previous` (the runner cancels the runs in flight, then the
//!   new one starts), `allow`.
//! - `missed` (fires that fell while no scheduler ran: the stored next fire
//!   is in the past when it starts): `skip` (default), `run_once` (one run
//!   for the latest), `backfill` (a run for each, oldest first, one after
//!   another, at most `max_catch_up`); only fires within `catch_up_window`
//!   count (see [`rules`]).
//! - `pause_after: N`: N consecutive failures of one typed reason pause the
//!   schedule, with the reason; a success, a change of the schedule or
//!   `resume` clear the streak. Fires of a paused schedule do not run (an
//!   operator's `run` does).
//! - `budget.per_day`: set as the ledger limits of the schedule's caller
//!   (`schedule:NAME`, a rolling 24 h window), so the budget actor admits
//!   or refuses its runs like any caller's; a refused run is recorded as
//!   `skipped` with the reason, and counts in no streak.
//!
//! # State
//! Every change of a schedule's state is written to the
//! [`ScheduleStore`] through one write-behind task (in order, batched), so
//! the handlers never wait on the store. What a crash can lose: the writes
//! of the last moment (the next start then sees an older state: a fire may
//! run again under `missed: run_once | backfill`, never be lost under
//! them). Runs in flight when the scheduler stops go on on the host; their
//! reports are not recorded.
//!
//! Rate: one `Tick` per distinct fire instant (1 000 schedules at one cron
//! share one), one `RunEnded` per run, and the operators' commands.

mod clock;
pub mod rules;
mod store_writer;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub use self::clock::SchedulerClock;
use self::rules::{from_ms, to_ms, Fire, FireKind, RunOutcome, RunReport};
use self::store_writer::{write_behind, Write};
use crate::ports::budget::{BudgetLedger, BudgetLimits};
use crate::ports::schedule::{Pause, ScheduleState, ScheduleStore};
use crate::skills::{Overlap, Schedule, SkillsRepo};

/// The longest the timer sleeps before it looks at the clock again (a
/// wall clock that jumped is seen within this).
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// The window of a `budget.per_day` cap in the ledger.
pub const DAY_WINDOW_SECS: u64 = 24 * 3600;

/// Runs one fire of a schedule. The scheduler calls it from a task of its
/// own per run, so it may take as long as the run does.
#[async_trait]
pub trait ScheduleRunner: Send + Sync + 'static {
    /// Runs `fire` of `repo`'s schedule and reports how it ended.
    async fn run(&self, repo: Arc<SkillsRepo>, fire: Fire) -> RunReport;

    /// Cancels the runs of schedule `name` in flight (`overlap:
    /// cancel_previous`); answers once they are asked to stop.
    async fn cancel(&self, name: &str);

    /// The ledger's limits changed (`budget.per_day`): reload them now.
    async fn budgets_changed(&self) {}
}

pub use crate::skills::schedule_caller;

/// What a fire did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "fired", content = "reason")]
pub enum FireAnswer {
    /// A run started.
    Started,
    /// It waits for the run in flight (`overlap: queue_one`).
    Queued,
    /// It did not run, and why.
    Skipped(String),
}

/// One schedule as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct ScheduleView {
    /// The schedule.
    pub schedule: Schedule,
    /// Its stored state.
    pub state: ScheduleState,
    /// Its runs in flight.
    pub running: u32,
    /// Whether a fire waits (`queue_one`).
    pub queued: bool,
    /// Missed fires still to catch up.
    pub backlog: usize,
}

/// What a reload changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadSummary {
    /// Schedules new in the repository.
    pub added: Vec<String>,
    /// Schedules no longer in it.
    pub removed: Vec<String>,
    /// Schedules whose configuration changed (streak reset).
    pub changed: Vec<String>,
    /// Schedules as they were.
    pub unchanged: Vec<String>,
}

/// A command about a schedule the scheduler does not have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no schedule `{name}` (known: {known})")]
pub struct UnknownSchedule {
    /// The name asked for.
    pub name: String,
    /// The schedules there are.
    pub known: String,
}

/// Messages to the scheduler.
pub enum SchedulerMsg {
    /// The timer: fire what is due.
    Tick,
    /// A run ended.
    RunEnded {
        /// The schedule.
        name: String,
        /// Its configuration's hash when the run started.
        hash: String,
        /// How it ended.
        report: RunReport,
    },
    /// What are the schedules?
    List(RpcReplyPort<Vec<ScheduleView>>),
    /// Fire a schedule now.
    RunNow {
        /// The schedule.
        name: String,
        /// What the fire did.
        reply: RpcReplyPort<Result<FireAnswer, UnknownSchedule>>,
    },
    /// Pause a schedule.
    Pause {
        /// The schedule.
        name: String,
        /// Why, in words.
        why: String,
        /// Its state after.
        reply: RpcReplyPort<Result<ScheduleState, UnknownSchedule>>,
    },
    /// Resume a schedule (clears its pause and streak).
    Resume {
        /// The schedule.
        name: String,
        /// Its state after.
        reply: RpcReplyPort<Result<ScheduleState, UnknownSchedule>>,
    },
    /// Run these schedules from now on (a repository read and checked).
    Reload {
        /// The repository.
        repo: Arc<SkillsRepo>,
        /// What changed.
        reply: RpcReplyPort<ReloadSummary>,
    },
    /// Answer once every state change so far is in the store.
    Flush(RpcReplyPort<()>),
}

/// The scheduler actor's configuration.
pub struct SchedulerActor {
    /// Where states are kept.
    pub store: Arc<dyn ScheduleStore>,
    /// What runs a fire.
    pub runner: Arc<dyn ScheduleRunner>,
    /// Where `budget.per_day` caps are set (the host's ledger); `None`:
    /// they are not enforced (a warning says so).
    pub ledger: Option<Arc<dyn BudgetLedger>>,
    /// The clock.
    pub clock: SchedulerClock,
}

/// One schedule's live entry.
struct Entry {
    schedule: Schedule,
    hash: String,
    state: ScheduleState,
    running: u32,
    queued: Option<Fire>,
    backlog: VecDeque<Fire>,
}

/// The scheduler's state.
pub struct SchedulerState {
    repo: Arc<SkillsRepo>,
    entries: BTreeMap<String, Entry>,
    /// Next fires, earliest first.
    due: BTreeSet<(Timestamp, String)>,
    /// The armed timer: when it wakes, and its task.
    timer: Option<(Timestamp, JoinHandle<()>)>,
    writes: mpsc::UnboundedSender<Write>,
    writer: JoinHandle<()>,
}

impl Actor for SchedulerActor {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = Arc<SkillsRepo>;

    async fn pre_start(
        &self,
        _: ActorRef<SchedulerMsg>,
        repo: Arc<SkillsRepo>,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        let stored = self.store.load_all().await?;
        let mut stored: BTreeMap<String, ScheduleState> =
            stored.into_iter().map(|s| (s.name.clone(), s)).collect();
        let (writes, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write_behind(self.store.clone(), rx));
        let now = self.clock.now();
        let mut st = SchedulerState {
            repo: repo.clone(),
            entries: BTreeMap::new(),
            due: BTreeSet::new(),
            timer: None,
            writes,
            writer,
        };
        for schedule in &repo.schedules {
            let entry = self.entry_at_start(schedule, stored.remove(&schedule.name), now);
            st.insert(entry);
        }
        let gone: Vec<String> = stored.into_keys().collect();
        if !gone.is_empty() {
            let _ = st.writes.send(Write::Remove(gone));
        }
        self.apply_day_caps(&repo, &[]).await;
        Ok(st)
    }

    async fn post_start(
        &self,
        myself: ActorRef<SchedulerMsg>,
        st: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        let names: Vec<String> = st.entries.keys().cloned().collect();
        for name in names {
            self.next_from_backlog(&myself, st, &name);
        }
        self.arm(&myself, st);
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<SchedulerMsg>,
        st: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some((_, t)) = st.timer.take() {
            t.abort();
        }
        // The writer ends once its queue is written (the sender drops
        // with the state).
        let (tx, rx) = oneshot::channel();
        if st.writes.send(Write::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
        st.writer.abort();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<SchedulerMsg>,
        msg: SchedulerMsg,
        st: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SchedulerMsg::Tick => {
                st.timer = None;
                self.fire_due(&myself, st);
            }
            SchedulerMsg::RunEnded { name, hash, report } => {
                self.run_ended(&myself, st, &name, &hash, &report);
            }
            SchedulerMsg::List(reply) => {
                let views = st
                    .entries
                    .values()
                    .map(|e| ScheduleView {
                        schedule: e.schedule.clone(),
                        state: e.state.clone(),
                        running: e.running,
                        queued: e.queued.is_some(),
                        backlog: e.backlog.len(),
                    })
                    .collect();
                let _ = reply.send(views);
            }
            SchedulerMsg::RunNow { name, reply } => {
                let answer = match st.entries.contains_key(&name) {
                    false => Err(st.unknown(&name)),
                    true => {
                        let fire = Fire {
                            schedule: name.clone(),
                            due: self.clock.now(),
                            kind: FireKind::Manual,
                        };
                        Ok(self.fire(&myself, st, fire))
                    }
                };
                let _ = reply.send(answer);
            }
            SchedulerMsg::Pause { name, why, reply } => {
                let now = to_ms(self.clock.now());
                let answer = st.update(&name, |s| {
                    s.paused = Some(Pause {
                        why,
                        at_ms: now,
                        auto: false,
                    });
                });
                let _ = reply.send(answer);
            }
            SchedulerMsg::Resume { name, reply } => {
                let answer = st.update(&name, |s| {
                    s.paused = None;
                    s.streak = 0;
                    s.streak_reason = None;
                });
                let _ = reply.send(answer);
            }
            SchedulerMsg::Reload { repo, reply } => {
                let previous = st.repo.clone();
                let summary = self.reload(st, repo.clone());
                self.apply_day_caps(&repo, &previous.schedules).await;
                self.arm(&myself, st);
                let _ = reply.send(summary);
            }
            SchedulerMsg::Flush(reply) => {
                let (tx, rx) = oneshot::channel();
                if st.writes.send(Write::Flush(tx)).is_ok() {
                    // Waits off the actor: the writer answers the caller.
                    tokio::spawn(async move {
                        let _ = rx.await;
                        let _ = reply.send(());
                    });
                } else {
                    let _ = reply.send(());
                }
            }
        }
        Ok(())
    }
}

impl SchedulerState {
    fn insert(&mut self, entry: Entry) {
        if let Some(ms) = entry.state.next_fire_ms {
            self.due.insert((from_ms(ms), entry.schedule.name.clone()));
        }
        let _ = self.writes.send(Write::Put(Box::new(entry.state.clone())));
        self.entries.insert(entry.schedule.name.clone(), entry);
    }

    fn unknown(&self, name: &str) -> UnknownSchedule {
        UnknownSchedule {
            name: name.to_string(),
            known: self.entries.keys().cloned().collect::<Vec<_>>().join(", "),
        }
    }

    fn save(&self, name: &str) {
        if let Some(e) = self.entries.get(name) {
            let _ = self.writes.send(Write::Put(Box::new(e.state.clone())));
        }
    }

    fn update(
        &mut self,
        name: &str,
        change: impl FnOnce(&mut ScheduleState),
    ) -> Result<ScheduleState, UnknownSchedule> {
        let Some(e) = self.entries.get_mut(name) else {
            return Err(self.unknown(name));
        };
        change(&mut e.state);
        let out = e.state.clone();
        self.save(name);
        Ok(out)
    }
}

impl SchedulerActor {
    /// A schedule's entry when the scheduler starts: its stored state
    /// (reset if the schedule changed), its missed fires per `missed`.
    fn entry_at_start(
        &self,
        schedule: &Schedule,
        stored: Option<ScheduleState>,
        now: Timestamp,
    ) -> Entry {
        let hash = rules::config_hash(schedule);
        let mut backlog = VecDeque::new();
        let state = match stored {
            None => ScheduleState {
                name: schedule.name.clone(),
                config_hash: hash.clone(),
                ..ScheduleState::default()
            },
            Some(mut s) => {
                if s.config_hash != hash {
                    rules::changed(&mut s, hash.clone());
                }
                if let Some(next) = s.next_fire_ms.map(from_ms) {
                    for due in rules::missed_fires(schedule, next, now) {
                        backlog.push_back(Fire {
                            schedule: schedule.name.clone(),
                            due,
                            kind: FireKind::CatchUp,
                        });
                    }
                }
                s
            }
        };
        let mut state = state;
        state.next_fire_ms = schedule.next_fire(now).map(to_ms);
        state.updated_at_ms = to_ms(now);
        Entry {
            schedule: schedule.clone(),
            hash,
            state,
            running: 0,
            queued: None,
            backlog,
        }
    }

    /// Arms the one timer for the earliest next fire (if it is not armed
    /// for it already).
    fn arm(&self, myself: &ActorRef<SchedulerMsg>, st: &mut SchedulerState) {
        let Some((next, _)) = st.due.first() else {
            if let Some((_, t)) = st.timer.take() {
                t.abort();
            }
            return;
        };
        let next = *next;
        if st.timer.as_ref().is_some_and(|(at, _)| *at == next) {
            return;
        }
        if let Some((_, t)) = st.timer.take() {
            t.abort();
        }
        let wait = next
            .duration_since(self.clock.now())
            .max(SignedDuration::ZERO);
        let wait = Duration::try_from(wait).unwrap_or(MAX_SLEEP).min(MAX_SLEEP);
        let me = myself.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = me.cast(SchedulerMsg::Tick);
        });
        st.timer = Some((next, task));
    }

    /// Fires every schedule that is due, sets each one's next fire, and
    /// re-arms the timer.
    fn fire_due(&self, myself: &ActorRef<SchedulerMsg>, st: &mut SchedulerState) {
        let now = self.clock.now();
        while let Some((at, name)) = st.due.first().cloned() {
            if at > now {
                break;
            }
            st.due.pop_first();
            let Some(e) = st.entries.get_mut(&name) else {
                continue;
            };
            let next = e.schedule.next_fire(now.max(at));
            e.state.next_fire_ms = next.map(to_ms);
            e.state.updated_at_ms = to_ms(now);
            if let Some(n) = next {
                st.due.insert((n, name.clone()));
            }
            if e.state.paused.is_some() {
                st.save(&name);
                continue;
            }
            let fire = Fire {
                schedule: name.clone(),
                due: at,
                kind: FireKind::Cron,
            };
            self.fire(myself, st, fire);
        }
        self.arm(myself, st);
    }

    /// Fires one schedule, under its `overlap` policy.
    fn fire(
        &self,
        myself: &ActorRef<SchedulerMsg>,
        st: &mut SchedulerState,
        fire: Fire,
    ) -> FireAnswer {
        let now = self.clock.now();
        let name = fire.schedule.clone();
        let Some(e) = st.entries.get_mut(&name) else {
            return FireAnswer::Skipped("unknown schedule".into());
        };
        let mut cancel = false;
        if e.running > 0 {
            match e.schedule.settings.overlap.unwrap_or_default() {
                Overlap::Skip => {
                    let why = "overlap: the previous run is still going".to_string();
                    rules::skipped(&mut e.state, why.clone(), now);
                    st.save(&name);
                    return FireAnswer::Skipped(why);
                }
                Overlap::QueueOne => {
                    if e.queued.is_some() {
                        let why = "overlap: a fire is already queued".to_string();
                        rules::skipped(&mut e.state, why.clone(), now);
                        st.save(&name);
                        return FireAnswer::Skipped(why);
                    }
                    e.queued = Some(fire);
                    return FireAnswer::Queued;
                }
                Overlap::CancelPrevious => cancel = true,
                Overlap::Allow => {}
            }
        }
        self.start(myself, st, fire, cancel);
        FireAnswer::Started
    }

    /// Starts a run of `fire` as a task (after cancelling the schedule's
    /// runs in flight when `cancel`).
    fn start(
        &self,
        myself: &ActorRef<SchedulerMsg>,
        st: &mut SchedulerState,
        fire: Fire,
        cancel: bool,
    ) {
        let now = self.clock.now();
        let name = fire.schedule.clone();
        let Some(e) = st.entries.get_mut(&name) else {
            return;
        };
        e.running += 1;
        e.state.last_fire_ms = Some(to_ms(now));
        e.state.updated_at_ms = to_ms(now);
        let hash = e.hash.clone();
        st.save(&name);
        let runner = self.runner.clone();
        let repo = st.repo.clone();
        let me = myself.clone();
        tokio::spawn(async move {
            if cancel {
                runner.cancel(&fire.schedule).await;
            }
            let name = fire.schedule.clone();
            let report = runner.run(repo, fire).await;
            let _ = me.cast(SchedulerMsg::RunEnded { name, hash, report });
        });
    }

    /// A run's report: the state, then the next fire waiting (a missed
    /// one, then a queued one).
    fn run_ended(
        &self,
        myself: &ActorRef<SchedulerMsg>,
        st: &mut SchedulerState,
        name: &str,
        hash: &str,
        report: &RunReport,
    ) {
        let now = self.clock.now();
        let Some(e) = st.entries.get_mut(name) else {
            return;
        };
        e.running = e.running.saturating_sub(1);
        let paused = rules::apply_report(&e.schedule, &mut e.state, report, e.hash == hash, now);
        e.state.updated_at_ms = to_ms(now);
        if paused {
            tracing::warn!(
                schedule = %name,
                why = e.state.paused.as_ref().map(|p| p.why.as_str()).unwrap_or(""),
                "schedule paused"
            );
        }
        if let RunOutcome::OverBudget(why) = &report.outcome {
            tracing::info!(schedule = %name, %why, "schedule skipped: its daily budget is spent");
        }
        st.save(name);
        self.next_from_backlog(myself, st, name);
    }

    /// Starts the schedule's next waiting fire, if it has one and no run
    /// in flight: a missed fire first, then a queued one. A paused
    /// schedule's waiting fires are dropped.
    fn next_from_backlog(
        &self,
        myself: &ActorRef<SchedulerMsg>,
        st: &mut SchedulerState,
        name: &str,
    ) {
        let Some(e) = st.entries.get_mut(name) else {
            return;
        };
        if e.running > 0 {
            return;
        }
        // A schedule paused meanwhile drops its waiting fires (an
        // operator's own `run` excepted).
        let paused = e.state.paused.is_some();
        if paused {
            e.backlog.clear();
        }
        let queued = e
            .queued
            .take()
            .filter(|f| !paused || f.kind == FireKind::Manual);
        let next = match e.backlog.pop_front() {
            Some(f) => {
                e.queued = queued;
                Some(f)
            }
            None => queued,
        };
        if let Some(f) = next {
            self.start(myself, st, f, false);
        }
    }

    /// Replaces the repository: new schedules start fresh, removed ones are
    /// forgotten, changed ones have their streak reset and their next fire
    /// computed again.
    fn reload(&self, st: &mut SchedulerState, repo: Arc<SkillsRepo>) -> ReloadSummary {
        let now = self.clock.now();
        let mut summary = ReloadSummary::default();
        let mut old = std::mem::take(&mut st.entries);
        st.due.clear();
        st.repo = repo.clone();
        for schedule in &repo.schedules {
            let hash = rules::config_hash(schedule);
            let entry = match old.remove(&schedule.name) {
                Some(mut e) if e.hash == hash => {
                    summary.unchanged.push(schedule.name.clone());
                    e.schedule = schedule.clone();
                    e
                }
                Some(mut e) => {
                    summary.changed.push(schedule.name.clone());
                    rules::changed(&mut e.state, hash.clone());
                    e.hash = hash;
                    e.schedule = schedule.clone();
                    e.state.next_fire_ms = schedule.next_fire(now).map(to_ms);
                    e.state.updated_at_ms = to_ms(now);
                    e
                }
                None => {
                    summary.added.push(schedule.name.clone());
                    self.entry_at_start(schedule, None, now)
                }
            };
            st.insert(entry);
        }
        summary.removed = old.into_keys().collect();
        if !summary.removed.is_empty() {
            let _ = st.writes.send(Write::Remove(summary.removed.clone()));
        }
        summary
    }

    /// Sets the ledger limits of every schedule's caller from its
    /// `budget.per_day` (a rolling 24 h window); lifts the ones of
    /// `previous` schedules that no longer have a cap.
    async fn apply_day_caps(&self, repo: &SkillsRepo, previous: &[Schedule]) {
        let Some(ledger) = &self.ledger else {
            if repo
                .schedules
                .iter()
                .any(|s| s.settings.budget.and_then(|b| b.per_day).is_some())
            {
                tracing::warn!(
                    "budget.per_day is not enforced: the scheduler has no budget ledger"
                );
            }
            return;
        };
        let mut changed = false;
        let capped: BTreeSet<&str> = repo
            .schedules
            .iter()
            .filter(|s| s.settings.budget.and_then(|b| b.per_day).is_some())
            .map(|s| s.name.as_str())
            .collect();
        for s in &repo.schedules {
            let Some(cap) = s.settings.budget.and_then(|b| b.per_day) else {
                continue;
            };
            let limits = BudgetLimits {
                tokens: cap.tokens,
                cost_micros: cap.cost.map(|c| (c * 1e6).round().max(0.0) as u64),
                window_secs: Some(DAY_WINDOW_SECS),
                ..BudgetLimits::default()
            };
            let caller = schedule_caller(&s.name);
            match ledger.set_limits(&caller, limits).await {
                Ok(()) => changed = true,
                Err(e) => {
                    tracing::warn!(schedule = %s.name, error = %e, "cannot set the daily budget")
                }
            }
        }
        for s in previous {
            let had = s.settings.budget.and_then(|b| b.per_day).is_some();
            if had && !capped.contains(s.name.as_str()) {
                let caller = schedule_caller(&s.name);
                if ledger
                    .set_limits(&caller, BudgetLimits::default())
                    .await
                    .is_ok()
                {
                    changed = true;
                }
            }
        }
        if changed {
            self.runner.budgets_changed().await;
        }
    }
}
