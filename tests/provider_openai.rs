#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The OpenAI-compatible provider against a loopback server that speaks
//! Chat Completions (M2, M4, M8, R7): plain and streamed replies, parallel
//! tool calls streamed in pieces, the usage-only last chunk, 429s with
//! `retry-after`, 500 storms, a connection dropped mid-stream, bodies and
//! tool arguments that are not JSON, the circuit breaker, a canary key that
//! never leaks, and whole runs through the host and the CLI.

mod provider_wire;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentvisor::ports::model::ToolSpec;
use agentvisor::ports::model::{ChatModel, ChatRequest, Message, ModelError, RetrySink, Role};
use agentvisor::providers::{
    Breaker, BreakerPolicy, CircuitBreaking, OpenAiConfig, OpenAiModel, ProviderConfig,
    RetryPolicy, Retrying, Secret, StreamMode,
};
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunEvent, RunStatus};
use provider_wire::{data_events, serve, Reply, Wire};
use serde_json::{json, Value};

const KEY: &str = "sk-test-key-0123456789";

fn model(wire: &Wire, stream: StreamMode) -> OpenAiModel {
    let mut c = OpenAiConfig::new("gpt-4o-mini", &wire.base_url);
    c.api_key = Secret::new(KEY);
    c.stream = stream;
    OpenAiModel::new(c)
}

fn tools() -> Arc<[ToolSpec]> {
    Arc::from(vec![ToolSpec {
        name: "add".into(),
        description: "adds".into(),
        parameters: json!({"type": "object", "properties": {"a": {"type": "number"}}}),
    }])
}

fn request() -> ChatRequest {
    let messages = vec![
        Message::text(Role::System, "be brief"),
        Message::text(Role::User, "add 2 and 3"),
    ];
    ChatRequest::new(Arc::new(messages), tools(), 0)
}

/// A delta sink that keeps what it gets.
fn sink() -> (agentvisor::ports::model::DeltaSink, Arc<Mutex<Vec<String>>>) {
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let g = got.clone();
    (
        Arc::new(move |t: &str| g.lock().unwrap().push(t.to_string())),
        got,
    )
}

fn text_reply(text: &str, input: u64, output: u64) -> Reply {
    Reply::ok(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
    }))
}

fn tool_reply(calls: &[(&str, &str, &str)]) -> Reply {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
        })
        .collect();
    Reply::ok(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 10},
    }))
}

fn fast_retries(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        base_delay: Duration::from_millis(2),
        max_delay: Duration::from_millis(4),
    }
}

#[tokio::test]
async fn a_plain_reply_carries_parallel_tool_calls_and_usage() {
    let wire = serve(vec![Reply::ok(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "adding", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}},
            {"id": "call_2", "type": "function", "function": {"name": "upper", "arguments": "{\"text\":\"x\"}"}}
        ]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 31, "completion_tokens": 12,
                  "prompt_tokens_details": {"cached_tokens": 16},
                  "completion_tokens_details": {"reasoning_tokens": 4}}
    }))])
    .await;
    let r = model(&wire, StreamMode::WhenListened)
        .complete(request())
        .await
        .unwrap();
    assert_eq!(r.text, "adding");
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!(&*r.tool_calls[1].id, "call_2");
    assert_eq!(&*r.tool_calls[0].arguments, r#"{"a":2,"b":3}"#);
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cache_read_tokens,
            r.usage.reasoning_tokens
        ),
        (31, 12, 16, 4)
    );
    let seen = &wire.seen()[0];
    assert_eq!(seen.path, "/v1/chat/completions");
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(seen.body["model"], "gpt-4o-mini");
    assert_eq!(seen.body["messages"][0]["role"], "system");
    assert_eq!(seen.body["tools"][0]["function"]["name"], "add");
    assert!(
        seen.body.get("stream").is_none(),
        "nobody listens: no stream"
    );
    assert!(seen.body.get("response_format").is_none());
}

