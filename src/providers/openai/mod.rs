//! The OpenAI Chat Completions provider, for OpenAI and every server that
//! speaks its protocol (llama.cpp, vLLM, Ollama, LM Studio).
//!
//! # Wire
//!
//! `POST {base_url}/chat/completions` (the base ends in `/v1`, as the
//! OpenAI SDKs write `OPENAI_BASE_URL`) with `model`, `messages` (system,
//! user — with image parts and text files when it has attachments —,
//! assistant with `tool_calls` and `content: ""`, never `null`, which some
//! servers answer with a 500; tool with `tool_call_id`), `tools` (functions,
//! left out when there are none) with `tool_choice` (`auto` unless the
//! manifest says otherwise: some servers ignore tools without it), the
//! manifest's `temperature`, `max_tokens`, `top_p`, `seed` and `stop` when
//! set, and, when the request carries a schema, `response_format: {type:
//! json_schema}`. The key goes in `Authorization: Bearer`, marked
//! sensitive; no key is sent when there is none (local servers).
//!
//! # Structured output fallback
//!
//! A request that carries a schema asks for it in three ways, each tried
//! when the one before is refused — a 4xx, or a 5xx to a call that carries
//! it while no call with it has succeeded here:
//!
//! 1. `response_format: {type: json_schema, json_schema: {name, schema}}`
//!    (OpenAI, vLLM, llama.cpp's own server);
//! 2. `response_format: {type: json_object, schema}`, which
//!    llama-cpp-python constrains by a grammar built from the schema;
//! 3. the schema in the system prompt (the run validates the answer and
//!    repairs it either way).
//!
//! The next way is tried at once, within the same call. A refusal is
//! remembered for this model (one per endpoint and model on a host), so
//! later calls start where the last refusal left them, and every run that
//! uses a fallback gets a `response_format_unsupported` warning.
//!
//! # Streaming fallback
//!
//! Some servers cannot stream some requests: llama-cpp-python's
//! `chatml-function-calling` format answers a streamed request that has
//! tools and `tool_choice` `auto` or `required` with a 200 and an empty
//! body. A streamed answer that ends with no event at all (an empty or
//! unreadable body, or a connection closed before any byte) is asked again
//! at once without streaming (`stream: false`, the plain JSON answer with
//! its tool calls and usage). Once that works, the fallback is remembered
//! for this model and request shape — whether it has tools and which
//! `tool_choice`, and how it asks for a schema — so later calls of that
//! shape go unstreamed from the start (calls of other shapes still
//! stream), and every run that makes such a call gets a
//! `streaming_unsupported` warning (its text arrives whole, not as deltas).
//!
//! # Leniency
//!
//! Our own serde types accept what real servers send: `content` null or
//! missing, tool calls without an id (one is made up: `call_{index}_{j}`),
//! `arguments` as an object instead of a string, usage missing. A server
//! that reports no usage (many local ones, when streaming) gets an estimate
//! (see `http::estimate_usage`), marked `estimated`, with a `usage_estimated`
//! warning to the observer. Arguments are passed on as raw text (redacted):
//! arguments that are not JSON reach the run, which gives the model a typed
//! tool error.
//!
//! This module does one call (its answer is read by `response`); retries
//! and the circuit breaker wrap it (`super::retry`, `super::breaker`).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use serde_json::{json, Value};

pub use super::http::StreamMode;
use super::http::{self, Secret};
use super::sse::StreamStats;
use crate::ports::model::{
    ChatModel, ChatRequest, ChatResponse, Message, ModelError, Role, ToolChoice,
};

mod response;

use response::{parse_plain, read_stream};

/// The public OpenAI endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How to reach one model.
#[derive(Clone, Debug)]
pub struct OpenAiConfig {
    /// The name in results and logs (`openai:gpt-4o-mini`, `ollama:llama3.2`).
    pub name: String,
    /// The model id sent on the wire.
    pub model: String,
    /// The API base, ending before `/chat/completions`.
    pub base_url: String,
    /// The key, if the server wants one.
    pub api_key: Option<Secret>,
    /// When to stream.
    pub stream: StreamMode,
    /// Whether usage is priced from the price table (not for local servers).
    pub priced: bool,
}

impl OpenAiConfig {
    /// A config for `model` at `base_url`, no key, named `openai:MODEL`.
    pub fn new(model: impl Into<String>, base_url: impl Into<String>) -> Self {
        let model = model.into();
        OpenAiConfig {
            name: format!("openai:{model}"),
            model,
            base_url: base_url.into(),
            api_key: None,
            stream: StreamMode::default(),
            priced: true,
        }
    }
}

