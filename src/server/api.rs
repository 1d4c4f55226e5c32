//! The API's request and response bodies. `/openapi.json` is derived from
//! these types (and the handlers' `#[utoipa::path]` attributes), so the
//! document says what the code does.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::handle::{LiveState, PendingApproval};
use crate::host::LiveRun;
use crate::ports::audit::RunSummary;
use crate::ports::run::CriticDecision;
use crate::RunResult;

/// `POST /v1/runs`: a run of an agent the server knows, by name.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRun {
    /// The agent's name (one of `GET /v1/agents`). Required unless an
    /// inline `manifest` is given.
    #[serde(default)]
    pub agent: Option<String>,
    /// The prompt (default: the manifest's `prompt`).
    #[serde(default)]
    pub input: Option<String>,
    /// Named inputs.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub inputs: BTreeMap<String, serde_json::Value>,
    /// This run's own token budget (its sub-agents' tokens count toward
    /// it). It applies with the manifest's `budget.tokens` and the
    /// caller's limits (the tightest wins): a model call asks for no
    /// longer a reply than what is left, and the run ends
    /// `budget_exceeded` (kill reason `budget`) when it is spent.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub budget_tokens: Option<u64>,
    /// The same key from the same caller returns the same run instead of
    /// starting another (also read from the `Idempotency-Key` header).
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// An inline manifest (admins only: a manifest can start processes).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub manifest: Option<serde_json::Value>,
}

/// `?wait=SECONDS`: answer with the result if the run ends that soon.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Seconds to wait for the run to end (at most 300).
    #[serde(default)]
    #[param(minimum = 0)]
    pub wait: Option<f64>,
}

/// A run's live progress.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LiveView {
    /// Model iterations started.
    pub iteration: u32,
    /// The iteration ceiling.
    pub max_iterations: u32,
    /// Time since it started, in ms.
    pub elapsed_ms: u64,
    /// Tokens used so far.
    pub tokens: u64,
    /// Tool calls finished so far.
    pub tool_calls: u32,
    /// Cost so far in micro-dollars (0 for a model without a price).
    #[serde(default)]
    pub cost_micros: u64,
    /// The critic's latest decision (as in a result's `critic`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub last_decision: Option<CriticDecision>,
    /// Tool calls waiting for an operator's approval (`approve` / `deny`):
    /// the run is parked, its deadlines paused, until they are decided.
    #[serde(default)]
    pub awaiting_approval: Vec<PendingView>,
}

/// A tool call waiting for an operator's approval.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PendingView {
    /// The model's call id (what `call_id` of `approve` / `deny` names).
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments as the model sent them (secrets redacted).
    pub arguments: String,
    /// Unix ms when it began to wait.
    pub since_ms: u64,
    /// Unix ms when it is denied if nobody decides.
    pub until_ms: u64,
}

impl From<&PendingApproval> for PendingView {
    fn from(p: &PendingApproval) -> Self {
        PendingView {
            call_id: p.call_id.to_string(),
            tool: p.tool.to_string(),
            arguments: p.arguments.clone(),
            since_ms: p.since_ms,
            until_ms: p.until_ms,
        }
    }
}

impl From<LiveState> for LiveView {
    fn from(l: LiveState) -> Self {
        LiveView {
            iteration: l.iteration,
            max_iterations: l.max_iterations,
            elapsed_ms: l.elapsed_ms,
            tokens: l.tokens,
            tool_calls: l.tool_calls,
            cost_micros: l.cost_micros,
            last_decision: l.last_decision,
            awaiting_approval: l.awaiting_approval.iter().map(PendingView::from).collect(),
        }
    }
}

