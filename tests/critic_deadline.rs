//! Soft timeout, extensions and the hard deadline. At the soft timeout the
//! critic extends the hard deadline by `extension` when the run made
//! progress since its last decision (at most `max_extensions` times), else
//! it steers once with a wrap-up nudge; at the hard deadline it ends the run
//! `timeout`/`deadline`. Every decision shows in the result, the event
//! stream and the audit log.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use agentvisor::policy::WRAP_UP;
use agentvisor::{CriticAction, Invocation, KillReason, RunEvent, RunResult, RunStatus};
use tokio::time::Instant;

fn decisions(r: &RunResult) -> Vec<(CriticAction, &str, u64)> {
    r.critic
        .iter()
        .map(|d| (d.action, d.reason.as_str(), d.at_ms))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn progress_earns_extensions_up_to_the_ceiling_then_a_steer_then_the_deadline() {
    let (host, store) = support::host().await;
    // Works forever, one 1 s tool call a step. Soft timeout 10 s, hard 20 s,
    // extensions of 10 s, two at most.
    let spec = support::spec(
        r#"
name: forever
tools: [sleep]
limits: { max_runtime: 10s, extension: 10s, max_extensions: 2, stall_timeout: 1h, max_iterations: 1000 }
critic: { loops: off }
script:
  - { tool: sleep, args: { ms: 1000 }, forever: true }
"#,
    );
    let t0 = Instant::now();
    let (r, events) = support::run_to_end(&host, spec, Invocation::prompt("x")).await;
    let run_id = r.run_id;
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_secs(40) && elapsed < Duration::from_millis(40_100),
        "hard 20 s + 2 × 10 s, ended after {elapsed:?}"
    );
    assert_eq!(r.status, RunStatus::Timeout);
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    assert_eq!(r.error_kind.as_deref(), Some("deadline"));
    assert_eq!(
        decisions(&r),
        [
            (CriticAction::Extend, "soft_timeout", 10_000),
            (CriticAction::Extend, "soft_timeout", 20_000),
            (CriticAction::Steer, "soft_timeout", 30_000),
            (CriticAction::Kill, "deadline", 40_000),
        ]
    );
    assert_eq!(r.critic[0].detail.as_deref(), Some("10000ms"));
    assert_eq!(r.critic[2].detail.as_deref(), Some(WRAP_UP));
    assert!(
        r.steps.len() >= 39,
        "the work done is kept: {}",
        r.steps.len()
    );

    // The steer reached the transcript as a user message.
    assert!(events.iter().any(
        |e| matches!(e, RunEvent::MessageCreate { role, text } if role == "user" && text == WRAP_UP)
    ));
    let critic_events = |kinds: Vec<String>| -> Vec<String> {
        kinds
            .into_iter()
            .filter(|k| k.starts_with("critic."))
            .collect()
    };
    let expected = [
        "critic.extend",
        "critic.extend",
        "critic.steer",
        "critic.kill",
    ];
    assert_eq!(critic_events(support::kinds(&events)), expected);
    host.shutdown().await;
    let audited = support::audited_events(&support::records(&store, run_id).await);
    assert_eq!(critic_events(support::kinds(&audited)), expected);
}

#[tokio::test(start_paused = true)]
async fn no_progress_gets_one_steer_then_the_deadline() {
    let (host, _store) = support::host().await;
    // The very first model call never answers (and the stall timeout is out
    // of the way): nothing to reward with an extension.
    let spec = support::spec(
        "name: stuck\nlimits: { max_runtime: 10s, stall_timeout: 1h }\nscript:\n  - { hang: true }\n",
    );
    let t0 = Instant::now();
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_secs(20) && elapsed < Duration::from_millis(20_100),
        "hard deadline 2 × max_runtime, ended after {elapsed:?}"
    );
    assert_eq!(r.status, RunStatus::Timeout);
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    assert_eq!(
        decisions(&r),
        [
            (CriticAction::Steer, "soft_timeout", 10_000),
            (CriticAction::Kill, "deadline", 20_000),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn progress_then_a_stuck_call_gets_an_extension_then_a_steer() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: then_stuck
tools: [sleep]
limits: { max_runtime: 10s, stall_timeout: 1h }
script:
  - { tool: sleep, args: { ms: 1000 } }
  - { hang: true }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    assert_eq!(
        decisions(&r),
        [
            (CriticAction::Extend, "soft_timeout", 10_000),
            (CriticAction::Steer, "soft_timeout", 20_000),
            (CriticAction::Kill, "deadline", 30_000),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_run_that_keeps_progressing_finishes_ok_on_extensions() {
    let (host, _store) = support::host().await;
    // 4.5 s of work against a 2 s soft / 4 s hard timeout.
    let spec = support::spec(
        r#"
name: slow
tools: [sleep]
limits: { max_runtime: 2s, extension: 2s, max_extensions: 2, stall_timeout: 5s }
script:
  - { tool: sleep, args: { ms: 900 } }
  - { tool: sleep, args: { ms: 901 } }
  - { tool: sleep, args: { ms: 902 } }
  - { tool: sleep, args: { ms: 903 } }
  - { tool: sleep, args: { ms: 904 } }
  - { text: "all five steps done" }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("all five steps done"));
    assert_eq!(
        decisions(&r),
        [
            (CriticAction::Extend, "soft_timeout", 2_000),
            (CriticAction::Extend, "soft_timeout", 4_000),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn with_no_extensions_allowed_a_busy_run_is_steered_then_timed_out() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: strict
tools: [sleep]
limits: { max_runtime: 5s, max_extensions: 0, stall_timeout: 1h, max_iterations: 1000 }
critic: { loops: off }
script:
  - { tool: sleep, args: { ms: 1000 }, forever: true }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Timeout);
    assert_eq!(
        decisions(&r),
        [
            (CriticAction::Steer, "soft_timeout", 5_000),
            (CriticAction::Kill, "deadline", 10_000),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_explicit_hard_timeout_wins_over_the_default() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        "name: h\nlimits: { max_runtime: 10s, hard_timeout: 3s, stall_timeout: 1h }\nscript:\n  - { hang: true }\n",
    );
    let t0 = Instant::now();
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(3100),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.status, RunStatus::Timeout);
    assert_eq!(
        decisions(&r),
        [(CriticAction::Kill, "deadline", 3_000)],
        "the deadline came before any soft decision"
    );
}
