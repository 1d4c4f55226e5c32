//! Replay (P3): re-run a recorded run against its recorded model responses
//! and tool results, and compare the trace.
//!
//! The recorded run's audit records hold everything needed: `run_started`
//! (the agent's tools and resolved limits), every `step.finish` (the whole
//! model response: text and raw tool calls), every `tool.result` (what the
//! model saw). The replay runs the same agent loop — argument validation,
//! parallel dispatch, error counting, iteration ceiling — on a fresh
//! in-memory host, with a model that answers from the recording and tools
//! with the original schemas that answer from the recording.
//!
//! The trace compared is the sequence of steps, tool calls (name, raw
//! arguments) and tool results (ok, content), the result's step records
//! (tool, arguments, ok, result: a second record of the same calls, so a
//! step or a tool result changed in one place and not the other shows), and
//! the ending (status, error kind, output). Timing is not part of it, nor
//! are critic decisions.
//!
//! Every ending replays equal:
//! - endings the agent loop decides from what the recording holds (`ok`;
//!   `error` with `max_iterations`, `tool_errors`, `invalid_output`, or a
//!   provider error such as `rate_limited`, `server_error`, `transport`)
//!   are compared whole: the recorded model answers the failed call with
//!   the recorded error's kind, and a run whose answer needed a repair turn
//!   replays against a schema that refuses exactly the answers the original
//!   schema refused (the manifest's schema is not on record);
//! - endings decided from outside the loop (`timeout`, `killed`,
//!   `cancelled`, `budget_exceeded`, a shard failure, a panic, an
//!   interrupted run) compare the steps the run recorded, not the ending;
//! - a run refused before it started (`rejected`, or `budget_exceeded` at
//!   admission) has no `run_started` record: nothing ran, so its trace is
//!   its ending alone, the same on replay.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::dispatch::ToolRegistry;
use crate::ports::audit::{AuditEntry, AuditRecord};
use crate::ports::event::RunEvent;
use crate::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, ToolSpec};
use crate::ports::run::{RunResult, RunStatus};
use crate::ports::tool::{Tool, ToolContext, ToolError};
use crate::spec::{AgentSpec, Invocation, LimitsSpec};
use crate::Host;

/// One entry of a comparable trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TraceItem {
    /// A model response: its text and raw tool calls.
    Step {
        /// 1-based iteration.
        iteration: u32,
        /// Assistant text.
        text: String,
        /// `name(arguments)` per call.
        calls: Vec<String>,
    },
    /// A tool result as the model saw it.
    ToolResult {
        /// Tool name.
        tool: String,
        /// Whether it succeeded.
        ok: bool,
        /// The content.
        result: String,
    },
    /// One of the result's step records (a tool call and its outcome).
    StepRecord {
        /// 1-based iteration.
        iteration: u32,
        /// Tool name.
        tool: String,
        /// The arguments' summary.
        args: String,
        /// Whether it succeeded.
        ok: bool,
        /// The result's summary.
        result: String,
    },
    /// How the run ended.
    End {
        /// Status.
        status: RunStatus,
        /// Error kind.
        error_kind: Option<String>,
        /// Output.
        output: Option<String>,
    },
}

/// The outcome of a replay.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    /// Whether the replayed trace equals the recorded one.
    pub same: bool,
    /// The recorded trace.
    pub recorded: Vec<TraceItem>,
    /// The replayed trace.
    pub replayed: Vec<TraceItem>,
    /// The first index where they differ, if they do.
    pub first_difference: Option<usize>,
}

/// Why a replay could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The records hold no terminal record, or no start.
    #[error("the run has no complete record: {0}")]
    Incomplete(String),
    /// The replay host could not be built or the run not submitted.
    #[error("replay failed: {0}")]
    Failed(String),
}

/// The trace of a recorded run, from its audit records.
pub fn recorded_trace(
    records: &[AuditRecord],
) -> Result<(Vec<TraceItem>, Arc<RunResult>), ReplayError> {
    let terminal = records
        .iter()
        .find_map(|r| match &r.entry {
            AuditEntry::Terminal(res) => Some(res.clone()),
            _ => None,
        })
        .ok_or_else(|| ReplayError::Incomplete("no terminal record".into()))?;
    let events = records.iter().filter_map(|r| match &r.entry {
        AuditEntry::Event(e) => Some(e),
        _ => None,
    });
    let mut trace = trace_of(events);
    trace.extend(steps_of(&terminal));
    trace.push(end_of(&terminal));
    Ok((trace, terminal))
}

