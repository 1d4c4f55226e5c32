//! Heartbeat throughput of ONE critic shard, against a bare tokio consumer.
//!
//! Run with: `cargo bench --bench heartbeat` (settings: `-- --beats N` or
//! `HEARTBEAT_BEATS=N`).
//!
//! Settings (defaults): `runs` = 10 000 watched runs, `beats` = 4 000 000
//! heartbeats per case, `batches` = `1,4` heartbeats per message (1: one
//! `CriticMsg::Beat` each, as a spawned tool call sends; 4: one
//! `CriticMsg::Beats` of StepStarted, StepFinished, ToolStarted,
//! ToolFinished, as a run sends at the end of a handler in W1),
//! `producers` = 1 task casting. Global allocator: mimalloc, as the CLI.
//!
//! The shard is spawned alone (`Critic::new`, the rules policy, an audit
//! sink that drops what it gets) and watches `runs` probe actors
//! (`Watch::unhosted`, limits far away, so no timer fires). The producers
//! cast heartbeats round-robin over the runs; then one `ReleaseStep` goes
//! behind them, and the shard's answer to a probe marks the moment it has
//! handled every heartbeat before it (one mailbox, in order). The floor is a
//! tokio unbounded mpsc and one consumer task keeping the same per-run
//! record (`HashMap<u64, _>`, a clock read per heartbeat, the same counters
//! and repeat check), with a oneshot as the marker. Printed: heartbeats/s
//! and messages/s absorbed, and the ratio shard / floor. Issue 5's target:
//! ≥ 1 000 000 heartbeats/s per shard.
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

use agentvisor::actors::audit::AuditMsg;
use agentvisor::actors::critic::{Beat, Critic, CriticMsg, Watch};
use agentvisor::actors::run::RunMsg;
use agentvisor::policy::RulesPolicy;
use agentvisor::{Limits, LimitsSpec};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use support::{ratio, setting};
use tokio::sync::{mpsc, oneshot};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Stands in for a run actor: the shard watches it; one of them reports
/// the shard's `NextStep` answer.
struct Probe;

impl Actor for Probe {
    type Msg = RunMsg;
    type State = Option<mpsc::UnboundedSender<()>>;
    type Arguments = Option<mpsc::UnboundedSender<()>>;

    async fn pre_start(
        &self,
        _: ActorRef<RunMsg>,
        marker: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(marker)
    }

    async fn handle(
        &self,
        _: ActorRef<RunMsg>,
        msg: RunMsg,
        marker: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let (RunMsg::NextStep, Some(tx)) = (msg, marker) {
            let _ = tx.send(());
        }
        Ok(())
    }
}

/// Stands in for the audit actor: drops what it gets.
struct AuditSink;

