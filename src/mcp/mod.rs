//! MCP servers as tool sources: a manifest's `mcp.servers` become tools
//! named `<server>__<tool>` that any run of the agent may call.
//!
//! # Guarantees
//! - **Shared, supervised servers.** A `scope: host` server (the default)
//!   runs once per host and definition, however many runs use it; a
//!   `scope: run` server runs once per run that calls it and is stopped when
//!   that run ends. Each server is an actor (`actors::mcp`) that starts it
//!   (10 s start timeout), restarts it with backoff when it crashes (after
//!   5 restarts within 60 s its calls fail `mcp_server_crashed` until a
//!   cool-down ends), and stops it: stdin closed → 200 ms → SIGTERM to its
//!   process group → 5 s → SIGKILL.
//! - **No orphan process.** A stdio server leads its own process group,
//!   which every stop signals whole; it gets `SIGKILL` when the thread that
//!   started it ends (Linux `PR_SET_PDEATHSIG`, set on a thread that lives
//!   as long as the process) and reads EOF on stdin when the host process
//!   dies; dropping the host kills the groups it left running.
//! - **Calls are tool calls.** Under the run's `tool_timeout`, in parallel
//!   within a step, cancellable: a timeout, kill or cancel sends the server
//!   `notifications/cancelled` for that request. A server's
//!   `notifications/progress` is a heartbeat of the run's critic. An
//!   answer over 16 MiB (`max_message_bytes`) fails its call at once,
//!   `mcp_result_too_large`, and costs the host no more than the limit.
//! - **No secret leaks.** A stdio child gets `PATH`, `HOME`, `LANG`, `TZ`
//!   and what its entry names; a secret only by `{ secret: NAME }`
//!   (`AGENTVISOR_SECRET_NAME`), scrubbed from the server's stderr tail.
//!   Events carry no arguments, results or secret values.
//!
//! The manifest types ([`crate::spec::mcp`]) and [`McpConfig`] are plain data, built
//! with every feature set; the client needs the `mcp` feature.

/// The manifest's `mcp:` key (it is the manifest's: see [`crate::spec::mcp`]).
pub use crate::spec::mcp as spec;

#[cfg(feature = "mcp")]
pub(crate) mod client;
#[cfg(feature = "mcp")]
pub mod env;
#[cfg(feature = "mcp")]
pub(crate) mod framing;
#[cfg(feature = "mcp")]
pub(crate) mod names;
#[cfg(feature = "mcp")]
pub(crate) mod process;
#[cfg(feature = "mcp")]
pub(crate) mod result;
#[cfg(feature = "mcp")]
pub(crate) mod tool;

use std::sync::Arc;
use std::time::Duration;

/// One MCP tool as a prepared agent holds it: which server it comes from
/// (by the server's manifest name), its own name there, and the tool its
/// runs call. A sub-agent's MCP tools are picked from its parent's by the
/// first two (see `host::palette`).
#[derive(Clone)]
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) struct ServedTool {
    /// The server's manifest name.
    pub(crate) server: Arc<str>,
    /// The tool's name on the server (before `<server>__` naming).
    pub(crate) remote: Arc<str>,
    /// The tool runs call.
    pub(crate) tool: crate::dispatch::CompiledTool,
}

/// How a host runs its MCP servers. Every field has a default (the values
/// in the module docs); tests shorten them.
#[derive(Clone, Debug)]
pub struct McpConfig {
    /// From spawn (or connect) to the server's tool list, at most.
    pub start_timeout: Duration,
    /// Restarts within `restart_window` before the server cools down.
    pub max_restarts: u32,
    /// The window restarts are counted in.
    pub restart_window: Duration,
    /// How long a crash-looping server's calls fail before it may start again.
    pub cool_down: Duration,
    /// The first restart's backoff (doubled per restart in the window).
    pub backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
    /// From closing a stopping server's stdin to SIGTERM.
    pub stdin_grace: Duration,
    /// From SIGTERM to SIGKILL.
    pub term_grace: Duration,
    /// The bytes of a server's stderr kept for error messages.
    pub stderr_tail: usize,
    /// The largest message a stdio server may send, in bytes: a larger
    /// answer fails its call at once (`mcp_result_too_large`) and is read
    /// past without being held (see `framing`).
    pub max_message_bytes: usize,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            start_timeout: Duration::from_secs(10),
            max_restarts: 5,
            restart_window: Duration::from_secs(60),
            cool_down: Duration::from_secs(60),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            stdin_grace: Duration::from_millis(200),
            term_grace: Duration::from_secs(5),
            stderr_tail: 1024,
            max_message_bytes: 16 * 1024 * 1024,
        }
    }
}

