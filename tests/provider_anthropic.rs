#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Anthropic provider against a loopback server that speaks the
//! Messages API (M3, M4, M8): headers, tool_use / tool_result turns, plain
//! and streamed replies with `input_json_delta`, usage with cache tokens,
//! overload and in-stream errors, a stream cut off, and a whole run.

mod provider_wire;

use std::sync::{Arc, Mutex};

use agentvisor::ports::model::ToolSpec;
use agentvisor::ports::model::{ChatModel, ChatRequest, Message, ModelError, Role};
use agentvisor::providers::{AnthropicConfig, AnthropicModel, ProviderConfig, Secret, StreamMode};
use agentvisor::{AgentSpec, Host, Invocation, RunStatus};
use provider_wire::{named_events, serve, Reply, Wire};
use serde_json::json;

const KEY: &str = "sk-ant-test-0123456789";

fn model(wire: &Wire, stream: StreamMode) -> AnthropicModel {
    let mut c = AnthropicConfig::new("claude-sonnet-4-5", &wire.base_url);
    c.api_key = Secret::new(KEY);
    c.stream = stream;
    AnthropicModel::new(c)
}

fn request() -> ChatRequest {
    let messages = vec![
        Message::text(Role::System, "be brief"),
        Message::text(Role::User, "add 2 and 3"),
    ];
    let tools = Arc::from(vec![ToolSpec {
        name: "add".into(),
        description: "adds".into(),
        parameters: json!({"type": "object"}),
    }]);
    ChatRequest::new(Arc::new(messages), tools, 0)
}

fn message(content: serde_json::Value, usage: serde_json::Value) -> Reply {
    Reply::ok(json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": content, "stop_reason": "end_turn", "usage": usage,
    }))
}

#[tokio::test]
async fn a_plain_reply_with_tool_use_and_cache_usage() {
    let wire = serve(vec![message(
        json!([
            {"type": "text", "text": "Let me add."},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
            {"type": "tool_use", "id": "toolu_2", "name": "upper", "input": {"text": "x"}}
        ]),
        json!({"input_tokens": 12, "output_tokens": 30, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200}),
    )])
    .await;
    let r = model(&wire, StreamMode::Never)
        .complete(request())
        .await
        .unwrap();
    assert_eq!(r.text, "Let me add.");
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!(&*r.tool_calls[0].id, "toolu_1");
    let args: serde_json::Value = serde_json::from_str(&r.tool_calls[0].arguments).unwrap();
    assert_eq!(args, json!({"a": 2, "b": 3}));
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cache_read_tokens,
            r.usage.cache_write_tokens
        ),
        (1212, 30, 1000, 200)
    );
    let seen = &wire.seen()[0];
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some(KEY));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert!(seen.header("authorization").is_none());
    assert_eq!(seen.body["system"], "be brief");
    assert_eq!(seen.body["messages"][0]["role"], "user");
    assert_eq!(seen.body["tools"][0]["input_schema"]["type"], "object");
    assert!(seen.body["max_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn a_streamed_reply_reassembles_input_json_deltas_and_streams_text() {
    let wire = serve(vec![Reply::Sse(named_events(&[
        ("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "content": [], "usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 100}}})),
        ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
        ("ping", json!({"type": "ping"})),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Adding "}})),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "now."}})),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        ("content_block_start", json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}}})),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}})),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"a\": 2"}})),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ", \"b\": 3}"}})),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 1})),
        ("content_block_start", json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}}})),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 2})),
        ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 42}})),
        ("message_stop", json!({"type": "message_stop"})),
    ]))])
    .await;
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let g = got.clone();
    let mut req = request();
    req.on_delta = Some(Arc::new(move |t: &str| g.lock().unwrap().push(t.into())));
    let r = model(&wire, StreamMode::WhenListened)
        .complete(req)
        .await
        .unwrap();
    assert_eq!(r.text, "Adding now.");
    assert_eq!(*got.lock().unwrap(), vec!["Adding ", "now."]);
    assert_eq!(r.tool_calls.len(), 2);
    assert_eq!(&*r.tool_calls[0].arguments, r#"{"a": 2, "b": 3}"#);
    assert_eq!(
        &*r.tool_calls[1].arguments, "{}",
        "no deltas: the start's input"
    );
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cache_read_tokens
        ),
        (125, 42, 100)
    );
    assert_eq!(wire.seen()[0].body["stream"], true);
}

