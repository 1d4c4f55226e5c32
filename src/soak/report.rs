//! A soak's report: what it was asked ([`Settings`]), what it saw each
//! second ([`Sample`]), the whole summed up ([`Summary`]) and the
//! [`Verdict`]. Serialized as `report.json` and by `agentvisor soak --json`;
//! fields are only ever added, never renamed or removed (readers depend on
//! them).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ports::audit::AuditStats;
use crate::ports::retention::Retention;
use crate::providers::chaos::ChaosCounts;

use super::driver::{Sample, Soaked};
use super::figures::{mib, round3};
use super::histogram::percentile_us;
use super::sampler::DiskUse;
use super::verdict::{
    disk_verdict, explain_statuses, rss_verdict, DiskPoint, DiskVerdict, TerminalVerdict, Verdict,
};

/// What the soak was asked to do.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settings {
    /// The manifest's path.
    pub file: String,
    /// The agent's name.
    pub agent: String,
    /// The model it runs on.
    pub model: String,
    /// Seconds runs are started for.
    pub duration_s: f64,
    /// Runs in flight at once.
    pub concurrency: u64,
    /// The chaos rate, if any.
    pub chaos_rate: Option<f64>,
    /// The chaos draws' seed.
    pub seed: u64,
    /// How long a chaos-slow call waits, with chaos.
    pub slow_ms: Option<u64>,
    /// The agent's stall timeout.
    pub stall_timeout_ms: u64,
    /// Where records go (`:memory:` or a path).
    pub db: String,
    /// The host's critic shards.
    pub critic_shards: usize,
    /// The retention the database was kept under (`null`: none).
    pub retain: Option<Retention>,
}

/// The whole soak, summed up.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Runs the host accepted.
    pub runs_submitted: u64,
    /// Runs whose result came back.
    pub runs_finished: u64,
    /// Submits the host refused (each ends its worker).
    pub submit_errors: u64,
    /// Seconds runs were started for.
    pub elapsed_s: f64,
    /// Seconds from the last start to the last result.
    pub drain_s: f64,
    /// The drain did not end in time: what still ran was cancelled.
    pub drain_timed_out: bool,
    /// Runs finished per second of `elapsed_s`.
    pub runs_per_sec: f64,
    /// Median latency over the whole soak.
    pub p50_ms: f64,
    /// 99th percentile latency over the whole soak.
    pub p99_ms: f64,
    /// The largest latency.
    pub max_ms: f64,
    /// Peak RSS of the process.
    pub peak_rss_bytes: u64,
    /// The same in MiB.
    pub peak_rss_mib: f64,
    /// Runs per status key (`ok`, `killed/stalled`, …).
    pub by_status: BTreeMap<String, u64>,
    /// The faults injected, with chaos.
    pub chaos: Option<ChaosCounts>,
    /// What the audit store wrote.
    pub audit: AuditStats,
    /// What the records took on disk (`null` with nothing on disk).
    pub disk: Option<DiskSummary>,
}

/// What a soak's records took on disk: database + WAL + spool.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiskSummary {
    /// The database file (`null`: none).
    pub db: Option<String>,
    /// The audit spool (`null`: none).
    pub spool: Option<String>,
    /// The most at any sample: database + WAL + spool.
    pub peak_bytes: u64,
    /// The same in MiB.
    pub peak_mib: f64,
    /// The most the database and its WAL held together at any sample.
    pub peak_db_wal_bytes: u64,
    /// The same in MiB.
    pub peak_db_wal_mib: f64,
    /// By file, after the host's shutdown.
    pub end: DiskUse,
    /// The same, all together, in MiB.
    pub end_mib: f64,
}

/// The report: settings, the series, the summary, the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// What was asked.
    pub settings: Settings,
    /// One sample a second (left out of `--json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series: Option<Vec<Sample>>,
    /// The whole soak.
    pub summary: Summary,
    /// The verdict.
    pub verdict: Verdict,
}

impl Report {
    /// Sums up and judges a finished soak. `chaos` is what a chaos model
    /// injected (`None` without one); `max_tool_errors` is the agent's limit
    /// (it sets how many malformed calls end a run).
    pub fn new(
        settings: Settings,
        soaked: Soaked,
        chaos: Option<ChaosCounts>,
        max_tool_errors: u32,
    ) -> Report {
        let elapsed = settings.duration_s.min(soaked.end_of_starts_s);
        let total = &soaked.latency_counts;
        let peak = soaked
            .peak_rss_bytes
            .max(soaked.series.iter().map(|s| s.rss_bytes).max().unwrap_or(0));
        let (disk_summary, disk) = match disk_part(&soaked, &settings) {
            Some((summary, verdict)) => (Some(summary), Some(verdict)),
            None => (None, None),
        };
        let summary = Summary {
            runs_submitted: soaked.runs_submitted,
            runs_finished: soaked.runs_finished,
            submit_errors: soaked.submit_errors,
            elapsed_s: round3(elapsed),
            drain_s: round3(soaked.ended_s - elapsed),
            drain_timed_out: soaked.drain_timed_out,
            runs_per_sec: round3(soaked.runs_finished as f64 / elapsed.max(1e-9)),
            p50_ms: round3(percentile_us(total, 0.50) / 1000.0),
            p99_ms: round3(percentile_us(total, 0.99) / 1000.0),
            max_ms: round3(soaked.max_latency_us as f64 / 1000.0),
            peak_rss_bytes: peak,
            peak_rss_mib: round3(mib(peak)),
            by_status: soaked.by_status,
            chaos,
            audit: soaked.audit,
            disk: disk_summary,
        };
        let points: Vec<(f64, u64)> = soaked.series.iter().map(|s| (s.t_s, s.rss_bytes)).collect();
        let rss = rss_verdict(&points, settings.duration_s);
        let statuses = explain_statuses(&summary.by_status, chaos, max_tool_errors);
        let terminal = TerminalVerdict::of(
            summary.runs_submitted,
            summary.runs_finished,
            summary.audit.terminal_records,
        );
        let verdict = Verdict::of(rss, disk, statuses, terminal, summary.submit_errors);
        Report {
            settings,
            series: Some(soaked.series),
            summary,
            verdict,
        }
    }
}

/// The disk figures and verdict of a soak that had anything on disk.
fn disk_part(soaked: &Soaked, settings: &Settings) -> Option<(DiskSummary, DiskVerdict)> {
    let paths = &soaked.disk_paths;
    if paths.db.is_none() && paths.spool.is_none() {
        return None;
    }
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let peak = |f: fn(&Sample) -> u64| soaked.series.iter().map(f).max().unwrap_or(0);
    let peak_all = peak(|s| s.disk_bytes);
    let peak_db_wal = peak(|s| s.db_bytes + s.wal_bytes);
    let end = soaked.disk_end;
    let summary = DiskSummary {
        db: path(&paths.db),
        spool: path(&paths.spool),
        peak_bytes: peak_all,
        peak_mib: round3(mib(peak_all)),
        peak_db_wal_bytes: peak_db_wal,
        peak_db_wal_mib: round3(mib(peak_db_wal)),
        end,
        end_mib: round3(mib(end.total())),
    };
    let mut finished = 0;
    let points: Vec<DiskPoint> = soaked
        .series
        .iter()
        .map(|s| {
            finished += s.completed;
            DiskPoint {
                t_s: s.t_s,
                total_bytes: s.disk_bytes,
                db_bytes: s.db_bytes,
                runs_finished: finished,
            }
        })
        .collect();
    let verdict = disk_verdict(&points, settings.duration_s, settings.retain);
    Some((summary, verdict))
}
