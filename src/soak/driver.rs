//! The soak driver: C workers, each starting the next run of one agent as
//! soon as its last one ended, until the duration has passed (or a
//! [`Stopper`] says stop); a sampler that reads the process and the
//! workers' counts once a second until the last run has ended; then the
//! host's shutdown, which drains the audit actor, so the store's counts are
//! final when [`Soak::finish`] returns.
//!
//! Each sample also reads what the host's records take on disk (the
//! database file and WAL of [`SoakPlan::disk`], the host's audit spool:
//! [`disk_use`]) and, with [`Soak::watch_chaos`], the faults a chaos model
//! has injected so far.
//!
//! Time is tokio's: on a paused clock (`start_paused` tests) a soak of any
//! duration runs in no wall time and starts a number of runs that depends
//! only on the runs' own (scripted) latencies.
//!
//! # Counting
//! A run counts as submitted once the host accepted it and as finished once
//! its handle gave a result; its status goes under its key (`ok`,
//! `killed/stalled`, `error/rate_limited`: the status and why). Latencies
//! (submit to result) go into a [`LatencyHistogram`]. A submit the host
//! refuses is counted and ends that worker.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::ports::audit::AuditStats;
use crate::providers::chaos::{ChaosCounts, ChaosModel};
use crate::{Agent, Host, Invocation, Limits, RunResult, RunStatus};

use super::figures::{mib, round3};
use super::histogram::{percentile_us, LatencyHistogram, BUCKETS};
use super::sampler::{
    cpu_seconds, disk_use, open_fds, peak_rss_bytes, rss_bytes, DiskPaths, DiskUse,
};

/// Actors a host runs besides its runs and critic shards: the root, audit
/// and budget.
const FIXED_ACTORS: usize = 3;

/// One second of the soak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the first run started.
    pub t_s: f64,
    /// `run` while runs are started, `drain` after.
    pub phase: &'static str,
    /// Runs completed in this interval.
    pub completed: u64,
    /// Runs completed per second in this interval.
    pub runs_per_sec: f64,
    /// Median latency (submit to result) of the runs completed in it.
    pub p50_ms: f64,
    /// Their 99th percentile.
    pub p99_ms: f64,
    /// RSS at the sample.
    pub rss_bytes: u64,
    /// The same in MiB.
    pub rss_mib: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// Runs alive.
    pub live_runs: usize,
    /// Actors alive: runs alive, the root, audit, budget and the shards.
    pub live_actors: usize,
    /// CPU time over wall time in this interval (100 = one core).
    pub cpu_pct: f64,
    /// Statuses so far (cumulative).
    pub statuses: BTreeMap<String, u64>,
    /// Database + WAL + spool, in bytes (0 with nothing on disk).
    pub disk_bytes: u64,
    /// The same in MiB.
    pub disk_mib: f64,
    /// The database file.
    pub db_bytes: u64,
    /// Its WAL (`-wal` and `-shm`).
    pub wal_bytes: u64,
    /// The audit spool.
    pub spool_bytes: u64,
    /// Faults injected so far (cumulative), with a watched chaos model.
    pub chaos: Option<ChaosCounts>,
}

/// What to soak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoakPlan {
    /// How long to keep starting runs.
    pub duration: Duration,
    /// Runs in flight at once (workers).
    pub concurrency: u64,
    /// The caller id of every run.
    pub caller: String,
    /// How long after `duration` the drain may take before the sampler
    /// gives up (the host's shutdown then cancels what still runs).
    pub drain_limit: Duration,
    /// Where the host's records are on disk, sampled with the rest (none
    /// by default; the host's audit spool is added when it has one).
    pub disk: DiskPaths,
}

impl SoakPlan {
    /// A plan for `agent`: caller `soak`, and a drain limit no run can
    /// outlast: its hard deadline with every extension, the kill grace and
    /// 5 s.
    pub fn new(agent: &Agent, duration: Duration, concurrency: u64) -> Self {
        SoakPlan {
            duration,
            concurrency,
            caller: "soak".to_string(),
            drain_limit: drain_limit(agent.limits()),
            disk: DiskPaths::default(),
        }
    }

    /// Samples the disk use of this database file (its WAL beside it).
    pub fn database(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.disk.db = Some(path.into());
        self
    }
}

/// The longest a run of these limits can take, and 5 s.
pub fn drain_limit(limits: &Limits) -> Duration {
    limits.hard_timeout
        + limits.extension * limits.max_extensions
        + limits.kill_grace
        + Duration::from_secs(5)
}

/// What a finished soak measured (see [`super::Report::new`] to judge it).
#[derive(Clone, Debug)]
pub struct Soaked {
    /// One sample a second, and one when the last run ended.
    pub series: Vec<Sample>,
    /// Every run's latency, as [`LatencyHistogram`] counts.
    pub latency_counts: Vec<u64>,
    /// The largest latency, in µs.
    pub max_latency_us: u64,
    /// Seconds from the start until runs stopped being started.
    pub end_of_starts_s: f64,
    /// Seconds from the start until the host had shut down.
    pub ended_s: f64,
    /// The sampler gave up on the drain.
    pub drain_timed_out: bool,
    /// Runs the host accepted.
    pub runs_submitted: u64,
    /// Runs whose result came back.
    pub runs_finished: u64,
    /// Submits the host refused.
    pub submit_errors: u64,
    /// Runs per status key.
    pub by_status: BTreeMap<String, u64>,
    /// The process's peak RSS when the soak ended.
    pub peak_rss_bytes: u64,
    /// What the audit store wrote (after the drain).
    pub audit: AuditStats,
    /// The files whose disk use was sampled.
    pub disk_paths: DiskPaths,
    /// Their disk use after the host's shutdown (the last records
    /// written, the spool replayed).
    pub disk_end: DiskUse,
}

