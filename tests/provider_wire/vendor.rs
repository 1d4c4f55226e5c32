//! A fake of a small local OpenAI-compatible server (what llama.cpp-based
//! servers such as llama-cpp-python 0.3.x do), kept as the regression suite
//! for real servers. It reproduces their quirks:
//!
//! - **one request at a time**: a request waits for the one slot before any
//!   byte of its answer (a queued call sees no first token), and holds it
//!   until its body is sent;
//! - **no usage** in streamed replies (and none in plain ones);
//! - **500 on `content: null`** in an assistant message;
//! - **tools ignored without `tool_choice`**: the model answers in text;
//! - **500 on `response_format`**;
//! - **slow**: a delay before the first token and between streamed pieces.
//!
//! [`Quirks`] add what other setups do: llama-cpp-python's
//! `chatml-function-calling` format (an empty 200 to a streamed request
//! with tools and `tool_choice` `auto` or `required`; `response_format:
//! {type: json_object, schema}` constrained by a grammar; usage in plain
//! replies), a server that refuses every request with tools (a 500 that
//! names them), and a small context (llama.cpp's server answers a streamed
//! request that does not fit with a 200 and an `error:` line, a plain one
//! with a 400).
//!
//! The "model" plays the hello agent from the transcript it is sent (no
//! state between requests): no tool result yet → `add(2, 3)`; one →
//! `upper("done")`; two → `2+3=5, DONE`. Asked for a JSON schema in the
//! system prompt, it answers `{"sum": 5}`.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

/// How slow the fake is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    /// Before the first byte of an answer (once it has the slot).
    pub(crate) first: Duration,
    /// Between streamed pieces.
    pub(crate) between: Duration,
}

impl Pace {
    pub(crate) fn quick() -> Pace {
        Pace {
            first: Duration::from_millis(2),
            between: Duration::from_millis(1),
        }
    }
}

/// What the fake does besides the defaults (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Quirks {
    /// A streamed request with tools and `tool_choice` `auto` or
    /// `required` gets a 200 `text/event-stream` with an empty body
    /// (llama-cpp-python's log: "Automatic streaming tool choice is not
    /// supported").
    pub(crate) empty_streamed_tool_choice: bool,
    /// `response_format: {type: json_object, schema}` is taken (the answer
    /// follows the schema); `json_schema` is still refused.
    pub(crate) json_object_schema: bool,
    /// Plain (non-streamed) replies report usage: 20 prompt tokens, 5
    /// completion tokens.
    pub(crate) plain_usage: bool,
    /// Every request with tools gets a 500 that names them.
    pub(crate) refuse_tools: bool,
    /// A request whose messages hold more characters than this does not fit
    /// the context.
    pub(crate) context_chars: Option<usize>,
}

impl Quirks {
    /// llama-cpp-python with `--chat_format chatml-function-calling`.
    pub(crate) fn chatml_function_calling() -> Quirks {
        Quirks {
            empty_streamed_tool_choice: true,
            json_object_schema: true,
            plain_usage: true,
            ..Quirks::default()
        }
    }
}

/// What llama.cpp's server says when a request does not fit.
pub(crate) const CONTEXT_MESSAGE: &str =
    "the request exceeds the available context size, try increasing it";

/// What the fake saw.
#[derive(Default)]
struct Log {
    bodies: Mutex<Vec<Value>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    errors: AtomicUsize,
}

/// A running fake.
pub(crate) struct Vendor {
    /// `http://127.0.0.1:PORT/v1`
    pub(crate) base_url: String,
    log: Arc<Log>,
    task: tokio::task::JoinHandle<()>,
}

impl Vendor {
    /// Every request body, in arrival order.
    pub(crate) fn bodies(&self) -> Vec<Value> {
        self.log.bodies.lock().unwrap().clone()
    }

    /// Requests seen.
    pub(crate) fn count(&self) -> usize {
        self.log.bodies.lock().unwrap().len()
    }

    /// The most requests it ever answered at once (1: it is single-slot).
    pub(crate) fn max_in_flight(&self) -> usize {
        self.log.max_in_flight.load(Ordering::SeqCst)
    }

    /// 500s it answered.
    pub(crate) fn errors(&self) -> usize {
        self.log.errors.load(Ordering::SeqCst)
    }
}

impl Drop for Vendor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the fake.
pub(crate) async fn serve_vendor(pace: Pace) -> Vendor {
    serve_vendor_with(pace, Quirks::default()).await
}

