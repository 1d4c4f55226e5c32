//! The plot of a soak report (`soak.svg`): eight panels over time, two
//! across, each titled with what the verdict found in it. Faint vertical
//! lines mark the end of warm-up and the end of the duration (what comes
//! after is the drain); the fitted slopes of RSS and disk are drawn dashed
//! over the window they were judged on.
//!
//! SVG (text as text, lines as polylines) needs no font files or image
//! encoders, so the plot costs the binary only plotters' SVG backend; any
//! browser shows it, and converters turn it into PNG.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use agentvisor::providers::chaos::ChaosCounts;
use agentvisor::soak::{DiskOutcome, Report, RssOutcome, Sample, VerdictOutcome};

/// Width and height of one panel, in pixels.
const PANEL: (u32, u32) = (800, 340);
/// Space for the figure's title (two lines, and a note on long soaks).
const TITLE_H: u32 = 86;

const BLUE: RGBColor = RGBColor(31, 119, 180);
const ORANGE: RGBColor = RGBColor(230, 120, 10);
const GREEN: RGBColor = RGBColor(44, 160, 44);
const RED: RGBColor = RGBColor(214, 39, 40);
const PURPLE: RGBColor = RGBColor(148, 103, 189);
const BROWN: RGBColor = RGBColor(140, 86, 75);
const GRAY: RGBColor = RGBColor(110, 110, 110);
const TEAL: RGBColor = RGBColor(23, 150, 160);
const BLACK_RGB: RGBColor = RGBColor(0, 0, 0);

/// The most points a line of a long soak keeps: beyond, its samples go
/// into buckets of consecutive seconds, one point each (an hour of
/// one-second samples would draw as a solid band).
const MAX_POINTS: usize = 600;

/// How a bucket of samples becomes one point.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Agg {
    /// The mean (rates, CPU, runs alive).
    Mean,
    /// The median of the seconds that had a value (a p50).
    Median,
    /// The highest (a p99, RSS, disk: peaks are what a bound is about).
    Max,
    /// The last (cumulative counts).
    Last,
    /// Every point as it is (a fitted line, a bound).
    Keep,
}

/// One line of a panel.
struct Line {
    name: String,
    pts: Vec<(f64, f64)>,
    color: RGBColor,
    dashed: bool,
    width: u32,
    agg: Agg,
}

impl Line {
    fn solid(name: impl Into<String>, pts: Vec<(f64, f64)>, color: RGBColor) -> Line {
        Line {
            name: name.into(),
            pts,
            color,
            dashed: false,
            width: 2,
            agg: Agg::Last,
        }
    }

    fn agg(mut self, agg: Agg) -> Line {
        self.agg = agg;
        self
    }

    fn dashed(name: impl Into<String>, pts: Vec<(f64, f64)>, color: RGBColor) -> Line {
        Line {
            dashed: true,
            ..Line::solid(name, pts, color)
        }
    }
}

/// One panel: a title, its lines, on a linear or a log y axis.
struct Panel {
    title: String,
    y_desc: &'static str,
    lines: Vec<Line>,
    log: bool,
    legend: SeriesLabelPosition,
    /// The top of a linear y axis, as a multiple of the highest value
    /// (room for the legend above the lines).
    headroom: f64,
}

