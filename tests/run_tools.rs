//! Tool calls inside a run: validation (unknown tool, arguments that are not
//! JSON, schema violations) turns into an error result the model reads and
//! the tool never runs; a failing or panicking tool is an error result and
//! the run goes on; parallel calls run concurrently; the tool timeout; the
//! consecutive-error ceiling.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use agentvisor::{Invocation, RunStatus};
use support::{CountingTool, RecordingModel};
use tokio::time::Instant;

/// A host with the `count` tool and a recording model playing `yaml`.
async fn recorded(
    yaml: &str,
) -> (
    agentvisor::Host,
    agentvisor::AgentSpec,
    std::sync::Arc<RecordingModel>,
    std::sync::Arc<CountingTool>,
) {
    let spec = support::spec(yaml);
    let model = RecordingModel::new(&spec);
    let count = CountingTool::new();
    let (host, _store) = support::host_from(
        support::builder()
            .model("recorded", model.clone())
            .tool(count.clone()),
    )
    .await;
    (host, spec, model, count)
}

#[tokio::test(start_paused = true)]
async fn a_call_to_an_unknown_tool_is_an_error_result_the_model_reads() {
    let (host, spec, model, count) = recorded(
        r#"
name: t
model: recorded
tools: [count]
script:
  - { tool: frobnicate, args: { n: 1 } }
  - { text: "sorry" }
"#,
    )
    .await;
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "the run goes on: {r:?}");
    assert_eq!(r.steps.len(), 1, "refused calls are steps too");
    let s = &r.steps[0];
    assert_eq!(&*s.tool, "frobnicate");
    assert!(!s.ok);
    let err = s.error.as_deref().unwrap_or_default();
    assert!(
        err.starts_with("unknown_tool") && err.contains("frobnicate"),
        "{err}"
    );
    assert_eq!(count.runs(), 0);
    let seen = model.tool_messages(1);
    assert_eq!(seen.len(), 1);
    assert!(seen[0].starts_with("error: unknown_tool"), "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn arguments_that_are_not_json_are_refused_before_the_tool_runs() {
    let (host, spec, model, count) = recorded(
        r#"
name: t
model: recorded
tools: [count]
script:
  - { tool: count, fail: malformed }
  - { text: "gave up" }
"#,
    )
    .await;
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(count.runs(), 0, "the tool never ran");
    let err = r.steps[0].error.as_deref().unwrap_or_default();
    assert!(
        err.starts_with("invalid_arguments") && err.contains("not valid JSON"),
        "{err}"
    );
    let seen = model.tool_messages(1);
    assert!(seen[0].contains("invalid_arguments"), "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn schema_violations_are_error_results_and_the_tool_does_not_run() {
    let (host, spec, model, count) = recorded(
        r#"
name: t
model: recorded
tools: [count]
limits: { max_tool_errors: 10 }
script:
  - { tool: count, args: { n: "seven" } }
  - { tool: count, args: { } }
  - { tool: count, args: { n: 1, extra: true } }
  - { tool: count, args: { n: 7 } }
  - { text: "counted" }
"#,
    )
    .await;
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let oks: Vec<bool> = r.steps.iter().map(|s| s.ok).collect();
    assert_eq!(oks, [false, false, false, true]);
    for s in &r.steps[..3] {
        let err = s.error.as_deref().unwrap_or_default();
        assert!(err.starts_with("invalid_arguments"), "{err}");
    }
    assert!(r.steps[0]
        .error
        .as_deref()
        .unwrap_or_default()
        .contains("/n"));
    assert!(r.steps[1]
        .error
        .as_deref()
        .unwrap_or_default()
        .contains("\"n\""));
    assert!(r.steps[2]
        .error
        .as_deref()
        .unwrap_or_default()
        .contains("extra"));
    assert_eq!(count.runs(), 1, "only the valid call ran");
    assert_eq!(r.steps[3].result, "counted 7");
    // The model read each refusal as the result of its call.
    assert!(model.tool_messages(1)[0].contains("/n"));
    assert!(model.tool_messages(4)[3].contains("counted 7"));
}

#[tokio::test(start_paused = true)]
async fn a_failing_tool_is_an_error_result_and_the_run_goes_on() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: t
tools: [fail, add]
script:
  - { tool: fail, args: { reason: "disk on fire" } }
  - { tool: add, args: { a: 1, b: 1 } }
  - { text: "done anyway" }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok);
    assert_eq!(
        r.steps[0].error.as_deref(),
        Some("tool_failed: disk on fire")
    );
    assert!(r.steps[1].ok);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_tool_is_an_error_result_and_the_run_goes_on() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: t
tools: [panic, add]
script:
  - { tool: panic, args: { message: "tool exploded" } }
  - { tool: add, args: { a: 2, b: 2 } }
  - { text: "still here" }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("still here"));
    let s = &r.steps[0];
    assert!(!s.ok);
    assert_eq!(
        s.error.as_deref(),
        Some("tool_panicked: tool panicked: tool exploded")
    );
    assert_eq!(r.steps[1].result, "4");
}

