//! Reading the Messages API's answer: a JSON body ([`parse_plain`]) or its
//! event stream ([`read_stream`]), into a [`ChatResponse`] (usage counted
//! as the parent module's "Usage" says).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::super::http::{self, Secret};
use super::super::sse::{self, SseEvent, StreamFold};
use crate::ports::model::{ChatRequest, ChatResponse, ModelError, ToolCallRequest};
use crate::ports::run::Usage;
use crate::secrets::StreamRedactor;

// ---- Wire types (lenient) ----

#[derive(Deserialize, Default)]
struct WireMessage {
    #[serde(default)]
    content: Vec<WireBlock>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireBlock {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Folds a later usage report into this one (fields it carries win).
    fn merge(&mut self, later: WireUsage) {
        self.input_tokens = later.input_tokens.or(self.input_tokens);
        self.output_tokens = later.output_tokens.or(self.output_tokens);
        self.cache_creation_input_tokens = later
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
        self.cache_read_input_tokens = later
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
    }

    fn usage(&self) -> Usage {
        let read = self.cache_read_input_tokens.unwrap_or(0);
        let write = self.cache_creation_input_tokens.unwrap_or(0);
        Usage {
            input_tokens: self.input_tokens.unwrap_or(0) + read + write,
            output_tokens: self.output_tokens.unwrap_or(0),
            cache_read_tokens: read,
            cache_write_tokens: write,
            reasoning_tokens: 0,
            estimated: false,
        }
    }
}

/// Tool input as raw argument text (`{}` when there is none).
fn input_text(input: Option<&Value>) -> String {
    match input {
        None | Some(Value::Null) => "{}".to_string(),
        Some(v) => v.to_string(),
    }
}

pub(super) fn parse_plain(
    body: &[u8],
    call_index: u32,
    secret: Option<&Secret>,
) -> Result<ChatResponse, ModelError> {
    let wire: WireMessage =
        serde_json::from_slice(body).map_err(|e| http::malformed("message", &e, body, secret))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (j, b) in wire.content.into_iter().enumerate() {
        match b.kind.as_str() {
            "text" => text.push_str(b.text.as_deref().unwrap_or_default()),
            "tool_use" => tool_calls.push(ToolCallRequest {
                id: b
                    .id
                    .unwrap_or_else(|| format!("call_{call_index}_{j}"))
                    .into(),
                name: b.name.unwrap_or_default().into(),
                arguments: input_text(b.input.as_ref()).into(),
            }),
            _ => {}
        }
    }
    Ok(ChatResponse {
        text,
        tool_calls,
        usage: wire.usage.unwrap_or_default().usage(),
        finish_reason: wire.stop_reason,
    })
}

/// A content block being streamed.
enum OpenBlock {
    Text,
    Tool {
        id: String,
        name: String,
        /// The input given at block start (used when no delta comes).
        initial: Option<Value>,
        json: String,
    },
    Other,
}

#[derive(Default)]
struct StreamState {
    text: String,
    blocks: BTreeMap<u64, OpenBlock>,
    usage: WireUsage,
    stop_reason: Option<String>,
    stopped: bool,
    delivered: bool,
    redactor: StreamRedactor,
}

#[derive(Deserialize)]
struct StartEvent {
    #[serde(default)]
    message: WireMessage,
}

#[derive(Deserialize)]
struct BlockStart {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    content_block: WireBlock,
}

#[derive(Deserialize)]
struct BlockDelta {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    delta: WireDelta,
}

#[derive(Deserialize, Default)]
struct WireDelta {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    partial_json: Option<String>,
    /// A `thinking_delta`'s text (not kept: progress only).
    #[serde(default)]
    thinking: Option<String>,
}

#[derive(Deserialize)]
struct MessageDelta {
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    delta: Option<StopDelta>,
}

/// A `message_delta`'s `delta`: why the message stopped.
#[derive(Deserialize)]
struct StopDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

impl StreamState {
    fn push_text(&mut self, t: &str, request: &ChatRequest) {
        let out = self.redactor.push(t);
        self.delivered |= http::deliver(request, &out);
        self.text.push_str(t);
    }
}

impl StreamFold for StreamState {
    /// Content is a text, tool-use or thinking block's start or delta that
    /// carries something, or a `message_delta` (usage, the stop reason);
    /// `message_start` (the envelope, before any token), `ping`, a block's
    /// stop and an empty delta are none.
    fn apply(
        &mut self,
        ev: &SseEvent,
        request: &ChatRequest,
        secret: Option<&Secret>,
    ) -> Result<bool, ModelError> {
        let data = ev.data.as_bytes();
        // The type is in the data too; servers that leave out `event:` work.
        let kind = if ev.event.is_empty() {
            serde_json::from_slice::<Value>(data)
                .ok()
                .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_default()
        } else {
            ev.event.clone()
        };
        let parse_err = |e: serde_json::Error| http::malformed(&kind, &e, data, secret);
        let said = |t: &Option<String>| t.as_deref().is_some_and(|t| !t.is_empty());
        let content = match kind.as_str() {
            "message_start" => {
                let s: StartEvent = serde_json::from_slice(data).map_err(parse_err)?;
                if let Some(u) = s.message.usage {
                    self.usage.merge(u);
                    if let Some(o) = &request.observer {
                        o.usage(&self.usage.usage());
                    }
                }
                false
            }
            "content_block_start" => {
                let s: BlockStart = serde_json::from_slice(data).map_err(parse_err)?;
                let (block, content) = match s.content_block.kind.as_str() {
                    "text" => {
                        let content = said(&s.content_block.text);
                        if let Some(t) = s.content_block.text.filter(|t| !t.is_empty()) {
                            self.push_text(&t, request);
                        }
                        (OpenBlock::Text, content)
                    }
                    "tool_use" => (
                        OpenBlock::Tool {
                            id: s.content_block.id.unwrap_or_default(),
                            name: s.content_block.name.unwrap_or_default(),
                            initial: s.content_block.input,
                            json: String::new(),
                        },
                        true,
                    ),
                    _ => (OpenBlock::Other, false),
                };
                self.blocks.insert(s.index, block);
                content
            }
            "content_block_delta" => {
                let d: BlockDelta = serde_json::from_slice(data).map_err(parse_err)?;
                match d.delta.kind.as_str() {
                    "text_delta" => {
                        let content = said(&d.delta.text);
                        if let Some(t) = d.delta.text {
                            self.push_text(&t, request);
                        }
                        content
                    }
                    "input_json_delta" => {
                        let content = said(&d.delta.partial_json);
                        if let Some(OpenBlock::Tool { json, .. }) = self.blocks.get_mut(&d.index) {
                            json.push_str(d.delta.partial_json.as_deref().unwrap_or_default());
                        }
                        content
                    }
                    "thinking_delta" => said(&d.delta.thinking),
                    _ => false,
                }
            }
            "message_delta" => {
                let d: MessageDelta = serde_json::from_slice(data).map_err(parse_err)?;
                if let Some(u) = d.usage {
                    self.usage.merge(u);
                    if let Some(o) = &request.observer {
                        o.usage(&self.usage.usage());
                    }
                }
                if let Some(reason) = d.delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                true
            }
            "message_stop" => {
                self.stopped = true;
                false
            }
            "error" => return Err(http::stream_error(data, secret)),
            _ => false,
        };
        Ok(content)
    }

