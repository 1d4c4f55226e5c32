//! One run of a scheduled skill, now ([`run`]): the schedule's run built
//! from its skill ([`SkillsRepo::plan`]), submitted to the host like any
//! run (the host's admission, budgets, deadlines, critic and audit apply
//! unchanged: this module adds no check of its own), its answer read into
//! memory and outputs ([`parse_answer`]), its publishes delivered and
//! waited for, and its memory written back.
//!
//! # Publishing
//!
//! The run does not publish as a side effect: its destinations go with
//! its invocation as a publish plan ([`SkillPublishPlan`]), whose intents
//! are recorded with the run's terminal record (the outbox; see
//! [`crate::ports::outbox`]). Once the run's result is in, this asks the
//! host's publisher to deliver them ([`Host::publish`]) and waits for each
//! outcome (every destination tried at most 3 times within the
//! schedule's `publish_timeout`). What a crash leaves owed is delivered by
//! the next host that opens the store.
//!
//! A run that fails before its agent run starts (a missing secret, a
//! submission refused) publishes too, through the same outbox: its
//! failure is recorded as a run that ended `error` (one terminal record,
//! its intents with it: [`Host::record_unstarted`]) and its `on_failure`
//! and `always` destinations get the failure text. A dry run records
//! nothing.
//!
//! # Writeback
//!
//! The memory is written back by a [`MemoryWriteback`] given in
//! [`RunOptions::writeback`] (the git writeback); without one the phase is
//! skipped and `writeback_sha` is `null`.
//!
//! # Phases
//!
//! A run goes `boot` (the repository is read) → `secrets` (the `env`'s
//! secrets are read) → `exec` (the agent run) → `publish` (when the
//! schedule has destinations) → `writeback` (when a writeback is given,
//! the schedule writes back and the run left a memory); a phase that
//! fails adds `fail` with the phase it failed in as `prev` (after a
//! failed publish the writeback still runs: a memory is not lost to a
//! webhook's outage). Each is in the result's `phases`, with its time.
//! `--dry-run` stops after `exec`.
//!
//! # Secrets
//!
//! The model sees `K=[secret]`, never a secret's value; the values are
//! registered for redaction (`crate::secrets`), so a run's output, events
//! and records have them replaced should they appear anyway. The answer
//! is read with every secret value replaced by `[REDACTED]` (this run's
//! own, whatever their length), so the result — output, outputs, memory —
//! holds none.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::host::Host;
use crate::ports::outbox::{DeliveryReport, DeliveryState, PublishHook};
use crate::ports::run::{unix_ms, KillReason, RunId, RunStatus, RunUsage};
use crate::skills::{parse_answer, scrub, PlanError, Schedule, SkillPublishPlan, SkillsRepo};

/// How a skill run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The run ended `ok`, every publish due was delivered and the
    /// writeback (if any) landed.
    Succeeded,
    /// The run ended `ok` but a publish or the writeback failed.
    PartialFailure,
    /// The run did not end `ok`, or could not start.
    Failed,
}

/// The phases of a skill run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The repository was read and the run built.
    Boot,
    /// The secrets were read.
    Secrets,
    /// The agent run.
    Exec,
    /// Publishing: the run's intents delivered and waited for.
    Publish,
    /// The memory written back.
    Writeback,
    /// The phase `prev` failed.
    Fail,
}

/// One phase event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseEvent {
    /// The phase entered.
    pub phase: Phase,
    /// With `fail`: the phase that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<Phase>,
    /// When (Unix ms).
    pub at_ms: u64,
}

/// The result of a skill run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SkillRunResult {
    /// The schedule.
    pub schedule: String,
    /// The skill.
    pub skill: String,
    /// How it ended.
    pub outcome: Outcome,
    /// Whether it was a dry run (no publish, no writeback).
    pub dry_run: bool,
    /// The agent run's id, once it was submitted; for a run that could not
    /// start but owed publishes, the id its failure was recorded under.
    pub run_id: Option<RunId>,
    /// The agent run's status (none when it could not start).
    pub status: Option<RunStatus>,
    /// Why the run was killed, if it was.
    pub kill_reason: Option<KillReason>,
    /// The error's kind (`missing_secret`, a run's `error_kind`, …).
    pub error_kind: Option<String>,
    /// The error, for people.
    pub error: Option<String>,
    /// Tokens used.
    pub usage: RunUsage,
    /// What they cost, in micro-dollars.
    pub cost_micros: u64,
    /// The answer without its memory and named output blocks.
    pub output: Option<String>,
    /// The named outputs (`<output name="…">`).
    pub outputs: BTreeMap<String, String>,
    /// The last `<memory>` block's text.
    pub memory: Option<String>,
    /// Each destination's publish result, in the schedule's order (empty
    /// in a dry run: it publishes nothing).
    pub publish: Vec<DeliveryReport>,
    /// The writeback's commit (none in a dry run, or without a writeback).
    pub writeback_sha: Option<String>,
    /// The phases, in order.
    pub phases: Vec<PhaseEvent>,
}

