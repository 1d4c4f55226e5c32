//! The scheduler's rules, as pure functions of a schedule, its stored
//! state and an instant: the hash of a schedule's configuration, the fires
//! missed while no host ran (`missed`, `catch_up_window`, `max_catch_up`),
//! and what a run's report does to the state (last outcome, today's
//! spend, the failure streak and `pause_after`). No clock is read here.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::ports::schedule::{Pause, ScheduleState};
use crate::skills::{Missed, Schedule};

/// How far back missed fires are caught up when `catch_up_window` is not
/// set.
pub const DEFAULT_CATCH_UP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The most missed fires `backfill` runs when `max_catch_up` is not set.
pub const DEFAULT_MAX_CATCH_UP: u32 = 10;

/// Why a schedule fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FireKind {
    /// Its cron came due.
    Cron,
    /// A fire missed while no host ran (`missed: run_once | backfill`).
    CatchUp,
    /// An operator asked (`POST /v1/schedules/{name}/run`).
    Manual,
}

/// One fire of a schedule: what a runner is asked to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fire {
    /// The schedule.
    pub schedule: String,
    /// The instant it was due.
    pub due: Timestamp,
    /// Why it fired.
    pub kind: FireKind,
}

/// How one run of a schedule ended, as the scheduler counts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "reason")]
pub enum RunOutcome {
    /// The run ended ok (and its publishing and writeback landed).
    Succeeded,
    /// The run ended ok but a publish or the writeback did not land: a
    /// failure of reason `partial_failure`.
    PartialFailure,
    /// The run failed; the reason is typed (`killed:runaway`,
    /// `error:provider_server`, `missing_secret`): failures of one reason
    /// make a streak.
    Failed(String),
    /// The run was cancelled (by `overlap: cancel_previous` or an
    /// operator's cancel): not a failure.
    Cancelled,
    /// The schedule's daily budget is spent: admission refused the run (a
    /// skip: `skipped`), or the run crossed the cap and was stopped
    /// (`over_budget`). Not a failure.
    OverBudget(String),
}

/// What a runner reports of one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReport {
    /// The run, once it was submitted.
    pub run_id: Option<String>,
    /// How it ended.
    pub outcome: RunOutcome,
    /// Tokens it used (its real usage, the judges' included).
    pub tokens: u64,
    /// What they cost, in micro-dollars.
    pub cost_micros: u64,
}

