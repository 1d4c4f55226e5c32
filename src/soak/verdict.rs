//! The soak's verdict, in three parts, each a pure function of what the
//! soak measured (so each is tested on made-up series):
//!
//! - **RSS**: the robust slope of RSS over the samples after warm-up (the
//!   first 20 % of the duration or 30 s, whichever is smaller) up to the
//!   end of the duration (the drain is not judged), in % of their mean RSS
//!   per minute, against a limit of 1 %/min. The slope is Theil–Sen's (the
//!   median of the slopes between every two samples), which a few outlying
//!   samples (a GC-like step, a page-cache blip) cannot drag, with Sen's 95 %
//!   interval around it. The outcome:
//!   - `too_short` when fewer than 60 s or 10 samples are left after
//!     warm-up: nothing is judged, and that is no failure;
//!   - `pass` when the slope is under the limit;
//!   - `fail` when the whole interval is at or over the limit (the growth is
//!     clear, not noise);
//!   - `inconclusive` when the slope is over the limit but the interval
//!     reaches below it: a longer soak is needed to tell; no failure.
//!
//!   Samples a second apart are not independent (RSS moves in steps), so
//!   the interval is narrower than a true one: it tells noise from growth
//!   for the large, not the fine.
//! - **Disk** (database + WAL + spool; not judged with `--db :memory:`):
//!   under a retention that bounds anything, the same slope, limit and
//!   outcomes as RSS, over the samples after warm-up *and* after the
//!   bound was first reached (the file at 90 % of `max_bytes`, `max_runs`
//!   runs finished, `max_age` passed): a file filling up to its bound is
//!   not growth. A soak that never reached its bound is `too_short`.
//!   Without retention the database keeps every run and grows by design:
//!   the slope is stated as `unbounded`, not judged, and no failure.
//! - **Statuses**: every status must be explained by the chaos injected:
//!   `ok` always; `killed/stalled` by hangs (a hung call ends its run that
//!   way: at most one per hang); `error/rate_limited` by 429s (at most one
//!   per 429; fewer when a retry layer absorbs them); `error/tool_errors` by
//!   malformed tool calls (`max_tool_errors` in a row each);
//!   `error/max_iterations` by malformed tool calls (each adds a model
//!   call); `killed/runaway` by malformed tool calls too (the same tool
//!   error again and again is the `same_error` loop: one per threshold's
//!   worth of them). Without chaos, only `ok`. Anything else, or more of a status
//!   than its cause allows, is unexplained.
//! - **Terminal records**: after the host's shutdown has drained the audit
//!   actor, the store's count of terminal records equals the runs
//!   submitted, and every submitted run's handle gave a result.
//!
//! The whole verdict's [`outcome`](Verdict::outcome) is `fail` when a part
//! failed (or a submit did), else `inconclusive` when a part could not be
//! judged (the RSS or disk slope `too_short` or `inconclusive`: the soak
//! did not show the process keeps its memory, or its disk), else `pass`. An inconclusive
//! verdict is no failure (`pass` stays true, and `agentvisor soak` exits 0
//! with a warning) unless the caller requires a conclusive one
//! ([`Verdict::require_conclusive`], `soak --require`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ports::retention::Retention;
use crate::providers::chaos::ChaosCounts;

use super::figures::{mib, round3};

/// The RSS slope a soak may show after warm-up, in % per minute.
pub const RSS_SLOPE_LIMIT_PCT_PER_MIN: f64 = 1.0;

/// The least time after warm-up a soak must have run for its RSS slope to
/// be judged, in seconds.
pub const RSS_MIN_WINDOW_S: f64 = 60.0;

/// The fewest samples after warm-up for the RSS slope to be judged.
pub const RSS_MIN_SAMPLES: usize = 10;

/// The confidence of the RSS slope's interval.
pub const RSS_CONFIDENCE: f64 = 0.95;

/// z of a two-sided 95 % interval.
const Z_95: f64 = 1.959_964;

/// The most samples the slope is taken over (evenly thinned beyond: the
/// pairs grow with the square of the samples).
const MAX_SLOPE_POINTS: usize = 1000;

/// What the RSS part of the verdict found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RssOutcome {
    /// The slope is under the limit.
    Pass,
    /// The slope's whole interval is at or over the limit.
    Fail,
    /// The slope is over the limit, its interval reaches below it.
    Inconclusive,
    /// Too little time or too few samples after warm-up to judge.
    TooShort,
}

/// The RSS part of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RssVerdict {
    /// Seconds not judged at the start.
    pub warmup_s: f64,
    /// Samples judged (after warm-up, up to the end of the duration).
    pub samples: usize,
    /// Seconds from the first judged sample to the last.
    pub window_s: f64,
    /// Their mean RSS.
    pub mean_rss_mib: f64,
    /// The slope (Theil–Sen), in MiB per minute.
    pub slope_mib_per_min: f64,
    /// The slope in % of the mean RSS per minute.
    pub slope_pct_per_min: f64,
    /// The low end of the slope's interval, in % per minute.
    pub slope_low_pct_per_min: f64,
    /// The high end of the slope's interval, in % per minute.
    pub slope_high_pct_per_min: f64,
    /// The interval's confidence (0.95).
    pub confidence: f64,
    /// How the slope is taken: `theil_sen`.
    pub method: &'static str,
    /// The limit, in % per minute.
    pub limit_pct_per_min: f64,
    /// What was found.
    pub outcome: RssOutcome,
    /// The outcome, said in a sentence.
    pub reason: String,
    /// No failure: every outcome but `fail`.
    pub pass: bool,
}

