//! The `ChatModel` port: one model call, request in, response (or a typed
//! provider error) out. Providers live in `crate::providers`; the run actor
//! sees only this trait.
//!
//! A call is a future the run actor spawns and can abort at any await, so a
//! provider must be cancel-safe: dropping the future abandons the request.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::run::Usage;
use super::tool::ToolSpec;

/// Who said a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The agent's instructions.
    System,
    /// The caller, or a steer injected by the critic.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

/// A tool call the model asked for. `arguments` is the raw JSON text the
/// model produced: it is parsed and validated before any tool runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRequest {
    /// The provider's call id (answered by the tool message with the same id).
    pub id: String,
    /// The tool name.
    pub name: String,
    /// Raw argument text, as sent by the model.
    pub arguments: String,
}

/// One transcript message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// The text.
    pub content: String,
    /// Tool calls (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallRequest>,
    /// The call answered (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with only text.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// Receives streamed text as it arrives (a chat bot shows it token by token).
pub type DeltaSink = Arc<dyn Fn(&str) + Send + Sync>;

/// One model call.
#[derive(Clone)]
pub struct ChatRequest {
    /// The transcript so far (shared: the run appends after the call ends).
    pub messages: Arc<Vec<Message>>,
    /// The tools the model may call.
    pub tools: Arc<[ToolSpec]>,
    /// 0-based index of this call within the run (the scripted model plays
    /// entry `call_index`).
    pub call_index: u32,
    /// A JSON Schema the final answer must follow, if any.
    pub response_schema: Option<Arc<Value>>,
    /// Where to stream text deltas, when someone listens.
    pub on_delta: Option<DeltaSink>,
}

/// What the model answered.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatResponse {
    /// Assistant text (may be empty when there are tool calls).
    pub text: String,
    /// Tool calls to run (in parallel) before the next model call.
    pub tool_calls: Vec<ToolCallRequest>,
    /// Token usage of this call.
    pub usage: Usage,
}

/// A provider error, typed so retries, circuit breakers and results can tell
/// them apart. Messages never carry a secret.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ModelError {
    /// 429: slow down (with the server's hint, if any).
    #[error("rate limited{}", .retry_after.map(|d| format!(" (retry after {} ms)", d.as_millis())).unwrap_or_default())]
    RateLimited {
        /// The server's `retry-after`, if it sent one.
        retry_after: Option<Duration>,
    },
    /// The account is out of quota: never retried.
    #[error("quota exhausted: {0}")]
    Quota(String),
    /// 5xx or an overloaded server.
    #[error("server error {status}: {message}")]
    Server {
        /// HTTP status (500 when not HTTP).
        status: u16,
        /// What it said (capped).
        message: String,
    },
    /// The request was refused as invalid (400/413).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The key was refused (401/403).
    #[error("authentication failed")]
    Auth,
    /// The response could not be understood.
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The connection failed or dropped.
    #[error("transport error: {0}")]
    Transport(String),
    /// The circuit breaker for this endpoint is open.
    #[error("circuit open for {0}")]
    CircuitOpen(String),
}

impl ModelError {
    /// Stable snake_case kind, used as the run's `error_kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            ModelError::RateLimited { .. } => "rate_limited",
            ModelError::Quota(_) => "quota",
            ModelError::Server { .. } => "server_error",
            ModelError::BadRequest(_) => "bad_request",
            ModelError::Auth => "auth",
            ModelError::Malformed(_) => "malformed_response",
            ModelError::Transport(_) => "transport",
            ModelError::CircuitOpen(_) => "circuit_open",
        }
    }
}

/// A chat model. Object-safe; used as `Arc<dyn ChatModel>`.
#[async_trait]
pub trait ChatModel: Send + Sync + 'static {
    /// The model's name, for results and logs (e.g. `scripted`, `openai:gpt-4o-mini`).
    fn name(&self) -> &str;

    /// Performs one call. Must be cancel-safe.
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError>;
}
