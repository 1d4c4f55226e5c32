//! The critic's model judge (`critic: { policy: judge, … }`), asked off
//! the shard on a scripted model: a kill confirmed by the second model
//! ends the run `killed`/`policy`; one the second model does not confirm,
//! or one below the threshold, is a steer; `continue` leaves the run
//! alone and spaces the next question by its confidence; a judge that
//! times out or answers what the schema refuses is a `warning` and the
//! rules decide; at a soft timeout it extends a slow but healthy run; its
//! tokens are reported apart (`usage.critic`) and charged to the run's
//! budget. Time is tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use agentvisor::{CriticAction, Invocation, KillReason, RunEvent, RunResult, RunStatus};

/// A verdict as the judge's script writes it.
fn verdict(v: &str, confidence: f64, reason: &str) -> String {
    let answer = serde_json::json!({
        "verdict": v,
        "confidence": confidence,
        "reason": reason,
        "message": if v == "continue" { serde_json::Value::Null } else { format!("stop: {reason}").into() },
    });
    format!(
        "{{ text: {}, usage: {{ input: 100, output: 20 }} }}",
        serde_json::to_string(&answer.to_string()).unwrap()
    )
}

/// A manifest whose run makes `steps` distinct tool calls (1 s each, so
/// the judge's answer comes back between two steps) then answers, with
/// the judge's settings `critic`.
fn manifest(steps: usize, critic: &str) -> String {
    let mut yaml = format!(
        "name: judged\nmodel: scripted\ntools: [add]\nlimits: {{ max_iterations: 100, max_runtime: 10m }}\ncritic: {critic}\nscript:\n"
    );
    for i in 0..steps {
        yaml.push_str(&format!(
            "  - {{ tool: add, args: {{ a: {i}, b: 1 }}, latency: 1s, usage: {{ input: 10, output: 10 }} }}\n"
        ));
    }
    yaml.push_str("  - { text: done, usage: { input: 10, output: 10 } }\n");
    yaml
}

async fn run(yaml: &str, inv: Invocation) -> (RunResult, Vec<RunEvent>) {
    let (host, _store) = support::host().await;
    let spec = support::spec(yaml);
    let out = support::run_to_end(&host, spec, inv).await;
    host.shutdown().await;
    out
}

