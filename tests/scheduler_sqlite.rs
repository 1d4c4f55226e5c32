//! The scheduler's state in the SQLite file (schema version 16): the port
//! round trip, and a scheduler stopped and started again over the same
//! file picks up each schedule's pause and why, last outcome and run, and
//! next fire.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::schedule::{Pause, ScheduleState, ScheduleStore};
use agentvisor::schedules::{HostRunner, Scheduler, SchedulerClock, SchedulerConfig};
use agentvisor::skills::SkillsRepo;
use agentvisor::stores::SqliteStore;
use support::scratch::Scratch;

#[tokio::test]
async fn states_round_trip_through_the_file() {
    let dir = Scratch::new("schedule-store");
    let path = dir.path("a.db");
    let state = ScheduleState {
        name: "nightly".into(),
        config_hash: "00ff".into(),
        next_fire_ms: Some(1_800_000_000_000),
        last_fire_ms: Some(1_700_000_000_000),
        last_outcome: Some("failed".into()),
        last_reason: Some("killed:runaway".into()),
        last_run_id: Some("01abc".into()),
        streak: 3,
        streak_reason: Some("killed:runaway".into()),
        paused: Some(Pause {
            why: "3 consecutive failures: killed:runaway".into(),
            at_ms: 1_700_000_000_500,
            auto: true,
        }),
        spent_day: Some("2026-11-27".into()),
        spent_tokens: 1234,
        spent_cost_micros: 56,
        updated_at_ms: 1_700_000_000_600,
    };
    {
        let store = SqliteStore::open(&path).await.unwrap();
        store.put_all(std::slice::from_ref(&state)).await.unwrap();
        let other = ScheduleState {
            name: "gone".into(),
            config_hash: "1".into(),
            ..ScheduleState::default()
        };
        store.put_all(&[other]).await.unwrap();
        store.remove(&["gone".to_string()]).await.unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.get("nightly").await.unwrap(), Some(state.clone()));
    assert_eq!(store.load_all().await.unwrap(), vec![state]);
    assert_eq!(store.get("gone").await.unwrap(), None);
}

#[tokio::test]
async fn a_restarted_scheduler_keeps_pauses_outcomes_and_next_fires() {
    let dir = Scratch::new("scheduler-restart");
    std::fs::create_dir_all(dir.path("skills/s")).unwrap();
    dir.file("skills/s/SKILL.md", "---\nname: s\n---\nSay hi.\n");
    dir.file(
        "agentvisor.yaml",
        "skills: { s: skills/s }\ndefaults: { model: scripted, script: [{ text: hi }] }\nschedules:\n  - { name: a, skill: s, cron: \"0 3 * * *\" }\n  - { name: b, skill: s, cron: \"0 4 * * *\" }\n",
    );
    let db = dir.path("state.db");
    let (host, _) = support::host().await;
    let start = |store: Arc<SqliteStore>| {
        let host = host.clone();
        let root = dir.0.clone();
        async move {
            Scheduler::start(
                SkillsRepo::open(&root).unwrap(),
                SchedulerConfig {
                    store,
                    runner: Arc::new(HostRunner::new(host)),
                    ledger: None,
                    clock: SchedulerClock::System,
                },
            )
            .await
            .unwrap()
        }
    };
    let (next_a, run_b) = {
        let store = Arc::new(SqliteStore::open(&db).await.unwrap());
        let s = start(store).await;
        s.pause("a", "maintenance").await.unwrap();
        s.run_now("b").await.unwrap();
        let run_b = loop {
            let b = s.list().await.unwrap().remove(1);
            if b.running == 0 && b.state.last_outcome.is_some() {
                break b.state.last_run_id.unwrap();
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let next_a = s.list().await.unwrap()[0].state.next_fire_ms;
        s.stop().await;
        (next_a, run_b)
    };
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let s = start(store).await;
    let views = s.list().await.unwrap();
    let a = &views[0].state;
    assert_eq!(
        a.paused.as_ref().map(|p| p.why.as_str()),
        Some("maintenance")
    );
    assert_eq!(a.next_fire_ms, next_a);
    let b = &views[1].state;
    assert_eq!(b.last_outcome.as_deref(), Some("succeeded"));
    assert_eq!(b.last_run_id.as_deref(), Some(run_b.as_str()));
    assert!(b.paused.is_none());
    s.stop().await;
    host.shutdown().await;
}
