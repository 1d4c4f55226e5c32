#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Real model servers, as a fake that behaves like a small llama.cpp-based
//! OpenAI-compatible server (`provider_wire::vendor`: one request at a
//! time, no usage in streams, 500 on `content: null` and on
//! `response_format`, tools ignored without `tool_choice`, slow): the
//! regression suite for what users of local servers hit. Each test names
//! the behaviour it holds.

mod provider_wire;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::model::{ChatModel, ChatRequest, Message, Role, ToolCallRequest};
use agentvisor::providers::{
    Breaker, BreakerPolicy, CircuitBreaking, OpenAiConfig, OpenAiModel, ProviderConfig,
    RetryPolicy, Retrying, StreamMode,
};
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunEvent, RunStatus};
use provider_wire::vendor::{serve_vendor, serve_vendor_with, Pace, Quirks, CONTEXT_MESSAGE};
use provider_wire::{serve, Reply};
use serde_json::{json, Value};

fn fast_retries(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        base_delay: Duration::from_millis(2),
        max_delay: Duration::from_millis(4),
    }
}

async fn host() -> Host {
    Host::builder()
        .config(HostConfig {
            critic_shards: 2,
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

fn hello(base_url: &str, extra: &str) -> AgentSpec {
    AgentSpec::from_yaml(&format!(
        "name: hello\nmodel: openai:local\nbase_url: {base_url}\nsystem: You add numbers and shout the result.\n\
         prompt: Add 2 and 3, then shout \"done\".\ntools: [add, upper]\n\
         limits: {{ max_iterations: 12, max_runtime: 60s, stall_timeout: 10s }}\n{extra}"
    ))
    .unwrap()
}

fn warnings(events: &[RunEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Warning { kind, message } => Some((kind.clone(), message.clone())),
            _ => None,
        })
        .collect()
}

async fn streamed(host: &Host, spec: AgentSpec) -> (agentvisor::RunResult, Vec<RunEvent>) {
    let (handle, mut events) = host
        .submit_streaming(spec, Invocation::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(e) = events.next().await {
        seen.push(e.event);
    }
    (handle.await, seen)
}

#[tokio::test]
async fn a_run_on_a_llama_like_server_calls_its_tools_and_counts_estimated_usage() {
    let server = serve_vendor(Pace::quick()).await;
    let host = host().await;
    let (r, events) = streamed(&host, hello(&server.base_url, "")).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("2+3=5, DONE"));
    assert_eq!(
        r.steps.len(),
        2,
        "the tools were used: tool_choice went out"
    );
    assert_eq!(server.errors(), 0, "no 500: no `content: null`");
    // Usage: estimated, charged, marked, warned about once.
    assert!(r.usage.estimated);
    assert!(
        r.usage.input_tokens > 30 && r.usage.output_tokens > 3,
        "{:?}",
        r.usage
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["usage"]["estimated"], true);
    let w = warnings(&events);
    let estimated: Vec<_> = w.iter().filter(|w| w.0 == "usage_estimated").collect();
    assert_eq!(estimated.len(), 1, "one per run: {w:?}");
    let finishes: Vec<&agentvisor::Usage> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::StepFinish { usage, .. } => Some(usage),
            _ => None,
        })
        .collect();
    assert_eq!(finishes.len(), 3);
    assert!(finishes.iter().all(|u| u.estimated && u.total() > 0));
    // The wire: `tool_choice: auto` with the tools, `content: ""` on the
    // assistant's tool-call turns, streamed with usage asked for.
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 3);
    for b in &bodies {
        assert_eq!(b["tool_choice"], "auto");
        assert_eq!(b["stream_options"]["include_usage"], true);
        for m in b["messages"].as_array().unwrap() {
            if m["role"] == "assistant" {
                assert_eq!(m["content"], "", "{m}");
            }
        }
    }
    host.shutdown().await;
}

