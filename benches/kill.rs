//! Kill latency at 10 000 and 100 000 concurrent hanging runs, against its
//! floor.
//!
//! Run with: `cargo bench --bench kill` (settings: `-- --runs 10000,100000`
//! or `KILL_RUNS=10000,100000`).
//!
//! Settings (defaults): `runs` = `10000,100000` concurrent runs, each
//! hanging in its first model call (`hang: true`; stall and deadlines an
//! hour away, so only the kill ends them); `sample` = 1000 runs killed one
//! at a time, spread evenly over the population; `storm` = 1 (then kill
//! every remaining run at once; 0 skips it). Host: the default `HostConfig`
//! (one critic shard per CPU; critic, budget and audit on, stores in
//! memory); `audit-max-age-us` overrides how long a record may wait for its
//! audit batch (only while the audit writer is busy: an idle writer takes
//! the records at once). Global allocator: mimalloc, as the CLI.
//!
//! Kill latency is the time from `handle.kill()` to the run's terminal
//! result delivered through its handle — which the audit actor hands over
//! only once the batch holding the terminal record is written, so it spans
//! the critic's decision, the run's stop, and the terminal record. The
//! floor is the same population as plain tokio tasks, each running the
//! floor's loop hung in the same scripted model call
//! (`support::workload::Floor`), killed by `JoinHandle::abort` and timed
//! until awaiting its `JoinHandle` returns.
//!
//! - *one at a time*: the sample is killed one run after another, each
//!   awaited before the next, while the rest of the population stays alive:
//!   the latency of a kill on a host carrying that many runs. Issue 5's
//!   target: p99 < 5 ms at 100 000.
//! - *storm*: every remaining run is killed at once (one task per run
//!   kills its run and awaits it): the latency when all kills queue up.
//!
//! Printed: p50, p99, max for each, and the ratios agentvisor / floor.
//!
//! `harness = false`: a plain binary, because the bench measures agentvisor
//! and its floor in the same run and prints their ratio, which criterion and
//! divan do not do across benchmarks (nor percentiles over a population it
//! builds once), and it keeps bench frameworks out of CI's dependency build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::future::Future;
use std::time::{Duration, Instant};

use agentvisor::soak::sampler::rss_bytes;
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunHandle, RunStatus};
use support::workload::Floor;
use support::{ratio, setting, us, Summary};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const HANG: &str = r#"
name: hang
model: scripted
system: You wait.
prompt: Wait.
limits: { max_runtime: 1h, stall_timeout: 1h }
script:
  - { hang: true }
"#;

/// What one engine measured at one population.
struct Kills {
    populate: Duration,
    rss_per_run: f64,
    one_at_a_time: Summary,
    storm: Option<(Summary, Duration)>,
}

/// Which handles the sample kills: `sample` of `n`, evenly spread.
fn sample_indexes(n: usize, sample: usize) -> Vec<usize> {
    let sample = sample.min(n);
    (0..sample).map(|i| i * n / sample.max(1)).collect()
}

/// Kills the sample one at a time, then (if `storm`) the rest at once.
/// `kill` must kill its handle and return a future that ends when the
/// handle reports the end.
async fn measure<H, K, Fut>(
    mut handles: Vec<Option<H>>,
    sample: usize,
    storm: bool,
    kill: K,
) -> (Summary, Option<(Summary, Duration)>)
where
    H: Send + 'static,
    K: Fn(H) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let mut one = Vec::with_capacity(sample);
    for i in sample_indexes(handles.len(), sample) {
        let h = handles[i].take().unwrap();
        let t0 = Instant::now();
        kill(h).await;
        one.push(t0.elapsed());
    }
    let one = Summary::of(&mut one);
    if !storm {
        return (one, None);
    }
    let t0 = Instant::now();
    let tasks: Vec<_> = handles
        .into_iter()
        .flatten()
        .map(|h| {
            let kill = kill.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                kill(h).await;
                t.elapsed()
            })
        })
        .collect();
    let mut all = Vec::with_capacity(tasks.len());
    for t in tasks {
        all.push(t.await.unwrap());
    }
    let wall = t0.elapsed();
    (one, Some((Summary::of(&mut all), wall)))
}