/// How a skill run goes.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Stop after the model and the parsing: no publish, no writeback.
    pub dry_run: bool,
    /// Commit the memory but do not push it.
    pub skip_push: bool,
    /// Writes the memory back (`None`: the `writeback` phase is skipped).
    pub writeback: Option<Arc<dyn MemoryWriteback>>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("dry_run", &self.dry_run)
            .field("skip_push", &self.skip_push)
            .field("writeback", &self.writeback.is_some())
            .finish()
    }
}

/// A writeback that could not land (its text holds no secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WritebackError(pub String);

/// Writes a run's memory back into its repository (the git writeback).
#[async_trait]
pub trait MemoryWriteback: Send + Sync + 'static {
    /// Writes `memory` of run `run_id` of `schedule` back into `repo` (as
    /// its `writeback:` says), pushing unless `skip_push`; answers the
    /// commit's id, or `None` when there was nothing to commit.
    async fn write_back(
        &self,
        repo: &SkillsRepo,
        schedule: &Schedule,
        run_id: RunId,
        memory: &str,
        skip_push: bool,
    ) -> Result<Option<String>, WritebackError>;
}

/// How long to wait for a run's publishes past their timeout (claims,
/// reads and the outcome's write).
const PUBLISH_WAIT_SLACK: Duration = Duration::from_secs(15);

