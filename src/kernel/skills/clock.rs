//! A schedule's clock: its cron read on the wall clock of an IANA time
//! zone, with daylight saving defined, and its deterministic jitter.
//!
//! [`ScheduleClock::next_fire`] is a pure function of the instant it is
//! asked after: no clock is read, so tests walk it across any date.
//!
//! # Daylight saving
//!
//! The cron matches civil (wall clock) minutes. A civil time becomes an
//! instant so:
//!
//! - **unambiguous**: that instant;
//! - **skipped** (in the gap of a spring-forward change, e.g. 02:30 when
//!   clocks jump from 02:00 to 03:00): the change's instant (03:00 new
//!   time), once, however many skipped minutes matched (`*/15` fires once
//!   at 03:00, not four times);
//! - **repeated** (in the fold of a fall-back change, e.g. 01:30 when
//!   clocks go from 02:00 back to 01:00): its first occurrence only, so
//!   a schedule never runs twice for one wall-clock time (and `*/15`
//!   does not fire during the repeated hour).
//!
//! # Jitter
//!
//! A schedule with `jitter: D` fires a fixed offset in `[0, D)` after each
//! cron instant: the offset is a hash (FNV-1a, stable across builds and
//! platforms) of the schedule's name, so it never changes between runs or
//! restarts, and a hundred schedules at `0 * * * *` spread over `D`.

use std::time::Duration;

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp};

use super::cron::Cron;

/// The cron, time zone and jitter offset of one schedule.
#[derive(Clone, Debug)]
pub struct ScheduleClock {
    cron: Cron,
    tz: TimeZone,
    offset: Duration,
}

/// A time zone name that is not an IANA zone this build knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown time zone `{0}` (use an IANA name such as `Europe/Oslo`, `America/New_York` or `UTC`)"
)]
pub struct UnknownTimeZone(pub String);

/// Looks up an IANA time zone by name.
pub fn time_zone(name: &str) -> Result<TimeZone, UnknownTimeZone> {
    if name.trim().is_empty() {
        return Err(UnknownTimeZone(name.to_string()));
    }
    TimeZone::get(name).map_err(|_| UnknownTimeZone(name.to_string()))
}

/// The deterministic jitter offset of schedule `name`: in `[0, jitter)`,
/// whole seconds (zero when `jitter` is under a second).
pub fn jitter_offset(name: &str, jitter: Duration) -> Duration {
    let secs = jitter.as_secs();
    if secs == 0 {
        return Duration::ZERO;
    }
    // FNV-1a, 64 bits: stable, unlike the std hashers.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Duration::from_secs(h % secs)
}

impl ScheduleClock {
    /// A clock for `cron` in `tz`, each fire `offset` after its cron
    /// instant (see [`jitter_offset`]).
    pub fn new(cron: Cron, tz: TimeZone, offset: Duration) -> Self {
        ScheduleClock { cron, tz, offset }
    }

    /// The cron expression.
    pub fn cron(&self) -> &Cron {
        &self.cron
    }

    /// The time zone.
    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// The jitter offset added to every fire.
    pub fn offset(&self) -> Duration {
        self.offset
    }

    /// The first fire strictly after `after`, or `None` if the cron
    /// matches no minute within eight years of it.
    pub fn next_fire(&self, after: Timestamp) -> Option<Timestamp> {
        let offset = SignedDuration::try_from(self.offset).ok()?;
        let base = after.checked_sub(offset).ok()?;
        self.next_cron_instant(base)?.checked_add(offset).ok()
    }

    /// The first cron instant strictly after `after` (see the module doc
    /// for the civil-to-instant rule).
    fn next_cron_instant(&self, after: Timestamp) -> Option<Timestamp> {
        let local = self.tz.to_datetime(after);
        // The next whole minute of the wall clock.
        let mut from = local
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(SignedDuration::from_mins(1))
            .ok()?;
        // Bounded: a fold repeats at most a few hours of minutes.
        for _ in 0..100_000 {
            let civil = self.cron.next_civil(from)?;
            if let Some(at) = self.instant_of(civil) {
                if at > after {
                    return Some(at);
                }
            }
            from = civil.checked_add(SignedDuration::from_mins(1)).ok()?;
        }
        None
    }

