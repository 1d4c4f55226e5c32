//! The critic kills a run that shows no heartbeat for `stall_timeout` while a
//! call is in flight (`killed`/`stalled`), aborts that call, and records the
//! decision in the result, the event stream and the audit log. A run whose
//! heartbeats keep coming is left alone, however long it takes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use agentvisor::{CriticAction, Invocation, KillReason, RunStatus};
use support::HangingTool;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_model_call_that_never_answers_is_killed_stalled() {
    let (host, store) = support::host().await;
    let spec = support::spec(
        r#"
name: stall
tools: [echo]
limits: { max_runtime: 30s, stall_timeout: 2s }
script:
  - { tool: echo, args: { text: looking }, latency: 50ms }
  - { hang: true }
"#,
    );
    let t0 = Instant::now();
    let (r, events) = support::run_to_end(&host, spec, Invocation::prompt("x")).await;
    let run_id = r.run_id;
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_millis(2050) && elapsed < Duration::from_millis(2100),
        "the last heartbeat (at 50 ms) + 2 s, ended after {elapsed:?}"
    );
    assert_eq!(r.status, RunStatus::Killed);
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    assert_eq!(r.error_kind.as_deref(), Some("stalled"));
    assert_eq!(r.iterations, 2);
    assert_eq!(r.steps.len(), 1, "the work before the stall is kept");
    assert_eq!(r.critic.len(), 1);
    let d = &r.critic[0];
    assert_eq!(
        (d.action, d.reason.as_str()),
        (CriticAction::Kill, "stalled")
    );
    assert!((2050..2060).contains(&d.at_ms), "{}", d.at_ms);

    let kinds = support::kinds(&events);
    assert!(kinds.contains(&"critic.kill".to_string()), "{kinds:?}");
    host.shutdown().await;
    let records = support::records(&store, run_id).await;
    let audited = support::kinds(&support::audited_events(&records));
    assert!(audited.contains(&"critic.kill".to_string()), "{audited:?}");
    assert_eq!(support::terminal_count(&records), 1);
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_that_hangs_is_killed_stalled_and_dropped() {
    let wait = HangingTool::new();
    let (host, _store) = support::host_from(support::builder().tool(wait.clone())).await;
    let spec = support::spec(
        "name: t\ntools: [wait]\nlimits: { stall_timeout: 3s, tool_timeout: 1h, max_runtime: 1h }\nscript:\n  - { tool: wait }\n  - { text: never }\n",
    );
    let t0 = Instant::now();
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(3100),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    assert_eq!(wait.started(), 1);
    assert_eq!(wait.dropped(), 1, "the stalled call was aborted");
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_a_long_run_alive() {
    let (host, _store) = support::host().await;
    // Six seconds of work in 1.5 s steps, under a 2 s stall timeout.
    let spec = support::spec(
        r#"
name: busy
tools: [sleep]
limits: { stall_timeout: 2s, max_runtime: 1m }
script:
  - { tool: sleep, args: { ms: 1500 } }
  - { tool: sleep, args: { ms: 1501 } }
  - { tool: sleep, args: { ms: 1502 } }
  - { tool: sleep, args: { ms: 1503 } }
  - { text: "done" }
"#,
    );
    let t0 = Instant::now();
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_secs(6));
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.critic.is_empty(), "{:?}", r.critic);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_run_does_not_disturb_its_neighbours() {
    let (host, _store) = support::host().await;
    let stalls =
        support::spec("name: s\nlimits: { stall_timeout: 1s }\nscript:\n  - { hang: true }\n");
    let slow = support::spec(
        "name: ok\ntools: [sleep]\nlimits: { stall_timeout: 5s }\nscript:\n  - { tool: sleep, args: { ms: 3000 } }\n  - { text: fine }\n",
    );
    let mut handles = Vec::new();
    for i in 0..10 {
        let spec = if i % 2 == 0 { &stalls } else { &slow };
        handles.push(host.submit(spec, Invocation::prompt("x")).await.unwrap());
    }
    for (i, h) in handles.into_iter().enumerate() {
        let r = h.await;
        if i % 2 == 0 {
            assert_eq!(r.kill_reason, Some(KillReason::Stalled));
        } else {
            assert_eq!(r.status, RunStatus::Ok);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_pause_of_the_process_moves_stall_windows_instead_of_killing() {
    let wait = HangingTool::new();
    let (host, _store) = support::host_from(support::builder().tool(wait.clone())).await;
    let spec = support::spec(
        "name: t\ntools: [wait]\nlimits: { stall_timeout: 2s, tool_timeout: 1h, max_runtime: 1h }\nscript:\n  - { tool: wait }\n  - { text: never }\n",
    );
    let t0 = Instant::now();
    let handle = host.submit(spec, Invocation::prompt("x")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The process "sleeps" 5 s: the clock jumps, and the shards learn of
    // it before any timer is judged (as their sleepers tell them).
    host.inject_pause(Duration::from_secs(5));
    tokio::time::advance(Duration::from_secs(5)).await;
    let r = handle.await;
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    // Without the shift the call would be stalled at 2 s; the window moved
    // by the 5 s the process was away.
    assert!(
        t0.elapsed() >= Duration::from_secs(7),
        "killed after {:?}",
        t0.elapsed()
    );
}