/// A slope with its interval, in units of y per unit of x.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slope {
    /// The median of the pairwise slopes.
    pub slope: f64,
    /// The interval's low end.
    pub low: f64,
    /// The interval's high end.
    pub high: f64,
}

/// Theil–Sen's slope of `points` (x, y) with Sen's interval at `z` (1.96
/// for 95 %); `None` with fewer than two distinct x. Beyond 1000 points, an
/// even thinning of them is used.
pub fn theil_sen(points: &[(f64, f64)], z: f64) -> Option<Slope> {
    let stride = points.len().div_ceil(MAX_SLOPE_POINTS).max(1);
    let pts: Vec<(f64, f64)> = points.iter().step_by(stride).copied().collect();
    let mut slopes = Vec::with_capacity(pts.len() * pts.len().saturating_sub(1) / 2);
    for (i, a) in pts.iter().enumerate() {
        for b in &pts[i + 1..] {
            let dx = b.0 - a.0;
            if dx != 0.0 {
                slopes.push((b.1 - a.1) / dx);
            }
        }
    }
    if slopes.is_empty() {
        return None;
    }
    slopes.sort_unstable_by(f64::total_cmp);
    let m = slopes.len();
    let slope = if m % 2 == 1 {
        slopes[m / 2]
    } else {
        (slopes[m / 2 - 1] + slopes[m / 2]) / 2.0
    };
    // Sen (1968): the interval's ends are the slopes at ranks
    // (N ∓ z·σ_S)/2, σ_S² = n(n−1)(2n+5)/18 the variance of Kendall's S.
    let n = pts.len() as f64;
    let c = z * (n * (n - 1.0) * (2.0 * n + 5.0) / 18.0).sqrt();
    let lo_rank = ((m as f64 - c) / 2.0).floor().max(1.0) as usize;
    let hi_rank = (((m as f64 + c) / 2.0).ceil() as usize + 1).min(m);
    Some(Slope {
        slope,
        low: slopes[lo_rank.min(m) - 1],
        high: slopes[hi_rank.max(1) - 1],
    })
}

/// A series' slope judged against a limit over a window (see the module
/// doc): what [`rss_verdict`] and [`disk_verdict`] share.
struct Judged {
    /// Samples in the window.
    n: usize,
    /// Seconds from its first sample to its last.
    window_s: f64,
    /// Their mean.
    mean: f64,
    /// Theil–Sen, in units a second.
    slope: Slope,
    /// The slope and its interval's ends, in % of the mean a minute.
    pct: (f64, f64, f64),
    /// What was found.
    outcome: RssOutcome,
    /// Why, in a sentence.
    reason: String,
}

/// Judges the slope of `samples` (seconds, value) from `from_s` to the end
/// of the duration (a sample up to 0.5 s late still counts), against
/// `limit` % of the mean a minute.
fn judge_slope(samples: &[(f64, f64)], from_s: f64, duration_s: f64, limit: f64) -> Judged {
    let judged: Vec<(f64, f64)> = samples
        .iter()
        .filter(|(t, _)| *t >= from_s && *t <= duration_s + 0.5)
        .copied()
        .collect();
    let n = judged.len();
    let mean = judged.iter().map(|p| p.1).sum::<f64>() / (n.max(1) as f64);
    let window_s = match (judged.first(), judged.last()) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0.0,
    };
    let slope = theil_sen(&judged, Z_95).unwrap_or(Slope {
        slope: 0.0,
        low: 0.0,
        high: 0.0,
    });
    let pct = |per_s: f64| {
        if mean > 0.0 {
            per_s * 60.0 / mean * 100.0
        } else {
            0.0
        }
    };
    let (point, low, high) = (pct(slope.slope), pct(slope.low), pct(slope.high));
    let (outcome, reason) = if window_s < RSS_MIN_WINDOW_S || n < RSS_MIN_SAMPLES {
        (
            RssOutcome::TooShort,
            format!(
                "too short to judge: {window_s:.0} s and {n} samples after warm-up \
                 (at least {RSS_MIN_WINDOW_S:.0} s and {RSS_MIN_SAMPLES} needed)"
            ),
        )
    } else if point < limit {
        (
            RssOutcome::Pass,
            format!("{point:+.3} %/min is under {limit} %/min"),
        )
    } else if low >= limit {
        (
            RssOutcome::Fail,
            format!(
                "{point:+.3} %/min, and all of its 95 % interval \
                 [{low:+.3}, {high:+.3}] is at or over {limit} %/min"
            ),
        )
    } else {
        (
            RssOutcome::Inconclusive,
            format!(
                "{point:+.3} %/min is over {limit} %/min, but its 95 % interval \
                 [{low:+.3}, {high:+.3}] reaches below it: soak longer to tell"
            ),
        )
    };
    Judged {
        n,
        window_s,
        mean,
        slope,
        pct: (point, low, high),
        outcome,
        reason,
    }
}

