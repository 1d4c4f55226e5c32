//! One run of a scheduled skill, now: the schedule's run built from its
//! skill ([`SkillsRepo::plan`]), submitted to the host like any run (the
//! host's admission, budgets, critic and audit apply unchanged: this module
//! adds no check of its own), and its answer read into memory and outputs
//! ([`parse_answer`]).
//!
//! What is built is the dry run: it stops after the model and the
//! parsing. Publishing (the outbox), the git writeback and the scheduler
//! loop are not built yet; a dry run's result says so with `publish: []`
//! and `writeback_sha: null`.
//!
//! # Phases
//!
//! A run goes `boot` (the repository is read) → `secrets` (the `env`'s
//! secrets are read) → `exec` (the agent run); a phase that fails adds
//! `fail` with the phase it failed in as `prev`. Each is in the result's
//! `phases`, with its time.
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

use serde::{Deserialize, Serialize};

use crate::host::Host;
use crate::ports::run::{unix_ms, KillReason, RunId, RunStatus, RunUsage};
use crate::skills::{parse_answer, PlanError, SkillsRepo};

/// How a skill run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The run ended `ok` (and, once built, every publish and the
    /// writeback landed).
    Succeeded,
    /// The run ended `ok` but a publish or the writeback failed (not
    /// produced until those are built).
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
    /// Publishing (not built yet).
    Publish,
    /// The git writeback (not built yet).
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
    /// The agent run's id, once it was submitted.
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
    /// Each destination's publish result (empty: a dry run publishes
    /// nothing).
    pub publish: Vec<serde_json::Value>,
    /// The writeback's commit (none in a dry run).
    pub writeback_sha: Option<String>,
    /// The phases, in order.
    pub phases: Vec<PhaseEvent>,
}

/// Runs schedule `schedule` of `repo` once on `host`, as a dry run (see
/// the module doc), reading secrets through `lookup` (`std::env::var`
/// outside tests). An unknown schedule is an error; everything else that
/// goes wrong is in the result (`outcome: failed`).
pub async fn dry_run(
    host: &Host,
    repo: &SkillsRepo,
    schedule: &str,
    lookup: impl Fn(&str) -> Option<String>,
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
        dry_run: true,
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
    let plan = match repo.plan(schedule, lookup) {
        Ok(p) => p,
        Err(e @ PlanError::UnknownSchedule { .. }) => return Err(e),
        Err(e) => {
            phases.push(event(Phase::Fail, Some(Phase::Secrets)));
            result.error_kind = Some(e.kind().to_string());
            result.error = Some(e.to_string());
            result.phases = phases;
            return Ok(result);
        }
    };
    phases.push(event(Phase::Exec, None));
    let secrets: Vec<String> = plan.env.secrets.values().cloned().collect();
    let run = match host.submit(plan.spec.clone(), plan.invocation).await {
        Ok(handle) => handle.await,
        Err(e) => {
            phases.push(event(Phase::Fail, Some(Phase::Exec)));
            result.error_kind = Some("submit".into());
            result.error = Some(crate::secrets::redact_string(e.to_string()));
            result.phases = phases;
            return Ok(result);
        }
    };
    result.run_id = Some(run.run_id);
    result.status = Some(run.status);
    result.kill_reason = run.kill_reason;
    result.error_kind = run.error_kind.clone();
    result.error = run.error.clone();
    result.usage = run.usage;
    result.cost_micros = run.cost_micros;
    if let Some(text) = &run.output {
        let answer = parse_answer(&scrub(text, &secrets));
        result.output = Some(answer.output);
        result.outputs = answer.outputs;
        result.memory = answer.memory;
    }
    if run.status == RunStatus::Ok {
        result.outcome = Outcome::Succeeded;
    } else {
        phases.push(event(Phase::Fail, Some(Phase::Exec)));
    }
    result.phases = phases;
    Ok(result)
}

/// `text` with every secret the process knows, and this run's own
/// (whatever their length), replaced by `[REDACTED]`: the model never had
/// them, but an answer that holds one anyway is never published or
/// written back with it.
fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = crate::secrets::redact(text).into_owned();
    for s in secrets {
        if !s.is_empty() && out.contains(s.as_str()) {
            out = out.replace(s.as_str(), crate::secrets::REDACTED);
        }
    }
    out
}

fn event(phase: Phase, prev: Option<Phase>) -> PhaseEvent {
    PhaseEvent {
        phase,
        prev,
        at_ms: unix_ms(),
    }
}
