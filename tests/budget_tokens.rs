//! Caller token budgets from the ledger (`MemoryBudgetLedger::set_limits`):
//! a run that crosses its caller's limit mid-flight ends
//! `budget_exceeded`/`budget` before its next model call; the caller's next
//! run is refused before any model call; other callers are untouched; spend
//! reaches the ledger by shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::budget::{BudgetLedger, BudgetLimits};
use agentvisor::stores::MemoryBudgetLedger;
use agentvisor::{AgentSpec, Host, Invocation, KillReason, RunStatus};
use support::{RecordingModel, SPENDER};

fn limit(tokens: u64) -> BudgetLimits {
    BudgetLimits {
        tokens: Some(tokens),
        ..Default::default()
    }
}

async fn budget_host(ledger: Arc<MemoryBudgetLedger>) -> (Host, AgentSpec, Arc<RecordingModel>) {
    budget_host_for(ledger, support::spec(SPENDER)).await
}

async fn budget_host_for(
    ledger: Arc<MemoryBudgetLedger>,
    spec: AgentSpec,
) -> (Host, AgentSpec, Arc<RecordingModel>) {
    let model = RecordingModel::new(&spec);
    let (host, _store) = support::host_from(
        support::builder()
            .model("recorded", model.clone())
            .budget_ledger(ledger),
    )
    .await;
    (host, spec, model)
}

#[tokio::test(start_paused = true)]
async fn a_run_that_crosses_its_budget_ends_before_its_next_model_call() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits("alice", limit(1000));
    let (host, spec, model) = budget_host(ledger.clone()).await;

    let r = host
        .execute(&spec, Invocation::prompt("x").caller("alice"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Budget));
    assert_eq!(r.error_kind.as_deref(), Some("budget"));
    // 600 after call 1 (under), 1200 after call 2 (over): no call 3.
    assert_eq!(r.iterations, 2);
    assert_eq!(model.calls(), 2);
    assert_eq!(r.usage.total(), 1200);
    assert_eq!(
        r.steps.len(),
        1,
        "the reply that passed the budget ends the run: its tool calls do not run"
    );
    assert_eq!(r.caller_id.as_deref(), Some("alice"));

    // The next run of the same caller is refused before any model call.
    let again = host
        .execute(&spec, Invocation::prompt("x").caller("alice"))
        .await
        .unwrap();
    assert_eq!(again.status, RunStatus::BudgetExceeded, "{again:?}");
    assert_eq!(again.error_kind.as_deref(), Some("budget"));
    assert_eq!(again.iterations, 0);
    assert!(again.steps.is_empty());
    assert_eq!(model.calls(), 2, "no model call for a refused run");

    // Another caller has its own account.
    let bob = host
        .execute(&spec, Invocation::prompt("x").caller("bob"))
        .await
        .unwrap();
    assert_eq!(bob.status, RunStatus::Ok, "{bob:?}");
    assert_eq!(bob.usage.total(), 2400);

    // Spend reaches the ledger by shutdown.
    host.shutdown().await;
    let window = Duration::from_secs(3600);
    let alice = ledger.spent("alice", window).await.unwrap();
    assert_eq!(alice.tokens, 1200);
    assert_eq!(alice.runs, 1, "the refused run spent nothing");
    assert_eq!(ledger.spent("bob", window).await.unwrap().tokens, 2400);
}

#[tokio::test(start_paused = true)]
async fn a_run_under_its_budget_finishes() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits("dave", limit(10_000));
    let (host, spec, _model) = budget_host(ledger).await;
    let r = host
        .execute(&spec, Invocation::prompt("x").caller("dave"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok);
    assert_eq!(r.usage.total(), 2400);
}

#[tokio::test(start_paused = true)]
async fn a_budget_is_shared_by_the_callers_concurrent_runs() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits("erin", limit(3000));
    let mut slow = support::spec(SPENDER);
    for e in &mut slow.script {
        e.latency = Some(Duration::from_millis(100));
    }
    let (host, slow, model) = budget_host_for(ledger, slow).await;
    let a = host
        .submit(&slow, Invocation::prompt("x").caller("erin"))
        .await
        .unwrap();
    let b = host
        .submit(&slow, Invocation::prompt("x").caller("erin"))
        .await
        .unwrap();
    let (a, b) = (a.await, b.await);
    // Together they stay within 3000 tokens: each call reserves what the
    // run's previous one used (600) and starts only while spent + reserved
    // is under the shared limit, so the sixth call (3600) never starts.
    assert_eq!(a.status, RunStatus::BudgetExceeded);
    assert_eq!(b.status, RunStatus::BudgetExceeded);
    assert_eq!(a.usage.total() + b.usage.total(), 3000);
    assert_eq!(model.calls(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_caller_at_its_concurrency_cap_is_rejected() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "frank",
        BudgetLimits {
            concurrent_runs: Some(1),
            ..Default::default()
        },
    );
    let (host, _store) = support::host_from(support::builder().budget_ledger(ledger)).await;
    let hangs =
        support::spec("name: h\nlimits: { stall_timeout: 1h }\nscript:\n  - { hang: true }\n");
    let first = host
        .submit(&hangs, Invocation::prompt("x").caller("frank"))
        .await
        .unwrap();
    let second = host
        .execute(&hangs, Invocation::prompt("x").caller("frank"))
        .await
        .unwrap();
    assert_eq!(second.status, RunStatus::Rejected);
    assert_eq!(second.error_kind.as_deref(), Some("caller_concurrency"));
    first.cancel();
    assert_eq!(first.await.status, RunStatus::Cancelled);
    let ok = support::spec("name: o\nscript:\n  - { text: hi }\n");
    let third = host
        .execute(&ok, Invocation::prompt("x").caller("frank"))
        .await
        .unwrap();
    assert_eq!(third.status, RunStatus::Ok, "the slot came back");
}