fn warnings(events: &[RunEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Warning { kind, .. } => Some(kind.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_kill_the_second_model_confirms_ends_the_run_killed_policy() {
    let critic = format!(
        "{{ policy: judge, model: scripted, after_steps: 3, confirm_model: scripted, script: [{}], confirm_script: [{}] }}",
        verdict("kill", 0.95, "it adds numbers and never answers"),
        verdict("kill", 0.9, "agreed"),
    );
    let (r, _) = run(&manifest(20, &critic), Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Killed, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Policy));
    let last = r.critic.last().unwrap();
    assert_eq!(last.action, CriticAction::Kill);
    assert_eq!(last.reason, "it adds numbers and never answers");
    assert!(
        last.detail.as_deref().unwrap().contains("confirmed by"),
        "{last:?}"
    );
    assert!(r.iterations < 20, "killed before its end: {}", r.iterations);
    let c = r.usage.critic.expect("the judges' usage is reported");
    assert_eq!((c.input_tokens, c.output_tokens, c.calls), (200, 40, 2));
    // Apart from the run's own calls (the last one was in flight when the
    // kill came, and was cut).
    assert_eq!(r.usage.total(), 20 * (r.iterations as u64 - 1));
}

#[tokio::test(start_paused = true)]
async fn a_kill_the_second_model_does_not_confirm_is_a_steer() {
    let critic = format!(
        "{{ policy: judge, model: scripted, after_steps: 3, confirm_model: scripted, script: [{}, {}], confirm_script: [{}] }}",
        verdict("kill", 0.95, "it seems stuck"),
        verdict("continue", 1.0, "fine now"),
        verdict("continue", 0.8, "it is making progress"),
    );
    let (r, _) = run(&manifest(10, &critic), Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.critic.len(), 1, "{:?}", r.critic);
    assert_eq!(r.critic[0].action, CriticAction::Steer);
    assert_eq!(r.critic[0].reason, "it seems stuck");
    assert_eq!(r.critic[0].detail.as_deref(), Some("stop: it seems stuck"));
    // Asked at step 3 (kill, then the confirmation), and 5 steps later.
    assert_eq!(r.usage.critic.unwrap().calls, 3);
}

#[tokio::test(start_paused = true)]
async fn a_kill_below_the_threshold_is_a_steer_without_a_second_opinion() {
    let critic = format!(
        "{{ policy: judge, model: scripted, after_steps: 3, threshold: 0.9, confirm_model: scripted, script: [{}, {}], confirm_script: [{}] }}",
        verdict("kill", 0.6, "maybe looping"),
        verdict("continue", 1.0, "fine"),
        verdict("kill", 1.0, "never asked"),
    );
    let (r, _) = run(&manifest(6, &critic), Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.critic.len(), 1);
    assert_eq!(r.critic[0].action, CriticAction::Steer);
    assert_eq!(r.usage.critic.unwrap().calls, 1, "no confirmation asked");
}

#[tokio::test(start_paused = true)]
async fn continue_leaves_the_run_alone_and_its_confidence_spaces_the_questions() {
    // Sure: asked at step 3, then 15 steps later (18).
    let sure = format!(
        "{{ policy: judge, model: scripted, after_steps: 3, every_steps: 10, script: [{{ text: {}, forever: true }}] }}",
        serde_json::to_string(
            &serde_json::json!({"verdict":"continue","confidence":1.0,"reason":"healthy","message":null}).to_string()
        )
        .unwrap()
    );
    let (r, events) = run(&manifest(20, &sure), Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.critic.is_empty(), "{:?}", r.critic);
    assert!(warnings(&events).is_empty(), "{events:?}");
    assert_eq!(r.usage.critic.unwrap().calls, 2);
    // Unsure: every 5 steps (3, 8, 13, 18).
    let unsure = sure.replace("\\\"confidence\\\":1.0", "\\\"confidence\\\":0.0");
    assert_ne!(unsure, sure);
    let (r, _) = run(&manifest(20, &unsure), Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.usage.critic.unwrap().calls, 4);
}

#[tokio::test(start_paused = true)]
async fn a_judge_that_times_out_is_a_warning_and_the_rules_decide() {
    let critic = "{ policy: judge, model: scripted, after_steps: 3, timeout: 2s, script: [{ hang: true, forever: true }] }";
    let (r, events) = run(&manifest(8, critic), Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.critic.is_empty());
    assert!(
        warnings(&events).contains(&"judge_timeout".to_string()),
        "{events:?}"
    );
    assert_eq!(
        r.usage.critic, None,
        "a call that never answered is charged nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_judge_that_answers_nonsense_is_a_warning_and_its_tokens_still_count() {
    let critic = "{ policy: judge, model: scripted, after_steps: 3, script: [{ text: 'I think it is fine', usage: { input: 50, output: 5 }, forever: true }] }";
    let (r, events) = run(&manifest(6, critic), Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.critic.is_empty());
    assert!(
        warnings(&events).contains(&"judge_invalid".to_string()),
        "{events:?}"
    );
    let c = r.usage.critic.unwrap();
    assert_eq!((c.input_tokens, c.output_tokens), (50, 5));
}

#[tokio::test(start_paused = true)]
async fn at_a_soft_timeout_the_judge_extends_a_slow_but_healthy_run() {
    let critic = format!(
        "{{ policy: judge, model: scripted, after_steps: 1000, script: [{}] }}",
        verdict("extend", 0.9, "slow but every call adds something new"),
    );
    // 12 steps of 1 s against a 5 s soft timeout and an 8 s hard deadline.
    let yaml = manifest(12, &critic).replace(
        "limits: { max_iterations: 100, max_runtime: 10m }",
        "limits: { max_iterations: 100, soft_timeout: 5s, hard_timeout: 8s, extension: 30s, max_extensions: 1 }",
    );
    let (r, _) = run(&yaml, Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.critic.len(), 1, "{:?}", r.critic);
    assert_eq!(r.critic[0].action, CriticAction::Extend);
    assert_eq!(r.critic[0].reason, "slow but every call adds something new");
}

#[tokio::test(start_paused = true)]
async fn the_judges_tokens_are_charged_to_the_runs_budget() {
    // The run's own calls: 20 tokens each, 11 calls = 220 of 1000. The
    // judge's one answer: 900 more, so the run passes its budget.
    let critic = format!(
        "{{ policy: judge, model: scripted, after_steps: 3, script: [{}] }}",
        verdict("continue", 1.0, "fine")
            .replace("input: 100, output: 20", "input: 800, output: 100"),
    );
    let mut inv = Invocation::prompt("add things");
    inv.budget_tokens = Some(1000);
    let (r, _) = run(&manifest(10, &critic), inv).await;
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.usage.critic.unwrap().total(), 900);
}

#[tokio::test(start_paused = true)]
async fn the_example_manifest_is_approved_by_its_judge_and_killed_by_the_confirmed_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents/judge.yaml");
    let spec = agentvisor::AgentSpec::from_file(path).unwrap();
    let (host, _store) = support::host().await;
    let (r, events) = support::run_to_end(&host, spec, Invocation::default()).await;
    host.shutdown().await;
    assert_eq!(r.status, RunStatus::Killed, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Policy));
    assert!(r.steps[0].ok, "the gated call ran: {:?}", r.steps[0]);
    assert!(events.iter().any(|e| matches!(
        e,
        RunEvent::ApprovalDecided { approved: true, by, .. } if by == "judge"
    )));
    assert_eq!(
        r.usage.critic.unwrap().calls,
        4,
        "approval, review, kill, confirmation"
    );
}

#[tokio::test(start_paused = true)]
async fn at_a_soft_timeout_the_judge_kills_a_wedged_run() {
    let critic = format!(
        "{{ policy: judge, model: scripted, after_steps: 1000, script: [{}] }}",
        verdict("kill", 0.95, "the same status, over and over"),
    );
    let yaml = manifest(12, &critic).replace(
        "limits: { max_iterations: 100, max_runtime: 10m }",
        "limits: { max_iterations: 100, soft_timeout: 5s, hard_timeout: 60s }",
    );
    let (r, _) = run(&yaml, Invocation::prompt("add things")).await;
    assert_eq!(r.status, RunStatus::Killed, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Policy));
    assert_eq!(r.critic.len(), 1, "{:?}", r.critic);
    assert_eq!(r.critic[0].reason, "the same status, over and over");
    assert!(
        r.iterations <= 6,
        "killed at the soft timeout: {}",
        r.iterations
    );
}
