//! The `ChatModel` port: one model call, request in, response (or a typed
//! provider error) out. Providers live in `crate::providers`; the run actor
//! sees only this trait.
//!
//! A call is a future the run actor spawns and can abort at any await, so a
//! provider must be cancel-safe: dropping the future abandons the request.
//!
//! Besides the transcript a request carries the agent's [`CallOptions`]
//! (sampling keys and `tool_choice`, passed through to the wire) and, for
//! models that stream, a [`CallObserver`]: every streamed piece is a sign
//! of life the run turns into a heartbeat for its critic, streamed text is
//! kept as the run's partial output, and a provider that falls back from
//! something the server refused says so through it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::run::Usage;

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

/// What a model is told about a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Unique name (`add`, `server__tool`, `agent__name`).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
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

/// A file or image handed to a run with its prompt
/// (`Invocation.attachments`, `agentvisor run --attach PATH`). It rides on
/// the first user message; providers that accept it send an image as an
/// image part (OpenAI `image_url` with a data URL, an Anthropic `image`
/// block) and a text file as text. See [`Attachment::check`] for the size cap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    /// File name (shown to the model with a text file).
    pub name: String,
    /// MIME type: `image/png`, `image/jpeg`, `image/gif`, `image/webp` are
    /// images; anything else is read as text.
    pub mime: String,
    /// The content: base64 for an image, the text itself otherwise.
    pub content: String,
}

/// The largest attachment: 5 MiB of file (an image's, decoded from its
/// base64; a text file's text), the Anthropic API's image limit.
pub const MAX_ATTACHMENT_BYTES: usize = 5 * 1024 * 1024;

/// The image types providers accept.
pub const IMAGE_MIME_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Why an attachment cannot be sent.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttachmentError {
    /// Larger than [`MAX_ATTACHMENT_BYTES`].
    #[error("attachment `{name}` is {bytes} bytes, over the {max} byte cap")]
    TooLarge {
        /// Its name.
        name: String,
        /// Its size.
        bytes: usize,
        /// The cap.
        max: usize,
    },
    /// An image whose content is not base64, or of a type no provider takes.
    #[error("attachment `{name}`: {why}")]
    Invalid {
        /// Its name.
        name: String,
        /// What is wrong.
        why: String,
    },
}

impl Attachment {
    /// Whether it is an image (sent as an image part, else as text).
    pub fn is_image(&self) -> bool {
        self.mime.starts_with("image/")
    }

    /// An attachment made from a file's bytes: a PNG, JPEG, GIF or WebP
    /// image (recognised by its first bytes) is base64-encoded, UTF-8 text
    /// is kept as text; anything else, or more than
    /// [`MAX_ATTACHMENT_BYTES`], is refused.
    pub fn from_bytes(name: impl Into<String>, bytes: &[u8]) -> Result<Self, AttachmentError> {
        let name = name.into();
        if bytes.len() > MAX_ATTACHMENT_BYTES {
            return Err(AttachmentError::TooLarge {
                name,
                bytes: bytes.len(),
                max: MAX_ATTACHMENT_BYTES,
            });
        }
        let image = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some("image/png")
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some("image/jpeg")
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some("image/gif")
        } else if bytes.len() > 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
            Some("image/webp")
        } else {
            None
        };
        if let Some(mime) = image {
            return Ok(Attachment {
                name,
                mime: mime.to_string(),
                content: base64(bytes),
            });
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(Attachment {
                name,
                mime: "text/plain".to_string(),
                content: text.to_string(),
            }),
            Err(_) => Err(AttachmentError::Invalid {
                name,
                why: "not text, and not a PNG, JPEG, GIF or WebP image".into(),
            }),
        }
    }

    /// Checks the size cap and, for an image, its type and base64 content.
    pub fn check(&self) -> Result<(), AttachmentError> {
        let bytes = if self.is_image() {
            self.content.len() / 4 * 3
        } else {
            self.content.len()
        };
        if bytes > MAX_ATTACHMENT_BYTES {
            return Err(AttachmentError::TooLarge {
                name: self.name.clone(),
                bytes,
                max: MAX_ATTACHMENT_BYTES,
            });
        }
        if self.is_image() {
            if !IMAGE_MIME_TYPES.contains(&self.mime.as_str()) {
                return Err(AttachmentError::Invalid {
                    name: self.name.clone(),
                    why: format!(
                        "image type `{}` is not one of {}",
                        self.mime,
                        IMAGE_MIME_TYPES.join(", ")
                    ),
                });
            }
            let base64ish = self.content.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'\n' | b'\r')
            });
            if !base64ish || self.content.is_empty() {
                return Err(AttachmentError::Invalid {
                    name: self.name.clone(),
                    why: "an image's content must be base64".into(),
                });
            }
        }
        Ok(())
    }

    /// The text a provider sends for a text attachment.
    pub fn as_text(&self) -> String {
        format!("[Attached file `{}`]\n{}", self.name, self.content)
    }
}

