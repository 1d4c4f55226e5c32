//! W1 through the path users run — the `agentvisor swarm` binary — against
//! the bare-tokio floor, at several concurrencies, in one sitting.
//!
//! Run with: `cargo bench --bench swarm` (settings: `-- --runs N` or
//! `SWARM_RUNS=N`).
//!
//! Settings (defaults): `runs` N = 200 000 runs per swarm, `floor-runs` =
//! 1 000 000 floor runs per measurement, `concurrency` = `1000,10000,100000`
//! (the list of C to measure), `rounds` = 3, `sqlite` = 1 (also measure
//! the default SQLite file against `--db :memory:` at the first C; 0 skips
//! it).
//!
//! Each round, for each C: the floor (the W1 loop as one tokio task per
//! run, argument validation included: `benches/support/workload.rs`) in
//! this process, then `agentvisor --db :memory: swarm w1.yaml --runs N
//! --concurrency C --json` as a child process (critic, budget and
//! in-memory audit on: the binary users run, its allocator, its runtime);
//! then, at the first C, the same swarm on a fresh SQLite file. Printed:
//! runs/s of each, the ratio swarm/floor at each C, how the ratio holds as
//! C grows (ratio at the largest C over ratio at the smallest; the target
//! is ≥ 0.8), and SQLite/`:memory:` (target ≥ 0.6). Medians over rounds.
//! The swarm's runs/s is what it reports itself (from its first run's
//! start to its last run's end: process start-up is not counted); its CPU
//! is the child's (`cutime` + `cstime` of `/proc/self/stat` around it).
//!
//! This bench exists so that a regression on the `swarm` path shows up in
//! the next before/after pair even when `cargo bench --bench w1` (a host
//! in the bench's own process) does not move.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use agentvisor::Host;
use support::workload::{run_engine, Engine, Settings, W1_MANIFEST};
use support::{list_setting, setting};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One swarm's figures.
struct Swarm {
    runs_per_sec: f64,
    cpu_s_per_1000: f64,
}

/// `agentvisor --db DB swarm W1 --runs N --concurrency C --json`, as a
/// child process; every run must end ok.
fn swarm(dir: &Path, db: &str, runs: u64, concurrency: u64) -> Swarm {
    let manifest = dir.join("w1.yaml");
    let cpu_before = children_cpu_seconds();
    let out = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .args(["--db", db, "swarm"])
        .arg(&manifest)
        .args(["--runs", &runs.to_string()])
        .args(["--concurrency", &concurrency.to_string(), "--json"])
        .env("AGENTVISOR_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("run agentvisor swarm");
    let cpu_s = children_cpu_seconds() - cpu_before;
    assert!(out.status.success(), "agentvisor swarm: {out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        summary["by_status"]["ok"], runs,
        "every swarm run must end ok: {summary}"
    );
    Swarm {
        runs_per_sec: summary["runs_per_sec"].as_f64().unwrap(),
        cpu_s_per_1000: cpu_s * 1000.0 / runs as f64,
    }
}

/// CPU seconds (user + system) of this process's children that have been
/// waited for: `cutime` and `cstime` of `/proc/self/stat` (clock ticks of
/// 1/100 s). The difference around one child's `output()` is that child's.
fn children_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at
    // `state`, field 3; cutime and cstime are fields 16 and 17.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (tick(16 - 3) + tick(17 - 3)) / 100.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let runs: u64 = setting("SWARM", "runs", 200_000);
    let floor_runs: u64 = setting("SWARM", "floor-runs", 1_000_000);
    let concurrencies = list_setting("SWARM", "concurrency", "1000,10000,100000");
    let rounds: usize = setting("SWARM", "rounds", 3).max(1);
    let sqlite: u8 = setting("SWARM", "sqlite", 1);
    assert!(!concurrencies.is_empty(), "--concurrency lists none");
    println!(
        "bench swarm: runs={runs} floor-runs={floor_runs} concurrency={concurrencies:?} rounds={rounds} sqlite={sqlite}"
    );
    let dir =
        std::env::temp_dir().join(format!("agentvisor-bench-swarmpath-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("w1.yaml"), W1_MANIFEST).unwrap();
    let rt = support::runtime();
    // ratios[i]: swarm/floor at concurrencies[i], one per round.
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); concurrencies.len()];
    let mut cpu_ratios: Vec<Vec<f64>> = vec![Vec::new(); concurrencies.len()];
    let mut file_ratios = Vec::new();
    for round in 1..=rounds {
        println!("round {round}");
        for (i, &c) in concurrencies.iter().enumerate() {
            let settings = Settings {
                runs: floor_runs,
                concurrency: c,
                latency: std::time::Duration::ZERO,
            };
            let floor = rt
                .block_on(run_engine(Engine::Floor, settings, Host::builder()))
                .unwrap();
            assert_eq!(floor.ok, floor_runs, "every floor run must end ok");
            let mem = swarm(&dir, ":memory:", runs, c);
            let r = mem.runs_per_sec / floor.runs_per_sec;
            let cr = mem.cpu_s_per_1000 / floor.cpu_s_per_1000.max(1e-12);
            println!(
                "  C={c:<7} floor {:>9.0} runs/s {:.4} CPU s/1000 | swarm :memory: {:>9.0} runs/s {:.4} CPU s/1000 | ratio {r:.3}x, CPU per run {cr:.2}x",
                floor.runs_per_sec, floor.cpu_s_per_1000, mem.runs_per_sec, mem.cpu_s_per_1000
            );
            ratios[i].push(r);
            cpu_ratios[i].push(cr);
            if i == 0 && sqlite != 0 {
                let db = dir.join(format!("swarm-{round}.db"));
                let file = swarm(&dir, db.to_str().unwrap(), runs, c);
                for ext in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{ext}", db.display()));
                }
                let fr = file.runs_per_sec / mem.runs_per_sec;
                println!(
                    "  C={c:<7} swarm on a SQLite file {:>9.0} runs/s {:.4} CPU s/1000 | file/:memory: {fr:.3}x",
                    file.runs_per_sec, file.cpu_s_per_1000
                );
                file_ratios.push(fr);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("medians of {rounds}:");
    let medians: Vec<f64> = ratios.iter().map(|r| median(r.clone())).collect();
    for (i, &c) in concurrencies.iter().enumerate() {
        println!(
            "  C={c:<7} swarm/floor {:.3}x, CPU per run {:.2}x",
            medians[i],
            median(cpu_ratios[i].clone())
        );
    }
    let first = medians[0];
    let last = *medians.last().unwrap();
    let held = last / first;
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!(
        "RESULT swarm W1 ratio {first:.3}x at C={} (target >= 0.50: {})",
        concurrencies[0],
        verdict(first >= 0.5)
    );
    if concurrencies.len() > 1 {
        println!(
            "RESULT ratio at C={} over C={}: {held:.2} (target >= 0.80: {})",
            concurrencies.last().unwrap(),
            concurrencies[0],
            verdict(held >= 0.8)
        );
    }
    if !file_ratios.is_empty() {
        let f = median(file_ratios);
        println!(
            "RESULT SQLite file / :memory: {f:.3}x at C={} (target >= 0.60: {})",
            concurrencies[0],
            verdict(f >= 0.6)
        );
    }
}
