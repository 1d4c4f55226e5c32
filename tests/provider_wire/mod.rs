//! Loopback model servers for the provider tests: an axum server on
//! 127.0.0.1:0 that answers each POST with the next scripted [`Reply`]
//! (the last one repeats, so one reply makes a storm) and records what it
//! was sent.
//!
//! Included by the `provider_*` test binaries with `mod provider_wire;`;
//! each uses part of it, hence `dead_code` is allowed.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, missing_docs)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::Value;

/// One answer of the server.
#[derive(Clone, Debug)]
pub(crate) enum Reply {
    /// A status, extra headers and a body (`application/json`).
    Json(u16, Vec<(&'static str, String)>, String),
    /// A 200 `text/event-stream` body sent as these pieces.
    Sse(Vec<String>),
    /// A 200 event stream that sends these pieces and then drops the
    /// connection mid-body.
    SseThenDrop(Vec<String>),
    /// A 200 event stream that sends `head`, then `keep` every `every`
    /// for as long as the client reads (a server that holds a request
    /// open with keep-alives).
    SseKeepAlive {
        head: Vec<String>,
        keep: String,
        every: std::time::Duration,
    },
}

impl Reply {
    /// A 200 JSON body.
    pub(crate) fn ok(body: Value) -> Reply {
        Reply::Json(200, Vec::new(), body.to_string())
    }

    /// An error status with a JSON body.
    pub(crate) fn status(status: u16, body: Value) -> Reply {
        Reply::Json(status, Vec::new(), body.to_string())
    }
}

/// What the server was sent.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A running loopback server.
pub(crate) struct Wire {
    /// `http://127.0.0.1:PORT/v1`
    pub(crate) base_url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Wire {
    /// What the server received, in order.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests came.
    pub(crate) fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// SSE `data:` lines, one event each, as OpenAI sends them.
pub(crate) fn data_events(chunks: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    out.push("data: [DONE]\n\n".to_string());
    out
}

/// SSE events with names, as Anthropic sends them.
pub(crate) fn named_events(events: &[(&str, Value)]) -> Vec<String> {
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

/// Starts a server that answers POSTs to any path under `/v1` with
/// `replies`, one per request, the last repeated.
pub(crate) async fn serve(replies: Vec<Reply>) -> Wire {
    let queue = Arc::new(Mutex::new(VecDeque::from(replies)));
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let (q, s) = (queue.clone(), seen.clone());
    let handler = move |uri: axum::http::Uri, headers: HeaderMap, body: String| {
        let (q, s) = (q.clone(), s.clone());
        async move {
            s.lock().unwrap().push(Seen {
                path: uri.path().to_string(),
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                    .collect(),
                body: serde_json::from_str(&body).unwrap_or(Value::Null),
            });
            let reply = {
                let mut q = q.lock().unwrap();
                if q.len() > 1 {
                    q.pop_front().unwrap()
                } else {
                    q.front().cloned().expect("a reply")
                }
            };
            respond(reply)
        }
    };
    let app = Router::new()
        .route("/v1/chat/completions", post(handler.clone()))
        .route("/v1/messages", post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Wire {
        base_url: format!("http://{addr}/v1"),
        seen,
        task,
    }
}

fn respond(reply: Reply) -> Response {
    match reply {
        Reply::Json(status, headers, body) => {
            let mut b = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json");
            for (k, v) in headers {
                b = b.header(k, v);
            }
            b.body(Body::from(body)).unwrap()
        }
        Reply::Sse(pieces) => sse(pieces, false),
        Reply::SseThenDrop(pieces) => sse(pieces, true),
        Reply::SseKeepAlive { head, keep, every } => sse_keep_alive(head, keep, every),
    }
}

fn sse_keep_alive(head: Vec<String>, keep: String, every: std::time::Duration) -> Response {
    use futures_util::StreamExt;
    let head = futures_util::stream::iter(head.into_iter().map(Ok::<_, std::io::Error>));
    let pings = futures_util::stream::unfold(keep, move |keep| async move {
        tokio::time::sleep(every).await;
        Some((Ok(keep.clone()), keep))
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(head.chain(pings)))
        .unwrap()
}

fn sse(pieces: Vec<String>, drop_after: bool) -> Response {
    use futures_util::StreamExt;
    let items: Vec<Result<String, std::io::Error>> = pieces.into_iter().map(Ok).collect();
    // The drop comes once the pieces have gone out (the client has read
    // them), as when a server dies mid-answer.
    let tail = futures_util::stream::once(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        Err(std::io::Error::other("connection dropped"))
    })
    .filter(move |_| std::future::ready(drop_after));
    let body = futures_util::stream::iter(items).chain(tail);
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap()
}

pub(crate) mod vendor;