/// Runs schedule `schedule` of `repo` once on `host`, as a dry run (see
/// [`run`] with `dry_run`).
pub async fn dry_run(
    host: &Host,
    repo: &SkillsRepo,
    schedule: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<SkillRunResult, PlanError> {
    let options = RunOptions {
        dry_run: true,
        ..RunOptions::default()
    };
    run(host, repo, schedule, lookup, &options).await
}

/// Runs schedule `schedule` of `repo` once on `host` (see the module
/// doc), reading secrets through `lookup` (`std::env::var` outside
/// tests). An unknown schedule is an error; everything else that goes
/// wrong is in the result (`outcome: failed` or `partial_failure`).
pub async fn run(
    host: &Host,
    repo: &SkillsRepo,
    schedule: &str,
    lookup: impl Fn(&str) -> Option<String>,
    options: &RunOptions,
) -> Result<SkillRunResult, PlanError> {
    let skill = repo
        .schedule(schedule)
        .map(|s| s.skill.clone())
        .unwrap_or_default();
    let mut phases = vec![event(Phase::Boot, None)];
    let mut result = SkillRunResult {
        schedule: schedule.to_string(),
        skill,
        outcome: Outcome::Failed,
        dry_run: options.dry_run,
        run_id: None,
        status: None,
        kill_reason: None,
        error_kind: None,
        error: None,
        usage: RunUsage::default(),
        cost_micros: 0,
        output: None,
        outputs: BTreeMap::new(),
        memory: None,
        publish: Vec::new(),
        writeback_sha: None,
        phases: Vec::new(),
    };
    phases.push(event(Phase::Secrets, None));
    let mut plan = match repo.plan(schedule, lookup) {
        Ok(p) => p,
        Err(e @ PlanError::UnknownSchedule { .. }) => return Err(e),
        Err(e) => {
            phases.push(event(Phase::Fail, Some(Phase::Secrets)));
            result.error_kind = Some(e.kind().to_string());
            result.error = Some(e.to_string());
            // No secret was read: the plan renders with none.
            if let (false, Some(p)) = (
                options.dry_run,
                repo.schedule_publish_plan(schedule, Vec::new()),
            ) {
                never_started(host, repo, schedule, &p, &mut result, &mut phases).await;
            }
            result.phases = phases;
            return Ok(result);
        }
    };
    let publish_plan = if options.dry_run {
        None
    } else {
        repo.publish_plan(&plan)
    };
    if let Some(p) = &publish_plan {
        if host.outbox().is_none() {
            phases.push(event(Phase::Fail, Some(Phase::Publish)));
            result.error_kind = Some("no_outbox".into());
            result.error = Some(crate::host::PublishWaitError::NoOutbox.to_string());
            result.phases = phases;
            return Ok(result);
        }
        plan.invocation.publish = PublishHook::new(Arc::new(p.clone()));
    }
    phases.push(event(Phase::Exec, None));
    let secrets: Vec<String> = plan.env.secrets.values().cloned().collect();
    let run = match host.submit(plan.spec.clone(), plan.invocation).await {
        Ok(handle) => handle.await,
        Err(e) => {
            phases.push(event(Phase::Fail, Some(Phase::Exec)));
            result.error_kind = Some("submit".into());
            result.error = Some(scrub(&e.to_string(), &secrets));
            if let Some(p) = &publish_plan {
                never_started(host, repo, schedule, p, &mut result, &mut phases).await;
            }
            result.phases = phases;
            return Ok(result);
        }
    };
    result.run_id = Some(run.run_id);
    result.status = Some(run.status);
    result.kill_reason = run.kill_reason;
    result.error_kind = run.error_kind.clone();
    result.error = run.error.as_deref().map(|e| scrub(e, &secrets));
    result.usage = run.usage;
    result.cost_micros = run.cost_micros;
    if let Some(text) = &run.output {
        let answer = parse_answer(&scrub(text, &secrets));
        result.output = Some(answer.output);
        result.outputs = answer.outputs;
        result.memory = answer.memory;
    }
    let ran_ok = run.status == RunStatus::Ok;
    if !ran_ok {
        phases.push(event(Phase::Fail, Some(Phase::Exec)));
    }
    let mut landed = true;
    if let Some(p) = &publish_plan {
        // A failed run publishes too: its `on_failure` destinations.
        phases.push(event(Phase::Publish, None));
        if !publish(host, run.run_id, p, &mut result).await {
            landed = false;
            phases.push(event(Phase::Fail, Some(Phase::Publish)));
        }
    }
    if let (false, true, Some(wb), Some(memory)) = (
        options.dry_run,
        ran_ok,
        &options.writeback,
        result.memory.clone(),
    ) {
        let writes_back = repo
            .schedule(schedule)
            .and_then(|s| s.settings.writeback.as_ref())
            .is_some_and(|w| w.enabled);
        if let (true, Some(sched)) = (writes_back, repo.schedule(schedule)) {
            phases.push(event(Phase::Writeback, None));
            // The one call site of the writeback.
            match wb
                .write_back(repo, sched, run.run_id, &memory, options.skip_push)
                .await
            {
                Ok(sha) => result.writeback_sha = sha,
                Err(e) => {
                    landed = false;
                    phases.push(event(Phase::Fail, Some(Phase::Writeback)));
                    result.error_kind.get_or_insert_with(|| "writeback".into());
                    result
                        .error
                        .get_or_insert_with(|| crate::secrets::redact_string(e.to_string()));
                }
            }
        }
    }
    result.outcome = match (ran_ok, landed) {
        (true, true) => Outcome::Succeeded,
        (true, false) => Outcome::PartialFailure,
        (false, _) => Outcome::Failed,
    };
    result.phases = phases;
    Ok(result)
}

/// A run that failed before its agent run started (`result` holds why)
/// still owes the publishes of `plan` whose `when` holds for a failure
/// (`on_failure`, `always`): the failure is recorded as a run that ended
/// `error` with the host's [`Host::record_unstarted`] — a terminal record
/// with its intents, the outbox path every ended run takes, the failure
/// text (`run error: …`) as their output — and they are delivered and
/// waited for as a run's. `result.run_id` is then the recorded run's;
/// its `status` stays `null` (no agent run started). Without an outbox
/// nothing can be recorded or published, and nothing is.
async fn never_started(
    host: &Host,
    repo: &SkillsRepo,
    schedule: &str,
    plan: &SkillPublishPlan,
    result: &mut SkillRunResult,
    phases: &mut Vec<PhaseEvent>,
) {
    if host.outbox().is_none() {
        return;
    }
    let agent = repo
        .schedule(schedule)
        .map_or_else(|| result.skill.clone(), |s| s.spec.name.clone());
    let inv = crate::spec::Invocation {
        caller_id: Some(crate::skills::schedule_caller(schedule)),
        publish: PublishHook::new(Arc::new(plan.clone())),
        ..Default::default()
    };
    let kind = result.error_kind.clone().unwrap_or_else(|| "failed".into());
    let error = result.error.clone().unwrap_or_default();
    let recorded = host.record_unstarted(&agent, inv, &kind, error).await;
    result.run_id = Some(recorded.run_id);
    phases.push(event(Phase::Publish, None));
    if !publish(host, recorded.run_id, plan, result).await {
        phases.push(event(Phase::Fail, Some(Phase::Publish)));
    }
}

/// Delivers the run's intents and waits for them; fills `publish`.
/// `false` when one due was not delivered.
async fn publish(
    host: &Host,
    run_id: RunId,
    plan: &SkillPublishPlan,
    result: &mut SkillRunResult,
) -> bool {
    let wait = plan.timeout + PUBLISH_WAIT_SLACK;
    match host.publish(run_id, wait).await {
        Ok(reports) => {
            let all_there = reports.len() == plan.destinations.len();
            let ok = all_there
                && reports
                    .iter()
                    .all(|r| matches!(r.state, DeliveryState::Delivered | DeliveryState::Skipped));
            if !all_there {
                result.error_kind.get_or_insert_with(|| "publish".into());
                result.error.get_or_insert_with(|| {
                    format!(
                        "{} of {} publish intents are on file (the audit store took the run's terminal record into its spool: they are delivered once it reaches the store)",
                        reports.len(),
                        plan.destinations.len()
                    )
                });
            }
            result.publish = reports;
            ok
        }
        Err(e) => {
            result.error_kind.get_or_insert_with(|| "publish".into());
            result.error.get_or_insert_with(|| e.to_string());
            false
        }
    }
}

fn event(phase: Phase, prev: Option<Phase>) -> PhaseEvent {
    PhaseEvent {
        phase,
        prev,
        at_ms: unix_ms(),
    }
}
