//! The budget tree (B2): sub-agents spend out of their root caller's
//! account, reserve-and-settle, so eight children racing for the last
//! tokens of the root's limit pass it by less than one model call's reply.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::{AuditEntry, AuditStore, RunFilter, RunIndex};
use agentvisor::ports::budget::{BudgetLedger, BudgetLimits};
use agentvisor::stores::{MemoryAuditStore, MemoryBudgetLedger};
use agentvisor::{AgentSpec, HostConfig, Invocation, KillReason, RunResult, RunStatus};

/// Every model call of the tree uses this many tokens (90 in, 10 out).
const REPLY: u64 = 100;

/// A worker that calls `echo` for ever, each call `latency` long: it stops
/// only when its caller's budget does.
fn worker(d: &Path, file: &str, latency: &str) -> PathBuf {
    let p = d.join(file);
    std::fs::write(
        &p,
        format!(
            "name: {}\ntools: [echo]\nlimits: {{ max_iterations: 100000, max_runtime: 1h, stall_timeout: 1h }}\ncritic: {{ loops: off }}\nscript:\n  - {{ tool: echo, args: {{ text: w }}, usage: {{ input: 90, output: 10 }}, latency: {latency}, forever: true }}\n",
            file.trim_end_matches(".yaml")
        ),
    )
    .unwrap();
    p
}

/// A root that starts eight workers in one step (four of each latency),
/// then answers.
fn root(d: &Path, fast: &Path, slow: &Path) -> AgentSpec {
    let calls: Vec<String> = (0..8)
        .map(|i| {
            let which = if i % 2 == 0 { "fast" } else { "slow" };
            format!("      - {{ tool: agent__{which}, args: {{ prompt: \"part {i}\" }} }}\n")
        })
        .collect();
    let p = d.join("root.yaml");
    std::fs::write(
        &p,
        format!(
            "name: root\ntools: [echo]\nagents:\n  fast: {}\n  slow: {}\nlimits: {{ max_runtime: 1h, stall_timeout: 1h, tool_timeout: 1h }}\nscript:\n  - usage: {{ input: 90, output: 10 }}\n    tools:\n{}  - {{ text: done, usage: {{ input: 90, output: 10 }} }}\n",
            fast.display(),
            slow.display(),
            calls.concat()
        ),
    )
    .unwrap();
    AgentSpec::from_file(&p).unwrap()
}

/// Builds a host whose caller `tree` may spend `limit` tokens, runs the
/// tree, and returns the root's result, every run's result and the spend
/// on the ledger.
async fn race(limit: u64, name: &str) -> (RunResult, Vec<RunResult>, u64) {
    let scratch = support::scratch::Scratch::new(&format!("budget-tree-{name}"));
    let d = scratch.0.clone();
    let spec = root(
        &d,
        &worker(&d, "fast.yaml", "7ms"),
        &worker(&d, "slow.yaml", "11ms"),
    );
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "tree",
        BudgetLimits {
            tokens: Some(limit),
            ..Default::default()
        },
    );
    let store = Arc::new(MemoryAuditStore::new());
    let host = agentvisor::Host::builder()
        .config(HostConfig {
            critic_shards: 2,
            // The first call's reservation is what a call uses: the
            // estimates hold, so the bound is one reply.
            budget_reserve_tokens: REPLY,
            ..HostConfig::default()
        })
        .budget_ledger(ledger.clone())
        .audit_store(store.clone())
        .build()
        .await
        .unwrap();
    let r = host
        .execute(spec, Invocation::prompt("go").caller("tree"))
        .await
        .unwrap();
    host.shutdown().await;
    let spent = ledger
        .spent("tree", Duration::from_secs(3600))
        .await
        .unwrap()
        .tokens;
    let all = store.list_runs(&RunFilter::default()).await.unwrap();
    let mut results = Vec::new();
    for s in all {
        results.push(store.run_result(s.run_id).await.unwrap().unwrap());
    }
    // Every run has exactly one terminal record.
    for res in &results {
        let records = store.run_records(res.run_id).await.unwrap();
        let ends = records
            .iter()
            .filter(|x| matches!(x.entry, AuditEntry::Terminal(_)))
            .count();
        assert_eq!(ends, 1, "{}", res.agent);
    }
    (r, results, spent)
}

fn check(limit: u64, root: &RunResult, all: &[RunResult], spent: u64) {
    assert_eq!(all.len(), 9, "the root and its eight children");
    let used: u64 = all.iter().map(|r| r.usage.total()).sum();
    assert_eq!(spent, used, "the ledger has every token of the tree");
    // The guarantee.
    assert!(
        spent < limit + REPLY,
        "the tree spent {spent} against a limit of {limit}"
    );
    // The budget was raced for and used up, not refused early.
    assert!(spent >= limit, "spent {spent} of {limit}");
    // The root's answer call found the budget spent.
    assert_eq!(root.status, RunStatus::BudgetExceeded, "{root:?}");
    assert_eq!(root.kill_reason, Some(KillReason::Budget));
    let children: Vec<&RunResult> = all.iter().filter(|r| r.agent != "root").collect();
    assert_eq!(children.len(), 8);
    for c in &children {
        assert_eq!(c.parent_run_id, Some(root.run_id));
        // Each child stopped on the budget: at admission, or before a call.
        assert_eq!(c.status, RunStatus::BudgetExceeded, "{c:?}");
    }
    // They raced: more than one child got calls in.
    let working = children.iter().filter(|c| c.usage.total() > 0).count();
    assert!(working >= 2, "only {working} children spent anything");
    // The parent read every child's failure as a tool result.
    assert_eq!(root.steps.len(), 8);
    assert!(root.steps.iter().all(|s| !s.ok));
}

#[tokio::test(start_paused = true)]
async fn eight_children_racing_for_the_last_tokens_pass_the_roots_limit_by_less_than_a_reply() {
    // 5_050: the race for the last 50 tokens is won by calls that will
    // each use 100, at most one of them past the limit.
    for limit in [5_000, 5_050, 5_099] {
        let (root, all, spent) = race(limit, &format!("paused-{limit}")).await;
        check(limit, &root, &all, spent);
    }
}

/// The same race on four worker threads: reservations and settlements of
/// the eight children interleave for real on the account's atomics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bound_holds_when_the_children_run_on_many_threads() {
    for round in 0..4u64 {
        let limit = 20_000 + round * 37;
        let (root, all, spent) = race(limit, &format!("threads-{round}")).await;
        check(limit, &root, &all, spent);
    }
}