/// Four decimals: the slopes in % a minute.
fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// Bytes a second in MiB a minute.
fn mib_per_min(bytes_per_s: f64) -> f64 {
    round3(bytes_per_s * 60.0 / (1024.0 * 1024.0))
}

/// The warm-up of a soak of `duration_s`: its first 20 %, at most 30 s.
pub fn warmup_s(duration_s: f64) -> f64 {
    (0.2 * duration_s).min(30.0)
}

/// Judges RSS after warm-up (see the module doc). `samples` are `(seconds
/// since start, RSS bytes)`; `duration_s` is how long runs were started.
pub fn rss_verdict(samples: &[(f64, u64)], duration_s: f64) -> RssVerdict {
    let warmup_s = warmup_s(duration_s);
    let points: Vec<(f64, f64)> = samples.iter().map(|&(t, r)| (t, r as f64)).collect();
    let j = judge_slope(&points, warmup_s, duration_s, RSS_SLOPE_LIMIT_PCT_PER_MIN);
    RssVerdict {
        warmup_s: round3(warmup_s),
        samples: j.n,
        window_s: round3(j.window_s),
        mean_rss_mib: round3(mib(j.mean as u64)),
        slope_mib_per_min: mib_per_min(j.slope.slope),
        slope_pct_per_min: round4(j.pct.0),
        slope_low_pct_per_min: round4(j.pct.1),
        slope_high_pct_per_min: round4(j.pct.2),
        confidence: RSS_CONFIDENCE,
        method: "theil_sen",
        limit_pct_per_min: RSS_SLOPE_LIMIT_PCT_PER_MIN,
        pass: j.outcome != RssOutcome::Fail,
        outcome: j.outcome,
        reason: j.reason,
    }
}

/// The disk use a soak under retention may grow by after warm-up, in % per
/// minute: the same bar as RSS.
pub const DISK_SLOPE_LIMIT_PCT_PER_MIN: f64 = 1.0;

/// The share of `max_bytes` the database file must reach for the bound to
/// count as reached (pruning keeps the pages in use at the bound, and a
/// sample a second may miss the top of each cycle).
pub const DISK_BOUND_REACHED: f64 = 0.9;

/// One disk sample: what [`disk_verdict`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DiskPoint {
    /// Seconds since the start.
    pub t_s: f64,
    /// Database + WAL + spool, in bytes.
    pub total_bytes: u64,
    /// The database file alone.
    pub db_bytes: u64,
    /// Runs finished so far (against `max_runs`).
    pub runs_finished: u64,
}

/// What the disk part of the verdict found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskOutcome {
    /// The slope after the bound was reached is under the limit.
    Pass,
    /// The slope's whole interval is at or over the limit.
    Fail,
    /// The slope is over the limit, its interval reaches below it.
    Inconclusive,
    /// Too little time after warm-up (or the retention bound was never
    /// reached) to judge.
    TooShort,
    /// No retention was asked: the database keeps every run and grows by
    /// design. The slope is stated, not judged.
    Unbounded,
}

/// The disk part of the verdict: database + WAL + spool over time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiskVerdict {
    /// The retention the soak ran under (`null`: none).
    pub retention: Option<Retention>,
    /// When the retention bound was first reached (the database at
    /// [`DISK_BOUND_REACHED`] of `max_bytes`, `max_runs` runs finished,
    /// `max_age` passed), in seconds; `null` if it never was.
    pub bound_reached_s: Option<f64>,
    /// Seconds not judged at the start: the warm-up, or until the bound
    /// was reached if that was later.
    pub warmup_s: f64,
    /// Samples judged.
    pub samples: usize,
    /// Seconds from the first judged sample to the last.
    pub window_s: f64,
    /// Their mean disk use.
    pub mean_mib: f64,
    /// The most disk used at any sample (database + WAL + spool).
    pub peak_mib: f64,
    /// The slope (Theil–Sen), in MiB per minute.
    pub slope_mib_per_min: f64,
    /// The slope in % of the mean disk use per minute.
    pub slope_pct_per_min: f64,
    /// The low end of the slope's interval, in % per minute.
    pub slope_low_pct_per_min: f64,
    /// The high end of the slope's interval, in % per minute.
    pub slope_high_pct_per_min: f64,
    /// The interval's confidence (0.95).
    pub confidence: f64,
    /// How the slope is taken: `theil_sen`.
    pub method: &'static str,
    /// The limit, in % per minute.
    pub limit_pct_per_min: f64,
    /// What was found.
    pub outcome: DiskOutcome,
    /// The outcome, said in a sentence.
    pub reason: String,
    /// No failure: every outcome but `fail`.
    pub pass: bool,
}

