//! `agentvisor soak FILE --duration D --concurrency C [--chaos RATE]
//! [--seed N] [--report DIR] [--json]`: keeps C runs of one manifest in
//! flight for D (as each run ends the next starts), then stops starting runs
//! and drains; samples the process every second; prints a verdict and exits
//! 0 iff it passes.
//!
//! # Samples (one a second)
//! Runs completed in that second (runs/s) and their latency p50/p99 (submit
//! to result, from a log-bucketed histogram: within 1.6 %), RSS (`VmRSS`),
//! open file descriptors (`/proc/self/fd`), runs alive
//! ([`Host::live_runs`]), live actors, CPU % (of one core) and the statuses
//! so far. Live actors are counted, not listed: a run is exactly one actor
//! (hosted on a critic shard; its model and tool calls are tasks it holds,
//! not actors), and a host has a fixed root, audit, budget and one critic
//! per shard; so live actors = runs alive + 3 + shards.
//!
//! # Chaos
//! `--chaos RATE` wraps the manifest's scripted model in a
//! [`ChaosModel`]: each model call, with probability RATE, is slow (a fifth
//! of the stall timeout, at most 1 s), hangs, fails with a 429, or answers
//! with a tool call whose arguments are not JSON. The draws are seeded
//! (`--seed`), so a soak's faults are reproducible.
//!
//! # Verdict
//! - **RSS slope**: least squares over the samples after warm-up (the first
//!   20 % of the duration or 30 s, whichever is smaller) up to the end of
//!   the duration (the drain is not judged), in % of their mean RSS per
//!   minute; passes under 1 %/min. With fewer than two such samples it is
//!   not judged (and passes).
//! - **Statuses**: every status must be explained by the chaos injected:
//!   `ok` always; `killed/stalled` by hangs (a hung call ends its run that
//!   way: at most one per hang); `error/rate_limited` by 429s (at most one
//!   per 429; fewer when a retry layer absorbs them); `error/tool_errors`
//!   by malformed tool calls (`max_tool_errors` in a row each);
//!   `error/max_iterations` by malformed tool calls (each adds a model
//!   call). Without chaos, only `ok`. Anything else, or more of a status
//!   than its cause allows, is unexplained.
//! - **Terminal records**: after [`Host::shutdown`] has drained the audit
//!   actor, the store's count of terminal records equals the runs
//!   submitted, and every submitted run's handle gave a result. The SQLite
//!   store counts the terminal rows it inserted (a duplicate is ignored,
//!   never counted); the in-memory store counts every terminal record
//!   appended (a duplicate would show as one too many).
//!
//! # Memory
//! The in-memory audit store (`--db :memory:`) keeps a bounded window of
//! the latest records (32 768) and counts every record ever written; at
//! soak rates (about 13 records a run) the window is full within seconds,
//! inside the warm-up, so it sets the RSS plateau, not its slope. RSS also
//! steps up when the load steps up (more runs alive at once) and the
//! allocator keeps those pages for reuse: judge the slope on soaks of
//! several minutes, where such a step weighs little.
//!
//! # Report
//! `--report DIR` writes `DIR/report.json` (settings, the series, the
//! summary, the verdict) and `DIR/soak.svg` (the series over time, one
//! panel each). `--json` prints the report without the series.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};

use agentvisor::ports::audit::AuditStats;
use agentvisor::providers::chaos::{ChaosConfig, ChaosCounts, ChaosModel};
use agentvisor::providers::ScriptedModel;
use agentvisor::workload::{cpu_seconds, peak_rss_bytes, rss_bytes};
use agentvisor::{Agent, Host, Invocation, LimitsSpec, RunResult, RunStatus};

/// The RSS slope a soak may show after warm-up, in % per minute.
const RSS_SLOPE_LIMIT_PCT_PER_MIN: f64 = 1.0;

/// Actors a host runs besides its runs and critic shards: the root, audit
/// and budget.
const FIXED_ACTORS: usize = 3;

/// The caller id of every soak run.
const CALLER: &str = "soak";

/// Flags of `agentvisor soak`.
#[derive(Args, Debug)]
pub(crate) struct SoakArgs {
    /// The agent manifest (YAML).
    file: PathBuf,
    /// How long to keep starting runs (`30s`, `10m`, `1h`).
    #[arg(long, default_value = "1m", value_parser = parse_positive_duration)]
    duration: Duration,
    /// How many runs in flight at once.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// Inject faults into this fraction of model calls (0 to 1): slow calls,
    /// hangs, 429s, malformed tool arguments. Needs `model: scripted`.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    chaos: Option<f64>,
    /// The seed of the chaos draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write `report.json` and `soak.svg` into this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Print the report (without the series) as one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = agentvisor::spec::parse_duration(s)?;
    if d.is_zero() {
        return Err("the duration must be more than 0".into());
    }
    Ok(d)
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "the chaos rate must be a number from 0 to 1 (e.g. 0.05), not `{s}`"
        )),
    }
}