#[tokio::test]
async fn streamed_text_reaches_the_sink_and_usage_comes_in_the_last_chunk() {
    let wire = serve(vec![Reply::Sse(data_events(&[
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "2+3"}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "=5, "}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "DONE"}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 8}}),
    ]))])
    .await;
    let (on_delta, got) = sink();
    let mut req = request();
    req.on_delta = Some(on_delta);
    let r = model(&wire, StreamMode::WhenListened)
        .complete(req)
        .await
        .unwrap();
    assert_eq!(r.text, "2+3=5, DONE");
    assert_eq!(*got.lock().unwrap(), vec!["2+3", "=5, ", "DONE"]);
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (120, 8));
    let body = &wire.seen()[0].body;
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn streamed_parallel_tool_calls_split_across_chunks_reassemble() {
    let wire = serve(vec![Reply::Sse(data_events(&[
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "call_a", "type": "function", "function": {"name": "add", "arguments": ""}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{\"a\": 2"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "id": "call_b", "type": "function", "function": {"name": "upper", "arguments": "{\"text\""}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ", \"b\": 3}"}},
            {"index": 1, "function": {"arguments": ": \"hi\"}"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 20}}),
    ]))])
    .await;
    let r = model(&wire, StreamMode::Always)
        .complete(request())
        .await
        .unwrap();
    let calls: Vec<(&str, &str, &str)> = r
        .tool_calls
        .iter()
        .map(|c| (&*c.id, &*c.name, &*c.arguments))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("call_a", "add", r#"{"a": 2, "b": 3}"#),
            ("call_b", "upper", r#"{"text": "hi"}"#)
        ]
    );
    assert_eq!(r.usage.total(), 70);
}

#[tokio::test]
async fn a_response_schema_goes_out_as_response_format() {
    let wire = serve(vec![text_reply("{\"sum\": 5}", 1, 1)]).await;
    let mut req = request();
    let schema = json!({"type": "object", "properties": {"sum": {"type": "number"}}});
    req.response_schema = Some(Arc::new(schema.clone()));
    model(&wire, StreamMode::Never).complete(req).await.unwrap();
    let body = &wire.seen()[0].body;
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(body["response_format"]["json_schema"]["schema"], schema);
}

/// A retry hook that records each (kind, delay).
type RetryLog = Arc<Mutex<Vec<(String, Duration)>>>;

fn retry_log() -> (RetrySink, RetryLog) {
    let log: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
    let l = log.clone();
    (
        Arc::new(move |e: &ModelError, d: Duration| {
            l.lock().unwrap().push((e.kind().to_string(), d))
        }),
        log,
    )
}

#[tokio::test]
async fn a_429_with_retry_after_is_typed_and_retried_after_the_hint() {
    let wire = serve(vec![
        Reply::Json(
            429,
            vec![("retry-after-ms", "30".into())],
            json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}).to_string(),
        ),
        text_reply("hi", 3, 1),
    ])
    .await;
    // The provider alone reports the hint.
    let e = model(&wire, StreamMode::Never)
        .complete(request())
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ModelError::RateLimited {
            retry_after: Some(Duration::from_millis(30))
        }
    );
    // Behind the retry layer, the next attempt waits at least the hint.
    let wire = serve(wire_replies_429_then_ok()).await;
    let retrying = Retrying::new(Arc::new(model(&wire, StreamMode::Never)), fast_retries(3));
    let (hook, log) = retry_log();
    let mut req = request();
    req.on_retry = Some(hook);
    let r = retrying.complete(req).await.unwrap();
    assert_eq!(r.text, "hi");
    assert_eq!(wire.count(), 2);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].0, "rate_limited");
    assert!(log[0].1 >= Duration::from_millis(30), "{:?}", log[0].1);
}

fn wire_replies_429_then_ok() -> Vec<Reply> {
    vec![
        Reply::Json(429, vec![("retry-after-ms", "30".into())], "{}".into()),
        text_reply("hi", 3, 1),
    ]
}