/// The result's step records as trace items.
fn steps_of(r: &RunResult) -> impl Iterator<Item = TraceItem> + '_ {
    r.steps.iter().map(|s| TraceItem::StepRecord {
        iteration: s.iteration,
        tool: s.tool.to_string(),
        args: s.args.clone(),
        ok: s.ok,
        result: s.result.clone(),
    })
}

/// Error kinds the agent loop decides from what the model and tools said
/// (the recording holds all of it, so the replay must end the same way).
const LOOP_KINDS: &[&str] = &[
    "max_iterations",
    "tool_errors",
    "invalid_output",
    "rate_limited",
    "quota",
    "server_error",
    "bad_request",
    "auth",
    "malformed_response",
    "transport",
    "incomplete_response",
    "circuit_open",
];

/// Whether the run's ending was decided by its loop from the recording
/// (compared whole) rather than from outside it (steps compared only).
fn decided_by_loop(r: &RunResult) -> bool {
    match r.status {
        RunStatus::Ok => true,
        RunStatus::Error => r
            .error_kind
            .as_deref()
            .is_some_and(|k| LOOP_KINDS.contains(&k)),
        _ => false,
    }
}

/// The provider error a run ended on, rebuilt from its kind and message.
fn model_error(kind: &str, message: &str) -> Option<ModelError> {
    let m = message.to_string();
    Some(match kind {
        "rate_limited" => ModelError::RateLimited { retry_after: None },
        "quota" => ModelError::Quota(m),
        "server_error" => ModelError::Server {
            status: 500,
            message: m,
        },
        "bad_request" => ModelError::BadRequest(m),
        "auth" => ModelError::Auth,
        "malformed_response" => ModelError::Malformed(m),
        "transport" => ModelError::Transport(m),
        "incomplete_response" => ModelError::Incomplete(m),
        "circuit_open" => ModelError::CircuitOpen(m),
        _ => return None,
    })
}

/// A tool error rebuilt from the text the model saw (`error: KIND: MESSAGE`).
fn tool_error(kind: &str, message: &str) -> ToolError {
    match kind {
        "tool_timeout" => message
            .strip_prefix("timed out after ")
            .and_then(|r| r.strip_suffix(" ms"))
            .and_then(|n| n.parse().ok())
            .map(ToolError::Timeout)
            .unwrap_or_else(|| ToolError::Failed(message.to_string())),
        "tool_panicked" => ToolError::Panicked(
            message
                .strip_prefix("tool panicked: ")
                .unwrap_or(message)
                .to_string(),
        ),
        _ => ToolError::Failed(message.to_string()),
    }
}

/// A tool's answer rebuilt from its `tool.result` record: the result, or
/// the error the model saw (`error: KIND: MESSAGE`).
pub(crate) fn recorded_answer(ok: bool, result: &str) -> Result<String, ToolError> {
    if ok {
        return Ok(result.to_string());
    }
    let mut parts = result.splitn(3, ": ");
    let (_, kind) = (parts.next(), parts.next().unwrap_or(""));
    Err(tool_error(kind, parts.next().unwrap_or(result)))
}

/// The answers a run's output schema refused: each final-looking answer
/// followed by a repair turn, and the last answer of an `invalid_output`
/// run. `None` when no answer was refused (no schema needs replaying).
fn refused_answers(records: &[AuditRecord], terminal: &RunResult) -> Option<Vec<String>> {
    let mut refused = Vec::new();
    let mut last_answer: Option<&str> = None;
    for r in records {
        let AuditEntry::Event(e) = &r.entry else {
            continue;
        };
        match e {
            RunEvent::StepFinish { text, calls, .. } => {
                last_answer = calls.is_empty().then_some(text.as_str());
            }
            RunEvent::MessageCreate { role, text }
                if role == "user" && text.starts_with(crate::output::REPAIR_PREFIX) =>
            {
                if let Some(a) = last_answer.take() {
                    refused.push(a.to_string());
                }
            }
            _ => {}
        }
    }
    if terminal.error_kind.as_deref() == Some("invalid_output") {
        refused.extend(terminal.output.clone());
    }
    (!refused.is_empty()).then_some(refused)
}

/// A schema that refuses exactly these answers: any answer that is not
/// JSON is refused by the check itself; the JSON ones are listed.
fn refusing_schema(answers: &[String]) -> Value {
    let mut values: Vec<Value> = Vec::new();
    for a in answers {
        for text in [a.trim(), unfence(a)] {
            if let Ok(v) = serde_json::from_str::<Value>(text) {
                if !values.contains(&v) {
                    values.push(v);
                }
            }
        }
    }
    if values.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::json!({ "not": { "enum": values } })
    }
}