/// What the soak was asked to do.
#[derive(Serialize)]
struct Settings {
    file: String,
    agent: String,
    model: String,
    duration_s: f64,
    concurrency: u64,
    chaos_rate: Option<f64>,
    seed: u64,
    slow_ms: Option<u64>,
    stall_timeout_ms: u64,
    db: String,
    critic_shards: usize,
}

/// One second of the soak.
#[derive(Clone, Debug, Serialize)]
struct Sample {
    /// Seconds since the first run started.
    t_s: f64,
    /// `run` while runs are started, `drain` after.
    phase: &'static str,
    /// Runs completed in this interval.
    completed: u64,
    runs_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    rss_bytes: u64,
    rss_mib: f64,
    open_fds: u64,
    live_runs: usize,
    live_actors: usize,
    /// CPU time over wall time in this interval (100 = one core).
    cpu_pct: f64,
    /// Statuses so far (cumulative).
    statuses: BTreeMap<String, u64>,
}

/// The whole soak, summed up.
#[derive(Serialize)]
struct Summary {
    runs_submitted: u64,
    runs_finished: u64,
    submit_errors: u64,
    /// Seconds runs were started for.
    elapsed_s: f64,
    /// Seconds from the last start to the last result.
    drain_s: f64,
    /// The drain did not end in time: what still ran was cancelled.
    drain_timed_out: bool,
    runs_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    peak_rss_bytes: u64,
    peak_rss_mib: f64,
    by_status: BTreeMap<String, u64>,
    chaos: Option<ChaosCounts>,
    audit: AuditStats,
}

/// The RSS part of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
struct RssVerdict {
    warmup_s: f64,
    /// Samples judged (after warm-up, up to the end of the duration).
    samples: usize,
    mean_rss_mib: f64,
    slope_mib_per_min: f64,
    slope_pct_per_min: f64,
    limit_pct_per_min: f64,
    pass: bool,
}

/// The statuses part of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
struct StatusVerdict {
    /// Each non-`ok` status seen: what explains it and how many it allows.
    explained: Vec<Explained>,
    /// Runs per status that nothing explains (an unknown status, or more
    /// than its cause allows).
    unexplained: BTreeMap<String, u64>,
    pass: bool,
}

/// One status the chaos may explain.
#[derive(Clone, Debug, PartialEq, Serialize)]
struct Explained {
    status: String,
    runs: u64,
    cause: &'static str,
    allowed: u64,
}

/// The terminal-records part of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
struct TerminalVerdict {
    runs_submitted: u64,
    results: u64,
    terminal_records: u64,
    pass: bool,
}

#[derive(Serialize)]
struct Verdict {
    pass: bool,
    rss: RssVerdict,
    statuses: StatusVerdict,
    terminal: TerminalVerdict,
}

#[derive(Serialize)]
struct Report {
    settings: Settings,
    #[serde(skip_serializing_if = "Option::is_none")]
    series: Option<Vec<Sample>>,
    summary: Summary,
    verdict: Verdict,
}

