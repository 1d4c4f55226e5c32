//! The scheduler (`agentvisor::schedules`) on a paused clock, with a runner
//! that records its fires: cron across daylight-saving changes, missed
//! fires after downtime under each `missed` policy, each `overlap` policy,
//! and `pause_after` (per reason; reset by a success, a change of the
//! schedule and `resume`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentvisor::ports::schedule::{ScheduleState, ScheduleStore};
use agentvisor::schedules::{
    config_hash, Fire, FireAnswer, FireKind, RunOutcome, RunReport, ScheduleRunner, Scheduler,
    SchedulerClock, SchedulerConfig,
};
use agentvisor::skills::{SkillsRepo, Timestamp};
use agentvisor::stores::MemoryScheduleStore;
use async_trait::async_trait;
use support::scratch::Scratch;

/// A runner that records each fire, takes `hold` of (tokio) time, and
/// ends with the next scripted outcome (else `succeeded`); `cancel` ends
/// the runs in flight as `cancelled`.
#[derive(Default)]
struct Recorder {
    fires: Mutex<Vec<(Fire, Timestamp)>>,
    ended: Mutex<Vec<(Fire, RunOutcome)>>,
    outcomes: Mutex<VecDeque<RunOutcome>>,
    hold: Duration,
    cancelled: tokio::sync::Notify,
    cancels: Mutex<u32>,
    clock: Mutex<Option<SchedulerClock>>,
}

impl Recorder {
    fn holding(hold: Duration) -> Arc<Recorder> {
        Arc::new(Recorder {
            hold,
            ..Recorder::default()
        })
    }

    fn script(&self, outcomes: &[RunOutcome]) {
        self.outcomes
            .lock()
            .unwrap()
            .extend(outcomes.iter().cloned());
    }

    fn dues(&self) -> Vec<Timestamp> {
        self.fires
            .lock()
            .unwrap()
            .iter()
            .map(|(f, _)| f.due)
            .collect()
    }

    fn kinds(&self) -> Vec<FireKind> {
        self.fires
            .lock()
            .unwrap()
            .iter()
            .map(|(f, _)| f.kind)
            .collect()
    }
}

#[async_trait]
impl ScheduleRunner for Recorder {
    async fn run(&self, _repo: Arc<SkillsRepo>, fire: Fire) -> RunReport {
        let now = self.clock.lock().unwrap().map(|c| c.now()).unwrap();
        self.fires.lock().unwrap().push((fire.clone(), now));
        let cancelled = self.cancelled.notified();
        let outcome = tokio::select! {
            _ = tokio::time::sleep(self.hold) => {
                self.outcomes.lock().unwrap().pop_front().unwrap_or(RunOutcome::Succeeded)
            }
            _ = cancelled => RunOutcome::Cancelled,
        };
        self.ended.lock().unwrap().push((fire, outcome.clone()));
        RunReport {
            run_id: None,
            outcome,
            tokens: 10,
            cost_micros: 0,
        }
    }

    async fn cancel(&self, _name: &str) {
        *self.cancels.lock().unwrap() += 1;
        self.cancelled.notify_waiters();
    }
}