/// Starts the fake with `quirks`.
pub(crate) async fn serve_vendor_with(pace: Pace, quirks: Quirks) -> Vendor {
    let log = Arc::new(Log::default());
    let slot = Arc::new(tokio::sync::Mutex::new(()));
    let l = log.clone();
    let handler = move |body: String| {
        let (log, slot) = (l.clone(), slot.clone());
        let quirks = quirks;
        async move {
            let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            log.bodies.lock().unwrap().push(body.clone());
            let guard = slot.lock_owned().await;
            let now = log.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            log.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let done = {
                let log = log.clone();
                move || {
                    log.in_flight.fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                }
            };
            let streamed = body["stream"] == true;
            if let Some(limit) = quirks.context_chars {
                let chars: usize = body["messages"]
                    .as_array()
                    .map(|m| m.iter().map(|m| m["content"].to_string().len()).sum())
                    .unwrap_or(0);
                if chars > limit {
                    tokio::time::sleep(pace.first).await;
                    done();
                    let error = json!({"code": 400, "message": CONTEXT_MESSAGE, "type": "exceed_context_size_error"});
                    return if streamed {
                        Response::builder()
                            .status(200)
                            .header("content-type", "text/event-stream")
                            .body(Body::from(format!("error: {error}\n\n")))
                            .unwrap()
                    } else {
                        Response::builder()
                            .status(400)
                            .header("content-type", "application/json")
                            .body(Body::from(json!({ "error": error }).to_string()))
                            .unwrap()
                    };
                }
            }
            let tool_choice = body.get("tool_choice").cloned().unwrap_or(Value::Null);
            let has_tools = body["tools"].as_array().is_some_and(|t| !t.is_empty());
            if quirks.empty_streamed_tool_choice
                && streamed
                && has_tools
                && (tool_choice == "auto" || tool_choice == "required")
            {
                tokio::time::sleep(pace.first).await;
                done();
                return Response::builder()
                    .status(200)
                    .header("content-type", "text/event-stream")
                    .body(Body::empty())
                    .unwrap();
            }
            if let Some(why) = refusal(&body, &quirks) {
                tokio::time::sleep(pace.first).await;
                log.errors.fetch_add(1, Ordering::SeqCst);
                done();
                return Response::builder()
                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                    .header("content-type", "application/json")
                    .body(Body::from(
                        json!({"error": {"message": why, "type": "server_error", "code": 500}})
                            .to_string(),
                    ))
                    .unwrap();
            }
            let answer = answer(&body);
            if streamed {
                stream(answer, pace, done)
            } else {
                tokio::time::sleep(pace.first).await;
                done();
                let mut reply = plain(&answer);
                if quirks.plain_usage {
                    reply["usage"] =
                        json!({"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25});
                }
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from(reply.to_string()))
                    .unwrap()
            }
        }
    };
    let app = Router::new().route("/v1/chat/completions", post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Vendor {
        base_url: format!("http://{addr}/v1"),
        log,
        task,
    }
}

/// Why the server chokes on a request (its 500 message), if it does.
fn refusal(body: &Value, quirks: &Quirks) -> Option<String> {
    if let Some(format) = body.get("response_format") {
        let grammar = format["type"] == "json_object" && format.get("schema").is_some();
        if !(quirks.json_object_schema && grammar) {
            return Some(format!(
                "Unrecognized response_format type: {}",
                format["type"].as_str().unwrap_or("?")
            ));
        }
    }
    if quirks.refuse_tools && body["tools"].as_array().is_some_and(|t| !t.is_empty()) {
        return Some("this chat format cannot take `tools`".into());
    }
    let messages = body["messages"].as_array()?;
    for m in messages {
        if m["role"] == "assistant" && !m["content"].is_string() && !m["content"].is_array() {
            return Some("'NoneType' object is not subscriptable".into());
        }
    }
    None
}

/// What the model says.
enum Answer {
    Text(String),
    Call {
        id: String,
        name: String,
        args: Value,
    },
}

fn answer(body: &Value) -> Answer {
    let empty = Vec::new();
    let messages = body["messages"].as_array().unwrap_or(&empty);
    let system = messages
        .iter()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        .collect::<String>();
    // Asked in the prompt, or constrained by a grammar.
    if system.contains("JSON Schema") || body["response_format"]["type"] == "json_object" {
        return Answer::Text("{\"sum\": 5}".into());
    }
    // Without `tool_choice` the server's chat template leaves the tools out.
    let tools = body["tools"].as_array().is_some_and(|t| !t.is_empty())
        && body.get("tool_choice").is_some_and(|c| c != "none");
    if !tools {
        return Answer::Text("I would add them, but I have no tools.".into());
    }
    let results = messages.iter().filter(|m| m["role"] == "tool").count();
    match results {
        0 => Answer::Call {
            id: "call_add".into(),
            name: "add".into(),
            args: json!({"a": 2, "b": 3}),
        },
        1 => Answer::Call {
            id: "call_upper".into(),
            name: "upper".into(),
            args: json!({"text": "done"}),
        },
        _ => Answer::Text("2+3=5, DONE".into()),
    }
}

/// A plain completion, without usage.
fn plain(answer: &Answer) -> Value {
    let message = match answer {
        Answer::Text(t) => json!({"role": "assistant", "content": t}),
        Answer::Call { id, name, args } => json!({
            "role": "assistant", "content": null,
            "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}],
        }),
    };
    json!({"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
}

/// A streamed completion in pieces, without a usage chunk; the slot is
/// released (`done`) once the last piece is out.
fn stream(answer: Answer, pace: Pace, done: impl FnOnce() + Send + 'static) -> Response {
    use futures_util::StreamExt;
    let mut chunks: Vec<Value> =
        vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})];
    match &answer {
        Answer::Text(t) => {
            let words: Vec<&str> = t.split_inclusive(' ').collect();
            for w in words {
                chunks.push(json!({"choices": [{"index": 0, "delta": {"content": w}}]}));
            }
            chunks.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
        }
        Answer::Call { id, name, args } => {
            chunks.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}}]}));
            let text = args.to_string();
            let (a, b) = text.split_at(text.len() / 2);
            for part in [a, b] {
                chunks.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": part}}]}}]}));
            }
            chunks.push(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            );
        }
    }
    let mut pieces: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    pieces.push("data: [DONE]\n\n".into());
    let n = pieces.len();
    let done = Arc::new(Mutex::new(Some(done)));
    let body = futures_util::stream::iter(pieces.into_iter().enumerate()).then(move |(i, p)| {
        let done = done.clone();
        async move {
            tokio::time::sleep(if i == 0 { pace.first } else { pace.between }).await;
            if i + 1 == n {
                if let Some(f) = done.lock().unwrap().take() {
                    f();
                }
            }
            Ok::<_, std::io::Error>(p)
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap()
}
