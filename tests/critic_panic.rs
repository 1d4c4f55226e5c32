//! A panicking model: when `complete` panics on its first poll, the run
//! actor itself panics and its critic (its supervisor) finalizes it as
//! `error`/`panic` with the panic text; when it panics after an await (in
//! the call's task), the run ends the same way. Either way: one terminal
//! audit record, the records before the panic kept, and the host goes on
//! running other runs.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::AuditEntry;
use agentvisor::ports::budget::BudgetLimits;
use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError};
use agentvisor::stores::MemoryBudgetLedger;
use agentvisor::{Host, Invocation, RunStatus};
use async_trait::async_trait;

/// Panics after waiting a little (so the call is already a task).
struct LateBoom;

#[async_trait]
impl ChatModel for LateBoom {
    fn name(&self) -> &str {
        "late"
    }

    async fn complete(&self, _request: ChatRequest) -> Result<ChatResponse, ModelError> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        panic!("late boom after {} ms", 100);
    }
}

const OK: &str = "name: fine\ntools: [add]\nscript:\n  - { tool: add, args: { a: 1, b: 1 } }\n  - { text: two }\n";

async fn panicky_host() -> (Host, Arc<agentvisor::stores::MemoryAuditStore>) {
    support::host_from(
        support::builder()
            .model(
                "boom",
                Arc::new(support::PanickingModel("boom: the model exploded")),
            )
            .model("late", Arc::new(LateBoom)),
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn a_model_that_panics_at_once_makes_the_run_end_error_panic() {
    let (host, store) = panicky_host().await;
    let spec = support::spec("name: b\nmodel: boom\n");
    let (handle, events) = host
        .submit_streaming(spec, Invocation::prompt("x"))
        .await
        .unwrap();
    let run_id = handle.run_id();
    let events = tokio::time::timeout(Duration::from_secs(5), support::collect(events))
        .await
        .expect("the stream of a panicked run ends");
    let r = tokio::time::timeout(Duration::from_secs(5), handle)
        .await
        .expect("a panicked run still delivers its result");
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("panic"));
    assert_eq!(r.kill_reason, None);
    let error = r.error.clone().unwrap_or_default();
    assert!(error.contains("boom: the model exploded"), "{error}");
    assert_eq!(r.iterations, 1);
    assert_eq!(support::kinds(&events), ["step.start", "error", "run.end"]);
    assert_eq!(host.live_runs(), 0);

    // The terminal record is on file (the result is delivered only after it
    // was written), exactly once, and last; the records the run made before
    // it panicked are kept.
    let records = support::records(&store, run_id).await;
    assert_eq!(support::terminal_count(&records), 1);
    assert!(
        matches!(records[0].entry, AuditEntry::RunStarted(_)),
        "{records:?}"
    );
    assert_eq!(
        support::kinds(&support::audited_events(&records)),
        ["step.start"]
    );
    match &records.last().expect("records").entry {
        AuditEntry::Terminal(t) => {
            assert_eq!(t.status, RunStatus::Error);
            assert_eq!(t.error_kind.as_deref(), Some("panic"));
            assert_eq!(t.error, r.error);
        }
        other => panic!("the terminal record comes last: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_model_that_panics_after_an_await_ends_the_run_error_panic() {
    let (host, store) = panicky_host().await;
    let spec = support::spec("name: l\nmodel: late\n");
    let handle = host.submit(spec, Invocation::prompt("x")).await.unwrap();
    let run_id = handle.run_id();
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("panic"));
    let error = r.error.clone().unwrap_or_default();
    assert!(error.contains("late boom after 100 ms"), "{error}");
    let records = support::records(&store, run_id).await;
    assert_eq!(support::terminal_count(&records), 1);
}

#[tokio::test(start_paused = true)]
async fn the_host_keeps_running_other_runs_around_panics() {
    let (host, _store) = panicky_host().await;
    let boom = support::spec("name: b\nmodel: boom\n");
    let late = support::spec("name: l\nmodel: late\n");
    let ok = support::spec(OK);
    let mut handles = Vec::new();
    for i in 0..30 {
        let spec = match i % 3 {
            0 => &boom,
            1 => &late,
            _ => &ok,
        };
        handles.push(host.submit(spec, Invocation::prompt("x")).await.unwrap());
    }
    for (i, h) in handles.into_iter().enumerate() {
        let r = h.await;
        if i % 3 == 2 {
            assert_eq!(r.status, RunStatus::Ok, "{r:?}");
            assert_eq!(r.output.as_deref(), Some("two"));
        } else {
            assert_eq!(r.error_kind.as_deref(), Some("panic"), "{r:?}");
        }
    }
    // And afterwards, on the same critic shards.
    for _ in 0..4 {
        let r = host.execute(&ok, Invocation::prompt("x")).await.unwrap();
        assert_eq!(r.status, RunStatus::Ok);
    }
    let stats = host.shutdown().await;
    assert_eq!(stats.terminal_records, 34);
}

#[tokio::test(start_paused = true)]
async fn a_panicked_run_gives_back_its_callers_concurrency_slot() {
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "carol",
        BudgetLimits {
            concurrent_runs: Some(1),
            ..Default::default()
        },
    );
    let (host, _store) = support::host_from(
        support::builder()
            .model(
                "boom",
                Arc::new(support::PanickingModel("boom: the model exploded")),
            )
            .budget_ledger(ledger),
    )
    .await;
    let r = host
        .execute(
            support::spec("name: b\nmodel: boom\n"),
            Invocation::prompt("x").caller("carol"),
        )
        .await
        .unwrap();
    assert_eq!(r.error_kind.as_deref(), Some("panic"));
    let r = host
        .execute(support::spec(OK), Invocation::prompt("x").caller("carol"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
}
