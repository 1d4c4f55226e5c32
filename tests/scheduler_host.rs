//! The scheduler over a real host (`HostRunner`): each fire is a skill run
//! through the host's admission; `budget.per_day` is enforced by the
//! budget actor on the schedule's caller (a run over the cap is refused
//! and the fire recorded as skipped, with the reason, from the runs' real
//! usage); a failing run's typed reason makes the streak that pauses it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::RunIndex;
use agentvisor::ports::budget::BudgetLedger;
use agentvisor::ports::schedule::ScheduleState;
use agentvisor::schedules::{FireAnswer, HostRunner, Scheduler, SchedulerClock, SchedulerConfig};
use agentvisor::skills::SkillsRepo;
use agentvisor::stores::{MemoryBudgetLedger, MemoryScheduleStore};
use agentvisor::RunStatus;
use support::scratch::Scratch;

fn repo(schedule: &str) -> Scratch {
    let dir = Scratch::new("scheduler-host");
    std::fs::create_dir_all(dir.path("skills/s")).unwrap();
    dir.file("skills/s/SKILL.md", "---\nname: s\n---\nSay hi.\n");
    dir.file(
        "agentvisor.yaml",
        &format!("skills: {{ s: skills/s }}\nschedules:\n{schedule}"),
    );
    dir
}

async fn state(s: &Scheduler, name: &str) -> (ScheduleState, u32) {
    let v = s
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|v| v.schedule.name == name)
        .unwrap();
    (v.state, v.running)
}

/// Fires `name` now and waits (on the paused clock) until its run is
/// recorded.
async fn run_once(s: &Scheduler, name: &str) -> ScheduleState {
    assert_eq!(s.run_now(name).await.unwrap(), FireAnswer::Started);
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (st, running) = state(s, name).await;
        if running == 0 && st.last_outcome.is_some() {
            return st;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_schedule_over_its_daily_budget_is_skipped_with_the_reason() {
    let dir = repo(
        "  - name: capped\n    skill: s\n    cron: \"0 0 1 1 *\"\n    model: scripted\n    script: [{ text: done, usage: { input: 100, output: 20 } }]\n    budget: { per_day: { tokens: 250 } }\n",
    );
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let (host, audit) = support::host_from(support::builder().budget_ledger(ledger.clone())).await;
    let s = Scheduler::start(
        SkillsRepo::open(&dir.0).unwrap(),
        SchedulerConfig {
            store: Arc::new(MemoryScheduleStore::new()),
            runner: Arc::new(HostRunner::new(host.clone())),
            ledger: Some(ledger.clone()),
            clock: SchedulerClock::System,
        },
    )
    .await
    .unwrap();
    // The cap is the ledger's limit of the schedule's caller.
    let limits = ledger.limits("schedule:capped").await.unwrap();
    assert_eq!(limits.tokens, Some(250));
    assert_eq!(limits.window_secs, Some(24 * 3600));

    let first = run_once(&s, "capped").await;
    assert_eq!(first.last_outcome.as_deref(), Some("succeeded"));
    assert_eq!(first.spent_tokens, 120, "the run's real usage");
    let second = run_once(&s, "capped").await;
    assert_eq!(second.last_outcome.as_deref(), Some("succeeded"));
    assert_eq!(second.spent_tokens, 240);
    // 240 of 250 spent: the next run is admitted (the budget actor lets
    // a caller pass its limit by less than one reply), crosses the cap
    // and is stopped: not a failure.
    let crossing = run_once(&s, "capped").await;
    assert_eq!(
        crossing.last_outcome.as_deref(),
        Some("over_budget"),
        "{crossing:?}"
    );
    assert_eq!(crossing.spent_tokens, 360);
    assert_eq!(crossing.streak, 0);
    // Spent: admission refuses the next run, and the fire is skipped.
    let third = run_once(&s, "capped").await;
    assert_eq!(third.last_outcome.as_deref(), Some("skipped"), "{third:?}");
    let why = third.last_reason.clone().unwrap();
    assert!(why.starts_with("budget.per_day: "), "{why}");
    assert!(why.contains("schedule:capped"), "{why}");
    assert_eq!(third.spent_tokens, 360);
    assert_eq!(third.streak, 0, "a skip is not a failure");
    // The refused run is on record like any run refused at admission.
    let id: agentvisor::RunId = third.last_run_id.unwrap().parse().unwrap();
    host.wait_idle().await;
    host.shutdown().await;
    let summary = audit.run_result(id).await.unwrap().unwrap();
    assert_eq!(summary.status, RunStatus::BudgetExceeded);
    assert_eq!(summary.caller_id.as_deref(), Some("schedule:capped"));
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn three_provider_failures_pause_with_their_typed_reason() {
    let dir = repo(
        "  - name: flaky\n    skill: s\n    cron: \"0 0 1 1 *\"\n    model: scripted\n    script: [{ fail: bad_request }]\n    pause_after: 3\n",
    );
    let (host, _audit) = support::host().await;
    let s = Scheduler::start(
        SkillsRepo::open(&dir.0).unwrap(),
        SchedulerConfig {
            store: Arc::new(MemoryScheduleStore::new()),
            runner: Arc::new(HostRunner::new(host.clone())),
            ledger: None,
            clock: SchedulerClock::System,
        },
    )
    .await
    .unwrap();
    let mut last = None;
    for _ in 0..3 {
        last = Some(run_once(&s, "flaky").await);
    }
    let st = last.unwrap();
    assert_eq!(st.last_outcome.as_deref(), Some("failed"));
    let reason = st.streak_reason.clone().unwrap();
    assert!(reason.starts_with("error:"), "{reason}");
    let paused = st.paused.expect("paused after three");
    assert_eq!(paused.why, format!("3 consecutive failures: {reason}"));
    s.stop().await;
    host.shutdown().await;
}
