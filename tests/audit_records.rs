//! The audit log: every event of a run is recorded, in order, between its
//! `run_started` and its terminal record; every run has exactly one
//! terminal record whatever its ending (killed and panicked runs too); a
//! result is on record before it is delivered; and `shutdown` drains every
//! buffer, so a crowd of concurrent runs leaves one terminal record each.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::AuditEntry;
use agentvisor::{HostConfig, Invocation, RunEvent, RunId, RunStatus};

const HELLO: &str = r#"
name: hello
tools: [add, upper]
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { tool: upper, args: { text: done } }
  - { text: "2+3=5, DONE" }
"#;

#[tokio::test(start_paused = true)]
async fn every_event_of_a_run_is_recorded_in_order() {
    let (host, store) = support::host().await;
    // Tool calls, a critic decision (an extension at the soft timeout), a
    // steer from the caller, and an answer.
    let spec = support::spec(
        r#"
name: busy
tools: [sleep, add]
limits: { max_runtime: 1s, stall_timeout: 1h }
script:
  - { tool: sleep, args: { ms: 1500 } }
  - tools:
      - { tool: add, args: { a: 1, b: 2 } }
      - { tool: nope }
  - { text: "finished" }
"#,
    );
    let (handle, events) = host
        .submit_streaming(spec, Invocation::prompt("work"))
        .await
        .unwrap();
    let run_id = handle.run_id();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    handle.steer("hurry");
    let events = support::collect(events).await;
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.critic.len(), 1, "{:?}", r.critic);

    let records = support::records(&store, run_id).await;
    let seqs: Vec<u32> = records.iter().map(|r| r.seq).collect();
    let expected: Vec<u32> = (0..records.len() as u32).collect();
    assert_eq!(seqs, expected, "seq numbers are contiguous from 0");
    assert!(records.iter().all(|rec| rec.run_id == run_id));
    assert!(
        matches!(&records[0].entry, AuditEntry::RunStarted(i) if &*i.agent == "busy" && i.prompt == "work")
    );
    assert!(records.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    match &records.last().expect("records").entry {
        AuditEntry::Terminal(t) => assert_eq!(**t, r, "the terminal record is the result"),
        other => panic!("the terminal record comes last, got {other:?}"),
    }

    // Every event the caller saw is on record, in the same order (streamed
    // text deltas are not recorded; the result holds the text). The stream
    // ends with `run.end`, the terminal record (checked above).
    assert!(matches!(
        events.last(),
        Some(RunEvent::RunEnd {
            status: RunStatus::Ok,
            ..
        })
    ));
    let streamed: Vec<RunEvent> = events
        .into_iter()
        .filter(|e| !matches!(e, RunEvent::TextDelta { .. } | RunEvent::RunEnd { .. }))
        .collect();
    let audited = support::audited_events(&records);
    assert_eq!(audited, streamed);
    let kinds = support::kinds(&audited);
    for k in [
        "step.start",
        "tool.call",
        "tool.result",
        "step.finish",
        "critic.extend",
        "message.create",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_result_is_on_record_before_it_is_delivered() {
    // Batches may wait an hour to fill; with the writer idle, a run's
    // records are handed over at once (group commit): the clock, paused,
    // would have to jump the hour for the timer to cut the batch.
    let config = HostConfig {
        audit_max_age: Duration::from_secs(3600),
        ..HostConfig::default()
    };
    let (host, store) = support::host_from(support::builder().config(config)).await;
    let t0 = tokio::time::Instant::now();
    for _ in 0..5 {
        let handle = host
            .submit(support::spec(HELLO), Invocation::prompt("x"))
            .await
            .unwrap();
        let run_id = handle.run_id();
        let r = handle.await;
        // No shutdown, no wait: the terminal record is already written.
        let records = support::records(&store, run_id).await;
        assert_eq!(support::terminal_count(&records), 1);
        assert!(matches!(&records.last().unwrap().entry, AuditEntry::Terminal(t) if **t == r));
    }
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "the results waited {:?} for the batch age",
        t0.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn exactly_one_terminal_record_per_run_whatever_its_ending() {
    let (host, store) = support::host_from(support::builder().model(
        "boom",
        Arc::new(support::PanickingModel("boom in the audit test")),
    ))
    .await;
    let cases: [(&str, RunStatus, Option<&str>); 8] = [
        (HELLO, RunStatus::Ok, None),
        (
            "name: te\ntools: [fail]\nscript:\n  - { tool: fail, args: {reason: a} }\n  - { tool: fail, args: {reason: b} }\n  - { tool: fail, args: {reason: c} }\n",
            RunStatus::Error,
            Some("tool_errors"),
        ),
        (
            "name: mi\ntools: [sleep]\nlimits: { max_iterations: 2 }\nscript:\n  - { tool: sleep, args: {ms: 1} }\n  - { tool: sleep, args: {ms: 2} }\n  - { text: never }\n",
            RunStatus::Error,
            Some("max_iterations"),
        ),
        (
            "name: st\nlimits: { stall_timeout: 1s }\nscript:\n  - { hang: true }\n",
            RunStatus::Killed,
            Some("stalled"),
        ),
        (
            "name: ru\ntools: [echo]\nscript:\n  - { tool: echo, args: {text: x}, forever: true }\n",
            RunStatus::Killed,
            Some("runaway"),
        ),
        (
            "name: dl\nlimits: { max_runtime: 1s, stall_timeout: 1h }\nscript:\n  - { hang: true }\n",
            RunStatus::Timeout,
            Some("deadline"),
        ),
        ("name: bo\nmodel: boom\n", RunStatus::Error, Some("panic")),
        (
            "name: pe\nscript:\n  - { fail: rate_limited }\n",
            RunStatus::Error,
            Some("rate_limited"),
        ),
    ];
    let mut runs: Vec<(RunId, RunStatus, Option<String>)> = Vec::new();
    for (yaml, status, kind) in cases {
        let r = host
            .execute(support::spec(yaml), Invocation::prompt("x"))
            .await
            .unwrap();
        assert_eq!(
            (r.status, r.error_kind.as_deref()),
            (status, kind),
            "{yaml}"
        );
        runs.push((r.run_id, r.status, r.error_kind));
    }
    // Operator kill and caller cancel.
    for kill in [true, false] {
        let h = host
            .submit(
                support::spec(
                    "name: op\nlimits: { stall_timeout: 1h }\nscript:\n  - { hang: true }\n",
                ),
                Invocation::prompt("x"),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        if kill {
            h.kill();
        } else {
            h.cancel();
        }
        let r = h.await;
        runs.push((r.run_id, r.status, r.error_kind));
    }
    let stats = host.shutdown().await;
    assert_eq!(stats.terminal_records, runs.len() as u64);
    for (run_id, status, kind) in runs {
        let records = support::records(&store, run_id).await;
        assert_eq!(support::terminal_count(&records), 1, "{status:?} {kind:?}");
        match &records.last().unwrap().entry {
            AuditEntry::Terminal(t) => {
                assert_eq!((t.status, &t.error_kind), (status, &kind));
            }
            other => panic!("terminal record last: {other:?}"),
        }
        let seqs: Vec<u32> = records.iter().map(|r| r.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn two_hundred_concurrent_runs_leave_one_terminal_record_each() {
    let (host, store) = support::host_from(support::builder().model(
        "boom",
        Arc::new(support::PanickingModel("boom in the audit test")),
    ))
    .await;
    let specs = [
        support::spec(HELLO),
        support::spec(
            "name: slow\ntools: [sleep]\nscript:\n  - { tool: sleep, args: {ms: 300} }\n  - { text: ok }\n",
        ),
        support::spec("name: st\nlimits: { stall_timeout: 1s }\nscript:\n  - { hang: true }\n"),
        support::spec("name: bo\nmodel: boom\n"),
        // Still running at shutdown: cancelled by it, and recorded.
        support::spec("name: forever\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { hang: true }\n"),
    ];
    let mut handles = Vec::new();
    let mut detached = Vec::new();
    for i in 0..200 {
        let spec = &specs[i % specs.len()];
        let h = host.submit(spec, Invocation::prompt("x")).await.unwrap();
        if i % specs.len() == 4 {
            detached.push(h.run_id());
            h.detach();
        } else {
            handles.push(h);
        }
    }
    let mut by_status: HashMap<RunStatus, usize> = HashMap::new();
    let mut ids: Vec<RunId> = detached.clone();
    for h in handles {
        let r = h.await;
        ids.push(r.run_id);
        *by_status.entry(r.status).or_default() += 1;
    }
    assert_eq!(by_status.get(&RunStatus::Ok), Some(&80));
    assert_eq!(by_status.get(&RunStatus::Killed), Some(&40));
    assert_eq!(by_status.get(&RunStatus::Error), Some(&40));
    assert_eq!(host.live_runs(), 40, "the detached runs still go on");

    let stats = host.shutdown().await;
    assert_eq!(stats.terminal_records, 200, "{stats:?}");
    assert_eq!(stats.records, store.records().len() as u64);
    assert_eq!(host.live_runs(), 0);
    for id in ids {
        let records = support::records(&store, id).await;
        assert_eq!(support::terminal_count(&records), 1);
        assert!(matches!(records[0].entry, AuditEntry::RunStarted(_)));
    }
    for id in detached {
        let records = support::records(&store, id).await;
        match &records.last().unwrap().entry {
            AuditEntry::Terminal(t) => {
                assert_eq!(t.status, RunStatus::Cancelled);
                assert_eq!(t.error_kind.as_deref(), Some("shutdown"));
            }
            other => panic!("{other:?}"),
        }
    }
}