/// How far past `max_bytes` database + WAL + spool may go once the bound
/// is reached (the WAL between two truncations, a batch not yet pruned).
pub const DISK_BOUND_SLACK: f64 = 1.25;

/// When `retention` first bounds what `samples` show (see
/// [`DiskVerdict::bound_reached_s`]): the earliest of its bounds.
fn bound_reached(samples: &[DiskPoint], retention: &Retention) -> Option<f64> {
    let by_bytes = retention.max_bytes.and_then(|max| {
        samples
            .iter()
            .find(|p| p.db_bytes as f64 >= DISK_BOUND_REACHED * max as f64)
            .map(|p| p.t_s)
    });
    let by_runs = retention.max_runs.and_then(|max| {
        samples
            .iter()
            .find(|p| p.runs_finished >= max)
            .map(|p| p.t_s)
    });
    let by_age = retention.max_age.and_then(|age| {
        samples
            .iter()
            .find(|p| p.t_s >= age.as_secs_f64())
            .map(|p| p.t_s)
    });
    [by_bytes, by_runs, by_age]
        .into_iter()
        .flatten()
        .min_by(f64::total_cmp)
}

/// Judges disk use (database + WAL + spool) over a soak of `duration_s`
/// under `retention`. With a retention that bounds anything, the disk must
/// be flat once the bound is reached and the warm-up is over: its slope is
/// judged as RSS's is (`too_short` when the bound was never reached or too
/// little time is left after it). Without one, the database keeps every
/// run: the slope over the same window as RSS's is stated, as
/// `unbounded`, and not judged.
pub fn disk_verdict(
    samples: &[DiskPoint],
    duration_s: f64,
    retention: Option<Retention>,
) -> DiskVerdict {
    let retention = retention.filter(Retention::is_set);
    let warmup = warmup_s(duration_s);
    let reached = retention.as_ref().and_then(|r| bound_reached(samples, r));
    let from_s = reached.map_or(warmup, |t| t.max(warmup));
    let points: Vec<(f64, f64)> = samples
        .iter()
        .map(|p| (p.t_s, p.total_bytes as f64))
        .collect();
    let j = judge_slope(&points, from_s, duration_s, DISK_SLOPE_LIMIT_PCT_PER_MIN);
    let peak = samples.iter().map(|p| p.total_bytes).max().unwrap_or(0);
    let per_min = mib_per_min(j.slope.slope);
    let (outcome, reason) = match (&retention, reached) {
        (None, _) => (
            DiskOutcome::Unbounded,
            format!(
                "no retention: the database keeps every run ({per_min:+.2} MiB/min \
                 after warm-up); not judged"
            ),
        ),
        (Some(r), None) => (
            DiskOutcome::TooShort,
            format!(
                "too short to judge: the retention bound ({r}) was not reached \
                 (peak {:.1} MiB)",
                mib(peak)
            ),
        ),
        (Some(r), Some(_)) => {
            // Past the bound by more than its slack after it was reached:
            // pruning did not keep the file bounded, whatever the slope.
            let over = r.max_bytes.and_then(|max| {
                let judged_peak = samples
                    .iter()
                    .filter(|p| p.t_s >= from_s)
                    .map(|p| p.total_bytes)
                    .max()?;
                let limit = (DISK_BOUND_SLACK * max as f64) as u64;
                (judged_peak > limit).then(|| {
                    format!(
                        "database + WAL + spool reached {:.1} MiB after the bound was \
                         reached, over {DISK_BOUND_SLACK}× max_bytes ({:.1} MiB)",
                        mib(judged_peak),
                        mib(max)
                    )
                })
            });
            match over {
                Some(reason) => (DiskOutcome::Fail, reason),
                None => (
                    match j.outcome {
                        RssOutcome::Pass => DiskOutcome::Pass,
                        RssOutcome::Fail => DiskOutcome::Fail,
                        RssOutcome::Inconclusive => DiskOutcome::Inconclusive,
                        RssOutcome::TooShort => DiskOutcome::TooShort,
                    },
                    j.reason,
                ),
            }
        }
    };
    DiskVerdict {
        retention,
        bound_reached_s: reached.map(round3),
        warmup_s: round3(from_s),
        samples: j.n,
        window_s: round3(j.window_s),
        mean_mib: round3(mib(j.mean as u64)),
        peak_mib: round3(mib(peak)),
        slope_mib_per_min: per_min,
        slope_pct_per_min: round4(j.pct.0),
        slope_low_pct_per_min: round4(j.pct.1),
        slope_high_pct_per_min: round4(j.pct.2),
        confidence: RSS_CONFIDENCE,
        method: "theil_sen",
        limit_pct_per_min: DISK_SLOPE_LIMIT_PCT_PER_MIN,
        pass: outcome != DiskOutcome::Fail,
        outcome,
        reason,
    }
}

/// The statuses part of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusVerdict {
    /// Each non-`ok` status seen: what explains it and how many it allows.
    pub explained: Vec<Explained>,
    /// Runs per status that nothing explains (an unknown status, or more
    /// than its cause allows).
    pub unexplained: BTreeMap<String, u64>,
    /// Nothing is unexplained.
    pub pass: bool,
}