/// The report's series as an SVG document.
pub(super) fn plot(report: &Report) -> Result<String, String> {
    let series = report.series.as_deref().unwrap_or_default();
    let settings = &report.settings;
    let mut panels = panels(report, series);
    let bucket = series.len().div_ceil(MAX_POINTS).max(1);
    for l in panels.iter_mut().flat_map(|p| p.lines.iter_mut()) {
        l.pts = thin(&l.pts, bucket, l.agg);
    }
    let x_max = series
        .iter()
        .map(|s| s.t_s)
        .fold(settings.duration_s, f64::max)
        .max(1.0);
    let marks = [
        (report.verdict.rss.warmup_s, "warm-up"),
        (settings.duration_s, "end"),
    ];
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let rows = panels.len().div_ceil(2) as u32;
    let mut svg = String::new();
    {
        let size = (2 * PANEL.0, TITLE_H + rows * PANEL.1);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let (top, body) = root.split_vertically(TITLE_H);
        let (workload, verdict) = figure_title(report);
        top.draw(&Text::new(
            workload,
            (20, 10),
            ("sans-serif", 20).into_font().color(&BLACK),
        ))
        .map_err(|e| err(&e))?;
        top.draw(&Text::new(
            verdict,
            (20, 38),
            ("sans-serif", 20).into_font().color(&BLACK),
        ))
        .map_err(|e| err(&e))?;
        // Seconds, or minutes for a soak of more than ten.
        let x_axis = if x_max > 600.0 {
            XAxis {
                max: x_max / 60.0,
                per_unit: 60.0,
                desc: "minutes since the start",
            }
        } else {
            XAxis {
                max: x_max,
                per_unit: 1.0,
                desc: "seconds since the start",
            }
        };
        let areas = body.split_evenly((rows as usize, 2));
        for (area, panel) in areas.iter().zip(&panels) {
            draw_panel(area, panel, &x_axis, &marks)?;
        }
        if bucket > 1 {
            top.draw(&Text::new(
                format!(
                    "each point: {bucket} s of samples (runs/s, CPU, runs alive: the mean; p50: the median; \
                     p99, RSS, disk, fds: the highest; counts: the last)"
                ),
                (20, 64),
                ("sans-serif", 12).into_font().color(&GRAY),
            ))
            .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// The figure's two title lines: the workload (`agentvisor soak: AGENT,
/// concurrency C, chaos R, retain …`), then the verdict and each part's.
fn figure_title(report: &Report) -> (String, String) {
    let (s, v) = (&report.settings, &report.verdict);
    let mut t = format!(
        "agentvisor soak: {} ({}), {} s, concurrency {}",
        s.agent, s.file, s.duration_s, s.concurrency
    );
    if let Some(rate) = s.chaos_rate {
        t.push_str(&format!(", chaos {rate} (seed {})", s.seed));
    }
    if let Some(r) = &s.retain {
        t.push_str(&format!(", retain {}", retain_text(r)));
    }
    t.push_str(&format!(", db {}", s.db));
    let verdict = match (v.outcome, v.pass) {
        (VerdictOutcome::Pass, _) => "PASS",
        (VerdictOutcome::Inconclusive, true) => "INCONCLUSIVE (no failure)",
        (VerdictOutcome::Inconclusive, false) => "FAIL (inconclusive, and --require)",
        (VerdictOutcome::Fail, _) => "FAIL",
    };
    let mark = |pass: bool| if pass { "pass" } else { "FAIL" };
    let mut parts = vec![format!("RSS {}", rss_mark(v.rss.outcome))];
    if let Some(d) = &v.disk {
        parts.push(format!("disk {}", disk_mark(d.outcome)));
    }
    parts.push(format!("statuses {}", mark(v.statuses.pass)));
    parts.push(format!("terminal records {}", mark(v.terminal.pass)));
    (t, format!("verdict {verdict}: {}", parts.join(", ")))
}

fn disk_mark(o: DiskOutcome) -> &'static str {
    match o {
        DiskOutcome::Pass => "pass",
        DiskOutcome::Fail => "FAIL",
        DiskOutcome::Inconclusive => "inconclusive",
        DiskOutcome::TooShort => "too short to judge",
        DiskOutcome::Unbounded => "no retention: not judged",
    }
}

/// A retention as a person reads it: sizes in MiB, ages in seconds.
fn retain_text(r: &agentvisor::ports::retention::Retention) -> String {
    let mut parts = Vec::new();
    if let Some(a) = r.max_age {
        parts.push(format!("max_age={} s", a.as_secs()));
    }
    if let Some(n) = r.max_runs {
        parts.push(format!("max_runs={n}"));
    }
    if let Some(b) = r.max_bytes {
        parts.push(format!("max_bytes={:.1} MiB", mib(b)));
    }
    parts.join(",")
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The panels, in reading order (left to right, then down).
fn panels(report: &Report, series: &[Sample]) -> Vec<Panel> {
    let (m, v) = (&report.summary, &report.verdict);
    let line = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        series.iter().map(|s| (s.t_s, f(s))).collect()
    };
    let mut panels = vec![
        Panel {
            title: format!(
                "runs completed per second: {:.0} runs/s over the soak, {} runs",
                m.runs_per_sec, m.runs_finished
            ),
            y_desc: "runs/s",
            lines: vec![Line::solid("runs/s", line(&|s| s.runs_per_sec), BLUE).agg(Agg::Mean)],
            log: false,
            legend: SeriesLabelPosition::LowerRight,
            headroom: 1.1,
        },
        Panel {
            title: format!(
                "latency of the runs ended each second (ms, log scale): whole soak p50 {}, p99 {}, max {}",
                ms(m.p50_ms),
                ms(m.p99_ms),
                ms(m.max_ms)
            ),
            y_desc: "ms",
            lines: vec![
                Line::solid("p50", line(&|s| s.p50_ms), BLUE).agg(Agg::Median),
                Line::solid("p99", line(&|s| s.p99_ms), RED).agg(Agg::Max),
            ],
            log: true,
            legend: SeriesLabelPosition::LowerRight,
            headroom: 1.1,
        },
        statuses_panel(report, series),
    ];

    // RSS, with the fitted slope over the judged window.
    let rss_pts: Vec<(f64, f64)> = line(&|s| s.rss_mib);
    let mut rss_lines = vec![Line::solid("RSS", rss_pts.clone(), BLUE).agg(Agg::Max)];
    if v.rss.outcome != RssOutcome::TooShort {
        if let Some(fit) = fitted(
            &rss_pts,
            v.rss.warmup_s,
            report.settings.duration_s,
            v.rss.slope_mib_per_min / 60.0,
        ) {
            rss_lines.push(
                Line::dashed(
                    format!("fit: {:+.2} MiB/min", v.rss.slope_mib_per_min),
                    fit,
                    BLACK_RGB,
                )
                .agg(Agg::Keep),
            );
        }
    }
    panels.push(Panel {
        title: format!(
            "RSS (MiB): peak {:.1}; slope {:+.3} %/min, 95 % in [{:+.3}, {:+.3}] [{}]",
            m.peak_rss_mib,
            v.rss.slope_pct_per_min,
            v.rss.slope_low_pct_per_min,
            v.rss.slope_high_pct_per_min,
            rss_mark(v.rss.outcome)
        ),
        y_desc: "MiB",
        lines: rss_lines,
        log: false,
        legend: SeriesLabelPosition::LowerRight,
        headroom: 1.1,
    });
    panels.push(disk_panel(report, series));
    panels.push(Panel {
        title: "CPU (% of one core)".to_string(),
        y_desc: "%",
        lines: vec![Line::solid("CPU", line(&|s| s.cpu_pct), ORANGE).agg(Agg::Mean)],
        log: false,
        legend: SeriesLabelPosition::LowerRight,
        headroom: 1.1,
    });
    panels.push(Panel {
        title: format!("runs alive (concurrency {})", report.settings.concurrency),
        y_desc: "runs",
        lines: vec![Line::solid("runs alive", line(&|s| s.live_runs as f64), GREEN).agg(Agg::Mean)],
        log: false,
        legend: SeriesLabelPosition::LowerRight,
        headroom: 1.1,
    });
    panels.push(Panel {
        title: "open file descriptors".to_string(),
        y_desc: "fds",
        lines: vec![Line::solid("fds", line(&|s| s.open_fds as f64), GRAY).agg(Agg::Max)],
        log: false,
        legend: SeriesLabelPosition::LowerRight,
        headroom: 1.1,
    });
    panels
}

/// `pts` in buckets of `bucket` consecutive points, one point each (at the
/// bucket's last time), made as `agg` says.
fn thin(pts: &[(f64, f64)], bucket: usize, agg: Agg) -> Vec<(f64, f64)> {
    if bucket <= 1 || agg == Agg::Keep {
        return pts.to_vec();
    }
    pts.chunks(bucket)
        .filter_map(|c| {
            let t = c.last()?.0;
            let ys = c.iter().map(|p| p.1);
            let y = match agg {
                Agg::Mean => ys.sum::<f64>() / c.len() as f64,
                Agg::Max => ys.fold(f64::MIN, f64::max),
                Agg::Last | Agg::Keep => c.last()?.1,
                Agg::Median => {
                    let mut v: Vec<f64> = ys.filter(|y| *y > 0.0).collect();
                    v.sort_unstable_by(f64::total_cmp);
                    v.get(v.len() / 2).copied().unwrap_or(0.0)
                }
            };
            Some((t, y))
        })
        .collect()
}

/// A latency in ms, to the precision that matters at its size.
fn ms(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0} ms")
    } else if x >= 1.0 {
        format!("{x:.1} ms")
    } else {
        format!("{x:.3} ms")
    }
}

