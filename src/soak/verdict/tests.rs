//! The verdict's parts on made-up series.
use super::slope::{judge_slope, Z_95};
use super::*;
use crate::ports::retention::Retention;

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
