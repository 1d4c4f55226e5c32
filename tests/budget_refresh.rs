//! Budgets that refresh and hold: a caller refused at its limit is admitted
//! again once its spend has left the window; reloading limits leaks no
//! concurrency slot (accounts refresh in place, tickets of runs in flight
//! release into the same account); cost and run-time limits end a run
//! `budget_exceeded`/`budget` before its next model call, like tokens.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::budget::BudgetLimits;
use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError};
use agentvisor::providers::scripted::ScriptedModel;
use agentvisor::stores::MemoryBudgetLedger;
use agentvisor::{Host, HostConfig, Invocation, KillReason, RunStatus};
use async_trait::async_trait;

const WINDOW: Duration = Duration::from_secs(600);
const REFRESH: Duration = Duration::from_secs(60);

async fn host_with(
    ledger: Arc<MemoryBudgetLedger>,
    extra: Option<(&str, Arc<dyn ChatModel>)>,
) -> Host {
    let mut b = Host::builder()
        .config(HostConfig {
            critic_shards: 2,
            budget_window: WINDOW,
            budget_refresh_every: REFRESH,
            ..HostConfig::default()
        })
        .budget_ledger(ledger);
    if let Some((name, model)) = extra {
        b = b.model(name, model);
    }
    b.build().await.unwrap()
}

const SPENDER: &str = "name: s\ntools: [echo]\nscript:\n  - { tool: echo, args: { text: a }, usage: { input: 500, output: 100 } }\n  - { tool: echo, args: { text: b }, usage: { input: 500, output: 100 } }\n  - { text: done, usage: { input: 500, output: 100 } }\n";
const SMALL: &str = "name: small\nscript:\n  - { text: hi, usage: { input: 5, output: 5 } }\n";

#[tokio::test(start_paused = true)]
async fn a_caller_refused_at_its_limit_is_admitted_again_once_the_window_moves() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "ann",
        BudgetLimits {
            tokens: Some(1000),
            ..Default::default()
        },
    );
    let host = host_with(ledger.clone(), None).await;
    let (spender, small) = (support::spec(SPENDER), support::spec(SMALL));

    let r = host
        .execute(&spender, Invocation::prompt("x").caller("ann"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.usage.total(), 1200);
    // Within the window, after refreshes: still refused.
    tokio::time::sleep(WINDOW / 2).await;
    let r = host
        .execute(&small, Invocation::prompt("x").caller("ann"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.iterations, 0);
    // The spend has left the window (plus a minute bucket and a refresh).
    tokio::time::sleep(WINDOW / 2 + Duration::from_secs(60) + REFRESH).await;
    let r = host
        .execute(&small, Invocation::prompt("x").caller("ann"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn reloading_limits_leaks_no_concurrency_slot() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let one = BudgetLimits {
        concurrent_runs: Some(1),
        ..Default::default()
    };
    ledger.set_limits("bo", one);
    let host = host_with(ledger.clone(), None).await;
    let hang = support::spec("name: h\nlimits: { stall_timeout: 1h, max_runtime: 2h, hard_timeout: 3h }\nscript: [{ hang: true }]\n");
    let small = support::spec(SMALL);
    let inv = || Invocation::prompt("x").caller("bo");

    let first = host.submit(&hang, inv()).await.unwrap();
    // The account goes stale and is reloaded while the run holds its slot.
    tokio::time::sleep(3 * REFRESH).await;
    host.reload_budgets().await;
    let r = host.execute(&small, inv()).await.unwrap();
    assert_eq!(r.error_kind.as_deref(), Some("caller_concurrency"), "{r:?}");
    // Raised to 2 and reloaded: a second run fits beside the first.
    ledger.set_limits(
        "bo",
        BudgetLimits {
            concurrent_runs: Some(2),
            ..Default::default()
        },
    );
    host.reload_budgets().await;
    let r = host.execute(&small, inv()).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    // Back to 1: the hanging run still holds the only slot.
    ledger.set_limits("bo", one);
    host.reload_budgets().await;
    let r = host.execute(&small, inv()).await.unwrap();
    assert_eq!(r.error_kind.as_deref(), Some("caller_concurrency"), "{r:?}");
    // Its ticket releases into the reloaded account: the slot comes back.
    first.cancel();
    assert_eq!(first.await.status, RunStatus::Cancelled);
    for _ in 0..3 {
        host.reload_budgets().await;
        let r = host.execute(&small, inv()).await.unwrap();
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    }
    host.shutdown().await;
}

/// The scripted model, priced as `gpt-4o`.
struct Priced(ScriptedModel);

#[async_trait]
impl ChatModel for Priced {
    fn name(&self) -> &str {
        "priced"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        self.0.complete(request).await
    }

    fn price_id(&self) -> Option<&str> {
        Some("gpt-4o")
    }
}

#[tokio::test(start_paused = true)]
async fn a_cost_limit_ends_the_run_before_its_next_model_call() {
    let mut spec = support::spec(SPENDER);
    spec.model = "priced".into();
    let model: Arc<dyn ChatModel> = Arc::new(Priced(ScriptedModel::new(spec.script.clone())));
    // One call (500 in, 100 out) costs 2250 µ$ at gpt-4o's price.
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "cy",
        BudgetLimits {
            cost_micros: Some(3000),
            ..Default::default()
        },
    );
    let host = host_with(ledger.clone(), Some(("priced", model))).await;
    let r = host
        .execute(&spec, Invocation::prompt("x").caller("cy"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Budget));
    assert!(r.error.as_deref().unwrap_or("").contains("cost"), "{r:?}");
    assert_eq!(r.iterations, 2, "under after call 1, over after call 2");
    assert_eq!(r.cost_micros, 4500, "{r:?}");
    let again = host
        .execute(&spec, Invocation::prompt("x").caller("cy"))
        .await
        .unwrap();
    assert_eq!(again.status, RunStatus::BudgetExceeded);
    assert_eq!(again.iterations, 0);
    host.shutdown().await;
    let spent = agentvisor::ports::budget::BudgetLedger::spent(&*ledger, "cy", WINDOW)
        .await
        .unwrap();
    assert_eq!(spent.cost_micros, 4500);
}

#[tokio::test(start_paused = true)]
async fn a_runtime_limit_ends_the_run_before_its_next_model_call() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "di",
        BudgetLimits {
            runtime_secs: Some(2),
            ..Default::default()
        },
    );
    let host = host_with(ledger.clone(), None).await;
    let slow = support::spec("name: slow\ntools: [echo]\nscript:\n  - { tool: echo, args: { text: a }, latency: 1s, forever: true }\n");
    let r = host
        .execute(&slow, Invocation::prompt("x").caller("di"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Budget));
    assert!(
        r.error.as_deref().unwrap_or("").contains("run-time"),
        "{r:?}"
    );
    // Calls start at 0 s and 1 s; at 2 s the caller's 2 s are spent.
    assert_eq!(r.iterations, 2, "{r:?}");
    let again = host
        .execute(&slow, Invocation::prompt("x").caller("di"))
        .await
        .unwrap();
    assert_eq!(again.status, RunStatus::BudgetExceeded);
    assert_eq!(again.iterations, 0);
    host.shutdown().await;
    let spent = agentvisor::ports::budget::BudgetLedger::spent(&*ledger, "di", WINDOW)
        .await
        .unwrap();
    assert_eq!(spent.runtime_ms, 2000);
}