async fn agentvisor(n: usize, sample: usize, storm: bool, config: HostConfig) -> Kills {
    let host = Host::builder().config(config).build().await.unwrap();
    let agent = host.agent(AgentSpec::from_yaml(HANG).unwrap()).unwrap();
    let rss0 = rss_bytes();
    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        handles.push(Some(
            host.submit(&agent, Invocation::default()).await.unwrap(),
        ));
    }
    let populate = t0.elapsed();
    // Let every run reach its hanging call.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_per_run = rss_bytes().saturating_sub(rss0) as f64 / n as f64;
    assert_eq!(host.live_runs(), n);
    let (one_at_a_time, storm) = measure(handles, sample, storm, |h: RunHandle| async move {
        h.kill();
        let r = h.await;
        assert_eq!(r.status, RunStatus::Killed, "{:?}", r.error);
    })
    .await;
    host.shutdown().await;
    Kills {
        populate,
        rss_per_run,
        one_at_a_time,
        storm,
    }
}

async fn floor(n: usize, sample: usize, storm: bool) -> Kills {
    let floor = Floor::new(&AgentSpec::from_yaml(HANG).unwrap()).unwrap();
    let rss0 = rss_bytes();
    let t0 = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let f = floor.clone();
            Some(tokio::spawn(async move { f.run_once().await }))
        })
        .collect();
    let populate = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_per_run = rss_bytes().saturating_sub(rss0) as f64 / n as f64;
    let (one_at_a_time, storm) = measure(
        handles,
        sample,
        storm,
        |h: tokio::task::JoinHandle<bool>| async move {
            h.abort();
            assert!(h.await.unwrap_err().is_cancelled());
        },
    )
    .await;
    Kills {
        populate,
        rss_per_run,
        one_at_a_time,
        storm,
    }
}

fn report(name: &str, k: &Kills) {
    println!(
        "  {name:<11} populated in {:.2} s (~{:.0} B RSS per hanging run)",
        k.populate.as_secs_f64(),
        k.rss_per_run
    );
    println!("    one at a time  {}", k.one_at_a_time.micros());
    if let Some((s, wall)) = &k.storm {
        println!(
            "    storm          {}  wall {:.3} s, {:.0} kills/s",
            s.micros(),
            wall.as_secs_f64(),
            s.count as f64 / wall.as_secs_f64()
        );
    }
}

fn main() {
    let populations = support::list_setting("KILL", "runs", "10000,100000");
    let sample: usize = setting("KILL", "sample", 1000);
    let storm: u8 = setting("KILL", "storm", 1);
    let storm = storm != 0;
    let defaults = HostConfig::default();
    let config = HostConfig {
        audit_max_age: Duration::from_micros(setting(
            "KILL",
            "audit-max-age-us",
            defaults.audit_max_age.as_micros() as u64,
        )),
        ..defaults
    };
    println!(
        "bench kill: runs={populations:?} sample={sample} storm={storm} audit_max_age={:?}",
        config.audit_max_age
    );
    let rt = support::runtime();
    for n in populations {
        let n = n as usize;
        let config = config.clone();
        let (fl, av) = rt
            .block_on(rt.spawn(async move {
                let fl = floor(n, sample, storm).await;
                let av = agentvisor(n, sample, storm, config).await;
                (fl, av)
            }))
            .unwrap();
        println!("{n} concurrent hanging runs");
        report("floor", &fl);
        report("agentvisor", &av);
        let (a, f) = (&av.one_at_a_time, &fl.one_at_a_time);
        if a.count > 0 {
            println!(
            "RESULT kill n={n} one at a time: agentvisor p50 {:.2} ms p99 {:.2} ms (target p99 < 5 ms: {}); agentvisor/floor p50 {:.0}x p99 {:.0}x",
            us(a.p50) / 1e3,
            us(a.p99) / 1e3,
            if a.p99 < Duration::from_millis(5) { "met" } else { "NOT met" },
            ratio(us(a.p50), us(f.p50)),
            ratio(us(a.p99), us(f.p99)),
        );
        }
        if let (Some((a, aw)), Some((f, fw))) = (&av.storm, &fl.storm) {
            println!(
                "RESULT kill n={n} storm: agentvisor p50 {:.2} ms p99 {:.2} ms, {:.0} kills/s; agentvisor/floor p99 {:.0}x, wall {:.0}x",
                us(a.p50) / 1e3,
                us(a.p99) / 1e3,
                a.count as f64 / aw.as_secs_f64(),
                ratio(us(a.p99), us(f.p99)),
                ratio(aw.as_secs_f64(), fw.as_secs_f64()),
            );
        }
    }
}
