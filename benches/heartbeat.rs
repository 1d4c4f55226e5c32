//! Heartbeat throughput of ONE critic shard, against a bare tokio consumer.
//!
//! Run with: `cargo bench --bench heartbeat` (settings: `-- --beats N` or
//! `HEARTBEAT_BEATS=N`).
//!
//! Settings (defaults): `runs` = 10 000 hosted runs, `beats` = 4 000 000
//! heartbeats, `producers` = 1 task casting. Global allocator: mimalloc,
//! as the CLI.
//!
//! A run's own heartbeats (step and tool start and finish) are field
//! updates in the handler that makes them: they cost the shard no message.
//! The heartbeats that do arrive as messages come from a run's tasks (a
//! spawned tool call as it ends, a retry) or from its caller
//! (`RunHandle::heartbeat`): one `Beat` message each. That is what this
//! bench streams at one shard: a host with one critic shard (rules policy,
//! in-memory stores) carries `runs` runs hung in their first model call
//! (limits an hour away, so no timer fires); the producers call
//! `heartbeat()` round-robin over their handles; then one run is killed
//! behind them, and the moment it is finished marks the shard having
//! handled every heartbeat before it (one mailbox, in order). The floor is
//! a tokio unbounded mpsc and one consumer task keeping the same per-run
//! record (`HashMap<u64, _>`, a clock read per heartbeat, the same
//! counters), with a oneshot as the marker. Printed: heartbeats/s absorbed,
//! and the ratio shard / floor. Issue 5's target: ≥ 1 000 000 heartbeats/s
//! per shard.
//!
//! `harness = false`: a plain binary, because the bench measures the shard
//! and its floor in the same run and prints their ratio, which criterion and
//! divan do not do across benchmarks, and it keeps bench frameworks out of
//! CI's dependency build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunHandle};
use support::{ratio, setting};
use tokio::sync::{mpsc, oneshot};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const HANG: &str = r#"
name: hang
model: scripted
prompt: Wait.
limits: { max_runtime: 1h, stall_timeout: 1h }
script:
  - { hang: true }
"#;

/// What a case measured.
struct Absorbed {
    /// Until the producers had sent everything.
    sent: Duration,
    /// Until the consumer had handled everything.
    done: Duration,
}

/// Casts `beats` heartbeats from `producers` tasks, round-robin over `runs`
/// runs (`send(i)` sends to run `i`), then waits for `mark` (which must
/// send the marker behind them).
async fn stream<S, M, Fut>(runs: u64, beats: u64, producers: u64, send: S, mark: M) -> Absorbed
where
    S: Fn(u64) + Clone + Send + 'static,
    M: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let send = send.clone();
            tokio::spawn(async move {
                let mut i = p;
                while i < beats {
                    send(i % runs);
                    i += producers;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let sent = t0.elapsed();
    mark().await;
    Absorbed {
        sent,
        done: t0.elapsed(),
    }
}

/// The shard: one critic shard hosting `runs` hung runs.
async fn shard(runs: u64, beats: u64, producers: u64) -> Absorbed {
    let host = Host::builder()
        .config(HostConfig {
            critic_shards: 1,
            ..Default::default()
        })
        .build()
        .await
        .unwrap();
    let agent = host.agent(AgentSpec::from_yaml(HANG).unwrap()).unwrap();
    let mut handles: Vec<RunHandle> = Vec::with_capacity(runs as usize);
    for _ in 0..runs {
        handles.push(host.submit(&agent, Invocation::default()).await.unwrap());
    }
    // Every run is hosted (in its first call) before the clock starts.
    while handles
        .iter()
        .any(|h| h.live().map_or(0, |l| l.iteration) == 0)
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let handles = Arc::new(handles);
    let h = handles.clone();
    let send = move |i: u64| h[i as usize].heartbeat();
    let marker = handles.clone();
    let absorbed = stream(runs, beats, producers, send, move || async move {
        marker[0].kill();
        while !marker[0].live().is_some_and(|l| l.finished) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    drop(handles);
    host.shutdown().await;
    absorbed
}

enum FloorMsg {
    Beat { run: u64 },
    Mark(oneshot::Sender<()>),
}

/// The floor's per-run record: the counters a shard keeps for heartbeats.
struct Record {
    last_beat: tokio::time::Instant,
    steps: u32,
    tool_calls: u32,
    tokens: u64,
}

/// The floor: an mpsc and one consumer task.
async fn floor(runs: u64, beats: u64, producers: u64) -> Absorbed {
    let (tx, mut rx) = mpsc::unbounded_channel::<FloorMsg>();
    let consumer = tokio::spawn(async move {
        let now = tokio::time::Instant::now();
        let mut records: HashMap<u64, Record> = (0..runs)
            .map(|pid| {
                let r = Record {
                    last_beat: now,
                    steps: 0,
                    tool_calls: 0,
                    tokens: 0,
                };
                (pid, r)
            })
            .collect();
        let mut beats = 0u64;
        while let Some(msg) = rx.recv().await {
            match msg {
                FloorMsg::Beat { run } => {
                    if let Some(r) = records.get_mut(&run) {
                        r.last_beat = tokio::time::Instant::now();
                        beats += 1;
                    }
                }
                FloorMsg::Mark(done) => {
                    let _ = done.send(());
                }
            }
        }
        let kept: u64 = records
            .values()
            .map(|r| u64::from(r.steps + r.tool_calls) + r.tokens)
            .sum();
        (beats, kept)
    });
    let (t, marker) = (tx.clone(), tx.clone());
    let send = move |run: u64| t.send(FloorMsg::Beat { run }).unwrap();
    let absorbed = stream(runs, beats, producers, send, move || async move {
        let (done_tx, done_rx) = oneshot::channel();
        marker.send(FloorMsg::Mark(done_tx)).unwrap();
        done_rx.await.unwrap();
    })
    .await;
    drop(tx);
    let (counted, _) = consumer.await.unwrap();
    assert_eq!(counted, beats, "the floor lost heartbeats");
    absorbed
}

fn main() {
    let runs: u64 = setting("HEARTBEAT", "runs", 10_000);
    let beats: u64 = setting("HEARTBEAT", "beats", 4_000_000);
    let producers: u64 = setting("HEARTBEAT", "producers", 1).max(1);
    println!("bench heartbeat: one critic shard, runs={runs} beats={beats} producers={producers}");
    let rt = support::runtime();
    let (fl, av) = rt
        .block_on(rt.spawn(async move {
            let fl = floor(runs, beats, producers).await;
            let av = shard(runs, beats, producers).await;
            (fl, av)
        }))
        .unwrap();
    let per_s = |d: Duration| beats as f64 / d.as_secs_f64();
    for (name, a) in [("floor", &fl), ("shard", &av)] {
        println!(
            "  {name:<6} {:>12.0} heartbeats/s  (sent in {:.3} s, absorbed in {:.3} s)",
            per_s(a.done),
            a.sent.as_secs_f64(),
            a.done.as_secs_f64()
        );
    }
    let rate = per_s(av.done);
    println!(
        "RESULT heartbeat: shard {:.2} M heartbeats/s (target >= 1 M: {}), shard/floor {:.2}x",
        rate / 1e6,
        if rate >= 1e6 { "met" } else { "NOT met" },
        ratio(rate, per_s(fl.done))
    );
}
