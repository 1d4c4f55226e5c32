//! Fork (P3): a new run whose first K steps are taken from a recorded run
//! and which then goes on live, under other settings (another model,
//! system prompt, prompt, manifest or critic policy).
//!
//! # How a fork runs
//!
//! A fork is a run like any other: it is submitted through
//! [`Host::submit_streaming`], so admission (caps, the caller's budget,
//! the store's health), the critic, metering, the audit log and
//! durability apply to it as to every run; nothing here checks any of
//! them again. What makes it a fork is its agent: the agent the manifest
//! prepares, with
//!
//! - **a model in front of its model** (`ForkModel`): model calls 1 to
//!   K are answered with the recorded responses, at once and at no cost
//!   (their usage is 0: the fork does not spend those tokens again); call
//!   K+1 on goes to the live model with the call index it would have had
//!   (a scripted model plays its entry K+1: entries 1 to K stand for the
//!   recorded steps). No model call before K is made.
//! - **a wrapper around each tool** (`ForkTool`): a call of steps 1 to K
//!   (known by its recorded call id) is answered with its recorded result;
//!   after K a call follows the effect policy: a `read` tool runs live; a
//!   `write`, `egress` or `unknown` tool (its class from the tool, or the
//!   manifest's `tools_effects`) is answered from the recording when the
//!   recorded run made the same call (tool and canonical arguments; a call
//!   made again takes the next recorded answer, the last one repeating),
//!   and otherwise gets the error `not_executed_in_fork`, which the model
//!   reads. [`ForkOptions::live`] runs more classes live.
//!
//! Arguments are validated and guards applied before a wrapper sees a
//! call, as for any call.
//!
//! # The replayed steps are checked
//!
//! The fork's steps 1 to K go through the agent loop again (validation,
//! guards, dispatch) with the recording's answers, so they are a replay
//! against the recording: [`ForkRun`] compares each of them, as it is
//! recorded, with the recorded step (text, calls, results) and reports
//! the first that differs ([`ForkDivergence`]): a recording that does
//! not reproduce under the fork's manifest (a tool gone or changed, a
//! guard that now denies) says so instead of diverging silently. The
//! check is settled when step K+1 starts (or the fork ends).
//!
//! # What a fork does not keep
//!
//! Timing is not replayed (recorded steps answer at once). A fork that
//! compacts its transcript during steps 1 to K, or a durable fork resumed
//! by `recover` before step K, calls its live model for the rest of the
//! recorded steps. Without a manifest, a fork runs the manifest the
//! recorded run ran ([`Recording::spec`]: stores keep it once per distinct
//! manifest); a run recorded before they did gives its agent's name,
//! model, tools and limits only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use super::diff::{steps_of, StepBuilder, StepTrace};
use super::replay::recorded_answer;
use crate::dispatch::validate;
use crate::handle::{RunEvents, RunHandle};
use crate::ports::audit::{AuditEntry, AuditRecord, RunInfo};
use crate::ports::event::{Event, RunEvent};
use crate::ports::model::{
    ChatModel, ChatRequest, ChatResponse, ModelError, ModelWrapper, ToolCallRequest, ToolSpec,
};
use crate::ports::run::{ForkOrigin, RunId, RunResult, Usage};
use crate::ports::tool::{Tool, ToolContext, ToolEffect, ToolError};
use crate::spec::{AgentSpec, Invocation};
use crate::{Host, SubmitError};

/// The error kind of a call a fork did not run and could not answer from
/// the recording.
pub const NOT_EXECUTED_IN_FORK: &str = "not_executed_in_fork";

/// Why a fork could not be made (nothing ran).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForkError {
    /// The run has no records.
    #[error("no run {0} on record")]
    NotRecorded(RunId),
    /// The run's records hold no start (it was refused before it ran).
    #[error("run {0} has no start on record: it never ran, so it has no step to fork from")]
    NoStart(RunId),
    /// The step is past the recorded run's last.
    #[error("cannot fork run {run_id} at step {step}: it recorded {last} step(s){hint}")]
    StepOutOfRange {
        /// The run.
        run_id: RunId,
        /// The step asked for.
        step: u32,
        /// Its last recorded step.
        last: u32,
        /// Why there may be none.
        hint: &'static str,
    },
    /// The fork's manifest or invocation was refused.
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