#[tokio::test]
async fn quota_and_refused_keys_are_not_retried() {
    for (status, body, kind) in [
        (
            429,
            json!({"error": {"message": "You exceeded your current quota", "type": "insufficient_quota"}}),
            "quota",
        ),
        (
            401,
            json!({"error": {"message": "Incorrect API key provided"}}),
            "auth",
        ),
        (
            400,
            json!({"error": {"message": "bad messages"}}),
            "bad_request",
        ),
        (
            413,
            json!({"error": {"message": "too large"}}),
            "bad_request",
        ),
    ] {
        let wire = serve(vec![Reply::status(status, body)]).await;
        let retrying = Retrying::new(Arc::new(model(&wire, StreamMode::Never)), fast_retries(3));
        let e = retrying.complete(request()).await.unwrap_err();
        assert_eq!(e.kind(), kind, "{status}");
        assert_eq!(wire.count(), 1, "{status} is not retried");
    }
}

#[tokio::test]
async fn a_500_storm_exhausts_the_retries_and_opens_the_circuit() {
    let wire = serve(vec![Reply::status(
        500,
        json!({"error": {"message": "boom"}}),
    )])
    .await;
    // Retries alone: 1 + 3 attempts, then the server's error.
    let retrying = Retrying::new(Arc::new(model(&wire, StreamMode::Never)), fast_retries(3));
    let e = retrying.complete(request()).await.unwrap_err();
    assert_eq!(e.kind(), "server_error");
    assert!(e.to_string().contains("boom"), "{e}");
    assert_eq!(wire.count(), 4);

    // With a breaker inside: it opens after 3, the retries stop there and
    // the call ends with the server's error; the next call is refused.
    let wire = serve(vec![Reply::status(
        503,
        json!({"error": {"message": "overloaded"}}),
    )])
    .await;
    let breaker = Arc::new(Breaker::new(
        "openai:gpt-4o-mini",
        BreakerPolicy {
            failures: 3,
            cool_down: Duration::from_secs(60),
        },
    ));
    let guarded: Arc<dyn ChatModel> = Arc::new(CircuitBreaking::new(
        Arc::new(model(&wire, StreamMode::Never)),
        breaker.clone(),
    ));
    let retrying = Retrying::new(guarded, fast_retries(10));
    let e = retrying.complete(request()).await.unwrap_err();
    assert_eq!(e.kind(), "server_error");
    assert_eq!(wire.count(), 3);
    assert_eq!(retrying.admit().map_err(|e| e.kind()), Err("circuit_open"));
    let e = retrying.complete(request()).await.unwrap_err();
    assert_eq!(e.kind(), "circuit_open");
    assert_eq!(wire.count(), 3, "an open circuit sends nothing");
}

#[tokio::test]
async fn a_stream_dropped_after_text_is_interrupted_and_not_retried() {
    let pieces = vec![
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
        ),
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": "lo"}}]})
        ),
    ];
    let wire = serve(vec![
        Reply::SseThenDrop(pieces.clone()),
        text_reply("again", 1, 1),
    ])
    .await;
    let retrying = Retrying::new(Arc::new(model(&wire, StreamMode::Always)), fast_retries(3));
    let (on_delta, got) = sink();
    let mut req = request();
    req.on_delta = Some(on_delta);
    let e = retrying.complete(req).await.unwrap_err();
    assert!(matches!(e, ModelError::Interrupted(_)), "{e:?}");
    assert_eq!(e.kind(), "transport");
    assert_eq!(*got.lock().unwrap(), vec!["Hel", "lo"]);
    assert_eq!(wire.count(), 1, "content was delivered: no retry");

    // Nobody listened, so nothing was delivered: the drop is retried.
    let wire = serve(vec![Reply::SseThenDrop(pieces), text_reply("again", 1, 1)]).await;
    let retrying = Retrying::new(Arc::new(model(&wire, StreamMode::Always)), fast_retries(3));
    let r = retrying.complete(request()).await.unwrap();
    assert_eq!(r.text, "again");
    assert_eq!(wire.count(), 2);
}

