//! Replay reports no false mismatch: a run replays to the same trace
//! whatever its ending (one test per ending the kernel can produce), and a
//! recording whose step or tool result was changed does not.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::{AuditEntry, AuditRecord, AuditStore};
use agentvisor::ports::budget::BudgetLimits;
use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, ToolCallRequest};
use agentvisor::replay::{replay, ReplayReport};
use agentvisor::stores::{MemoryAuditStore, MemoryBudgetLedger};
use agentvisor::tools::ToolRegistry;
use agentvisor::{HostBuilder, HostConfig, Invocation, KillReason, RunEvent, RunResult, RunStatus};
use async_trait::async_trait;

/// Answers one `add` call, then fails with `error` on every later call.
struct FailingModel {
    error: ModelError,
    calls: AtomicU32,
}

#[async_trait]
impl ChatModel for FailingModel {
    fn name(&self) -> &str {
        "failing"
    }

    async fn complete(&self, _request: ChatRequest) -> Result<ChatResponse, ModelError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Ok(ChatResponse {
                text: "adding".into(),
                tool_calls: vec![ToolCallRequest {
                    id: "call_0".into(),
                    name: "add".into(),
                    arguments: r#"{"a": 1, "b": 2}"#.into(),
                }],
                usage: Default::default(),
                finish_reason: None,
            });
        }
        Err(self.error.clone())
    }
}

async fn records_of(store: &MemoryAuditStore, r: &RunResult) -> Vec<AuditRecord> {
    store.run_records(r.run_id).await.unwrap()
}

async fn replayed(records: &[AuditRecord]) -> ReplayReport {
    replay(records, &ToolRegistry::with_builtins().with_test_tools())
        .await
        .unwrap()
}

/// Runs `yaml` on a host made from `b`, checks the ending, replays it and
/// expects the same trace.
async fn run_and_replay(
    b: HostBuilder,
    yaml: &str,
    inv: Invocation,
    status: RunStatus,
    kind: Option<&str>,
) -> Vec<AuditRecord> {
    let (host, store) = support::host_from(b).await;
    let r = host.execute(support::spec(yaml), inv).await.unwrap();
    host.shutdown().await;
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.error_kind.as_deref(), kind, "{r:?}");
    let records = records_of(&store, &r).await;
    let report = replayed(&records).await;
    assert!(report.same, "{report:#?}");
    records
}