/// One run: its live state while it runs, its result once it has ended.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    /// The run's id (32 hex digits).
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// Who submitted it.
    pub caller_id: Option<String>,
    /// Its parent, for a sub-agent run.
    pub parent_run_id: Option<String>,
    /// `running`, or how it ended: `ok`, `error`, `timeout`, `killed`,
    /// `budget_exceeded`, `cancelled`, `rejected`, `dry_run`.
    pub status: String,
    /// Why it was killed, when it was.
    pub kill_reason: Option<String>,
    /// The error kind, when it did not end ok.
    pub error_kind: Option<String>,
    /// The answer (or partial output), once it has ended.
    pub output: Option<String>,
    /// Progress, while it runs.
    pub live: Option<LiveView>,
    /// The whole result (steps, usage, cost, critic decisions), once it
    /// has ended.
    #[schema(value_type = Option<Object>)]
    pub result: Option<Arc<RunResult>>,
}

impl RunView {
    /// The view of a live run.
    pub(crate) fn live(run: &crate::RunRef) -> Self {
        RunView {
            run_id: run.run_id().to_string(),
            agent: run.agent().to_string(),
            caller_id: run.caller_id().map(str::to_string),
            parent_run_id: run.parent_run_id().map(|p| p.to_string()),
            status: "running".into(),
            kill_reason: None,
            error_kind: None,
            output: None,
            live: Some(run.live().into()),
            result: None,
        }
    }

    /// The view of an ended run.
    pub(crate) fn ended(r: Arc<RunResult>) -> Self {
        RunView {
            run_id: r.run_id.to_string(),
            agent: r.agent.clone(),
            caller_id: r.caller_id.clone(),
            parent_run_id: r.parent_run_id.map(|p| p.to_string()),
            status: r.status.to_string(),
            kill_reason: r.kill_reason.map(|k| k.to_string()),
            error_kind: r.error_kind.clone(),
            output: r.output.clone(),
            live: None,
            result: Some(r),
        }
    }
}

/// `GET /v1/runs` filters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `running`, or an end status (`ok`, `error`, `timeout`, `killed`,
    /// `budget_exceeded`, `cancelled`, `rejected`, `dry_run`).
    #[serde(default)]
    pub status: Option<String>,
    /// Only runs of this agent.
    #[serde(default)]
    pub agent: Option<String>,
    /// Only runs this schedule fired (`serve --skills`).
    #[serde(default)]
    pub schedule: Option<String>,
    /// Only this run and its sub-agent runs (a run id).
    #[serde(default)]
    pub root: Option<String>,
    /// At most this many (default 50, at most 500).
    #[serde(default)]
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// Where the previous page ended (its `next_cursor`).
    #[serde(default)]
    pub cursor: Option<String>,
}

/// One run in a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunItem {
    /// The run's id.
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// Who submitted it.
    pub caller_id: Option<String>,
    /// The schedule that fired it (its caller is `schedule:NAME`).
    pub schedule: Option<String>,
    /// Its parent, for a sub-agent run.
    pub parent_run_id: Option<String>,
    /// `running`, or how it ended.
    pub status: String,
    /// Why it was killed, when it was.
    pub kill_reason: Option<String>,
    /// The error kind, when it did not end ok.
    pub error_kind: Option<String>,
    /// Unix ms it ended at (ended runs).
    pub finished_at: Option<u64>,
    /// Wall time in ms (ended runs), or its age (live runs).
    pub duration_ms: u64,
    /// Progress (live runs).
    pub live: Option<LiveView>,
}

impl RunItem {
    pub(crate) fn live(r: &LiveRun) -> Self {
        RunItem {
            run_id: r.run_id.to_string(),
            agent: r.agent.clone(),
            caller_id: r.caller_id.clone(),
            schedule: schedule_of(r.caller_id.as_deref()),
            parent_run_id: r.parent_run_id.map(|p| p.to_string()),
            status: "running".into(),
            kill_reason: None,
            error_kind: None,
            finished_at: None,
            duration_ms: r.age_ms,
            live: Some(LiveView {
                iteration: r.iteration,
                max_iterations: r.max_iterations,
                elapsed_ms: r.age_ms,
                tokens: r.tokens,
                tool_calls: r.tool_calls,
                cost_micros: r.cost_micros,
                last_decision: r.last_decision.clone(),
                awaiting_approval: r.awaiting_approval.iter().map(PendingView::from).collect(),
            }),
        }
    }