fn rss_mark(o: RssOutcome) -> &'static str {
    match o {
        RssOutcome::Pass => "pass",
        RssOutcome::Fail => "FAIL",
        RssOutcome::Inconclusive => "inconclusive",
        RssOutcome::TooShort => "too short to judge",
    }
}

/// The Theil–Sen line of `slope` (a second) through `pts` from `from` to
/// `to`: its intercept is the median of y − slope·x over those points.
fn fitted(pts: &[(f64, f64)], from: f64, to: f64, slope: f64) -> Option<Vec<(f64, f64)>> {
    let mut offsets: Vec<f64> = pts
        .iter()
        .filter(|(t, _)| *t >= from && *t <= to + 0.5)
        .map(|(t, y)| y - slope * t)
        .collect();
    if offsets.len() < 2 {
        return None;
    }
    offsets.sort_unstable_by(f64::total_cmp);
    let b = offsets[offsets.len() / 2];
    Some(vec![(from, b + slope * from), (to, b + slope * to)])
}

/// A fault kind: its name, its count, its colour, the statuses it explains.
type Fault = (
    &'static str,
    fn(&ChaosCounts) -> u64,
    RGBColor,
    &'static [&'static str],
);

/// Each fault kind injected (dashed, cumulative) next to the statuses it
/// explains (solid, the same colour); a status nothing explains in black.
fn statuses_panel(report: &Report, series: &[Sample]) -> Panel {
    let v = &report.verdict.statuses;
    let cumulative = |key: &str| -> Vec<(f64, f64)> {
        series
            .iter()
            .map(|s| (s.t_s, s.statuses.get(key).copied().unwrap_or(0) as f64))
            .collect()
    };
    let injected = |f: fn(&ChaosCounts) -> u64| -> Vec<(f64, f64)> {
        series
            .iter()
            .filter_map(|s| s.chaos.as_ref().map(|c| (s.t_s, f(c) as f64)))
            .collect()
    };
    let last = |pts: &[(f64, f64)]| pts.last().map(|p| p.1 as u64).unwrap_or(0);
    let mut lines = Vec::new();
    let chaos = report.summary.chaos;
    let faults: [Fault; 4] = [
        ("hang", |c| c.hang, RED, &["killed/stalled"]),
        ("429", |c| c.rate_limited, ORANGE, &["error/rate_limited"]),
        (
            "malformed",
            |c| c.malformed,
            PURPLE,
            &[
                "error/tool_errors",
                "error/max_iterations",
                "killed/runaway",
            ],
        ),
        ("slow", |c| c.slow, TEAL, &[]),
    ];
    let mut shown: Vec<&str> = vec!["ok"];
    for (fault, count, color, statuses) in faults {
        if chaos.is_some() {
            let pts = injected(count);
            let n = last(&pts);
            let name = if statuses.is_empty() {
                format!("{fault} injected: {n} (runs end ok)")
            } else {
                format!("{fault} injected: {n}")
            };
            lines.push(Line::dashed(name, pts, color));
        }
        for (i, status) in statuses.iter().enumerate() {
            shown.push(*status);
            let pts = cumulative(status);
            let n = last(&pts);
            if n == 0 && chaos.is_none() {
                continue;
            }
            let allowed = v
                .explained
                .iter()
                .find(|e| e.status == *status)
                .map(|e| e.allowed);
            let name = match allowed {
                Some(a) if n > a => format!("{status}: {n} (only {a} explained)"),
                Some(a) => format!("{status}: {n} (≤ {a})"),
                None => format!("{status}: {n}"),
            };
            let mut l = Line::solid(name, pts, if i == 0 { color } else { BROWN });
            l.width = 3;
            lines.push(l);
        }
    }
    let others: Vec<&String> = report
        .summary
        .by_status
        .keys()
        .filter(|k| !shown.contains(&k.as_str()))
        .collect();
    for key in others {
        let pts = cumulative(key);
        let n = last(&pts);
        // What the verdict explains is said so (a status a fault explains
        // is drawn beside it above); the rest is not.
        let said = match v.explained.iter().find(|e| e.status == *key) {
            Some(e) if n <= e.allowed => format!("{key}: {n} (≤ {}, {})", e.allowed, e.cause),
            _ => format!("{key}: {n} (unexplained)"),
        };
        lines.push(Line::solid(said, pts, BLACK_RGB));
    }
    let ok = report.summary.by_status.get("ok").copied().unwrap_or(0);
    let what = if v.pass {
        "every status explained [pass]".to_string()
    } else {
        let list: Vec<String> = v
            .unexplained
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        format!("unexplained: {} [FAIL]", list.join(", "))
    };
    let title = if chaos.is_some() {
        format!(
            "faults injected (dashed) and the runs they ended (solid), cumulative; {ok} ok; {what}"
        )
    } else {
        format!("statuses other than ok, cumulative (no chaos); {ok} ok; {what}")
    };
    Panel {
        title,
        y_desc: "runs",
        lines,
        log: false,
        legend: SeriesLabelPosition::UpperLeft,
        headroom: 1.1,
    }
}