pub(crate) async fn soak(a: SoakArgs, db: &super::Db) -> ExitCode {
    if let Some(dir) = &a.report {
        if let Err(e) = std::fs::create_dir_all(dir) {
            return super::refuse(format!(
                "cannot create the report directory {}: {e}",
                dir.display()
            ));
        }
    }
    let mut chaos: Option<Arc<ChaosModel>> = None;
    let wrap = |spec: &agentvisor::AgentSpec, builder: agentvisor::HostBuilder| {
        let Some(rate) = a.chaos else {
            return Ok(builder);
        };
        if spec.model != "scripted" {
            return Err(super::refuse(format!(
                "--chaos wraps the scripted model; {} uses model `{}`",
                a.file.display(),
                spec.model
            )));
        }
        let limits = spec.limits.resolve(&LimitsSpec::default());
        let config = ChaosConfig {
            rate,
            seed: a.seed,
            slow: slow_delay(limits.stall_timeout),
        };
        let inner = Arc::new(ScriptedModel::new(spec.script.clone()));
        let model = Arc::new(ChaosModel::new(inner, config).map_err(super::refuse)?);
        chaos = Some(model.clone());
        Ok(builder.model(spec.model.clone(), model))
    };
    let (host, agent) = match super::prepare_with(&a.file, None, db, wrap).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    let limits = *agent.limits();
    let settings = Settings {
        file: a.file.display().to_string(),
        agent: agent.name().to_string(),
        model: agent.model().name().to_string(),
        duration_s: a.duration.as_secs_f64(),
        concurrency: a.concurrency,
        chaos_rate: a.chaos,
        seed: a.seed,
        slow_ms: a
            .chaos
            .map(|_| slow_delay(limits.stall_timeout).as_millis() as u64),
        stall_timeout_ms: limits.stall_timeout.as_millis() as u64,
        db: match db {
            super::Db::Memory => ":memory:".to_string(),
            super::Db::File(p) => p.display().to_string(),
        },
        critic_shards: host.config().critic_shards,
    };
    // A run ends by its hard deadline at the latest (extensions and the
    // kill grace included); a drain longer than that is a failure.
    let drain_limit = limits.hard_timeout
        + limits.extension * limits.max_extensions
        + limits.kill_grace
        + Duration::from_secs(5);

    let run = Soak::start(&host, &agent, a.concurrency, a.duration);
    let bar = progress_bar(a.duration);
    let sampled = run
        .sample(&host, &settings, a.duration + drain_limit, &bar)
        .await;
    bar.finish_and_clear();
    run.ctrl_c.abort();
    let audit = host.shutdown().await;
    for w in run.workers {
        let _ = w.await;
    }
    let drain_end = Instant::now();

    let t = &run.tally;
    let by_status = t.statuses();
    let chaos_counts = chaos.as_ref().map(|c| c.counts());
    let runs_submitted = t.submitted.load(Ordering::Relaxed);
    let runs_finished = t.finished.load(Ordering::Relaxed);
    let total = &sampled.latency_total;
    let elapsed = a.duration.as_secs_f64().min(sampled.end_of_starts);
    let peak = peak_rss_bytes().max(
        sampled
            .series
            .iter()
            .map(|s| s.rss_bytes)
            .max()
            .unwrap_or(0),
    );
    let summary = Summary {
        runs_submitted,
        runs_finished,
        submit_errors: t.submit_errors.load(Ordering::Relaxed),
        elapsed_s: round3(elapsed),
        drain_s: round3((drain_end - run.started).as_secs_f64() - elapsed),
        drain_timed_out: sampled.drain_timed_out,
        runs_per_sec: round3(runs_finished as f64 / elapsed.max(1e-9)),
        p50_ms: round3(percentile_us(total, 0.50) / 1000.0),
        p99_ms: round3(percentile_us(total, 0.99) / 1000.0),
        max_ms: round3(t.latency.max_us() as f64 / 1000.0),
        peak_rss_bytes: peak,
        peak_rss_mib: round3(mib(peak)),
        by_status: by_status.clone(),
        chaos: chaos_counts,
        audit,
    };
    let points: Vec<(f64, u64)> = sampled
        .series
        .iter()
        .map(|s| (s.t_s, s.rss_bytes))
        .collect();
    let rss = rss_verdict(&points, a.duration.as_secs_f64());
    let statuses = explain_statuses(&by_status, chaos_counts, limits.max_tool_errors);
    let terminal = TerminalVerdict {
        runs_submitted,
        results: runs_finished,
        terminal_records: audit.terminal_records,
        pass: runs_finished == runs_submitted && audit.terminal_records == runs_submitted,
    };
    let verdict = Verdict {
        pass: rss.pass && statuses.pass && terminal.pass && summary.submit_errors == 0,
        rss,
        statuses,
        terminal,
    };
    let mut report = Report {
        settings,
        series: Some(sampled.series),
        summary,
        verdict,
    };
    let mut code = if report.verdict.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    if let Some(dir) = &a.report {
        if let Err(e) = write_report(dir, &report) {
            eprintln!("error: cannot write the report to {}: {e}", dir.display());
            code = ExitCode::from(1);
        }
    }
    if a.json {
        report.series = None;
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        print_report(&report);
    }
    code
}

/// How long a chaos-slow call waits: well under the stall timeout.
fn slow_delay(stall_timeout: Duration) -> Duration {
    (stall_timeout / 5).min(Duration::from_secs(1))
}

fn progress_bar(duration: Duration) -> ProgressBar {
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::with_draw_target(
            Some(duration.as_secs().max(1)),
            ProgressDrawTarget::stderr_with_hz(4),
        )
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} s  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Counts the workers share with the sampler.
#[derive(Default)]
struct Tally {
    submitted: AtomicU64,
    finished: AtomicU64,
    submit_errors: AtomicU64,
    latency: LatencyHistogram,
    statuses: Mutex<BTreeMap<String, u64>>,
    /// Stop starting runs (Ctrl-C).
    stop: AtomicBool,
    workers_left: AtomicUsize,
    workers_done: Notify,
}

impl Tally {
    fn record(&self, result: &RunResult, latency: Duration) {
        self.latency.record(latency.as_micros() as u64);
        let key = status_key(result);
        {
            let mut g = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
            match g.get_mut(key.as_str()) {
                Some(n) => *n += 1,
                None => {
                    g.insert(key, 1);
                }
            }
        }
        self.finished.fetch_add(1, Ordering::Relaxed);
    }