/// A [`ChatModel`] over Chat Completions.
pub struct OpenAiModel {
    config: OpenAiConfig,
    url: String,
    /// The URL as errors show it.
    endpoint: String,
    client: reqwest::Client,
    /// How a schema is asked for (a [`Format`] as `u8`): where the last
    /// refusal left it.
    schema_format: AtomicU8,
    /// A call with `response_format` succeeded: a later 5xx is not blamed on it.
    schema_ok: AtomicBool,
    /// The request shapes this server cannot stream.
    unstreamable: Mutex<Vec<Shape>>,
}

/// How a request asks for its response schema (see "Structured output
/// fallback"), in the order they are tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// No schema asked for.
    None,
    /// `response_format: {type: json_schema}`.
    JsonSchema,
    /// `response_format: {type: json_object, schema}`.
    JsonObject,
    /// The schema in the system prompt.
    Prompt,
}

impl Format {
    fn from_u8(v: u8) -> Format {
        match v {
            0 => Format::JsonSchema,
            1 => Format::JsonObject,
            _ => Format::Prompt,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Format::None | Format::JsonSchema => 0,
            Format::JsonObject => 1,
            Format::Prompt => 2,
        }
    }

    /// Whether it goes in `response_format`.
    fn in_body(self) -> bool {
        matches!(self, Format::JsonSchema | Format::JsonObject)
    }

    /// The way to try once this one is refused.
    fn next(self) -> Format {
        match self {
            Format::JsonSchema => Format::JsonObject,
            _ => Format::Prompt,
        }
    }
}

/// What a request's answer may depend on when a server cannot stream it
/// (see "Streaming fallback"): its `tool_choice` when it has tools (`0`
/// auto, `1` required, `2` none, `3` a named tool), and how it asks for a
/// schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    tools: Option<u8>,
    format: Format,
}

impl Shape {
    fn of(request: &ChatRequest, format: Format) -> Shape {
        let tools = (!request.tools.is_empty()).then(|| match request.tool_choice() {
            ToolChoice::Auto => 0,
            ToolChoice::Required => 1,
            ToolChoice::None => 2,
            ToolChoice::Tool(_) => 3,
        });
        Shape { tools, format }
    }

    /// In words, for warnings.
    fn describe(&self) -> String {
        let tools = match self.tools {
            None => "no tools",
            Some(0) => "tools and `tool_choice: auto`",
            Some(1) => "tools and `tool_choice: required`",
            Some(2) => "tools and `tool_choice: none`",
            Some(_) => "tools and a named `tool_choice`",
        };
        let format = match self.format {
            Format::None | Format::Prompt => "",
            Format::JsonSchema => ", `response_format: json_schema`",
            Format::JsonObject => ", `response_format: json_object`",
        };
        format!("{tools}{format}")
    }
}

/// What one exchange saw of its answer, whatever it ended with.
#[derive(Debug, Default)]
struct Seen {
    /// A success status came back.
    ok_status: bool,
    /// The body as it came (a stream's events, or a plain body's bytes).
    stats: StreamStats,
}

impl OpenAiModel {
    /// A model with its own connection pool.
    pub fn new(config: OpenAiConfig) -> Self {
        let url = format!("{}/chat/completions", http::trim_base(&config.base_url));
        OpenAiModel {
            endpoint: http::endpoint(&url),
            config,
            url,
            client: http::client(),
            schema_format: AtomicU8::new(0),
            schema_ok: AtomicBool::new(false),
            unstreamable: Mutex::new(Vec::new()),
        }
    }

    /// The endpoint's URL (for the circuit breaker's key).
    pub fn url(&self) -> &str {
        &self.url
    }

    fn secret(&self) -> Option<&Secret> {
        self.config.api_key.as_ref()
    }

    /// The request body, asking for the schema (if any) as `format` says.
    fn body(&self, request: &ChatRequest, stream: bool, format: Format) -> Value {
        let mut messages: Vec<Value> = request.messages.iter().map(wire_message).collect();
        if let (Some(schema), Format::Prompt) = (&request.response_schema, format) {
            let note = http::schema_note(schema);
            match messages.first_mut() {
                Some(first) if first["role"] == "system" => {
                    let text = first["content"].as_str().unwrap_or_default();
                    first["content"] = Value::String(format!("{text}\n\n{note}"));
                }
                _ => messages.insert(0, json!({ "role": "system", "content": note })),
            }
        }
        let mut body = json!({
            "model": self.config.model,
            "messages": messages,
        });
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters,
                        }
                    })
                })
                .collect();
            body["tools"] = Value::Array(tools);
            body["tool_choice"] = match request.tool_choice() {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::Required => json!("required"),
                ToolChoice::None => json!("none"),
                ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
            };
        }
        if let Some(o) = &request.options {
            if let Some(t) = o.temperature {
                body["temperature"] = json!(t);
            }
            if let Some(n) = o.max_tokens {
                body["max_tokens"] = json!(n);
            }
            if let Some(p) = o.top_p {
                body["top_p"] = json!(p);
            }
            if let Some(seed) = o.seed {
                body["seed"] = json!(seed);
            }
            if !o.stop.is_empty() {
                body["stop"] = json!(o.stop);
            }
        }
        match (&request.response_schema, format) {
            (Some(schema), Format::JsonSchema) => {
                body["response_format"] = json!({
                    "type": "json_schema",
                    "json_schema": { "name": "output", "schema": **schema },
                });
            }
            (Some(schema), Format::JsonObject) => {
                body["response_format"] = json!({ "type": "json_object", "schema": **schema });
            }
            _ => {}
        }
        if stream {
            body["stream"] = Value::Bool(true);
            body["stream_options"] = json!({ "include_usage": true });
        }
        body
    }
}