/// One status the chaos may explain.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explained {
    /// The status key (`killed/stalled`).
    pub status: String,
    /// Runs that ended so.
    pub runs: u64,
    /// The fault that explains it.
    pub cause: &'static str,
    /// How many runs that fault explains at most.
    pub allowed: u64,
}

/// The default threshold of the `same_error` loop detector (a manifest
/// may set its own; the soak's workload keeps the default).
const SAME_ERROR_DEFAULT: u16 = crate::ports::critic::LOOPS_DEFAULT.same_error;

/// Judges the statuses against the faults injected (see the module doc).
pub fn explain_statuses(
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
            // Malformed calls in a row end in the same tool error each
            // time: the critic's `same_error` loop detector takes that for
            // a runaway loop (rightly) once it repeats its threshold.
            "killed/runaway" => Some((
                "malformed (the same error repeated)",
                c.malformed / u64::from(SAME_ERROR_DEFAULT.max(1)),
            )),
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

/// The terminal-records part of the verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TerminalVerdict {
    /// Runs the host accepted.
    pub runs_submitted: u64,
    /// Results their handles gave.
    pub results: u64,
    /// Terminal records the store counted.
    pub terminal_records: u64,
    /// One result and one terminal record per run.
    pub pass: bool,
}

impl TerminalVerdict {
    /// Judges the counts.
    pub fn of(runs_submitted: u64, results: u64, terminal_records: u64) -> Self {
        TerminalVerdict {
            runs_submitted,
            results,
            terminal_records,
            pass: results == runs_submitted && terminal_records == runs_submitted,
        }
    }
}

/// What the whole verdict found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictOutcome {
    /// Every part was judged and passed.
    Pass,
    /// A part failed, or a submit did.
    Fail,
    /// Nothing failed, but a part could not be judged (see
    /// [`Verdict::unjudged`]).
    Inconclusive,
}

/// The whole verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// No part failed and no submit did (and, when a conclusive verdict is
    /// required, every part was judged).
    pub pass: bool,
    /// `pass`, `fail` or `inconclusive` (see the module doc).
    pub outcome: VerdictOutcome,
    /// The parts that could not be judged, each with why (`rss: too short
    /// to judge: …`); empty when every part was.
    pub unjudged: Vec<String>,
    /// A conclusive verdict was required: an inconclusive one fails.
    pub require_conclusive: bool,
    /// RSS over time.
    pub rss: RssVerdict,
    /// Disk use over time (`null` when nothing is on disk: `--db
    /// :memory:`).
    pub disk: Option<DiskVerdict>,
    /// Statuses against the faults injected.
    pub statuses: StatusVerdict,
    /// Terminal records against runs.
    pub terminal: TerminalVerdict,
}

impl Verdict {
    /// Puts the parts together; `submit_errors` is how many submits the
    /// host refused (any fails the verdict).
    pub fn of(
        rss: RssVerdict,
        disk: Option<DiskVerdict>,
        statuses: StatusVerdict,
        terminal: TerminalVerdict,
        submit_errors: u64,
    ) -> Self {
        let disk_pass = disk.as_ref().is_none_or(|d| d.pass);
        let failed =
            !(rss.pass && disk_pass && statuses.pass && terminal.pass && submit_errors == 0);
        let mut unjudged = Vec::new();
        if matches!(rss.outcome, RssOutcome::TooShort | RssOutcome::Inconclusive) {
            unjudged.push(format!("rss: {}", rss.reason));
        }
        if let Some(d) = &disk {
            if matches!(d.outcome, DiskOutcome::TooShort | DiskOutcome::Inconclusive) {
                unjudged.push(format!("disk: {}", d.reason));
            }
        }
        let outcome = if failed {
            VerdictOutcome::Fail
        } else if !unjudged.is_empty() {
            VerdictOutcome::Inconclusive
        } else {
            VerdictOutcome::Pass
        };
        Verdict {
            pass: !failed,
            outcome,
            unjudged,
            require_conclusive: false,
            rss,
            disk,
            statuses,
            terminal,
        }
    }