/// Standard base64 (with padding), for images.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
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
    /// Files and images that come with it (user messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

impl Message {
    /// A message with only text.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            attachments: Vec::new(),
        }
    }
}

/// Which tool the model must call, as a manifest's `tool_choice` says:
/// `auto` (the default, sent whenever tools are: some servers ignore the
/// tools without it), `required`, `none`, or a tool's name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must not call a tool.
    None,
    /// The model must call this tool.
    Tool(String),
}

impl ToolChoice {
    /// The manifest's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            ToolChoice::Auto => "auto",
            ToolChoice::Required => "required",
            ToolChoice::None => "none",
            ToolChoice::Tool(name) => name,
        }
    }
}

impl Serialize for ToolChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.trim() {
            "auto" => ToolChoice::Auto,
            "required" | "any" => ToolChoice::Required,
            "none" => ToolChoice::None,
            "" => return Err(serde::de::Error::custom("`tool_choice` must not be empty")),
            name => ToolChoice::Tool(name.to_string()),
        })
    }
}

/// How every call of an agent is made: the manifest's sampling keys and
/// `tool_choice`, passed through to both providers (Anthropic has no
/// `seed`: it is left out there). Unset keys are not sent, so the server's
/// defaults apply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallOptions {
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// The reply's token cap.
    pub max_tokens: Option<u32>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Which tool the model must call (sent only with tools).
    pub tool_choice: ToolChoice,
}

/// Told about a call as it goes (see the module doc). Every method has a
/// default that does nothing, so an observer implements what it needs.
pub trait CallObserver: Send + Sync {
    /// Content arrived from the server: a streamed chunk that carries some
    /// (text, a tool-call part, reasoning, usage) or a whole body. A sign
    /// of life, and the end of the wait for the first token. Keep-alives
    /// (SSE comments, empty deltas, `ping` events) are not reported.
    fn alive(&self) {}

    /// Streamed answer text (already redacted), as the listener gets it.
    fn text(&self, _piece: &str) {}

    /// The server reported the call's usage, or part of it, mid-stream
    /// (a usage chunk): a call cut before its end is charged it.
    fn usage(&self, _usage: &crate::ports::run::Usage) {}

