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
//! # Report
//! `--report DIR` writes `DIR/report.json` (settings, the series, the
//! summary, the verdict) and `DIR/soak.svg` (the series over time, one
//! panel each). `--json` prints the report without the series.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use agentvisor::providers::chaos::{ChaosConfig, ChaosModel};
use agentvisor::providers::ScriptedModel;
use agentvisor::soak::{Report, RssOutcome, Sample, Settings, Soak, SoakPlan, VerdictOutcome};
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
    /// Write `report.json` and `soak.svg` into this directory.
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
        },
        critic_shards: host.config().critic_shards,
    };

    let soak = Soak::start(
        &host,
        &agent,
        SoakPlan::new(&agent, a.duration, a.concurrency),
    );
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
        "{}{:.0} runs/s  p99 {:.0} ms  {} live  RSS {:.0} MiB  {} fds",
        if s.phase == "run" { "" } else { "draining: " },
        s.runs_per_sec,
        s.p99_ms,
        s.live_runs,
        s.rss_mib,
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
