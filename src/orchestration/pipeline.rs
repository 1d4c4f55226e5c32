//! Multi-phase pipelines (D4): a manifest's `phases:` run in order, each
//! a run of its own, each phase's prompt filled with the outputs of the
//! phases before it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use agentvisor::{AgentSpec, Host, Invocation};
//! let host = Host::builder().build().await?;
//! let spec = AgentSpec::from_file("examples/agents/essay.yaml")?;
//! let result = host.run_pipeline(spec, Invocation::prompt("tides")).await?;
//! println!("{} {:?} ({} tokens)", result.status, result.output, result.usage.total());
//! # Ok(()) }
//! ```
//!
#![doc = include_str!("../../docs/pipelines.md")]

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::Agent;
use crate::host::{Host, SubmitError};
use crate::ports::audit::{AuditEntry, AuditStoreError};
use crate::ports::event::Event;
use crate::ports::run::{unix_ms, KillReason, RunId, RunResult, RunStatus, Usage};
use crate::spec::{AgentSpec, Invocation, PhaseSpec};

/// How many runs one phase of a durable pipeline may be tried with at most
/// (each run of the pipeline with the same id tries a failed phase again).
pub const MAX_PHASE_ATTEMPTS: u32 = 16;

/// Why a pipeline could not run (nothing ran, unless said otherwise).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The manifest has no `phases`.
    #[error("manifest `{0}` has no phases")]
    NoPhases(String),
    /// A phase's manifest does not prepare on this host (an unknown tool or
    /// model).
    #[error("phase `{phase}`: {source}")]
    Phase {
        /// The phase.
        phase: String,
        /// Why.
        #[source]
        source: SubmitError,
    },
    /// A template names an input the invocation does not bring.
    #[error("phase `{phase}`: its prompt uses `{{{{inputs.{input}}}}}`, but the invocation has no input `{input}`")]
    MissingInput {
        /// The phase.
        phase: String,
        /// The input.
        input: String,
    },
    /// A durable pipeline's phase could not be looked up in the audit log.
    #[error("phase `{phase}`: cannot read its earlier runs: {source}")]
    Store {
        /// The phase.
        phase: String,
        /// The store's error.
        #[source]
        source: AuditStoreError,
    },
    /// A durable pipeline's phase was tried [`MAX_PHASE_ATTEMPTS`] times.
    #[error("phase `{0}` was tried {MAX_PHASE_ATTEMPTS} times already")]
    Attempts(String),
    /// A pipeline started with [`Host::start_pipeline`] ended without a
    /// result (its task panicked, or its runtime shut down).
    #[error("the pipeline stopped without a result: {0}")]
    Stopped(String),
}

/// How many events of a started pipeline wait for its reader, at most (then
/// the pipeline waits for the reader).
const PIPELINE_EVENTS: usize = 1024;

/// What a pipeline run by [`Host::start_pipeline`] is told from outside:
/// where its events go, and whether to stop.
#[derive(Default)]
struct Control {
    events: Option<mpsc::Sender<Event>>,
    cancel: CancellationToken,
}

/// A pipeline running as a task of its own ([`Host::start_pipeline`]).
/// Dropping it cancels the pipeline (the phase in flight ends `cancelled`).
pub struct PipelineRun {
    pipeline_id: RunId,
    events: Option<mpsc::Receiver<Event>>,
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<PipelineResult, PipelineError>>>,
}

impl PipelineRun {
    /// The pipeline's id (its phases' runs are recorded under it).
    pub fn pipeline_id(&self) -> RunId {
        self.pipeline_id
    }

    /// The next event of a phase's run (or of one of its sub-agents), in
    /// order; `None` once the pipeline has ended.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.as_mut()?.recv().await
    }

    /// Stops delivering events (so an unread stream never holds the
    /// pipeline up).
    pub fn ignore_events(&mut self) {
        self.events = None;
    }

    /// Cancels the phase in flight and runs no more phases: the pipeline
    /// ends `cancelled`.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Waits for the pipeline's result.
    pub async fn result(mut self) -> Result<PipelineResult, PipelineError> {
        self.events = None;
        let Some(task) = self.task.take() else {
            return Err(PipelineError::Stopped("its result was taken".into()));
        };
        match task.await {
            Ok(r) => r,
            Err(e) => Err(PipelineError::Stopped(e.to_string())),
        }
    }
}

impl Drop for PipelineRun {
    fn drop(&mut self) {
        if self.task.is_some() {
            self.cancel.cancel();
        }
    }
}