/// A recorded run, read for forking.
#[derive(Clone, Debug)]
pub struct Recording {
    run_id: RunId,
    info: RunInfo,
    /// Its steps, as [`steps_of`] reads them.
    steps: Vec<StepTrace>,
    /// Its model responses, one per step, in order.
    responses: Vec<ChatResponse>,
    /// Every recorded tool answer by call id, with its step.
    by_call: HashMap<Arc<str>, (u32, Result<String, ToolError>)>,
    /// Every recorded tool answer by call (tool and canonical arguments),
    /// in order.
    by_hash: HashMap<u64, Vec<Result<String, ToolError>>>,
    /// Whether its records keep step events (`audit: summary` does not).
    summary_only: bool,
}

impl Recording {
    /// Reads a recorded run from its audit records (in order).
    pub fn from_records(run_id: RunId, records: &[AuditRecord]) -> Result<Self, ForkError> {
        if records.is_empty() {
            return Err(ForkError::NotRecorded(run_id));
        }
        let info = records
            .iter()
            .find_map(|r| match &r.entry {
                AuditEntry::RunStarted(i) => Some((**i).clone()),
                _ => None,
            })
            .ok_or(ForkError::NoStart(run_id))?;
        let mut responses = Vec::new();
        let mut calls: HashMap<Arc<str>, (u32, u64)> = HashMap::new();
        let mut by_call = HashMap::new();
        let mut by_hash: HashMap<u64, Vec<_>> = HashMap::new();
        for r in records {
            let AuditEntry::Event(e) = &r.entry else {
                continue;
            };
            match e {
                RunEvent::StepFinish {
                    iteration,
                    text,
                    calls: asked,
                    finish_reason,
                    ..
                } => {
                    for c in asked {
                        calls.insert(
                            c.id.clone(),
                            (*iteration, validate::canonical_hash(&c.name, &c.arguments)),
                        );
                    }
                    responses.push(ChatResponse {
                        text: text.clone(),
                        // A call whose arguments the record keeps capped is
                        // answered with a text of their full length (refused
                        // for its size as the run's was; see `replay`).
                        tool_calls: asked
                            .iter()
                            .map(|c| match crate::ports::run::uncap_arguments(&c.arguments) {
                                Some(full) => ToolCallRequest {
                                    arguments: full.into(),
                                    ..c.clone()
                                },
                                None => c.clone(),
                            })
                            .collect(),
                        // Not spent again.
                        usage: Usage::default(),
                        finish_reason: finish_reason.clone(),
                    });
                }
                RunEvent::ToolResult {
                    call_id,
                    iteration,
                    ok,
                    result,
                    ..
                } => {
                    let answer = recorded_answer(*ok, result);
                    if let Some((_, hash)) = calls.get(call_id) {
                        by_hash.entry(*hash).or_default().push(answer.clone());
                    }
                    by_call.insert(call_id.clone(), (*iteration, answer));
                }
                _ => {}
            }
        }
        let summary_only = responses.is_empty()
            && records
                .iter()
                .any(|r| matches!(&r.entry, AuditEntry::Terminal(t) if t.iterations > 0));
        Ok(Recording {
            run_id,
            info,
            steps: steps_of(records),
            responses,
            by_call,
            by_hash,
            summary_only,
        })
    }

    /// The recorded run.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// Its start record: agent, model, caller, prompt, tools, limits.
    pub fn info(&self) -> &RunInfo {
        &self.info
    }

    /// How many steps (model calls) it recorded.
    pub fn last_step(&self) -> u32 {
        self.responses.len() as u32
    }

    /// The manifest the recorded run ran, with the limits it ran under
    /// (an invocation's overrides included): the recorded manifest where
    /// the store keeps it ([`Recording::has_manifest`]: its system prompt,
    /// script, tools and policies); else one made of what its start record
    /// says, its agent's name, model, tools and limits (no system prompt,
    /// no script).
    pub fn spec(&self) -> AgentSpec {
        let mut spec = self.recorded_spec().unwrap_or_else(|| {
            let mut spec = AgentSpec::new(self.info.agent.to_string(), self.info.model.to_string());
            spec.tools = self.info.tools.to_vec();
            spec
        });
        if let Some(l) = self.info.limits {
            spec.limits = l.to_spec();
        }
        spec
    }

    /// Whether the store kept the recorded run's manifest (runs recorded
    /// since schema version 14 have it).
    pub fn has_manifest(&self) -> bool {
        self.recorded_spec().is_some()
    }

    fn recorded_spec(&self) -> Option<AgentSpec> {
        let json = self.info.manifest.as_ref()?.json.as_ref()?;
        json.decode::<AgentSpec>().ok()
    }
}

