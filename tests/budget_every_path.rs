//! Every budget applies together on every path (B1, B2): a manifest's
//! `budget.tokens`, an invocation's `budget_tokens`, a host's allowance and
//! the caller's stored limits, the tightest winning, checked before every
//! model call in the run itself (so no model is fast enough to outrun it),
//! with sub-agents spending their parent's run budget; a call asks for no
//! longer a reply than the budgets leave, and a reply that still passes a
//! budget ends the run `budget_exceeded` with its output; an absurd usage
//! report is a malformed response, not a ledger entry.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::budget::{BudgetLedger, BudgetLimits};
use agentvisor::stores::MemoryBudgetLedger;
use agentvisor::{Host, HostConfig, Invocation, KillReason, RunResult, RunStatus};
use support::{RecordingModel, SPENDER};

fn with_budget(yaml: &str, tokens: u64) -> String {
    format!("{yaml}budget: {{ tokens: {tokens} }}\n")
}

async fn host_with(
    yaml: &str,
    ledger: Arc<MemoryBudgetLedger>,
    config: HostConfig,
) -> (Host, Arc<RecordingModel>) {
    let model = RecordingModel::new(&support::spec(yaml));
    let (host, _) = support::host_from(
        support::builder()
            .config(HostConfig {
                critic_shards: 2,
                ..config
            })
            .model("recorded", model.clone())
            .budget_ledger(ledger),
    )
    .await;
    (host, model)
}

async fn run(host: &Host, yaml: &str, inv: Invocation) -> RunResult {
    host.submit(support::spec(yaml), inv).await.unwrap().await
}

fn assert_stopped_by_budget(r: &RunResult) {
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Budget), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn a_manifest_budget_holds_on_every_run_the_host_admits() {
    let yaml = with_budget(SPENDER, 1000);
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let (host, model) = host_with(&yaml, ledger, HostConfig::default()).await;
    let r = run(&host, &yaml, Invocation::prompt("go")).await;
    assert_stopped_by_budget(&r);
    // Two calls (1 200 tokens): the second passed the budget, so no third.
    assert_eq!(model.calls(), 2, "{r:?}");
    assert_eq!(r.usage.total(), 1200);
    assert!(
        r.error.as_deref().unwrap().contains("token budget"),
        "{r:?}"
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_invocation_budget_and_the_callers_stored_limit_apply_together() {
    // The caller may spend 10 000; this run 700: the run's wins.
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "alice",
        BudgetLimits {
            tokens: Some(10_000),
            ..Default::default()
        },
    );
    let (host, model) = host_with(SPENDER, ledger.clone(), HostConfig::default()).await;
    let inv = Invocation {
        budget_tokens: Some(700),
        ..Invocation::prompt("go").caller("alice")
    };
    let r = run(&host, SPENDER, inv).await;
    assert_stopped_by_budget(&r);
    assert_eq!(model.calls(), 2);
    host.shutdown().await;
    // Every token is recorded in the caller's ledger.
    let spent = ledger
        .spent("alice", Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(spent.tokens, 1200);

    // Now the caller's limit is the tighter: 1 200 spent of 1 500, and a
    // manifest budget of 100 000 does not lift it.
    ledger.set_limits(
        "alice",
        BudgetLimits {
            tokens: Some(1500),
            ..Default::default()
        },
    );
    let yaml = with_budget(SPENDER, 100_000);
    let (host, model) = host_with(&yaml, ledger.clone(), HostConfig::default()).await;
    let r = run(&host, &yaml, Invocation::prompt("go").caller("alice")).await;
    assert_stopped_by_budget(&r);
    assert_eq!(model.calls(), 1, "{r:?}");
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_host_allowance_is_shared_by_its_runs_on_top_of_their_own() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let config = HostConfig {
        allowance_tokens: Some(1500),
        ..HostConfig::default()
    };
    let (host, _) = host_with(SPENDER, ledger, config).await;
    // The first run spends 1 800 (three calls; the third passes 1 500).
    let first = run(&host, SPENDER, Invocation::prompt("go")).await;
    assert_stopped_by_budget(&first);
    assert_eq!(first.usage.total(), 1800);
    // The allowance is spent: the next run of the host is refused.
    let second = run(&host, SPENDER, Invocation::prompt("again")).await;
    assert_eq!(second.status, RunStatus::BudgetExceeded, "{second:?}");
    assert_eq!(second.iterations, 0, "{second:?}");
    assert!(
        second
            .error
            .as_deref()
            .unwrap()
            .contains("this host's runs"),
        "{second:?}"
    );
    host.shutdown().await;
}

/// One answer of 494 tokens.
const ONE_BIG_ANSWER: &str = r#"
name: big
model: recorded
max_tokens: 300
script:
  - { text: "a long answer", usage: { input: 400, output: 94 } }
"#;

#[tokio::test(start_paused = true)]
async fn a_reply_past_the_budget_ends_budget_exceeded_and_keeps_its_output() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let (host, model) = host_with(ONE_BIG_ANSWER, ledger, HostConfig::default()).await;
    let inv = Invocation {
        budget_tokens: Some(5),
        ..Invocation::prompt("go")
    };
    let r = run(&host, ONE_BIG_ANSWER, inv).await;
    assert_stopped_by_budget(&r);
    assert_eq!(r.output.as_deref(), Some("a long answer"));
    // The call asked for no more than the budget left.
    assert_eq!(model.reply_caps(), vec![Some(5)]);

    // With room to spare, the manifest's own cap is the bound.
    let inv = Invocation {
        budget_tokens: Some(100_000),
        ..Invocation::prompt("go")
    };
    let r = run(&host, ONE_BIG_ANSWER, inv).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(model.reply_caps()[1], Some(300));
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_zero_budget_is_refused_before_the_run() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let (host, model) = host_with(SPENDER, ledger, HostConfig::default()).await;
    let inv = Invocation {
        budget_tokens: Some(0),
        ..Invocation::prompt("go")
    };
    let e = host
        .submit(support::spec(SPENDER), inv)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("budget_tokens"), "{e}");
    assert_eq!(model.calls(), 0);
    host.shutdown().await;
}

