//! OpenTelemetry traces (the `otel` feature): a parent run that delegates
//! to a child and calls a tool, exported over OTLP/HTTP to a receiver in
//! this test (a loopback axum server that decodes the protobuf
//! `ExportTraceServiceRequest`), then checked for span names, GenAI
//! attributes, nesting and a critic decision event.
#![cfg(feature = "otel")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tracing_subscriber::prelude::*;

use agentvisor::otel::Traces;
use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError};
use agentvisor::providers::{RetryPolicy, Retrying};
use agentvisor::{AgentSpec, Invocation, RunStatus};

/// What the receiver got: every span of every request, and the service
/// name each request's resource named.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    services: Vec<String>,
}

type Shared = Arc<Mutex<Received>>;

async fn accept(State(got): State<Shared>, body: Bytes) -> impl IntoResponse {
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new()).into_response();
    };
    let mut got = got.lock().unwrap();
    for rs in req.resource_spans {
        if let Some(r) = &rs.resource {
            if let Some(Value::StringValue(s)) = attr_in(&r.attributes, "service.name") {
                got.services.push(s.clone());
            }
        }
        for ss in rs.scope_spans {
            got.spans.extend(ss.spans);
        }
    }
    // An empty `ExportTraceServiceResponse`: everything accepted.
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        Vec::new(),
    )
        .into_response()
}

/// Starts the receiver on 127.0.0.1 (a thread and runtime of its own, so
/// it outlives the host's runtime and serves the exporter's last flush);
/// returns its base URL.
fn receiver(got: Shared) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new()
                .route("/v1/traces", axum::routing::post(accept))
                .with_state(got);
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

fn attr_in<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text<'a>(s: &'a Span, key: &str) -> &'a str {
    match attr_in(&s.attributes, key) {
        Some(Value::StringValue(v)) => v,
        other => panic!("span `{}`: `{key}` is {other:?}", s.name),
    }
}

fn int(s: &Span, key: &str) -> i64 {
    match attr_in(&s.attributes, key) {
        Some(Value::IntValue(v)) => *v,
        other => panic!("span `{}`: `{key}` is {other:?}", s.name),
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one `{name}` span: {found:#?}");
    found[0]
}

fn children<'a>(spans: &'a [Span], parent: &Span, name: &str) -> Vec<&'a Span> {
    let mut v: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == name && s.parent_span_id == parent.span_id)
        .collect();
    v.sort_by_key(|s| s.start_time_unix_nano);
    v
}

/// A model that is rate limited once (10 ms), then answers.
struct LimitedOnce(Mutex<bool>);

#[async_trait::async_trait]
impl ChatModel for LimitedOnce {
    fn name(&self) -> &str {
        "flaky:m1"
    }

    async fn complete(&self, _request: ChatRequest) -> Result<ChatResponse, ModelError> {
        if std::mem::replace(&mut *self.0.lock().unwrap(), false) {
            return Err(ModelError::RateLimited {
                retry_after: Some(Duration::from_millis(10)),
            });
        }
        Ok(ChatResponse {
            text: "ok".into(),
            finish_reason: Some("stop".into()),
            ..Default::default()
        })
    }
}

fn write(d: &Path, file: &str, yaml: &str) -> PathBuf {
    let p = d.join(file);
    std::fs::write(&p, yaml).unwrap();
    p
}