/// How to fork.
#[derive(Clone, Debug, Default)]
pub struct ForkOptions {
    /// Steps 1 to `at_step` are taken from the recording (0: none).
    pub at_step: u32,
    /// Effect classes run live besides `read` (`--live-tools write,egress`).
    pub live: Vec<ToolEffect>,
    /// The prompt (default: the recorded run's).
    pub prompt: Option<String>,
    /// Who the fork is charged to (default: the recorded run's caller).
    pub caller_id: Option<String>,
    /// The fork's own token budget, if any.
    pub budget_tokens: Option<u64>,
}

/// Where a fork's replayed steps first differ from the recording.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ForkDivergence {
    /// The first replayed step (1 to K) that differs.
    pub step: u32,
    /// The recorded step.
    pub recorded: Option<StepTrace>,
    /// The fork's step (`null`: the fork ended before it).
    pub forked: Option<StepTrace>,
}

/// A fork in flight: its handle, its events, and the check of its
/// replayed steps.
pub struct ForkRun {
    handle: RunHandle,
    events: RunEvents,
    expected: Vec<StepTrace>,
    seen: StepBuilder,
    origin: ForkOrigin,
    /// Its event stream has ended (it is not polled again).
    ended: bool,
}

/// A fork that ended.
#[derive(Clone, Debug, Serialize)]
pub struct ForkOutcome {
    /// Its result (with [`RunResult::forked_from`]).
    pub result: RunResult,
    /// Where its replayed steps first differ from the recording, if they
    /// do.
    pub divergence: Option<ForkDivergence>,
}

impl ForkRun {
    /// The fork's run id.
    pub fn run_id(&self) -> RunId {
        self.handle.run_id()
    }

    /// The fork's handle (to cancel it, or reach it by reference).
    pub fn handle(&self) -> &RunHandle {
        &self.handle
    }

    /// Where it was forked from.
    pub fn origin(&self) -> ForkOrigin {
        self.origin
    }

    /// The fork's next event (`None` once it ended).
    pub async fn next_event(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        let Some(ev) = self.events.next().await else {
            self.ended = true;
            return None;
        };
        self.seen.push(0, &ev.event);
        Some(ev)
    }

    /// The first replayed step that differs from the recording, judged on
    /// the steps seen so far: settled once step K+1 has started or the
    /// fork has ended.
    pub fn divergence(&self) -> Option<ForkDivergence> {
        let seen = self.seen.steps();
        self.expected.iter().enumerate().find_map(|(i, rec)| {
            let forked = seen.get(i);
            match forked {
                Some(f) if f.same_as(rec) => None,
                _ => Some(ForkDivergence {
                    step: rec.step,
                    recorded: Some(rec.clone()),
                    forked: forked.cloned(),
                }),
            }
        })
    }

    /// Lets the fork run on without this caller (its events unread, no
    /// check of its replayed steps: `diff` of the recorded run and the
    /// fork shows them); a reference to it.
    pub fn detach(self) -> crate::RunRef {
        let run = self.handle.run_ref();
        self.handle.detach();
        run
    }

    /// Follows the fork to its end.
    pub async fn finish(mut self) -> ForkOutcome {
        while self.next_event().await.is_some() {}
        let divergence = self.divergence();
        let result = (&mut self.handle).await;
        ForkOutcome { result, divergence }
    }
}

/// Forks `recording` at `options.at_step` under manifest `spec` on `host`
/// (see the module doc). Refused (nothing runs) when the step is past the
/// recorded run's last, or the host refuses the submission.
pub async fn fork(
    host: &Host,
    spec: impl Into<Arc<AgentSpec>>,
    recording: &Recording,
    options: ForkOptions,
) -> Result<ForkRun, ForkError> {
    let k = options.at_step;
    if k > recording.last_step() {
        return Err(ForkError::StepOutOfRange {
            run_id: recording.run_id,
            step: k,
            last: recording.last_step(),
            hint: if recording.summary_only {
                " (it was recorded with `audit: summary`, which keeps no steps)"
            } else {
                ""
            },
        });
    }
    let agent = host.prepare(spec).await?;
    let prefix = recording.responses[..k as usize].to_vec();
    let model = fork_model(prefix, agent.model().clone());
    let answers = Arc::new(Answers {
        prefix: recording
            .by_call
            .iter()
            .filter(|(_, (step, _))| *step <= k)
            .map(|(id, (_, a))| (id.clone(), a.clone()))
            .collect(),
        by_hash: recording.by_hash.clone(),
        used: Mutex::new(HashMap::new()),
    });
    let tools = agent.tools().wrapped(|tool| {
        let effect = agent
            .tool_effect(&tool.spec().name)
            .unwrap_or(ToolEffect::Unknown);
        Arc::new(ForkTool {
            inner: tool.clone(),
            effect,
            live: effect == ToolEffect::Read || options.live.contains(&effect),
            answers: answers.clone(),
        }) as Arc<dyn Tool>
    });
    let forked = agent.rewired(model, tools);
    let origin = ForkOrigin {
        run_id: recording.run_id,
        step: k,
    };
    let inv = Invocation {
        prompt: options
            .prompt
            .unwrap_or_else(|| recording.info.prompt.clone()),
        caller_id: options
            .caller_id
            .or_else(|| recording.info.caller_id.as_deref().map(str::to_string)),
        budget_tokens: options.budget_tokens,
        forked_from: Some(origin),
        ..Default::default()
    };
    let (handle, events) = host.submit_streaming(forked, inv).await?;
    Ok(ForkRun {
        handle,
        events,
        expected: recording.steps[..k as usize].to_vec(),
        seen: StepBuilder::default(),
        origin,
        ended: false,
    })
}