    /// The call went on despite something (`kind` is a stable snake_case
    /// name such as `response_format_unsupported`).
    fn warning(&self, _kind: &str, _message: &str) {}
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
    /// The agent's sampling keys and tool choice (`None`: the defaults).
    pub options: Option<Arc<CallOptions>>,
    /// Told about streamed pieces and fallbacks (models that stream).
    pub observer: Option<Arc<dyn CallObserver>>,
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
            options: None,
            observer: None,
        }
    }

    /// The tool choice to send (`auto` unless the options say otherwise).
    pub fn tool_choice(&self) -> &ToolChoice {
        static AUTO: ToolChoice = ToolChoice::Auto;
        self.options.as_ref().map_or(&AUTO, |o| &o.tool_choice)
    }

    /// Tells the observer, if any, that something arrived.
    pub fn alive(&self) {
        if let Some(o) = &self.observer {
            o.alive();
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
    /// Why the model stopped, in the provider's words (`stop`,
    /// `tool_calls`, `length`; Anthropic's `end_turn`, `tool_use`,
    /// `max_tokens`); `None` when it did not say.
    pub finish_reason: Option<String>,
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
    /// The server answered 200 but its body ended before the response was
    /// whole: an empty body, a stream with no event or without its last
    /// word. The server is up and chose to stop, so this says more about
    /// the request than about the endpoint (a circuit breaker weighs it as
    /// the request's fault). Retried, as a flaky server may finish next time.
    #[error("incomplete response: {0}")]
    Incomplete(String),
    /// The circuit breaker for this endpoint is open.
    #[error("circuit open for {0}")]
    CircuitOpen(String),
    /// The stream failed after it had delivered text to the listener: the
    /// caller has seen part of an answer, so the call is never retried. The
    /// kind is the cause's.
    #[error("stream interrupted after content: {0}")]
    Interrupted(Box<ModelError>),
}

/// Whose fault a [`ModelError`] is ([`ModelError::blame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Blame {
    /// The endpoint's: it is down or overloaded for every request.
    Endpoint,
    /// Possibly the request's: the endpoint answered this request badly.
    Request,
    /// No one's: the endpoint is alive and refused the request or key.
    Nobody,
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
            ModelError::Incomplete(_) => "incomplete_response",
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
            ModelError::RateLimited { .. }
                | ModelError::Server { .. }
                | ModelError::Transport(_)
                | ModelError::Incomplete(_)
        )
    }

    /// Whether this error says the endpoint itself is unhealthy, whatever
    /// was asked of it ([`Blame::Endpoint`]).
    pub fn is_endpoint_failure(&self) -> bool {
        self.blame() == Blame::Endpoint
    }

    /// Whose fault this error is, as a circuit breaker weighs it:
    ///
    /// - [`Blame::Endpoint`]: the endpoint is down or overloaded, whatever
    ///   the request: the connection failed or timed out (`Transport`),
    ///   a 408, 502, 503, 504 or 529, a rate limit, an exhausted quota.
    /// - [`Blame::Request`]: the endpoint answered, and the answer may
    ///   depend on what it was asked: any other 5xx (a 500 that chokes on
    ///   something in the request), a 200 that ended early or empty
    ///   (`Incomplete`), an answer that could not be read.
    /// - [`Blame::Nobody`]: a refused request or key (the endpoint is
    ///   alive and said why), an open circuit.
    pub fn blame(&self) -> Blame {
        match self {
            ModelError::RateLimited { .. } | ModelError::Quota(_) | ModelError::Transport(_) => {
                Blame::Endpoint
            }
            ModelError::Server { status, .. } => match status {
                408 | 502 | 503 | 504 | 529 => Blame::Endpoint,
                _ => Blame::Request,
            },
            ModelError::Malformed(_) | ModelError::Incomplete(_) => Blame::Request,
            ModelError::Interrupted(cause) => cause.blame(),
            ModelError::BadRequest(_) | ModelError::Auth | ModelError::CircuitOpen(_) => {
                Blame::Nobody
            }
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

/// A chat model. Object-safe; used as `Arc<dyn ChatModel>`. A model that
/// wraps another implements [`ModelWrapper`] instead, which forwards every
/// capability below by default.
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

    /// Whether this model streams and reports through the request's
    /// `observer` (the HTTP providers do; a wrapper answers for what it
    /// wraps). A run builds an observer only for a model that does, and
    /// only such a run has a first-token phase (`first_token_timeout`).
    fn streams(&self) -> bool {
        false
    }

    /// Whether a run on this model must bring something to answer (a
    /// prompt, inputs or an attachment): a real provider would be sent an
    /// empty user message, which servers refuse or choke on, so the host
    /// refuses such a run before any call (the HTTP providers say yes; a
    /// wrapper answers for what it wraps). Default no: the scripted model
    /// plays its script whatever the input.
    fn needs_input(&self) -> bool {
        false
    }
}

/// A decorator of a [`ChatModel`] (a retry layer, a circuit breaker, fault
/// injection, a session's call numbering): it changes how calls are made
/// and forwards everything else to the model it wraps, in the spirit of
/// tower's `Layer`. Every `ModelWrapper` is a [`ChatModel`] (the blanket
/// impl below); each capability defaults to asking [`inner`](Self::inner),
/// so a wrapper overrides only what it changes and cannot forget a
/// capability. A capability added to `ChatModel` is added here too, with a
/// default that asks `inner()`, and forwarded by the blanket impl.
#[async_trait]
pub trait ModelWrapper: Send + Sync + 'static {
    /// The model this one wraps.
    fn inner(&self) -> &dyn ChatModel;

    /// Performs one call (usually through `inner()`). Must be cancel-safe.
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError>;

    /// See [`ChatModel::name`]; default: the wrapped model's.
    fn name(&self) -> &str {
        self.inner().name()
    }

    /// See [`ChatModel::admit`]; default: the wrapped model's.
    fn admit(&self) -> Result<(), ModelError> {
        self.inner().admit()
    }

    /// See [`ChatModel::price_id`]; default: the wrapped model's.
    fn price_id(&self) -> Option<&str> {
        self.inner().price_id()
    }

    /// See [`ChatModel::answers_at_once`]; default: the wrapped model's.
    fn answers_at_once(&self) -> bool {
        self.inner().answers_at_once()
    }

    /// See [`ChatModel::reports_retries`]; default: the wrapped model's.
    fn reports_retries(&self) -> bool {
        self.inner().reports_retries()
    }

    /// See [`ChatModel::streams`]; default: the wrapped model's.
    fn streams(&self) -> bool {
        self.inner().streams()
    }

    /// See [`ChatModel::needs_input`]; default: the wrapped model's.
    fn needs_input(&self) -> bool {
        self.inner().needs_input()
    }
}