/// An answer without a Markdown code fence around it (as the output check
/// forgives one).
fn unfence(text: &str) -> &str {
    let t = text.trim();
    let Some(body) = t.strip_prefix("```").and_then(|r| r.strip_suffix("```")) else {
        return t;
    };
    match body.split_once('\n') {
        Some((lang, inner)) if !lang.contains('{') && !lang.contains('[') => inner.trim(),
        _ => body.trim(),
    }
}

fn trace_of<'a>(events: impl Iterator<Item = &'a RunEvent>) -> Vec<TraceItem> {
    let mut out = Vec::new();
    for e in events {
        match e {
            RunEvent::StepFinish {
                iteration,
                text,
                calls,
                ..
            } => out.push(TraceItem::Step {
                iteration: *iteration,
                text: text.clone(),
                calls: calls
                    .iter()
                    .map(|c| format!("{}({})", c.name, c.arguments))
                    .collect(),
            }),
            RunEvent::ToolResult {
                tool, ok, result, ..
            } => out.push(TraceItem::ToolResult {
                tool: tool.to_string(),
                ok: *ok,
                result: result.clone(),
            }),
            _ => {}
        }
    }
    out
}

fn end_of(r: &RunResult) -> TraceItem {
    TraceItem::End {
        status: r.status,
        error_kind: r.error_kind.clone(),
        output: r.output.clone(),
    }
}

/// A model that answers from a recording: the recorded responses in
/// order, then the recorded provider error the run ended on, if any.
struct RecordedModel {
    responses: Vec<ChatResponse>,
    failure: Option<ModelError>,
}

#[async_trait]
impl ChatModel for RecordedModel {
    /// A script entry answers at once (or after its latency, a timer).
    fn answers_at_once(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "recorded"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let i = request.call_index as usize;
        if let (true, Some(e)) = (i == self.responses.len(), &self.failure) {
            return Err(e.clone());
        }
        self.responses.get(i).cloned().ok_or_else(|| {
            ModelError::BadRequest(format!(
                "the recording has no response for call {}",
                request.call_index + 1
            ))
        })
    }
}

/// Recorded tool results by call id: (ok, the result as the model saw it).
type Recorded = HashMap<Arc<str>, Result<String, ToolError>>;

/// A tool with the original schema that answers from a recording.
struct RecordedTool {
    spec: ToolSpec,
    results: Recorded,
}

#[async_trait]
impl Tool for RecordedTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _args: Value, ctx: ToolContext) -> Result<String, ToolError> {
        match self.results.get(&ctx.call_id) {
            Some(result) => result.clone(),
            None => Err(ToolError::Failed(
                "the recording has no result for this call".into(),
            )),
        }
    }
}

