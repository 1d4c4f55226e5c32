//! The events of a run as a caller streams them: the typed [`RunEvent`]
//! (its `type` tag is the wire name) and the [`Event`] subscribers get, with
//! the run's id and the audit record's `seq`.
//!
//! The wire names are the CLI's JSON contract and the audit log's schema, so
//! a rename is a breaking change.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::model::ToolCallRequest;
use super::run::{CriticAction, CriticDecision, KillReason, RunId, RunStatus, Usage};

/// A typed event of a run, in the order the run saw it. The `type` tag is
/// the wire name (`step.start`, `tool.call`, `critic.steer`, …).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
#[non_exhaustive]
pub enum RunEvent {
    /// A model call starts.
    #[serde(rename = "step.start")]
    StepStart {
        /// 1-based iteration.
        iteration: u32,
    },
    /// A model call finished.
    #[serde(rename = "step.finish")]
    StepFinish {
        /// 1-based iteration.
        iteration: u32,
        /// The assistant text, whole.
        text: String,
        /// Tool calls requested.
        tool_calls: u32,
        /// This call's usage.
        usage: Usage,
        /// The tool calls as the model sent them (raw arguments): with the
        /// text, the whole response, so a run can be replayed.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        calls: Vec<ToolCallRequest>,
        /// Why the model stopped, in the provider's words (`stop`,
        /// `tool_calls`, `length`, `end_turn`, `max_tokens`…); absent when
        /// it did not say. `length` / `max_tokens` on a final answer: the
        /// answer was cut at the output limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<String>,
    },
    /// Streamed assistant text.
    #[serde(rename = "text.delta")]
    TextDelta {
        /// 1-based iteration.
        iteration: u32,
        /// The new text.
        text: String,
    },
    /// A tool call is dispatched (or refused: see the matching result).
    #[serde(rename = "tool.call")]
    ToolCall {
        /// 1-based iteration.
        iteration: u32,
        /// The model's call id.
        call_id: Arc<str>,
        /// Tool name.
        tool: Arc<str>,
        /// Argument summary.
        args: String,
    },
    /// A tool call's result.
    #[serde(rename = "tool.result")]
    ToolResult {
        /// 1-based iteration.
        iteration: u32,
        /// The model's call id.
        call_id: Arc<str>,
        /// Tool name.
        tool: Arc<str>,
        /// Whether it succeeded.
        ok: bool,
        /// The result (or error) as the model sees it: capped at the run's
        /// `max_tool_result_bytes`.
        result: String,
        /// Wall time.
        duration_ms: u64,
    },
    /// A message was added to the transcript (a steer, a final answer).
    #[serde(rename = "message.create")]
    MessageCreate {
        /// `user`, `assistant`, `system`.
        role: String,
        /// The text.
        text: String,
    },
    /// The critic steered the run.
    #[serde(rename = "critic.steer")]
    CriticSteer(CriticDecision),
    /// The critic extended the deadline.
    #[serde(rename = "critic.extend")]
    CriticExtend(CriticDecision),
    /// The critic raised the iteration ceiling.
    #[serde(rename = "critic.raise_iterations")]
    CriticRaiseIterations(CriticDecision),
    /// The critic killed the run.
    #[serde(rename = "critic.kill")]
    CriticKill(CriticDecision),
    /// A guard refused a tool call or a final answer.
    #[serde(rename = "critic.deny")]
    CriticDeny(CriticDecision),
    /// A guard held a tool call for an operator's decision.
    #[serde(rename = "critic.ask")]
    CriticAsk(CriticDecision),
    /// A model call failed and is retried after a backoff (the critic saw
    /// it as a heartbeat).
    #[serde(rename = "model.retry")]
    ModelRetry {
        /// 1-based iteration.
        iteration: u32,
        /// The error's stable kind (`rate_limited`, `server_error`, …).
        kind: String,
        /// The error (never a secret).
        message: String,
        /// How long the retry layer waits before the next attempt.
        delay_ms: u64,
    },
    /// Something the run went on despite (an unpriced model, a compaction
    /// that failed).
    #[serde(rename = "warning")]
    Warning {
        /// Stable snake_case kind (`unknown_price`, `compaction_failed`, …).
        kind: String,
        /// What happened.
        message: String,
    },
    /// The middle of the transcript was replaced by a summary the model
    /// wrote (context compaction), before the model call of `iteration`.
    #[serde(rename = "transcript.compacted")]
    TranscriptCompacted {
        /// The 1-based iteration whose model call sees the compacted
        /// transcript.
        iteration: u32,
        /// Messages before.
        messages_before: u32,
        /// Messages after.
        messages_after: u32,
        /// The estimated prompt before, in tokens.
        tokens_before: u64,
        /// The estimated prompt after, in tokens.
        tokens_after: u64,
        /// The summary call's usage (counted in the run's usage and cost).
        usage: Usage,
        /// The summary, as the model sees it from now on.
        summary: String,
    },
    /// A durable run was resumed from its checkpoint after its process
    /// ended (`Host::recover`); the steps after `iteration` run again.
    #[serde(rename = "run.resumed")]
    Resumed {
        /// Which resume this is (1-based; capped, then `crash_loop`).
        attempt: u32,
        /// Model iterations completed before the interruption.
        iteration: u32,
    },
    /// An error the run recovered from or ended with.
    #[serde(rename = "error")]
    Error {
        /// Stable snake_case kind.
        kind: String,
        /// Message (never a secret).
        message: String,
    },
    /// The run ended: the last event of every stream. It carries the
    /// terminal record's `seq`; the whole result is the run's
    /// [`RunResult`](super::run::RunResult).
    #[serde(rename = "run.end")]
    RunEnd {
        /// How it ended.
        status: RunStatus,
        /// Why it was killed, when it was.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kill_reason: Option<KillReason>,
        /// The error kind, when not ok.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<String>,
        /// The answer, or the partial output.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        /// Token usage.
        usage: Usage,
        /// Cost in integer micro-dollars.
        cost_micros: u64,
        /// Wall time from start to end.
        duration_ms: u64,
    },
    /// An MCP server the run uses started (or restarted) and listed its
    /// tools.
    #[serde(rename = "mcp.server.start.ok")]
    McpServerStartOk {
        /// The server's manifest name.
        server: String,
        /// How many tools it listed.
        tool_count: u32,
        /// From spawn (or connect) to its tool list.
        ms: u64,
    },
    /// An MCP server the run uses ended (crashed, or stopped).
    #[serde(rename = "mcp.server.exit")]
    McpServerExit {
        /// The server's manifest name.
        server: String,
        /// Its exit code (`None`: killed by a signal, or an HTTP server's
        /// connection ended).
        code: Option<i32>,
        /// The last KiB it wrote to stderr.
        stderr_tail: String,
    },
    /// A crashed MCP server is started again after a backoff.
    #[serde(rename = "mcp.server.restart")]
    McpServerRestart {
        /// The server's manifest name.
        server: String,
        /// Restarts within the crash window, this one included.
        attempt: u32,
        /// The backoff before it.
        delay_ms: u64,
    },
    /// An MCP tool call answered (its `isError` results included: those
    /// are answers the model reads). Never carries arguments or results.
    #[serde(rename = "mcp.tool.call.ok")]
    McpToolCallOk {
        /// The tool as the model sees it.
        tool: String,
        /// Wall time.
        duration_ms: u64,
    },
    /// An MCP tool call failed (the server crashed, was cancelled, …).
    #[serde(rename = "mcp.tool.call.fail")]
    McpToolCallFail {
        /// The tool as the model sees it.
        tool: String,
        /// Wall time.
        duration_ms: u64,
        /// The error's kind (`mcp_server_crashed`, `mcp_call_cancelled`, …).
        error_kind: String,
    },
    /// An MCP tool call ran out of the run's `tool_timeout` (the server
    /// was sent `notifications/cancelled`).
    #[serde(rename = "mcp.tool.call.timeout")]
    McpToolCallTimeout {
        /// The tool as the model sees it.
        tool: String,
        /// Wall time.
        duration_ms: u64,
    },
    /// A tool call waits for an operator's approval (the manifest's
    /// `approval:`): the run is parked, its deadlines and stall timer
    /// paused, until it is approved, denied, or `approval_timeout` passes
    /// (then it is denied).
    #[serde(rename = "approval.requested")]
    ApprovalRequested {
        /// 1-based iteration.
        iteration: u32,
        /// The model's call id (what `approve` and `deny` may name).
        call_id: Arc<str>,
        /// Tool name.
        tool: Arc<str>,
        /// The call's arguments as the model sent them (secrets redacted;
        /// capped at 16 KiB).
        arguments: String,
        /// How long the call waits for a decision, in ms.
        timeout_ms: u64,
        /// Why the approval judge (`approval.judge`) passed the call to a
        /// person, when one was asked: its reason, or why it could not
        /// decide (it failed, or it escalated too often to be asked).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        escalated: Option<String>,
    },
    /// A decision on a call that waited for approval.
    #[serde(rename = "approval.decided")]
    ApprovalDecided {
        /// The model's call id.
        call_id: Arc<str>,
        /// Tool name.
        tool: Arc<str>,
        /// Whether the call runs.
        approved: bool,
        /// Who decided: `operator`, `judge` (the approval judge approved
        /// it), or `timeout` (nobody did in time).
        by: String,
        /// The reason given (for a denial, what the model reads).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// How long the call waited, in ms.
        waited_ms: u64,
    },
    /// This subscriber fell behind the run and missed live events: what
    /// follows is re-read from the audit log from `resume_from` on (a
    /// stream event only; never recorded).
    #[serde(rename = "lagged")]
    Lagged {
        /// The `seq` the stream resumes from.
        resume_from: u32,
    },
}