    fn is_over(&self) -> bool {
        self.stopped
    }

    /// Only `message_stop` ends a message.
    fn whole_at_end(&self) -> bool {
        false
    }

    fn delivered(&self) -> bool {
        self.delivered
    }

    fn into_response(mut self, request: &ChatRequest) -> ChatResponse {
        let call_index = request.call_index;
        let rest = self.redactor.finish();
        http::deliver(request, &rest);
        let mut tool_calls = Vec::new();
        for (j, block) in self.blocks.into_values().enumerate() {
            if let OpenBlock::Tool {
                id,
                name,
                initial,
                json,
            } = block
            {
                let arguments = if json.is_empty() {
                    input_text(initial.as_ref())
                } else {
                    json
                };
                tool_calls.push(ToolCallRequest {
                    id: if id.is_empty() {
                        format!("call_{call_index}_{j}").into()
                    } else {
                        id.into()
                    },
                    name: name.into(),
                    arguments: arguments.into(),
                });
            }
        }
        ChatResponse {
            text: self.text,
            tool_calls,
            usage: self.usage.usage(),
            finish_reason: self.stop_reason,
        }
    }
}

pub(super) async fn read_stream(
    resp: &mut reqwest::Response,
    request: &ChatRequest,
    secret: Option<&Secret>,
    endpoint: &str,
) -> Result<ChatResponse, ModelError> {
    sse::read_stream::<StreamState>(
        resp,
        request,
        secret,
        endpoint,
        "`message_stop`",
        &mut sse::StreamStats::default(),
    )
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn usage_includes_cache_tokens() {
        let body = br#"{"content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"output_tokens":3,"cache_read_input_tokens":100,"cache_creation_input_tokens":20}}"#;
        let r = parse_plain(body, 0, None).unwrap();
        assert_eq!(r.usage.input_tokens, 130);
        assert_eq!(r.usage.cache_read_tokens, 100);
        assert_eq!(r.usage.cache_write_tokens, 20);
        assert_eq!(r.text, "hi");
        assert_eq!(r.finish_reason, None, "the body gave no stop_reason");
    }

    #[test]
    fn only_events_with_content_are_progress() {
        let request = ChatRequest::new(
            std::sync::Arc::new(Vec::new()),
            std::sync::Arc::from(Vec::new()),
            0,
        );
        let mut st = StreamState::default();
        let mut apply = |event: &str, data: &str| {
            let ev = SseEvent {
                event: event.to_string(),
                data: data.to_string(),
            };
            st.apply(&ev, &request, None).unwrap()
        };
        for (event, data, content) in [
            (
                "message_start",
                r#"{"type":"message_start","message":{"content":[],"usage":{"input_tokens":5}}}"#,
                false,
            ),
            ("ping", r#"{"type":"ping"}"#, false),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
                false,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":""}}"#,
                false,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"so"}}"#,
                true,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
                false,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
                false,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":""}}"#,
                false,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
                true,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t","name":"add","input":{}}}"#,
                true,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}"#,
                false,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{}"}}"#,
                true,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":3}}"#,
                true,
            ),
            ("", r#"{"type":"ping"}"#, false),
        ] {
            assert_eq!(apply(event, data), content, "{event} {data}");
        }
    }

    #[test]
    fn the_stop_reason_is_kept_plain_and_streamed() {
        let body = br#"{"content":[{"type":"text","text":"hi"}],"stop_reason":"max_tokens"}"#;
        let r = parse_plain(body, 0, None).unwrap();
        assert_eq!(r.finish_reason.as_deref(), Some("max_tokens"));
        let request = ChatRequest::new(
            std::sync::Arc::new(Vec::new()),
            std::sync::Arc::from(Vec::new()),
            0,
        );
        let mut st = StreamState::default();
        let events = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"content":[],"usage":{"input_tokens":5,"output_tokens":0}}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ];
        for (event, data) in events {
            let ev = SseEvent {
                event: event.to_string(),
                data: data.to_string(),
            };
            st.apply(&ev, &request, None).unwrap();
        }
        let r = st.into_response(&request);
        assert_eq!(r.text, "hello");
        assert_eq!(r.finish_reason.as_deref(), Some("end_turn"));
    }
}