/// Database, WAL, spool and their sum; the retention bound; the fitted
/// slope over the judged window.
fn disk_panel(report: &Report, series: &[Sample]) -> Panel {
    let line = |f: &dyn Fn(&Sample) -> u64| -> Vec<(f64, f64)> {
        series.iter().map(|s| (s.t_s, mib(f(s)))).collect()
    };
    let Some(d) = &report.verdict.disk else {
        return Panel {
            title: format!("disk: nothing on disk (db {})", report.settings.db),
            y_desc: "MiB",
            lines: Vec::new(),
            log: false,
            legend: SeriesLabelPosition::UpperLeft,
            headroom: 1.1,
        };
    };
    let total = line(&|s| s.disk_bytes);
    let mut lines = vec![
        Line::solid("database + WAL + spool", total.clone(), BLUE).agg(Agg::Max),
        Line::solid("database", line(&|s| s.db_bytes), GREEN).agg(Agg::Max),
        Line::solid("WAL", line(&|s| s.wal_bytes), ORANGE).agg(Agg::Max),
    ];
    if series.iter().any(|s| s.spool_bytes > 0) {
        lines.push(Line::solid("spool", line(&|s| s.spool_bytes), RED).agg(Agg::Max));
    }
    if let Some(max) = d.retention.and_then(|r| r.max_bytes) {
        let (a, b) = (
            series.first().map(|s| s.t_s).unwrap_or(0.0),
            series.last().map(|s| s.t_s).unwrap_or(1.0),
        );
        lines.push(
            Line::dashed(
                format!("max_bytes {:.1} MiB", mib(max)),
                vec![(a, mib(max)), (b, mib(max))],
                GRAY,
            )
            .agg(Agg::Keep),
        );
    }
    if matches!(
        d.outcome,
        DiskOutcome::Pass | DiskOutcome::Fail | DiskOutcome::Inconclusive
    ) {
        if let Some(fit) = fitted(
            &total,
            d.warmup_s,
            report.settings.duration_s,
            d.slope_mib_per_min / 60.0,
        ) {
            lines.push(
                Line::dashed(
                    format!(
                        "fit from {:.0} s: {:+.2} MiB/min",
                        d.warmup_s, d.slope_mib_per_min
                    ),
                    fit,
                    BLACK_RGB,
                )
                .agg(Agg::Keep),
            );
        }
    }
    let judged = disk_mark(d.outcome);
    Panel {
        title: format!(
            "disk (MiB): peak {:.1} (database + WAL {:.1}); slope {:+.3} %/min ({:+.2} MiB/min) [{judged}]",
            d.peak_mib,
            report
                .summary
                .disk
                .as_ref()
                .map(|s| s.peak_db_wal_mib)
                .unwrap_or(0.0),
            d.slope_pct_per_min,
            d.slope_mib_per_min
        ),
        y_desc: "MiB",
        lines,
        log: false,
        legend: SeriesLabelPosition::UpperRight,
        headroom: 1.6,
    }
}

