//! Runs reachable by id: `Host::run`, `Host::runs`, `RunRef`, and event
//! subscribers (late, several, slow) that see every record once, in order,
//! each with its `seq`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::time::Duration;

use agentvisor::{Event, Invocation, KillReason, RunEvent, RunStatus};
use support::HangingTool;

/// Three tool turns, each waiting 1 s on tokio's clock, then an answer.
const SLOW: &str = "name: slow\ntools: [sleep, add]\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { tool: sleep, args: { ms: 1000 } }\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { tool: sleep, args: { ms: 1000 } }\n  - { tool: sleep, args: { ms: 1000 } }\n  - { text: done }\n";

const WAITS: &str = "name: waits\ntools: [wait]\nlimits: { stall_timeout: 1h, max_runtime: 1h, tool_timeout: 1h }\nscript:\n  - { tool: wait }\n  - { text: never }\n";

/// Every event of a stream but the streamed text deltas (live only: they
/// are not records, and the `step.finish` after them holds their text).
async fn drain(mut events: agentvisor::RunEvents) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(e) = events.next().await {
        if !matches!(e.event, RunEvent::TextDelta { .. }) {
            out.push(e);
        }
    }
    out
}

/// The seqs of the record events of a stream (deltas and the terminal
/// pair's shared seq aside), which must rise one by one with no repeat.
fn assert_in_order(events: &[Event]) {
    let mut last: Option<u32> = None;
    for e in events {
        if matches!(
            e.event,
            RunEvent::TextDelta { .. } | RunEvent::RunEnd { .. }
        ) {
            continue;
        }
        if let Some(l) = last {
            assert!(e.seq > l, "seq {} after {l}: {events:#?}", e.seq);
        }
        last = Some(e.seq);
    }
    assert!(
        matches!(
            events.last().map(|e| &e.event),
            Some(RunEvent::RunEnd { .. })
        ),
        "the stream ends with run.end"
    );
}

