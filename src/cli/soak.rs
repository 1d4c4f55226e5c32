//! `agentvisor soak FILE --duration D --concurrency C [--chaos RATE]
//! [--seed N] [--report DIR] [--json] [--require]`: keeps C runs of one manifest in
//! flight for D (as each run ends the next starts), then stops starting runs
//! and drains; samples the process every second; prints a verdict and exits
//! 0 iff it passes. Ctrl-C stops starting runs and drains. A verdict that
//! could not judge a part (a soak too short for the RSS slope) is
//! `inconclusive`: exit 0 with a warning, or exit 1 with `--require`.
//!
//! The engine, its samples and its verdict are [`agentvisor::soak`]; this
//! face parses the flags, wraps the model for `--chaos`, shows progress,
//! prints the report and draws its plot.
//!
//! # Chaos
//! `--chaos RATE` wraps the manifest's scripted model in a [`ChaosModel`]:
//! each model call, with probability RATE, is slow (a fifth of the stall
//! timeout, at most 1 s), hangs, fails with a 429, or answers with a tool
//! call whose arguments are not JSON. The draws are seeded (`--seed`), so a
//! soak's faults are reproducible.
//!
//! # Terminal records
//! The SQLite store counts the terminal rows it inserted (a duplicate is
//! ignored, never counted); the in-memory store counts every terminal
//! record appended (a duplicate would show as one too many).
//!
//! # Disk
//! With a database file, each sample reads what the records take on disk:
//! the file, its WAL and the audit spool (`--spool`, or `PATH.spool`).
//! Under `--retain` the disk must be flat once the bound is reached and
//! the warm-up is over; without it the growth is stated, not judged.
//!
//! # Report
//! `--report DIR` writes `DIR/report.json` (settings, the series, the
//! summary, the verdict) and `DIR/soak.svg` (the series over time, a
//! panel each, titled with the verdict: see `docs/soak.md`). `--json`
//! prints the report without the series.

mod plot;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use agentvisor::providers::chaos::{ChaosConfig, ChaosModel};
use agentvisor::providers::ScriptedModel;
use agentvisor::soak::{
    DiskOutcome, Report, RssOutcome, Sample, Settings, Soak, SoakPlan, VerdictOutcome,
};
use agentvisor::LimitsSpec;