/// A fork's model: `recorded` answers calls 0 to its length - 1, `live`
/// the rest (see `ForkModel`).
pub(crate) fn fork_model(
    recorded: Vec<ChatResponse>,
    live: Arc<dyn ChatModel>,
) -> Arc<dyn ChatModel> {
    Arc::new(ForkModel {
        recorded: recorded.into(),
        live,
    })
}

/// The recording's model responses in front of the live model (see the
/// module doc).
struct ForkModel {
    /// Responses to calls 0 to K-1.
    recorded: Arc<[ChatResponse]>,
    live: Arc<dyn ChatModel>,
}

#[async_trait]
impl ModelWrapper for ForkModel {
    fn inner(&self) -> &dyn ChatModel {
        &*self.live
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        match self.recorded.get(request.call_index as usize) {
            Some(r) => Ok(r.clone()),
            None => self.live.complete(request).await,
        }
    }
}

/// The recorded tool answers a fork's tools share.
struct Answers {
    /// Answers of the calls of steps 1 to K, by call id.
    prefix: HashMap<Arc<str>, Result<String, ToolError>>,
    /// Every recorded answer by call hash, in order.
    by_hash: HashMap<u64, Vec<Result<String, ToolError>>>,
    /// How many answers of each call hash were handed out.
    used: Mutex<HashMap<u64, usize>>,
}

impl Answers {
    /// The next recorded answer of the call with this hash (the last
    /// repeating), if the recording made that call.
    fn next(&self, hash: u64) -> Option<Result<String, ToolError>> {
        let list = self.by_hash.get(&hash)?;
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let n = used.entry(hash).or_insert(0);
        let answer = list.get(*n).or_else(|| list.last())?.clone();
        *n += 1;
        Some(answer)
    }
}

/// A tool of a fork: the recording's answers in front of the tool (see the
/// module doc). Forwards everything else to the tool it wraps.
struct ForkTool {
    inner: Arc<dyn Tool>,
    /// Its class for this agent (the manifest's `tools_effects` applied).
    effect: ToolEffect,
    /// Whether calls after K run live.
    live: bool,
    answers: Arc<Answers>,
}

#[async_trait]
impl Tool for ForkTool {
    fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<String, ToolError> {
        if let Some(answer) = self.answers.prefix.get(&ctx.call_id) {
            return answer.clone();
        }
        if self.live {
            return self.inner.call(args, ctx).await;
        }
        let name = &self.inner.spec().name;
        match self
            .answers
            .next(validate::canonical_hash_of(name, &args))
        {
            Some(answer) => answer,
            None => Err(ToolError::Typed {
                kind: NOT_EXECUTED_IN_FORK,
                message: format!(
                    "`{name}` is a `{}` tool, which this fork does not run, and the recorded run made no such call to answer it with",
                    self.effect
                ),
            }),
        }
    }

    fn effect(&self) -> ToolEffect {
        self.effect
    }

    fn answers_at_once(&self) -> bool {
        self.inner.answers_at_once()
    }

    fn timeout_error(&self, timeout_ms: u64) -> ToolError {
        self.inner.timeout_error(timeout_ms)
    }

    fn uses_run(&self) -> bool {
        self.inner.uses_run()
    }

    fn call_through_run<'a>(&self, args: &'a Value) -> Option<(&'a str, Option<&'a Value>)> {
        self.inner.call_through_run(args)
    }
}