/// One transcript message in the wire shape.
fn wire_message(m: &Message) -> Value {
    match m.role {
        Role::System => json!({ "role": "system", "content": m.content }),
        Role::User if !m.attachments.is_empty() => {
            let mut parts = vec![json!({ "type": "text", "text": m.content })];
            for a in &m.attachments {
                parts.push(if a.is_image() {
                    let data: String = a.content.split_whitespace().collect();
                    json!({
                        "type": "image_url",
                        "image_url": { "url": format!("data:{};base64,{data}", a.mime) },
                    })
                } else {
                    json!({ "type": "text", "text": a.as_text() })
                });
            }
            json!({ "role": "user", "content": parts })
        }
        Role::User => json!({ "role": "user", "content": m.content }),
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": m.tool_call_id.as_deref().unwrap_or_default(),
            "content": m.content,
        }),
        Role::Assistant => {
            // `content` is a string even on a tool-call turn: `null` makes
            // some servers (llama.cpp-based ones) answer 500.
            let mut v = json!({ "role": "assistant", "content": m.content });
            if !m.tool_calls.is_empty() {
                v["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.id,
                            "type": "function",
                            "function": { "name": c.name, "arguments": c.arguments },
                        })
                    })
                    .collect();
            }
            v
        }
    }
}

#[async_trait]
impl ChatModel for OpenAiModel {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn price_id(&self) -> Option<&str> {
        self.config.priced.then_some(self.config.model.as_str())
    }

    fn streams(&self) -> bool {
        true
    }

    fn needs_input(&self) -> bool {
        true
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let mut format = if request.response_schema.is_some() {
            Format::from_u8(self.schema_format.load(Ordering::Relaxed))
        } else {
            Format::None
        };
        let mut cause: Option<ModelError> = None;
        let result = loop {
            match self.exchange(&request, format).await {
                Err(e) if format.in_body() && self.refused_schema(&e) => {
                    let next = format.next();
                    self.schema_format
                        .fetch_max(next.as_u8(), Ordering::Relaxed);
                    tracing::warn!(
                        model = %self.config.name,
                        error = %e,
                        "the server refused this `response_format`: {} from now on",
                        if next == Format::Prompt { "the schema goes in the system prompt" } else { "`json_object` with the schema" }
                    );
                    cause = Some(e);
                    format = next;
                }
                Ok(r) => {
                    if format.in_body() {
                        self.schema_ok.store(true, Ordering::Relaxed);
                    }
                    break Ok(http::finish_response(&request, r));
                }
                Err(e) => break Err(e),
            }
        };
        // Every run that uses a fallback is told (once: warnings are one
        // per kind a run), with the refusal when this call met it.
        if matches!(format, Format::JsonObject | Format::Prompt) {
            self.schema_fallback_warning(&request, format, cause.as_ref());
        }
        result
    }
}

impl OpenAiModel {
    /// Whether `e`, the answer to a call that carried `response_format`,
    /// says the server does not take it: a refused request, or a server
    /// error while no call with it has ever succeeded here.
    fn refused_schema(&self, e: &ModelError) -> bool {
        match e {
            ModelError::BadRequest(_) => !http::is_context_overflow(e),
            ModelError::Server { status, .. } => {
                *status >= 500 && !self.schema_ok.load(Ordering::Relaxed)
            }
            _ => false,
        }
    }

    fn schema_fallback_warning(
        &self,
        request: &ChatRequest,
        format: Format,
        cause: Option<&ModelError>,
    ) {
        if let Some(o) = &request.observer {
            let why = cause.map(|e| format!(" ({e})")).unwrap_or_default();
            let how = match format {
                Format::JsonObject => {
                    "the output schema is sent as `response_format: {type: json_object, schema}`"
                }
                _ => "the output schema is asked for in the system prompt",
            };
            o.warning(
                "response_format_unsupported",
                &format!(
                    "{} at {} does not take `response_format: json_schema`{why}: {how} and the answer validated",
                    self.config.name, self.endpoint
                ),
            );
        }
    }

