//! A critic shard is never frozen and never lost: blocking calls run off
//! the shard, slow handlers are reported, whatever a policy answers the
//! hard deadline ends a run, a failed shard's runs end `shard_failed` and a
//! fresh shard takes its place, shutdown has a deadline, and a killed
//! run's tool calls get `kill_grace`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::critic::{RunView, Verdict};
use agentvisor::ports::model::ToolSpec;
use agentvisor::ports::tool::{Tool, ToolContext, ToolError};
use agentvisor::{
    CriticAction, CriticPolicy, Decision, Fault, HostConfig, Invocation, KillReason, RunEvent,
    RunResult, RunStatus, Trigger,
};
use async_trait::async_trait;
use serde_json::{json, Value};
use support::HangingTool;

/// A tool that blocks its thread (synchronous work done wrong).
struct Blocking {
    spec: ToolSpec,
    block: Duration,
    /// Claims to answer at once (then it is polled on the shard).
    in_place: bool,
}

impl Blocking {
    fn new(name: &str, block: Duration, in_place: bool) -> Arc<Self> {
        Arc::new(Blocking {
            spec: ToolSpec {
                name: name.into(),
                description: "Blocks its thread.".into(),
                parameters: json!({"type": "object"}),
            },
            block,
            in_place,
        })
    }
}

#[async_trait]
impl Tool for Blocking {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        std::thread::sleep(self.block);
        Ok("blocked".into())
    }

    fn answers_at_once(&self) -> bool {
        self.in_place
    }
}

// Real time: the point is a thread that really blocks. Every wait below is
// on a run's result; the test takes about 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tool_that_blocks_its_thread_does_not_freeze_its_shard() {
    let (host, _store) = support::host_from(
        support::builder()
            .config(HostConfig {
                critic_shards: 1,
                ..HostConfig::default()
            })
            .tool(Blocking::new("block", Duration::from_secs(2), false)),
    )
    .await;
    // 100 runs on the same shard that beat every 100 ms for 1 s.
    let mut beating = Vec::new();
    for _ in 0..100 {
        beating.push(
            host.submit(
                support::spec("name: beats\ntools: [sleep]\nlimits: { stall_timeout: 500ms, max_runtime: 1h }\ncritic: { loops: off }\nscript:\n  - { tool: sleep, args: { ms: 100 }, repeat: 10 }\n  - { text: done }\n"),
                Invocation::prompt("x"),
            )
            .await
            .unwrap(),
        );
    }
    // And one that hangs: killed `stalled` 300 ms after it starts.
    let t0 = std::time::Instant::now();
    let hangs = host
        .submit(
            support::spec("name: hangs\nlimits: { stall_timeout: 300ms, max_runtime: 1h }\nscript:\n  - { hang: true }\n"),
            Invocation::prompt("x"),
        )
        .await
        .unwrap();
    // Once they run, a run whose tool blocks its thread for 2 s.
    while hangs.live().is_some_and(|l| l.iteration == 0) {
        tokio::task::yield_now().await;
    }
    let blocker = host
        .submit(
            support::spec("name: blocker\ntools: [block]\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { tool: block }\n  - { text: done }\n"),
            Invocation::prompt("x"),
        )
        .await
        .unwrap();
    let r = hangs.await;
    let took = t0.elapsed();
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    assert!(
        took < Duration::from_millis(1500),
        "killed after {took:?}: the shard waited for the blocked tool"
    );
    for h in beating {
        let r = h.await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    }
    assert_eq!(blocker.await.status, RunStatus::Ok);
    host.shutdown().await;
}

// Real time: the tool really blocks its thread 80 ms in its first poll.
#[tokio::test]
async fn a_call_that_holds_the_shard_is_reported() {
    let (host, _store) = support::host_from(support::builder().tool(Blocking::new(
        "hog",
        Duration::from_millis(80),
        true,
    )))
    .await;
    let (handle, events) = host
        .submit_streaming(
            support::spec(
                "name: hog\ntools: [hog]\nscript:\n  - { tool: hog }\n  - { text: done }\n",
            ),
            Invocation::prompt("x"),
        )
        .await
        .unwrap();
    let events = support::collect(events).await;
    assert_eq!(handle.await.status, RunStatus::Ok);
    let warned = events.iter().any(|e| {
        matches!(e, RunEvent::Warning { kind, message } if kind == "slow_handler" && message.contains("`hog`"))
    });
    assert!(warned, "{events:?}");
}

/// A policy that answers the same thing to everything.
struct Always(Decision);

impl CriticPolicy for Always {
    fn decide(&self, _t: Trigger, _v: &RunView) -> Verdict {
        Verdict::Now(self.0.clone())
    }
}

/// A policy that never answers.
struct Never(Arc<AtomicUsize>);

impl CriticPolicy for Never {
    fn decide(&self, _t: Trigger, _v: &RunView) -> Verdict {
        self.0.fetch_add(1, Ordering::SeqCst);
        Verdict::Later(Box::pin(std::future::pending()))
    }
}

const HANGS: &str = "name: hangs\nlimits: { stall_timeout: 1s, max_runtime: 5s, max_extensions: 2, extension: 10s }\nscript:\n  - { hang: true }\n";