/// What became of one phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseOutcome {
    /// The phase's name.
    pub name: String,
    /// Its run (`None`: it did not run, the pipeline stopped before it).
    pub run_id: Option<RunId>,
    /// Its run's status (`None`: it did not run).
    pub status: Option<RunStatus>,
    /// Why it was killed, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_reason: Option<KillReason>,
    /// Its error kind, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    /// Its output (partial output when it failed).
    pub output: Option<String>,
    /// Whether it is optional.
    pub optional: bool,
    /// Taken from an earlier run of the pipeline (durable), not run now.
    pub resumed: bool,
    /// Its usage.
    pub usage: Usage,
    /// Its cost in micro-dollars.
    pub cost_micros: u64,
}

/// A pipeline's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineResult {
    /// The pipeline's id (its phases' ids derive from it when durable).
    pub pipeline_id: RunId,
    /// The manifest's name.
    pub agent: String,
    /// `ok` when every phase that is not optional ended `ok`; else the
    /// status of the phase that stopped it.
    pub status: RunStatus,
    /// The phase that stopped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_phase: Option<String>,
    /// That phase's kill reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_reason: Option<KillReason>,
    /// That phase's error kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    /// That phase's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last `ok` phase's output.
    pub output: Option<String>,
    /// Every phase, in order.
    pub phases: Vec<PhaseOutcome>,
    /// Usage summed over the phases.
    pub usage: Usage,
    /// Cost summed over the phases, in micro-dollars.
    pub cost_micros: u64,
    /// Unix ms when it started.
    pub started_at: u64,
    /// Unix ms when it ended.
    pub finished_at: u64,
}

impl Host {
    /// Runs a pipeline manifest's phases in order (see the module doc). An
    /// `Err` is a pipeline that could not start: a phase that does not
    /// prepare on this host, a missing input, an unreadable audit log.
    pub async fn run_pipeline(
        &self,
        spec: impl Into<Arc<AgentSpec>>,
        invocation: Invocation,
    ) -> Result<PipelineResult, PipelineError> {
        self.pipeline(spec.into(), invocation, &Control::default())
            .await
    }

    /// Starts a pipeline as a task of its own: its events as they happen,
    /// a way to cancel it, and its result (see [`PipelineRun`]). Its id is
    /// the invocation's `run_id`, or a new one.
    pub fn start_pipeline(
        &self,
        spec: impl Into<Arc<AgentSpec>>,
        mut invocation: Invocation,
    ) -> PipelineRun {
        let spec: Arc<AgentSpec> = spec.into();
        let pipeline_id = *invocation.run_id.get_or_insert_with(RunId::new);
        let (tx, rx) = mpsc::channel(PIPELINE_EVENTS);
        let control = Control {
            events: Some(tx),
            cancel: CancellationToken::new(),
        };
        let cancel = control.cancel.clone();
        let host = self.clone();
        let task = tokio::spawn(async move { host.pipeline(spec, invocation, &control).await });
        PipelineRun {
            pipeline_id,
            events: Some(rx),
            cancel,
            task: Some(task),
        }
    }

    async fn pipeline(
        &self,
        spec: Arc<AgentSpec>,
        invocation: Invocation,
        control: &Control,
    ) -> Result<PipelineResult, PipelineError> {
        if spec.phases.is_empty() {
            return Err(PipelineError::NoPhases(spec.name.clone()));
        }
        let mut agents = Vec::with_capacity(spec.phases.len());
        for p in &spec.phases {
            let agent = self
                .prepare(spec.phase_manifest(p))
                .await
                .map_err(|source| PipelineError::Phase {
                    phase: p.name.clone(),
                    source,
                })?;
            for input in input_references(&p.prompt) {
                if !invocation.inputs.contains_key(input) {
                    return Err(PipelineError::MissingInput {
                        phase: p.name.clone(),
                        input: input.to_string(),
                    });
                }
            }
            agents.push(agent);
        }
        let pipeline_id = invocation.run_id.unwrap_or_default();
        let durable = spec.durable || self.config().durable_default;
        let mut out = PipelineResult {
            pipeline_id,
            agent: spec.name.clone(),
            status: RunStatus::Ok,
            failed_phase: None,
            kill_reason: None,
            error_kind: None,
            error: None,
            output: None,
            phases: Vec::with_capacity(spec.phases.len()),
            usage: Usage::default(),
            cost_micros: 0,
            started_at: unix_ms(),
            finished_at: 0,
        };
        let mut outputs: BTreeMap<&str, String> = BTreeMap::new();
        for (index, (phase, agent)) in spec.phases.iter().zip(agents).enumerate() {
            if out.status == RunStatus::Ok && control.cancel.is_cancelled() {
                // Cancelled between phases: the rest do not run.
                out.status = RunStatus::Cancelled;
                out.failed_phase = Some(phase.name.clone());
                out.error_kind = Some("cancelled".into());
                out.error = Some("the pipeline was cancelled".into());
            }
            if out.status != RunStatus::Ok {
                out.phases.push(PhaseOutcome::not_run(phase));
                continue;
            }
            let prompt = fill(&phase.prompt, &invocation, &outputs);
            let (result, resumed) = if durable {
                self.durable_phase(
                    pipeline_id,
                    index,
                    phase,
                    agent,
                    &invocation,
                    prompt,
                    control,
                )
                .await?
            } else {
                let inv = phase_invocation(&invocation, pipeline_id, RunId::new(), prompt);
                (
                    self.run_phase(agent, inv, control)
                        .await
                        .map_err(|source| PipelineError::Phase {
                            phase: phase.name.clone(),
                            source,
                        })?,
                    false,
                )
            };
            out.usage.add(&result.usage);
            out.cost_micros += result.cost_micros;
            if result.status == RunStatus::Ok {
                let text = result.output.clone().unwrap_or_default();
                out.output = Some(text.clone());
                outputs.insert(phase.name.as_str(), text);
            } else if phase.optional && result.status != RunStatus::Cancelled {
                outputs.insert(phase.name.as_str(), String::new());
            } else {
                out.status = result.status;
                out.failed_phase = Some(phase.name.clone());
                out.kill_reason = result.kill_reason;
                out.error_kind = result.error_kind.clone();
                out.error = result.error.clone();
            }
            out.phases.push(PhaseOutcome {
                name: phase.name.clone(),
                run_id: Some(result.run_id),
                status: Some(result.status),
                kill_reason: result.kill_reason,
                error_kind: result.error_kind,
                output: result.output,
                optional: phase.optional,
                resumed,
                usage: result.usage.own,
                cost_micros: result.cost_micros,
            });
        }
        out.finished_at = unix_ms().max(out.started_at);
        Ok(out)
    }