#[tokio::test]
async fn usage_a_server_does_not_report_still_exhausts_a_budget() {
    let server = serve_vendor(Pace::quick()).await;
    let dir = std::env::temp_dir().join(format!("agentvisor-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("hello.yaml");
    std::fs::write(&manifest, serde_yaml_like(&server.base_url)).unwrap();
    let out = cli(&[
        "run",
        manifest.to_str().unwrap(),
        "--budget-tokens",
        "5",
        "--json",
        "--db",
        ":memory:",
    ])
    .await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "budget_exceeded", "{v}");
    assert_eq!(v["usage"]["estimated"], true);
    assert_eq!(server.count(), 1, "the run stopped before its second call");
    let _ = std::fs::remove_dir_all(&dir);
}

fn serde_yaml_like(base_url: &str) -> String {
    format!(
        "name: hello\nmodel: openai:local\nbase_url: {base_url}\nsystem: You add numbers.\n\
         prompt: Add 2 and 3, then shout \"done\".\ntools: [add, upper]\n"
    )
}

/// Runs the CLI with no provider variables of the caller's environment.
async fn cli(args: &[&str]) -> std::process::Output {
    cli_env(args, &[]).await
}

async fn cli_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_agentvisor"));
        c.args(&args).current_dir(env!("CARGO_MANIFEST_DIR"));
        for k in [
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            "AGENTVISOR_DB",
            "AGENTVISOR_TIERS",
        ] {
            c.env_remove(k);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_server_that_refuses_response_format_gets_the_schema_in_the_prompt() {
    let server = serve_vendor(Pace::quick()).await;
    let host = host().await;
    let spec = AgentSpec::from_yaml(&format!(
        "name: sum\nmodel: openai:local\nbase_url: {}\nsystem: You add.\nprompt: 2+3?\n\
         output_schema: {{ type: object, properties: {{ sum: {{ type: integer }} }}, required: [sum] }}\n",
        server.base_url
    ))
    .unwrap();
    for round in 0..2 {
        let (r, events) = streamed(&host, spec.clone()).await;
        assert_eq!(r.status, RunStatus::Ok, "round {round}: {r:?}");
        assert_eq!(r.output.as_deref(), Some("{\"sum\": 5}"));
        let kinds: Vec<String> = warnings(&events).into_iter().map(|w| w.0).collect();
        assert!(
            kinds.contains(&"response_format_unsupported".to_string()),
            "round {round}: {kinds:?}"
        );
    }
    let bodies = server.bodies();
    let formats: Vec<&Value> = bodies
        .iter()
        .filter_map(|b| b.get("response_format"))
        .map(|f| &f["type"])
        .collect();
    assert_eq!(
        formats,
        [&json!("json_schema"), &json!("json_object")],
        "each way tried once, the refusals remembered"
    );
    assert_eq!(server.errors(), 2, "two 500s, never retried");
    let last = bodies.last().unwrap();
    assert!(last["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("JSON Schema"));
    host.shutdown().await;
}

#[tokio::test]
async fn a_swarm_of_50_at_concurrency_8_on_a_single_slot_server_ends_ok_with_usage() {
    let server = serve_vendor(Pace {
        first: Duration::from_millis(3),
        between: Duration::from_millis(1),
    })
    .await;
    let host = host().await;
    let agent = host.agent(hello(&server.base_url, "")).unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(8));
    let mut runs = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (host, agent, gate) = (host.clone(), agent.clone(), gate.clone());
        runs.spawn(async move {
            let _slot = gate.acquire_owned().await.unwrap();
            host.execute(&agent, Invocation::default()).await.unwrap()
        });
    }
    let mut n = 0;
    while let Some(r) = runs.join_next().await {
        let r = r.unwrap();
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        assert!(r.usage.estimated && r.usage.total() > 0, "{:?}", r.usage);
        n += 1;
    }
    assert_eq!(n, 50);
    assert_eq!(server.count(), 150);
    assert_eq!(server.max_in_flight(), 1, "the fake is single-slot");
    host.shutdown().await;

    // The same through the CLI's swarm.
    let dir = std::env::temp_dir().join(format!("agentvisor-swarm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("hello.yaml");
    std::fs::write(&manifest, serde_yaml_like(&server.base_url)).unwrap();
    let out = cli(&[
        "swarm",
        manifest.to_str().unwrap(),
        "--runs",
        "50",
        "--concurrency",
        "8",
        "--json",
        "--db",
        ":memory:",
    ])
    .await;
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["by_status"], json!({"ok": 50}), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tool_turn_request() -> ChatRequest {
    let mut call = Message::text(Role::Assistant, "");
    call.tool_calls = vec![ToolCallRequest {
        id: "c1".into(),
        name: "add".into(),
        arguments: "{}".into(),
    }];
    let mut result = Message::text(Role::Tool, "5");
    result.tool_call_id = Some("c1".into());
    let messages = vec![Message::text(Role::User, "add"), call, result];
    ChatRequest::new(Arc::new(messages), Arc::from(Vec::new()), 1)
}

fn plain_request() -> ChatRequest {
    ChatRequest::new(
        Arc::new(vec![Message::text(Role::User, "hi")]),
        Arc::from(Vec::new()),
        0,
    )
}

fn guarded(base_url: &str, failures: u32) -> (Retrying, Arc<Breaker>) {
    let mut c = OpenAiConfig::new("local", base_url);
    c.stream = StreamMode::Never;
    let breaker = Arc::new(Breaker::new(
        "openai:local",
        BreakerPolicy {
            failures,
            cool_down: Duration::from_secs(600),
        },
    ));
    let model: Arc<dyn ChatModel> = Arc::new(CircuitBreaking::new(
        Arc::new(OpenAiModel::new(c)),
        breaker.clone(),
    ));
    (Retrying::new(model, fast_retries(3)), breaker)
}

#[tokio::test]
async fn a_500_one_request_shape_always_gets_is_reported_and_does_not_open_the_circuit() {
    let ok = Reply::ok(
        json!({"choices": [{"index": 0, "message": {"content": "hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
    );
    let choke = Reply::status(
        500,
        json!({"error": {"message": "'NoneType' object is not subscriptable"}}),
    );
    let wire = serve(vec![
        ok.clone(),
        choke.clone(),
        choke.clone(),
        choke.clone(),
        choke.clone(),
        ok.clone(),
        choke.clone(),
        choke.clone(),
        choke.clone(),
        choke,
        ok,
    ])
    .await;
    let (model, breaker) = guarded(&wire.base_url, 2);
    for round in 0..2 {
        assert!(model.complete(plain_request()).await.is_ok());
        let e = model.complete(tool_turn_request()).await.unwrap_err();
        assert_eq!(e.kind(), "server_error");
        assert!(
            e.to_string().contains("NoneType"),
            "the server's message: {e}"
        );
        assert!(breaker.admit().is_ok(), "round {round}: a request's fault");
    }
    assert!(model.complete(plain_request()).await.is_ok());
    assert_eq!(wire.count(), 11, "bounded retries, nothing refused");

    // A server that fails every request — every shape — still opens the
    // circuit.
    let dead = serve(vec![Reply::status(
        500,
        json!({"error": {"message": "boom"}}),
    )])
    .await;
    let (model, breaker) = guarded(&dead.base_url, 2);
    let e = model.complete(plain_request()).await.unwrap_err();
    assert_eq!(e.kind(), "server_error");
    assert!(breaker.admit().is_ok(), "one shape: maybe its own fault");
    let e = model.complete(tool_turn_request()).await.unwrap_err();
    assert_eq!(e.kind(), "server_error");
    assert_eq!(breaker.admit().map_err(|e| e.kind()), Err("circuit_open"));
    assert_eq!(
        dead.count(),
        5,
        "four tries of the first, one of the second"
    );

    // So does an endpoint that is down, whatever it is asked.
    for status in [502, 503, 504] {
        let down = serve(vec![Reply::status(status, json!({}))]).await;
        let (model, breaker) = guarded(&down.base_url, 2);
        assert!(model.complete(plain_request()).await.is_err());
        assert_eq!(
            breaker.admit().map_err(|e| e.kind()),
            Err("circuit_open"),
            "{status}"
        );
    }
}

/// A request with tools and `tool_choice: auto`.
fn tools_request() -> ChatRequest {
    let tools = vec![agentvisor::ports::model::ToolSpec {
        name: "add".into(),
        description: "adds".into(),
        parameters: json!({"type": "object"}),
    }];
    ChatRequest::new(
        Arc::new(vec![Message::text(Role::User, "add 2 and 3")]),
        Arc::from(tools),
        0,
    )
}

#[tokio::test]
async fn an_empty_200_to_one_request_shape_does_not_open_the_circuit_for_others() {
    // A server that answers requests with tools with an empty 200, and the
    // rest properly.
    let empty = Reply::Json(200, Vec::new(), String::new());
    let ok = Reply::ok(
        json!({"choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
    );
    let mut replies = vec![empty.clone(); 8];
    replies.push(ok);
    let wire = serve(replies).await;
    let (model, breaker) = guarded(&wire.base_url, 2);
    for _ in 0..2 {
        let e = model.complete(tools_request()).await.unwrap_err();
        assert_eq!(e.kind(), "incomplete_response");
        // The error says where, what status, and what arrived.
        let text = e.to_string();
        assert!(
            text.contains(&format!("POST {}/chat/completions", wire.base_url))
                && text.contains("200 OK")
                && text.contains("empty body"),
            "{text}"
        );
        assert!(breaker.admit().is_ok(), "one shape's failures: {text}");
    }
    assert_eq!(wire.count(), 8, "retried, never refused");
    // A plain request to the same model goes through.
    let r = model.complete(plain_request()).await.unwrap();
    assert_eq!(r.text, "hi");
}

#[tokio::test]
async fn a_server_that_refuses_tools_does_not_get_plain_runs_refused() {
    let quirks = Quirks {
        refuse_tools: true,
        ..Quirks::default()
    };
    let server = serve_vendor_with(Pace::quick(), quirks).await;
    let host = host().await;
    // Two runs with tools: three tries each (retries 2), six 500s in a row,
    // past the breaker's five.
    for _ in 0..2 {
        let r = host
            .execute(hello(&server.base_url, ""), Invocation::default())
            .await
            .unwrap();
        assert_eq!(r.status, RunStatus::Error, "{r:?}");
        assert_eq!(r.error_kind.as_deref(), Some("server_error"));
        assert!(r.error.unwrap().contains("cannot take `tools`"));
    }
    assert_eq!(server.errors(), 6);
    // Another agent on the same model, without tools: not `circuit_open`.
    let plain = AgentSpec::from_yaml(&format!(
        "name: plain\nmodel: openai:local\nbase_url: {}\nprompt: Say hi.\n",
        server.base_url
    ))
    .unwrap();
    let r = host.execute(plain, Invocation::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(
        r.output.as_deref(),
        Some("I would add them, but I have no tools.")
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_chatml_function_calling_server_gets_tool_requests_unstreamed() {
    let server = serve_vendor_with(Pace::quick(), Quirks::chatml_function_calling()).await;
    let host = host().await;
    for round in 0..2 {
        let (r, events) = streamed(&host, hello(&server.base_url, "")).await;
        assert_eq!(r.status, RunStatus::Ok, "round {round}: {r:?}");
        assert_eq!(r.output.as_deref(), Some("2+3=5, DONE"));
        assert_eq!(r.steps.len(), 2, "the tools were used");
        // The plain replies' usage is read, not estimated.
        assert!(!r.usage.estimated, "{:?}", r.usage);
        assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (60, 15));
        let w = warnings(&events);
        let fallbacks: Vec<_> = w
            .iter()
            .filter(|w| w.0 == "streaming_unsupported")
            .collect();
        assert_eq!(fallbacks.len(), 1, "round {round}: {w:?}");
        assert!(fallbacks[0].1.contains("tool_choice: auto"), "{w:?}");
    }
    // One streamed try, answered with nothing; then plain, remembered.
    let streams: Vec<bool> = server
        .bodies()
        .iter()
        .map(|b| b["stream"] == true)
        .collect();
    assert_eq!(streams, [true, false, false, false, false, false, false]);
    // A request of another shape (no tools) still streams.
    let plain = AgentSpec::from_yaml(&format!(
        "name: plain\nmodel: openai:local\nbase_url: {}\nprompt: Say hi.\n",
        server.base_url
    ))
    .unwrap();
    let (r, events) = streamed(&host, plain).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(events
        .iter()
        .any(|e| matches!(e, RunEvent::TextDelta { .. })));
    assert_eq!(server.bodies().last().unwrap()["stream"], true);
    host.shutdown().await;
}

#[tokio::test]
async fn structured_output_on_llama_cpp_python_goes_as_json_object_with_the_schema() {
    let server = serve_vendor_with(Pace::quick(), Quirks::chatml_function_calling()).await;
    let host = host().await;
    let spec = AgentSpec::from_yaml(&format!(
        "name: sum\nmodel: openai:local\nbase_url: {}\nsystem: You add.\nprompt: 2+3?\n\
         output_schema: {{ type: object, properties: {{ sum: {{ type: integer }} }}, required: [sum] }}\n",
        server.base_url
    ))
    .unwrap();
    for round in 0..2 {
        let (r, events) = streamed(&host, spec.clone()).await;
        assert_eq!(r.status, RunStatus::Ok, "round {round}: {r:?}");
        assert_eq!(r.output.as_deref(), Some("{\"sum\": 5}"));
        let w = warnings(&events);
        assert!(
            w.iter()
                .any(|w| w.0 == "response_format_unsupported" && w.1.contains("json_object")),
            "round {round}: {w:?}"
        );
    }
    let bodies = server.bodies();
    let formats: Vec<&Value> = bodies
        .iter()
        .map(|b| &b["response_format"]["type"])
        .collect();
    assert_eq!(
        formats,
        [
            &json!("json_schema"),
            &json!("json_object"),
            &json!("json_object")
        ],
        "json_schema refused once, then json_object from the start"
    );
    assert_eq!(
        bodies[1]["response_format"]["schema"]["required"],
        json!(["sum"]),
        "the schema goes with it"
    );
    for b in &bodies {
        let system = b["messages"][0]["content"].as_str().unwrap();
        assert!(
            !system.contains("JSON Schema"),
            "not in the prompt: {system}"
        );
    }
    assert_eq!(server.errors(), 1);
    host.shutdown().await;
}

#[tokio::test]
async fn a_context_overflow_in_a_stream_says_what_the_server_said() {
    let quirks = Quirks {
        context_chars: Some(400),
        ..Quirks::default()
    };
    let server = serve_vendor_with(Pace::quick(), quirks).await;
    let host = host().await;
    let long = "Add 2 and 3. ".repeat(50);
    let (r, _) = streamed(&host, hello(&server.base_url, "")).await;
    assert_eq!(r.status, RunStatus::Ok, "a short prompt fits: {r:?}");
    let before = server.count();
    let (handle, mut events) = host
        .submit_streaming(hello(&server.base_url, ""), Invocation::prompt(long))
        .await
        .unwrap();
    while events.next().await.is_some() {}
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("bad_request"), "{r:?}");
    let e = r.error.unwrap();
    assert!(e.contains(CONTEXT_MESSAGE) && e.contains("context"), "{e}");
    assert_eq!(server.count() - before, 1, "not retried");
    host.shutdown().await;
}

fn text_reply(text: &str) -> Reply {
    Reply::ok(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }))
}

#[tokio::test]
async fn manifest_sampling_keys_and_tool_choice_reach_both_providers() {
    let extra = "tool_choice: add\ntemperature: 0.2\nmax_tokens: 64\ntop_p: 0.9\nseed: 7\nstop: [\"END\", \"STOP\"]\n";
    let wire = serve(vec![text_reply("5")]).await;
    let host = host().await;
    let r = host
        .execute(hello(&wire.base_url, extra), Invocation::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let b = &wire.seen()[0].body;
    assert_eq!(
        b["tool_choice"],
        json!({"type": "function", "function": {"name": "add"}})
    );
    assert_eq!(b["temperature"], 0.2);
    assert_eq!(b["max_tokens"], 64);
    assert_eq!(b["top_p"], 0.9);
    assert_eq!(b["seed"], 7);
    assert_eq!(b["stop"], json!(["END", "STOP"]));

    // `required` and `none`; a single `stop` string.
    for (choice, wire_choice) in [("required", json!("required")), ("none", json!("none"))] {
        let wire = serve(vec![text_reply("5")]).await;
        let spec = hello(
            &wire.base_url,
            &format!("tool_choice: {choice}\nstop: END\n"),
        );
        host.execute(spec, Invocation::default()).await.unwrap();
        let b = &wire.seen()[0].body;
        assert_eq!(b["tool_choice"], wire_choice);
        assert_eq!(b["stop"], json!(["END"]));
        assert!(b.get("temperature").is_none(), "unset keys are not sent");
    }

    // Anthropic: its own spellings, and no seed.
    let wire = serve(vec![Reply::ok(json!({
        "content": [{"type": "text", "text": "5"}],
        "usage": {"input_tokens": 10, "output_tokens": 2},
    }))])
    .await;
    let base = wire.base_url.trim_end_matches("/v1").to_string();
    let mut spec = hello(&base, extra);
    spec.model = "anthropic:claude-x".into();
    let r = host
        .execute(spec.clone(), Invocation::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let seen = &wire.seen()[0];
    assert_eq!(seen.path, "/v1/messages", "the host without /v1 works");
    let b = &seen.body;
    assert_eq!(b["tool_choice"], json!({"type": "tool", "name": "add"}));
    assert_eq!(b["temperature"], 0.2);
    assert_eq!(b["max_tokens"], 64);
    assert_eq!(b["top_p"], 0.9);
    assert_eq!(b["stop_sequences"], json!(["END", "STOP"]));
    assert!(b.get("seed").is_none());
    for (choice, wire_choice) in [
        ("required", json!({"type": "any"})),
        ("auto", json!({"type": "auto"})),
    ] {
        let wire = serve(vec![Reply::ok(
            json!({"content": [{"type": "text", "text": "5"}]}),
        )])
        .await;
        // With `/v1`, as before: both spellings reach /v1/messages.
        let mut spec = hello(&wire.base_url, &format!("tool_choice: {choice}\n"));
        spec.model = "anthropic:claude-x".into();
        host.execute(spec, Invocation::default()).await.unwrap();
        assert_eq!(wire.seen()[0].path, "/v1/messages");
        assert_eq!(wire.seen()[0].body["tool_choice"], wire_choice);
    }
    host.shutdown().await;
}

#[test]
fn bad_call_options_are_refused_naming_the_key() {
    for (extra, key) in [
        ("tool_choice: nosuch\n", "tool_choice"),
        ("temperature: 3\n", "temperature"),
        ("top_p: 0\n", "top_p"),
        ("max_tokens: 0\n", "max_tokens"),
        (
            "limits: { first_token_timeout: 0s }\n",
            "first_token_timeout",
        ),
    ] {
        let yaml = format!("name: a\nmodel: openai:x\ntools: [add]\n{extra}");
        let e = AgentSpec::from_yaml(&yaml).unwrap_err().to_string();
        assert!(e.contains(key), "{extra}: {e}");
    }
    let e = AgentSpec::from_yaml("name: a\nmodel: openai:x\ntool_choice: required\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("tools"), "{e}");
}

#[tokio::test]
async fn anthropic_base_url_from_the_environment_works_with_or_without_v1() {
    for with_v1 in [false, true] {
        let wire = serve(vec![Reply::ok(
            json!({"content": [{"type": "text", "text": "hi"}]}),
        )])
        .await;
        let base = if with_v1 {
            wire.base_url.clone()
        } else {
            wire.base_url.trim_end_matches("/v1").to_string()
        };
        let env = std::collections::HashMap::from([("ANTHROPIC_BASE_URL".to_string(), base)]);
        let host = Host::builder()
            .providers(ProviderConfig {
                env: Some(Arc::new(env)),
                ..ProviderConfig::default()
            })
            .build()
            .await
            .unwrap();
        let spec =
            AgentSpec::from_yaml("name: a\nmodel: anthropic:claude-x\nprompt: hi\n").unwrap();
        let r = host.execute(spec, Invocation::default()).await.unwrap();
        assert_eq!(r.status, RunStatus::Ok, "with /v1: {with_v1}: {r:?}");
        assert_eq!(wire.seen()[0].path, "/v1/messages");
        host.shutdown().await;
    }
}

#[tokio::test]
async fn a_404_names_the_url_that_was_called() {
    let wire = serve(vec![text_reply("x")]).await;
    // An OpenAI base without `/v1`: the server has no `/chat/completions`.
    let base = wire.base_url.trim_end_matches("/v1").to_string();
    let host = host().await;
    let r = host
        .execute(hello(&base, ""), Invocation::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("bad_request"));
    let e = r.error.unwrap();
    assert!(
        e.contains("404") && e.contains(&format!("{base}/chat/completions")),
        "{e}"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_stream_cut_after_content_keeps_the_text_as_partial_output() {
    let pieces = vec![
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": "2+3"}}]})
        ),
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": "=5, DO"}}]})
        ),
    ];
    let wire = serve(vec![Reply::SseThenDrop(pieces)]).await;
    let host = host().await;
    // Nobody listens: the run still streams (for its heartbeats) and keeps
    // what arrived.
    let r = host
        .execute(hello(&wire.base_url, ""), Invocation::default())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("transport"));
    assert_eq!(r.output.as_deref(), Some("2+3=5, DO"));
    assert_eq!(wire.count(), 1, "content arrived: not retried");
    host.shutdown().await;
}

#[tokio::test]
async fn model_errors_name_the_flag_or_say_how_to_set_a_model() {
    let out = cli(&[
        "run",
        "examples/agents/hello.yaml",
        "--model",
        "bogus",
        "--db",
        ":memory:",
    ])
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--model") && err.contains("bogus"), "{err}");
    assert!(
        !err.contains("invalid manifest") && !err.contains("scripted`"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("agentvisor-nomodel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("bare.yaml");
    std::fs::write(&manifest, "name: bare\nprompt: hi\n").unwrap();
    let out = cli(&["run", manifest.to_str().unwrap(), "--db", ":memory:"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for hint in ["model:", "--model", "AGENTVISOR_TIERS", "OPENAI_BASE_URL"] {
        assert!(err.contains(hint), "{hint}: {err}");
    }
    // Configured through OPENAI_BASE_URL, the same manifest runs there.
    let wire = serve(vec![text_reply("hello")]).await;
    let out = cli_env(
        &[
            "run",
            manifest.to_str().unwrap(),
            "--json",
            "--db",
            ":memory:",
        ],
        &[("OPENAI_BASE_URL", &wire.base_url)],
    )
    .await;
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["status"], "ok");
    assert_eq!(wire.seen()[0].body["model"], "gpt-4o-mini");
    let _ = std::fs::remove_dir_all(&dir);
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";

#[tokio::test]
async fn attachments_reach_the_model_as_image_parts_and_text() {
    let dir = std::env::temp_dir().join(format!("agentvisor-attach-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("dot.png");
    std::fs::write(&png, PNG).unwrap();
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, "remember the milk").unwrap();
    let manifest = dir.join("look.yaml");
    std::fs::write(&manifest, "name: look\nprompt: What do you see?\n").unwrap();

    // OpenAI-compatible: an image_url part with a data URL, the text file as text.
    let wire = serve(vec![text_reply("a dot")]).await;
    let out = cli_env(
        &[
            "run",
            manifest.to_str().unwrap(),
            "--model",
            "openai:vision",
            "--attach",
            png.to_str().unwrap(),
            "--attach",
            notes.to_str().unwrap(),
            "--json",
            "--db",
            ":memory:",
        ],
        &[("OPENAI_BASE_URL", &wire.base_url)],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let user = &wire.seen()[0].body["messages"][0];
    assert_eq!(user["role"], "user");
    let parts = user["content"].as_array().unwrap();
    assert_eq!(
        parts[0],
        json!({"type": "text", "text": "What do you see?"})
    );
    assert_eq!(parts[1]["type"], "image_url");
    let url = parts[1]["image_url"]["url"].as_str().unwrap();
    assert!(
        url.starts_with("data:image/png;base64,iVBORw0KGgo"),
        "{url}"
    );
    assert!(parts[2]["text"]
        .as_str()
        .unwrap()
        .contains("remember the milk"));
    assert!(parts[2]["text"].as_str().unwrap().contains("notes.txt"));

    // Anthropic: an image block.
    let wire = serve(vec![Reply::ok(
        json!({"content": [{"type": "text", "text": "a dot"}]}),
    )])
    .await;
    let out = cli_env(
        &[
            "run",
            manifest.to_str().unwrap(),
            "--model",
            "anthropic:claude-x",
            "--attach",
            png.to_str().unwrap(),
            "--db",
            ":memory:",
        ],
        &[("ANTHROPIC_BASE_URL", &wire.base_url)],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let blocks = wire.seen()[0].body["messages"][0]["content"].clone();
    assert_eq!(blocks[1]["type"], "image");
    assert_eq!(blocks[1]["source"]["type"], "base64");
    assert_eq!(blocks[1]["source"]["media_type"], "image/png");

    // Unreadable, unusable or oversized: exit 2, naming the file, nothing sent.
    let binary = dir.join("blob.bin");
    std::fs::write(&binary, [0xC3u8, 0x28, 0, 1, 2]).unwrap();
    let big = dir.join("big.txt");
    std::fs::write(&big, vec![b'a'; 5 * 1024 * 1024 + 1]).unwrap();
    let missing = dir.join("missing.png");
    for (path, says) in [
        (&missing, "cannot read"),
        (&binary, "not text"),
        (&big, "cap"),
    ] {
        let out = cli_env(
            &[
                "run",
                manifest.to_str().unwrap(),
                "--model",
                "openai:vision",
                "--attach",
                path.to_str().unwrap(),
                "--db",
                ":memory:",
            ],
            &[("OPENAI_BASE_URL", &wire.base_url)],
        )
        .await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains(says),
            "{err}"
        );
    }
    assert_eq!(wire.count(), 1);

    // Through the library: an oversized attachment is a submit error.
    let host = host().await;
    let inv = Invocation {
        attachments: vec![agentvisor::spec::Attachment {
            name: "big.txt".into(),
            mime: "text/plain".into(),
            content: "a".repeat(5 * 1024 * 1024 + 1),
        }],
        ..Invocation::default()
    };
    let e = host
        .submit(hello(&wire.base_url, ""), inv)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("big.txt"), "{e}");
    host.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_run_with_nothing_to_answer_is_refused_before_any_call() {
    let wire = serve(vec![text_reply("hello")]).await;
    let dir = std::env::temp_dir().join(format!("agentvisor-noinput-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bare = dir.join("bare.yaml");
    std::fs::write(
        &bare,
        format!(
            "name: bare\nmodel: openai:local\nbase_url: {}\n",
            wire.base_url
        ),
    )
    .unwrap();
    let out = cli(&["run", bare.to_str().unwrap(), "--db", ":memory:"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--input") && err.contains("prompt:"), "{err}");
    assert_eq!(wire.count(), 0, "nothing was sent");
    // With an input, the same manifest runs.
    let out = cli(&[
        "run",
        bare.to_str().unwrap(),
        "--input",
        "hi",
        "--json",
        "--db",
        ":memory:",
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(wire.count(), 1);
    // The scripted model may run without one.
    let scripted = dir.join("scripted.yaml");
    std::fs::write(
        &scripted,
        "name: s\nmodel: scripted\nscript:\n  - { text: ok }\n",
    )
    .unwrap();
    let out = cli(&["run", scripted.to_str().unwrap(), "--db", ":memory:"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The library refuses it the same way, before any run exists.
    let host = host().await;
    let spec = AgentSpec::from_file(&bare).unwrap();
    let e = host
        .submit(spec, Invocation::default())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("nothing to answer"), "{e}");
    host.shutdown().await;
    assert_eq!(wire.count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_dummy_key_shorter_than_8_characters_mangles_no_message() {
    let wire = serve(vec![Reply::status(
        404,
        json!({"error": {"message": "Not Found"}}),
    )])
    .await;
    let dir = std::env::temp_dir().join(format!("agentvisor-dummykey-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("hello.yaml");
    std::fs::write(&manifest, serde_yaml_like(&wire.base_url)).unwrap();
    let out = cli_env(
        &[
            "run",
            manifest.to_str().unwrap(),
            "--json",
            "--db",
            ":memory:",
        ],
        &[("OPENAI_API_KEY", "o")],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{stderr}"));
    assert_eq!(v["error_kind"], "bad_request", "{v}");
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("404 Not Found") && error.contains(": Not Found"),
        "{error}"
    );
    assert!(
        !error.contains("REDACTED") && !stderr.contains("REDACTED"),
        "{error}\n{stderr}"
    );
    // The key was sent all the same.
    assert_eq!(wire.seen()[0].header("authorization"), Some("Bearer o"));
    // One warning says the key is not redacted.
    assert_eq!(
        stderr.matches("shorter than 8 characters").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("OPENAI_API_KEY"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