#[tokio::test]
async fn a_stream_that_just_stops_says_where_and_what_arrived() {
    let piece = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
    );
    let wire = serve(vec![Reply::Sse(vec![piece.clone()])]).await;
    let e = model(&wire, StreamMode::Always)
        .complete(request())
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ModelError::Incomplete(format!(
            "POST {}/chat/completions answered 200 OK, but the stream ended before `[DONE]` or a `finish_reason`, after {} bytes and 1 event",
            wire.base_url,
            piece.len()
        ))
    );
    assert_eq!(e.kind(), "incomplete_response");
    assert!(e.is_retryable());
}

#[tokio::test]
async fn a_body_that_is_not_json_is_malformed_and_not_retried() {
    let wire = serve(vec![Reply::Json(
        200,
        Vec::new(),
        "<html>gateway</html>".into(),
    )])
    .await;
    let retrying = Retrying::new(Arc::new(model(&wire, StreamMode::Never)), fast_retries(3));
    let e = retrying.complete(request()).await.unwrap_err();
    assert_eq!(e.kind(), "malformed_response");
    assert!(e.to_string().contains("<html>"), "{e}");
    assert_eq!(wire.count(), 1);
    // A stream chunk that is not JSON too.
    let wire = serve(vec![Reply::Sse(vec!["data: {not json\n\n".into()])]).await;
    let e = model(&wire, StreamMode::Always)
        .complete(request())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "malformed_response");
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_error() {
    let wire = serve(vec![text_reply("x", 1, 1)]).await;
    let base = wire.base_url.clone();
    drop(wire);
    tokio::task::yield_now().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let _ = base;
    let mut c = OpenAiConfig::new("m", closed);
    c.stream = StreamMode::Never;
    let e = OpenAiModel::new(c).complete(request()).await.unwrap_err();
    assert_eq!(e.kind(), "transport", "{e}");
    assert!(e.is_retryable());
}

// ---- Whole runs through the host ----

fn hello(model: &str, base_url: &str) -> AgentSpec {
    AgentSpec::from_yaml(&format!(
        "name: hello\nmodel: {model}\nbase_url: {base_url}\nsystem: You add numbers and shout the result.\n\
         prompt: Add 2 and 3, then shout \"done\".\ntools: [add, upper]\n\
         limits: {{ max_iterations: 12, max_runtime: 60s, stall_timeout: 10s }}\n"
    ))
    .unwrap()
}