    /// Requires a conclusive verdict: an inconclusive one no longer passes.
    pub fn require_conclusive(&mut self) {
        self.require_conclusive = true;
        if self.outcome == VerdictOutcome::Inconclusive {
            self.pass = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    /// 100 MiB growing `mib_per_min`, sampled every second for `secs`.
    fn line(mib_per_min: f64, secs: u64) -> Vec<(f64, u64)> {
        (1..=secs)
            .map(|t| {
                (
                    t as f64,
                    (100.0 * MIB + mib_per_min * MIB / 60.0 * t as f64) as u64,
                )
            })
            .collect()
    }

    #[test]
    fn slope_of_a_line_is_its_rate_relative_to_the_mean() {
        // 1 MiB a minute for 10 min: mean ≈ 105.25 MiB, so ≈ 0.95 %/min.
        let v = rss_verdict(&line(1.0, 600), 600.0);
        assert_eq!((v.warmup_s, v.samples, v.window_s), (30.0, 571, 570.0));
        assert!((v.slope_mib_per_min - 1.0).abs() < 1e-3, "{v:?}");
        let mean_mib = 100.0 + (30.0 + 600.0) / 2.0 / 60.0;
        assert!(
            (v.slope_pct_per_min - 100.0 / mean_mib).abs() < 1e-3,
            "{v:?}"
        );
        assert_eq!((v.outcome, v.pass), (RssOutcome::Pass, true));
        assert_eq!(v.method, "theil_sen");
        // A line has no noise: the interval is the slope.
        assert!((v.slope_high_pct_per_min - v.slope_low_pct_per_min).abs() < 1e-3);

        // Twice as steep fails.
        let v = rss_verdict(&line(2.0, 600), 600.0);
        assert_eq!((v.outcome, v.pass), (RssOutcome::Fail, false), "{v:?}");
    }

    #[test]
    fn a_verdict_that_could_not_judge_memory_says_so() {
        let statuses = explain_statuses(&BTreeMap::from([("ok".to_string(), 10)]), None, 3);
        let terminal = TerminalVerdict::of(10, 10, 10);
        // 10 s: too short for the RSS slope.
        let short = rss_verdict(&line(0.0, 10), 10.0);
        let v = Verdict::of(short.clone(), None, statuses.clone(), terminal.clone(), 0);
        assert_eq!(v.outcome, VerdictOutcome::Inconclusive);
        assert!(v.pass, "inconclusive is no failure");
        assert_eq!(v.unjudged.len(), 1);
        assert!(
            v.unjudged[0].starts_with("rss: too short"),
            "{:?}",
            v.unjudged
        );
        let mut required = v.clone();
        required.require_conclusive();
        assert!(!required.pass);
        assert_eq!(required.outcome, VerdictOutcome::Inconclusive);
        // Judged and flat: a pass, which requiring leaves a pass.
        let long = rss_verdict(&line(0.0, 600), 600.0);
        let mut v = Verdict::of(long, None, statuses.clone(), terminal.clone(), 0);
        v.require_conclusive();
        assert_eq!((v.outcome, v.pass), (VerdictOutcome::Pass, true));
        assert!(v.unjudged.is_empty());
        // A failed part wins over an unjudged one.
        let v = Verdict::of(short, None, statuses, TerminalVerdict::of(10, 9, 9), 0);
        assert_eq!((v.outcome, v.pass), (VerdictOutcome::Fail, false));
    }

    #[test]
    fn outliers_do_not_move_the_slope() {
        // Flat at 100 MiB with a few samples far off either way: least
        // squares would read a slope from where they fall; the median of
        // pairwise slopes does not.
        let mut samples = line(0.0, 300);
        for (i, s) in samples.iter_mut().enumerate() {
            if i % 37 == 0 {
                s.1 = if i > 150 { 400 << 20 } else { 10 << 20 };
            }
        }
        let v = rss_verdict(&samples, 300.0);
        assert_eq!(v.slope_pct_per_min, 0.0, "{v:?}");
        assert_eq!(v.outcome, RssOutcome::Pass);
    }

    #[test]
    fn noise_around_a_slope_over_the_limit_is_inconclusive_not_a_failure() {
        // 12 samples 6 s apart after warm-up, 1.2 MiB/min (≈ 1.2 %/min)
        // under ±0.3 MiB of noise: the slope is over the limit, its
        // interval reaches below it.
        let noise = [
            0.3, -0.2, 0.1, -0.3, 0.2, 0.0, -0.1, 0.3, -0.2, 0.1, -0.3, 0.2,
        ];
        let samples: Vec<(f64, u64)> = noise
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let t = 20.0 + 6.0 * i as f64;
                (t, ((100.0 + 1.2 * t / 60.0 + n) * MIB) as u64)
            })
            .collect();
        let v = rss_verdict(&samples, 100.0);
        assert!(v.slope_pct_per_min >= 1.0, "{v:?}");
        assert!(v.slope_low_pct_per_min < 1.0, "{v:?}");
        assert_eq!((v.outcome, v.pass), (RssOutcome::Inconclusive, true));
        assert!(v.reason.contains("soak longer"), "{}", v.reason);
    }

    #[test]
    fn a_short_soak_is_too_short_to_judge_not_a_failure() {
        // 10 s: warm-up is 2 s (20 %), 9 samples after it, steeply growing.
        let v = rss_verdict(&line(600.0, 10), 10.0);
        assert_eq!((v.warmup_s, v.samples), (2.0, 9));
        assert_eq!((v.outcome, v.pass), (RssOutcome::TooShort, true));
        assert!(v.slope_pct_per_min > 1.0, "the slope is still stated");
        assert!(v.reason.starts_with("too short to judge"), "{}", v.reason);
        // Drain samples (after the duration) are not judged either.
        let mut with_drain = line(0.0, 10);
        with_drain.push((12.0, 900 << 20));
        assert_eq!(rss_verdict(&with_drain, 10.0).samples, 9);
    }