#[test]
fn a_delegating_run_exports_genai_spans_nested_by_run() {
    let got: Shared = Arc::default();
    let url = receiver(got.clone());
    // Configured the way a deployment is: the standard variables (this
    // test binary's only test sets them).
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &url);
    std::env::set_var("OTEL_SERVICE_NAME", "otel-test");
    std::env::remove_var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    std::env::remove_var("OTEL_SDK_DISABLED");
    std::env::remove_var("OTEL_TRACES_EXPORTER");
    let traces = Traces::from_env().unwrap().expect("an endpoint is set");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(traces.layer()))
        .unwrap();

    // The child repeats a call (the critic steers it: `runaway`), then
    // answers; the parent delegates to it, calls a tool, waits on its
    // model once (a call that moves into a task), and answers.
    let scratch = support::scratch::Scratch::new("otel");
    let d = scratch.0.clone();
    let child = write(
        &d,
        "helper.yaml",
        "name: helper\ntools: [add]\nlimits: { repeat_limit: 2 }\nscript:\n  - { tool: add, args: { a: 2, b: 3 } }\n  - { tool: add, args: { a: 2, b: 3 } }\n  - { text: \"5\", usage: { input: 7, output: 1 } }\n",
    );
    let parent = write(
        &d,
        "parent.yaml",
        &format!(
            "name: parent\ntools: [add, upper]\nagents:\n  helper: {{ file: {}, description: Adds for you }}\nscript:\n  - {{ tool: agent__helper, args: {{ prompt: \"add 2 and 3\" }}, usage: {{ input: 20, output: 4 }} }}\n  - {{ tool: upper, args: {{ text: done }}, latency: 5ms, usage: {{ input: 30, output: 3 }} }}\n  - {{ text: \"it is 5, DONE\", usage: {{ input: 40, output: 6 }} }}\n",
            child.display()
        ),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (host, _store) = support::host().await;
        let r = host
            .execute(
                AgentSpec::from_file(&parent).unwrap(),
                Invocation::prompt("go"),
            )
            .await
            .unwrap();
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        host.shutdown().await;

        // A second trace: a provider retry, on the call's span.
        let model = Retrying::new(
            Arc::new(LimitedOnce(Mutex::new(true))),
            RetryPolicy::default(),
        );
        let (host, _store) =
            support::host_from(support::builder().model("flaky:m1", Arc::new(model))).await;
        let r = host
            .execute(
                support::spec("name: retrier\nmodel: flaky:m1\n"),
                Invocation::prompt("hi"),
            )
            .await
            .unwrap();
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        host.shutdown().await;
    });
    drop(rt);
    // Every span has ended; shutting the pipeline down exports the batch.
    traces.shutdown().unwrap();

    let got = got.lock().unwrap();
    let spans = &got.spans;
    assert!(
        got.services.iter().all(|s| s == "otel-test") && !got.services.is_empty(),
        "{:?}",
        got.services
    );

    // The retrying run: its own trace, the retry an event of its call.
    let retrier = one(spans, "invoke_agent retrier");
    assert!(retrier.parent_span_id.is_empty());
    assert_eq!(text(retrier, "gen_ai.provider.name"), "flaky");
    assert_eq!(text(retrier, "gen_ai.request.model"), "m1");
    let call = one(spans, "chat m1");
    assert_eq!(call.parent_span_id, retrier.span_id);
    // Why the model stopped, as it said: a string array.
    match attr_in(&call.attributes, "gen_ai.response.finish_reasons") {
        Some(Value::ArrayValue(a)) => {
            let reasons: Vec<_> = a.values.iter().map(|v| v.value.clone()).collect();
            assert_eq!(reasons, [Some(Value::StringValue("stop".into()))]);
        }
        other => panic!("gen_ai.response.finish_reasons: {other:?}"),
    }
    let retry = call
        .events
        .iter()
        .find(|e| e.name == "model.retry")
        .unwrap_or_else(|| panic!("no model.retry event: {:#?}", call.events));
    match attr_in(&retry.attributes, "kind") {
        Some(Value::StringValue(k)) => assert_eq!(k, "rate_limited"),
        other => panic!("kind: {other:?}"),
    }
    let spans: Vec<Span> = spans
        .iter()
        .filter(|s| s.trace_id != retrier.trace_id)
        .cloned()
        .collect();
    let spans = &spans[..];

    // One trace, rooted at the parent's run.
    let root = one(spans, "invoke_agent parent");
    assert!(root.parent_span_id.is_empty(), "the parent's run is a root");
    assert!(spans.iter().all(|s| s.trace_id == root.trace_id));
    assert_eq!(root.kind, SpanKind::Internal as i32);
    assert_eq!(text(root, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(text(root, "gen_ai.agent.name"), "parent");
    assert_eq!(text(root, "gen_ai.provider.name"), "scripted");
    assert_eq!(text(root, "gen_ai.request.model"), "scripted");
    assert_eq!(text(root, "agentvisor.run.status"), "ok");

    // The parent's model calls and tool calls are children of its run.
    let chats = children(spans, root, "chat scripted");
    // A script gives no reason: none is made up.
    assert!(chats
        .iter()
        .all(|c| attr_in(&c.attributes, "gen_ai.response.finish_reasons").is_none()));
    assert_eq!(chats.len(), 3, "{spans:#?}");
    for c in &chats {
        assert_eq!(c.kind, SpanKind::Client as i32);
        assert_eq!(text(c, "gen_ai.operation.name"), "chat");
        assert_eq!(text(c, "gen_ai.provider.name"), "scripted");
        assert_eq!(text(c, "gen_ai.request.model"), "scripted");
    }
    let usage: Vec<(i64, i64)> = chats
        .iter()
        .map(|c| {
            (
                int(c, "gen_ai.usage.input_tokens"),
                int(c, "gen_ai.usage.output_tokens"),
            )
        })
        .collect();
    // The second call waited 5 ms in a task: its span went with it.
    assert_eq!(usage, [(20, 4), (30, 3), (40, 6)]);
    let (child_in, child_out) = (7, 1);
    let delegate = children(spans, root, "execute_tool agent__helper");
    assert_eq!(delegate.len(), 1, "{spans:#?}");
    let delegate = delegate[0];
    assert_eq!(text(delegate, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(text(delegate, "gen_ai.tool.name"), "agent__helper");
    assert_eq!(text(delegate, "gen_ai.tool.type"), "function");
    assert!(!text(delegate, "gen_ai.tool.call.id").is_empty());
    let upper = children(spans, root, "execute_tool upper");
    assert_eq!(upper.len(), 1, "{spans:#?}");
    assert_eq!(upper[0].kind, SpanKind::Internal as i32);

    // The child's run sits under the parent's delegating tool call: its
    // span was made on another critic shard, from that call's task.
    let child_run = one(spans, "invoke_agent helper");
    assert_eq!(child_run.parent_span_id, delegate.span_id);
    assert_eq!(text(child_run, "gen_ai.agent.name"), "helper");
    let child_chats = children(spans, child_run, "chat scripted");
    assert_eq!(child_chats.len(), 3, "{spans:#?}");
    assert_eq!(children(spans, child_run, "execute_tool add").len(), 2);
    // A run's span carries its whole usage (the child's tokens are its own).
    let child_total: i64 = child_chats
        .iter()
        .map(|c| int(c, "gen_ai.usage.input_tokens"))
        .sum();
    assert_eq!(int(child_run, "gen_ai.usage.input_tokens"), child_total);
    assert_eq!(
        int(child_chats[2], "gen_ai.usage.input_tokens"),
        child_in,
        "the last answer's usage"
    );
    assert_eq!(int(child_chats[2], "gen_ai.usage.output_tokens"), child_out);
    assert_eq!(int(root, "gen_ai.usage.input_tokens"), 20 + 30 + 40);
    assert_eq!(int(root, "gen_ai.usage.output_tokens"), 4 + 3 + 6);

    // The critic's decision is an event on the child's run span.
    let steer = child_run
        .events
        .iter()
        .find(|e| e.name == "critic.steer")
        .unwrap_or_else(|| panic!("no critic.steer event: {:#?}", child_run.events));
    match attr_in(&steer.attributes, "reason") {
        Some(Value::StringValue(r)) => assert_eq!(r, "runaway"),
        other => panic!("reason: {other:?}"),
    }
    assert!(root.events.iter().all(|e| !e.name.starts_with("critic.")));
}

/// `agentvisor chat` reading a pipe leaves at Ctrl-C without waiting for
/// its runtime (the read of stdin would hold it); its spans are exported
/// on the way out all the same.
#[test]
fn a_chat_stopped_by_ctrl_c_exports_its_spans() {
    use std::io::{BufRead, Write};
    use std::process::{Command, Stdio};

    let got: Shared = Arc::default();
    let url = receiver(got.clone());
    let scratch = support::scratch::Scratch::new("otel-chat");
    let d = scratch.0.clone();
    let agent = write(
        &d,
        "chatter.yaml",
        "name: chatter\nscript:\n  - { text: \"hello back\", usage: { input: 5, output: 2 } }\n",
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .arg("--db")
        .arg(":memory:")
        .arg("chat")
        .arg(&agent)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_SERVICE_NAME", "chat-test")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_EXPORTER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hi\n").unwrap();
    stdin.flush().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "hello back");
    // The answer is out, the chat waits for the next line (stdin stays
    // open): Ctrl-C ends it. A real process and its signal: a Ctrl-C that
    // lands between the answer and the chat's next wait for a line is
    // not seen, so it is sent again until the chat exits (bounded: 200
    // tries 25 ms apart).
    let pid = child.id().to_string();
    let mut status = None;
    for _ in 0..200 {
        assert!(Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success());
        std::thread::sleep(Duration::from_millis(25));
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
    }
    let Some(status) = status else {
        let _ = child.kill();
        panic!("the chat did not end at Ctrl-C");
    };
    drop(stdin);
    assert_eq!(status.code(), Some(0), "{status:?}");
    // The exporter's last request was answered before the process exited.
    let got = got.lock().unwrap();
    assert!(
        got.services.iter().any(|s| s == "chat-test"),
        "{:?}",
        got.services
    );
    let run = one(&got.spans, "invoke_agent chatter");
    assert_eq!(text(run, "gen_ai.agent.name"), "chatter");
    assert_eq!(children(&got.spans, run, "chat scripted").len(), 1);
}
