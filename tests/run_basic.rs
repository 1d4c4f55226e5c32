//! The basic life of a run: the agent loop to an answer, the RunResult's
//! JSON contract, the event stream and its order, model errors, the
//! iteration ceiling, and refusals of bad input at submit time.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use agentvisor::{Invocation, RunEvent, RunStatus, SubmitError};

const HELLO: &str = r#"
name: hello
model: scripted
system: You add numbers and shout the result.
tools: [add, upper]
limits: { max_iterations: 12, max_runtime: 60s, stall_timeout: 10s }
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { tool: upper, args: { text: done } }
  - { text: "2+3=5, DONE", usage: { input: 120, output: 8 } }
"#;

#[tokio::test(start_paused = true)]
async fn a_run_calls_its_tools_then_answers() {
    let (host, _store) = support::host().await;
    let r = host
        .execute(support::spec(HELLO), Invocation::prompt("add 2 and 3"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("2+3=5, DONE"));
    assert_eq!(r.kill_reason, None);
    assert_eq!(r.error_kind, None);
    assert_eq!(r.iterations, 3);
    let steps: Vec<(&str, bool, &str, u32)> = r
        .steps
        .iter()
        .map(|s| (&*s.tool, s.ok, s.result.as_str(), s.iteration))
        .collect();
    assert_eq!(steps, [("add", true, "5", 1), ("upper", true, "DONE", 2)]);
    // The last call reports its usage; the first two are estimated (> 0).
    assert!(
        r.usage.input_tokens > 120 && r.usage.output_tokens > 8,
        "{:?}",
        r.usage
    );
    assert!(r.critic.is_empty());
    assert!(r.finished_at >= r.started_at);
    assert_eq!(r.agent, "hello");
    assert_eq!(host.live_runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_result_json_speaks_the_documented_field_names() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: contract
tools: [add, fail]
limits: { hard_timeout: 10s, max_runtime: 1h, stall_timeout: 1h }
script:
  - { tool: add, args: { a: 1, b: 2 }, usage: { input: 10, output: 3 } }
  - { tool: fail, args: { reason: nope }, latency: 2s, usage: { input: 20, output: 4 } }
  - { text: "partial work", usage: { input: 30, output: 5 } }
"#,
    );
    let handle = host.submit(spec, Invocation::prompt("go")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    handle.extend(Duration::from_secs(5));
    let r = handle.await;
    let v = serde_json::to_value(&r).unwrap();

    let run_id = v["run_id"].as_str().expect("run_id is a string");
    assert_eq!(run_id.len(), 32);
    assert!(run_id.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(run_id, r.run_id.to_string());
    assert_eq!(v["status"], "ok");
    assert!(v["kill_reason"].is_null(), "kill_reason is null when none");
    assert!(v["error_kind"].is_null());
    assert_eq!(v["output"], "partial work");

    let steps = v["steps"].as_array().expect("steps is an array");
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["tool"], "add");
    assert_eq!(steps[0]["ok"], true);
    assert!(steps[0].get("error").is_none(), "no `error` when ok");
    assert!(steps[0]["duration_ms"].is_u64());
    assert_eq!(steps[1]["tool"], "fail");
    assert_eq!(steps[1]["ok"], false);
    let err = steps[1]["error"].as_str().expect("`error` when not ok");
    assert!(err.contains("nope"), "{err}");

    assert_eq!(v["usage"]["input_tokens"], 60);
    assert_eq!(v["usage"]["output_tokens"], 12);

    let critic = v["critic"].as_array().expect("critic is an array");
    assert_eq!(critic.len(), 1);
    assert_eq!(critic[0]["action"], "extend");
    assert_eq!(critic[0]["reason"], "operator");
    let at = critic[0]["at_ms"].as_u64().expect("at_ms is a number");
    assert!((1000..1100).contains(&at), "{at}");

    let started = v["started_at"].as_u64().expect("started_at is unix ms");
    let finished = v["finished_at"].as_u64().expect("finished_at is unix ms");
    assert!(started > 1_600_000_000_000 && finished >= started);
}

#[tokio::test(start_paused = true)]
async fn a_killed_run_serializes_its_kill_reason() {
    let (host, _store) = support::host().await;
    let spec = support::spec("name: k\nscript:\n  - { hang: true }\n");
    let handle = host.submit(spec, Invocation::prompt("go")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    handle.kill();
    let v = serde_json::to_value(handle.await).unwrap();
    assert_eq!(v["status"], "killed");
    assert_eq!(v["kill_reason"], "operator");
    assert_eq!(v["error_kind"], "operator");
    assert_eq!(v["critic"][0]["action"], "kill");
}

#[tokio::test(start_paused = true)]
async fn events_stream_in_order_and_end_with_the_run() {
    let (host, _store) = support::host().await;
    let (handle, events) = host
        .submit_streaming(support::spec(HELLO), Invocation::prompt("add"))
        .await
        .unwrap();
    // Read the whole stream while still holding the handle: the stream must
    // end when the run ends, not when the handle goes.
    let events = tokio::time::timeout(Duration::from_secs(60), support::collect(events))
        .await
        .expect("the event stream ends with the run");
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok);

    assert_eq!(
        support::kinds_without_deltas(&events),
        [
            "step.start",
            "step.finish",
            "tool.call",
            "tool.result",
            "step.start",
            "step.finish",
            "tool.call",
            "tool.result",
            "step.start",
            "step.finish",
            "message.create",
            "run.end",
        ]
    );
    // A tool result answers the call before it, in the same iteration.
    let mut open = None;
    for e in &events {
        match e {
            RunEvent::ToolCall {
                iteration, call_id, ..
            } => open = Some((*iteration, call_id.clone())),
            RunEvent::ToolResult {
                iteration,
                call_id,
                ok,
                ..
            } => {
                assert_eq!(open.take(), Some((*iteration, call_id.clone())));
                assert!(ok);
            }
            _ => {}
        }
    }
    // Streamed text comes inside its step (after step.start 3, before
    // step.finish 3) and adds up to the answer.
    let kinds = support::kinds(&events);
    let first_delta = kinds.iter().position(|k| k == "text.delta");
    let last_start = kinds.iter().rposition(|k| k == "step.start");
    let last_finish = kinds.iter().rposition(|k| k == "step.finish");
    let (Some(d), Some(s), Some(f)) = (first_delta, last_start, last_finish) else {
        panic!("expected text deltas and steps: {kinds:?}");
    };
    assert!(s < d && d < f, "{kinds:?}");
    let streamed: String = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::TextDelta { iteration, text } => {
                assert_eq!(*iteration, 3);
                Some(text.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(streamed, "2+3=5, DONE");
    // The answer, then `run.end` with the result's gist.
    match &events[events.len() - 2..] {
        [RunEvent::MessageCreate { role, text }, RunEvent::RunEnd { status, output, .. }] => {
            assert_eq!(role, "assistant");
            assert_eq!(text, "2+3=5, DONE");
            assert_eq!(*status, RunStatus::Ok);
            assert_eq!(output.as_deref(), Some("2+3=5, DONE"));
        }
        other => panic!("the stream ends with the answer and run.end, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_ends_its_stream_with_an_error_event() {
    let (host, _store) = support::host().await;
    let spec = support::spec("name: e\nscript:\n  - { fail: server }\n");
    let (r, events) = support::run_to_end(&host, spec, Invocation::prompt("x")).await;
    assert_eq!(r.status, RunStatus::Error);
    match &events[events.len() - 2..] {
        [RunEvent::Error { kind, message }, RunEvent::RunEnd {
            status, error_kind, ..
        }] => {
            assert_eq!(kind, "server_error");
            assert!(message.contains("500"), "{message}");
            assert_eq!(*status, RunStatus::Error);
            assert_eq!(error_kind.as_deref(), Some("server_error"));
        }
        other => panic!("expected an error event, then run.end, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn provider_errors_end_the_run_with_their_kind() {
    let (host, _store) = support::host().await;
    for (fail, kind) in [
        ("rate_limited", "rate_limited"),
        ("server", "server_error"),
        ("bad_request", "bad_request"),
    ] {
        let spec = support::spec(&format!(
            "name: e\ntools: [echo]\nscript:\n  - {{ tool: echo, args: {{ text: hi }} }}\n  - {{ fail: {fail} }}\n"
        ));
        let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
        assert_eq!(r.status, RunStatus::Error, "{fail}");
        assert_eq!(r.error_kind.as_deref(), Some(kind), "{fail}");
        assert_eq!(r.kill_reason, None);
        assert_eq!(r.iterations, 2);
        assert_eq!(r.steps.len(), 1, "the step before the error is kept");
    }
}

#[tokio::test(start_paused = true)]
async fn a_script_that_runs_out_is_an_error_not_a_panic() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        "name: short\ntools: [echo]\nscript:\n  - { tool: echo, args: { text: a } }\n",
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("bad_request"));
    assert!(r.error.unwrap_or_default().contains("no entry for call 2"));
}

#[tokio::test(start_paused = true)]
async fn max_iterations_ends_the_run_with_the_last_text_as_partial_output() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: busy
tools: [add]
limits: { max_iterations: 3, repeat_limit: 100 }
script:
  - { text: "first thoughts", tool: add, args: { a: 1, b: 1 } }
  - { text: "second thoughts", tool: add, args: { a: 1, b: 2 } }
  - { text: "third thoughts", tool: add, args: { a: 1, b: 3 } }
  - { text: "never reached" }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("max_iterations"));
    assert_eq!(r.kill_reason, None);
    assert_eq!(r.iterations, 3);
    assert_eq!(r.steps.len(), 3);
    assert_eq!(r.output.as_deref(), Some("third thoughts"));
}

#[tokio::test(start_paused = true)]
async fn an_invocation_can_lower_the_manifests_limits() {
    let (host, _store) = support::host().await;
    let spec = support::spec(HELLO);
    let mut inv = Invocation::prompt("x");
    inv.limits.max_iterations = Some(1);
    let r = host.execute(spec, inv).await.unwrap();
    assert_eq!(r.error_kind.as_deref(), Some("max_iterations"));
    assert_eq!(r.iterations, 1);
}

#[tokio::test(start_paused = true)]
async fn unknown_models_and_tools_are_refused_at_submit() {
    let (host, store) = support::host().await;
    let unknown_model = support::spec("name: m\nmodel: gpt-nope\n");
    match host.submit(unknown_model, Invocation::prompt("x")).await {
        Err(SubmitError::UnknownModel { model, known }) => {
            assert_eq!(model, "gpt-nope");
            assert!(known.contains("scripted"), "{known}");
        }
        other => panic!("expected UnknownModel, got {:?}", other.map(|h| h.run_id())),
    }
    let unknown_tool = support::spec("name: t\ntools: [add, frobnicate]\nscript: [{text: hi}]\n");
    match host.submit(unknown_tool, Invocation::prompt("x")).await {
        Err(e @ SubmitError::Tool(_)) => {
            let text = e.to_string();
            assert!(
                text.contains("frobnicate") && text.contains("add"),
                "{text}"
            );
        }
        other => panic!("expected a tool error, got {:?}", other.map(|h| h.run_id())),
    }
    let stats = host.shutdown().await;
    assert_eq!(stats.records, 0, "nothing ran, nothing was recorded");
    assert!(store.records().is_empty());
}

#[tokio::test(start_paused = true)]
async fn bad_manifests_are_refused_with_a_message_that_names_the_problem() {
    for (yaml, needle) in [
        ("name: a\nscript: [{text: hi}]\nlimmits: {}\n", "limmits"),
        (
            "name: a\nlimits: {max_runtime: 5 parsecs}\nscript: [{text: hi}]\n",
            "5 parsecs",
        ),
        ("name: a\nmodel: scripted\n", "script"),
        ("name: a\nscript: [{text: hi, hang: maybe}]\n", "hang"),
    ] {
        let err = agentvisor::AgentSpec::from_yaml(yaml)
            .err()
            .unwrap_or_else(|| panic!("accepted a bad manifest:\n{yaml}"));
        let text = err.to_string();
        assert!(text.contains(needle), "{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn after_shutdown_runs_are_rejected_not_lost() {
    let (host, _store) = support::host().await;
    host.shutdown().await;
    let r = host
        .execute(support::spec(HELLO), Invocation::prompt("x"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Rejected);
    assert_eq!(r.error_kind.as_deref(), Some("shutting_down"));
    assert_eq!(r.iterations, 0);
}
