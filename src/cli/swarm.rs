//! `agentvisor swarm FILE --runs N --concurrency C`: N runs of one manifest,
//! at most C in flight, with a progress bar on a terminal and a summary:
//! runs, statuses, runs/s, latency p50/p99, peak RSS. Exit 0 iff every run
//! ended `ok` and is on record.
//!
//! The statuses are what the callers were told. A run whose terminal
//! record reached neither the database nor the spool (both on a full disk,
//! say) is also counted as `unrecorded` (by status, `--json` too), and the
//! exit message says how many: the database's `runs list` lacks exactly
//! those.
//!
//! SIGTERM, SIGHUP and Ctrl-C stop admitting runs and give those in flight
//! `--drain` (default 10 s) to finish; then what still runs is cancelled,
//! every record is written, the summary printed, and the exit code is 143,
//! 129 or 130. A second signal cancels at once (see `signals`).

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

use super::signals::{Caught, Signals};

/// The most runs one swarm makes.
const MAX_RUNS: u64 = 1_000_000_000;
/// The most runs one swarm keeps in flight.
pub(super) const MAX_CONCURRENCY: u64 = 1_000_000;

/// Flags of `agentvisor swarm`.
#[derive(Args, Debug)]
pub(crate) struct SwarmArgs {
    /// What the database keeps (`--retain`).
    #[command(flatten)]
    pub(crate) keep: super::keep::KeepArgs,
    /// The agent manifest (YAML).
    file: PathBuf,
    /// How many runs (1 to 1000000000).
    #[arg(long, value_name = "N", default_value_t = 1000, allow_hyphen_values = true, value_parser = super::flags::whole(1, MAX_RUNS))]
    runs: u64,
    /// How many in flight at once (1 to 1000000).
    #[arg(long, value_name = "C", default_value_t = 100, allow_hyphen_values = true, value_parser = super::flags::whole(1, MAX_CONCURRENCY))]
    concurrency: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// A token budget for all of this swarm's runs together (at least 1):
    /// on top of the manifest's `budget` (each run's) and the caller's
    /// stored limits; the tightest wins.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = super::flags::whole(1, u64::MAX))]
    budget_tokens: Option<u64>,
    /// Named inputs of every run as a JSON object (see `run --inputs`).
    #[arg(long, value_name = "JSON")]
    inputs: Option<String>,
    /// The prompt of every run (default: the manifest's `prompt`); `-`
    /// reads it from stdin.
    #[arg(long, allow_hyphen_values = true)]
    input: Option<String>,
    /// After SIGTERM, SIGHUP or Ctrl-C, how long runs in flight may go on
    /// before they are cancelled (default 10s).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = super::signals::drain_flag)]
    drain: Option<std::time::Duration>,
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
    /// Runs whose terminal records reached neither the database nor the
    /// spool (counted in `by_status` too).
    unrecorded: u64,
    /// Those runs by the status their callers were told.
    unrecorded_by_status: BTreeMap<String, u64>,
}

pub(crate) async fn swarm(mut a: SwarmArgs, db: &super::Db) -> ExitCode {
    let mut signals = match Signals::listen() {
        Ok(s) => s,
        Err(e) => return super::refuse(format!("cannot listen for signals: {e}")),
    };
    a.input = match super::input_text(a.input.take()) {
        Ok(i) => i,
        Err(code) => return code,
    };
    let inputs = match super::inputs_flag(a.inputs.as_deref()) {
        Ok(i) => i,
        Err(code) => return code,
    };
    let (host, agent) = match super::prepare(&a.file, a.budget_tokens, db, a.model.clone()).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    if let Err(e) = agent.spec().check_inputs(&inputs) {
        host.shutdown().await;
        return super::refuse(format!("{}: {e}", a.file.display()));
    }
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
    let announced = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let statuses: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let latency = Arc::new(LatencyHistogram::default());
    let prompt = a.input.clone().unwrap_or_default();
    let started = Instant::now();
    let workers = a.concurrency.min(a.runs);
    let mut tasks = Vec::with_capacity(workers as usize);
    for _ in 0..workers {
        let inputs = inputs.clone();
        let announced = announced.clone();
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
                    inputs: inputs.clone(),
                    caller_id: Some("swarm".into()),
                    ..Default::default()
                };
                // Boxed: the submission's future is held only until the
                // run starts, while the worker waits on the run for its
                // whole life; inline, its room would be part of every
                // worker's task.
                let status = match Box::pin(host.submit(&agent, inv)).await {
                    Ok(h) => {
                        if !announced.swap(true, Ordering::Relaxed) {
                            tracing::info!("swarm: runs in flight");
                        }
                        h.shared().await.status
                    }
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
    // The workers end when every run is done, or once `stop` is set and
    // their runs in flight ended (finished, or cancelled by the shutdown).
    let mut joined = std::pin::pin!(futures_util::future::join_all(tasks));
    let drain = a.drain.unwrap_or(super::signals::DEFAULT_DRAIN);
    let mut caught: Option<Caught> = None;
    let mut drain_until: Option<tokio::time::Instant> = None;
    let mut shutting: Option<tokio::task::JoinHandle<agentvisor::ports::audit::AuditStats>> = None;
    let cancel_now = |shutting: &mut Option<_>| {
        if shutting.is_none() {
            let host = host.clone();
            *shutting = Some(tokio::spawn(async move { host.shutdown().await }));
        }
    };
    let finished = loop {
        tokio::select! {
            done = &mut joined => break done,
            s = signals.next() => {
                if caught.is_none() {
                    caught = Some(s);
                    stop.store(true, Ordering::Relaxed);
                    errln!(
                        "{}: no new runs; runs in flight may finish within {}, then they are cancelled",
                        s.name(),
                        agentvisor::spec::format_duration(drain)
                    );
                    drain_until = Some(tokio::time::Instant::now() + drain);
                } else {
                    drain_until = None;
                    cancel_now(&mut shutting);
                }
            }
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now)), if drain_until.is_some() => {
                drain_until = None;
                cancel_now(&mut shutting);
            }
        }
    };
    drop(finished);
    let elapsed = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let stats = match shutting {
        Some(t) => t.await.unwrap_or_default(),
        None => host.shutdown().await,
    };
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
        unrecorded: stats.unrecorded.total(),
        unrecorded_by_status: stats
            .unrecorded
            .by_status()
            .map(|(s, n)| (s.to_string(), n))
            .collect(),
    };
    if a.json {
        outln!("{}", serde_json::to_string(&s).unwrap_or_default());
    } else {
        outln!("runs:          {} (concurrency {})", s.runs, s.concurrency);
        for (k, v) in &s.by_status {
            outln!("  {k:<13}{v}");
        }
        outln!("elapsed:       {:.3} s", s.elapsed_s);
        outln!("runs/s:        {:.0}", s.runs_per_sec);
        outln!(
            "latency:       p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            s.p50_ms,
            s.p99_ms,
            s.max_ms
        );
        outln!("peak RSS:      {:.1} MiB", s.peak_rss_mib);
        outln!(
            "audit:         {} terminal records",
            s.audit_terminal_records
        );
        if s.unrecorded > 0 {
            outln!("unrecorded:    {}: recorded nowhere", stats.unrecorded);
        }
    }
    let lost = super::report_unwritten(&host, &stats);
    let all_ok = done == a.runs && s.by_status.get("ok").copied().unwrap_or(0) == a.runs;
    if let Some(s) = caught {
        ExitCode::from(s.exit_code())
    } else if all_ok && !lost {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