impl Actor for AuditSink {
    type Msg = AuditMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<AuditMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

/// The `i`-th message of the stream, for run `pid`.
fn beats(i: u64, batch: usize) -> Vec<Beat> {
    const CYCLE: usize = 4;
    (0..batch)
        .map(|j| match (i as usize * batch + j) % CYCLE {
            0 => Beat::StepStarted,
            1 => Beat::StepFinished { tokens: 10 },
            // Distinct calls: no repeat decision is ever asked.
            2 => Beat::ToolStarted { hash: i + 1 },
            _ => Beat::ToolFinished,
        })
        .collect()
}

/// What a case measured.
struct Absorbed {
    /// Until the producers had sent everything.
    sent: Duration,
    /// Until the consumer had handled everything.
    done: Duration,
}

/// Casts `messages` messages from `producers` tasks, round-robin over
/// `pids`, then waits for `mark` (which must send the marker behind them).
async fn stream<S, M, Fut>(
    pids: Arc<Vec<u64>>,
    messages: u64,
    batch: usize,
    producers: u64,
    send: S,
    mark: M,
) -> Absorbed
where
    S: Fn(u64, Vec<Beat>) + Clone + Send + 'static,
    M: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let (pids, send) = (pids.clone(), send.clone());
            tokio::spawn(async move {
                let mut i = p;
                while i < messages {
                    send(pids[(i % pids.len() as u64) as usize], beats(i, batch));
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

/// The shard: spawned alone, watching `runs` probes.
async fn shard(runs: u64, heartbeats: u64, batch: usize, producers: u64) -> Absorbed {
    let (sink, _) = Actor::spawn(None, AuditSink, ()).await.unwrap();
    let critic = Critic::new(Arc::new(RulesPolicy), sink.clone());
    let (critic, _) = Actor::spawn(None, critic, ()).await.unwrap();
    let far = Duration::from_secs(3600);
    let limits: Limits = LimitsSpec {
        max_runtime: Some(far),
        stall_timeout: Some(far),
        ..Default::default()
    }
    .resolve(&LimitsSpec::default());
    let (marker_tx, mut marker_rx) = mpsc::unbounded_channel();
    let mut probes = Vec::with_capacity(runs as usize);
    for i in 0..runs {
        let marker = (i == 0).then(|| marker_tx.clone());
        let (probe, _) = Actor::spawn(None, Probe, marker).await.unwrap();
        critic
            .cast(CriticMsg::Watch(Box::new(Watch::unhosted(
                probe.clone(),
                limits,
            ))))
            .unwrap();
        probes.push(probe);
    }
    let first = probes[0].clone();
    let mark = |critic: ActorRef<CriticMsg>, first: ActorRef<RunMsg>| {
        critic.cast(CriticMsg::ReleaseStep { run: first }).unwrap();
    };
    // Every watch is in before the clock starts.
    mark(critic.clone(), first.clone());
    marker_rx.recv().await.unwrap();

    let pids = Arc::new(probes.iter().map(|p| p.get_id().pid()).collect::<Vec<_>>());
    let c = critic.clone();
    let send = move |run: u64, beats: Vec<Beat>| {
        let msg = if beats.len() == 1 {
            CriticMsg::Beat {
                run,
                beat: beats[0],
            }
        } else {
            CriticMsg::Beats { run, beats }
        };
        c.cast(msg).unwrap();
    };
    let (c, f) = (critic.clone(), first.clone());
    let absorbed = stream(
        pids,
        heartbeats / batch as u64,
        batch,
        producers,
        send,
        move || async move {
            mark(c, f);
            marker_rx.recv().await.unwrap();
        },
    )
    .await;
    critic.stop(None);
    for p in probes {
        p.stop(None);
    }
    sink.stop(None);
    absorbed
}

enum FloorMsg {
    Beat { run: u64, beat: Beat },
    Beats { run: u64, beats: Vec<Beat> },
    Mark(oneshot::Sender<()>),
}

/// The floor's per-run record: the counters a shard keeps for heartbeats.
struct Record {
    last_beat: tokio::time::Instant,
    steps: u32,
    steps_done: u32,
    tool_calls: u32,
    tokens: u64,
    last_call: u64,
    repeats: u32,
}

fn floor_beat(runs: &mut HashMap<u64, Record>, pid: u64, beat: Beat, repeat_limit: u32) -> bool {
    let Some(r) = runs.get_mut(&pid) else {
        return false;
    };
    r.last_beat = tokio::time::Instant::now();
    match beat {
        Beat::StepStarted => r.steps += 1,
        Beat::StepFinished { tokens } => {
            r.steps_done += 1;
            r.tokens += tokens;
        }
        Beat::ToolFinished => r.tool_calls += 1,
        Beat::Alive => {}
        Beat::ToolStarted { hash } => {
            if hash == r.last_call {
                r.repeats += 1;
            } else {
                r.last_call = hash;
                r.repeats = 1;
            }
            return r.repeats >= repeat_limit;
        }
    }
    false
}

/// The floor: an mpsc and one consumer task.
async fn floor(runs: u64, heartbeats: u64, batch: usize, producers: u64) -> Absorbed {
    let (tx, mut rx) = mpsc::unbounded_channel::<FloorMsg>();
    let repeat_limit = Limits::default().repeat_limit;
    let consumer = tokio::spawn(async move {
        let now = tokio::time::Instant::now();
        let mut records: HashMap<u64, Record> = (0..runs)
            .map(|pid| {
                let r = Record {
                    last_beat: now,
                    steps: 0,
                    steps_done: 0,
                    tool_calls: 0,
                    tokens: 0,
                    last_call: 0,
                    repeats: 0,
                };
                (pid, r)
            })
            .collect();
        let mut asks = 0u64;
        while let Some(msg) = rx.recv().await {
            match msg {
                FloorMsg::Beat { run, beat } => {
                    asks += u64::from(floor_beat(&mut records, run, beat, repeat_limit))
                }
                FloorMsg::Beats { run, beats } => {
                    for beat in beats {
                        asks += u64::from(floor_beat(&mut records, run, beat, repeat_limit));
                    }
                }
                FloorMsg::Mark(done) => {
                    let _ = done.send(());
                }
            }
        }
        (asks, records.values().map(|r| r.steps as u64).sum::<u64>())
    });
    let pids = Arc::new((0..runs).collect::<Vec<_>>());
    let (t, marker) = (tx.clone(), tx.clone());
    let send = move |run: u64, beats: Vec<Beat>| {
        let msg = if beats.len() == 1 {
            FloorMsg::Beat {
                run,
                beat: beats[0],
            }
        } else {
            FloorMsg::Beats { run, beats }
        };
        t.send(msg).unwrap();
    };
    let absorbed = stream(
        pids,
        heartbeats / batch as u64,
        batch,
        producers,
        send,
        move || async move {
            let (done_tx, done_rx) = oneshot::channel();
            marker.send(FloorMsg::Mark(done_tx)).unwrap();
            done_rx.await.unwrap();
        },
    )
    .await;
    drop(tx);
    let (asks, _steps) = consumer.await.unwrap();
    assert_eq!(asks, 0, "the floor's stream asked for a repeat decision");
    absorbed
}

fn main() {
    let runs: u64 = setting("HEARTBEAT", "runs", 10_000);
    let heartbeats: u64 = setting("HEARTBEAT", "beats", 4_000_000);
    let producers: u64 = setting("HEARTBEAT", "producers", 1).max(1);
    let batches = support::list_setting("HEARTBEAT", "batches", "1,4");
    println!(
        "bench heartbeat: one critic shard, runs={runs} beats={heartbeats} producers={producers} batches={batches:?}"
    );
    let rt = support::runtime();
    for batch in batches {
        let batch = batch.max(1) as usize;
        let (fl, av) = rt
            .block_on(rt.spawn(async move {
                let fl = floor(runs, heartbeats, batch, producers).await;
                let av = shard(runs, heartbeats, batch, producers).await;
                (fl, av)
            }))
            .unwrap();
        let total = (heartbeats / batch as u64 * batch as u64) as f64;
        let per_s = |d: Duration| total / d.as_secs_f64();
        println!("{batch} heartbeat(s) per message");
        for (name, a) in [("floor", &fl), ("shard", &av)] {
            println!(
                "  {name:<6} {:>12.0} heartbeats/s  {:>12.0} messages/s  (sent in {:.3} s, absorbed in {:.3} s)",
                per_s(a.done),
                per_s(a.done) / batch as f64,
                a.sent.as_secs_f64(),
                a.done.as_secs_f64()
            );
        }
        let rate = per_s(av.done);
        println!(
            "RESULT heartbeat batch={batch}: shard {:.2} M heartbeats/s (target >= 1 M: {}), shard/floor {:.2}x",
            rate / 1e6,
            if rate >= 1e6 { "met" } else { "NOT met" },
            ratio(rate, per_s(fl.done))
        );
    }
}