/// A repository with one skill and these schedules (YAML list items).
fn repo(schedules: &str) -> Scratch {
    let dir = Scratch::new("scheduler");
    std::fs::create_dir_all(dir.path("skills/s")).unwrap();
    dir.file("skills/s/SKILL.md", "---\nname: s\n---\nSay hi.\n");
    dir.file(
        "agentvisor.yaml",
        &format!(
            "skills: {{ s: skills/s }}\ndefaults: {{ model: scripted, script: [{{ text: hi }}] }}\nschedules:\n{schedules}"
        ),
    );
    dir
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

async fn start(
    dir: &Scratch,
    runner: &Arc<Recorder>,
    store: Arc<dyn ScheduleStore>,
    wall: &str,
) -> Scheduler {
    let clock = SchedulerClock::starting_at(ts(wall));
    *runner.clock.lock().unwrap() = Some(clock);
    Scheduler::start(
        SkillsRepo::open(&dir.0).unwrap(),
        SchedulerConfig {
            store,
            runner: runner.clone(),
            ledger: None,
            clock,
        },
    )
    .await
    .unwrap()
}

/// Lets the timer, the scheduler and the runs' tasks catch up.
async fn settle() {
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
}

/// Moves the paused clock by `d` and lets everything that came due run.
async fn pass(d: Duration) {
    tokio::time::sleep(d).await;
    settle().await;
}

async fn state(s: &Scheduler, name: &str) -> ScheduleState {
    s.list()
        .await
        .unwrap()
        .into_iter()
        .find(|v| v.schedule.name == name)
        .unwrap()
        .state
}

#[tokio::test(start_paused = true)]
async fn a_daily_fire_in_the_spring_gap_runs_once_at_the_change() {
    let dir =
        repo("  - { name: night, skill: s, cron: \"30 2 * * *\", timezone: America/New_York }\n");
    let runner = Recorder::holding(Duration::from_secs(1));
    let s = start(
        &dir,
        &runner,
        Arc::new(MemoryScheduleStore::new()),
        "2026-03-07T12:00:00Z",
    )
    .await;
    pass(Duration::from_secs(3 * 24 * 3600)).await;
    // 02:30 does not exist on 2026-03-08 (02:00 EST jumps to 03:00 EDT):
    // one fire at the change, then 02:30 EDT on the days after.
    assert_eq!(
        runner.dues(),
        [
            ts("2026-03-08T07:00:00Z"),
            ts("2026-03-09T06:30:00Z"),
            ts("2026-03-10T06:30:00Z"),
        ]
    );
    // The recorded next fire is the day after, in UTC ms.
    let st = state(&s, "night").await;
    assert_eq!(
        st.next_fire_ms,
        Some(ts("2026-03-11T06:30:00Z").as_millisecond() as u64)
    );
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_repeated_hour_in_the_autumn_fold_fires_once() {
    let dir =
        repo("  - { name: q, skill: s, cron: \"*/30 1 * * *\", timezone: America/New_York }\n");
    let runner = Recorder::holding(Duration::from_secs(1));
    let s = start(
        &dir,
        &runner,
        Arc::new(MemoryScheduleStore::new()),
        "2026-10-31T12:00:00Z",
    )
    .await;
    pass(Duration::from_secs(2 * 24 * 3600)).await;
    // 2026-11-01: 01:00 and 01:30 EDT run; the repeated 01:00 and 01:30
    // EST do not; the next day's run at EST.
    assert_eq!(
        runner.dues(),
        [
            ts("2026-11-01T05:00:00Z"),
            ts("2026-11-01T05:30:00Z"),
            ts("2026-11-02T06:00:00Z"),
            ts("2026-11-02T06:30:00Z"),
        ]
    );
    s.stop().await;
}

/// A store that says the schedule's next fire was `next` (the host was
/// down since).
async fn store_with_next(dir: &Scratch, name: &str, next: &str) -> Arc<dyn ScheduleStore> {
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let store = Arc::new(MemoryScheduleStore::new());
    store
        .put_all(&[ScheduleState {
            name: name.into(),
            config_hash: config_hash(repo.schedule(name).unwrap()),
            next_fire_ms: Some(ts(next).as_millisecond() as u64),
            ..ScheduleState::default()
        }])
        .await
        .unwrap();
    store
}

#[tokio::test(start_paused = true)]
async fn missed_fires_after_downtime_follow_each_policy() {
    let now = "2026-01-01T10:30:00Z";
    for (policy, expect) in [
        ("skip", vec![]),
        ("run_once", vec!["2026-01-01T10:00:00Z"]),
        (
            "backfill",
            vec![
                "2026-01-01T08:00:00Z",
                "2026-01-01T09:00:00Z",
                "2026-01-01T10:00:00Z",
            ],
        ),
    ] {
        // Down from 04:00; the window reaches back to 05:30; three at most.
        let dir = repo(&format!(
            "  - {{ name: h, skill: s, cron: \"0 * * * *\", missed: {policy}, catch_up_window: 5h, max_catch_up: 3 }}\n"
        ));
        let store = store_with_next(&dir, "h", "2026-01-01T04:00:00Z").await;
        let runner = Recorder::holding(Duration::from_secs(60));
        let s = start(&dir, &runner, store, now).await;
        // Ten minutes: every catch-up runs (a minute each, one after
        // another), and no cron fire is due before 11:00.
        pass(Duration::from_secs(600)).await;
        let expect: Vec<Timestamp> = expect.into_iter().map(ts).collect();
        assert_eq!(runner.dues(), expect, "missed: {policy}");
        assert!(runner.kinds().iter().all(|k| *k == FireKind::CatchUp));
        // One after another: each started once the one before had ended.
        let starts: Vec<Timestamp> = runner
            .fires
            .lock()
            .unwrap()
            .iter()
            .map(|(_, at)| *at)
            .collect();
        for w in starts.windows(2) {
            assert!(
                w[1].duration_since(w[0]).as_secs() >= 60,
                "{policy}: {starts:?}"
            );
        }
        // The next cron fire is the next hour's, as for any schedule.
        assert_eq!(
            state(&s, "h").await.next_fire_ms,
            Some(ts("2026-01-01T11:00:00Z").as_millisecond() as u64)
        );
        s.stop().await;
    }
}

/// Runs of 150 s against a fire a minute, under `overlap`.
async fn overlapping(policy: &str) -> (Arc<Recorder>, Scheduler, Scratch) {
    let dir = repo(&format!(
        "  - {{ name: m, skill: s, cron: \"* * * * *\", overlap: {policy} }}\n"
    ));
    let runner = Recorder::holding(Duration::from_secs(150));
    let s = start(
        &dir,
        &runner,
        Arc::new(MemoryScheduleStore::new()),
        "2026-01-01T00:00:30Z",
    )
    .await;
    (runner, s, dir)
}

#[tokio::test(start_paused = true)]
async fn overlap_skip_drops_fires_while_a_run_goes_on() {
    let (runner, s, _d) = overlapping("skip").await;
    // 00:01 starts (till 00:03:30); 00:02 and 00:03 are skipped; 00:04
    // starts.
    pass(Duration::from_secs(160)).await;
    assert_eq!(runner.dues(), [ts("2026-01-01T00:01:00Z")]);
    let st = state(&s, "m").await;
    assert_eq!(st.last_outcome.as_deref(), Some("skipped"));
    assert!(st.last_reason.unwrap().starts_with("overlap"));
    pass(Duration::from_secs(40)).await;
    assert_eq!(runner.dues(), [ts("2026-01-01T00:01:00Z")]);
    pass(Duration::from_secs(20)).await;
    assert_eq!(
        runner.dues(),
        [ts("2026-01-01T00:01:00Z"), ts("2026-01-01T00:04:00Z")]
    );
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn overlap_queue_one_runs_one_waiting_fire_after_the_run() {
    let (runner, s, _d) = overlapping("queue_one").await;
    // 00:01 starts; 00:02 waits; 00:03 is skipped (one waits already).
    pass(Duration::from_secs(160)).await;
    assert_eq!(runner.dues().len(), 1);
    assert_eq!(
        s.run_now("m").await.unwrap(),
        FireAnswer::Skipped("overlap: a fire is already queued".into())
    );
    // 00:03:30: the first ends, the queued 00:02 starts at once.
    pass(Duration::from_secs(21)).await;
    assert_eq!(
        runner.dues(),
        [ts("2026-01-01T00:01:00Z"), ts("2026-01-01T00:02:00Z")]
    );
    let starts: Vec<Timestamp> = runner
        .fires
        .lock()
        .unwrap()
        .iter()
        .map(|(_, at)| *at)
        .collect();
    assert_eq!(starts[1], ts("2026-01-01T00:03:30Z"));
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pause_drops_the_queued_fire() {
    let (runner, s, _d) = overlapping("queue_one").await;
    // 00:01 starts; 00:02 waits; then the schedule is paused.
    pass(Duration::from_secs(100)).await;
    assert!(s.list().await.unwrap()[0].queued);
    s.pause("m", "hold").await.unwrap();
    // 00:03:30: the run ends; the queued fire does not start.
    pass(Duration::from_secs(200)).await;
    assert_eq!(runner.dues(), [ts("2026-01-01T00:01:00Z")]);
    assert!(!s.list().await.unwrap()[0].queued);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn overlap_cancel_previous_cancels_then_starts() {
    let (runner, s, _d) = overlapping("cancel_previous").await;
    pass(Duration::from_secs(100)).await;
    // 00:01 started; 00:02 cancelled it and started.
    assert_eq!(
        runner.dues(),
        [ts("2026-01-01T00:01:00Z"), ts("2026-01-01T00:02:00Z")]
    );
    assert_eq!(*runner.cancels.lock().unwrap(), 1);
    let ended = runner.ended.lock().unwrap().clone();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].0.due, ts("2026-01-01T00:01:00Z"));
    assert_eq!(ended[0].1, RunOutcome::Cancelled);
    let st = state(&s, "m").await;
    assert_eq!(st.last_outcome.as_deref(), Some("cancelled"));
    assert_eq!(st.streak, 0, "a cancel is not a failure");
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn overlap_allow_runs_side_by_side() {
    let (runner, s, _d) = overlapping("allow").await;
    pass(Duration::from_secs(160)).await;
    assert_eq!(runner.dues().len(), 3);
    assert!(
        runner.ended.lock().unwrap().is_empty(),
        "none has ended yet"
    );
    assert_eq!(s.list().await.unwrap()[0].running, 3);
    s.stop().await;
}

fn failed(why: &str) -> RunOutcome {
    RunOutcome::Failed(why.into())
}

/// A schedule every minute with `pause_after: 3`, runs of one second.
async fn pausing(outcomes: &[RunOutcome]) -> (Arc<Recorder>, Scheduler, Scratch) {
    let dir = repo("  - { name: p, skill: s, cron: \"* * * * *\", pause_after: 3 }\n");
    let runner = Recorder::holding(Duration::from_secs(1));
    runner.script(outcomes);
    let s = start(
        &dir,
        &runner,
        Arc::new(MemoryScheduleStore::new()),
        "2026-01-01T00:00:30Z",
    )
    .await;
    (runner, s, dir)
}

#[tokio::test(start_paused = true)]
async fn three_failures_of_one_reason_pause_the_schedule_until_resumed() {
    let (runner, s, _d) = pausing(&[
        failed("error:provider_server"),
        failed("error:provider_server"),
        failed("error:provider_server"),
    ])
    .await;
    pass(Duration::from_secs(5 * 60)).await;
    // Three runs, then paused: the fires after do not run.
    assert_eq!(runner.dues().len(), 3);
    let st = state(&s, "p").await;
    let paused = st.paused.expect("paused");
    assert!(paused.auto);
    assert_eq!(paused.why, "3 consecutive failures: error:provider_server");
    assert_eq!(st.streak, 3);
    // A paused schedule still runs when an operator asks.
    assert_eq!(s.run_now("p").await.unwrap(), FireAnswer::Started);
    pass(Duration::from_secs(2)).await;
    assert_eq!(runner.dues().len(), 4);
    assert_eq!(state(&s, "p").await.streak, 0, "that run succeeded");
    let after = s.resume("p").await.unwrap();
    assert!(after.paused.is_none());
    pass(Duration::from_secs(60)).await;
    assert_eq!(runner.dues().len(), 5, "fires run again once resumed");
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failures_of_mixed_reasons_do_not_pause() {
    let (runner, s, _d) = pausing(&[
        failed("error:provider_server"),
        failed("killed:runaway"),
        failed("error:provider_server"),
        failed("killed:runaway"),
    ])
    .await;
    pass(Duration::from_secs(5 * 60)).await;
    assert_eq!(runner.dues().len(), 5);
    let st = state(&s, "p").await;
    assert!(st.paused.is_none());
    // The last failure's streak is 1; a success since cleared it.
    assert_eq!(st.last_outcome.as_deref(), Some("succeeded"));
    assert_eq!(st.streak, 0);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_streak() {
    let (_runner, s, _d) = pausing(&[
        failed("killed:runaway"),
        failed("killed:runaway"),
        RunOutcome::Succeeded,
        failed("killed:runaway"),
        failed("killed:runaway"),
    ])
    .await;
    pass(Duration::from_secs(5 * 60)).await;
    let st = state(&s, "p").await;
    assert!(st.paused.is_none());
    assert_eq!(
        (st.streak, st.streak_reason.as_deref()),
        (2, Some("killed:runaway"))
    );
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_change_of_the_schedule_resets_the_streak() {
    let (_runner, s, dir) = pausing(&[
        failed("killed:runaway"),
        failed("killed:runaway"),
        failed("killed:runaway"),
        failed("killed:runaway"),
        failed("killed:runaway"),
    ])
    .await;
    pass(Duration::from_secs(2 * 60)).await;
    assert_eq!(state(&s, "p").await.streak, 2);
    // The same schedule with another `max_turns`: a change.
    dir.file(
        "agentvisor.yaml",
        "skills: { s: skills/s }\ndefaults: { model: scripted, script: [{ text: hi }] }\nschedules:\n  - { name: p, skill: s, cron: \"* * * * *\", pause_after: 3, max_turns: 4 }\n",
    );
    let summary = s.reload_from_disk().await.unwrap();
    assert_eq!(summary.changed, ["p"]);
    assert_eq!(state(&s, "p").await.streak, 0);
    pass(Duration::from_secs(2 * 60)).await;
    let st = state(&s, "p").await;
    assert_eq!(st.streak, 2);
    assert!(st.paused.is_none());
    // A bad repository on reload is refused; the schedule goes on.
    dir.file(
        "agentvisor.yaml",
        "schedules:\n  - { name: p, skill: nope, cron: \"* * * * *\" }\n",
    );
    let err = s.reload_from_disk().await.unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    pass(Duration::from_secs(60)).await;
    let st = state(&s, "p").await;
    assert!(
        st.paused.is_some(),
        "the old schedule ran its third failure"
    );
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_operator_pause_holds_fires_and_says_why() {
    let dir = repo("  - { name: o, skill: s, cron: \"* * * * *\" }\n");
    let runner = Recorder::holding(Duration::from_secs(1));
    let s = start(
        &dir,
        &runner,
        Arc::new(MemoryScheduleStore::new()),
        "2026-01-01T00:00:30Z",
    )
    .await;
    let st = s.pause("o", "maintenance").await.unwrap();
    assert_eq!(st.paused.as_ref().unwrap().why, "maintenance");
    assert!(!st.paused.unwrap().auto);
    pass(Duration::from_secs(3 * 60)).await;
    assert!(runner.dues().is_empty());
    assert!(s
        .pause("nope", "x")
        .await
        .unwrap_err()
        .to_string()
        .contains("no schedule `nope`"));
    s.resume("o").await.unwrap();
    pass(Duration::from_secs(60)).await;
    assert_eq!(runner.dues().len(), 1);
    s.stop().await;
}