/// An MCP failure. [`kind`](McpError::kind) is the `error_kind` of the tool
/// result, or of the run when it cannot start. No variant carries a secret
/// value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server did not start, or did not list its tools in time.
    #[error("mcp server `{server}` did not start: {reason}{}", tail_suffix(.stderr_tail))]
    StartFailed {
        /// The server's manifest name.
        server: String,
        /// Why.
        reason: String,
        /// The last of its stderr.
        stderr_tail: String,
    },
    /// The server crashed (during the call, or too often: cooling down).
    #[error("mcp server `{server}` crashed: {reason}{}", tail_suffix(.stderr_tail))]
    Crashed {
        /// The server's manifest name.
        server: String,
        /// What is known.
        reason: String,
        /// The last of its stderr.
        stderr_tail: String,
    },
    /// The call ran out of the run's `tool_timeout`.
    #[error("mcp tool `{tool}` timed out after {ms} ms")]
    ToolTimeout {
        /// The tool as the model sees it.
        tool: String,
        /// The timeout.
        ms: u64,
    },
    /// `allow:` names a tool the server does not have, or the server lists
    /// a tool whose name cannot be called.
    #[error("mcp server `{server}`: {message}")]
    InvalidName {
        /// The server's manifest name.
        server: String,
        /// Which name and why.
        message: String,
    },
    /// The run was killed or cancelled while the call ran.
    #[error("mcp tool `{tool}` call cancelled: the run was stopped")]
    Cancelled {
        /// The tool as the model sees it.
        tool: String,
    },
    /// The server's answer to the call is larger than
    /// [`McpConfig::max_message_bytes`].
    #[error(
        "mcp tool `{tool}` answered with more than {limit_bytes} bytes (the limit of one message)"
    )]
    ResultTooLarge {
        /// The tool as the model sees it.
        tool: String,
        /// The limit.
        limit_bytes: u64,
    },
    /// An `env:` or `headers:` value could not be resolved.
    #[error("mcp server `{server}`: `{key}` names secret `{secret}`, but {variable} is not set")]
    EnvResolve {
        /// The server's manifest name.
        server: String,
        /// The variable or header.
        key: String,
        /// The secret's name.
        secret: String,
        /// The variable read.
        variable: String,
    },
    /// This build has no MCP client, or the agent needs async preparation.
    #[error("{0}")]
    Unavailable(String),
}

fn tail_suffix(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!(" (stderr: {})", tail.trim())
    }
}

impl McpError {
    /// Stable snake_case kind.
    pub fn kind(&self) -> &'static str {
        match self {
            McpError::StartFailed { .. } => "mcp_server_start_failed",
            McpError::Crashed { .. } => "mcp_server_crashed",
            McpError::ToolTimeout { .. } => "mcp_tool_timeout",
            McpError::InvalidName { .. } => "mcp_tool_invalid_name",
            McpError::Cancelled { .. } => "mcp_call_cancelled",
            McpError::ResultTooLarge { .. } => "mcp_result_too_large",
            McpError::EnvResolve { .. } => "mcp_env_resolve",
            McpError::Unavailable(_) => "mcp_unavailable",
        }
    }

    /// As a tool error (its kind kept).
    pub fn into_tool_error(self) -> crate::ports::tool::ToolError {
        crate::ports::tool::ToolError::Typed {
            kind: self.kind(),
            message: self.to_string(),
        }
    }
}
