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
//! A server that refuses `response_format` — a 4xx, or a 5xx to the first
//! call that carries it — is asked again at once with the schema in the
//! system prompt instead (the run validates the answer and repairs it
//! either way). The refusal is remembered for this model (one per endpoint
//! and model on a host), so later calls go straight to the fallback, and
//! every run that uses it gets a `response_format_unsupported` warning.
//!
//! # Streaming
//!
//! Streaming (`stream: true`, `stream_options.include_usage`) is used when
//! [`StreamMode`] says so — by default, when someone listens to the run's
//! deltas or observes the call (a run does, for its heartbeats). Every
//! chunk is a sign of life for the request's observer; text deltas go to
//! the request's sink and observer as they come (redacted, see
//! [`crate::secrets`]); tool-call
//! deltas are reassembled by their `index` (id and name arrive first, the
//! arguments in pieces); usage comes in a final chunk with no choices. A
//! stream is complete at `[DONE]` or once a `finish_reason` and the body's
//! end were seen; a body that ends before that, or is cut off, is a
//! `Transport` error — wrapped in `Interrupted` when text was already
//! delivered, so it is never retried. A server that ignores `stream` and
//! answers with a JSON body is read as a plain response.
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
//! This module does one call; retries and the circuit breaker wrap it
//! (`super::retry`, `super::breaker`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use serde::Deserialize;
use serde_json::{json, Value};

pub use super::http::StreamMode;
use super::http::{self, Secret};
use super::sse::{SseEvent, SseParser};
use crate::ports::model::{
    ChatModel, ChatRequest, ChatResponse, Message, ModelError, Role, ToolCallRequest, ToolChoice,
};
use crate::ports::run::Usage;
use crate::secrets::StreamRedactor;

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
    /// The server refused `response_format`: the schema goes in the prompt.
    refuses_schema: AtomicBool,
    /// A call with `response_format` succeeded: a later 5xx is not blamed on it.
    schema_ok: AtomicBool,
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
            refuses_schema: AtomicBool::new(false),
            schema_ok: AtomicBool::new(false),
        }
    }

    /// The endpoint's URL (for the circuit breaker's key).
    pub fn url(&self) -> &str {
        &self.url
    }

    fn secret(&self) -> Option<&Secret> {
        self.config.api_key.as_ref()
    }

    /// The request body; `schema_in_prompt`: the response schema goes in
    /// the system prompt instead of `response_format`.
    fn body(&self, request: &ChatRequest, stream: bool, schema_in_prompt: bool) -> Value {
        let mut messages: Vec<Value> = request.messages.iter().map(wire_message).collect();
        if let (Some(schema), true) = (&request.response_schema, schema_in_prompt) {
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
        if let (Some(schema), false) = (&request.response_schema, schema_in_prompt) {
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": { "name": "output", "schema": **schema },
            });
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

// ---- Wire types (lenient) ----

#[derive(Deserialize, Default)]
struct WireResponse {
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize, Default)]
struct WireChoice {
    #[serde(default)]
    message: Option<WireMessage>,
    #[serde(default)]
    delta: Option<WireMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize, Default)]
struct WireToolCall {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Deserialize, Default)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize, Default)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn into_usage(self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            cache_read_tokens: self
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
            reasoning_tokens: self
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            estimated: false,
        }
    }
}

/// Text content: a string, or an array of `{type: text, text}` parts.
fn content_text(v: &Option<Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Raw argument text: a string as is, an object serialized.
fn arguments_text(v: Option<Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
    }
}

/// A plain (non-streamed) response body.
fn parse_plain(
    body: &[u8],
    call_index: u32,
    secret: Option<&Secret>,
) -> Result<ChatResponse, ModelError> {
    let wire: WireResponse = serde_json::from_slice(body)
        .map_err(|e| http::malformed("chat completion", &e, body, secret))?;
    let usage = wire.usage.map(WireUsage::into_usage).unwrap_or_default();
    let Some(choice) = wire.choices.into_iter().next() else {
        return Err(ModelError::Malformed(
            "chat completion without choices".into(),
        ));
    };
    let message = choice.message.or(choice.delta).unwrap_or_default();
    let text = content_text(&message.content);
    let tool_calls = message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(j, c)| {
            let f = c.function.unwrap_or_default();
            ToolCallRequest {
                id: c
                    .id
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| format!("call_{call_index}_{j}"))
                    .into(),
                name: f.name.unwrap_or_default().into(),
                arguments: arguments_text(f.arguments).into(),
            }
        })
        .collect();
    Ok(ChatResponse {
        text,
        tool_calls,
        usage,
    })
}

