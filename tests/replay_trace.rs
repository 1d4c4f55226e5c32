//! Replay (P3): a recorded run re-run against its recorded model responses
//! and tool results gives the same trace; a record that was tampered with
//! does not.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;

use agentvisor::ports::audit::{AuditEntry, AuditStore};
use agentvisor::ports::run::RunStatus;
use agentvisor::replay::{replay, TraceItem};
use agentvisor::tools::ToolRegistry;
use agentvisor::Invocation;

const MANIFEST: &str = r#"
name: replayed
system: You add.
tools: [add, upper, fail]
script:
  - { tools: [{ tool: add, args: { a: 2, b: 3 } }, { tool: upper, args: { text: x } }] }
  - { tool: add, args: { a: "two" } }
  - { tool: upper, args: { text: y } }
  - { tool: nope, args: {} }
  - { tool: fail, args: { reason: boom } }
  - { text: "final: 5 X" }
"#;

async fn recorded_run() -> (
    Vec<agentvisor::ports::audit::AuditRecord>,
    agentvisor::RunResult,
) {
    let (host, store) = support::host().await;
    let spec = support::spec(MANIFEST);
    let result = host
        .submit(spec, Invocation::prompt("go"))
        .await
        .unwrap()
        .await;
    host.shutdown().await;
    let records = store.run_records(result.run_id).await.unwrap();
    (records, result)
}

#[tokio::test(start_paused = true)]
async fn a_recorded_run_replays_to_the_same_trace() {
    let (records, result) = recorded_run().await;
    assert_eq!(result.status, RunStatus::Ok);
    let report = replay(&records, &ToolRegistry::with_builtins().with_test_tools())
        .await
        .unwrap();
    assert!(report.same, "{:#?}", report);
    // The trace is not trivial: 6 steps, 6 tool results (3 refused or failed), the end.
    let steps = report
        .recorded
        .iter()
        .filter(|t| matches!(t, TraceItem::Step { .. }))
        .count();
    let refused = report
        .recorded
        .iter()
        .filter(|t| matches!(t, TraceItem::ToolResult { ok: false, .. }))
        .count();
    assert_eq!((steps, refused), (6, 3));
    assert!(matches!(
        report.recorded.last(),
        Some(TraceItem::End {
            status: RunStatus::Ok,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_tampered_record_does_not_replay_the_same() {
    let (mut records, _) = recorded_run().await;
    for r in &mut records {
        if let AuditEntry::Terminal(res) = &mut r.entry {
            let mut changed = (**res).clone();
            changed.output = Some("something else".into());
            *res = Arc::new(changed);
        }
    }
    let report = replay(&records, &ToolRegistry::with_builtins().with_test_tools())
        .await
        .unwrap();
    assert!(!report.same);
    assert_eq!(report.first_difference, Some(report.recorded.len() - 1));
}

#[tokio::test(start_paused = true)]
async fn a_run_without_a_terminal_record_is_refused() {
    let (records, _) = recorded_run().await;
    let partial: Vec<_> = records.into_iter().filter(|r| !r.is_terminal()).collect();
    assert!(
        replay(&partial, &ToolRegistry::with_builtins().with_test_tools())
            .await
            .is_err()
    );
}

/// A tool call's arguments past what any tool accepts (here 600 kB) are kept
/// capped in the records — head, tail, a marker with the full size — and
/// the run still replays the same: its call refused for its size again.
#[tokio::test(start_paused = true)]
async fn oversized_arguments_are_recorded_capped_and_replay_the_same() {
    let big = "w".repeat(600_000);
    let manifest = format!(
        "name: big\nsystem: s\ntools: [upper]\nscript:\n  - {{ tool: upper, args: {{ text: \"{big}\" }} }}\n  - {{ text: done }}\n"
    );
    let (host, store) = support::host().await;
    let result = host
        .submit(support::spec(&manifest), Invocation::prompt("go"))
        .await
        .unwrap()
        .await;
    host.shutdown().await;
    assert_eq!(result.status, RunStatus::Ok);
    let records = store.run_records(result.run_id).await.unwrap();
    let args: Vec<String> = records
        .iter()
        .filter_map(|r| match &r.entry {
            AuditEntry::Event(agentvisor::ports::event::RunEvent::StepFinish { calls, .. }) => {
                Some(
                    calls
                        .iter()
                        .map(|c| c.arguments.to_string())
                        .collect::<Vec<_>>(),
                )
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(args.len(), 1);
    let full = format!("{{\"text\":\"{big}\"}}").len();
    assert!(args[0].len() <= 4096, "stored {} bytes", args[0].len());
    assert!(
        args[0].contains(&format!("bytes cut of {full}]")),
        "{}",
        &args[0][..100]
    );
    assert!(args[0].starts_with("{\"text\":\"www"));
    // Every record together stays small (the manifest, which holds the
    // script and so the 600 kB, is kept once per manifest, not a run: it
    // is named here by its id alone).
    let total: usize = records
        .iter()
        .cloned()
        .map(|mut r| {
            if let AuditEntry::RunStarted(info) = &mut r.entry {
                let m = info.manifest.as_mut().expect("the run names its manifest");
                assert!(m.json.as_ref().unwrap().text().len() > 600_000);
                m.json = None;
            }
            serde_json::to_string(&r).unwrap().len()
        })
        .sum();
    assert!(total < 32 * 1024, "records take {total} bytes");
    let report = replay(&records, &ToolRegistry::with_builtins().with_test_tools())
        .await
        .unwrap();
    assert!(report.same, "{:#?}", report.first_difference);
    assert!(report.recorded.iter().any(|t| matches!(
        t,
        TraceItem::ToolResult { ok: false, result, .. } if result.contains(&format!("arguments are {full} bytes"))
    )));
}
