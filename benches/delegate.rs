//! A swarm of parents each delegating to two children, against the same
//! runs submitted plainly, in one process.
//!
//! Run with: `cargo bench --bench delegate` (settings: `-- --trees 10000
//! --concurrency 1000`, or `DELEGATE_TREES=…`).
//!
//! Settings (defaults): `trees` = 10 000 groups per phase, `concurrency` =
//! 1 000 groups in flight at once, `rounds` = 3. Host: the default
//! `HostConfig` (one critic shard per CPU; critic, budget and audit on,
//! stores in memory), a fresh one per phase. Global allocator: mimalloc,
//! as the CLI.
//!
//! The child is W1 (`examples/agents/w1.yaml`: 3 model calls, 2 tool
//! calls, no latency). Each round runs three phases, back to back:
//!
//! - *pair*: a group is 2 plain W1 runs, submitted together and awaited.
//! - *trio*: a group is the same 2 W1 runs plus a plain parent — 2 model
//!   calls, the first calling `add` twice in parallel — submitted together:
//!   the three runs of a tree, without delegation.
//! - *tree*: a group is one parent whose first model call calls
//!   `agent__worker` twice in parallel (a palette entry naming the W1
//!   manifest): 2 child runs under the same critic, their answers the
//!   tool results, then the parent's answer. 3 runs per group: 30 000 runs
//!   at the default size. Every group must end with the parent `ok` and
//!   both children `ok` (the parent's steps), no run left live, and one
//!   terminal record per run in the audit store.
//!
//! Printed per phase: groups/s, runs/s, µs of wall time and CPU µs per
//! group (at throughput: elapsed / groups), peak RSS (reset before the
//! phase) over the RSS before it. Then the ratios, per group: tree /
//! pair, tree / trio, and the *delegation overhead* — tree minus trio
//! (what running the children as sub-agents costs beyond running the same
//! three runs on their own) — over pair (two plain runs). Medians over the
//! rounds.
//!
//! `harness = false`: a plain binary that measures the tree and its plain
//! baselines in the same run and prints their ratios.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;
use std::sync::Arc;

use agentvisor::ports::audit::AuditStore;
use agentvisor::soak::sampler::{cpu_seconds, peak_rss_bytes, reset_peak_rss, rss_bytes};
use agentvisor::stores::MemoryAuditStore;
use agentvisor::{Agent, AgentSpec, Host, Invocation, RunResult, RunStatus};
use support::process::mib;
use support::workload::{drive, W1_MANIFEST};
use support::{ratio, setting};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The parent of a tree: two children of the W1 worker at once, then the
/// answer. It may use `add` and `upper`, so its children may too.
const PARENT: &str = r#"name: parent
model: scripted
system: You split the work.
prompt: Do two parts.
tools: [add, upper]
agents:
  worker: { file: worker.yaml, description: "Adds and shouts." }
script:
  - tools:
      - { tool: agent__worker, args: { prompt: "part one" } }
      - { tool: agent__worker, args: { prompt: "part two" } }
  - { text: "both parts done" }
"#;

/// The trio's parent: the same shape with two plain tool calls.
const PLAIN_PARENT: &str = r#"name: plain-parent
model: scripted
system: You split the work.
prompt: Do two parts.
tools: [add, upper]
script:
  - tools:
      - { tool: add, args: { a: 2, b: 3 } }
      - { tool: add, args: { a: 4, b: 5 } }
  - { text: "both parts done" }
"#;

/// What a group is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Pair,
    Trio,
    Tree,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Pair => "pair",
            Phase::Trio => "trio",
            Phase::Tree => "tree",
        }
    }

    fn runs_per_group(self) -> u64 {
        match self {
            Phase::Pair => 2,
            Phase::Trio | Phase::Tree => 3,
        }
    }
}

/// What one phase measured.
struct Figures {
    groups: u64,
    runs: u64,
    elapsed_s: f64,
    cpu_s: f64,
    base_rss: u64,
    peak_rss: u64,
}

impl Figures {
    fn wall_us_per_group(&self) -> f64 {
        self.elapsed_s * 1e6 / self.groups as f64
    }

    fn cpu_us_per_group(&self) -> f64 {
        self.cpu_s * 1e6 / self.groups as f64
    }
}

fn ok(r: &RunResult) -> bool {
    r.status == RunStatus::Ok
}

/// A tree ended well: the parent `ok`, both children called and `ok` with
/// W1's answer.
fn tree_ok(r: &RunResult) -> bool {
    ok(r)
        && r.steps.len() == 2
        && r.steps
            .iter()
            .all(|s| &*s.tool == "agent__worker" && s.ok && s.result == "final: 5 DONE")
}

async fn phase(phase: Phase, groups: u64, concurrency: u64, dir: &std::path::Path) -> Figures {
    let store = Arc::new(MemoryAuditStore::new());
    let host = Host::builder()
        .audit_store(store.clone())
        .build()
        .await
        .unwrap();
    let w1 = host
        .agent(AgentSpec::from_yaml(W1_MANIFEST).unwrap())
        .unwrap();
    let plain = host
        .agent(AgentSpec::from_yaml(PLAIN_PARENT).unwrap())
        .unwrap();
    let parent = host
        .agent(AgentSpec::from_file(dir.join("parent.yaml")).unwrap())
        .unwrap();
    reset_peak_rss();
    let base_rss = rss_bytes();
    let cpu0 = cpu_seconds();
    let h = host.clone();
    let (done, elapsed) = drive(groups, concurrency, move || {
        let (host, w1, plain, parent) = (h.clone(), w1.clone(), plain.clone(), parent.clone());
        async move { group(phase, &host, &w1, &plain, &parent).await }
    })
    .await;
    let cpu_s = cpu_seconds() - cpu0;
    let peak_rss = peak_rss_bytes().max(base_rss);
    let live = host.live_runs();
    host.shutdown().await;
    let terminal = store.stats().await.unwrap().terminal_records;
    let runs = groups * phase.runs_per_group();
    assert_eq!(done, groups, "{}: every group must end ok", phase.name());
    assert_eq!(live, 0, "{}: no run may be left live", phase.name());
    assert_eq!(
        terminal,
        runs,
        "{}: one terminal record per run",
        phase.name()
    );
    Figures {
        groups,
        runs,
        elapsed_s: elapsed.as_secs_f64(),
        cpu_s,
        base_rss,
        peak_rss,
    }
}

