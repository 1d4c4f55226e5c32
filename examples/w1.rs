//! Run with: cargo run --release --example w1 -- --runs 200000 --concurrency 1000 --latency-ms 0
//!
//! Workload W1 — one run = 3 model calls and 2 tool executions against the
//! scripted model (`add(2,3)`, `upper("done")`, then the text `final: 5
//! DONE`), each model call first sleeping L ms — through two engines (both
//! in `benches/support/workload.rs`, shared with the benches):
//!
//! - `floor`: the same loop as plain tokio tasks with a trait-object model
//!   and the same tool set (argument validation included), nothing else: no
//!   actors, no critic, no budget, no audit.
//! - `agentvisor`: the full runtime with critic, budget and audit (in
//!   memory) on.
//!
//! Each engine runs in its own child process (same binary, `--engine NAME`),
//! so the figures do not share an allocator or a peak-RSS mark. Printed per
//! engine: runs/s, CPU seconds per 1000 runs, bytes per concurrent run (peak
//! RSS minus the RSS before the runs, over C: meaningful when L keeps all C
//! runs alive at once, e.g. `--runs 100000 --concurrency 100000 --latency-ms
//! 2000`), and the ratios agentvisor / floor.

use std::process::{Command, ExitCode};
use std::time::Duration;

use agentvisor::Host;
use workload::{run_engine, Engine, Figures, Ratios, Settings};

#[path = "../benches/support/workload.rs"]
mod workload;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Child: runs one engine and prints its figures as one JSON line.
fn child(engine: &str, s: Settings) -> Result<(), String> {
    let engine: Engine = engine.parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let f = rt
        .block_on(run_engine(engine, s, Host::builder()))
        .map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string(&f).map_err(|e| e.to_string())?);
    Ok(())
}

/// Parent: runs each engine in a child process and reads its figures back.
fn measure(exe: &str, engine: Engine, s: Settings) -> Result<Figures, String> {
    let out = Command::new(exe)
        .args([
            "--engine",
            engine.as_str(),
            "--runs",
            &s.runs.to_string(),
            "--concurrency",
            &s.concurrency.to_string(),
            "--latency-ms",
            &s.latency.as_millis().to_string(),
        ])
        .output()
        .map_err(|e| format!("cannot start {engine}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).map_err(|e| {
        format!(
            "{engine}: {e}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let s = Settings {
        runs: arg(&args, "--runs", 200_000),
        concurrency: arg(&args, "--concurrency", 1000),
        latency: Duration::from_millis(arg(&args, "--latency-ms", 0)),
    };
    let done = if let Some(i) = args.iter().position(|a| a == "--engine") {
        child(args.get(i + 1).map(String::as_str).unwrap_or_default(), s)
    } else {
        parent(&args[0], s)
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("w1: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parent(exe: &str, s: Settings) -> Result<(), String> {
    println!(
        "W1: runs={} concurrency={} latency={}ms",
        s.runs,
        s.concurrency,
        s.latency.as_millis()
    );
    let mut figs = Vec::new();
    for engine in [Engine::Floor, Engine::Agentvisor] {
        let f = measure(exe, engine, s)?;
        println!(
            "{:<11} {:>10.0} runs/s  {:>7.3} CPU s/1000 runs  {:>9.0} B/concurrent run  ({} of {} ok, {:.2} s)",
            f.engine.as_str(), f.runs_per_sec, f.cpu_s_per_1000, f.bytes_per_concurrent_run, f.ok, f.runs, f.elapsed_s
        );
        figs.push(f);
    }
    let r = Ratios::of(&figs[1], &figs[0]);
    println!(
        "ratio agentvisor/floor: throughput {:.2}x, CPU per run {:.2}x, memory per concurrent run {:.2}x",
        r.throughput, r.cpu_per_run, r.memory_per_run
    );
    Ok(())
}
