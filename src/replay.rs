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
//! arguments) and tool results (ok, content), and the ending (status,
//! error kind, output). Timing is not part of it, nor are critic decisions;
//! for a run that was killed, timed out or cancelled (a timing outcome) only
//! the steps it recorded are compared.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::ports::audit::{AuditEntry, AuditRecord};
use crate::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError};
use crate::ports::run::{RunEvent, RunResult, RunStatus};
use crate::ports::tool::{Tool, ToolContext, ToolError, ToolSpec};
use crate::spec::{AgentSpec, Invocation, LimitsSpec};
use crate::tools::ToolRegistry;
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
    trace.push(end_of(&terminal));
    Ok((trace, terminal))
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

/// A model that answers from a recording.
struct RecordedModel {
    responses: Vec<ChatResponse>,
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
        self.responses
            .get(request.call_index as usize)
            .cloned()
            .ok_or_else(|| {
                ModelError::BadRequest(format!(
                    "the recording has no response for call {}",
                    request.call_index + 1
                ))
            })
    }
}

/// Recorded tool results by call id: (ok, the result as the model saw it).
type Recorded = HashMap<Arc<str>, (bool, String)>;

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
            Some((true, text)) => Ok(text.clone()),
            Some((false, text)) => Err(ToolError::Failed(text.clone())),
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
    let info = records
        .iter()
        .find_map(|r| match &r.entry {
            AuditEntry::RunStarted(i) => Some((**i).clone()),
            _ => None,
        })
        .ok_or_else(|| ReplayError::Incomplete("no run_started record".into()))?;

    let mut responses = Vec::new();
    let mut results: HashMap<Arc<str>, Recorded> = HashMap::new();
    for r in records {
        if let AuditEntry::Event(e) = &r.entry {
            match e {
                RunEvent::StepFinish {
                    text, calls, usage, ..
                } => responses.push(ChatResponse {
                    text: text.clone(),
                    tool_calls: calls.clone(),
                    usage: *usage,
                }),
                RunEvent::ToolResult {
                    call_id,
                    tool,
                    ok,
                    result,
                    ..
                } => {
                    // What the model saw for an error is "error: <kind>: <message>".
                    let text = if *ok {
                        result.clone()
                    } else {
                        result.splitn(3, ": ").nth(2).unwrap_or(result).to_string()
                    };
                    results
                        .entry(tool.clone())
                        .or_default()
                        .insert(call_id.clone(), (*ok, text));
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

    let mut spec = AgentSpec::new(info.agent.to_string(), "recorded");
    spec.tools = info.tools.to_vec();
    spec.limits = info.limits.unwrap_or_default();
    // Timing is not replayed: no deadline or stall may cut the replay short.
    // Nor is compaction: the recording answers steps, not summary calls (a
    // summary would take a step's call index), and the recorded model reads
    // no transcript.
    spec.limits = LimitsSpec {
        soft_timeout: Some(crate::spec::ABSOLUTE_DEADLINE),
        hard_timeout: Some(crate::spec::ABSOLUTE_DEADLINE),
        stall_timeout: Some(crate::spec::ABSOLUTE_DEADLINE),
        context_window: Some(0),
        ..spec.limits
    };
    let host = Host::builder()
        .tools(registry)
        .model("recorded", Arc::new(RecordedModel { responses }))
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

    let mut replayed = trace_of(seen.iter());
    replayed.push(end_of(&result));
    let timing_outcome = matches!(
        terminal.status,
        RunStatus::Killed | RunStatus::Timeout | RunStatus::Cancelled
    );
    let (a, b): (&[TraceItem], &[TraceItem]) = if timing_outcome {
        let n = recorded.len() - 1;
        (&recorded[..n], &replayed[..n.min(replayed.len())])
    } else {
        (&recorded, &replayed)
    };
    let first_difference = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i));
    Ok(ReplayReport {
        same: first_difference.is_none(),
        recorded,
        replayed,
        first_difference,
    })
}