/// Flags of `agentvisor soak`.
#[derive(Args, Debug)]
pub(crate) struct SoakArgs {
    /// What the database keeps (`--retain`).
    #[command(flatten)]
    pub(crate) keep: super::keep::KeepArgs,
    /// The agent manifest (YAML).
    file: PathBuf,
    /// How long to keep starting runs (`30s`, `10m`, `1h`).
    #[arg(long, default_value = "1m", allow_hyphen_values = true, value_parser = super::flags::duration(Duration::from_millis(1), super::flags::MAX_SOAK))]
    duration: Duration,
    /// How many runs in flight at once.
    #[arg(long, value_name = "C", default_value_t = 100, allow_hyphen_values = true, value_parser = super::flags::whole(1, super::swarm::MAX_CONCURRENCY))]
    concurrency: u64,
    /// Inject faults into this fraction of model calls (0 to 1): slow calls,
    /// hangs, 429s, malformed tool arguments. Needs `model: scripted`.
    #[arg(long, value_name = "RATE", allow_hyphen_values = true, value_parser = parse_rate)]
    chaos: Option<f64>,
    /// The seed of the chaos draws.
    #[arg(long, value_name = "N", default_value_t = 1, allow_hyphen_values = true, value_parser = super::flags::whole(0, u64::MAX))]
    seed: u64,
    /// Write `report.json` and `soak.svg` (the plot) into this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Print the report (without the series) as one JSON object.
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics while it runs.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Fail (exit 1) when the verdict is inconclusive (a part, such as the
    /// RSS slope of a soak too short to judge, could not be judged).
    #[arg(long)]
    require: bool,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "the chaos rate must be a number from 0 to 1 (e.g. 0.05), not `{s}`"
        )),
    }
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
    let _metrics = match super::serve::metrics_endpoint(a.metrics_addr, &host).await {
        Ok(m) => m,
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
            super::Db::Postgres(url) => format!("{url:?}"),
        },
        critic_shards: host.config().critic_shards,
        retain: match db {
            super::Db::Memory => None,
            super::Db::File(_) | super::Db::Postgres(_) => a.keep.retain.filter(|r| r.is_set()),
        },
    };

    let mut plan = SoakPlan::new(&agent, a.duration, a.concurrency);
    if let super::Db::File(path) = db {
        plan = plan.database(path);
    }
    let mut soak = Soak::start(&host, &agent, plan);
    if let Some(model) = &chaos {
        soak = soak.watch_chaos(model.clone());
    }
    let stopper = soak.stopper();
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stopper.stop();
        }
    });
    let bar = progress_bar(a.duration);
    let duration_s = settings.duration_s;
    let soaked = soak
        .finish(&host, |s| show_progress(&bar, s, duration_s))
        .await;
    bar.finish_and_clear();
    ctrl_c.abort();

    let chaos_counts = chaos.as_ref().map(|c| c.counts());
    let mut report = Report::new(settings, soaked, chaos_counts, limits.max_tool_errors);
    if a.require {
        report.verdict.require_conclusive();
    }
    let mut code = if report.verdict.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    if let Some(dir) = &a.report {
        if let Err(e) = write_report(dir, &report) {
            errln!("error: cannot write the report to {}: {e}", dir.display());
            code = ExitCode::from(1);
        }
    }
    if a.json {
        report.series = None;
        outln!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        print_report(&report);
    }
    if report.verdict.outcome == VerdictOutcome::Inconclusive {
        let why = report.verdict.unjudged.join("; ");
        if a.require {
            errln!("error: the verdict is inconclusive ({why}), and --require asks for a conclusive one");
        } else {
            errln!("warning: the verdict is inconclusive ({why}): nothing failed, but this soak does not show it passes; soak longer, or pass --require to fail on it");
        }
    }
    // Records the database and the spool did not take: lost, and said so.
    if super::report_unwritten(&host, &report.summary.audit) {
        code = ExitCode::from(1);
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

fn show_progress(bar: &ProgressBar, s: &Sample, duration_s: f64) {
    bar.set_position(s.t_s.min(duration_s) as u64);
    bar.set_message(format!(
        "{}{:.0} runs/s  p99 {:.0} ms  {} live  RSS {:.0} MiB  disk {:.0} MiB  {} fds",
        if s.phase == "run" { "" } else { "draining: " },
        s.runs_per_sec,
        s.p99_ms,
        s.live_runs,
        s.rss_mib,
        s.disk_mib,
        s.open_fds
    ));
}

// ---- Output -----------------------------------------------------------------

fn print_report(r: &Report) {
    let (s, m, v) = (&r.settings, &r.summary, &r.verdict);
    let mark = |pass: bool| if pass { "pass" } else { "FAIL" };
    let chaos = match s.chaos_rate {
        Some(rate) => format!(", chaos {rate} (seed {})", s.seed),
        None => String::new(),
    };
    outln!(
        "soak:          {} for {} s, concurrency {}{chaos}",
        s.file,
        s.duration_s,
        s.concurrency
    );
    outln!(
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
        outln!("  {k:<22}{n}");
    }
    outln!(
        "latency:       p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        m.p50_ms,
        m.p99_ms,
        m.max_ms
    );
    if let Some(c) = &m.chaos {
        outln!(
            "chaos:         {} calls: {} slow, {} hang, {} rate_limited, {} malformed",
            c.calls,
            c.slow,
            c.hang,
            c.rate_limited,
            c.malformed
        );
    }
    let rss_mark = match v.rss.outcome {
        RssOutcome::Pass => "pass",
        RssOutcome::Fail => "FAIL",
        RssOutcome::Inconclusive => "inconclusive",
        RssOutcome::TooShort => "too short to judge",
    };
    outln!(
        "RSS:           peak {:.1} MiB; slope {:+.3} %/min ({:+.2} MiB/min, 95 % in [{:+.3}, {:+.3}]) over {} samples after {:.1} s warm-up [{rss_mark}]",
        m.peak_rss_mib,
        v.rss.slope_pct_per_min,
        v.rss.slope_mib_per_min,
        v.rss.slope_low_pct_per_min,
        v.rss.slope_high_pct_per_min,
        v.rss.samples,
        v.rss.warmup_s,
    );
    if v.rss.outcome != RssOutcome::Pass {
        outln!("               {}", v.rss.reason);
    }
    if let (Some(d), Some(disk)) = (&v.disk, &m.disk) {
        let disk_mark = match d.outcome {
            DiskOutcome::Pass => "pass",
            DiskOutcome::Fail => "FAIL",
            DiskOutcome::Inconclusive => "inconclusive",
            DiskOutcome::TooShort => "too short to judge",
            DiskOutcome::Unbounded => "no retention: not judged",
        };
        outln!(
            "disk:          peak {:.1} MiB (database + WAL {:.1} MiB), {:.1} MiB at the end; slope {:+.3} %/min ({:+.2} MiB/min, 95 % in [{:+.3}, {:+.3}]) over {} samples after {:.1} s [{disk_mark}]",
            disk.peak_mib,
            disk.peak_db_wal_mib,
            disk.end_mib,
            d.slope_pct_per_min,
            d.slope_mib_per_min,
            d.slope_low_pct_per_min,
            d.slope_high_pct_per_min,
            d.samples,
            d.warmup_s,
        );
        if !matches!(d.outcome, DiskOutcome::Pass | DiskOutcome::Unbounded) {
            outln!("               {}", d.reason);
        }
    }
    if v.statuses.unexplained.is_empty() {
        outln!(
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
        outln!(
            "statuses:      unexplained: {} [{}]",
            list.join(", "),
            mark(false)
        );
    }
    outln!(
        "terminal:      {} records for {} runs ({} results) [{}]",
        v.terminal.terminal_records,
        v.terminal.runs_submitted,
        v.terminal.results,
        mark(v.terminal.pass)
    );
    let verdict = match (v.outcome, v.pass) {
        (VerdictOutcome::Pass, _) => "PASS",
        (VerdictOutcome::Inconclusive, true) => "INCONCLUSIVE (no failure)",
        (VerdictOutcome::Inconclusive, false) => {
            "FAIL (inconclusive, and --require asks for a conclusive verdict)"
        }
        (VerdictOutcome::Fail, _) => "FAIL",
    };
    outln!("verdict:       {verdict}");
}

fn write_report(dir: &Path, report: &Report) -> Result<(), String> {
    let json = serde_json::to_vec_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("report.json"), json).map_err(|e| e.to_string())?;
    let svg = plot::plot(report)?;
    std::fs::write(dir.join("soak.svg"), svg).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn rates_outside_zero_to_one_are_refused() {
        assert_eq!(parse_rate("0.05"), Ok(0.05));
        assert_eq!(parse_rate("1"), Ok(1.0));
        for bad in ["2", "-0.1", "NaN", "x", ""] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    /// A made-up five-minute chaos soak on a database under `max_bytes =
    /// 50 MiB`: the file fills in 50 s and stays; RSS is flat; hangs end
    /// runs `killed/stalled`, 429s `error/rate_limited`.
    pub(super) fn made_up_report() -> Report {
        use agentvisor::ports::audit::AuditStats;
        use agentvisor::providers::chaos::ChaosCounts;
        use agentvisor::soak::{DiskPaths, DiskUse, Soaked};

        let chaos_at = |t: u64| ChaosCounts {
            calls: 3000 * t,
            slow: 40 * t,
            hang: 2 * t,
            rate_limited: 3 * t,
            malformed: 5 * t,
        };
        let series: Vec<Sample> = (1..=300u64)
            .map(|t| {
                let db = (t.min(50) << 20) + (t % 7) * 100_000;
                let wal = (t % 5) << 20;
                let statuses = BTreeMap::from([
                    ("ok".to_string(), 1000 * t),
                    ("killed/stalled".to_string(), 2 * t.saturating_sub(2)),
                    ("error/rate_limited".to_string(), 3 * t),
                ]);
                Sample {
                    t_s: t as f64,
                    phase: "run",
                    completed: 1005,
                    runs_per_sec: 1005.0,
                    p50_ms: 31.0 + (t % 3) as f64,
                    p99_ms: if t % 4 == 0 { 2000.0 } else { 400.0 },
                    rss_bytes: (80 + t % 3) << 20,
                    rss_mib: (80 + t % 3) as f64,
                    open_fds: 12,
                    live_runs: 200,
                    live_actors: 205,
                    cpu_pct: 150.0,
                    statuses,
                    disk_bytes: db + wal,
                    disk_mib: ((db + wal) >> 20) as f64,
                    db_bytes: db,
                    wal_bytes: wal,
                    spool_bytes: 0,
                    chaos: Some(chaos_at(t)),
                }
            })
            .collect();
        let last = series.last().cloned().unwrap_or_else(|| unreachable!());
        let finished: u64 = series.iter().map(|s| s.completed).sum();
        let soaked = Soaked {
            latency_counts: vec![0; agentvisor::soak::histogram::BUCKETS],
            max_latency_us: 2_000_000,
            end_of_starts_s: 300.0,
            ended_s: 300.0,
            drain_timed_out: false,
            runs_submitted: finished,
            runs_finished: finished,
            submit_errors: 0,
            by_status: last.statuses.clone(),
            peak_rss_bytes: 82 << 20,
            audit: AuditStats {
                terminal_records: finished,
                ..AuditStats::default()
            },
            disk_paths: DiskPaths {
                db: Some("soak.db".into()),
                spool: Some("soak.db.spool".into()),
            },
            disk_end: DiskUse {
                db_bytes: last.db_bytes,
                wal_bytes: 0,
                spool_bytes: 0,
            },
            series,
        };
        let settings = Settings {
            file: "examples/agents/soak.yaml".into(),
            agent: "soak".into(),
            model: "scripted".into(),
            duration_s: 300.0,
            concurrency: 200,
            chaos_rate: Some(0.05),
            seed: 1,
            slow_ms: Some(400),
            stall_timeout_ms: 2000,
            db: "soak.db".into(),
            critic_shards: 2,
            retain: "max_bytes=50MiB".parse().ok(),
        };
        Report::new(settings, soaked, Some(chaos_at(300)), 5)
    }

    #[test]
    fn the_report_holds_the_disk_series_and_verdict_and_the_plot_is_written() {
        let report = made_up_report();
        let disk = report
            .verdict
            .disk
            .as_ref()
            .unwrap_or_else(|| unreachable!());
        assert_eq!(disk.outcome, DiskOutcome::Pass, "{disk:?}");
        assert_eq!(disk.bound_reached_s, Some(45.0));

        let dir =
            std::env::temp_dir().join(format!("agentvisor-soak-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        write_report(&dir, &report).unwrap_or_else(|e| panic!("{e}"));
        let json: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("report.json")).unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let svg = std::fs::read_to_string(dir.join("soak.svg")).unwrap_or_else(|e| panic!("{e}"));
        let _ = std::fs::remove_dir_all(&dir);

        let series = json["series"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        assert_eq!(series.len(), 300);
        assert_eq!(series[99]["db_bytes"], (50u64 << 20) + 100_000 * (100 % 7));
        assert_eq!(series[99]["wal_bytes"], 0);
        assert_eq!(
            series[101]["disk_bytes"],
            (50u64 << 20) + 400_000 + (2 << 20)
        );
        assert_eq!(series[0]["chaos"]["hang"], 2);
        let summary_disk = &json["summary"]["disk"];
        assert_eq!(summary_disk["db"], "soak.db");
        assert_eq!(summary_disk["end"]["db_bytes"], (50u64 << 20) + 600_000);
        assert!(summary_disk["peak_db_wal_bytes"].as_u64() > Some(50 << 20));
        assert_eq!(json["verdict"]["disk"]["outcome"], "pass");
        assert_eq!(json["settings"]["retain"]["max_bytes"], 50u64 << 20);

        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for text in [
            "runs completed per second",
            "latency of the runs ended each second (ms, log scale)",
            "RSS (MiB): peak 82.0; slope",
            "disk (MiB): peak",
            "[pass]",
            "hang injected: 600",
            "killed/stalled: 596 (≤ 600)",
            "error/rate_limited: 900 (≤ 900)",
            "slow injected: 12000 (runs end ok)",
            "max_bytes 50.0 MiB",
            "every status explained [pass]",
            "verdict PASS",
        ] {
            assert!(svg.contains(text), "the plot lacks {text:?}");
        }
    }
}
