//! The critic catches a run that makes the same tool call with the same
//! arguments again and again: at `repeat_limit` it steers once; on the next
//! repeat it kills the run (`killed`/`runaway`). Changing the arguments, or a
//! different call in between, resets the count.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use agentvisor::{CriticAction, Invocation, KillReason, RunEvent, RunStatus};
use support::RecordingModel;

#[tokio::test(start_paused = true)]
async fn the_same_call_again_and_again_is_steered_then_killed_runaway() {
    // No latency anywhere: the run must not outrun the critic's decision.
    let spec = support::spec(
        r#"
name: runaway
model: recorded
tools: [echo]
limits: { repeat_limit: 3, max_iterations: 20 }
script:
  - { tool: echo, args: { text: again }, forever: true }
"#,
    );
    let model = RecordingModel::new(&spec);
    let (host, store) =
        support::host_from(support::builder().model("recorded", model.clone())).await;
    let (r, events) = support::run_to_end(&host, spec, Invocation::prompt("x")).await;
    let run_id = r.run_id;
    assert_eq!(r.status, RunStatus::Killed, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Runaway));
    assert_eq!(r.error_kind.as_deref(), Some("runaway"));
    assert_eq!(r.iterations, 4, "steer at the 3rd call, kill at the 4th");
    assert_eq!(r.steps.len(), 4);
    let decisions: Vec<(CriticAction, &str)> = r
        .critic
        .iter()
        .map(|d| (d.action, d.reason.as_str()))
        .collect();
    assert_eq!(
        decisions,
        [
            (CriticAction::Steer, "runaway"),
            (CriticAction::Kill, "runaway")
        ]
    );
    let steer_text = r.critic[0].detail.clone().expect("the steer's text");
    assert!(steer_text.contains("same tool call"), "{steer_text}");

    // The steer reached the model before its 4th call.
    let fourth = model.request(3);
    assert!(
        fourth.iter().any(|m| m.content == steer_text),
        "the 4th call saw the steer"
    );
    assert!(!model.request(2).iter().any(|m| m.content == steer_text));

    let kinds = support::kinds(&events);
    let critic: Vec<&String> = kinds.iter().filter(|k| k.starts_with("critic.")).collect();
    assert_eq!(critic, ["critic.steer", "critic.kill"]);
    assert!(events
        .iter()
        .any(|e| matches!(e, RunEvent::MessageCreate { role, text } if role == "user" && *text == steer_text)));

    host.shutdown().await;
    let audited = support::kinds(&support::audited_events(
        &support::records(&store, run_id).await,
    ));
    let critic: Vec<&String> = audited
        .iter()
        .filter(|k| k.starts_with("critic."))
        .collect();
    assert_eq!(critic, ["critic.steer", "critic.kill"]);
}

#[tokio::test(start_paused = true)]
async fn a_run_that_changes_approach_after_the_steer_finishes_ok() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: learns
tools: [add]
script:
  - { tool: add, args: { a: 1, b: 1 }, repeat: 3 }
  - { text: "fine, it is 2" }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.critic.len(), 1);
    assert_eq!(r.critic[0].action, CriticAction::Steer);
    assert_eq!(r.critic[0].reason, "runaway");
}

#[tokio::test(start_paused = true)]
async fn different_arguments_are_not_a_repeat() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: varied
tools: [add, echo]
# add(1, 1) comes back 2 five times: `same_observation` (and `poll`) would
# see that; this test is about `repeat` alone.
critic: { loops: { same_observation: 0, poll: 0 } }
script:
  - { tool: add, args: { a: 1, b: 1 } }
  - { tool: add, args: { a: 1, b: 2 } }
  - { tool: add, args: { a: 1, b: 3 } }
  - { tool: add, args: { a: 1, b: 4 } }
  - { tool: add, args: { a: 1, b: 1 } }
  - { tool: add, args: { a: 1, b: 1 } }
  - { tool: echo, args: { text: break } }
  - { tool: add, args: { a: 1, b: 1 } }
  - { tool: add, args: { a: 1, b: 1 } }
  - { text: "done" }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.critic.is_empty(), "{:?}", r.critic);
}

#[tokio::test(start_paused = true)]
async fn repeat_limit_is_configurable() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        r#"
name: strict
tools: [echo]
limits: { repeat_limit: 2 }
script:
  - { tool: echo, args: { text: again }, forever: true }
"#,
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.kill_reason, Some(KillReason::Runaway));
    assert_eq!(r.iterations, 3);
}

#[tokio::test(start_paused = true)]
async fn many_runaways_at_once_are_all_caught() {
    let (host, _store) = support::host().await;
    let spec = support::spec(
        "name: r\ntools: [echo]\nlimits: { max_iterations: 50 }\nscript:\n  - { tool: echo, args: { text: again }, forever: true }\n",
    );
    let mut handles = Vec::new();
    for _ in 0..50 {
        handles.push(host.submit(&spec, Invocation::prompt("x")).await.unwrap());
    }
    for h in handles {
        let r = h.await;
        assert_eq!(r.kill_reason, Some(KillReason::Runaway), "{r:?}");
        assert_eq!(r.iterations, 4);
    }
}