/// [`run_and_replay`] of `yaml` on a test host, prompted with `x`.
async fn replays_equal(yaml: &str, status: RunStatus, kind: Option<&str>) {
    run_and_replay(
        support::builder(),
        yaml,
        Invocation::prompt("x"),
        status,
        kind,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn ok_replays_equal() {
    let yaml = "name: e\ntools: [add]\nscript:\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { text: '3' }\n";
    replays_equal(yaml, RunStatus::Ok, None).await;
}

#[tokio::test(start_paused = true)]
async fn max_iterations_replays_equal() {
    let yaml = "name: e\ntools: [add]\nlimits: { max_iterations: 3, repeat_limit: 100 }\nscript:\n  - { tool: add, args: { a: 1, b: 2 }, forever: true }\n";
    replays_equal(yaml, RunStatus::Error, Some("max_iterations")).await;
}

#[tokio::test(start_paused = true)]
async fn tool_errors_replay_equal() {
    let yaml = "name: e\ntools: [fail]\nlimits: { max_tool_errors: 2 }\nscript:\n  - { tool: fail, args: { reason: a } }\n  - { tool: fail, args: { reason: b } }\n  - { text: never }\n";
    replays_equal(yaml, RunStatus::Error, Some("tool_errors")).await;
}

#[tokio::test(start_paused = true)]
async fn tool_timeouts_and_panics_replay_equal() {
    let yaml = "name: e\ntools: [sleep, panic]\nlimits: { tool_timeout: 1s, max_tool_errors: 5 }\nscript:\n  - { tools: [{ tool: sleep, args: { ms: 5000 } }, { tool: panic, args: { message: boom } }] }\n  - { text: done }\n";
    replays_equal(yaml, RunStatus::Ok, None).await;
}

#[tokio::test(start_paused = true)]
async fn an_output_schema_repair_turn_replays_equal() {
    let yaml = "name: e\noutput_schema: { type: object, required: [sum] }\nscript:\n  - { text: '{\"total\": 3}' }\n  - { text: \"```json\\n{\\\"sum\\\": 3}\\n```\" }\n";
    replays_equal(yaml, RunStatus::Ok, None).await;
}

#[tokio::test(start_paused = true)]
async fn invalid_output_replays_equal() {
    let yaml = "name: e\noutput_schema: { type: object, required: [sum] }\nscript:\n  - { text: 'not json' }\n  - { text: '{\"total\": 3}' }\n";
    replays_equal(yaml, RunStatus::Error, Some("invalid_output")).await;
}

#[tokio::test(start_paused = true)]
async fn provider_errors_replay_equal() {
    let errors = [
        ModelError::RateLimited {
            retry_after: Some(Duration::from_secs(1)),
        },
        ModelError::Server {
            status: 503,
            message: "overloaded".into(),
        },
        ModelError::Transport("connection reset".into()),
        ModelError::BadRequest("too long".into()),
        ModelError::Malformed("not json".into()),
        ModelError::Quota("out of credit".into()),
        ModelError::Auth,
    ];
    for error in errors {
        let kind = error.kind();
        let model = Arc::new(FailingModel {
            error,
            calls: AtomicU32::new(0),
        });
        let b = support::builder().model("failing", model);
        let yaml = "name: e\nmodel: failing\ntools: [add]\n";
        run_and_replay(
            b,
            yaml,
            Invocation::prompt("x"),
            RunStatus::Error,
            Some(kind),
        )
        .await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_replays_equal() {
    let yaml = "name: e\ntools: [add]\nlimits: { max_runtime: 1s, hard_timeout: 2s, max_extensions: 0, stall_timeout: 1h }\nscript:\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { hang: true }\n";
    replays_equal(yaml, RunStatus::Timeout, Some("deadline")).await;
}

#[tokio::test(start_paused = true)]
async fn a_stall_replays_equal() {
    let yaml = "name: e\ntools: [add]\nlimits: { stall_timeout: 1s }\nscript:\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { hang: true }\n";
    replays_equal(yaml, RunStatus::Killed, Some("stalled")).await;
}

#[tokio::test(start_paused = true)]
async fn a_runaway_replays_equal() {
    let yaml = "name: e\ntools: [add]\nlimits: { repeat_limit: 2 }\nscript:\n  - { tool: add, args: { a: 1, b: 2 }, forever: true }\n";
    replays_equal(yaml, RunStatus::Killed, Some("runaway")).await;
}

#[tokio::test(start_paused = true)]
async fn a_model_panic_replays_equal() {
    let b = support::builder().model("panicky", Arc::new(support::PanickingModel("on purpose")));
    run_and_replay(
        b,
        "name: e\nmodel: panicky\n",
        Invocation::prompt("x"),
        RunStatus::Error,
        Some("panic"),
    )
    .await;
}

/// Runs a hanging run, ends it from outside with `end`, replays it.
async fn ended_from_outside(end: impl FnOnce(&agentvisor::RunHandle)) -> (RunResult, ReplayReport) {
    let yaml = "name: e\ntools: [add]\nlimits: { stall_timeout: 1h }\nscript:\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { hang: true }\n";
    let (host, store) = support::host().await;
    let mut handle = host
        .submit(support::spec(yaml), Invocation::prompt("x"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    end(&handle);
    let r = (&mut handle).await;
    host.shutdown().await;
    let report = replayed(&records_of(&store, &r).await).await;
    (r, report)
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_replays_equal() {
    let (r, report) = ended_from_outside(|h| h.cancel()).await;
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(r.steps.len(), 1);
    assert!(report.same, "{report:#?}");
}

#[tokio::test(start_paused = true)]
async fn an_operator_kill_replays_equal() {
    let (r, report) = ended_from_outside(|h| h.kill()).await;
    assert_eq!(r.status, RunStatus::Killed);
    assert_eq!(r.kill_reason, Some(KillReason::Operator));
    assert!(report.same, "{report:#?}");
}

fn budget_builder(tokens: u64) -> HostBuilder {
    let ledger = MemoryBudgetLedger::with_default_limits(BudgetLimits {
        tokens: Some(tokens),
        ..Default::default()
    });
    support::builder().budget_ledger(Arc::new(ledger))
}

#[tokio::test(start_paused = true)]
async fn a_budget_kill_replays_equal() {
    let yaml = "name: e\ntools: [add]\nscript:\n  - { tool: add, args: { a: 1, b: 2 }, usage: { input: 600, output: 100 } }\n  - { tool: add, args: { a: 2, b: 2 }, usage: { input: 600, output: 100 } }\n  - { text: done }\n";
    let records = run_and_replay(
        budget_builder(1000),
        yaml,
        Invocation::prompt("x"),
        RunStatus::BudgetExceeded,
        Some("budget"),
    )
    .await;
    assert!(records
        .iter()
        .any(|r| matches!(r.entry, AuditEntry::RunStarted(_))));
}

#[tokio::test(start_paused = true)]
async fn refusals_at_admission_replay_equal() {
    // Over budget before it starts.
    let (host, store) = support::host_from(budget_builder(0)).await;
    let r = host
        .execute(
            support::spec("name: e\nscript: [{ text: hi }]\n"),
            Invocation::prompt("x"),
        )
        .await
        .unwrap();
    host.shutdown().await;
    assert_eq!(r.status, RunStatus::BudgetExceeded);
    let report = replayed(&records_of(&store, &r).await).await;
    assert!(report.same && report.recorded.len() == 1, "{report:#?}");

    // Rejected: the host is at its run cap.
    let b = support::builder().config(HostConfig {
        critic_shards: 1,
        max_concurrent_runs: Some(1),
        ..HostConfig::default()
    });
    let (host, store) = support::host_from(b).await;
    let hang = support::spec("name: h\nlimits: { stall_timeout: 1h }\nscript: [{ hang: true }]\n");
    let first = host.submit(&hang, Invocation::prompt("x")).await.unwrap();
    let r = host.execute(&hang, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Rejected, "{r:?}");
    first.cancel();
    host.shutdown().await;
    let report = replayed(&records_of(&store, &r).await).await;
    assert!(report.same, "{report:#?}");
}

async fn tampered(change: impl Fn(&mut RunEvent)) -> ReplayReport {
    let yaml = "name: e\ntools: [add, upper]\nscript:\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { tool: upper, args: { text: x } }\n  - { text: done }\n";
    let (host, store) = support::host().await;
    let r = host
        .execute(support::spec(yaml), Invocation::prompt("x"))
        .await
        .unwrap();
    host.shutdown().await;
    let mut records = records_of(&store, &r).await;
    for rec in &mut records {
        if let AuditEntry::Event(e) = &mut rec.entry {
            change(e);
        }
    }
    replayed(&records).await
}

#[tokio::test(start_paused = true)]
async fn a_tampered_tool_result_is_reported() {
    let report = tampered(|e| {
        if let RunEvent::ToolResult { result, tool, .. } = e {
            if &**tool == "add" {
                *result = "4".into();
            }
        }
    })
    .await;
    assert!(!report.same, "{report:#?}");
}

#[tokio::test(start_paused = true)]
async fn a_tampered_step_is_reported() {
    let report = tampered(|e| {
        if let RunEvent::StepFinish { calls, .. } = e {
            for c in calls.iter_mut() {
                if &*c.name == "upper" {
                    c.arguments = r#"{"text":"y"}"#.into();
                }
            }
        }
    })
    .await;
    assert!(!report.same, "{report:#?}");
}