/// A reply that claims every token there is.
const ABSURD: &str = r#"
name: absurd
model: recorded
script:
  - { text: "hi", usage: { input: 18446744073709551615, output: 18446744073709551615 } }
  - { text: "hi", usage: { input: 10, output: 2 } }
"#;

#[tokio::test(start_paused = true)]
async fn an_absurd_usage_report_is_a_malformed_response_and_charges_nothing() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "bob",
        BudgetLimits {
            tokens: Some(1_000_000),
            ..Default::default()
        },
    );
    let (host, _) = host_with(ABSURD, ledger.clone(), HostConfig::default()).await;
    let r = run(&host, ABSURD, Invocation::prompt("go").caller("bob")).await;
    assert_eq!(r.status, RunStatus::Error, "{r:?}");
    assert_eq!(r.error_kind.as_deref(), Some("malformed_response"), "{r:?}");
    assert_eq!(r.usage.total(), 0);
    // The caller is not locked out: its next run is admitted and runs.
    let next = run(&host, ABSURD, Invocation::prompt("again").caller("bob")).await;
    assert_ne!(next.status, RunStatus::Rejected, "{next:?}");
    assert_ne!(next.status, RunStatus::BudgetExceeded, "{next:?}");
    host.shutdown().await;
    let spent = ledger
        .spent("bob", Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(spent.tokens < 100, "{spent:?}");
}

#[tokio::test(start_paused = true)]
async fn a_session_prompt_is_held_to_its_manifests_budget() {
    let yaml = with_budget(SPENDER, 1000);
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let (host, model) = host_with(&yaml, ledger, HostConfig::default()).await;
    let chat = host
        .open_session(support::spec(&yaml), agentvisor::SessionOptions::default())
        .await
        .unwrap();
    let r = chat.prompt("go").await.unwrap();
    assert_stopped_by_budget(&r);
    assert_eq!(model.calls(), 2, "{r:?}");
    host.shutdown().await;
}

/// A worker that calls `echo` for ever, 600 tokens a call.
const WORKER: &str = "name: worker\nmodel: scripted\ntools: [echo]\nlimits: { max_iterations: 1000, repeat_limit: 10000 }\nscript:\n  - { tool: echo, args: { text: w }, usage: { input: 500, output: 100 }, forever: true }\n";

#[tokio::test(start_paused = true)]
async fn a_sub_agent_spends_its_parents_run_budget() {
    let scratch = support::scratch::Scratch::new("budget-child");
    let worker = scratch.0.join("worker.yaml");
    std::fs::write(&worker, WORKER).unwrap();
    // The parent may spend 1 000 tokens, its sub-agent's included; the
    // child has no budget of its own.
    let parent = format!(
        "name: lead\nmodel: scripted\nagents:\n  worker: {}\nbudget: {{ tokens: 1000 }}\nscript:\n  - {{ tool: agent__worker, args: {{ prompt: work }}, usage: {{ input: 90, output: 10 }} }}\n  - {{ text: done, usage: {{ input: 90, output: 10 }} }}\n",
        worker.display()
    );
    let path = scratch.0.join("lead.yaml");
    std::fs::write(&path, &parent).unwrap();
    let spec = agentvisor::AgentSpec::from_file(&path).unwrap();
    let (host, store) = support::host().await;
    let root = host
        .submit(spec, Invocation::prompt("go"))
        .await
        .unwrap()
        .await;
    host.shutdown().await;

    use agentvisor::ports::audit::{RunFilter, RunIndex};
    let runs = store.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(runs.len(), 2, "the lead and its worker");
    let mut total = 0;
    for s in runs {
        let r = store.run_result(s.run_id).await.unwrap().unwrap();
        total += r.usage.total();
        if &*r.agent == "worker" {
            // 100 (lead) + 600 + 600 passes 1 000: the child stops there.
            assert_stopped_by_budget(&r);
            assert_eq!(r.usage.total(), 1200, "{r:?}");
        }
    }
    // The lead cannot go on either: its run budget is spent.
    assert_eq!(root.status, RunStatus::BudgetExceeded, "{root:?}");
    assert_eq!(total, 1300, "the tree passed its budget by one reply");
}