    /// Runs one phase's run: its events to the pipeline's reader, if it
    /// has one; cancelled when the pipeline is.
    async fn run_phase(
        &self,
        agent: Agent,
        inv: Invocation,
        control: &Control,
    ) -> Result<RunResult, SubmitError> {
        let (mut handle, mut events) = match &control.events {
            Some(_) => {
                let (h, e) = self.submit_streaming(agent, inv).await?;
                (h, Some(e))
            }
            None => (self.submit(agent, inv).await?, None),
        };
        let mut cancelled = false;
        if let (Some(events), Some(tx)) = (events.as_mut(), &control.events) {
            // Until the run's stream ends (with the run).
            loop {
                tokio::select! {
                    ev = events.next() => match ev {
                        // A reader that has gone away is no reason to stop.
                        Some(ev) => { let _ = tx.send(ev).await; }
                        None => break,
                    },
                    _ = control.cancel.cancelled(), if !cancelled => {
                        cancelled = true;
                        handle.cancel();
                    }
                }
            }
            return Ok(handle.await);
        }
        tokio::select! {
            r = &mut handle => Ok(r),
            _ = control.cancel.cancelled() => {
                handle.cancel();
                Ok(handle.await)
            }
        }
    }

    /// Runs (or finds) a durable pipeline's phase: an attempt on record
    /// `ok` is taken as it is, one in flight is waited for, and otherwise
    /// the phase runs with the first attempt id not on record.
    #[allow(clippy::too_many_arguments)]
    async fn durable_phase(
        &self,
        pipeline: RunId,
        index: usize,
        phase: &PhaseSpec,
        agent: Agent,
        invocation: &Invocation,
        prompt: String,
        control: &Control,
    ) -> Result<(RunResult, bool), PipelineError> {
        let store_error = |source| PipelineError::Store {
            phase: phase.name.clone(),
            source,
        };
        for attempt in 0..MAX_PHASE_ATTEMPTS {
            let run_id = phase_run_id(pipeline, index, attempt);
            if let Some(run) = self.run(&run_id) {
                let result = run.result().await;
                if result.status == RunStatus::Ok {
                    return Ok((result, true));
                }
                continue;
            }
            let records = self
                .audit_store()
                .run_records(run_id)
                .await
                .map_err(store_error)?;
            if records.is_empty() {
                let inv = phase_invocation(invocation, pipeline, run_id, prompt);
                let result = self
                    .run_phase(agent, inv, control)
                    .await
                    .map_err(|source| PipelineError::Phase {
                        phase: phase.name.clone(),
                        source,
                    })?;
                return Ok((result, false));
            }
            let ended_ok = records.iter().rev().find_map(|r| match &r.entry {
                AuditEntry::Terminal(res) if res.status == RunStatus::Ok => Some(res.clone()),
                _ => None,
            });
            if let Some(result) = ended_ok {
                return Ok((RunResult::clone(&result), true));
            }
        }
        Err(PipelineError::Attempts(phase.name.clone()))
    }
}

