//! The value parsers of the numeric flags, each with its range, as the
//! manifest's limits have theirs: a value out of range, or not a number at
//! all (`nan`, `inf`, `1e300`, `-0`, `-1`), is refused by the flag parser
//! (exit 2, naming the flag and the range), so nothing downstream ever sees
//! it. Every numeric flag of every command goes through one of these (or
//! through a parser of its own module that states its range the same way:
//! `--lease-ttl`, `--drain`, `--chaos`, `budget set`'s limits).

use std::time::Duration;

/// The most rows `runs list` and `sessions list` print.
pub(crate) const MAX_LIST: u64 = 1_000_000;
/// The most event-stream subscribers per run `serve` allows.
pub(crate) const MAX_SUBSCRIBERS: u64 = 100_000;
/// The highest `--rate-limit` (requests per second per caller).
pub(crate) const MAX_RATE: f64 = 1_000_000.0;
/// The lowest non-zero `--rate-limit`: one request per 1000 s.
pub(crate) const MIN_RATE: f64 = 0.001;
/// The longest `soak --duration` (30 days).
pub(crate) const MAX_SOAK: Duration = Duration::from_secs(30 * 24 * 3600);

/// A whole number from `lo` to `hi`.
pub(crate) fn whole(lo: u64, hi: u64) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s: &str| match s.trim().parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("use a whole number from {lo} to {hi}")),
    }
}

/// [`whole`] as a `usize`.
pub(crate) fn whole_usize(lo: u64, hi: u64) -> impl Fn(&str) -> Result<usize, String> + Clone {
    let parse = whole(lo, hi);
    move |s: &str| {
        parse(s).and_then(|n| usize::try_from(n).map_err(|_| format!("at most {}", usize::MAX)))
    }
}

/// [`whole`] as a `u32`.
pub(crate) fn whole_u32(lo: u32, hi: u32) -> impl Fn(&str) -> Result<u32, String> + Clone {
    let parse = whole(u64::from(lo), u64::from(hi));
    move |s: &str| parse(s).map(|n| u32::try_from(n).unwrap_or(hi))
}

/// A duration (`500ms`, `2s`, `1m30s`, or seconds) from `lo` to `hi`.
pub(crate) fn duration(
    lo: Duration,
    hi: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |s: &str| {
        let range = || {
            format!(
                "use a duration from {} to {} (e.g. 500ms, 30s, 10m, 1h)",
                agentvisor::spec::format_duration(lo),
                long(hi)
            )
        };
        match agentvisor::spec::parse_duration(s) {
            Ok(d) if d >= lo && d <= hi => Ok(d),
            _ => Err(range()),
        }
    }
}

/// A long duration as people write it (`24h`, `30d`).
fn long(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 86_400 && s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s >= 3600 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else {
        agentvisor::spec::format_duration(d)
    }
}

/// `serve --rate-limit`: requests per second per caller, `0` for no limit,
/// else from [`MIN_RATE`] to [`MAX_RATE`]. Below the lowest rate the wait
/// for the next request would be longer than a `Duration` holds.
pub(crate) fn rate_limit(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(0.0) => Ok(0.0),
        Ok(r) if (MIN_RATE..=MAX_RATE).contains(&r) => Ok(r),
        _ => Err(format!(
            "use 0 (no limit) or a number of requests per second from {MIN_RATE} to {MAX_RATE}"
        )),
    }
}