/// Every wrapper is a model: each capability is the wrapper's answer,
/// which is the wrapped model's unless the wrapper overrides it. `complete`
/// hands on the wrapper's boxed future as it is (no second allocation).
impl<W: ModelWrapper> ChatModel for W {
    fn name(&self) -> &str {
        ModelWrapper::name(self)
    }

    fn complete<'life0, 'async_trait>(
        &'life0 self,
        request: ChatRequest,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<ChatResponse, ModelError>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        ModelWrapper::complete(self, request)
    }

    fn admit(&self) -> Result<(), ModelError> {
        ModelWrapper::admit(self)
    }

    fn price_id(&self) -> Option<&str> {
        ModelWrapper::price_id(self)
    }

    fn answers_at_once(&self) -> bool {
        ModelWrapper::answers_at_once(self)
    }

    fn reports_retries(&self) -> bool {
        ModelWrapper::reports_retries(self)
    }

    fn streams(&self) -> bool {
        ModelWrapper::streams(self)
    }

    fn needs_input(&self) -> bool {
        ModelWrapper::needs_input(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn base64_matches_the_standard() {
        for (raw, enc) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foobar", "Zm9vYmFy"),
            (&[0xFF, 0xEE, 0x00, 0x01], "/+4AAQ=="),
        ] {
            assert_eq!(base64(raw), enc);
        }
    }

    #[test]
    fn attachments_are_typed_capped_and_checked() {
        let png = [b"\x89PNG\r\n\x1a\n".as_slice(), &[0u8; 20]].concat();
        let a = Attachment::from_bytes("a.png", &png).unwrap();
        assert_eq!(a.mime, "image/png");
        assert!(a.is_image() && a.check().is_ok());
        let t = Attachment::from_bytes("notes.txt", "héllo".as_bytes()).unwrap();
        assert_eq!(
            (t.mime.as_str(), t.content.as_str()),
            ("text/plain", "héllo")
        );
        assert!(t.as_text().contains("notes.txt"));
        let bin = Attachment::from_bytes("x.bin", &[0xC3, 0x28, 0, 1]).unwrap_err();
        assert!(bin.to_string().contains("x.bin"), "{bin}");
        let big = vec![b'a'; MAX_ATTACHMENT_BYTES + 1];
        let e = Attachment::from_bytes("big.txt", &big).unwrap_err();
        assert!(matches!(e, AttachmentError::TooLarge { .. }), "{e}");
        let bad = Attachment {
            name: "i.png".into(),
            mime: "image/png".into(),
            content: "not base64!".into(),
        };
        assert!(bad.check().is_err());
        let tiff = Attachment {
            mime: "image/tiff".into(),
            content: "AAAA".into(),
            ..bad
        };
        assert!(tiff.check().unwrap_err().to_string().contains("image/tiff"));
    }
}