/// A tool call being reassembled from deltas.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// The state of one streamed response.
#[derive(Default)]
struct StreamState {
    text: String,
    calls: BTreeMap<u32, PartialCall>,
    usage: Usage,
    finished: bool,
    done: bool,
    delivered: bool,
    redactor: StreamRedactor,
}

impl StreamState {
    /// Applies one event; `Err` for an error the server sent in the stream
    /// or a chunk that does not parse.
    fn apply(
        &mut self,
        ev: &SseEvent,
        request: &ChatRequest,
        secret: Option<&Secret>,
    ) -> Result<(), ModelError> {
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| http::malformed("stream chunk", &e, data.as_bytes(), secret))?;
        if v.get("error").is_some_and(|e| !e.is_null()) || ev.event == "error" {
            return Err(http::stream_error(data.as_bytes(), secret));
        }
        let chunk: WireResponse = serde_json::from_value(v)
            .map_err(|e| http::malformed("stream chunk", &e, data.as_bytes(), secret))?;
        if let Some(u) = chunk.usage {
            self.usage = u.into_usage();
        }
        for choice in chunk.choices {
            if choice.finish_reason.is_some() {
                self.finished = true;
            }
            let Some(delta) = choice.delta.or(choice.message) else {
                continue;
            };
            let piece = content_text(&delta.content);
            if !piece.is_empty() {
                let out = self.redactor.push(&piece);
                self.delivered |= http::deliver(request, &out);
                self.text.push_str(&piece);
            }
            for (j, tc) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                let index = tc.index.unwrap_or(j as u32);
                let call = self.calls.entry(index).or_default();
                if let Some(id) = tc.id.filter(|s| !s.is_empty()) {
                    call.id = id;
                }
                if let Some(f) = tc.function {
                    // The name comes once; a server that repeats it whole
                    // in later chunks must not double it.
                    if let Some(name) = f.name.filter(|s| !s.is_empty()) {
                        if call.name.is_empty() {
                            call.name = name;
                        }
                    }
                    call.arguments.push_str(&arguments_text(f.arguments));
                }
            }
        }
        Ok(())
    }

    fn into_response(mut self, request: &ChatRequest) -> ChatResponse {
        let call_index = request.call_index;
        let rest = self.redactor.finish();
        http::deliver(request, &rest);
        let tool_calls = self
            .calls
            .into_values()
            .enumerate()
            .map(|(j, c)| ToolCallRequest {
                id: if c.id.is_empty() {
                    format!("call_{call_index}_{j}").into()
                } else {
                    c.id.into()
                },
                name: c.name.into(),
                arguments: c.arguments.into(),
            })
            .collect();
        ChatResponse {
            text: self.text,
            tool_calls,
            usage: self.usage,
        }
    }

    /// `e`, wrapped as `Interrupted` when text already reached the listener.
    fn fail(&self, e: ModelError) -> ModelError {
        if self.delivered {
            ModelError::Interrupted(Box::new(e))
        } else {
            e
        }
    }
}

/// Reads a streamed response to its end.
async fn read_stream(
    resp: &mut reqwest::Response,
    request: &ChatRequest,
    secret: Option<&Secret>,
) -> Result<ChatResponse, ModelError> {
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut st = StreamState::default();
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => return Err(st.fail(http::transport(e, secret))),
        };
        // Every chunk is a sign of life: text, tool-call arguments,
        // reasoning, or a keep-alive comment.
        request.alive();
        parser.feed(&chunk, &mut events);
        for ev in events.drain(..) {
            st.apply(&ev, request, secret).map_err(|e| st.fail(e))?;
            if st.done {
                return Ok(st.into_response(request));
            }
        }
    }
    if st.finished {
        return Ok(st.into_response(request));
    }
    Err(st.fail(ModelError::Transport(
        "the stream ended before the response was complete".into(),
    )))
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

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let wants_schema = request.response_schema.is_some();
        let in_prompt = wants_schema && self.refuses_schema.load(Ordering::Relaxed);
        let result = match self.call(&request, in_prompt).await {
            Err(e) if wants_schema && !in_prompt && self.refused_schema(&e) => {
                self.refuses_schema.store(true, Ordering::Relaxed);
                tracing::warn!(
                    model = %self.config.name,
                    error = %e,
                    "the server refused response_format: the schema goes in the system prompt from now on"
                );
                self.schema_fallback_warning(&request, Some(&e));
                self.call(&request, true).await
            }
            Ok(r) if wants_schema && !in_prompt => {
                self.schema_ok.store(true, Ordering::Relaxed);
                Ok(r)
            }
            other => {
                if in_prompt {
                    self.schema_fallback_warning(&request, None);
                }
                other
            }
        };
        result.map(|r| http::finish_response(&request, r))
    }
}