/// Replays a recorded run. `tools` supplies the original tool schemas
/// (the host's registry); `records` are the run's audit records in order.
pub async fn replay(
    records: &[AuditRecord],
    tools: &ToolRegistry,
) -> Result<ReplayReport, ReplayError> {
    let (recorded, terminal) = recorded_trace(records)?;
    let info = records.iter().find_map(|r| match &r.entry {
        AuditEntry::RunStarted(i) => Some((**i).clone()),
        _ => None,
    });
    let Some(info) = info else {
        // Refused before it started: nothing ran, nothing can differ.
        let refused = matches!(
            terminal.status,
            RunStatus::Rejected | RunStatus::BudgetExceeded
        ) && terminal.iterations == 0
            && records
                .iter()
                .all(|r| matches!(r.entry, AuditEntry::Terminal(_)));
        if refused {
            return Ok(ReplayReport {
                same: true,
                replayed: recorded.clone(),
                recorded,
                first_difference: None,
            });
        }
        return Err(ReplayError::Incomplete("no run_started record".into()));
    };

    let mut responses = Vec::new();
    let mut results: HashMap<Arc<str>, Recorded> = HashMap::new();
    for r in records {
        if let AuditEntry::Event(e) = &r.entry {
            match e {
                RunEvent::StepFinish {
                    text,
                    calls,
                    usage,
                    finish_reason,
                    ..
                } => responses.push(ChatResponse {
                    text: text.clone(),
                    // A call whose arguments the record keeps capped is
                    // answered with a text of their full length: refused
                    // for its size as the run's was.
                    tool_calls: calls
                        .iter()
                        .map(|c| match crate::ports::run::uncap_arguments(&c.arguments) {
                            Some(full) => crate::ports::model::ToolCallRequest {
                                arguments: full.into(),
                                ..c.clone()
                            },
                            None => c.clone(),
                        })
                        .collect(),
                    usage: *usage,
                    finish_reason: finish_reason.clone(),
                }),
                RunEvent::ToolResult {
                    call_id,
                    tool,
                    ok,
                    result,
                    ..
                } => {
                    let answer = recorded_answer(*ok, result);
                    results
                        .entry(tool.clone())
                        .or_default()
                        .insert(call_id.clone(), answer);
                }
                _ => {}
            }
        }
    }

    let mut registry = ToolRegistry::new();
    let originals = tools
        .select(&info.tools)
        .map_err(|e| ReplayError::Failed(e.to_string()))?;
    for spec in originals.specs().iter() {
        let tool = RecordedTool {
            spec: spec.clone(),
            results: results.remove(spec.name.as_str()).unwrap_or_default(),
        };
        registry
            .register(Arc::new(tool))
            .map_err(|e| ReplayError::Failed(e.to_string()))?;
    }

    let failure = match (terminal.status, terminal.error_kind.as_deref()) {
        (RunStatus::Error, Some(kind)) => {
            model_error(kind, terminal.error.as_deref().unwrap_or(""))
        }
        _ => None,
    };
    let mut spec = AgentSpec::new(info.agent.to_string(), "recorded");
    spec.output_schema = refused_answers(records, &terminal).map(|a| refusing_schema(&a));
    spec.tools = info.tools.to_vec();
    spec.limits = info.limits.map(|l| l.to_spec()).unwrap_or_default();
    // Timing is not replayed: no deadline or stall may cut the replay short.
    // Nor is compaction: the recording answers steps, not summary calls (a
    // summary would take a step's call index), and the recorded model reads
    // no transcript.
    spec.limits = LimitsSpec {
        soft_timeout: Some(crate::spec::ABSOLUTE_DEADLINE),
        hard_timeout: Some(crate::spec::ABSOLUTE_DEADLINE),
        stall_timeout: Some(crate::spec::ABSOLUTE_DEADLINE),
        // Nor is the critic's runaway kill (it ends a run from outside the
        // loop, at a moment that depends on timing): the replay runs on to
        // the end of the recording and compares the steps the run recorded.
        repeat_limit: Some(crate::spec::MAX_COUNT),
        context_window: Some(0),
        ..spec.limits
    };
    // Nor is any other loop detector's.
    spec.critic.loops = crate::spec::LoopsSpec::off();
    let host = Host::builder()
        .tools(registry)
        .model("recorded", Arc::new(RecordedModel { responses, failure }))
        .build()
        .await
        .map_err(|e| ReplayError::Failed(e.to_string()))?;
    let submitted = host
        .submit_streaming(spec, Invocation::prompt(info.prompt.clone()))
        .await;
    let (handle, mut events) = submitted.map_err(|e| ReplayError::Failed(e.to_string()))?;
    let mut seen = Vec::new();
    while let Some(e) = events.next().await {
        seen.push(e.event);
    }
    let result = handle.await;
    host.shutdown().await;

    let events = trace_of(seen.iter());
    let steps: Vec<TraceItem> = steps_of(&result).collect();
    let end = end_of(&result);
    let whole = decided_by_loop(&terminal);
    // An ending decided outside the loop: only the steps the run recorded
    // are compared (the replay, never stopped, may go further).
    let (events, steps) = if whole {
        (events, steps)
    } else {
        let recorded_events = recorded
            .iter()
            .filter(|t| !matches!(t, TraceItem::StepRecord { .. } | TraceItem::End { .. }))
            .count();
        let recorded_steps = terminal.steps.len();
        (
            events.into_iter().take(recorded_events).collect(),
            steps.into_iter().take(recorded_steps).collect(),
        )
    };
    let mut replayed = events;
    replayed.extend(steps);
    // Whole: every item, the ending too. Otherwise all but the ending.
    let compared = if whole {
        replayed.len() + 1
    } else {
        replayed.len()
    }
    .max(recorded.len() - usize::from(!whole));
    replayed.push(end);
    let first_difference = (0..compared).find(|&i| recorded.get(i) != replayed.get(i));
    Ok(ReplayReport {
        same: first_difference.is_none(),
        recorded,
        replayed,
        first_difference,
    })
}
