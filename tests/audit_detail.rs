#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Audit detail (P1): `audit: summary` keeps a run's start, its result,
//! critic decisions, errors and warnings, not its step events; `full` (the
//! default) keeps everything; a manifest's key wins over the host's. The
//! live stream is the same at both; the SQLite store reads a summary back
//! as written.

mod support;

use std::sync::Arc;

use agentvisor::ports::audit::{AuditDetail, AuditEntry, AuditRecord, AuditStore};
use agentvisor::stores::{MemoryAuditStore, SqliteStore};
use agentvisor::{Host, HostConfig, Invocation, RunEvent, RunStatus};
use support::scratch::Scratch;

const MANIFEST: &str = r#"
name: detailed
system: s
tools: [add, fail]
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { tool: fail, args: { reason: boom } }
  - { text: "5" }
"#;

fn kinds(records: &[AuditRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| match &r.entry {
            AuditEntry::RunStarted(_) => "run.start".to_string(),
            AuditEntry::Event(e) => e.kind().to_string(),
            AuditEntry::Terminal(_) => "run.end".to_string(),
            AuditEntry::Publish(_) => "publish".to_string(),
        })
        .collect()
}

async fn run_with(
    host_detail: AuditDetail,
    manifest: &str,
    store: Arc<dyn AuditStore>,
) -> (agentvisor::RunResult, Vec<AuditRecord>, Vec<String>) {
    let host = Host::builder()
        .test_tools()
        .audit_store(store.clone())
        .config(HostConfig {
            audit: host_detail,
            ..HostConfig::default()
        })
        .build()
        .await
        .unwrap();
    let handle = host
        .submit_streaming(support::spec(manifest), Invocation::prompt("go"))
        .await
        .unwrap();
    let (handle, mut events) = handle;
    let mut live = Vec::new();
    while let Some(e) = events.next().await {
        live.push(e.event.kind().to_string());
    }
    let result = handle.await;
    host.shutdown().await;
    let records = store.run_records(result.run_id).await.unwrap();
    (result, records, live)
}

#[tokio::test(start_paused = true)]
async fn summary_keeps_the_start_the_result_and_the_errors_only() {
    let mem = Arc::new(MemoryAuditStore::new());
    let (result, records, live) = run_with(AuditDetail::Summary, MANIFEST, mem).await;
    assert_eq!(result.status, RunStatus::Ok);
    assert_eq!(kinds(&records), ["run.start", "tool.result", "run.end"]);
    assert!(matches!(
        &records[1].entry,
        AuditEntry::Event(RunEvent::ToolResult { ok: false, .. })
    ));
    // The result keeps its step summaries; the live stream had everything.
    let AuditEntry::Terminal(end) = &records[2].entry else {
        panic!("no terminal record")
    };
    assert_eq!(end.steps.len(), 2);
    assert!(live.iter().any(|k| k == "step.finish"));
    assert!(live.iter().any(|k| k == "tool.call"));
}

#[tokio::test(start_paused = true)]
async fn full_is_the_default_and_a_manifest_key_wins_over_the_host() {
    let mem = Arc::new(MemoryAuditStore::new());
    let (_, full, live) = run_with(AuditDetail::Full, MANIFEST, mem.clone()).await;
    assert!(kinds(&full).iter().any(|k| k == "step.finish"));
    // Deltas are the stream's alone (never recorded).
    for kind in live.iter().filter(|k| *k != "text.delta") {
        assert!(kinds(&full).contains(kind), "{kind} not recorded");
    }
    assert_eq!(HostConfig::default().audit, AuditDetail::Full);
    // The manifest says `full` on a `summary` host, and the other way.
    let manifest = format!("audit: full\n{MANIFEST}");
    let (_, kept, _) = run_with(AuditDetail::Summary, &manifest, mem.clone()).await;
    assert_eq!(kinds(&kept), kinds(&full));
    let manifest = format!("audit: summary\n{MANIFEST}");
    let (_, summary, _) = run_with(AuditDetail::Full, &manifest, mem).await;
    assert_eq!(summary.len(), 3);
}

#[tokio::test]
async fn a_summary_reads_back_from_sqlite_as_written() {
    let dir = Scratch::new("summary");
    let sqlite = Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap());
    let mem = Arc::new(MemoryAuditStore::new());
    let (result, from_mem, _) = run_with(AuditDetail::Summary, MANIFEST, mem).await;
    sqlite.append(&from_mem).await.unwrap();
    assert_eq!(sqlite.run_records(result.run_id).await.unwrap(), from_mem);
}

#[test]
fn a_bad_audit_value_exits_2_naming_the_flag() {
    for cmd in [
        &["swarm", "examples/agents/hello.yaml", "--runs", "1"][..],
        &["run", "examples/agents/hello.yaml"],
        &["soak", "examples/agents/hello.yaml"],
        &["serve"],
    ] {
        let mut args = cmd.to_vec();
        args.extend(["--audit", "some", "--db", ":memory:"]);
        let out = support::cli::agentvisor(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--audit"), "{args:?}: {stderr}");
    }
}