    fn statuses(&self) -> BTreeMap<String, u64> {
        self.statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Tells the sampler when the last worker has ended (even by a panic).
struct WorkerGuard(Arc<Tally>);

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        if self.0.workers_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.workers_done.notify_one();
        }
    }
}

/// A soak in progress: its workers and what they count.
struct Soak {
    tally: Arc<Tally>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    /// Waits for Ctrl-C (aborted when the soak ends).
    ctrl_c: tokio::task::JoinHandle<()>,
    started: Instant,
    end: Instant,
}

/// What the sampler saw.
struct Sampled {
    series: Vec<Sample>,
    latency_total: Vec<u64>,
    /// Seconds from the start until runs stopped being started.
    end_of_starts: f64,
    drain_timed_out: bool,
}

impl Soak {
    /// Starts `concurrency` workers, each starting the next run as soon as
    /// its last one ended, until `duration` has passed (or Ctrl-C).
    fn start(host: &Host, agent: &Agent, concurrency: u64, duration: Duration) -> Soak {
        let tally = Arc::new(Tally::default());
        tally
            .workers_left
            .store(concurrency as usize, Ordering::Release);
        let started = Instant::now();
        let end = started + duration;
        let workers = (0..concurrency)
            .map(|_| {
                let (host, agent, tally) = (host.clone(), agent.clone(), tally.clone());
                tokio::spawn(async move {
                    let _guard = WorkerGuard(tally.clone());
                    while Instant::now() < end && !tally.stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        let inv = Invocation {
                            caller_id: Some(CALLER.into()),
                            ..Default::default()
                        };
                        match host.submit(&agent, inv).await {
                            Ok(handle) => {
                                tally.submitted.fetch_add(1, Ordering::Relaxed);
                                let result = handle.shared().await;
                                tally.record(&result, t0.elapsed());
                            }
                            Err(_) => {
                                tally.submit_errors.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                })
            })
            .collect();
        let stop = tally.clone();
        let ctrl_c = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.stop.store(true, Ordering::Relaxed);
            }
        });
        Soak {
            tally,
            workers,
            ctrl_c,
            started,
            end,
        }
    }

    /// Samples every second until every worker has ended, or until
    /// `give_up` after the start (the caller's shutdown then cancels what
    /// still runs).
    async fn sample(
        &self,
        host: &Host,
        settings: &Settings,
        give_up: Duration,
        bar: &ProgressBar,
    ) -> Sampled {
        let t = &self.tally;
        let fixed_actors = FIXED_ACTORS + settings.critic_shards;
        let mut ticker = tokio::time::interval_at(
            self.started + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut series = Vec::new();
        let mut latency_total = vec![0u64; BUCKETS];
        let (mut last_at, mut last_finished, mut last_cpu) = (self.started, 0u64, cpu_seconds());
        let mut end_of_starts = None;
        let mut drain_timed_out = false;
        loop {
            let done = tokio::select! {
                _ = ticker.tick() => false,
                _ = t.workers_done.notified() => true,
            };
            let now = Instant::now();
            let dt = (now - last_at).as_secs_f64().max(1e-3);
            let finished = t.finished.load(Ordering::Relaxed);
            let cpu = cpu_seconds();
            let counts = t.latency.take();
            for (total, n) in latency_total.iter_mut().zip(&counts) {
                *total += n;
            }
            let elapsed = (now - self.started).as_secs_f64();
            let running = now < self.end && !t.stop.load(Ordering::Relaxed);
            if !running && end_of_starts.is_none() {
                end_of_starts = Some(elapsed.min((self.end - self.started).as_secs_f64()));
            }
            let live = host.live_runs();
            let rss = rss_bytes();
            let sample = Sample {
                t_s: round3(elapsed),
                phase: if running || elapsed <= settings.duration_s + 0.05 {
                    "run"
                } else {
                    "drain"
                },
                completed: finished - last_finished,
                runs_per_sec: round3((finished - last_finished) as f64 / dt),
                p50_ms: round3(percentile_us(&counts, 0.50) / 1000.0),
                p99_ms: round3(percentile_us(&counts, 0.99) / 1000.0),
                rss_bytes: rss,
                rss_mib: round3(mib(rss)),
                open_fds: open_fds(),
                live_runs: live,
                live_actors: live + fixed_actors,
                cpu_pct: round3((cpu - last_cpu) / dt * 100.0),
                statuses: t.statuses(),
            };
            bar.set_position(elapsed.min(settings.duration_s) as u64);
            bar.set_message(format!(
                "{}{:.0} runs/s  p99 {:.0} ms  {} live  RSS {:.0} MiB  {} fds",
                if running { "" } else { "draining: " },
                sample.runs_per_sec,
                sample.p99_ms,
                live,
                sample.rss_mib,
                sample.open_fds
            ));
            series.push(sample);
            (last_at, last_finished, last_cpu) = (now, finished, cpu);
            if done {
                break;
            }
            if now - self.started > give_up {
                drain_timed_out = true;
                break;
            }
        }
        Sampled {
            series,
            latency_total,
            end_of_starts: end_of_starts.unwrap_or(settings.duration_s),
            drain_timed_out,
        }
    }
}