    #[test]
    fn warm_up_growth_is_not_judged() {
        // 100 s soak: warm-up 20 s. A jump in the first 20 s, then flat.
        let samples: Vec<(f64, u64)> = (1..=100)
            .map(|t| (t as f64, if t < 20 { 10 } else { 500 } << 20))
            .collect();
        let v = rss_verdict(&samples, 100.0);
        assert_eq!((v.warmup_s, v.samples), (20.0, 81));
        assert_eq!(v.slope_pct_per_min, 0.0);
        assert_eq!(v.outcome, RssOutcome::Pass);
    }

    #[test]
    fn too_few_samples_are_not_judged() {
        let v = rss_verdict(&[(1.0, 1 << 20)], 1.0);
        assert_eq!((v.samples, v.slope_pct_per_min, v.pass), (1, 0.0, true));
        assert_eq!(v.outcome, RssOutcome::TooShort);
        assert!(rss_verdict(&[], 5.0).pass);
    }

    #[test]
    fn shrinking_rss_passes() {
        let samples: Vec<(f64, u64)> = (1..=100).map(|t| (t as f64, (1000 - t) << 20)).collect();
        let v = rss_verdict(&samples, 100.0);
        assert!(v.slope_pct_per_min < 0.0 && v.pass, "{v:?}");
    }

