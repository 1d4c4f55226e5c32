//! Human approval (C9): a call of a tool the manifest gates (`approval:`)
//! parks its run until an operator approves or denies it, with the run's
//! deadlines and stall timer paused meanwhile; nobody deciding within
//! `approval_timeout` denies it. Time is tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use agentvisor::{
    AgentSpec, ApprovalError, Invocation, KillReason, RunEvent, RunEvents, RunHandle, RunStatus,
};
use support::RecordingModel;

/// A run that adds (gated), then answers; tight deadlines that a parked
/// run would long have passed.
const GATED: &str = r#"
name: gated
model: recorded
tools: [add, upper]
approval: [add]
limits: { max_runtime: 20s, soft_timeout: 20s, hard_timeout: 20s, max_extensions: 0, stall_timeout: 5s }
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { text: "done" }
"#;

/// Starts `yaml` on a host whose `recorded` model plays its script.
async fn start(
    yaml: &str,
) -> (
    agentvisor::Host,
    std::sync::Arc<agentvisor::stores::MemoryAuditStore>,
    std::sync::Arc<RecordingModel>,
    RunHandle,
    RunEvents,
) {
    let spec = support::spec(yaml);
    let model = RecordingModel::new(&spec);
    let (host, store) =
        support::host_from(support::builder().model("recorded", model.clone())).await;
    let (handle, events) = host
        .submit_streaming(spec, Invocation::prompt("go"))
        .await
        .unwrap();
    (host, store, model, handle, events)
}

/// Reads events until `n` calls wait for approval; returns their call ids.
async fn until_requested(events: &mut RunEvents, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    while ids.len() < n {
        let ev = events.next().await.expect("the run waits before it ends");
        if let RunEvent::ApprovalRequested { call_id, .. } = &ev.event {
            ids.push(call_id.to_string());
        }
    }
    ids
}

#[tokio::test(start_paused = true)]
async fn a_parked_run_outlives_its_deadlines_and_runs_the_call_once_approved() {
    let (host, store, model, handle, mut events) = start(GATED).await;
    let run = handle.run_ref();
    let ids = until_requested(&mut events, 1).await;
    let pending = run.pending_approvals();
    assert_eq!(pending.len(), 1);
    assert_eq!(&*pending[0].tool, "add");
    assert_eq!(pending[0].call_id.to_string(), ids[0]);
    assert!(pending[0].arguments.contains("\"a\""), "{pending:?}");
    assert_eq!(run.live().awaiting_approval, pending);

    // Half an hour: far past its stall timeout (5 s) and hard deadline (20 s).
    tokio::time::sleep(Duration::from_secs(1800)).await;
    assert!(!run.is_finished(), "a parked run is not killed");
    assert_eq!(model.calls(), 1, "nothing ran meanwhile");

    let covered = run.approve(None).unwrap();
    assert_eq!(covered, pending);
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("done"));
    assert!(r.steps[0].ok, "the approved call ran: {:?}", r.steps);
    assert_eq!(model.tool_messages(1), ["5"]);
    assert!(r.critic.is_empty(), "no critic decision: {:?}", r.critic);
    assert!(run.pending_approvals().is_empty());
    assert_eq!(run.approve(None), Err(ApprovalError::NotAwaiting));

    // The request and the decision are in the audit log.
    host.shutdown().await;
    let records = support::records(&store, r.run_id).await;
    let audited = support::audited_events(&records);
    let decided = audited
        .iter()
        .find_map(|e| match e {
            RunEvent::ApprovalDecided {
                approved,
                by,
                waited_ms,
                ..
            } => Some((*approved, by.clone(), *waited_ms)),
            _ => None,
        })
        .expect("the decision is recorded");
    assert_eq!((decided.0, decided.1.as_str()), (true, "operator"));
    assert!(decided.2 >= 1_800_000, "{decided:?}");
    let kinds = support::kinds(&audited);
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap();
    assert!(at("tool.call") < at("approval.requested"));
    assert!(at("approval.requested") < at("approval.decided"));
    assert!(at("approval.decided") < at("tool.result"));
}

