//! Runs hosted on a critic shard: what a run without a task of its own
//! still guarantees. A caller's heartbeats reach its critic and keep a
//! hung call from stalling until they stop; a panic in one run's handler
//! ends that run alone while the other runs of the same shard go on; the
//! shared result is the very one the audit log holds.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::AuditEntry;
use agentvisor::{HostConfig, Invocation, KillReason, RunStatus};

const HUNG: &str = "name: hung\nprompt: wait\nlimits: { max_runtime: 1h, stall_timeout: 10s }\nscript:\n  - { hang: true }\n";

#[tokio::test(start_paused = true)]
async fn a_callers_heartbeats_keep_a_hung_call_from_stalling_until_they_stop() {
    let (host, _) = support::host().await;
    let handle = host
        .submit(support::spec(HUNG), Invocation::default())
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    // A heartbeat every 4 s for 40 s: four stall timeouts pass, none fires.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(4)).await;
        handle.heartbeat();
    }
    let live = handle.live().unwrap();
    assert!(!live.finished, "a run that beats is not stalled: {live:?}");
    assert_eq!(live.iteration, 1);

    // Silence: the stall timeout after the last beat kills it.
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Killed);
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(50) && took < Duration::from_secs(52),
        "killed {took:?} after the start: the last beat (40 s) + the stall timeout (10 s)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_run_leaves_the_other_runs_of_its_shard_running() {
    // One shard hosts all three runs.
    let (host, store) = support::host_from(
        support::builder()
            .config(HostConfig {
                critic_shards: 1,
                ..HostConfig::default()
            })
            .model("boom", Arc::new(support::PanickingModel("boom in one run"))),
    )
    .await;
    let slow = "name: slow\ntools: [add]\nscript:\n  - { tool: add, args: { a: 1, b: 2 }, latency: 2s }\n  - { text: three, latency: 2s }\n";
    let before = host
        .submit(support::spec(slow), Invocation::prompt("x"))
        .await
        .unwrap();
    let boom = host
        .submit(
            support::spec("name: b\nmodel: boom\n"),
            Invocation::prompt("x"),
        )
        .await
        .unwrap();
    let after = host
        .submit(support::spec(slow), Invocation::prompt("y"))
        .await
        .unwrap();

    let b = boom.await;
    assert_eq!(b.status, RunStatus::Error);
    assert_eq!(b.error_kind.as_deref(), Some("panic"));
    assert!(b.error.unwrap_or_default().contains("boom in one run"));
    for handle in [before, after] {
        let run_id = handle.run_id();
        let r = handle.await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        assert_eq!(r.output.as_deref(), Some("three"));
        let records = support::records(&store, run_id).await;
        assert_eq!(support::terminal_count(&records), 1);
    }
    assert_eq!(host.live_runs(), 0);
}

#[tokio::test]
async fn the_shared_result_is_the_one_on_record() {
    let (host, store) = support::host().await;
    let spec = support::spec(
        "name: two\ntools: [add]\nscript:\n  - { tool: add, args: { a: 2, b: 3 } }\n  - { text: five }\n",
    );
    let handle = host.submit(spec, Invocation::prompt("x")).await.unwrap();
    let run_id = handle.run_id();
    let shared = handle.shared().await;
    assert_eq!(shared.status, RunStatus::Ok);
    assert_eq!(shared.output.as_deref(), Some("five"));
    assert_eq!(shared.steps.len(), 1);
    let records = support::records(&store, run_id).await;
    let on_record = records
        .iter()
        .find_map(|r| match &r.entry {
            AuditEntry::Terminal(t) => Some(t.clone()),
            _ => None,
        })
        .expect("a terminal record");
    assert!(
        Arc::ptr_eq(&shared, &on_record),
        "the caller shares the recorded result rather than a copy"
    );
}