/// `ok`, or the status and why: `killed/stalled`, `error/rate_limited`.
fn status_key(r: &RunResult) -> String {
    if r.status == RunStatus::Ok {
        return "ok".to_string();
    }
    match (r.kill_reason, &r.error_kind) {
        (Some(k), _) => format!("{}/{}", r.status, k.as_str()),
        (None, Some(kind)) => format!("{}/{kind}", r.status),
        (None, None) => r.status.to_string(),
    }
}

/// Judges the statuses against the faults injected (see the module doc).
fn explain_statuses(
    by_status: &BTreeMap<String, u64>,
    injected: Option<ChaosCounts>,
    max_tool_errors: u32,
) -> StatusVerdict {
    let c = injected.unwrap_or_default();
    let mut explained = Vec::new();
    let mut unexplained = BTreeMap::new();
    for (status, &runs) in by_status {
        let cause = match status.as_str() {
            "ok" => continue,
            "killed/stalled" => Some(("hang", c.hang)),
            "error/rate_limited" => Some(("rate_limited", c.rate_limited)),
            "error/tool_errors" => Some((
                "malformed (max_tool_errors in a row)",
                c.malformed / u64::from(max_tool_errors.max(1)),
            )),
            "error/max_iterations" => Some(("malformed", c.malformed)),
            _ => None,
        };
        match cause {
            Some((cause, allowed)) => {
                if runs > allowed {
                    unexplained.insert(status.clone(), runs - allowed);
                }
                explained.push(Explained {
                    status: status.clone(),
                    runs,
                    cause,
                    allowed,
                });
            }
            None => {
                unexplained.insert(status.clone(), runs);
            }
        }
    }
    StatusVerdict {
        pass: unexplained.is_empty(),
        explained,
        unexplained,
    }
}

/// The RSS slope after warm-up (see the module doc). `samples` are
/// `(seconds since start, RSS bytes)`.
fn rss_verdict(samples: &[(f64, u64)], duration_s: f64) -> RssVerdict {
    let warmup_s = (0.2 * duration_s).min(30.0);
    let judged: Vec<(f64, f64)> = samples
        .iter()
        .filter(|(t, _)| *t >= warmup_s && *t <= duration_s + 0.5)
        .map(|&(t, r)| (t, r as f64))
        .collect();
    let n = judged.len() as f64;
    let mean_t = judged.iter().map(|p| p.0).sum::<f64>() / n.max(1.0);
    let mean_r = judged.iter().map(|p| p.1).sum::<f64>() / n.max(1.0);
    let sxx: f64 = judged.iter().map(|p| (p.0 - mean_t).powi(2)).sum();
    let sxy: f64 = judged.iter().map(|p| (p.0 - mean_t) * (p.1 - mean_r)).sum();
    // Bytes per second.
    let slope = if judged.len() >= 2 && sxx > 0.0 {
        sxy / sxx
    } else {
        0.0
    };
    let pct = if mean_r > 0.0 {
        slope * 60.0 / mean_r * 100.0
    } else {
        0.0
    };
    RssVerdict {
        warmup_s: round3(warmup_s),
        samples: judged.len(),
        mean_rss_mib: round3(mib(mean_r as u64)),
        slope_mib_per_min: round3(slope * 60.0 / (1024.0 * 1024.0)),
        slope_pct_per_min: (pct * 1e4).round() / 1e4,
        limit_pct_per_min: RSS_SLOPE_LIMIT_PCT_PER_MIN,
        pass: pct < RSS_SLOPE_LIMIT_PCT_PER_MIN,
    }
}

/// Open file descriptors of this process (0 without `/proc`).
fn open_fds() -> u64 {
    // The directory handle itself is one of the entries.
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1) as u64)
        .unwrap_or(0)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

// ---- Latency histogram ----------------------------------------------------

/// Sub-buckets per power of two: 2^5 = 32, so a bucket is at most 1/32 of
/// its value wide (reported at its middle: within 1.6 %).
const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
/// The largest power of two tracked (2^40 µs is 12 days).
const MAX_EXP: u32 = 40;
const BUCKETS: usize = SUB + (MAX_EXP - SUB_BITS + 1) as usize * SUB;