#[tokio::test(start_paused = true)]
async fn after_the_wait_the_deadlines_hold_from_where_they_stood() {
    // The model hangs after the approved call: the run has what was left
    // of its 20 s when it parked, counted from the approval.
    let yaml = GATED.replace(r#"  - { text: "done" }"#, "  - { hang: true }");
    let yaml = yaml.replace("stall_timeout: 5s", "stall_timeout: 1h");
    let (host, _store, _model, handle, mut events) = start(&yaml).await;
    let run = handle.run_ref();
    until_requested(&mut events, 1).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    run.approve(None).unwrap();
    let approved = tokio::time::Instant::now();
    let r = handle.await;
    let lived = approved.elapsed();
    assert_eq!(r.status, RunStatus::Timeout, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    assert!(
        lived >= Duration::from_secs(19) && lived <= Duration::from_secs(21),
        "ended {lived:?} after the approval"
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stall_window_opens_fresh_after_the_wait() {
    let yaml = GATED.replace(r#"  - { text: "done" }"#, "  - { hang: true }");
    let yaml = yaml.replace("hard_timeout: 20s", "hard_timeout: 1h");
    let yaml = yaml.replace("soft_timeout: 20s", "soft_timeout: 1h");
    let (host, _store, _model, handle, mut events) = start(&yaml).await;
    let run = handle.run_ref();
    until_requested(&mut events, 1).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    run.approve(None).unwrap();
    let approved = tokio::time::Instant::now();
    let r = handle.await;
    assert_eq!(r.kill_reason, Some(KillReason::Stalled), "{r:?}");
    let lived = approved.elapsed();
    assert!(
        lived >= Duration::from_secs(5) && lived < Duration::from_secs(6),
        "stalled {lived:?} after the approval"
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_denied_call_is_an_error_the_model_reads() {
    let (host, _store, model, handle, mut events) = start(GATED).await;
    let run = handle.run_ref();
    until_requested(&mut events, 1).await;
    let covered = run.deny(None, "too risky").unwrap();
    assert_eq!(covered.len(), 1);
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "the model goes on: {r:?}");
    assert!(!r.steps[0].ok);
    assert_eq!(
        r.steps[0].error.as_deref(),
        Some("approval_denied: denied by operator: too risky")
    );
    assert_eq!(
        model.tool_messages(1),
        ["error: approval_denied: denied by operator: too risky"]
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn nobody_deciding_within_the_approval_timeout_denies_the_call() {
    let yaml = GATED.replace(
        "max_extensions: 0,",
        "max_extensions: 0, approval_timeout: 10m,",
    );
    let (host, _store, model, handle, mut events) = start(&yaml).await;
    until_requested(&mut events, 1).await;
    let t0 = tokio::time::Instant::now();
    let mut decided = None;
    while let Some(ev) = events.next().await {
        if let RunEvent::ApprovalDecided {
            approved,
            by,
            reason,
            ..
        } = &ev.event
        {
            decided = Some((*approved, by.clone(), reason.clone(), t0.elapsed()));
        }
    }
    let (approved, by, reason, after) = decided.expect("a decision is recorded");
    assert!(!approved);
    assert_eq!(by, "timeout");
    assert!(reason.unwrap().contains("10m"));
    assert!(
        after >= Duration::from_secs(600) && after < Duration::from_secs(601),
        "{after:?}"
    );
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok);
    assert_eq!(
        model.tool_messages(1),
        ["error: approval_denied: denied: nobody approved the call within 10m"]
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn calls_of_one_turn_are_decided_one_by_one_and_run_together() {
    let yaml = r#"
name: turn
model: recorded
tools: [add, upper]
approval: [add]
script:
  - { tools: [ { tool: add, args: { a: 1, b: 1 } }, { tool: upper, args: { text: hi } }, { tool: add, args: { a: 2, b: 2 } } ] }
  - { text: "done" }
"#;
    let (host, _store, model, handle, mut events) = start(yaml).await;
    let run = handle.run_ref();
    let ids = until_requested(&mut events, 2).await;
    assert_eq!(
        run.pending_approvals().len(),
        2,
        "the free call is not asked about"
    );
    assert_eq!(
        run.approve(Some("no-such-call")),
        Err(ApprovalError::UnknownCall("no-such-call".into()))
    );
    let covered = run.approve(Some(&ids[0])).unwrap();
    assert_eq!(covered.len(), 1);
    // One still waits: nothing has run.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(run.pending_approvals().len(), 1);
    assert_eq!(model.calls(), 1);
    run.deny(Some(&ids[1]), "").unwrap();
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let oks: Vec<bool> = r.steps.iter().map(|s| s.ok).collect();
    assert_eq!(oks, [true, true, false]);
    assert_eq!(
        model.tool_messages(1),
        ["2", "HI", "error: approval_denied: denied by operator"]
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_parked_run_can_be_killed() {
    let (host, _store, _model, handle, mut events) = start(GATED).await;
    let run = handle.run_ref();
    until_requested(&mut events, 1).await;
    run.kill(KillReason::Operator);
    let r = handle.await;
    assert_eq!(r.kill_reason, Some(KillReason::Operator));
    assert!(run.pending_approvals().is_empty());
    assert_eq!(run.deny(None, "late"), Err(ApprovalError::NotAwaiting));
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn secrets_in_the_arguments_shown_are_redacted() {
    agentvisor::secrets::register("sk-approval-test-0123456789");
    let yaml = r#"
name: secret
model: recorded
tools: [upper]
approval: ["*"]
script:
  - { tool: upper, args: { text: "key sk-approval-test-0123456789" } }
  - { text: "done" }
"#;
    let (host, _store, _model, handle, mut events) = start(yaml).await;
    let run = handle.run_ref();
    let mut shown = None;
    while let Some(ev) = events.next().await {
        if let RunEvent::ApprovalRequested { arguments, .. } = &ev.event {
            shown = Some(arguments.clone());
            break;
        }
    }
    let shown = shown.unwrap();
    assert!(!shown.contains("sk-approval-test"), "{shown}");
    assert!(shown.contains("[REDACTED]"), "{shown}");
    assert!(!run.pending_approvals()[0]
        .arguments
        .contains("sk-approval-test"));
    run.approve(None).unwrap();
    assert_eq!(handle.await.status, RunStatus::Ok);
    host.shutdown().await;
}

#[test]
fn approval_gates_are_checked_in_the_manifest() {
    let bad = |yaml: &str| match AgentSpec::from_yaml(yaml) {
        Ok(_) => panic!("accepted: {yaml}"),
        Err(e) => e.to_string(),
    };
    let e =
        bad("name: a\nmodel: scripted\ntools: [add]\napproval: [shell]\nscript: [{ text: x }]\n");
    assert!(e.contains("`shell`") && e.contains("line 4"), "{e}");
    let e = bad(
        "name: a\nmodel: scripted\ntools: [add]\napproval: [add, add]\nscript: [{ text: x }]\n",
    );
    assert!(e.contains("twice"), "{e}");
    let e = bad("name: a\nmodel: scripted\ntools: [add]\napproval: [add]\nlimits: { approval_timeout: 0s }\nscript: [{ text: x }]\n");
    assert!(e.contains("approval_timeout"), "{e}");
    let e = bad("name: a\nmodel: scripted\napprovals: [add]\nscript: [{ text: x }]\n");
    assert!(e.contains("approvals"), "{e}");
    for ok in ["[add]", "['*']", "[]"] {
        let yaml = format!(
            "name: a\nmodel: scripted\ntools: [add]\napproval: {ok}\nscript: [{{ text: x }}]\n"
        );
        AgentSpec::from_yaml(&yaml).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    let spec = support::spec(
        "name: a\nmodel: scripted\ntools: [add, upper]\napproval: [add]\nscript: [{ text: x }]\n",
    );
    assert!(spec.needs_approval("add") && !spec.needs_approval("upper"));
    assert_eq!(
        spec.limits.resolve(&Default::default()).approval_timeout,
        Duration::from_secs(3600)
    );
}
