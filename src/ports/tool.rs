//! The `Tool` port: a named function with a JSON Schema for its arguments.
//! The registry in `crate::tools` validates arguments against the schema
//! before `call` ever runs, so a tool sees only an object that passed. What
//! the model is told about a tool, its [`ToolSpec`], is model vocabulary and
//! lives with the `ChatModel` port.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use tokio_util::sync::CancellationToken;

use super::event::RunEvent;
use super::model::ToolSpec;
use super::run::{RunId, RunResult};

/// Where a tool call's events go (the run's stream and audit log): set by
/// the run for calls that run in a task.
pub type ToolEvents = Arc<dyn Fn(RunEvent) + Send + Sync>;

/// What calling a tool does to the world outside the run: the class a
/// fork's effect policy reads (see `crate::fork`). Declared by each tool
/// ([`Tool::effect`]); a manifest may override it per tool
/// (`tools_effects: { NAME: read }`).
///
/// The wire names (`read`, `write`, `egress`, `unknown`) are a contract:
/// the manifest's key, `agentvisor mcp tools` and the API's tool catalog
/// show them.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ToolEffect {
    /// Reads only: calling it again changes nothing anywhere (a lookup, a
    /// computation).
    Read,
    /// Changes state the run's host or its services keep (a file, a
    /// database row).
    Write,
    /// Reaches the world outside (sends an e-mail, posts to a web API).
    Egress,
    /// Not said: taken as the most dangerous.
    #[default]
    Unknown,
}

impl ToolEffect {
    /// Every class, in a fixed order.
    pub const ALL: [ToolEffect; 4] = [
        ToolEffect::Read,
        ToolEffect::Write,
        ToolEffect::Egress,
        ToolEffect::Unknown,
    ];

    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolEffect::Read => "read",
            ToolEffect::Write => "write",
            ToolEffect::Egress => "egress",
            ToolEffect::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ToolEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ToolEffect {
    type Err = String;

    /// The class whose [`as_str`](ToolEffect::as_str) is `s`.
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown effect `{s}` (read, write, egress, unknown)"))
    }
}

/// What a tool knows about the call it serves.
#[derive(Clone)]
pub struct ToolContext {
    /// The run that made the call.
    pub run_id: RunId,
    /// The model's call id.
    pub call_id: Arc<str>,
    /// Fires when the run is killed or cancelled while the call runs.
    cancel: Option<CancellationToken>,
    /// Tells the run's critic the call is alive.
    beat: Option<Beater>,
    /// The run's hard deadline when the call started.
    deadline: Option<tokio::time::Instant>,
    /// Adds events to the run's stream.
    events: Option<ToolEvents>,
    /// The run itself, for a tool that [uses it](Tool::uses_run).
    run: Option<Arc<dyn RunAccess>>,
}

/// What a tool call calls to tell its run's critic it is alive.
pub type Beater = Arc<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("run_id", &self.run_id)
            .field("call_id", &self.call_id)
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl ToolContext {
    /// The context of a call of run `run_id` (no cancellation signal).
    pub fn new(run_id: RunId, call_id: Arc<str>) -> Self {
        ToolContext {
            run_id,
            call_id,
            cancel: None,
            beat: None,
            deadline: None,
            events: None,
            run: None,
        }
    }

    /// With the run's tools and its caller's runs (for a tool that
    /// [uses its run](Tool::uses_run)).
    pub fn with_run(mut self, run: Arc<dyn RunAccess>) -> Self {
        self.run = Some(run);
        self
    }

    /// The run that made the call: its tools and its caller's runs. Set
    /// only for a tool that [uses its run](Tool::uses_run).
    pub fn run(&self) -> Option<&Arc<dyn RunAccess>> {
        self.run.as_ref()
    }

    /// With a way to add events to the run's stream and audit log.
    pub fn with_events(mut self, events: ToolEvents) -> Self {
        self.events = Some(events);
        self
    }

    /// Adds an event to the run's stream and audit log (no arguments, no
    /// results, no secrets). A no-op for a call polled in place.
    pub fn event(&self, event: RunEvent) {
        if let Some(e) = &self.events {
            e(event);
        }
    }

    /// Whether the run listens for this call's [`beat`](Self::beat)s and
    /// [`event`](Self::event)s.
    pub fn listens(&self) -> bool {
        self.beat.is_some() || self.events.is_some()
    }

    /// With a heartbeat to the run's critic.
    pub fn with_beat(mut self, beat: Beater) -> Self {
        self.beat = Some(beat);
        self
    }

    /// With the run's hard deadline.
    pub fn with_deadline(mut self, deadline: tokio::time::Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Tells the run's critic the call is alive (progress of a long call:
    /// a call that beats is never `stalled`). A no-op for a call polled in
    /// place.
    pub fn beat(&self) {
        if let Some(b) = &self.beat {
            b();
        }
    }

    /// The run's hard deadline as it stood when the call started (a
    /// sub-agent's run starts capped at it, and then follows the run's
    /// deadline as it moves).
    pub fn deadline(&self) -> Option<tokio::time::Instant> {
        self.deadline
    }

    /// With the cancellation signal a stopped run fires.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Whether the run that made the call was stopped: the tool has the
    /// run's `kill_grace` from then on to clean up and return, after which
    /// its future is dropped.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.is_cancelled())
    }

    /// Resolves when the run that made the call is stopped (never, for a
    /// call without a signal: one polled in place answers at once).
    pub async fn cancelled(&self) {
        match &self.cancel {
            Some(c) => c.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// The cancellation token itself (to hand to a child task or client).
    pub fn cancel_token(&self) -> Option<&CancellationToken> {
        self.cancel.as_ref()
    }
}

/// A tool failure; its message goes back to the model as the tool result.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ToolError {
    /// No tool of that name is available to this run.
    #[error("unknown tool `{0}`")]
    UnknownTool(String),
    /// The arguments were not valid JSON, not an object, too large, or broke the schema.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
    /// The tool did not finish within the tool timeout.
    #[error("timed out after {0} ms")]
    Timeout(u64),
    /// The tool panicked.
    #[error("tool panicked: {0}")]
    Panicked(String),
    /// A failure of a kind the tool names itself (`mcp_server_crashed`,
    /// `mcp_tool_timeout`, …).
    #[error("{message}")]
    Typed {
        /// Stable snake_case kind.
        kind: &'static str,
        /// What happened (never a secret).
        message: String,
    },
}

/// The error kind of a call a tool guard denied (`guard:` in a manifest).
pub const GUARD_DENIED: &str = "guard_denied";

impl ToolError {
    /// Whether the call was refused before its tool ran: an unknown tool,
    /// bad arguments, or a denial by a guard or an operator
    /// (`approval_denied`). Calling again as is gets the same answer.
    pub fn is_refusal(&self) -> bool {
        match self {
            ToolError::UnknownTool(_) | ToolError::InvalidArguments(_) => true,
            ToolError::Typed { kind, .. } => *kind == GUARD_DENIED || *kind == "approval_denied",
            _ => false,
        }
    }

    /// Stable snake_case kind.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::UnknownTool(_) => "unknown_tool",
            ToolError::InvalidArguments(_) => "invalid_arguments",
            ToolError::Failed(_) => "tool_failed",
            ToolError::Timeout(_) => "tool_timeout",
            ToolError::Panicked(_) => "tool_panicked",
            ToolError::Typed { kind, .. } => kind,
        }
    }
}