impl PhaseOutcome {
    fn not_run(phase: &PhaseSpec) -> Self {
        PhaseOutcome {
            name: phase.name.clone(),
            run_id: None,
            status: None,
            kill_reason: None,
            error_kind: None,
            output: None,
            optional: phase.optional,
            resumed: false,
            usage: Usage::default(),
            cost_micros: 0,
        }
    }
}

/// A phase's invocation: the pipeline's caller, channel, session, inputs
/// and limit overrides, with the phase's run id and filled prompt, in the
/// pipeline's tree.
fn phase_invocation(
    base: &Invocation,
    pipeline: RunId,
    run_id: RunId,
    prompt: String,
) -> Invocation {
    Invocation {
        run_id: Some(run_id),
        root_run_id: Some(pipeline),
        caller_id: base.caller_id.clone(),
        channel_id: base.channel_id.clone(),
        session_id: base.session_id.clone(),
        inputs: base.inputs.clone(),
        prompt,
        attachments: base.attachments.clone(),
        limits: base.limits,
        ..Default::default()
    }
}

/// The id of a durable pipeline's phase run: the pipeline id's time and
/// salt bits (so it sorts with its pipeline), and 48 bits mixed from the
/// pipeline id, the phase's place and the attempt. The same on every host
/// and process: a resumed pipeline finds its phases' runs by it.
pub fn phase_run_id(pipeline: RunId, index: usize, attempt: u32) -> RunId {
    const LOW: u128 = 0xFFFF_FFFF_FFFF;
    let mut x = (pipeline.0 as u64) ^ ((pipeline.0 >> 64) as u64).rotate_left(17);
    x ^= (index as u64)
        .wrapping_add(1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= u64::from(attempt).wrapping_add(1).rotate_left(32);
    // splitmix64's finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    RunId((pipeline.0 & !LOW) | (u128::from(x) & LOW))
}

/// The `{{inputs.NAME}}` a template names.
fn input_references(template: &str) -> Vec<&str> {
    placeholders(template)
        .filter_map(|p| p.strip_prefix("inputs."))
        .collect()
}

/// The trimmed insides of a template's `{{…}}`.
fn placeholders(template: &str) -> impl Iterator<Item = &str> {
    let mut rest = template;
    std::iter::from_fn(move || {
        let start = rest.find("{{")?;
        let after = &rest[start + 2..];
        let end = after.find("}}")?;
        rest = &after[end + 2..];
        Some(after[..end].trim())
    })
}

/// Fills a phase's prompt: `{{prompt}}`, `{{inputs.NAME}}` (strings as
/// they are, other JSON compact) and `{{phases.NAME.output}}`. Anything
/// else between braces is left as written.
fn fill(template: &str, inv: &Invocation, outputs: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        out.push_str(&rest[..start]);
        let inner = after[..end].trim();
        let value = if inner == "prompt" {
            Some(inv.prompt.clone())
        } else if let Some(name) = inner.strip_prefix("inputs.") {
            inv.inputs.get(name).map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        } else {
            inner
                .strip_prefix("phases.")
                .and_then(|r| r.strip_suffix(".output"))
                .and_then(|name| outputs.get(name).cloned())
        };
        match value {
            Some(v) => out.push_str(&v),
            None => out.push_str(&rest[start..start + 2 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled() {
        let mut inv = Invocation::prompt("tides");
        inv.inputs.insert("n".into(), serde_json::json!(3));
        inv.inputs.insert("who".into(), serde_json::json!("Ada"));
        let mut outputs = BTreeMap::new();
        outputs.insert("outline", "A, B".to_string());
        let got = fill(
            "On {{prompt}} for {{ inputs.who }} in {{inputs.n}} parts: {{phases.outline.output}} {{other}}",
            &inv,
            &outputs,
        );
        assert_eq!(got, "On tides for Ada in 3 parts: A, B {{other}}");
        assert_eq!(fill("no braces {{", &inv, &outputs), "no braces {{");
        assert_eq!(input_references("{{inputs.a}} {{ inputs.b }}"), ["a", "b"]);
    }

    #[test]
    fn phase_ids_are_stable_distinct_and_sort_with_their_pipeline() {
        let p = RunId::new();
        let a = phase_run_id(p, 0, 0);
        assert_eq!(a, phase_run_id(p, 0, 0));
        let mut all = std::collections::HashSet::new();
        for i in 0..8 {
            for t in 0..MAX_PHASE_ATTEMPTS {
                let id = phase_run_id(p, i, t);
                assert_eq!(id.0 >> 48, p.0 >> 48);
                assert!(all.insert(id));
            }
        }
        assert!(!all.contains(&p));
    }
}