    #[test]
    fn theil_sen_thins_long_series_and_needs_two_distinct_times() {
        assert_eq!(theil_sen(&[(1.0, 1.0), (1.0, 5.0)], Z_95), None);
        let long: Vec<(f64, f64)> = (0..5000).map(|t| (t as f64, 3.0 * t as f64)).collect();
        let s = theil_sen(&long, Z_95).map(|s| s.slope);
        assert_eq!(s, Some(3.0));
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

        // Runaway kills: one per `same_error` threshold of malformed calls.
        let per = u64::from(SAME_ERROR_DEFAULT);
        let runaway = |n: u64| statuses(&[("ok", 900), ("killed/runaway", n)]);
        assert!(explain_statuses(&runaway(9 / per), Some(injected), 3).pass);
        let v = explain_statuses(&runaway(9 / per + 1), Some(injected), 3);
        assert_eq!(v.unexplained, statuses(&[("killed/runaway", 1)]));

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

    /// Disk samples every second for `secs`: `total(t)` bytes, the
    /// database the same, 100 runs finished a second.
    fn disk(secs: u64, total: impl Fn(f64) -> f64) -> Vec<DiskPoint> {
        (1..=secs)
            .map(|t| {
                let b = total(t as f64) as u64;
                DiskPoint {
                    t_s: t as f64,
                    total_bytes: b,
                    db_bytes: b,
                    runs_finished: 100 * t,
                }
            })
            .collect()
    }

    fn retain(s: &str) -> Option<Retention> {
        Some(s.parse().unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn a_disk_that_keeps_growing_under_retention_fails() {
        // 50 MiB bound reached at 20 s, then 5 MiB a minute more (≈ 9 %/min
        // of ≈ 55 MiB) to the end of 5 minutes: pruning does not keep up.
        let samples = disk(300, |t| {
            if t < 20.0 {
                t * 2.5 * MIB
            } else {
                50.0 * MIB + (t - 20.0) * 5.0 * MIB / 60.0
            }
        });
        let v = disk_verdict(&samples, 300.0, retain("max_bytes=50MiB"));
        assert_eq!(v.bound_reached_s, Some(18.0), "{v:?}");
        assert_eq!(v.warmup_s, 30.0, "the warm-up is the later of the two");
        assert!((v.slope_mib_per_min - 5.0).abs() < 1e-3, "{v:?}");
        assert_eq!((v.outcome, v.pass), (DiskOutcome::Fail, false), "{v:?}");
        let statuses = explain_statuses(&BTreeMap::new(), None, 3);
        let flat_rss = rss_verdict(&line(0.0, 300), 300.0);
        let verdict = Verdict::of(flat_rss, Some(v), statuses, TerminalVerdict::of(1, 1, 1), 0);
        assert_eq!(
            (verdict.outcome, verdict.pass),
            (VerdictOutcome::Fail, false)
        );
    }

    #[test]
    fn a_disk_far_past_its_bound_fails_however_flat() {
        // Reaches the 50 MiB bound, then sits flat at 80 MiB (pruning fell
        // behind once and never caught up, or a reader held the WAL): the
        // slope is nil, the file is not bounded.
        let samples = disk(300, |t| (t * 2.0).min(80.0) * MIB);
        let v = disk_verdict(&samples, 300.0, retain("max_bytes=50MiB"));
        assert_eq!(v.slope_pct_per_min, 0.0, "{v:?}");
        assert_eq!((v.outcome, v.pass), (DiskOutcome::Fail, false), "{v:?}");
        assert!(v.reason.contains("over 1.25× max_bytes"), "{}", v.reason);
        // Within the slack (the WAL between truncations): a pass.
        let samples = disk(300, |t| (t * 2.0).min(60.0) * MIB);
        let v = disk_verdict(&samples, 300.0, retain("max_bytes=50MiB"));
        assert_eq!((v.outcome, v.pass), (DiskOutcome::Pass, true), "{v:?}");
    }

    #[test]
    fn a_disk_flat_at_its_bound_passes_and_the_fill_is_not_judged() {
        // Fills at 1 MiB/s up to 50 MiB (at 50 s, after the 30 s warm-up),
        // then saw-tooths around the bound as pruning and checkpoints run.
        let samples = disk(300, |t| {
            if t < 50.0 {
                t * MIB
            } else {
                50.0 * MIB
                    + if (t as u64).is_multiple_of(7) {
                        4.0 * MIB
                    } else {
                        0.0
                    }
            }
        });
        let v = disk_verdict(&samples, 300.0, retain("max_bytes=50MiB"));
        assert_eq!(v.bound_reached_s, Some(45.0));
        assert_eq!(v.warmup_s, 45.0);
        assert_eq!(v.slope_pct_per_min, 0.0, "{v:?}");
        assert_eq!((v.outcome, v.pass), (DiskOutcome::Pass, true), "{v:?}");
        assert_eq!(v.peak_mib, 54.0);
        // A slow fill (to 50 MiB at 150 s): judged from the end of warm-up
        // it would read as growth; from when the bound was reached, flat.
        let slow = disk(300, |t| (t / 3.0).min(50.0) * MIB);
        let v = disk_verdict(&slow, 300.0, retain("max_bytes=50MiB"));
        assert_eq!(v.bound_reached_s, Some(135.0));
        assert_eq!(
            (v.outcome, v.slope_pct_per_min),
            (DiskOutcome::Pass, 0.0),
            "{v:?}"
        );
        let points: Vec<(f64, f64)> = slow.iter().map(|p| (p.t_s, p.total_bytes as f64)).collect();
        let from_warmup = judge_slope(&points, 30.0, 300.0, DISK_SLOPE_LIMIT_PCT_PER_MIN);
        assert_eq!(from_warmup.outcome, RssOutcome::Fail);
        // A count bound is reached when that many runs have finished.
        let v = disk_verdict(&samples, 300.0, retain("max_runs=6000"));
        assert_eq!(v.bound_reached_s, Some(60.0));
        // An age bound once that much time has passed.
        let v = disk_verdict(&samples, 300.0, retain("max_age=2m,max_runs=100000"));
        assert_eq!(v.bound_reached_s, Some(120.0));
    }

    #[test]
    fn a_disk_that_never_reached_its_bound_is_too_short_and_without_retention_unbounded() {
        let growing = disk(300, |t| t * MIB);
        let v = disk_verdict(&growing, 300.0, retain("max_bytes=2GiB"));
        assert_eq!((v.outcome, v.pass), (DiskOutcome::TooShort, true), "{v:?}");
        assert!(v.reason.contains("was not reached"), "{}", v.reason);
        assert_eq!(v.bound_reached_s, None);
        let statuses = explain_statuses(&BTreeMap::new(), None, 3);
        let flat_rss = rss_verdict(&line(0.0, 300), 300.0);
        let terminal = TerminalVerdict::of(1, 1, 1);
        let mut verdict = Verdict::of(
            flat_rss.clone(),
            Some(v),
            statuses.clone(),
            terminal.clone(),
            0,
        );
        assert_eq!(verdict.outcome, VerdictOutcome::Inconclusive);
        assert!(verdict.pass);
        assert!(
            verdict.unjudged[0].starts_with("disk: too short"),
            "{:?}",
            verdict.unjudged
        );
        verdict.require_conclusive();
        assert!(!verdict.pass);

        // No retention: the same growth is stated, not judged.
        for none in [None, Some(Retention::default())] {
            let v = disk_verdict(&growing, 300.0, none);
            assert_eq!((v.outcome, v.pass), (DiskOutcome::Unbounded, true), "{v:?}");
            assert_eq!(v.retention, None);
            assert!((v.slope_mib_per_min - 60.0).abs() < 1e-3, "{v:?}");
            let verdict = Verdict::of(
                flat_rss.clone(),
                Some(v),
                statuses.clone(),
                terminal.clone(),
                0,
            );
            assert_eq!(verdict.outcome, VerdictOutcome::Pass, "{verdict:?}");
        }
    }

    #[test]
    fn a_short_soak_under_a_reached_bound_is_too_short_to_judge_disk() {
        // 40 s: warm-up 8 s, bound reached at 10 s, 30 s left (under 60 s).
        let samples = disk(40, |t| (t.min(10.0)) * MIB);
        let v = disk_verdict(&samples, 40.0, retain("max_bytes=10MiB"));
        assert_eq!(v.bound_reached_s, Some(9.0));
        assert_eq!((v.outcome, v.pass), (DiskOutcome::TooShort, true), "{v:?}");
        assert!(v.reason.starts_with("too short to judge"), "{}", v.reason);
    }

    #[test]
    fn terminal_records_must_match_runs_and_results() {
        assert!(TerminalVerdict::of(10, 10, 10).pass);
        assert!(!TerminalVerdict::of(10, 9, 10).pass);
        assert!(!TerminalVerdict::of(10, 10, 11).pass);
    }
}
