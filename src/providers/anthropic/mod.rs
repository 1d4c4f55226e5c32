//! The Anthropic Messages provider.
//!
//! # Wire
//!
//! `POST {base}/v1/messages` with `x-api-key` (marked sensitive) and
//! `anthropic-version: 2023-06-01`. The base is written as the official
//! Anthropic SDKs write `ANTHROPIC_BASE_URL`: the host
//! (`http://127.0.0.1:4011`), to which `/v1/messages` is added; a base that
//! already ends in `/v1` gets `/messages` only, so both spellings work. System messages become the `system`
//! field; the transcript becomes alternating user/assistant turns of
//! content blocks: an assistant turn carries `text` and `tool_use` blocks,
//! and the tool results that answer it go back as `tool_result` blocks in
//! one user turn (with any user text that follows them), as the API wants.
//! A response schema is asked for in the system prompt (the Messages API
//! has no `response_format`); the run validates the answer either way.
//! With tools, `tool_choice` goes out as `{type: auto | any | none | tool}`;
//! the manifest's `temperature`, `top_p`, `max_tokens` (over the config's)
//! and `stop` (as `stop_sequences`) are sent when set; `seed` is not (the
//! API has none). A user turn's attachments become `image` blocks (base64)
//! and text blocks.
//!
//! Streaming (same [`StreamMode`] as the OpenAI provider) reads the event
//! sequence `message_start` → `content_block_start` / `content_block_delta`
//! (`text_delta`, `input_json_delta`) / `content_block_stop` →
//! `message_delta` → `message_stop`; `ping` and unknown events (thinking
//! blocks, signatures) are skipped, an `error` event is a typed error.
//! A chunk is a sign of life for the request's observer only when it
//! carries content (text, a tool-use block or its input, thinking, the
//! closing `message_delta`): `message_start`, `ping`, `:` comments and
//! empty deltas are keep-alives, not progress; text goes to
//! the listener and the observer redacted (see [`crate::secrets`]). A
//! stream that ends before `message_stop` is an `Incomplete` error (one cut
//! off, `Transport`), naming the URL, the status and the bytes and events
//! that arrived, wrapped in `Interrupted` once text reached the listener.
//!
//! # Usage
//!
//! Anthropic counts `input_tokens` without the cache; ours include it:
//! input = `input_tokens + cache_read_input_tokens +
//! cache_creation_input_tokens`, with the two cache counts kept apart for
//! pricing. In a stream, `message_delta` usage is cumulative: the last one wins.

use async_trait::async_trait;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{json, Value};

use super::http::StreamMode;
use super::http::{self, Secret};
use crate::ports::model::{
    ChatModel, ChatRequest, ChatResponse, Message, ModelError, Role, ToolChoice,
};

mod response;

use response::{parse_plain, read_stream};

/// The public Anthropic endpoint (the host, as the SDKs write it).
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

/// The Messages URL for a base written either way (see the module doc).
pub fn messages_url(base_url: &str) -> String {
    let base = http::trim_base(base_url);
    if base.ends_with("/v1") {
        format!("{base}/messages")
    } else {
        format!("{base}/v1/messages")
    }
}

/// The API version header this provider speaks.
pub const API_VERSION: &str = "2023-06-01";

/// How to reach one model.
#[derive(Clone, Debug)]
pub struct AnthropicConfig {
    /// The name in results and logs (`anthropic:claude-sonnet-4-5`).
    pub name: String,
    /// The model id sent on the wire.
    pub model: String,
    /// The API base: the host, with or without a trailing `/v1`.
    pub base_url: String,
    /// The key.
    pub api_key: Option<Secret>,
    /// When to stream.
    pub stream: StreamMode,
    /// `max_tokens` of every call (the API requires one).
    pub max_tokens: u32,
}

impl AnthropicConfig {
    /// A config for `model` at `base_url`, no key, named `anthropic:MODEL`.
    pub fn new(model: impl Into<String>, base_url: impl Into<String>) -> Self {
        let model = model.into();
        AnthropicConfig {
            name: format!("anthropic:{model}"),
            model,
            base_url: base_url.into(),
            api_key: None,
            stream: StreamMode::default(),
            max_tokens: 4096,
        }
    }
}

/// A [`ChatModel`] over the Messages API.
pub struct AnthropicModel {
    config: AnthropicConfig,
    url: String,
    /// The URL as errors show it.
    endpoint: String,
    client: reqwest::Client,
}

impl AnthropicModel {
    /// A model with its own connection pool.
    pub fn new(config: AnthropicConfig) -> Self {
        let url = messages_url(&config.base_url);
        AnthropicModel {
            endpoint: http::endpoint(&url),
            config,
            url,
            client: http::client(),
        }
    }

    /// The endpoint's URL (for the circuit breaker's key).
    pub fn url(&self) -> &str {
        &self.url
    }

