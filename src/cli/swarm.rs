//! `agentvisor swarm FILE --runs N --concurrency C`: N runs of one manifest,
//! at most C in flight, with a progress bar on a terminal and a summary:
//! runs, statuses, runs/s, latency p50/p99, peak RSS. Exit 0 iff every run
//! ended `ok`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use agentvisor::soak::{mib, percentile_us, round3, LatencyHistogram};
use agentvisor::{Invocation, RunStatus};

/// Flags of `agentvisor swarm`.
#[derive(Args, Debug)]
pub(crate) struct SwarmArgs {
    /// The agent manifest (YAML).
    file: PathBuf,
    /// How many runs.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// How many in flight at once.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// The prompt of every run (default: the manifest's `prompt`).
    #[arg(long)]
    input: Option<String>,
    /// Run on this model instead of the manifest's (see `run --model`).
    #[arg(long, value_name = "SPEC")]
    model: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics while it runs.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

#[derive(Serialize)]
struct Summary {
    runs: u64,
    concurrency: u64,
    by_status: BTreeMap<String, u64>,
    elapsed_s: f64,
    runs_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    peak_rss_bytes: u64,
    peak_rss_mib: f64,
    audit_terminal_records: u64,
}

pub(crate) async fn swarm(a: SwarmArgs, db: &super::Db) -> ExitCode {
    let (host, agent) = match super::prepare(&a.file, None, db, a.model.clone()).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    let _metrics = match super::serve::metrics_endpoint(a.metrics_addr, &host).await {
        Ok(m) => m,
        Err(code) => return code,
    };
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::with_draw_target(Some(a.runs), ProgressDrawTarget::stderr_with_hz(4))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} runs  {per_sec}  eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let statuses: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let latency = Arc::new(LatencyHistogram::default());
    let prompt = a.input.clone().unwrap_or_default();
    let started = Instant::now();
    let workers = a.concurrency.min(a.runs);
    let mut tasks = Vec::with_capacity(workers as usize);
    for _ in 0..workers {
        let (host, agent, next, stop, statuses, bar, prompt, latency) = (
            host.clone(),
            agent.clone(),
            next.clone(),
            stop.clone(),
            statuses.clone(),
            bar.clone(),
            prompt.clone(),
            latency.clone(),
        );
        let total = a.runs;
        tasks.push(tokio::spawn(async move {
            let mut local: std::collections::HashMap<RunStatus, u64> =
                std::collections::HashMap::new();
            while !stop.load(Ordering::Relaxed) && next.fetch_add(1, Ordering::Relaxed) < total {
                let t0 = Instant::now();
                let inv = Invocation {
                    prompt: prompt.clone(),
                    caller_id: Some("swarm".into()),
                    ..Default::default()
                };
                let status = match host.submit(&agent, inv).await {
                    Ok(h) => h.shared().await.status,
                    Err(_) => RunStatus::Error,
                };
                latency.record(t0.elapsed().as_micros() as u64);
                *local.entry(status).or_default() += 1;
                bar.inc(1);
            }
            let mut g = statuses.lock().unwrap_or_else(|p| p.into_inner());
            for (s, n) in local {
                *g.entry(s.to_string()).or_default() += n;
            }
        }));
    }
    let ctrl_c = {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.store(true, Ordering::Relaxed);
            }
        })
    };
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    ctrl_c.abort();
    bar.finish_and_clear();
    let stats = host.shutdown().await;
    let counts = latency.counts();
    let pct = |p: f64| percentile_us(&counts, p) / 1000.0;
    let by_status = statuses.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let done = counts.iter().sum::<u64>();
    let peak = agentvisor::soak::sampler::peak_rss_bytes();
    let s = Summary {
        runs: done,
        concurrency: a.concurrency,
        by_status,
        elapsed_s: round3(elapsed),
        runs_per_sec: round3(done as f64 / elapsed.max(1e-9)),
        p50_ms: round3(pct(0.50)),
        p99_ms: round3(pct(0.99)),
        max_ms: round3(latency.max_us() as f64 / 1000.0),
        peak_rss_bytes: peak,
        peak_rss_mib: round3(mib(peak)),
        audit_terminal_records: stats.terminal_records,
    };
    if a.json {
        println!("{}", serde_json::to_string(&s).unwrap_or_default());
    } else {
        println!("runs:          {} (concurrency {})", s.runs, s.concurrency);
        for (k, v) in &s.by_status {
            println!("  {k:<13}{v}");
        }
        println!("elapsed:       {:.3} s", s.elapsed_s);
        println!("runs/s:        {:.0}", s.runs_per_sec);
        println!(
            "latency:       p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            s.p50_ms, s.p99_ms, s.max_ms
        );
        println!("peak RSS:      {:.1} MiB", s.peak_rss_mib);
        println!(
            "audit:         {} terminal records",
            s.audit_terminal_records
        );
    }
    let all_ok = done == a.runs && s.by_status.get("ok").copied().unwrap_or(0) == a.runs;
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