/// The hash of a schedule's effective configuration (FNV-1a over its
/// settings as JSON: stable across builds): a different hash is a change
/// of the schedule.
pub fn config_hash(schedule: &Schedule) -> String {
    let text = serde_json::to_string(&schedule.settings).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes().chain(schedule.skill.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Unix ms of an instant (0 before 1970).
pub fn to_ms(t: Timestamp) -> u64 {
    u64::try_from(t.as_millisecond()).unwrap_or(0)
}

/// The instant of Unix ms.
pub fn from_ms(ms: u64) -> Timestamp {
    Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or(Timestamp::MAX)
}

/// The fires of `schedule` missed between `stored_next` (the next fire
/// the store held, which did not happen) and `now`, that its `missed`
/// policy catches up, oldest first: none for `skip`; the latest for
/// `run_once`; the latest `max_catch_up` (default
/// [`DEFAULT_MAX_CATCH_UP`]) for `backfill`. Only fires within
/// `catch_up_window` (default [`DEFAULT_CATCH_UP_WINDOW`]) before `now`
/// count.
pub fn missed_fires(schedule: &Schedule, stored_next: Timestamp, now: Timestamp) -> Vec<Timestamp> {
    let s = &schedule.settings;
    let policy = s.missed.unwrap_or_default();
    if policy == Missed::Skip || stored_next > now {
        return Vec::new();
    }
    let window = s.catch_up_window.unwrap_or(DEFAULT_CATCH_UP_WINDOW);
    let window = SignedDuration::try_from(window).unwrap_or(SignedDuration::MAX);
    let oldest = now.checked_sub(window).unwrap_or(Timestamp::MIN);
    let keep = match policy {
        Missed::RunOnce => 1,
        _ => s.max_catch_up.unwrap_or(DEFAULT_MAX_CATCH_UP).max(1) as usize,
    };
    // From the later of the stored fire and the window's start: the first
    // fire at or after it (next_fire is strictly after).
    let from = stored_next.max(oldest);
    let mut at = schedule.next_fire(
        from.checked_sub(SignedDuration::from_millis(1))
            .unwrap_or(from),
    );
    let mut found = std::collections::VecDeque::with_capacity(keep);
    // Bounded: a per-minute schedule over a day's window is 1 440 fires.
    for _ in 0..1_000_000 {
        let Some(t) = at else { break };
        if t > now {
            break;
        }
        if found.len() == keep {
            found.pop_front();
        }
        found.push_back(t);
        at = schedule.next_fire(t);
    }
    found.into()
}

/// The day `at` falls on in `schedule`'s time zone (`YYYY-MM-DD`).
pub fn day_of(schedule: &Schedule, at: Timestamp) -> String {
    at.to_zoned_datetime(schedule.clock.time_zone().clone())
        .date()
        .to_string()
}

/// A change of the schedule: its streak and an automatic pause are reset.
pub fn changed(state: &mut ScheduleState, hash: String) {
    state.config_hash = hash;
    state.streak = 0;
    state.streak_reason = None;
    if state.paused.as_ref().is_some_and(|p| p.auto) {
        state.paused = None;
    }
}

/// Records a skipped fire (not a run: the streak is untouched).
pub fn skipped(state: &mut ScheduleState, reason: impl Into<String>, now: Timestamp) {
    state.last_fire_ms = Some(to_ms(now));
    state.last_outcome = Some("skipped".into());
    state.last_reason = Some(reason.into());
}

/// Applies a run's report to its schedule's state: the last outcome,
/// today's spend and the failure streak; pauses the schedule after
/// `pause_after` consecutive failures of one reason. `counts` is false for
/// a run of an earlier configuration (it touches no streak). Answers
/// whether the schedule was paused by this report.
pub fn apply_report(
    schedule: &Schedule,
    state: &mut ScheduleState,
    report: &RunReport,
    counts: bool,
    now: Timestamp,
) -> bool {
    let day = day_of(schedule, now);
    if state.spent_day.as_deref() != Some(day.as_str()) {
        state.spent_day = Some(day);
        state.spent_tokens = 0;
        state.spent_cost_micros = 0;
    }
    state.spent_tokens = state.spent_tokens.saturating_add(report.tokens);
    state.spent_cost_micros = state.spent_cost_micros.saturating_add(report.cost_micros);
    if report.run_id.is_some() {
        state.last_run_id = report.run_id.clone();
    }
    let (outcome, reason): (&str, Option<String>) = match &report.outcome {
        RunOutcome::Succeeded => ("succeeded", None),
        RunOutcome::PartialFailure => ("partial_failure", Some("partial_failure".into())),
        RunOutcome::Failed(r) => ("failed", Some(r.clone())),
        RunOutcome::Cancelled => ("cancelled", None),
        RunOutcome::OverBudget(r) if report.tokens == 0 => ("skipped", Some(r.clone())),
        RunOutcome::OverBudget(r) => ("over_budget", Some(r.clone())),
    };
    state.last_outcome = Some(outcome.into());
    state.last_reason = reason.clone();
    if !counts {
        return false;
    }
    match &report.outcome {
        RunOutcome::Succeeded => {
            state.streak = 0;
            state.streak_reason = None;
            false
        }
        RunOutcome::PartialFailure | RunOutcome::Failed(_) => {
            let reason = reason.unwrap_or_default();
            if state.streak_reason.as_deref() == Some(reason.as_str()) {
                state.streak = state.streak.saturating_add(1);
            } else {
                state.streak = 1;
                state.streak_reason = Some(reason.clone());
            }
            match schedule.settings.pause_after {
                Some(n) if state.streak >= n && state.paused.is_none() => {
                    state.paused = Some(Pause {
                        why: format!("{} consecutive failures: {reason}", state.streak),
                        at_ms: to_ms(now),
                        auto: true,
                    });
                    true
                }
                _ => false,
            }
        }
        RunOutcome::Cancelled | RunOutcome::OverBudget(_) => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::skills::SkillsRepo;

    fn repo(schedule_yaml: &str) -> (tempdir::Dir, SkillsRepo) {
        let dir = tempdir::Dir::new();
        std::fs::create_dir_all(dir.0.join("skills/s")).unwrap();
        std::fs::write(
            dir.0.join("skills/s/SKILL.md"),
            "---\nname: s\n---\nSay hi.\n",
        )
        .unwrap();
        std::fs::write(
            dir.0.join("agentvisor.yaml"),
            format!(
                "skills:\n  s: skills/s\nschedules:\n  - name: a\n    skill: s\n    model: scripted\n    script: [{{ text: hi }}]\n{schedule_yaml}"
            ),
        )
        .unwrap();
        let r = SkillsRepo::open(&dir.0).unwrap();
        (dir, r)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p = std::env::temp_dir()
                    .join(format!("agentvisor-rules-{}-{n}", std::process::id()));
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn missed_fires_follow_the_policy_window_and_cap() {
        let (_d, r) = repo("    cron: \"0 * * * *\"\n    missed: backfill\n    catch_up_window: 5h\n    max_catch_up: 3\n");
        let s = &r.schedules[0];
        let got = missed_fires(s, ts("2026-01-01T00:00:00Z"), ts("2026-01-01T10:30:00Z"));
        assert_eq!(
            got,
            [
                ts("2026-01-01T08:00:00Z"),
                ts("2026-01-01T09:00:00Z"),
                ts("2026-01-01T10:00:00Z")
            ]
        );
        let (_d, r) = repo("    cron: \"0 * * * *\"\n    missed: run_once\n");
        let got = missed_fires(
            &r.schedules[0],
            ts("2026-01-01T08:00:00Z"),
            ts("2026-01-01T10:30:00Z"),
        );
        assert_eq!(got, [ts("2026-01-01T10:00:00Z")]);
        let (_d, r) = repo("    cron: \"0 * * * *\"\n");
        assert!(missed_fires(
            &r.schedules[0],
            ts("2026-01-01T08:00:00Z"),
            ts("2026-01-01T10:30:00Z")
        )
        .is_empty());
    }

    #[test]
    fn a_streak_is_per_reason_and_pauses_at_its_count() {
        let (_d, r) = repo("    cron: \"0 * * * *\"\n    pause_after: 3\n");
        let s = &r.schedules[0];
        let mut st = ScheduleState::default();
        let fail = |why: &str| RunReport {
            run_id: None,
            outcome: RunOutcome::Failed(why.into()),
            tokens: 0,
            cost_micros: 0,
        };
        let now = ts("2026-01-01T00:00:00Z");
        assert!(!apply_report(
            s,
            &mut st,
            &fail("killed:runaway"),
            true,
            now
        ));
        assert!(!apply_report(
            s,
            &mut st,
            &fail("killed:runaway"),
            true,
            now
        ));
        assert!(!apply_report(
            s,
            &mut st,
            &fail("error:provider_server"),
            true,
            now
        ));
        assert_eq!(
            (st.streak, st.streak_reason.as_deref()),
            (1, Some("error:provider_server"))
        );
        assert!(!apply_report(
            s,
            &mut st,
            &fail("error:provider_server"),
            true,
            now
        ));
        assert!(apply_report(
            s,
            &mut st,
            &fail("error:provider_server"),
            true,
            now
        ));
        let p = st.paused.clone().unwrap();
        assert!(p.auto);
        assert_eq!(p.why, "3 consecutive failures: error:provider_server");
        changed(&mut st, "new".into());
        assert_eq!((st.streak, st.paused.is_none()), (0, true));
    }
}
