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
//! deltas or observes the call (a run does, for its heartbeats). A chunk
//! is a sign of life for the request's observer only when it carries
//! content (text, a tool-call part, reasoning, usage, a `finish_reason`):
//! `:` comments and empty deltas are keep-alives, not progress; text deltas go to
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
//! This module does one call (its answer is read by `response`); retries
//! and the circuit breaker wrap it (`super::retry`, `super::breaker`).

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use serde_json::{json, Value};

pub use super::http::StreamMode;
use super::http::{self, Secret};
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