/// The time axis: its end and unit (points are in seconds).
struct XAxis {
    max: f64,
    per_unit: f64,
    desc: &'static str,
}

/// Draws one panel into its area.
fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    p: &Panel,
    x: &XAxis,
    marks: &[(f64, &str)],
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let ys = p.lines.iter().flat_map(|l| l.pts.iter().map(|p| p.1));
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&p.title, ("sans-serif", 15))
        .margin(10)
        .margin_right(20)
        .x_label_area_size(34)
        .y_label_area_size(64);
    if p.log {
        // Whole decades, each labelled (1, 10, 100 ms…), with light lines
        // at their multiples: labelling the multiples crowds the top of
        // each decade.
        let positive: Vec<f64> = ys.filter(|y| *y > 0.0).collect();
        let lo = positive.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = positive.iter().copied().fold(0.0, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > 0.0 {
            let lo = 10f64.powf(lo.log10().floor());
            let hi = 10f64.powf((hi * 1.05).log10().ceil());
            (lo, if hi > lo { hi } else { lo * 10.0 })
        } else {
            (0.1, 10.0)
        };
        let decades = (hi / lo).log10().round().max(1.0) as usize;
        let mut chart = builder
            .build_cartesian_2d(0.0..x.max, (lo..hi).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x.desc)
            .x_label_formatter(&|v| number(*v))
            .y_desc(p.y_desc)
            .y_labels(decades + 1)
            .y_label_formatter(&|v| number(*v))
            .light_line_style(BLACK.mix(0.05))
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(|e| err(&e))?;
        draw_lines(&mut chart, p, x.per_unit, marks, (lo, hi))
    } else {
        let hi = ys.fold(0.0, f64::max) * p.headroom;
        let hi = if hi > 0.0 { hi } else { 1.0 };
        let mut chart = builder
            .build_cartesian_2d(0.0..x.max, 0.0..hi)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x.desc)
            .x_label_formatter(&|v| number(*v))
            .y_desc(p.y_desc)
            .y_label_formatter(&|v| number(*v))
            .light_line_style(BLACK.mix(0.05))
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(|e| err(&e))?;
        draw_lines(&mut chart, p, x.per_unit, marks, (0.0, hi))
    }
}