    pub(crate) fn ended(r: &RunSummary) -> Self {
        RunItem {
            run_id: r.run_id.to_string(),
            agent: r.agent.clone(),
            caller_id: r.caller_id.clone(),
            schedule: schedule_of(r.caller_id.as_deref()),
            parent_run_id: r.parent_run_id.map(|p| p.to_string()),
            status: r.status.to_string(),
            kill_reason: r.kill_reason.map(|k| k.to_string()),
            error_kind: r.error_kind.clone(),
            finished_at: Some(r.finished_at),
            duration_ms: r.duration_ms(),
            live: None,
        }
    }
}

/// The schedule of a run submitted by the scheduler (caller
/// `schedule:NAME`).
fn schedule_of(caller: Option<&str>) -> Option<String> {
    caller
        .and_then(|c| c.strip_prefix("schedule:"))
        .map(str::to_string)
}

/// A page of runs: live ones first (newest first), then ended ones (the
/// most recently ended first).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// The runs.
    pub runs: Vec<RunItem>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// `POST /v1/runs/{id}/steer`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SteerBody {
    /// The message injected before the run's next model call.
    pub text: String,
}

/// `POST /v1/runs/{id}/extend`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    /// Seconds to push the run's hard deadline back by (0 < s ≤ 86400).
    #[schema(exclusive_minimum = 0, maximum = 86400)]
    pub seconds: f64,
}

/// `POST /v1/runs/{id}/kill` (the body is optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KillBody {
    /// Recorded with the kill (default `operator`).
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /v1/runs/{id}/approve|deny` (the body is optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalBody {
    /// The waiting call decided on (default: every call the run waits
    /// for).
    #[serde(default)]
    pub call_id: Option<String>,
    /// Why (recorded with the decision; for a denial, what the model
    /// reads).
    #[serde(default)]
    pub note: Option<String>,
}

/// A decision was handed to the run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApprovalDecision {
    /// The run.
    pub run_id: String,
    /// `approve` or `deny`.
    pub action: String,
    /// The calls the decision covers.
    pub calls: Vec<PendingView>,
}

/// A command was handed to the run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Accepted {
    /// The run.
    pub run_id: String,
    /// `steer`, `extend`, `kill`, `cancel`.
    pub action: String,
}

/// An agent the server runs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentView {
    /// Its name (what `POST /v1/runs` takes).
    pub name: String,
    /// What it is for.
    pub description: Option<String>,
    /// Its model spec.
    pub model: String,
    /// The tools it may call.
    pub tools: Vec<String>,
    /// Each tool's effect class (`read`, `write`, `egress`, `unknown`),
    /// by tool name: what the tool declares, or the manifest's
    /// `tools_effects` where it names it. An agent whose MCP servers have
    /// not started yet lists its other tools only.
    #[serde(default)]
    pub tool_effects: std::collections::BTreeMap<String, String>,
}

impl AgentView {
    /// The view of one agent of the catalog.
    pub(crate) fn of(l: super::catalog::Listed<'_>) -> Self {
        let tool_effects = l
            .prepared
            .map(|a| {
                a.tool_effects()
                    .into_iter()
                    .map(|(name, e)| (name, e.as_str().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        AgentView {
            name: l.name.to_string(),
            description: l.spec.description.clone(),
            model: l.model,
            tools: l.spec.tools.clone(),
            tool_effects,
        }
    }
}

/// `GET /v1/agents`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentList {
    /// The agents, by name.
    pub agents: Vec<AgentView>,
    /// The manifests of `--agents` that were left out, and why.
    #[serde(default)]
    pub failed: Vec<super::catalog::FailedManifest>,
}

/// `GET /healthz`, `GET /readyz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, `ready`, or `draining`.
    pub status: String,
    /// Runs in flight.
    pub active_runs: u64,
    /// Agents loaded.
    pub agents: u64,
}