#[tokio::test]
async fn overload_in_stream_errors_and_cut_streams_are_typed() {
    let wire = serve(vec![Reply::status(
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    )])
    .await;
    let e = model(&wire, StreamMode::Never)
        .complete(request())
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ModelError::Server {
            status: 529,
            message: "Overloaded".into()
        }
    );
    assert!(e.is_retryable());

    let wire = serve(vec![Reply::Sse(named_events(&[
        ("message_start", json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}})),
        ("error", json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
    ]))])
    .await;
    let e = model(&wire, StreamMode::Always)
        .complete(request())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "server_error");

    let wire = serve(vec![Reply::Sse(named_events(&[
        ("message_start", json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}})),
        ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}})),
    ]))])
    .await;
    let mut req = request();
    req.on_delta = Some(Arc::new(|_: &str| {}));
    let e = model(&wire, StreamMode::Always)
        .complete(req)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ModelError::Interrupted(c) if c.kind() == "incomplete_response"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("/v1/messages answered 200 OK")
            && e.to_string().contains("3 events"),
        "{e}"
    );
    assert!(!e.is_retryable());

    let wire = serve(vec![Reply::status(401, json!({"type": "error", "error": {"type": "authentication_error", "message": format!("invalid x-api-key {KEY}")}}))]).await;
    let e = model(&wire, StreamMode::Never)
        .complete(request())
        .await
        .unwrap_err();
    assert_eq!(e, ModelError::Auth);
    let wire = serve(vec![Reply::status(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "Your credit balance is too low"}}))]).await;
    let e = model(&wire, StreamMode::Never)
        .complete(request())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "quota");
}

#[tokio::test]
async fn a_run_on_anthropic_sends_tool_results_back_and_is_priced() {
    let wire = serve(vec![
        message(
            json!([{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}]),
            json!({"input_tokens": 100, "output_tokens": 20}),
        ),
        message(
            json!([{"type": "text", "text": "2+3=5"}]),
            json!({"input_tokens": 150, "output_tokens": 10, "cache_read_input_tokens": 1000}),
        ),
    ])
    .await;
    let env = Arc::new(std::collections::HashMap::from([(
        "ANTHROPIC_API_KEY".to_string(),
        KEY.to_string(),
    )]));
    let host = Host::builder()
        .providers(ProviderConfig {
            env: Some(env),
            ..ProviderConfig::default()
        })
        .build()
        .await
        .unwrap();
    let spec = AgentSpec::from_yaml(&format!(
        "name: adder\nmodel: anthropic:claude-sonnet-4-20250514\nbase_url: {}\nsystem: add\ntools: [add]\n",
        wire.base_url
    ))
    .unwrap();
    let r = host
        .execute(spec, Invocation::prompt("2+3?"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{:?}", r.error);
    assert_eq!(r.output.as_deref(), Some("2+3=5"));
    assert_eq!(r.steps.len(), 1);
    assert!(r.steps[0].ok);
    // 1250 input of which 1000 cache reads: 250 × $3 + 1000 × $0.30
    // + 30 out × $15 per Mtok = 750 + 300 + 450 µ$.
    assert_eq!(r.usage.input_tokens, 1250);
    assert_eq!(r.cost_micros, 1500);
    let second = &wire.seen()[1];
    assert_eq!(second.header("x-api-key"), Some(KEY));
    let msgs = second.body["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    assert_eq!(msgs[1]["content"][0]["type"], "tool_use");
    assert_eq!(msgs[2]["content"][0]["type"], "tool_result");
    assert_eq!(msgs[2]["content"][0]["tool_use_id"], "toolu_1");
    assert_eq!(msgs[2]["content"][0]["content"], "5");
    host.shutdown().await;
}