/// Latencies in µs, counted in log-linear buckets: fixed memory however
/// long the soak, lock-free to record.
struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    max: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    fn record(&self, us: u64) {
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(us, Ordering::Relaxed);
    }

    /// The counts since the last take, and resets them.
    fn take(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.swap(0, Ordering::Relaxed))
            .collect()
    }

    fn max_us(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }
}

fn bucket_of(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros();
    if exp > MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (us >> (exp - SUB_BITS)) as usize & (SUB - 1);
    SUB + (exp - SUB_BITS) as usize * SUB + sub
}

/// The middle of a bucket, in µs.
fn bucket_value(i: usize) -> f64 {
    if i < SUB {
        return i as f64;
    }
    let shift = ((i - SUB) / SUB) as u32;
    let sub = ((i - SUB) % SUB) as u64;
    let low = (SUB as u64 + sub) << shift;
    low as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
}

/// The `p` quantile (0..=1) of histogram counts, in µs (0 when empty).
fn percentile_us(counts: &[u64], p: f64) -> f64 {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return 0.0;
    }
    let rank = ((p * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_value(i);
        }
    }
    0.0
}

// ---- Output -----------------------------------------------------------------

fn print_report(r: &Report) {
    let (s, m, v) = (&r.settings, &r.summary, &r.verdict);
    let mark = |pass: bool| if pass { "pass" } else { "FAIL" };
    let chaos = match s.chaos_rate {
        Some(rate) => format!(", chaos {rate} (seed {})", s.seed),
        None => String::new(),
    };
    println!(
        "soak:          {} for {} s, concurrency {}{chaos}",
        s.file, s.duration_s, s.concurrency
    );
    println!(
        "runs:          {} submitted, {} finished, {:.0} runs/s; drain {:.1} s{}",
        m.runs_submitted,
        m.runs_finished,
        m.runs_per_sec,
        m.drain_s,
        if m.drain_timed_out {
            " (timed out)"
        } else {
            ""
        }
    );
    for (k, n) in &m.by_status {
        println!("  {k:<22}{n}");
    }
    println!(
        "latency:       p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        m.p50_ms, m.p99_ms, m.max_ms
    );
    if let Some(c) = &m.chaos {
        println!(
            "chaos:         {} calls: {} slow, {} hang, {} rate_limited, {} malformed",
            c.calls, c.slow, c.hang, c.rate_limited, c.malformed
        );
    }
    println!(
        "RSS:           peak {:.1} MiB; slope {:+.3} %/min ({:+.2} MiB/min) over {} samples after {:.1} s warm-up [{}]",
        m.peak_rss_mib,
        v.rss.slope_pct_per_min,
        v.rss.slope_mib_per_min,
        v.rss.samples,
        v.rss.warmup_s,
        mark(v.rss.pass)
    );
    if v.statuses.unexplained.is_empty() {
        println!(
            "statuses:      every status explained [{}]",
            mark(v.statuses.pass)
        );
    } else {
        let list: Vec<String> = v
            .statuses
            .unexplained
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        println!(
            "statuses:      unexplained: {} [{}]",
            list.join(", "),
            mark(false)
        );
    }
    println!(
        "terminal:      {} records for {} runs ({} results) [{}]",
        v.terminal.terminal_records,
        v.terminal.runs_submitted,
        v.terminal.results,
        mark(v.terminal.pass)
    );
    println!("verdict:       {}", if v.pass { "PASS" } else { "FAIL" });
}

fn write_report(dir: &Path, report: &Report) -> Result<(), String> {
    let json = serde_json::to_vec_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("report.json"), json).map_err(|e| e.to_string())?;
    let series = report.series.as_deref().unwrap_or_default();
    let svg = plot(series, &report.settings, report.verdict.rss.warmup_s)?;
    std::fs::write(dir.join("soak.svg"), svg).map_err(|e| e.to_string())
}