/// What a message does while another message of its session runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BusyMode {
    /// Refused at once: 409 `session_busy` (the default).
    #[default]
    Refuse,
    /// Waits for the other to end, then runs (messages run in the order
    /// they came).
    Wait,
}

/// `POST /v1/sessions`: a chat session with an agent the server knows.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The agent's name (one of `GET /v1/agents`).
    pub agent: String,
    /// The session's id (1 to 128 ASCII letters, digits, `-`, `_`, `.`,
    /// `:`; at most 110 for a caller who is not an admin); default: a new
    /// one. Ids are per caller: the id of one of your sessions reopens it,
    /// whatever other callers' sessions are called.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub id: Option<String>,
    /// What a message does while another runs (default `refuse`).
    #[serde(default)]
    pub on_busy: Option<BusyMode>,
}

/// `POST /v1/sessions/{id}/messages`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageBody {
    /// The user's message.
    #[schema(min_length = 1)]
    pub text: String,
}

/// Where a session is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Opened; no message has run yet.
    Created,
    /// A message's run is in flight.
    Running,
    /// Waiting for the next message.
    Idle,
    /// Closed: it takes no more messages; its history stays readable.
    Closed,
}

impl From<crate::ports::session::SessionState> for SessionStatus {
    fn from(s: crate::ports::session::SessionState) -> Self {
        use crate::ports::session::SessionState as S;
        match s {
            S::Created => SessionStatus::Created,
            S::Running => SessionStatus::Running,
            S::Idle => SessionStatus::Idle,
            S::Closed => SessionStatus::Closed,
        }
    }
}

/// One message of a session's history.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionMessageView {
    /// Its place in the history (0, 1, 2, …).
    pub seq: u32,
    /// `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The run that answered it.
    pub run_id: Option<String>,
    /// Unix ms when it was kept.
    pub at_ms: u64,
}

/// A session: its state and its history.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    /// The session's id.
    pub session_id: String,
    /// Its agent.
    pub agent: String,
    /// Who created it (who may use it).
    pub caller_id: Option<String>,
    /// Where it is in its lifecycle.
    pub state: SessionStatus,
    /// What a message does while another runs.
    pub on_busy: BusyMode,
    /// Unix ms when it was created.
    pub created_at: u64,
    /// Unix ms of its last change.
    pub updated_at: u64,
    /// Messages answered.
    pub prompts: u32,
    /// Tokens its runs used, all messages together.
    pub tokens: u64,
    /// The last message's run.
    pub last_run_id: Option<String>,
    /// The run of the message in flight.
    pub current_run_id: Option<String>,
    /// The history: every answered message and its answer, in order (a
    /// message whose run did not end `ok` is not kept).
    pub messages: Vec<SessionMessageView>,
}

/// `POST /v1/runs/{id}/fork`: the options of `agentvisor fork`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// Steps (model calls) 1 to `at_step` are taken from the recording.
    pub at_step: u32,
    /// The agent (of `GET /v1/agents`) to go on with; default: the
    /// recorded run's agent, by name.
    #[serde(default)]
    pub agent: Option<String>,
    /// The model to go on with (a model spec or a tier).
    #[serde(default)]
    pub model: Option<String>,
    /// The system prompt to go on with.
    #[serde(default)]
    pub system: Option<String>,
    /// The prompt (default: the recorded run's).
    #[serde(default)]
    pub prompt: Option<String>,
    /// The `critic:` section to go on with (an object, or YAML text;
    /// `"rules"`: the default section).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub critic_policy: Option<serde_json::Value>,
    /// Effect classes whose calls run live besides `read` (`write`,
    /// `egress`, `unknown`).
    #[serde(default)]
    pub live_tools: Vec<String>,
    /// The fork's own token budget.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub budget_tokens: Option<u64>,
}

/// `GET /v1/diff?a=ID&b=ID`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// Run A's id.
    pub a: String,
    /// Run B's id.
    pub b: String,
}
