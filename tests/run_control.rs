//! Controlling a run through its handle: cancel, drop-cancels (and detach),
//! kill (`operator`), steer, extend, and the live state.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use agentvisor::ports::model::Role;
use agentvisor::{CriticAction, Invocation, KillReason, RunEvent, RunStatus};
use support::{HangingTool, RecordingModel};
use tokio::time::Instant;

const HANGS: &str =
    "name: hangs\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { hang: true }\n";

/// A run that calls the hanging `wait` tool.
const WAITS: &str =
    "name: waits\ntools: [wait]\nlimits: { stall_timeout: 1h, max_runtime: 1h, tool_timeout: 1h }\nscript:\n  - { tool: wait }\n  - { text: never }\n";

#[tokio::test(start_paused = true)]
async fn cancel_ends_the_run_cancelled_and_aborts_the_call_in_flight() {
    let wait = HangingTool::new();
    let (host, _store) = support::host_from(support::builder().tool(wait.clone())).await;
    let handle = host
        .submit(support::spec(WAITS), Invocation::prompt("x"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(wait.started(), 1);
    assert_eq!(wait.dropped(), 0);
    let t0 = Instant::now();
    handle.cancel();
    let r = handle.await;
    assert!(
        t0.elapsed() < Duration::from_millis(50),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(r.error_kind.as_deref(), Some("cancelled"));
    assert_eq!(r.kill_reason, None);
    assert!(r.critic.is_empty(), "a cancel is not a critic decision");
    assert_eq!(wait.dropped(), 1, "the tool call in flight was dropped");
    assert_eq!(host.live_runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_cancels_the_run() {
    let wait = HangingTool::new();
    let (host, store) = support::host_from(support::builder().tool(wait.clone())).await;
    let handle = host
        .submit(support::spec(WAITS), Invocation::prompt("x"))
        .await
        .unwrap();
    let run_id = handle.run_id();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(host.live_runs(), 1);
    drop(handle);
    tokio::time::timeout(Duration::from_secs(1), host.wait_idle())
        .await
        .expect("the run ends once its handle is dropped");
    assert_eq!(wait.dropped(), 1);
    host.shutdown().await;
    let records = support::records(&store, run_id).await;
    let terminal = records.last().expect("a terminal record");
    match &terminal.entry {
        agentvisor::ports::audit::AuditEntry::Terminal(r) => {
            assert_eq!(r.status, RunStatus::Cancelled);
        }
        other => panic!("expected the terminal record last, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_detached_run_goes_on_without_its_handle() {
    let (host, store) = support::host().await;
    let spec = support::spec(
        "name: d\ntools: [sleep]\nscript:\n  - { tool: sleep, args: { ms: 500 } }\n  - { text: finished }\n",
    );
    let handle = host.submit(spec, Invocation::prompt("x")).await.unwrap();
    let run_id = handle.run_id();
    handle.detach();
    host.wait_idle().await;
    host.shutdown().await;
    let records = support::records(&store, run_id).await;
    match &records.last().expect("records").entry {
        agentvisor::ports::audit::AuditEntry::Terminal(r) => {
            assert_eq!(r.status, RunStatus::Ok);
            assert_eq!(r.output.as_deref(), Some("finished"));
        }
        other => panic!("expected the terminal record last, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn kill_ends_the_run_killed_by_the_operator_and_says_so_everywhere() {
    let wait = HangingTool::new();
    let (host, store) = support::host_from(support::builder().tool(wait.clone())).await;
    let (handle, events) = host
        .submit_streaming(support::spec(WAITS), Invocation::prompt("x"))
        .await
        .unwrap();
    let run_id = handle.run_id();
    tokio::time::sleep(Duration::from_millis(250)).await;
    handle.kill();
    let events = support::collect(events).await;
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Killed);
    assert_eq!(r.kill_reason, Some(KillReason::Operator));
    assert_eq!(wait.dropped(), 1, "the kill reached the call in flight");
    assert_eq!(r.critic.len(), 1);
    assert_eq!(r.critic[0].action, CriticAction::Kill);
    assert_eq!(r.critic[0].reason, "operator");
    assert!(
        (250..300).contains(&r.critic[0].at_ms),
        "{}",
        r.critic[0].at_ms
    );
    // The steps so far are kept: the wait call was dispatched, never answered.
    assert_eq!(r.iterations, 1);

    let kinds = support::kinds(&events);
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["critic.kill", "error", "run.end"],
        "{kinds:?}"
    );
    match events.iter().rev().nth(1) {
        Some(RunEvent::Error { kind, .. }) => assert_eq!(kind, "operator"),
        other => panic!("{other:?}"),
    }
    host.shutdown().await;
    let records = support::records(&store, run_id).await;
    let audited = support::kinds(&support::audited_events(&records));
    assert!(audited.contains(&"critic.kill".to_string()), "{audited:?}");
    assert_eq!(support::terminal_count(&records), 1);
}

#[tokio::test(start_paused = true)]
async fn the_first_stop_wins() {
    let (host, _store) = support::host().await;
    let handle = host
        .submit(support::spec(HANGS), Invocation::prompt("x"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    handle.kill();
    handle.cancel();
    handle.kill();
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Killed);
    assert_eq!(r.kill_reason, Some(KillReason::Operator));
    assert_eq!(r.critic.len(), 1, "one kill decision: {:?}", r.critic);
}

#[tokio::test(start_paused = true)]
async fn steer_injects_a_message_before_the_next_model_call() {
    let spec = support::spec(
        r#"
name: s
model: recorded
tools: [sleep]
script:
  - { tool: sleep, args: { ms: 1000 } }
  - { text: "steered answer" }
"#,
    );
    let model = RecordingModel::new(&spec);
    let (host, store) =
        support::host_from(support::builder().model("recorded", model.clone())).await;
    let (handle, events) = host
        .submit_streaming(spec, Invocation::prompt("start"))
        .await
        .unwrap();
    let run_id = handle.run_id();
    tokio::time::sleep(Duration::from_millis(500)).await;
    handle.steer("answer in French");
    let events = support::collect(events).await;
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok);

    assert_eq!(model.calls(), 2);
    assert!(
        !model
            .request(0)
            .iter()
            .any(|m| m.content == "answer in French"),
        "not before it was sent"
    );
    let second = model.request(1);
    let last = second.last().expect("a transcript");
    assert_eq!(last.role, Role::User);
    assert_eq!(
        last.content, "answer in French",
        "after the tool result, before the call"
    );

    let kinds = support::kinds_without_deltas(&events);
    let steer_at = events
        .iter()
        .position(|e| matches!(e, RunEvent::MessageCreate { role, text } if role == "user" && text == "answer in French"))
        .expect("a message.create for the steer");
    assert_eq!(kinds[steer_at - 1], "tool.result", "{kinds:?}");
    assert_eq!(kinds[steer_at + 1], "step.start", "{kinds:?}");

    host.shutdown().await;
    let audited = support::audited_events(&support::records(&store, run_id).await);
    assert!(audited
        .iter()
        .any(|e| matches!(e, RunEvent::MessageCreate { role, .. } if role == "user")));
}

#[tokio::test(start_paused = true)]
async fn extend_pushes_the_hard_deadline_back() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        "name: e\nlimits: { max_runtime: 1h, hard_timeout: 10s, stall_timeout: 1h }\nscript:\n  - { hang: true }\n",
    );
    let t0 = Instant::now();
    let (handle, events) = host
        .submit_streaming(spec, Invocation::prompt("x"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    handle.extend(Duration::from_secs(10));
    let events = support::collect(events).await;
    let r = handle.await;
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_secs(20) && elapsed < Duration::from_millis(20_100),
        "deadline 10s + 10s, ended after {elapsed:?}"
    );
    assert_eq!(r.status, RunStatus::Timeout);
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    let decisions: Vec<(CriticAction, &str, Option<&str>)> = r
        .critic
        .iter()
        .map(|d| (d.action, d.reason.as_str(), d.detail.as_deref()))
        .collect();
    assert_eq!(
        decisions,
        [
            (CriticAction::Extend, "operator", Some("10000ms")),
            (CriticAction::Kill, "deadline", None)
        ]
    );
    assert_eq!(
        support::kinds(&events)
            .into_iter()
            .filter(|k| k.starts_with("critic."))
            .collect::<Vec<_>>(),
        ["critic.extend", "critic.kill"]
    );
}

#[tokio::test(start_paused = true)]
async fn without_extend_the_same_run_times_out_at_its_hard_timeout() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        "name: e\nlimits: { max_runtime: 1h, hard_timeout: 10s, stall_timeout: 1h }\nscript:\n  - { hang: true }\n",
    );
    let t0 = Instant::now();
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(10_100),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.status, RunStatus::Timeout);
}

#[tokio::test(start_paused = true)]
async fn live_state_follows_the_run() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: l
tools: [sleep]
script:
  - { tool: sleep, args: { ms: 1000 }, usage: { input: 10, output: 5 } }
  - { tool: sleep, args: { ms: 1001 }, usage: { input: 20, output: 5 } }
  - { text: done, usage: { input: 30, output: 5 } }
"#,
    );
    let handle = host.submit(spec, Invocation::prompt("x")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let live = handle.live().expect("live state");
    assert_eq!(live.iteration, 1);
    assert_eq!(live.max_iterations, 12);
    assert_eq!(live.tool_calls, 0);
    assert_eq!(live.tokens, 15);
    assert!(!live.finished);
    assert!((500..520).contains(&live.elapsed_ms), "{}", live.elapsed_ms);

    tokio::time::sleep(Duration::from_millis(1000)).await;
    let live = handle.live().expect("live state");
    assert_eq!((live.iteration, live.tool_calls, live.tokens), (2, 1, 40));
    assert!(!live.finished);

    tokio::time::sleep(Duration::from_millis(1000)).await;
    let live = handle.live().expect("live state");
    assert!(live.finished);
    assert_eq!(live.iteration, 3);
    assert_eq!(live.tokens, 75);
    assert_eq!(live.tool_calls, 2, "after the end, too");
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok);
}
