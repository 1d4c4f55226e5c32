//! The scheduler of a skills repository, as a library: [`Scheduler`]
//! starts the scheduler actor over a repository, a [`ScheduleStore`] and a
//! [`ScheduleRunner`], and answers its commands (list, run now, pause,
//! resume, reload). [`HostRunner`] is the runner `agentvisor serve
//! --skills` uses: each fire is one run of the schedule through
//! [`crate::skill_run`], on the host, with its admission, budgets, critic
//! and audit.
//!
//! See the scheduler actor's guarantees in docs/skills.md ("The
//! scheduler"): one timer for all schedules, `overlap`, `missed`,
//! `pause_after`, `budget.per_day`, state kept in the store.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};

use crate::actors::scheduler::{SchedulerActor, SchedulerMsg};
use crate::host::Host;
use crate::ports::budget::BudgetLedger;
use crate::ports::run::RunStatus;
use crate::ports::schedule::{ScheduleState, ScheduleStore};
use crate::skill_run::{Outcome, SkillRunResult};
use crate::skills::{PlanError, SkillError, SkillsRepo};

pub use crate::actors::scheduler::rules::{
    config_hash, from_ms, missed_fires, to_ms, Fire, FireKind, RunOutcome, RunReport,
    DEFAULT_CATCH_UP_WINDOW, DEFAULT_MAX_CATCH_UP,
};
pub use crate::actors::scheduler::{
    schedule_caller, FireAnswer, ReloadSummary, ScheduleRunner, ScheduleView, SchedulerClock,
    UnknownSchedule, DAY_WINDOW_SECS,
};

/// How long a command waits for the scheduler's answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the scheduler could not do what it was asked.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// No schedule of that name.
    #[error(transparent)]
    Unknown(#[from] UnknownSchedule),
    /// The repository could not be read or was refused (the schedules
    /// running before go on unchanged).
    #[error(transparent)]
    Repo(#[from] SkillError),
    /// The scheduler could not start (its store could not be read).
    #[error("the scheduler could not start: {0}")]
    Start(String),
    /// The scheduler did not answer (it stopped, or timed out).
    #[error("the scheduler did not answer: {0}")]
    Gone(String),
}

/// What the scheduler needs besides the repository.
pub struct SchedulerConfig {
    /// Where schedule states are kept (the SQLite store keeps them across
    /// restarts).
    pub store: Arc<dyn ScheduleStore>,
    /// What runs a fire ([`HostRunner`]).
    pub runner: Arc<dyn ScheduleRunner>,
    /// The host's budget ledger, where `budget.per_day` caps are set.
    pub ledger: Option<Arc<dyn BudgetLedger>>,
    /// The clock ([`SchedulerClock::System`] outside tests).
    pub clock: SchedulerClock,
}

/// A running scheduler. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    actor: ActorRef<SchedulerMsg>,
    root: Arc<PathBuf>,
}

impl Scheduler {
    /// Starts a scheduler for `repo`: reads the stored states, catches up
    /// missed fires per each schedule's `missed`, and arms its timer.
    pub async fn start(
        repo: SkillsRepo,
        config: SchedulerConfig,
    ) -> Result<Scheduler, SchedulerError> {
        let root = Arc::new(repo.root.clone());
        let actor = SchedulerActor {
            store: config.store,
            runner: config.runner,
            ledger: config.ledger,
            clock: config.clock,
        };
        let (actor, _) = Actor::spawn(None, actor, Arc::new(repo))
            .await
            .map_err(|e| SchedulerError::Start(e.to_string()))?;
        Ok(Scheduler { actor, root })
    }

    async fn ask<T>(
        &self,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> SchedulerMsg,
    ) -> Result<T, SchedulerError>
    where
        T: Send + 'static,
    {
        match self.actor.call(msg, Some(ASK_TIMEOUT)).await {
            Ok(CallResult::Success(v)) => Ok(v),
            Ok(CallResult::Timeout) => Err(SchedulerError::Gone("timed out".into())),
            Ok(CallResult::SenderError) => Err(SchedulerError::Gone("stopped".into())),
            Err(e) => Err(SchedulerError::Gone(e.to_string())),
        }
    }

    /// The schedules, by name.
    pub async fn list(&self) -> Result<Vec<ScheduleView>, SchedulerError> {
        self.ask(SchedulerMsg::List).await
    }

    /// Fires schedule `name` now (its `overlap` applies; a paused schedule
    /// runs too).
    pub async fn run_now(&self, name: &str) -> Result<FireAnswer, SchedulerError> {
        let name = name.to_string();
        Ok(self
            .ask(|reply| SchedulerMsg::RunNow { name, reply })
            .await??)
    }

    /// Pauses schedule `name`, saying why.
    pub async fn pause(&self, name: &str, why: &str) -> Result<ScheduleState, SchedulerError> {
        let (name, why) = (name.to_string(), why.to_string());
        Ok(self
            .ask(|reply| SchedulerMsg::Pause { name, why, reply })
            .await??)
    }

