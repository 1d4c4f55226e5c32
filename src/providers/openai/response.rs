//! Reading an OpenAI-compatible server's answer: a JSON body
//! ([`parse_plain`]) or a stream of chunks ([`read_stream`]), into a
//! [`ChatResponse`], leniently (see the parent module's "Leniency").

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
    /// Reasoning text, as servers that stream it name it (DeepSeek, vLLM,
    /// llama.cpp: `reasoning_content`; others: `reasoning`). Not kept: a
    /// streamed piece of it is progress.
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
}

impl WireMessage {
    /// Whether it carries reasoning text.
    fn reasons(&self) -> bool {
        let said = |v: &Option<Value>| !content_text(v).is_empty();
        said(&self.reasoning_content) || said(&self.reasoning)
    }
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
pub(super) fn parse_plain(
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
    let finish_reason = choice.finish_reason;
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
        finish_reason,
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
    /// The last `finish_reason` a chunk gave.
    finish_reason: Option<String>,
    finished: bool,
    done: bool,
    delivered: bool,
    redactor: StreamRedactor,
}

impl StreamFold for StreamState {
    /// Applies one event; `Err` for an error the server sent in the stream
    /// or a chunk that does not parse. Content is text, a tool-call part,
    /// reasoning, usage or a `finish_reason`; a chunk with an empty delta
    /// (a keep-alive, or the opening `role` chunk) is none.
    fn apply(
        &mut self,
        ev: &SseEvent,
        request: &ChatRequest,
        secret: Option<&Secret>,
    ) -> Result<bool, ModelError> {
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(false);
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| http::malformed("stream chunk", &e, data.as_bytes(), secret))?;
        if v.get("error").is_some_and(|e| !e.is_null()) || ev.event == "error" {
            return Err(http::stream_error(data.as_bytes(), secret));
        }
        let chunk: WireResponse = serde_json::from_value(v)
            .map_err(|e| http::malformed("stream chunk", &e, data.as_bytes(), secret))?;
        let mut content = false;
        if let Some(u) = chunk.usage {
            self.usage = u.into_usage();
            // A call cut after this is charged it (`CallObserver::usage`).
            if let Some(o) = &request.observer {
                o.usage(&self.usage);
            }
            content = true;
        }
        for choice in chunk.choices {
            if choice.finish_reason.is_some() {
                self.finished = true;
                self.finish_reason = choice.finish_reason.clone();
                content = true;
            }
            let Some(delta) = choice.delta.or(choice.message) else {
                continue;
            };
            content |= delta.reasons();
            let piece = content_text(&delta.content);
            if !piece.is_empty() {
                let out = self.redactor.push(&piece);
                self.delivered |= http::deliver(request, &out);
                self.text.push_str(&piece);
                content = true;
            }
            let calls = delta.tool_calls.unwrap_or_default();
            content |= !calls.is_empty();
            for (j, tc) in calls.into_iter().enumerate() {
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
        Ok(content)
    }

    fn is_over(&self) -> bool {
        self.done
    }

    /// A server that closes after its last `finish_reason` chunk without
    /// `[DONE]` gave a whole answer.
    fn whole_at_end(&self) -> bool {
        self.finished
    }

    fn delivered(&self) -> bool {
        self.delivered
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
            finish_reason: self.finish_reason,
        }
    }
}

/// Reads a streamed response to its end.
pub(super) async fn read_stream(
    resp: &mut reqwest::Response,
    request: &ChatRequest,
    secret: Option<&Secret>,
    endpoint: &str,
    stats: &mut sse::StreamStats,
) -> Result<ChatResponse, ModelError> {
    sse::read_stream::<StreamState>(
        resp,
        request,
        secret,
        endpoint,
        "`[DONE]` or a `finish_reason`",
        stats,
    )
    .await
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
        assert_eq!(resp.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn only_chunks_with_content_are_progress() {
        let mut st = StreamState::default();
        let r = request();
        let mut apply = |data: &str| {
            let ev = SseEvent {
                event: String::new(),
                data: data.to_string(),
            };
            st.apply(&ev, &r, None).unwrap()
        };
        for nothing in [
            "",
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":""}}]}"#,
            r#"{"choices":[]}"#,
        ] {
            assert!(!apply(nothing), "{nothing}");
        }
        for content in [
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"add"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning":"hmm"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#,
        ] {
            assert!(apply(content), "{content}");
        }
        assert!(!apply("[DONE]"));
    }

    #[test]
    fn plain_responses_are_read_leniently() {
        let body = br#"{"choices":[{"message":{"content":null,"tool_calls":[{"function":{"name":"add","arguments":{"a":1}}}]}}]}"#;
        let r = parse_plain(body, 4, None).unwrap();
        assert_eq!(&*r.tool_calls[0].id, "call_4_0");
        assert_eq!(&*r.tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(r.usage, Usage::default());
        assert_eq!(r.finish_reason, None, "a server that gives no reason");
        let cut =
            br#"{"choices":[{"message":{"content":"half an ans"},"finish_reason":"length"}]}"#;
        let r = parse_plain(cut, 0, None).unwrap();
        assert_eq!(r.finish_reason.as_deref(), Some("length"));
        assert_eq!(
            parse_plain(b"not json", 0, None).unwrap_err().kind(),
            "malformed_response"
        );
    }
}