/// Counts the workers share with the sampler.
#[derive(Default)]
struct Tally {
    submitted: AtomicU64,
    finished: AtomicU64,
    submit_errors: AtomicU64,
    latency: LatencyHistogram,
    statuses: Mutex<BTreeMap<String, u64>>,
    /// Stop starting runs.
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

/// `ok`, or the status and why: `killed/stalled`, `error/rate_limited`.
pub fn status_key(r: &RunResult) -> String {
    if r.status == RunStatus::Ok {
        return "ok".to_string();
    }
    match (r.kill_reason, &r.error_kind) {
        (Some(k), _) => format!("{}/{}", r.status, k.as_str()),
        (None, Some(kind)) => format!("{}/{kind}", r.status),
        (None, None) => r.status.to_string(),
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

/// Stops a soak from starting runs (what runs drains). Cheap to clone.
#[derive(Clone)]
pub struct Stopper(Arc<Tally>);

impl Stopper {
    /// No worker starts another run.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Stopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Stopper")
            .field(&self.0.stop.load(Ordering::Relaxed))
            .finish()
    }
}

/// A soak in progress: its workers and what they count.
pub struct Soak {
    tally: Arc<Tally>,
    workers: Vec<JoinHandle<()>>,
    plan: SoakPlan,
    critic_shards: usize,
    started: Instant,
    chaos: Option<Arc<ChaosModel>>,
}

impl std::fmt::Debug for Soak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Soak")
            .field("plan", &self.plan)
            .field("submitted", &self.tally.submitted.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Soak {
    /// Starts the plan's workers on `host` (see the module doc).
    pub fn start(host: &Host, agent: &Agent, mut plan: SoakPlan) -> Soak {
        if plan.disk.spool.is_none() {
            plan.disk.spool = host.config().audit_spool.clone();
        }
        let tally = Arc::new(Tally::default());
        let concurrency = plan.concurrency.max(1);
        tally
            .workers_left
            .store(concurrency as usize, Ordering::Release);
        let started = Instant::now();
        let end = started + plan.duration;
        let caller: Arc<str> = Arc::from(plan.caller.as_str());
        let workers = (0..concurrency)
            .map(|_| {
                let (host, agent, tally) = (host.clone(), agent.clone(), tally.clone());
                let caller = caller.clone();
                tokio::spawn(async move {
                    let _guard = WorkerGuard(tally.clone());
                    while Instant::now() < end && !tally.stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        let inv = Invocation {
                            caller_id: Some(caller.to_string()),
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
        Soak {
            tally,
            workers,
            critic_shards: host.config().critic_shards,
            plan,
            started,
            chaos: None,
        }
    }

    /// Samples what `model` has injected every second (each sample's
    /// `chaos`), so the report can show each fault next to its outcome.
    pub fn watch_chaos(mut self, model: Arc<ChaosModel>) -> Self {
        self.chaos = Some(model);
        self
    }

    /// Stops the soak from starting runs, from anywhere (Ctrl-C).
    pub fn stopper(&self) -> Stopper {
        Stopper(self.tally.clone())
    }

    /// Samples every second until every worker has ended (or the drain
    /// limit has passed), calling `on_sample` with each sample; then shuts
    /// `host` down (every record written) and returns what was measured.
    pub async fn finish(self, host: &Host, mut on_sample: impl FnMut(&Sample)) -> Soaked {
        let t = &self.tally;
        let give_up = self.plan.duration + self.plan.drain_limit;
        let duration_s = self.plan.duration.as_secs_f64();
        let end = self.started + self.plan.duration;
        let fixed_actors = FIXED_ACTORS + self.critic_shards;
        let mut ticker = tokio::time::interval_at(
            self.started + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut series = Vec::new();
        let mut latency_counts = vec![0u64; BUCKETS];
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
            for (total, n) in latency_counts.iter_mut().zip(&counts) {
                *total += n;
            }
            let elapsed = (now - self.started).as_secs_f64();
            let running = now < end && !t.stop.load(Ordering::Relaxed);
            if !running && end_of_starts.is_none() {
                end_of_starts = Some(elapsed.min(duration_s));
            }
            let live = host.live_runs();
            let rss = rss_bytes();
            let disk = disk_use(&self.plan.disk);
            let sample = Sample {
                t_s: round3(elapsed),
                phase: if running || elapsed <= duration_s + 0.05 {
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
                disk_bytes: disk.total(),
                disk_mib: round3(mib(disk.total())),
                db_bytes: disk.db_bytes,
                wal_bytes: disk.wal_bytes,
                spool_bytes: disk.spool_bytes,
                chaos: self.chaos.as_ref().map(|c| c.counts()),
            };
            on_sample(&sample);
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
        let audit = host.shutdown().await;
        for w in self.workers {
            // A worker ends by its loop (or by a panic, which the counts
            // then show as a run submitted and never finished).
            let _ = w.await;
        }
        let ended_s = self.started.elapsed().as_secs_f64();
        Soaked {
            series,
            latency_counts,
            max_latency_us: t.latency.max_us(),
            end_of_starts_s: end_of_starts.unwrap_or(duration_s),
            ended_s,
            drain_timed_out,
            runs_submitted: t.submitted.load(Ordering::Relaxed),
            runs_finished: t.finished.load(Ordering::Relaxed),
            submit_errors: t.submit_errors.load(Ordering::Relaxed),
            by_status: t.statuses(),
            peak_rss_bytes: peak_rss_bytes(),
            audit,
            disk_end: disk_use(&self.plan.disk),
            disk_paths: self.plan.disk,
        }
    }
}