    /// Resumes schedule `name`: clears its pause and its failure streak.
    pub async fn resume(&self, name: &str) -> Result<ScheduleState, SchedulerError> {
        let name = name.to_string();
        Ok(self
            .ask(|reply| SchedulerMsg::Resume { name, reply })
            .await??)
    }

    /// Runs the schedules of `repo` from now on.
    pub async fn reload(&self, repo: SkillsRepo) -> Result<ReloadSummary, SchedulerError> {
        let repo = Arc::new(repo);
        self.ask(|reply| SchedulerMsg::Reload { repo, reply }).await
    }

    /// Reads the repository again from where it was first opened and runs
    /// its schedules; a repository that is refused changes nothing (the
    /// error says why).
    pub async fn reload_from_disk(&self) -> Result<ReloadSummary, SchedulerError> {
        let repo = SkillsRepo::open(self.root.as_path())?;
        self.reload(repo).await
    }

    /// The repository's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Waits until every state change so far is in the store.
    pub async fn flush(&self) -> Result<(), SchedulerError> {
        self.ask(SchedulerMsg::Flush).await
    }

    /// Stops the scheduler once its state is written (runs in flight go
    /// on on the host).
    pub async fn stop(&self) {
        let _ = self.flush().await;
        let _ = self.actor.stop_and_wait(None, Some(ASK_TIMEOUT)).await;
    }
}

/// The runner of `serve --skills`: each fire is one run of the schedule
/// on `host` ([`crate::skill_run::run`]: the run, its publishes, its
/// writeback), secrets read from the environment.
pub struct HostRunner {
    host: Host,
    options: crate::skill_run::RunOptions,
}

impl HostRunner {
    /// A runner over `host`: each fire is a skill run with its publishes
    /// and no writeback (see [`HostRunner::with_writeback`]).
    pub fn new(host: Host) -> Self {
        HostRunner {
            host,
            options: crate::skill_run::RunOptions::default(),
        }
    }

    /// Writes each run's memory back with `writeback` (the git writeback).
    pub fn with_writeback(mut self, writeback: Arc<dyn crate::skill_run::MemoryWriteback>) -> Self {
        self.options.writeback = Some(writeback);
        self
    }
}

#[async_trait]
impl ScheduleRunner for HostRunner {
    async fn run(&self, repo: Arc<SkillsRepo>, fire: Fire) -> RunReport {
        let result = crate::skill_run::run(
            &self.host,
            &repo,
            &fire.schedule,
            |k| std::env::var(k).ok(),
            &self.options,
        )
        .await;
        report_of(&fire.schedule, result)
    }

    async fn cancel(&self, name: &str) {
        let caller = schedule_caller(name);
        for live in self.host.runs() {
            if live.caller_id.as_deref() == Some(caller.as_str()) {
                if let Some(run) = self.host.run(&live.run_id) {
                    run.cancel();
                }
            }
        }
    }

    async fn budgets_changed(&self) {
        self.host.reload_budgets().await;
    }
}

/// How the scheduler counts a skill run's result: its outcome, its typed
/// failure reason (`{status}:{kill_reason}`, else `{status}:{error_kind}`,
/// else the error's kind when the run could not start), a cancel, or the
/// schedule's daily budget (the budget of its caller: admission refused
/// the run, or the run crossed the cap and was stopped).
pub fn report_of(schedule: &str, result: Result<SkillRunResult, PlanError>) -> RunReport {
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            return RunReport {
                run_id: None,
                outcome: RunOutcome::Failed(e.kind().to_string()),
                tokens: 0,
                cost_micros: 0,
            }
        }
    };
    let tokens = r
        .usage
        .own
        .total()
        .saturating_add(r.usage.critic.map_or(0, |c| c.total()));
    let caller = format!("caller `{}`", schedule_caller(schedule));
    let outcome = match (r.outcome, r.status) {
        (Outcome::Succeeded, _) => RunOutcome::Succeeded,
        (Outcome::PartialFailure, _) => RunOutcome::PartialFailure,
        (_, Some(RunStatus::Cancelled)) => RunOutcome::Cancelled,
        (_, Some(RunStatus::BudgetExceeded))
            if r.error.as_deref().is_some_and(|e| e.contains(&caller)) =>
        {
            RunOutcome::OverBudget(format!(
                "budget.per_day: {}",
                r.error.as_deref().unwrap_or("")
            ))
        }
        (_, status) => RunOutcome::Failed(match (status, r.kill_reason, &r.error_kind) {
            (Some(s), Some(k), _) => format!("{s}:{k}"),
            (Some(s), None, Some(kind)) => format!("{s}:{kind}"),
            (Some(s), None, None) => s.to_string(),
            (None, _, Some(kind)) => kind.clone(),
            (None, _, None) => "failed".into(),
        }),
    };
    RunReport {
        run_id: r.run_id.map(|id| id.to_string()),
        outcome,
        tokens,
        cost_micros: r.cost_micros,
    }
}