/// One event of a run as subscribers get it: the event, the run it belongs
/// to (and that run's parent, for a sub-agent run), and its audit record's
/// `seq` (a consumer resumes from any `seq`; a streamed `text.delta` is
/// not a record and carries the `seq` of the record before it). On the
/// wire the fields sit beside the event's own: `{"type": "tool.call",
/// "run_id": "…", "seq": 4, …}`. A run's subscribers get its sub-agents'
/// events too, as they happen, each with its own run's `run_id`, `seq`
/// and `parent_run_id`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The run.
    pub run_id: RunId,
    /// The run's parent, when it is a sub-agent run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// Its audit record's sequence number.
    pub seq: u32,
    /// What happened.
    #[serde(flatten)]
    pub event: RunEvent,
}

impl std::ops::Deref for Event {
    type Target = RunEvent;
    fn deref(&self) -> &RunEvent {
        &self.event
    }
}

impl RunEvent {
    /// The wire name: the `type` tag serde writes (`step.start`,
    /// `mcp.tool.call.ok`, …). The one list of the names: the audit log
    /// stores each event under it (a test holds it equal to serde's tag).
    pub fn kind(&self) -> &'static str {
        match self {
            RunEvent::StepStart { .. } => "step.start",
            RunEvent::StepFinish { .. } => "step.finish",
            RunEvent::TextDelta { .. } => "text.delta",
            RunEvent::ToolCall { .. } => "tool.call",
            RunEvent::ToolResult { .. } => "tool.result",
            RunEvent::MessageCreate { .. } => "message.create",
            RunEvent::CriticSteer(_) => "critic.steer",
            RunEvent::CriticExtend(_) => "critic.extend",
            RunEvent::CriticRaiseIterations(_) => "critic.raise_iterations",
            RunEvent::CriticKill(_) => "critic.kill",
            RunEvent::CriticDeny(_) => "critic.deny",
            RunEvent::CriticAsk(_) => "critic.ask",
            RunEvent::ModelRetry { .. } => "model.retry",
            RunEvent::Warning { .. } => "warning",
            RunEvent::TranscriptCompacted { .. } => "transcript.compacted",
            RunEvent::Resumed { .. } => "run.resumed",
            RunEvent::Error { .. } => "error",
            RunEvent::RunEnd { .. } => "run.end",
            RunEvent::McpServerStartOk { .. } => "mcp.server.start.ok",
            RunEvent::McpServerExit { .. } => "mcp.server.exit",
            RunEvent::McpServerRestart { .. } => "mcp.server.restart",
            RunEvent::McpToolCallOk { .. } => "mcp.tool.call.ok",
            RunEvent::McpToolCallFail { .. } => "mcp.tool.call.fail",
            RunEvent::McpToolCallTimeout { .. } => "mcp.tool.call.timeout",
            RunEvent::ApprovalRequested { .. } => "approval.requested",
            RunEvent::ApprovalDecided { .. } => "approval.decided",
            RunEvent::Lagged { .. } => "lagged",
        }
    }

    /// The event for a critic decision.
    pub fn from_decision(d: CriticDecision) -> Self {
        match d.action {
            CriticAction::Steer => RunEvent::CriticSteer(d),
            CriticAction::Extend => RunEvent::CriticExtend(d),
            CriticAction::RaiseIterations => RunEvent::CriticRaiseIterations(d),
            CriticAction::Kill => RunEvent::CriticKill(d),
            CriticAction::Deny => RunEvent::CriticDeny(d),
            CriticAction::Ask => RunEvent::CriticAsk(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_wire_names() {
        let e = RunEvent::ToolCall {
            iteration: 1,
            call_id: "c1".into(),
            tool: "add".into(),
            args: "{}".into(),
        };
        let v = serde_json::to_value(&e).unwrap_or_default();
        assert_eq!(v["type"], "tool.call");
        assert_eq!(KillReason::Deadline.status(), RunStatus::Timeout);
    }
}