impl OpenAiModel {
    /// Whether `e`, the answer to a call that carried `response_format`,
    /// says the server does not take it: a refused request, or a server
    /// error while no call with it has ever succeeded here.
    fn refused_schema(&self, e: &ModelError) -> bool {
        match e {
            ModelError::BadRequest(_) => true,
            ModelError::Server { status, .. } => {
                *status >= 500 && !self.schema_ok.load(Ordering::Relaxed)
            }
            _ => false,
        }
    }

    fn schema_fallback_warning(&self, request: &ChatRequest, cause: Option<&ModelError>) {
        if let Some(o) = &request.observer {
            let why = cause.map(|e| format!(" ({e})")).unwrap_or_default();
            o.warning(
                "response_format_unsupported",
                &format!(
                    "{} at {} does not take `response_format`{why}: the output schema is asked for in the system prompt and the answer validated",
                    self.config.name, self.endpoint
                ),
            );
        }
    }

    /// One HTTP exchange.
    async fn call(
        &self,
        request: &ChatRequest,
        schema_in_prompt: bool,
    ) -> Result<ChatResponse, ModelError> {
        let secret = self.secret();
        let stream = match self.config.stream {
            StreamMode::Always => true,
            StreamMode::Never => false,
            StreamMode::WhenListened => request.on_delta.is_some() || request.observer.is_some(),
        };
        let body = serde_json::to_vec(&self.body(request, stream, schema_in_prompt))
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
        let is_sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if stream && is_sse {
            read_stream(&mut resp, request, secret).await
        } else {
            let body = http::read_body(&mut resp, secret).await?;
            request.alive();
            let mut response = parse_plain(&body, request.call_index, secret)?;
            response.text = crate::secrets::redact_string(response.text);
            http::deliver(request, &response.text);
            Ok(response)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::*;

    fn request() -> ChatRequest {
        ChatRequest::new(Arc::new(Vec::new()), Arc::from(Vec::new()), 2)
    }

    #[test]
    fn tool_call_deltas_reassemble_by_index() {
        let mut st = StreamState::default();
        let r = request();
        let chunks = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"add","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"upper","arguments":"{\"te"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\": 2,"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"b\": 3}"}},{"index":1,"function":{"arguments":"xt\": \"hi\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":10}}}"#,
        ];
        for c in chunks {
            let ev = SseEvent {
                event: String::new(),
                data: c.to_string(),
            };
            st.apply(&ev, &r, None).unwrap();
        }
        assert!(st.finished);
        let resp = st.into_response(&r);
        assert_eq!(resp.tool_calls.len(), 2);
        assert_eq!(&*resp.tool_calls[0].name, "add");
        assert_eq!(&*resp.tool_calls[0].arguments, r#"{"a": 2, "b": 3}"#);
        assert_eq!(&*resp.tool_calls[1].id, "call_b");
        assert_eq!(&*resp.tool_calls[1].arguments, r#"{"text": "hi"}"#);
        assert_eq!(resp.usage.input_tokens, 50);
        assert_eq!(resp.usage.cache_read_tokens, 10);
    }

    #[test]
    fn plain_responses_are_read_leniently() {
        let body = br#"{"choices":[{"message":{"content":null,"tool_calls":[{"function":{"name":"add","arguments":{"a":1}}}]}}]}"#;
        let r = parse_plain(body, 4, None).unwrap();
        assert_eq!(&*r.tool_calls[0].id, "call_4_0");
        assert_eq!(&*r.tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(r.usage, Usage::default());
        assert_eq!(
            parse_plain(b"not json", 0, None).unwrap_err().kind(),
            "malformed_response"
        );
    }

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
