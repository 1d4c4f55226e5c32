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
    /// Shared text: a call's id and name are referred to by its events, its
    /// step record and its tool message, copied by a reference count.
    pub id: Arc<str>,
    /// The tool name.
    pub name: Arc<str>,
    /// Raw argument text, as sent by the model.
    pub arguments: Arc<str>,
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
    pub tool_call_id: Option<Arc<str>>,
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

/// Told about each retry before its backoff sleep: the error that is retried
/// and how long the retry layer waits. The run turns it into a heartbeat
/// the critic sees and a `model.retry` event.
pub type RetrySink = Arc<dyn Fn(&ModelError, Duration) + Send + Sync>;

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
    /// The run's hard deadline, when known: a retry layer never sleeps past it.
    pub deadline: Option<tokio::time::Instant>,
    /// Told about each retry (a heartbeat for the critic).
    pub on_retry: Option<RetrySink>,
}

impl ChatRequest {
    /// A request with no schema, no listeners and no deadline.
    pub fn new(messages: Arc<Vec<Message>>, tools: Arc<[ToolSpec]>, call_index: u32) -> Self {
        ChatRequest {
            messages,
            tools,
            call_index,
            response_schema: None,
            on_delta: None,
            deadline: None,
            on_retry: None,
        }
    }
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
    /// The stream failed after it had delivered text to the listener: the
    /// caller has seen part of an answer, so the call is never retried. The
    /// kind is the cause's.
    #[error("stream interrupted after content: {0}")]
    Interrupted(Box<ModelError>),
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
            ModelError::Interrupted(cause) => cause.kind(),
        }
    }

    /// Whether a retry may help: a 429, a 408/409/5xx/529, or a connection
    /// that failed before any content. Never a quota error, a refused
    /// request, a refused key, a response we could not read, an open
    /// circuit or a stream that already delivered content.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ModelError::RateLimited { .. } | ModelError::Server { .. } | ModelError::Transport(_)
        )
    }

    /// Whether this error says the endpoint is unhealthy (what a circuit
    /// breaker counts): rate limits, quota, server and transport errors,
    /// unreadable responses. A refused request or key says nothing about
    /// the endpoint.
    pub fn is_endpoint_failure(&self) -> bool {
        match self {
            ModelError::RateLimited { .. }
            | ModelError::Quota(_)
            | ModelError::Server { .. }
            | ModelError::Malformed(_)
            | ModelError::Transport(_) => true,
            ModelError::Interrupted(cause) => cause.is_endpoint_failure(),
            ModelError::BadRequest(_) | ModelError::Auth | ModelError::CircuitOpen(_) => false,
        }
    }

    /// The server's retry hint, if it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ModelError::RateLimited { retry_after } => *retry_after,
            _ => None,
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

    /// A cheap admission check before a run is started on this model: an
    /// open circuit breaker refuses here, so the run is `rejected` at once.
    fn admit(&self) -> Result<(), ModelError> {
        Ok(())
    }

    /// The model id to price this model's usage by (see `crate::pricing`),
    /// or `None` for a model that costs nothing (scripted, local, a test
    /// double). A priced model missing from the table costs 0 and the run
    /// gets a warning event.
    fn price_id(&self) -> Option<&str> {
        None
    }

    /// Whether `complete`'s first poll returns at once without blocking
    /// (a scripted or cached answer, or a timer registered): such a call is
    /// polled in place on the run's critic shard and costs no task. Every
    /// network provider says no (its first poll encodes the request and
    /// connects); a wrapper answers for what it wraps. Default no.
    fn answers_at_once(&self) -> bool {
        false
    }

    /// Whether this model reports the retries it makes through the
    /// request's `on_retry` (the retry layer does; a wrapper answers for
    /// what it wraps). A run builds that sink only for a model that does.
    fn reports_retries(&self) -> bool {
        false
    }
}