/// One panel of the plot: a title and its lines.
struct Panel {
    title: &'static str,
    lines: Vec<(&'static str, Vec<(f64, f64)>)>,
}

/// The series as an SVG: one panel per measure, time on the x axis, the
/// end of warm-up and the end of the duration marked.
fn plot(series: &[Sample], settings: &Settings, warmup_s: f64) -> Result<String, String> {
    use plotters::prelude::*;

    let line = |f: fn(&Sample) -> f64| series.iter().map(|s| (s.t_s, f(s))).collect::<Vec<_>>();
    let panels = [
        Panel {
            title: "runs completed per second",
            lines: vec![("runs/s", line(|s| s.runs_per_sec))],
        },
        Panel {
            title: "latency (ms)",
            lines: vec![("p50", line(|s| s.p50_ms)), ("p99", line(|s| s.p99_ms))],
        },
        Panel {
            title: "RSS (MiB)",
            lines: vec![("RSS", line(|s| s.rss_mib))],
        },
        Panel {
            title: "open file descriptors",
            lines: vec![("fds", line(|s| s.open_fds as f64))],
        },
        Panel {
            title: "runs alive",
            lines: vec![("live runs", line(|s| s.live_runs as f64))],
        },
    ];
    let colors = [BLUE, RED];
    let x_max = series
        .iter()
        .map(|s| s.t_s)
        .fold(settings.duration_s, f64::max)
        .max(1.0);
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut svg = String::new();
    {
        let height = 40 + 220 * panels.len() as u32;
        let root = SVGBackend::with_string(&mut svg, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let title = format!(
            "agentvisor soak: {}, concurrency {}{}",
            settings.agent,
            settings.concurrency,
            settings
                .chaos_rate
                .map(|r| format!(", chaos {r}"))
                .unwrap_or_default()
        );
        let root = root
            .titled(&title, ("sans-serif", 20))
            .map_err(|e| err(&e))?;
        for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(&panels) {
            let y_max = panel
                .lines
                .iter()
                .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
                .fold(0.0, f64::max)
                * 1.1;
            let y_max = if y_max > 0.0 { y_max } else { 1.0 };
            let mut chart = ChartBuilder::on(area)
                .caption(panel.title, ("sans-serif", 15))
                .margin(8)
                .x_label_area_size(36)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..x_max, 0.0..y_max)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .light_line_style(WHITE)
                .draw()
                .map_err(|e| err(&e))?;
            let marks = [(warmup_s, "warm-up"), (settings.duration_s, "end")];
            for (x, _) in marks.iter().filter(|(x, _)| *x > 0.0) {
                chart
                    .draw_series(LineSeries::new([(*x, 0.0), (*x, y_max)], BLACK.mix(0.25)))
                    .map_err(|e| err(&e))?;
            }
            for ((name, pts), color) in panel.lines.iter().zip(colors.iter().cycle()) {
                let color = *color;
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color))
                    .map_err(|e| err(&e))?
                    .label(*name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
            chart
                .configure_series_labels()
                .border_style(BLACK.mix(0.3))
                .background_style(WHITE.mix(0.8))
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_is_its_rate_relative_to_the_mean() {
        // 100 MiB growing 1 MiB a minute, sampled every second for 10 min:
        // mean ≈ 104.9 MiB, so ≈ 0.953 %/min.
        let base = 100.0 * 1024.0 * 1024.0;
        let per_s = 1024.0 * 1024.0 / 60.0;
        let samples: Vec<(f64, u64)> = (1..=600)
            .map(|t| (t as f64, (base + per_s * t as f64) as u64))
            .collect();
        let v = rss_verdict(&samples, 600.0);
        assert_eq!(v.warmup_s, 30.0);
        assert_eq!(v.samples, 571);
        assert!((v.slope_mib_per_min - 1.0).abs() < 1e-3, "{v:?}");
        let mean_mib = 100.0 + (30.0 + 600.0) / 2.0 / 60.0;
        assert!(
            (v.slope_pct_per_min - 100.0 / mean_mib).abs() < 1e-3,
            "{v:?}"
        );
        assert!(v.pass);

        // Twice as steep fails.
        let steep: Vec<(f64, u64)> = samples
            .iter()
            .map(|&(t, r)| (t, r + (per_s * t) as u64))
            .collect();
        assert!(!rss_verdict(&steep, 600.0).pass);
    }

    #[test]
    fn warm_up_growth_is_not_judged() {
        // 10 s soak: warm-up is 2 s (20 %). A jump in the first 2 s, then flat.
        let samples: Vec<(f64, u64)> = (1..=10)
            .map(|t| (t as f64, if t < 2 { 10 } else { 500 } << 20))
            .collect();
        let v = rss_verdict(&samples, 10.0);
        assert_eq!((v.warmup_s, v.samples), (2.0, 9));
        assert_eq!(v.slope_pct_per_min, 0.0);
        assert!(v.pass);
        // Drain samples (after the duration) are not judged either.
        let mut with_drain = samples.clone();
        with_drain.push((12.0, 900 << 20));
        assert_eq!(rss_verdict(&with_drain, 10.0).samples, 9);
    }

    #[test]
    fn too_few_samples_are_not_judged() {
        let v = rss_verdict(&[(1.0, 1 << 20)], 1.0);
        assert_eq!((v.samples, v.slope_pct_per_min, v.pass), (1, 0.0, true));
        assert!(rss_verdict(&[], 5.0).pass);
    }

    #[test]
    fn shrinking_rss_passes() {
        let samples: Vec<(f64, u64)> = (1..=100).map(|t| (t as f64, (1000 - t) << 20)).collect();
        let v = rss_verdict(&samples, 100.0);
        assert!(v.slope_pct_per_min < 0.0 && v.pass, "{v:?}");
    }

    fn statuses(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
        list.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn without_chaos_only_ok_is_explained() {
        let v = explain_statuses(&statuses(&[("ok", 10)]), None, 3);
        assert!(v.pass && v.explained.is_empty());
        let v = explain_statuses(&statuses(&[("ok", 10), ("killed/stalled", 1)]), None, 3);
        assert!(!v.pass);
        assert_eq!(v.unexplained, statuses(&[("killed/stalled", 1)]));
    }

    #[test]
    fn chaos_explains_its_own_statuses_up_to_what_it_injected() {
        let injected = ChaosCounts {
            calls: 1000,
            slow: 10,
            hang: 5,
            rate_limited: 7,
            malformed: 9,
        };
        let ok = statuses(&[
            ("ok", 900),
            ("killed/stalled", 5),
            ("error/rate_limited", 7),
            ("error/tool_errors", 3),
        ]);
        let v = explain_statuses(&ok, Some(injected), 3);
        assert!(v.pass, "{v:?}");
        assert_eq!(v.explained.len(), 3);

        let too_many = statuses(&[
            ("ok", 900),
            ("killed/stalled", 6),
            ("error/tool_errors", 4),
            ("killed/deadline", 1),
            ("cancelled/operator", 2),
        ]);
        let v = explain_statuses(&too_many, Some(injected), 3);
        assert!(!v.pass);
        assert_eq!(
            v.unexplained,
            statuses(&[
                ("killed/stalled", 1),
                ("error/tool_errors", 1),
                ("killed/deadline", 1),
                ("cancelled/operator", 2),
            ])
        );
    }

    #[test]
    fn histogram_buckets_are_within_two_percent() {
        for v in [
            0u64,
            1,
            31,
            32,
            33,
            63,
            64,
            100,
            1_000,
            12_345,
            999_999,
            1 << 39,
        ] {
            let mid = bucket_value(bucket_of(v));
            let err = (mid - v as f64).abs() / (v as f64).max(1.0);
            assert!(err <= 1.0 / 64.0 + 1e-9, "{v}: {mid}");
        }
        // Monotone: a larger value never lands in an earlier bucket.
        let mut last = 0;
        for v in (0..5_000_000u64).step_by(997) {
            let b = bucket_of(v);
            assert!(b >= last && b < BUCKETS);
            last = b;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_come_from_the_counts_and_take_resets() {
        let h = LatencyHistogram::default();
        assert_eq!(percentile_us(&h.take(), 0.5), 0.0);
        for us in 1..=1000u64 {
            h.record(us * 1000); // 1 ms … 1 s
        }
        let counts = h.take();
        let p50 = percentile_us(&counts, 0.50);
        let p99 = percentile_us(&counts, 0.99);
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.02, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.02, "{p99}");
        assert_eq!(h.max_us(), 1_000_000);
        assert_eq!(h.take().iter().sum::<u64>(), 0);
    }

    #[test]
    fn rates_outside_zero_to_one_are_refused() {
        assert_eq!(parse_rate("0.05"), Ok(0.05));
        assert_eq!(parse_rate("1"), Ok(1.0));
        for bad in ["2", "-0.1", "NaN", "x", ""] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert!(parse_positive_duration("0s").is_err());
        assert_eq!(parse_positive_duration("10m"), Ok(Duration::from_secs(600)));
    }

    #[test]
    fn the_plot_is_an_svg_with_every_panel() -> Result<(), String> {
        let series: Vec<Sample> = (1..=5)
            .map(|t| Sample {
                t_s: t as f64,
                phase: "run",
                completed: 10,
                runs_per_sec: 10.0,
                p50_ms: 1.0,
                p99_ms: 2.0,
                rss_bytes: 10 << 20,
                rss_mib: 10.0,
                open_fds: 12,
                live_runs: 4,
                live_actors: 9,
                cpu_pct: 50.0,
                statuses: BTreeMap::new(),
            })
            .collect();
        let settings = Settings {
            file: "soak.yaml".into(),
            agent: "soak".into(),
            model: "scripted".into(),
            duration_s: 5.0,
            concurrency: 4,
            chaos_rate: None,
            seed: 1,
            slow_ms: None,
            stall_timeout_ms: 2000,
            db: ":memory:".into(),
            critic_shards: 2,
        };
        let svg = plot(&series, &settings, 1.0)?;
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        for title in ["runs completed per second", "latency (ms)", "RSS (MiB)"] {
            assert!(svg.contains(title), "{title}");
        }
        assert!(svg.contains("<polyline"));
        Ok(())
    }
}