async fn ends_at_the_deadline(
    policy: Arc<dyn CriticPolicy>,
    latest: Duration,
) -> (RunResult, Duration) {
    let (host, _store) = support::host_from(support::builder().critic_policy(policy)).await;
    let t0 = tokio::time::Instant::now();
    let r = host
        .execute(support::spec(HANGS), Invocation::prompt("x"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Timeout, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    let elapsed = t0.elapsed();
    assert!(elapsed <= latest, "{elapsed:?}");
    // The shard still works.
    let ok = host
        .execute(support::spec(support::HELLO), Invocation::prompt("x"))
        .await
        .unwrap();
    assert_eq!(ok.status, RunStatus::Ok);
    (r, elapsed)
}

#[tokio::test(start_paused = true)]
async fn a_policy_that_always_continues_cannot_keep_a_run_past_its_deadline() {
    ends_at_the_deadline(
        Arc::new(Always(Decision::Continue)),
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_policy_that_always_steers_cannot_keep_a_run_past_its_deadline() {
    ends_at_the_deadline(
        Arc::new(Always(Decision::Steer("go on".into()))),
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_policy_that_always_extends_gets_max_extensions() {
    // Hard deadline 5 s; each extension is the hour the policy asks for,
    // and `max_extensions: 2` of them are granted, no more: the run ends
    // past two hours (both were granted) and before a third.
    let (r, elapsed) = ends_at_the_deadline(
        Arc::new(Always(Decision::Extend(Duration::from_secs(3600)))),
        Duration::from_secs(10 + 2 * 3600),
    )
    .await;
    let extended = r
        .critic
        .iter()
        .filter(|d| d.action == CriticAction::Extend)
        .count();
    assert_eq!(extended, 2, "{:?}", r.critic);
    assert!(elapsed >= Duration::from_secs(5 + 2 * 3600), "{elapsed:?}");
}

#[tokio::test(start_paused = true)]
async fn a_policy_that_never_answers_cannot_keep_a_run_past_its_deadline() {
    let asked = Arc::new(AtomicUsize::new(0));
    ends_at_the_deadline(Arc::new(Never(asked.clone())), Duration::from_secs(10)).await;
    // One question pending per run: the stall timer did not pile them up.
    assert!(asked.load(Ordering::SeqCst) >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_shard_ends_its_runs_shard_failed_and_is_replaced() {
    let (host, store) = support::host_from(support::builder().config(HostConfig {
        critic_shards: 1,
        ..HostConfig::default()
    }))
    .await;
    let spec = support::spec("name: hangs\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { hang: true }\n");
    let mut handles = Vec::new();
    for _ in 0..3 {
        handles.push(
            host.submit(spec.clone(), Invocation::prompt("x"))
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    host.inject_shard_fault(0, Fault::Fail);
    for h in handles {
        let id = h.run_id();
        let r = tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .expect("every handle resolves");
        assert_eq!(r.status, RunStatus::Error);
        assert_eq!(r.error_kind.as_deref(), Some("shard_failed"));
        let records = support::records(&store, id).await;
        assert_eq!(support::terminal_count(&records), 1);
    }
    // New runs go to the replacement shard.
    let ok = host
        .execute(support::spec(support::HELLO), Invocation::prompt("x"))
        .await
        .unwrap();
    assert_eq!(ok.status, RunStatus::Ok);
    assert_eq!(host.live_runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_what_a_wedged_shard_holds_after_its_deadline() {
    let (host, store) = support::host_from(support::builder().config(HostConfig {
        critic_shards: 1,
        shutdown_timeout: Duration::from_secs(2),
        ..HostConfig::default()
    }))
    .await;
    let spec = support::spec("name: hangs\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { hang: true }\n");
    let a = host
        .submit(spec.clone(), Invocation::prompt("x"))
        .await
        .unwrap();
    let b = host.submit(spec, Invocation::prompt("x")).await.unwrap();
    let (ida, idb) = (a.run_id(), b.run_id());
    a.detach();
    tokio::time::sleep(Duration::from_millis(10)).await;
    host.inject_shard_fault(0, Fault::Wedge);
    let t0 = tokio::time::Instant::now();
    host.shutdown().await;
    assert!(t0.elapsed() >= Duration::from_secs(2));
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let r = b.await;
    assert_eq!(r.status, RunStatus::Cancelled);
    for id in [ida, idb] {
        let records = support::records(&store, id).await;
        assert_eq!(support::terminal_count(&records), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_killed_runs_tool_call_gets_kill_grace_to_clean_up() {
    let stubborn = HangingTool::stubborn();
    let (host, _store) = support::host_from(support::builder().tool(stubborn.clone())).await;
    let handle = host
        .submit(
            support::spec("name: waits\ntools: [wait]\nlimits: { stall_timeout: 1h, max_runtime: 1h, tool_timeout: 1h, kill_grace: 3s }\nscript:\n  - { tool: wait }\n  - { text: never }\n"),
            Invocation::prompt("x"),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(stubborn.started(), 1);
    let t0 = tokio::time::Instant::now();
    handle.kill();
    let r = handle.await;
    // The status is decided at the kill, not after the grace.
    assert_eq!(r.kill_reason, Some(KillReason::Operator));
    assert!(t0.elapsed() < Duration::from_millis(50));
    // The call ignores the signal: it is dropped when the grace is over.
    tokio::time::sleep(Duration::from_millis(2900)).await;
    assert_eq!(stubborn.dropped(), 0, "the call has its grace");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(stubborn.dropped(), 1, "then it is dropped");
}