fn hello_replies() -> Vec<Reply> {
    vec![
        tool_reply(&[("call_1", "add", r#"{"a":2,"b":3}"#)]),
        tool_reply(&[("call_2", "upper", r#"{"text":"done"}"#)]),
        text_reply("2+3=5, DONE", 120, 8),
    ]
}

async fn host() -> Host {
    Host::builder()
        .config(HostConfig {
            critic_shards: 1,
            ..HostConfig::default()
        })
        .providers(ProviderConfig {
            env: Some(Arc::default()),
            retry: fast_retries(2),
            ..ProviderConfig::default()
        })
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_run_on_openai_keeps_the_scripted_models_result_contract() {
    let wire = serve(hello_replies()).await;
    let host = host().await;
    let r = host
        .execute(
            hello("openai:loopback-model", &wire.base_url),
            Invocation::default(),
        )
        .await
        .unwrap();
    let scripted = host
        .execute(
            AgentSpec::from_file(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/agents/hello.yaml"
            ))
            .unwrap(),
            Invocation::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{:?}", r.error);
    assert_eq!(r.status, scripted.status);
    assert_eq!(r.output, scripted.output);
    assert_eq!(r.iterations, scripted.iterations);
    let contract = |r: &agentvisor::RunResult| {
        r.steps
            .iter()
            .map(|s| {
                (
                    s.iteration,
                    s.tool.clone(),
                    s.args.clone(),
                    s.ok,
                    s.result.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(contract(&r), contract(&scripted));
    let keys = |r: &agentvisor::RunResult| {
        let v = serde_json::to_value(r).unwrap();
        v.as_object().unwrap().keys().cloned().collect::<Vec<_>>()
    };
    assert_eq!(keys(&r), keys(&scripted));
    assert_eq!(r.usage.total(), 40 + 10 + 40 + 10 + 120 + 8);
    assert_eq!(r.cost_micros, 0, "an unknown model costs 0");
    // The second request carried the tool result back.
    let second = &wire.seen()[1].body;
    let msgs = second["messages"].as_array().unwrap();
    assert_eq!(msgs[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(msgs[3]["role"], "tool");
    assert_eq!(msgs[3]["tool_call_id"], "call_1");
    assert_eq!(msgs[3]["content"], "5");
    host.shutdown().await;
}

#[tokio::test]
async fn a_streamed_run_emits_text_deltas_a_price_warning_and_its_cost() {
    let wire = serve(vec![Reply::Sse(data_events(&[
        json!({"choices": [{"index": 0, "delta": {"content": "2+3"}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "=5"}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 120, "completion_tokens": 8}}),
    ]))])
    .await;
    let host = host().await;
    let (handle, events) = host
        .submit_streaming(
            hello("openai:loopback-model", &wire.base_url),
            Invocation::default(),
        )
        .await
        .unwrap();
    let mut events = events;
    let mut seen = Vec::new();
    while let Some(e) = events.next().await {
        seen.push(e.event);
    }
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok);
    let deltas: String = seen
        .iter()
        .filter_map(|e| match e {
            RunEvent::TextDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, "2+3=5");
    assert!(
        seen.iter().any(|e| matches!(e, RunEvent::Warning { kind, message } if kind == "unknown_price" && message.contains("loopback-model"))),
        "{seen:?}"
    );

    // A model the price table knows is priced: 120 × $0.15 + 8 × $0.60 per Mtok.
    let wire = serve(vec![text_reply("2+3=5", 120, 8)]).await;
    let r = host
        .execute(
            hello("openai:gpt-4o-mini", &wire.base_url),
            Invocation::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.cost_micros, 23);
    host.shutdown().await;
}

#[tokio::test]
async fn tool_arguments_that_are_not_json_are_a_tool_error_not_a_crash() {
    let wire = serve(vec![
        tool_reply(&[("call_1", "add", r#"{"a": 2, "b":"#)]),
        text_reply("sorry, 5", 10, 2),
    ])
    .await;
    let host = host().await;
    let r = host
        .execute(
            hello("openai:loopback-model", &wire.base_url),
            Invocation::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok);
    assert_eq!(r.steps.len(), 1);
    assert!(!r.steps[0].ok);
    let err = r.steps[0].error.as_deref().unwrap_or_default();
    assert!(err.starts_with("invalid_arguments"), "{err}");
    let back = &wire.seen()[1].body["messages"][3];
    assert_eq!(back["role"], "tool");
    assert!(back["content"]
        .as_str()
        .unwrap()
        .contains("invalid_arguments"));
    host.shutdown().await;
}

#[tokio::test]
async fn an_open_circuit_rejects_new_runs_at_once() {
    // A 503: the endpoint is down (a 500 to one request shape would be
    // that shape's fault, see the breaker's module doc).
    let wire = serve(vec![Reply::status(
        503,
        json!({"error": {"message": "down"}}),
    )])
    .await;
    let host = Host::builder()
        .providers(ProviderConfig {
            env: Some(Arc::default()),
            retry: fast_retries(5),
            breaker: BreakerPolicy {
                failures: 2,
                cool_down: Duration::from_secs(600),
            },
            ..ProviderConfig::default()
        })
        .build()
        .await
        .unwrap();
    let spec = hello("openai:loopback-model", &wire.base_url);
    let first = host
        .execute(spec.clone(), Invocation::default())
        .await
        .unwrap();
    assert_eq!(first.status, RunStatus::Error);
    assert_eq!(first.error_kind.as_deref(), Some("server_error"));
    assert_eq!(wire.count(), 2);
    let second = host.execute(spec, Invocation::default()).await.unwrap();
    assert_eq!(second.status, RunStatus::Rejected);
    assert_eq!(second.error_kind.as_deref(), Some("circuit_open"));
    assert_eq!(second.iterations, 0);
    assert_eq!(wire.count(), 2, "a rejected run sends nothing");
    host.shutdown().await;
}

/// A log sink for the canary test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_canary_key_never_reaches_an_error_event_record_or_log() {
    const CANARY: &str = "sk-canary-7f3a9e1c5b2d4680";
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // Servers that echo the key in every way they can.
    let echo = format!("Incorrect API key provided: {CANARY}. Bearer {CANARY}");
    let wire = serve(vec![
        Reply::status(500, json!({"error": {"message": echo}})),
        Reply::status(401, json!({"error": {"message": echo}})),
        Reply::status(400, json!({"error": {"message": echo}})),
        Reply::Json(200, Vec::new(), format!("not json {CANARY}")),
        Reply::Sse(vec![format!(
            "data: {}\n\n",
            json!({"error": {"message": echo, "type": "server_error"}})
        )]),
        Reply::Sse(vec![format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": "x"}}]})
        )]),
    ])
    .await;
    let env = Arc::new(std::collections::HashMap::from([(
        "CANARY_KEY".to_string(),
        CANARY.to_string(),
    )]));
    let host = Host::builder()
        .providers(ProviderConfig {
            env: Some(env),
            retry: fast_retries(0),
            ..ProviderConfig::default()
        })
        .build()
        .await
        .unwrap();
    let mut spec = hello("openai:loopback-model", &wire.base_url);
    spec.api_key_env = Some("CANARY_KEY".into());
    let mut everything = String::new();
    let mut runs = Vec::new();
    for _ in 0..6 {
        let (handle, mut events) = host
            .submit_streaming(spec.clone(), Invocation::default())
            .await
            .unwrap();
        while let Some(e) = events.next().await {
            everything.push_str(&serde_json::to_string(&e).unwrap());
        }
        let r = handle.await;
        assert_ne!(r.status, RunStatus::Ok);
        runs.push(r.run_id);
        everything.push_str(&serde_json::to_string(&r).unwrap());
        everything.push_str(&format!("{r:?}"));
    }
    // The key did go out, in its header.
    assert!(wire
        .seen()
        .iter()
        .all(|s| s.header("authorization") == Some(format!("Bearer {CANARY}").as_str())));
    host.shutdown().await;
    for run in runs {
        let records = host.audit_store().run_records(run).await.unwrap();
        assert!(records.len() > 2);
        everything.push_str(&format!("{records:?}"));
    }
    everything.push_str(&String::from_utf8_lossy(&logs.0.lock().unwrap()));
    assert!(
        everything.contains("Incorrect API key provided"),
        "the echoes were seen"
    );
    assert!(
        !everything.contains(CANARY),
        "the canary leaked:\n{everything}"
    );
    assert!(
        !everything.contains("canary-7f3a"),
        "part of the canary leaked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_runs_hello_on_an_openai_compatible_server() {
    let wire = serve(hello_replies()).await;
    let base = wire.base_url.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_agentvisor"))
            .args([
                "run",
                "examples/agents/hello.yaml",
                "--model",
                "openai:loopback-model",
                "--json",
                "--db",
                ":memory:",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("OPENAI_BASE_URL", &base)
            .env_remove("OPENAI_API_KEY")
            .env_remove("AGENTVISOR_DB")
            .env_remove("AGENTVISOR_TIERS")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["output"], "2+3=5, DONE");
    assert_eq!(v["steps"].as_array().unwrap().len(), 2);
    assert_eq!(v["usage"]["output_tokens"], 10 + 10 + 8);
    assert_eq!(wire.count(), 3, "the manifest's script was ignored");
    assert!(
        wire.seen()[0].header("authorization").is_none(),
        "no key, no header"
    );
}