#[tokio::test(start_paused = true)]
async fn parallel_tool_calls_run_concurrently() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: t
tools: [sleep, add]
script:
  - tools:
      - { tool: sleep, args: { ms: 1000 } }
      - { tool: sleep, args: { ms: 1000 } }
      - { tool: add, args: { a: 1, b: 2 } }
  - { text: "all three done" }
"#,
    );
    let (handle, events) = host
        .submit_streaming(spec, Invocation::prompt("x"))
        .await
        .unwrap();
    let t0 = Instant::now();
    let events = support::collect(events).await;
    let r = handle.await;
    let elapsed = t0.elapsed();
    assert_eq!(r.status, RunStatus::Ok);
    assert!(
        elapsed >= Duration::from_millis(1000) && elapsed < Duration::from_millis(1500),
        "two 1000 ms sleeps side by side take about 1000 ms, took {elapsed:?}"
    );
    let tools: Vec<(&str, bool)> = r.steps.iter().map(|s| (&*s.tool, s.ok)).collect();
    assert_eq!(tools, [("sleep", true), ("sleep", true), ("add", true)]);
    assert!(r.steps.iter().all(|s| s.iteration == 1));
    assert_eq!(r.steps[0].duration_ms, 1000);
    assert_eq!(r.steps[2].duration_ms, 0, "add did not wait for the sleeps");
    // Every call is dispatched before any result comes back.
    let kinds = support::kinds_without_deltas(&events);
    assert_eq!(
        &kinds[..8],
        [
            "step.start",
            "step.finish",
            "tool.call",
            "tool.call",
            "tool.call",
            "tool.result",
            "tool.result",
            "tool.result"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_overruns_its_timeout_is_an_error_result() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: t
tools: [sleep]
limits: { tool_timeout: 100ms }
script:
  - { tool: sleep, args: { ms: 60000 } }
  - { tool: sleep, args: { ms: 50 } }
  - { text: "moved on" }
"#,
    );
    let t0 = Instant::now();
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    let s = &r.steps[0];
    assert!(!s.ok);
    assert_eq!(
        s.error.as_deref(),
        Some("tool_timeout: timed out after 100 ms")
    );
    assert!((100..150).contains(&s.duration_ms), "{}", s.duration_ms);
    assert!(r.steps[1].ok, "a quick call under the same timeout passes");
}

#[tokio::test(start_paused = true)]
async fn three_steps_in_a_row_where_every_call_failed_end_the_run() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: t
tools: [fail, add]
script:
  - { tool: fail, args: { reason: one } }
  - tools:
      - { tool: fail, args: { reason: two } }
      - { tool: nope }
  - { tool: add, args: { a: "x", b: 1 } }
  - { text: "never reached" }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("tool_errors"));
    assert_eq!(r.kill_reason, None);
    assert_eq!(r.iterations, 3);
    assert_eq!(r.steps.len(), 4);
    assert!(r.steps.iter().all(|s| !s.ok));
}

#[tokio::test(start_paused = true)]
async fn a_step_with_one_good_call_resets_the_error_count() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: t
tools: [fail, add]
script:
  - { tool: fail, args: { reason: one } }
  - { tool: fail, args: { reason: two } }
  - tools:
      - { tool: fail, args: { reason: three } }
      - { tool: add, args: { a: 1, b: 1 } }
  - { tool: fail, args: { reason: four } }
  - { tool: fail, args: { reason: five } }
  - { text: "survived" }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("survived"));
    assert_eq!(r.steps.iter().filter(|s| !s.ok).count(), 5);
}

#[tokio::test(start_paused = true)]
async fn long_tool_results_are_capped() {
    let long = "x".repeat(5000);
    let (host, spec, model, _count) = recorded(&format!(
        "name: t\nmodel: recorded\ntools: [echo]\nlimits: {{ max_tool_result_bytes: 1000 }}\nscript:\n  - {{ tool: echo, args: {{ text: \"{long}\" }} }}\n  - {{ text: ok }}\n"
    ))
    .await;
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok);
    let seen = &model.tool_messages(1)[0];
    assert!(seen.len() < 1100 && seen.contains("cut"), "{}", seen.len());
    assert!(r.steps[0].result.len() <= 260, "step summaries are short");
}

#[tokio::test(start_paused = true)]
async fn a_host_offers_the_failing_test_tools_only_when_asked() {
    use agentvisor::tools::RegistryError;
    use agentvisor::{Host, SubmitError};
    for tool in ["fail", "panic"] {
        let spec = support::spec(&format!(
            "name: t\ntools: [{tool}]\nscript:\n  - {{ text: never }}\n"
        ));
        let plain = Host::builder().build().await.unwrap();
        match plain.prepare(spec.clone()).await {
            Err(SubmitError::Tool(RegistryError::UnknownTool { name, available })) => {
                assert_eq!(name, tool);
                assert!(!available.iter().any(|n| n == "fail" || n == "panic"));
            }
            other => panic!("a plain host offered `{tool}`: {:?}", other.err()),
        }
        plain.shutdown().await;
        let asked = Host::builder().test_tools().build().await.unwrap();
        assert!(asked.prepare(spec).await.is_ok(), "`{tool}` asked for");
        asked.shutdown().await;
    }
}