/// One group of `phase`; whether every run of it ended well.
async fn group(phase: Phase, host: &Host, w1: &Agent, plain: &Agent, parent: &Agent) -> bool {
    let submit = |a| host.submit(a, Invocation::default());
    match phase {
        Phase::Pair => {
            let (Ok(a), Ok(b)) = (submit(w1).await, submit(w1).await) else {
                return false;
            };
            let (a, b) = futures_util::future::join(a.shared(), b.shared()).await;
            ok(&a) && ok(&b)
        }
        Phase::Trio => {
            let (Ok(p), Ok(a), Ok(b)) = (submit(plain).await, submit(w1).await, submit(w1).await)
            else {
                return false;
            };
            let (p, a, b) = futures_util::future::join3(p.shared(), a.shared(), b.shared()).await;
            ok(&p) && ok(&a) && ok(&b)
        }
        Phase::Tree => match submit(parent).await {
            Ok(p) => tree_ok(&*p.shared().await),
            Err(_) => false,
        },
    }
}

fn line(p: Phase, f: &Figures) {
    println!(
        "  {:<5} {:>8.0} groups/s {:>8.0} runs/s  {:>7.2} µs/group wall  {:>7.2} CPU µs/group  peak RSS {:>6.1} MiB (+{:.1} MiB over {:.1})  ({} runs, {:.2} s)",
        p.name(),
        f.groups as f64 / f.elapsed_s,
        f.runs as f64 / f.elapsed_s,
        f.wall_us_per_group(),
        f.cpu_us_per_group(),
        mib(f.peak_rss),
        mib(f.peak_rss.saturating_sub(f.base_rss)),
        mib(f.base_rss),
        f.runs,
        f.elapsed_s
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The manifests of a tree, in a directory of their own (a palette names
/// its children by file).
fn manifests() -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("agentvisor-bench-delegate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("worker.yaml"), W1_MANIFEST).unwrap();
    std::fs::write(dir.join("parent.yaml"), PARENT).unwrap();
    dir
}

fn main() {
    let trees: u64 = setting("DELEGATE", "trees", 10_000).max(1);
    let concurrency: u64 = setting("DELEGATE", "concurrency", 1000).max(1);
    let rounds: usize = setting("DELEGATE", "rounds", 3).max(1);
    println!(
        "bench delegate: trees={trees} ({} runs) concurrency={concurrency} groups rounds={rounds}; child = W1, latency 0",
        trees * 3
    );
    let dir = manifests();
    let rt = support::runtime();
    let mut per: Vec<[f64; 5]> = Vec::new();
    let mut tree_rps = Vec::new();
    let mut tree_peak = Vec::new();
    for round in 1..=rounds {
        println!("round {round}");
        let mut f = Vec::new();
        for p in [Phase::Pair, Phase::Trio, Phase::Tree] {
            let figures = rt.block_on(phase(p, trees, concurrency, &dir));
            line(p, &figures);
            f.push(figures);
        }
        let (pair, trio, tree) = (&f[0], &f[1], &f[2]);
        let wall = |g: &Figures| g.wall_us_per_group();
        let cpu = |g: &Figures| g.cpu_us_per_group();
        let r = [
            ratio(wall(tree), wall(pair)),
            ratio(wall(tree), wall(trio)),
            ratio(wall(tree) - wall(trio), wall(pair)),
            ratio(cpu(tree), cpu(trio)),
            ratio(cpu(tree) - cpu(trio), cpu(pair)),
        ];
        println!(
            "  per group, wall: tree/pair {:.2}x, tree/trio {:.2}x, delegation overhead (tree - trio) / pair {:.2}x; CPU: tree/trio {:.2}x, overhead / pair {:.2}x",
            r[0], r[1], r[2], r[3], r[4]
        );
        tree_rps.push(tree.runs as f64 / tree.elapsed_s);
        tree_peak.push(mib(tree.peak_rss));
        per.push(r);
    }
    let m = |i: usize| median(per.iter().map(|r| r[i]).collect());
    let (tree_rps, tree_peak) = (median(tree_rps), median(tree_peak));
    println!(
        "median of {rounds}: tree {:.0} runs/s, peak RSS {:.1} MiB; wall tree/pair {:.2}x, tree/trio {:.2}x, overhead/pair {:.2}x; CPU tree/trio {:.2}x, overhead/pair {:.2}x",
        tree_rps,
        tree_peak,
        m(0),
        m(1),
        m(2),
        m(3),
        m(4)
    );
    println!(
        "RESULT delegate {trees} trees ({} runs) all terminal; {:.0} runs/s; delegating to 2 children costs {:.2}x two plain runs beyond the same 3 runs submitted plainly (wall; CPU {:.2}x)",
        trees * 3,
        tree_rps,
        m(2),
        m(4)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