/// A tool. Object-safe; used as `Arc<dyn Tool>`. `call` must be cancel-safe:
/// a killed run signals the call ([`ToolContext::cancelled`]), gives it the
/// run's `kill_grace`, then drops the future.
///
/// A call runs in a task of its own, off the critic shard that hosts the
/// run, unless the tool says it [answers at once](Tool::answers_at_once):
/// then its first poll runs in the run's handler on the shard. Long
/// synchronous work still belongs in `tokio::task::spawn_blocking` (it
/// would hold a runtime worker thread), but it cannot freeze other runs.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Name, description and argument schema.
    fn spec(&self) -> &ToolSpec;

    /// Runs the tool on arguments that already passed validation.
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<String, ToolError>;

    /// What calling it does outside the run ([`ToolEffect`]). Default
    /// `unknown`: a tool that does not say is taken as the most
    /// dangerous (a fork answers its calls from the recording).
    fn effect(&self) -> ToolEffect {
        ToolEffect::Unknown
    }

    /// Whether `call`'s first poll returns at once without blocking (pure
    /// computation on small input, or registering a timer): such a call is
    /// polled in place on the run's critic shard and costs no task. Say yes
    /// only if that holds for every input; default no.
    fn answers_at_once(&self) -> bool {
        false
    }

    /// The error of a call that ran out of its `timeout_ms` (the registry
    /// drops its future then). Default: [`ToolError::Timeout`]; a tool with
    /// its own kind of timeout (`mcp_tool_timeout`) says so here.
    fn timeout_error(&self, timeout_ms: u64) -> ToolError {
        ToolError::Timeout(timeout_ms)
    }

    /// Whether the tool works through the run that calls it (the built-in
    /// `wait`): its calls get [`ToolContext::run`], run in a task bounded
    /// by the run's deadline instead of the tool timeout (the calls it
    /// makes through the run get the tool timeout each). Default no.
    fn uses_run(&self) -> bool {
        false
    }

    /// The call a tool that [uses its run](Tool::uses_run) makes through
    /// it, as `args` name it (tool and arguments; `None`: none named, as a
    /// `wait` on a run): the run's guards and approvals check it at
    /// dispatch. Default `None`.
    fn call_through_run<'a>(&self, args: &'a Value) -> Option<(&'a str, Option<&'a Value>)> {
        let _ = args;
        None
    }
}

/// What a tool that [uses its run](Tool::uses_run) reaches through its
/// context: the run's own tools, called with the checks of a direct call,
/// and the runs of the run's caller. Implemented by the run.
#[async_trait]
pub trait RunAccess: Send + Sync + 'static {
    /// Calls one of the run's tools as the model's own call of it would
    /// be: a tool the run does not have is `unknown_tool`, arguments are
    /// validated against its schema, its guards apply (`max_calls`
    /// counts the call; a denial is recorded as the critic's), and a call
    /// that needs an operator is refused unless the run approved it when
    /// it dispatched the calling tool. Bounded by the tool timeout, its
    /// result capped as any result.
    async fn call_tool(&self, tool: &str, args: Value) -> Result<String, ToolError>;

    /// Waits for run `run_id` to end and gives its result: a child of the
    /// run, or any run of the same caller (live, or on record); another
    /// caller's run, the run itself or one of its ancestors is refused.
    async fn run_result(&self, run_id: RunId) -> Result<Arc<RunResult>, ToolError>;

    /// How often a call that waits should [beat](ToolContext::beat) so the
    /// run is not taken as stalled.
    fn beat_every(&self) -> std::time::Duration;
}