    /// One call as the server takes it: streamed when the request wants a
    /// stream and its shape is not known to fail streamed, else plain; a
    /// stream that brought no event at all is asked again at once, plain
    /// (see "Streaming fallback").
    async fn exchange(
        &self,
        request: &ChatRequest,
        format: Format,
    ) -> Result<ChatResponse, ModelError> {
        let wants_stream = match self.config.stream {
            StreamMode::Always => true,
            StreamMode::Never => false,
            StreamMode::WhenListened => request.on_delta.is_some() || request.observer.is_some(),
        };
        let shape = Shape::of(request, format);
        let known = self.unstreamable().contains(&shape);
        if known && wants_stream {
            self.stream_fallback_warning(request, &shape, None);
        }
        let mut seen = Seen::default();
        if known || !wants_stream {
            return self.call(request, format, false, &mut seen).await;
        }
        match self.call(request, format, true, &mut seen).await {
            Err(e) if seen.ok_status && seen.stats.events == 0 && empty_answer(&e) => {
                tracing::warn!(
                    model = %self.config.name,
                    shape = %shape.describe(),
                    error = %e,
                    "a streamed request brought no event: asked again without streaming"
                );
                self.stream_fallback_warning(request, &shape, Some(&e));
                let r = self
                    .call(request, format, false, &mut Seen::default())
                    .await;
                if r.is_ok() {
                    let mut known = self.unstreamable();
                    if !known.contains(&shape) {
                        known.push(shape);
                    }
                }
                r
            }
            other => other,
        }
    }

    fn unstreamable(&self) -> std::sync::MutexGuard<'_, Vec<Shape>> {
        self.unstreamable.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stream_fallback_warning(
        &self,
        request: &ChatRequest,
        shape: &Shape,
        cause: Option<&ModelError>,
    ) {
        if let Some(o) = &request.observer {
            let why = cause.map(|e| format!(" ({e})")).unwrap_or_default();
            o.warning(
                "streaming_unsupported",
                &format!(
                    "{} at {} does not stream requests with {}{why}: they are sent with `stream: false`, and their text arrives whole",
                    self.config.name,
                    self.endpoint,
                    shape.describe()
                ),
            );
        }
    }

    /// One HTTP exchange; `seen` records what came back.
    async fn call(
        &self,
        request: &ChatRequest,
        format: Format,
        stream: bool,
        seen: &mut Seen,
    ) -> Result<ChatResponse, ModelError> {
        let secret = self.secret();
        let body = serde_json::to_vec(&self.body(request, stream, format))
            .map_err(|e| ModelError::BadRequest(format!("cannot encode the request: {e}")))?;
        let mut req = self
            .client
            .post(&self.url)
            .header(CONTENT_TYPE, "application/json")
            .header(
                ACCEPT,
                if stream {
                    "text/event-stream"
                } else {
                    "application/json"
                },
            )
            .body(body);
        if let Some(key) = secret {
            req = req.header(
                AUTHORIZATION,
                http::secret_header(&format!("Bearer {}", key.expose()))?,
            );
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| http::send_error(e, secret, &self.endpoint))?;
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            let headers = resp.headers().clone();
            let body = http::read_body(&mut resp, secret).await.unwrap_or_default();
            return Err(http::status_error(
                status,
                &headers,
                &body,
                secret,
                &self.endpoint,
            ));
        }
        seen.ok_status = true;
        let is_sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if stream && is_sse {
            read_stream(&mut resp, request, secret, &self.endpoint, &mut seen.stats).await
        } else {
            let body = http::read_body(&mut resp, secret).await?;
            seen.stats.bytes = body.len();
            if body.iter().all(u8::is_ascii_whitespace) {
                return Err(ModelError::Incomplete(format!(
                    "POST {} answered {}, with an empty body",
                    self.endpoint,
                    resp.status()
                )));
            }
            request.alive();
            let mut response = parse_plain(&body, request.call_index, secret)?;
            response.text = crate::secrets::redact_string(response.text);
            http::deliver(request, &response.text);
            Ok(response)
        }
    }
}

/// Whether `e` ends an answer that brought nothing: an empty or cut body
/// (the caller checks that no event came).
fn empty_answer(e: &ModelError) -> bool {
    matches!(e, ModelError::Incomplete(_) | ModelError::Transport(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::model::ToolCallRequest;

    #[test]
    fn assistant_tool_turns_go_out_in_wire_shape() {
        let m = Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCallRequest {
                id: "c1".into(),
                name: "add".into(),
                arguments: "{}".into(),
            }],
            tool_call_id: None,
            attachments: Vec::new(),
        };
        let v = wire_message(&m);
        assert_eq!(v["content"], "", "never null: some servers answer 500");
        assert_eq!(v["tool_calls"][0]["function"]["name"], "add");
    }
}
