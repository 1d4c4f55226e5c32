//! W1 through agentvisor against its floor, in one process.
//!
//! Run with: `cargo bench --bench w1` (settings: `-- --runs N` or `W1_RUNS=N`).
//!
//! Settings (defaults): `runs` N = 100 000 agentvisor runs per round,
//! `floor-runs` = 1 000 000 floor runs per round (the floor is ~15× faster;
//! this many keep its CPU figure, read in 10 ms ticks, within ~1 %),
//! `concurrency` C = 1000, `latency-ms` L = 0, `rounds` = 3. Host: the
//! default `HostConfig` (one critic shard per CPU) with critic, budget and
//! audit on, stores in memory; to see what a knob is worth, override
//! `critic-shards`, `audit-batch` (records per write) or
//! `audit-max-age-us` (how long a record may wait for its batch). Global
//! allocator: mimalloc, as the CLI.
//!
//! Each round runs the floor, then agentvisor, on the same runtime
//! (`support::workload::run_engine`); printed per round: runs/s, CPU
//! seconds per 1000 runs, and the ratios agentvisor / floor; then the median
//! over the rounds. Issue 5's target: throughput ratio ≥ 0.3 (aim 0.5).
//!
//! `harness = false`: this is a plain binary. The bench measures agentvisor
//! and its floor in the same run and prints their ratio, which criterion and
//! divan do not do across benchmarks (each benchmark is reported on its own),
//! the CPU figure comes from `/proc/self/stat` around a whole engine run
//! rather than from per-iteration timing, and no bench framework enters
//! CI's dependency build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use agentvisor::{Host, HostConfig};
use support::setting;
use support::workload::{run_engine, Engine, Figures, Ratios, Settings};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn line(f: &Figures) {
    println!(
        "  {:<11} {:>10.0} runs/s  {:>7.4} CPU s/1000 runs  ({} of {} ok, {:.2} s)",
        f.engine.as_str(),
        f.runs_per_sec,
        f.cpu_s_per_1000,
        f.ok,
        f.runs,
        f.elapsed_s
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let s = Settings {
        runs: setting("W1", "runs", 100_000),
        concurrency: setting("W1", "concurrency", 1000),
        latency: Duration::from_millis(setting("W1", "latency-ms", 0)),
    };
    let rounds: usize = setting("W1", "rounds", 3).max(1);
    let floor_settings = Settings {
        runs: setting("W1", "floor-runs", 1_000_000),
        ..s
    };
    let defaults = HostConfig::default();
    let config = HostConfig {
        critic_shards: setting("W1", "critic-shards", defaults.critic_shards),
        audit_batch: setting("W1", "audit-batch", defaults.audit_batch),
        audit_max_age: Duration::from_micros(setting(
            "W1",
            "audit-max-age-us",
            defaults.audit_max_age.as_micros() as u64,
        )),
        ..defaults
    };
    println!(
        "bench w1: runs={} floor-runs={} concurrency={} latency={}ms rounds={} critic_shards={} audit_batch={} audit_max_age={:?}",
        s.runs,
        floor_settings.runs,
        s.concurrency,
        s.latency.as_millis(),
        rounds,
        config.critic_shards,
        config.audit_batch,
        config.audit_max_age
    );
    let rt = support::runtime();
    let mut floors = Vec::new();
    let mut avs = Vec::new();
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        println!("round {round}");
        let floor = rt
            .block_on(run_engine(Engine::Floor, floor_settings, Host::builder()))
            .unwrap();
        line(&floor);
        let av = rt
            .block_on(run_engine(
                Engine::Agentvisor,
                s,
                Host::builder().config(config.clone()),
            ))
            .unwrap();
        line(&av);
        assert_eq!(
            (floor.ok, av.ok),
            (floor_settings.runs, s.runs),
            "every run must end ok"
        );
        let r = Ratios::of(&av, &floor);
        println!(
            "  ratio agentvisor/floor: throughput {:.3}x, CPU per run {:.2}x",
            r.throughput, r.cpu_per_run
        );
        floors.push(floor);
        avs.push(av);
        ratios.push(r);
    }
    let throughput = median(ratios.iter().map(|r| r.throughput).collect());
    let cpu = median(ratios.iter().map(|r| r.cpu_per_run).collect());
    println!(
        "median of {rounds}: floor {:.0} runs/s {:.4} CPU s/1000; agentvisor {:.0} runs/s {:.4} CPU s/1000",
        median(floors.iter().map(|f| f.runs_per_sec).collect()),
        median(floors.iter().map(|f| f.cpu_s_per_1000).collect()),
        median(avs.iter().map(|f| f.runs_per_sec).collect()),
        median(avs.iter().map(|f| f.cpu_s_per_1000).collect()),
    );
    println!(
        "RESULT w1 throughput ratio {throughput:.3}x (target >= 0.30: {}), CPU per run ratio {cpu:.2}x",
        if throughput >= 0.3 { "met" } else { "NOT met" }
    );
}
