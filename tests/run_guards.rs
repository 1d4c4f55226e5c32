//! Tool guards (`guard:`) and the output guard (`output_guard:`): a call a
//! rule denies is an error result the model reads, `ask` parks the call as
//! `approval:` does, `max_calls` denies calls past the limit, `args`
//! rules look into the arguments, and a final answer that matches a
//! denied pattern gets one repair turn, then `error`/`guardrail`. Every
//! guard decision is a critic decision in the result, the stream and the
//! audit log. Time is tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use agentvisor::{
    CriticAction, CriticDecision, Invocation, RunEvent, RunEvents, RunHandle, RunResult, RunStatus,
};
use support::RecordingModel;

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

/// Runs `yaml` to its end: the result, its audited events, the model.
async fn run(yaml: &str) -> (RunResult, Vec<RunEvent>, std::sync::Arc<RecordingModel>) {
    let (host, store, model, handle, events) = start(yaml).await;
    drop(events);
    let r = handle.await;
    host.shutdown().await;
    let records = support::records(&store, r.run_id).await;
    (r, support::audited_events(&records), model)
}

fn decision(action: CriticAction, reason: &str, detail: &str) -> (CriticAction, String, String) {
    (action, reason.to_string(), detail.to_string())
}

fn decisions(r: &RunResult) -> Vec<(CriticAction, String, String)> {
    r.critic
        .iter()
        .map(|d: &CriticDecision| {
            (
                d.action,
                d.reason.clone(),
                d.detail.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_denied_call_is_an_error_the_model_reads_and_a_critic_decision() {
    let yaml = r#"
name: deny
model: recorded
tools: [add, upper]
guard:
  - { tool: "up*", action: deny, reason: "no shouting" }
script:
  - { tools: [ { tool: upper, args: { text: hi } }, { tool: add, args: { a: 1, b: 2 } } ] }
  - { text: "done" }
"#;
    let (r, audited, model) = run(yaml).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(!r.steps[0].ok && r.steps[1].ok, "{:?}", r.steps);
    assert_eq!(
        r.steps[0].error.as_deref(),
        Some("guard_denied: no shouting")
    );
    assert_eq!(
        model.tool_messages(1),
        ["error: guard_denied: no shouting", "3"]
    );
    assert_eq!(
        decisions(&r),
        [decision(CriticAction::Deny, "guard", "upper: no shouting")]
    );
    // In the audit log, between the call and its result.
    let kinds = support::kinds(&audited);
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap();
    assert!(at("tool.call") < at("critic.deny"), "{kinds:?}");
    assert!(at("critic.deny") < at("tool.result"), "{kinds:?}");
    assert!(audited
        .iter()
        .any(|e| matches!(e, RunEvent::CriticDeny(d) if d.reason == "guard")));
}

#[tokio::test(start_paused = true)]
async fn ask_parks_the_call_for_an_operator_as_approval_does() {
    let yaml = r#"
name: ask
model: recorded
tools: [add, upper]
guard:
  - { tool: add, action: ask, reason: "sums need a look" }
limits: { max_runtime: 20s, hard_timeout: 20s, max_extensions: 0, stall_timeout: 5s }
script:
  - { tools: [ { tool: add, args: { a: 2, b: 3 } }, { tool: upper, args: { text: hi } } ] }
  - { text: "done" }
"#;
    let (host, store, model, handle, mut events) = start(yaml).await;
    let run = handle.run_ref();
    let mut asked = None;
    while let Some(ev) = events.next().await {
        match ev.event {
            RunEvent::CriticAsk(d) => asked = Some(d),
            RunEvent::ApprovalRequested { tool, .. } => {
                assert_eq!(&*tool, "add");
                break;
            }
            _ => {}
        }
    }
    let asked = asked.expect("the ask is a critic decision, before the request");
    assert_eq!(asked.action, CriticAction::Ask);
    assert_eq!(asked.detail.as_deref(), Some("add: sums need a look"));
    // Parked past its stall timeout and deadline, as an approval gate.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(!run.is_finished());
    assert_eq!(run.pending_approvals().len(), 1, "only the guarded call");
    assert_eq!(model.calls(), 1);
    run.approve(None).unwrap();
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(model.tool_messages(1), ["5", "HI"]);
    assert_eq!(
        decisions(&r),
        [decision(
            CriticAction::Ask,
            "guard",
            "add: sums need a look"
        )]
    );
    host.shutdown().await;
    let audited = support::audited_events(&support::records(&store, r.run_id).await);
    let kinds = support::kinds(&audited);
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap();
    assert!(at("critic.ask") < at("approval.requested"), "{kinds:?}");
    assert!(at("approval.decided") < at("tool.result"), "{kinds:?}");
}

#[tokio::test(start_paused = true)]
async fn max_calls_denies_the_call_past_the_limit() {
    let yaml = r#"
name: capped
model: recorded
tools: [add, upper]
guard:
  - { tool: add, max_calls: 2 }
script:
  - { tool: add, args: { a: 1, b: 1 } }
  - { tools: [ { tool: add, args: { a: 2, b: 2 } }, { tool: add, args: { a: 3, b: 3 } } ] }
  - { tool: upper, args: { text: free } }
  - { tool: add, args: { a: 4, b: 4 } }
  - { text: "done" }
"#;
    let (r, _audited, model) = run(yaml).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let oks: Vec<bool> = r.steps.iter().map(|s| s.ok).collect();
    assert_eq!(oks, [true, true, false, true, false], "{:?}", r.steps);
    let third = r.steps[2].error.clone().unwrap_or_default();
    assert!(
        third.starts_with("guard_denied: `add` may be called at most 2 times"),
        "{third}"
    );
    assert_eq!(model.tool_messages(1), ["2"]);
    assert_eq!(
        decisions(&r),
        [
            decision(CriticAction::Deny, "guard", "add: max_calls 2 reached"),
            decision(CriticAction::Deny, "guard", "add: max_calls 2 reached"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_args_rule_looks_at_the_value_at_its_pointer() {
    let yaml = r#"
name: paths
model: recorded
tools: [echo, upper, add]
guard:
  - { tool: "*", args: { pointer: /text, matches: "^/etc" }, action: deny }
script:
  - { tools: [ { tool: echo, args: { text: /etc/passwd } }, { tool: echo, args: { text: /home/ada } }, { tool: upper, args: { text: /etc } }, { tool: add, args: { a: 1, b: 2 } } ] }
  - { text: "done" }
"#;
    let (r, _audited, model) = run(yaml).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(
        model.tool_messages(1),
        [
            "error: guard_denied: denied by guard `*`",
            "/home/ada",
            "error: guard_denied: denied by guard `*`",
            "3"
        ]
    );
    let details: Vec<String> = decisions(&r).into_iter().map(|d| d.2).collect();
    assert_eq!(
        details,
        ["echo: denied by guard `*`", "upper: denied by guard `*`"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_guarded_answer_gets_one_repair_turn() {
    let yaml = r#"
name: answers
model: recorded
output_guard: { deny_patterns: ["(?i)api[_-]?key"] }
script:
  - { text: "your API_KEY is hunter2" }
  - { text: "I cannot share that." }
"#;
    let (r, audited, model) = run(yaml).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("I cannot share that."));
    let repair = model.request(1).last().unwrap().content.clone();
    assert!(
        repair.starts_with("Your answer was withheld") && repair.contains("api[_-]?key"),
        "{repair}"
    );
    assert!(!repair.contains("hunter2"), "{repair}");
    assert_eq!(
        decisions(&r),
        [decision(
            CriticAction::Deny,
            "output_guard",
            "pattern 1 matched the final answer"
        )]
    );
    assert!(audited.iter().any(|e| matches!(e, RunEvent::CriticDeny(_))));
}

#[tokio::test(start_paused = true)]
async fn a_second_guarded_answer_ends_the_run_guardrail_without_output() {
    let yaml = r#"
name: answers
model: recorded
output_guard: { deny_patterns: ["password", "(?i)api[_-]?key"] }
script:
  - { text: "your API_KEY is hunter2" }
  - { text: "fine: the api-key is hunter2" }
  - { text: "never asked" }
"#;
    let (r, _audited, model) = run(yaml).await;
    assert_eq!(r.status, RunStatus::Error, "{r:?}");
    assert_eq!(r.error_kind.as_deref(), Some("guardrail"));
    assert_eq!(r.output, None, "a refused answer is no output");
    let error = r.error.clone().unwrap_or_default();
    assert!(error.contains("pattern 2"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
    assert_eq!(model.calls(), 2);
    assert_eq!(r.critic.len(), 2);
    assert!(r
        .critic
        .iter()
        .all(|d| d.action == CriticAction::Deny && d.reason == "output_guard"));
}

#[tokio::test(start_paused = true)]
async fn approval_keeps_working_beside_guards_and_allow_ends_the_search() {
    // `allow` matches first: the later deny-all never sees `add`; `upper`
    // is gated by `approval:` as before.
    let yaml = r#"
name: both
model: recorded
tools: [add, upper]
approval: [upper]
guard:
  - { tool: add, action: allow }
  - { tool: "*", args: { pointer: /a, matches: "." }, action: deny }
script:
  - { tools: [ { tool: add, args: { a: 1, b: 2 } }, { tool: upper, args: { text: hi } } ] }
  - { text: "done" }
"#;
    let (host, _store, model, handle, mut events) = start(yaml).await;
    let run = handle.run_ref();
    while let Some(ev) = events.next().await {
        if let RunEvent::ApprovalRequested { tool, .. } = ev.event {
            assert_eq!(&*tool, "upper");
            break;
        }
    }
    run.approve(None).unwrap();
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok);
    assert_eq!(model.tool_messages(1), ["3", "HI"]);
    assert!(
        r.critic.is_empty(),
        "approval is no guard decision: {:?}",
        r.critic
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn max_calls_holds_across_a_resume() {
    // Two sums, then a third asked for in the call a shutdown interrupts:
    // the run resumed on another host knows its two earlier calls.
    let yaml = r#"
name: capped
model: recorded
durable: true
tools: [add]
guard:
  - { tool: add, max_calls: 2 }
script:
  - { tool: add, args: { a: 1, b: 1 } }
  - { tool: add, args: { a: 2, b: 2 } }
  - { tool: add, args: { a: 3, b: 3 }, latency: 10s }
  - { text: "done" }
"#;
    let audit = std::sync::Arc::new(agentvisor::stores::MemoryAuditStore::new());
    let checkpoints = std::sync::Arc::new(agentvisor::stores::MemoryCheckpointer::new());
    let host_on = |model| {
        support::builder()
            .model("recorded", model)
            .audit_store(audit.clone())
            .checkpointer(checkpoints.clone())
            .build()
    };
    let first = host_on(RecordingModel::new(&support::spec(yaml)))
        .await
        .unwrap();
    let handle = first
        .submit(support::spec(yaml), Invocation::prompt("go"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.shutdown().await;
    assert_eq!(handle.await.error_kind.as_deref(), Some("shutdown"));

    let model = RecordingModel::new(&support::spec(yaml));
    let second = host_on(model.clone()).await.unwrap();
    let recovery = second.recover().await.unwrap();
    let r = recovery.resumed.into_iter().next().expect("resumed").await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let oks: Vec<bool> = r.steps.iter().map(|s| s.ok).collect();
    assert_eq!(oks, [true, true, false], "{:?}", r.steps);
    assert_eq!(
        decisions(&r),
        [decision(
            CriticAction::Deny,
            "guard",
            "add: max_calls 2 reached"
        )]
    );
    second.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn no_ending_keeps_an_output_the_output_guard_denies() {
    // The reply that passes the budget would be kept as the output of a
    // `budget_exceeded` run; it names an API key: withheld.
    let yaml = r#"
name: spent
model: recorded
budget: { tokens: 100 }
output_guard: { deny_patterns: ["(?i)api[_-]?key"] }
script:
  - { text: "the API_KEY is hunter2", usage: { input: 200, output: 10 } }
"#;
    let (r, _audited, _model) = run(yaml).await;
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.output, None, "{r:?}");
    assert_eq!(
        decisions(&r),
        [decision(
            CriticAction::Deny,
            "output_guard",
            "pattern 1 matched the run's output: withheld"
        )]
    );

    // A run killed after a turn whose text names a key keeps no partial
    // output either.
    let yaml = r#"
name: partial
model: recorded
tools: [sleep]
limits: { max_runtime: 5s, hard_timeout: 5s, max_extensions: 0, stall_timeout: 1h, tool_timeout: 1h }
output_guard: { deny_patterns: ["(?i)api[_-]?key"] }
script:
  - { text: "found the api_key, now sleeping", tool: sleep, args: { ms: 60000 } }
  - { text: "never" }
"#;
    let (r, _audited, _model) = run(yaml).await;
    assert_eq!(r.status, RunStatus::Timeout, "{r:?}");
    assert_eq!(r.output, None, "{r:?}");
}