    fn body(&self, request: &ChatRequest, stream: bool) -> Value {
        let mut system: Vec<&str> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::System)
            .map(|m| m.content.as_str())
            .collect();
        let schema_note;
        if let Some(schema) = &request.response_schema {
            schema_note = http::schema_note(schema);
            system.push(&schema_note);
        }
        let options = request.options.as_deref();
        let max_tokens = options
            .and_then(|o| o.max_tokens)
            .unwrap_or(self.config.max_tokens);
        let mut body = json!({
            "model": self.config.model,
            "max_tokens": max_tokens,
            "messages": wire_messages(&request.messages),
        });
        if let Some(o) = options {
            if let Some(t) = o.temperature {
                body["temperature"] = json!(t);
            }
            if let Some(p) = o.top_p {
                body["top_p"] = json!(p);
            }
            if !o.stop.is_empty() {
                body["stop_sequences"] = json!(o.stop);
            }
        }
        if !system.is_empty() {
            body["system"] = Value::String(system.join("\n\n"));
        }
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name,
                        "description": t.description,
                        "input_schema": t.parameters,
                    })
                })
                .collect();
            body["tool_choice"] = match request.tool_choice() {
                ToolChoice::Auto => json!({"type": "auto"}),
                ToolChoice::Required => json!({"type": "any"}),
                ToolChoice::None => json!({"type": "none"}),
                ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
            };
        }
        if stream {
            body["stream"] = Value::Bool(true);
        }
        body
    }
}

/// The transcript as alternating turns of content blocks.
fn wire_messages(messages: &[Message]) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in messages {
        let (role, blocks) = match m.role {
            Role::System => continue,
            Role::User => {
                let mut blocks = text_block(&m.content);
                for a in &m.attachments {
                    blocks.push(if a.is_image() {
                        let data: String = a.content.split_whitespace().collect();
                        json!({
                            "type": "image",
                            "source": { "type": "base64", "media_type": a.mime, "data": data },
                        })
                    } else {
                        json!({ "type": "text", "text": a.as_text() })
                    });
                }
                ("user", blocks)
            }
            Role::Tool => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id.as_deref().unwrap_or_default(),
                    "content": m.content,
                })],
            ),
            Role::Assistant => {
                let mut blocks = text_block(&m.content);
                for c in &m.tool_calls {
                    // Arguments that were not a JSON object go back as an
                    // empty input: the tool result says what was wrong.
                    let input = serde_json::from_str::<Value>(&c.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": c.id,
                        "name": c.name,
                        "input": input,
                    }));
                }
                ("assistant", blocks)
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((r, b)) if *r == role => {
                // Tool results lead their turn, text follows them.
                b.extend(blocks);
            }
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({ "role": role, "content": content }))
        .collect()
}

fn text_block(text: &str) -> Vec<Value> {
    if text.trim().is_empty() {
        Vec::new()
    } else {
        vec![json!({ "type": "text", "text": text })]
    }
}

#[async_trait]
impl ChatModel for AnthropicModel {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn price_id(&self) -> Option<&str> {
        Some(&self.config.model)
    }

    fn streams(&self) -> bool {
        true
    }

    fn needs_input(&self) -> bool {
        true
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let secret = self.config.api_key.as_ref();
        let stream = match self.config.stream {
            StreamMode::Always => true,
            StreamMode::Never => false,
            StreamMode::WhenListened => request.on_delta.is_some() || request.observer.is_some(),
        };
        let body = serde_json::to_vec(&self.body(&request, stream))
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
            .header("anthropic-version", API_VERSION)
            .body(body);
        if let Some(key) = secret {
            req = req.header("x-api-key", http::secret_header(key.expose())?);
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
        let response = if stream && is_sse {
            read_stream(&mut resp, &request, secret, &self.endpoint).await?
        } else {
            let body = http::read_body(&mut resp, secret).await?;
            request.alive();
            let mut response = parse_plain(&body, request.call_index, secret)?;
            response.text = crate::secrets::redact_string(response.text);
            http::deliver(&request, &response.text);
            response
        };
        Ok(http::finish_response(&request, response))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ports::model::ToolCallRequest;

    #[test]
    fn tool_results_share_one_user_turn_after_the_tool_use_turn() {
        let call = |id: &str| ToolCallRequest {
            id: id.into(),
            name: "add".into(),
            arguments: r#"{"a":1}"#.into(),
        };
        let tool = |id: &str| Message {
            role: Role::Tool,
            content: "3".into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(id.into()),
            attachments: Vec::new(),
        };
        let msgs = vec![
            Message::text(Role::System, "sys"),
            Message::text(Role::User, "hi"),
            Message {
                role: Role::Assistant,
                content: String::new(),
                tool_calls: vec![call("a"), call("b")],
                tool_call_id: None,
                attachments: Vec::new(),
            },
            tool("a"),
            tool("b"),
            Message::text(Role::User, "steer"),
        ];
        let w = wire_messages(&msgs);
        assert_eq!(w.len(), 3);
        assert_eq!(w[1]["role"], "assistant");
        assert_eq!(w[1]["content"][1]["type"], "tool_use");
        assert_eq!(w[1]["content"][1]["input"]["a"], 1);
        assert_eq!(w[2]["role"], "user");
        let blocks = w[2]["content"].as_array().unwrap();
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0]["type"], "tool_result");
        assert_eq!(blocks[2]["type"], "text");
    }
}