#[tokio::test(start_paused = true)]
async fn a_detached_run_is_reachable_by_id_until_it_ends() {
    let (host, _store) = support::host().await;
    let handle = host
        .submit(support::spec(SLOW), Invocation::prompt("x").caller("carol"))
        .await
        .unwrap();
    let id = handle.run_id();
    handle.detach();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let r = host.run(&id).expect("a live run is reachable by id");
    assert_eq!(r.run_id(), id);
    assert_eq!(r.agent(), "slow");
    assert_eq!(r.caller_id(), Some("carol"));
    let listed = host.runs();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].run_id, id);
    assert_eq!(listed[0].agent, "slow");
    assert_eq!(listed[0].caller_id.as_deref(), Some("carol"));
    assert_eq!(listed[0].iteration, 1);

    // Two references, two tasks: both see the same result.
    let other = r.clone();
    let waiter = tokio::spawn(async move { other.result().await });
    let result = r.result().await;
    assert_eq!(result.status, RunStatus::Ok);
    assert_eq!(result.output.as_deref(), Some("done"));
    assert_eq!(waiter.await.unwrap(), result);
    assert!(host.run(&id).is_none(), "an ended run leaves the registry");
    assert!(host.runs().is_empty());
    assert!(host.run(&agentvisor::RunId(7)).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_reference_steers_extends_and_kills_with_its_reason() {
    let wait = HangingTool::new();
    let (host, _store) = support::host_from(support::builder().tool(wait.clone())).await;
    let handle = host
        .submit(support::spec(WAITS), Invocation::prompt("x"))
        .await
        .unwrap();
    let id = handle.run_id();
    handle.detach();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = host.run(&id).unwrap();
    r.extend(Duration::from_secs(30));
    r.kill(KillReason::Policy);
    let result = r.result().await;
    assert_eq!(result.status, RunStatus::Killed);
    assert_eq!(result.kill_reason, Some(KillReason::Policy));
    let actions: Vec<_> = result.critic.iter().map(|d| d.action).collect();
    assert_eq!(
        actions,
        [
            agentvisor::CriticAction::Extend,
            agentvisor::CriticAction::Kill
        ]
    );
    assert!(r.is_finished());
    assert!(r.live().finished);
    // The tool call got the signal and cleaned up at once.
    assert_eq!(wait.dropped(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_late_subscriber_gets_the_past_from_the_store_then_the_live_events() {
    let (host, _store) = support::host().await;
    let (handle, early) = host
        .submit_streaming(support::spec(SLOW), Invocation::prompt("x"))
        .await
        .unwrap();
    let early = tokio::spawn(drain(early));
    // Join half way: two tool turns done.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = handle.run_ref().subscribe();
    let late = tokio::spawn(drain(late));
    // And one that resumes from a seq it had seen up to.
    let resumed = tokio::spawn(drain(handle.run_ref().subscribe_from(5)));
    let result = handle.await;
    assert_eq!(result.status, RunStatus::Ok);

    let early = early.await.unwrap();
    let late = late.await.unwrap();
    let resumed = resumed.await.unwrap();
    assert_in_order(&early);
    assert_in_order(&late);
    // The late subscriber saw exactly what the early one saw.
    assert!(
        late == early,
        "the late subscriber saw what the early one saw"
    );
    assert!(early.iter().all(|e| e.run_id == result.run_id));
    // Resuming from seq 5 gives the same events from 5 on.
    let from5: Vec<Event> = early.iter().filter(|e| e.seq >= 5).cloned().collect();
    assert!(
        resumed == from5,
        "resuming from seq 5 gives the events from 5 on"
    );
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_of_an_ended_run_gets_its_whole_record() {
    let (host, _store) = support::host().await;
    let (handle, live) = host
        .submit_streaming(support::spec(SLOW), Invocation::prompt("x"))
        .await
        .unwrap();
    let r = handle.run_ref();
    let live = drain(live).await;
    let result = handle.await;
    assert_eq!(result.status, RunStatus::Ok);
    let after = drain(r.subscribe()).await;
    assert!(
        after == live,
        "the record read back is the stream seen live"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_subscriber_is_told_it_lagged_and_catches_up_without_gaps() {
    // Each turn is a tool call that answers at once: the run emits its
    // events faster than a subscriber with a 2-event buffer reads them.
    let mut yaml = String::from("name: chatty\ntools: [add]\nlimits: { max_iterations: 40, repeat_limit: 100, stall_timeout: 1h, max_runtime: 1h }\nscript:\n");
    for i in 0..20 {
        yaml.push_str(&format!(
            "  - {{ tool: add, args: {{ a: {i}, b: 1 }}, latency: 10ms }}\n"
        ));
    }
    yaml.push_str("  - { text: done }\n");
    let (host, _store) = support::host().await;
    let (handle, fast) = host
        .submit_streaming(support::spec(&yaml), Invocation::prompt("x"))
        .await
        .unwrap();
    let mut slow = handle.run_ref().subscribe_with_buffer(0, 2);
    let fast = tokio::spawn(drain(fast));
    let result = handle.await;
    assert_eq!(result.status, RunStatus::Ok);
    // The slow one reads only now: it lagged, and says so.
    let mut seen = Vec::new();
    let mut lagged = 0;
    while let Some(e) = slow.next().await {
        if matches!(e.event, RunEvent::TextDelta { .. }) {
            continue;
        }
        if let RunEvent::Lagged { resume_from } = e.event {
            lagged += 1;
            assert_eq!(resume_from, e.seq);
            continue;
        }
        seen.push(e);
    }
    assert!(lagged >= 1, "the slow subscriber was told it lagged");
    let fast = fast.await.unwrap();
    assert_in_order(&fast);
    assert_in_order(&seen);
    assert!(seen == fast, "after catching up it has every event once");
}

#[tokio::test(start_paused = true)]
async fn events_carry_their_records_seq() {
    let (host, store) = support::host().await;
    let (handle, events) = host
        .submit_streaming(support::spec(SLOW), Invocation::prompt("x"))
        .await
        .unwrap();
    let id = handle.run_id();
    let events = drain(events).await;
    handle.await;
    host.shutdown().await;
    let records = support::records(&store, id).await;
    for e in &events {
        let rec = records
            .iter()
            .find(|r| r.seq == e.seq)
            .expect("every event's seq is a record's");
        match (&rec.entry, &e.event) {
            (agentvisor::ports::audit::AuditEntry::Event(ev), got) => assert_eq!(ev, got),
            (agentvisor::ports::audit::AuditEntry::Terminal(_), RunEvent::RunEnd { .. }) => {}
            (other, got) => panic!("seq {} is {other:?} but the event is {got:?}", e.seq),
        }
    }
    // On the wire the seq sits beside the event's own fields.
    let v = serde_json::to_value(&events[0]).unwrap();
    assert_eq!(v["type"], "step.start");
    assert_eq!(v["seq"], events[0].seq);
    assert_eq!(v["run_id"], id.to_string());
    let back: Event = serde_json::from_value(v).unwrap();
    assert_eq!(back, events[0]);
}