    /// The instant a matching civil minute fires at (see the module doc).
    fn instant_of(&self, civil: DateTime) -> Option<Timestamp> {
        match self.tz.to_ambiguous_timestamp(civil).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(civil).ok(),
            // The first occurrence: the offset in force before the change.
            AmbiguousOffset::Fold { before, .. } => before.to_timestamp(civil).ok(),
            // The change itself: the first instant after the skipped time.
            AmbiguousOffset::Gap { after, .. } => {
                let before_change = after.to_timestamp(civil).ok()?;
                self.tz
                    .following(before_change)
                    .next()
                    .map(|t| t.timestamp())
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn clock(cron: &str, tz: &str) -> ScheduleClock {
        ScheduleClock::new(
            Cron::parse(cron).unwrap(),
            time_zone(tz).unwrap(),
            Duration::ZERO,
        )
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// The next `n` fires after `from`.
    fn fires(c: &ScheduleClock, from: &str, n: usize) -> Vec<String> {
        let mut at = ts(from);
        (0..n)
            .map(|_| {
                at = c.next_fire(at).unwrap();
                at.to_zoned_datetime(c.time_zone().clone()).to_string()
            })
            .collect()
    }

    #[test]
    fn a_daily_time_in_the_spring_gap_runs_once_at_the_change() {
        // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT.
        let c = clock("30 2 * * *", "America/New_York");
        assert_eq!(
            fires(&c, "2026-03-07T12:00:00Z", 3),
            [
                "2026-03-08T03:00:00-04:00[America/New_York]",
                "2026-03-09T02:30:00-04:00[America/New_York]",
                "2026-03-10T02:30:00-04:00[America/New_York]",
            ]
        );
    }

    #[test]
    fn minutes_in_the_gap_collapse_into_one_fire() {
        let c = clock("*/20 * * * *", "America/New_York");
        assert_eq!(
            fires(&c, "2026-03-08T06:30:00Z", 4),
            [
                "2026-03-08T01:40:00-05:00[America/New_York]",
                // 02:00, 02:20 and 02:40 do not exist: one fire at the change.
                "2026-03-08T03:00:00-04:00[America/New_York]",
                "2026-03-08T03:20:00-04:00[America/New_York]",
                "2026-03-08T03:40:00-04:00[America/New_York]",
            ]
        );
    }

    #[test]
    fn a_repeated_time_in_the_autumn_fold_runs_once() {
        // New York, 2026-11-01: 02:00 EDT goes back to 01:00 EST.
        let c = clock("30 1 * * *", "America/New_York");
        assert_eq!(
            fires(&c, "2026-10-31T12:00:00Z", 2),
            [
                "2026-11-01T01:30:00-04:00[America/New_York]",
                "2026-11-02T01:30:00-05:00[America/New_York]",
            ]
        );
        // Asked from inside the repeated hour (01:10 EST, the second
        // 01:10): 01:30 already ran, at its first occurrence.
        assert_eq!(
            fires(&c, "2026-11-01T06:10:00Z", 1),
            ["2026-11-02T01:30:00-05:00[America/New_York]"]
        );
        let every = clock("0,30 * * * *", "America/New_York");
        assert_eq!(
            fires(&every, "2026-11-01T05:00:00Z", 3),
            [
                "2026-11-01T01:30:00-04:00[America/New_York]",
                // The repeated 01:00 and 01:30 (EST) do not fire again.
                "2026-11-01T02:00:00-05:00[America/New_York]",
                "2026-11-01T02:30:00-05:00[America/New_York]",
            ]
        );
    }

    #[test]
    fn europe_changes_at_its_own_hours() {
        // Oslo, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 2026-10-25:
        // 03:00 CEST goes back to 02:00 CET.
        let c = clock("15 2 * * *", "Europe/Oslo");
        assert_eq!(
            fires(&c, "2026-03-28T12:00:00Z", 2),
            [
                "2026-03-29T03:00:00+02:00[Europe/Oslo]",
                "2026-03-30T02:15:00+02:00[Europe/Oslo]",
            ]
        );
        assert_eq!(
            fires(&c, "2026-10-24T12:00:00Z", 2),
            [
                "2026-10-25T02:15:00+02:00[Europe/Oslo]",
                "2026-10-26T02:15:00+01:00[Europe/Oslo]",
            ]
        );
    }

    #[test]
    fn next_fire_is_strictly_after() {
        let c = clock("0 * * * *", "UTC");
        assert_eq!(
            c.next_fire(ts("2026-01-01T10:00:00Z")),
            Some(ts("2026-01-01T11:00:00Z"))
        );
        assert_eq!(
            c.next_fire(ts("2026-01-01T09:59:59.5Z")),
            Some(ts("2026-01-01T10:00:00Z"))
        );
    }

    #[test]
    fn jitter_is_deterministic_and_spread() {
        let j = Duration::from_secs(300);
        assert_eq!(jitter_offset("nightly", j), jitter_offset("nightly", j));
        assert!(jitter_offset("nightly", j) < j);
        assert_eq!(jitter_offset("nightly", Duration::ZERO), Duration::ZERO);
        let distinct: std::collections::BTreeSet<Duration> = (0..100)
            .map(|i| jitter_offset(&format!("schedule-{i}"), j))
            .collect();
        assert!(distinct.len() > 60, "{}", distinct.len());
        let off = jitter_offset("nightly", j);
        let c = ScheduleClock::new(Cron::parse("0 * * * *").unwrap(), TimeZone::UTC, off);
        let first = c.next_fire(ts("2026-01-01T10:00:00Z")).unwrap();
        assert_eq!(
            first,
            ts("2026-01-01T10:00:00Z") + SignedDuration::try_from(off).unwrap()
        );
        // Asked from the jittered fire itself: the next hour's.
        let second = c.next_fire(first).unwrap();
        assert_eq!(second.duration_since(first), SignedDuration::from_hours(1));
    }

    #[test]
    fn unknown_zones_are_refused() {
        assert!(time_zone("Mars/Olympus").is_err());
        assert!(time_zone("").is_err());
        assert!(time_zone("Europe/Oslo").is_ok());
    }
}
