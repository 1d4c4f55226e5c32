//! A persistent token limit holds under concurrency: admission reserves the
//! first call's tokens and every later call reserves what the run's
//! previous call used, so a caller's concurrent runs pass the limit by less
//! than one model reply in all (when the estimates hold). Before
//! reservations, 200 runs at concurrency 100 of a 1000-token-a-call agent
//! spent about 108 000 tokens against a 10 000-token limit.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::budget::{BudgetLedger, BudgetLimits};
use agentvisor::stores::MemoryBudgetLedger;
use agentvisor::{Invocation, RunStatus};

const LIMIT: u64 = 10_000;
const REPLY: u64 = 1000;

#[tokio::test(start_paused = true)]
async fn concurrent_runs_of_one_caller_pass_its_limit_by_less_than_one_reply() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "swarm",
        BudgetLimits {
            tokens: Some(LIMIT),
            ..Default::default()
        },
    );
    let (host, _store) = support::host_from(support::builder().budget_ledger(ledger.clone())).await;
    // Every call uses 1000 tokens, after a short wait (so many are in flight at once).
    let spec = Arc::new(support::spec(
        "name: k\ntools: [echo]\nscript:\n  - { tool: echo, args: { text: a }, usage: { input: 900, output: 100 }, latency: 10ms }\n  - { tool: echo, args: { text: b }, usage: { input: 900, output: 100 }, latency: 10ms }\n  - { text: done, usage: { input: 900, output: 100 }, latency: 10ms }\n",
    ));
    let next = Arc::new(AtomicU64::new(0));
    let used = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..100 {
        let (host, spec, next, used) = (host.clone(), spec.clone(), next.clone(), used.clone());
        workers.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < 200 {
                let r = host
                    .execute(spec.clone(), Invocation::prompt("x").caller("swarm"))
                    .await
                    .unwrap();
                used.fetch_add(r.usage.total(), Ordering::Relaxed);
                statuses.push(r.status);
            }
            statuses
        }));
    }
    let mut ok = 0;
    for w in workers {
        for s in w.await.unwrap() {
            assert!(
                matches!(s, RunStatus::Ok | RunStatus::BudgetExceeded),
                "{s:?}"
            );
            ok += usize::from(s == RunStatus::Ok);
        }
    }
    host.shutdown().await;
    let spent = ledger
        .spent("swarm", Duration::from_secs(3600))
        .await
        .unwrap()
        .tokens;
    assert_eq!(
        spent,
        used.load(Ordering::Relaxed),
        "the ledger has every token"
    );
    // The guarantee: under the limit plus one reply (each reservation was
    // exactly the call's use, 1000 tokens).
    assert!(
        spent < LIMIT + REPLY,
        "spent {spent} against a limit of {LIMIT}"
    );
    assert!(
        spent >= LIMIT - REPLY,
        "the budget was used, not refused early: {spent}"
    );
    assert!(ok <= 3, "at most three 3000-token runs fit: {ok}");
}
