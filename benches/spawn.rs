//! Spawn-to-result cost of one run, one at a time, against its floor.
//!
//! Run with: `cargo bench --bench spawn` (settings: `-- --runs N` or
//! `SPAWN_RUNS=N`).
//!
//! Settings (defaults): `runs` = 2000 timed runs per engine and agent,
//! after `warmup` = 200 untimed ones. Host: the default `HostConfig`
//! (critic, budget and audit on, stores in memory); `audit-max-age-us`
//! overrides how long a record may wait for its audit batch (a result is
//! delivered once its terminal record is written; with the audit writer
//! idle, as it is for a lone run, the batch is cut at once, so the age
//! bounds only runs that queue behind a write). Global allocator:
//! mimalloc, as the CLI. Two agents:
//!
//! - `one-call`: a single model call that answers text at once, no tools —
//!   the cost of making a run exist and getting its result back;
//! - `w1`: the W1 run (3 model calls, 2 tool calls, L = 0).
//!
//! One run at a time, from a task on a runtime worker: agentvisor times
//! `host.submit(..).await` then awaiting the handle; the floor times
//! `tokio::spawn` of its run (`support::workload::Floor`) and awaiting the
//! `JoinHandle`. Printed: mean, p50, p99, max per run, and the ratios
//! agentvisor / floor of the mean and the p50.
//!
//! `harness = false`: a plain binary, because the bench measures agentvisor
//! and its floor in the same run and prints their ratio, which criterion and
//! divan do not do across benchmarks, and it keeps bench frameworks out of
//! CI's dependency build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunStatus};
use support::workload::{w1_spec, Floor};
use support::{ratio, setting, us, Summary};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ONE_CALL: &str = r#"
name: one-call
model: scripted
system: You answer.
prompt: Say done.
script:
  - { text: "done" }
"#;

async fn agentvisor(spec: AgentSpec, config: HostConfig, warmup: u64, runs: u64) -> Summary {
    let host = Host::builder().config(config).build().await.unwrap();
    let agent = host.agent(spec).unwrap();
    let mut samples = Vec::with_capacity(runs as usize);
    for i in 0..warmup + runs {
        let t0 = Instant::now();
        let result = host
            .submit(&agent, Invocation::default())
            .await
            .unwrap()
            .await;
        let took = t0.elapsed();
        assert_eq!(result.status, RunStatus::Ok, "{:?}", result.error);
        if i >= warmup {
            samples.push(took);
        }
    }
    host.shutdown().await;
    Summary::of(&mut samples)
}

async fn floor(spec: AgentSpec, warmup: u64, runs: u64) -> Summary {
    let floor = Floor::new(&spec).unwrap();
    let mut samples = Vec::with_capacity(runs as usize);
    for i in 0..warmup + runs {
        let f = floor.clone();
        let t0 = Instant::now();
        let ok = tokio::spawn(async move { f.run_once().await })
            .await
            .unwrap();
        let took = t0.elapsed();
        assert!(ok);
        if i >= warmup {
            samples.push(took);
        }
    }
    Summary::of(&mut samples)
}

fn main() {
    let runs: u64 = setting("SPAWN", "runs", 2000);
    let warmup: u64 = setting("SPAWN", "warmup", 200);
    let defaults = HostConfig::default();
    let config = HostConfig {
        audit_max_age: Duration::from_micros(setting(
            "SPAWN",
            "audit-max-age-us",
            defaults.audit_max_age.as_micros() as u64,
        )),
        ..defaults
    };
    println!(
        "bench spawn: runs={runs} warmup={warmup}, one at a time, audit_max_age={:?}",
        config.audit_max_age
    );
    let rt = support::runtime();
    let agents = [
        ("one-call", AgentSpec::from_yaml(ONE_CALL).unwrap()),
        ("w1", w1_spec(Duration::ZERO).unwrap()),
    ];
    for (name, spec) in agents {
        // On a worker thread, as a host's callers are.
        let config = config.clone();
        let (fl, av) = rt
            .block_on(rt.spawn(async move {
                let fl = floor(spec.clone(), warmup, runs).await;
                let av = agentvisor(spec, config, warmup, runs).await;
                (fl, av)
            }))
            .unwrap();
        println!("{name}");
        println!("  floor       {}", fl.micros());
        println!("  agentvisor  {}", av.micros());
        println!(
            "RESULT spawn {name}: agentvisor/floor mean {:.1}x, p50 {:.1}x ({:.1} µs vs {:.1} µs per run)",
            ratio(us(av.mean), us(fl.mean)),
            ratio(us(av.p50), us(fl.p50)),
            us(av.mean),
            us(fl.mean)
        );
    }
}