/// An axis label: no more digits than it needs.
fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        let s = format!("{v:.1}");
        s.trim_end_matches(".0").to_string()
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The marks, then each line (broken where a log axis has no value), then
/// the legend; times in seconds, drawn in units of `per_unit` seconds.
fn draw_lines<'a, 'b: 'a, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, Y>>,
    p: &Panel,
    per_unit: f64,
    marks: &[(f64, &str)],
    (lo, hi): (f64, f64),
) -> Result<(), String>
where
    Y: Ranged<ValueType = f64>,
{
    let err = |e: &dyn std::fmt::Display| e.to_string();
    for (x, name) in marks.iter().filter(|(x, _)| *x > 0.0) {
        let x = &(x / per_unit);
        chart
            .draw_series(LineSeries::new([(*x, lo), (*x, hi)], BLACK.mix(0.3)))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(std::iter::once(Text::new(
                name.to_string(),
                (*x, hi),
                ("sans-serif", 11).into_font().color(&GRAY),
            )))
            .map_err(|e| err(&e))?;
    }
    let mut any = false;
    for l in &p.lines {
        // A log axis has no zero: a second without a value breaks the line.
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for &(x, y) in &l.pts {
            let x = x / per_unit;
            if p.log && y <= 0.0 {
                if segments.last().is_some_and(|s| !s.is_empty()) {
                    segments.push(Vec::new());
                }
            } else if let Some(s) = segments.last_mut() {
                s.push((x, y));
            }
        }
        let style = l.color.stroke_width(l.width);
        let mut labelled = false;
        for seg in segments.into_iter().filter(|s| !s.is_empty()) {
            // A lone point draws as a dot.
            let seg = if seg.len() == 1 {
                vec![seg[0], (seg[0].0 + 0.2 / per_unit, seg[0].1)]
            } else {
                seg
            };
            let drawn = if l.dashed {
                chart
                    .draw_series(DashedLineSeries::new(seg, 8u32, 5u32, style))
                    .map_err(|e| err(&e))?
            } else {
                chart
                    .draw_series(LineSeries::new(seg, style))
                    .map_err(|e| err(&e))?
            };
            if !labelled {
                let dashed = l.dashed;
                drawn.label(l.name.as_str()).legend(move |(x, y)| {
                    if dashed {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (7, 0)], style)
                            + PathElement::new(vec![(11, 0), (18, 0)], style)
                    } else {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (18, 0)], style)
                            + PathElement::new(vec![(18, 0), (18, 0)], style)
                    }
                });
                labelled = true;
                any = true;
            }
        }
    }
    if any {
        chart
            .configure_series_labels()
            .position(p.legend.clone())
            .label_font(("sans-serif", 13))
            .border_style(BLACK.mix(0.3))
            .background_style(WHITE.mix(0.85))
            .draw()
            .map_err(|e| err(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_numbers_carry_no_needless_digits() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(1500.0), "1500");
    }

    #[test]
    fn a_fitted_line_goes_through_the_middle_of_its_points() {
        let pts: Vec<(f64, f64)> = (0..100)
            .map(|t| (t as f64, 10.0 + 2.0 * t as f64))
            .collect();
        assert_eq!(
            fitted(&pts, 20.0, 90.0, 2.0),
            Some(vec![(20.0, 50.0), (90.0, 190.0)])
        );
        assert_eq!(fitted(&pts, 200.0, 300.0, 2.0), None);
    }

    #[test]
    fn long_series_are_thinned_by_bucket() {
        let pts: Vec<(f64, f64)> = (1..=7).map(|t| (t as f64, t as f64)).collect();
        assert_eq!(thin(&pts, 1, Agg::Mean), pts);
        assert_eq!(thin(&pts, 3, Agg::Keep), pts);
        assert_eq!(
            thin(&pts, 3, Agg::Mean),
            [(3.0, 2.0), (6.0, 5.0), (7.0, 7.0)]
        );
        assert_eq!(
            thin(&pts, 3, Agg::Max),
            [(3.0, 3.0), (6.0, 6.0), (7.0, 7.0)]
        );
        assert_eq!(
            thin(&pts, 3, Agg::Last),
            [(3.0, 3.0), (6.0, 6.0), (7.0, 7.0)]
        );
        // A p50 of 0 is a second without runs: not a value.
        let p50 = [(1.0, 0.0), (2.0, 5.0), (3.0, 9.0), (4.0, 0.0)];
        assert_eq!(thin(&p50, 4, Agg::Median), [(4.0, 9.0)]);
        assert_eq!(
            thin(&[(1.0, 0.0), (2.0, 0.0)], 2, Agg::Median),
            [(2.0, 0.0)]
        );
    }
}
