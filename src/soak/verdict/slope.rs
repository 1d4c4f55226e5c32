//! The slopes the soak judges: Theil–Sen over RSS and over disk use, with
//! their outcomes (see the parent module's doc for the rules).

use serde::Serialize;

use crate::ports::retention::Retention;

use super::super::figures::{mib, round3};
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
pub(super) const Z_95: f64 = 1.959_964;

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
pub(super) struct Judged {
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
    pub(super) outcome: RssOutcome,
    /// Why, in a sentence.
    reason: String,
}

/// Judges the slope of `samples` (seconds, value) from `from_s` to the end
/// of the duration (a sample up to 0.5 s late still counts), against
/// `limit` % of the mean a minute.
pub(super) fn judge_slope(
    samples: &[(f64, f64)],
    from_s: f64,
    duration_s: f64,
    limit: f64,
) -> Judged {
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