/// `runs extend RUN_ID BY`: seconds (`90`, `1.5`) or a duration (`30s`,
/// `5m`), more than 0 and at most 24 h; in seconds.
pub(crate) fn extend_by(s: &str) -> Result<f64, String> {
    let max = agentvisor::spec::MAX_DURATION.as_secs_f64();
    let secs = match s.trim().parse::<f64>() {
        Ok(x) => Some(x),
        Err(_) => agentvisor::spec::parse_duration(s)
            .ok()
            .map(|d| d.as_secs_f64()),
    };
    match secs {
        Some(x) if x > 0.0 && x <= max => Ok(x),
        _ => Err("use a duration more than 0 and at most 24h (e.g. 30s, 5m, or seconds)".into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_parser_keeps_its_range() {
        let runs = whole(1, 10);
        assert_eq!(runs("10"), Ok(10));
        for bad in [
            "0",
            "11",
            "-1",
            "-0",
            "nan",
            "1e3",
            "",
            "18446744073709551616",
        ] {
            assert!(runs(bad).unwrap_err().contains("from 1 to 10"), "{bad}");
        }
        assert_eq!(rate_limit("0"), Ok(0.0));
        assert_eq!(rate_limit("-0"), Ok(0.0));
        assert_eq!(rate_limit("2.5"), Ok(2.5));
        for bad in ["nan", "inf", "-inf", "1e-300", "1e300", "-1", "0.0001"] {
            assert!(rate_limit(bad).is_err(), "{bad}");
        }
        assert_eq!(extend_by("30s"), Ok(30.0));
        assert_eq!(extend_by("1.5"), Ok(1.5));
        for bad in ["0", "-0", "nan", "inf", "1e300", "25h", "-5"] {
            assert!(extend_by(bad).is_err(), "{bad}");
        }
        let d = duration(Duration::from_millis(1), MAX_SOAK);
        assert!(d("31d").is_err());
        assert!(d("0s").unwrap_err().contains("from 1ms to 30d"));
        assert_eq!(d("10m"), Ok(Duration::from_secs(600)));
    }

    use clap::Parser;
    use proptest::prelude::*;

    use crate::cli::Cli;

    /// Text a numeric flag might be given: any float written every way
    /// (`NaN`, `inf`, `-0`, `1e-300`, `1e300`), integers past every width,
    /// durations, and odd text.
    fn odd_value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<f64>().prop_map(|x| format!("{x}")),
            any::<f64>().prop_map(|x| format!("{x:e}")),
            any::<f64>().prop_map(|x| format!("{x:?}")),
            prop::sample::select(vec![
                "nan", "NaN", "inf", "-inf", "infinity", "-0", "-0.0", "0", "1e-300", "1e300",
                "-1", "", " ", "1e3", "0x10", "+5", "1_000",
            ])
            .prop_map(str::to_string),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u128>().prop_map(|n| n.to_string()),
            (
                0.0f64..1e12,
                prop::sample::select(vec!["ms", "s", "m", "h", "d", ""])
            )
                .prop_map(|(x, u)| format!("{x}{u}")),
            "[-+0-9.eE]{0,12}",
        ]
    }

    /// Every numeric flag as the command line writes it: the arguments
    /// before it and the flag.
    const FLAGS: &[(&[&str], &str)] = &[
        (&["run", "f.yaml"], "--budget-tokens"),
        (&["run", "f.yaml"], "--drain"),
        (&["run", "f.yaml"], "--lease-ttl"),
        (&["swarm", "f.yaml"], "--runs"),
        (&["swarm", "f.yaml"], "--concurrency"),
        (&["swarm", "f.yaml"], "--budget-tokens"),
        (&["swarm", "f.yaml"], "--drain"),
        (&["soak", "f.yaml"], "--duration"),
        (&["soak", "f.yaml"], "--concurrency"),
        (&["soak", "f.yaml"], "--chaos"),
        (&["soak", "f.yaml"], "--seed"),
        (&["serve"], "--rate-limit"),
        (&["serve"], "--max-subscribers"),
        (&["serve"], "--drain"),
        (&["chat", "f.yaml"], "--budget-tokens"),
        (&["runs", "list"], "--limit"),
        (&["sessions", "list"], "--limit"),
        (&["budget", "set", "a"], "--tokens"),
        (&["budget", "set", "a"], "--cost-micros"),
        (&["budget", "set", "a"], "--runtime"),
        (&["budget", "set", "a"], "--concurrent"),
        (&["budget", "set", "a"], "--window"),
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// What a parser accepts is in its range, whatever it is fed.
        #[test]
        fn the_parsers_accept_only_their_range(s in odd_value()) {
            if let Ok(n) = whole(1, 1000)(&s) {
                prop_assert!((1..=1000).contains(&n), "{s}");
            }
            if let Ok(r) = rate_limit(&s) {
                prop_assert!(r == 0.0 || (MIN_RATE..=MAX_RATE).contains(&r), "{s}");
                // The limiter's longest wait fits a `Duration`.
                prop_assert!(r == 0.0 || Duration::try_from_secs_f64(1.0 / r).is_ok(), "{s}");
            }
            if let Ok(x) = extend_by(&s) {
                prop_assert!(x > 0.0 && x <= 86_400.0, "{s}");
            }
            let (lo, hi) = (Duration::from_millis(100), MAX_SOAK);
            if let Ok(d) = duration(lo, hi)(&s) {
                prop_assert!(d >= lo && d <= hi, "{s}");
            }
        }

        /// Every numeric flag of every command: the command line parses, or
        /// it is refused as a bad value, naming the flag and a range.
        #[test]
        fn every_numeric_flag_refuses_by_name_and_range(
            at in prop::sample::select((0..FLAGS.len()).collect::<Vec<_>>()),
            s in odd_value(),
        ) {
            let (before, flag) = FLAGS[at];
            let mut argv = vec!["agentvisor"];
            argv.extend_from_slice(before);
            argv.extend([flag, s.as_str()]);
            if let Err(e) = Cli::try_parse_from(&argv) {
                let text = e.to_string();
                prop_assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{:?}: {}", argv, text);
                prop_assert!(text.contains(flag), "{:?}: {}", argv, text);
                prop_assert!(text.contains(" to ") || text.contains("more than 0"), "{:?}: {}", argv, text);
            }
        }
    }
}
