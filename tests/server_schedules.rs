//! `/v1/schedules` over HTTP (`serve --skills`): the list (next fire in
//! the schedule's zone and in UTC, last outcome, streak, pause and why),
//! `run`, `pause`, `resume` and `reload` (a refused repository changes
//! nothing), a schedule's runs in `/v1/runs` with `schedule`, admin
//! tokens only, and a server without a skills repository.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::schedules::{HostRunner, Scheduler, SchedulerClock, SchedulerConfig};
use agentvisor::skills::SkillsRepo;
use agentvisor::stores::{MemoryBudgetLedger, MemoryScheduleStore};
use serde_json::{json, Value};
use support::loopback::{Running, ALICE, ROOT};
use support::scratch::Scratch;

const MANIFEST: &str = "skills: { s: skills/s }\ndefaults: { model: scripted, script: [{ text: \"hi <memory>m</memory>\" }] }\nschedules:\n  - { name: digest, skill: s, cron: \"30 7 * * mon-fri\", timezone: Europe/Oslo }\n  - { name: hourly, skill: s, cron: \"@hourly\" }\n";

async fn start() -> (Running, Scratch) {
    let dir = Scratch::new("server-schedules");
    std::fs::create_dir_all(dir.path("skills/s")).unwrap();
    dir.file("skills/s/SKILL.md", "---\nname: s\n---\nSay hi.\n");
    dir.file("agentvisor.yaml", MANIFEST);
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let (host, store) = support::host_from(support::builder().budget_ledger(ledger.clone())).await;
    let s = Scheduler::start(
        SkillsRepo::open(&dir.0).unwrap(),
        SchedulerConfig {
            store: Arc::new(MemoryScheduleStore::new()),
            runner: Arc::new(HostRunner::new(host.clone())),
            ledger: Some(ledger),
            clock: SchedulerClock::System,
        },
    )
    .await
    .unwrap();
    let running = support::loopback::start(host, store, &[], true).await;
    running.server.set_scheduler(Some(s));
    (running, dir)
}

fn find<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

#[tokio::test]
async fn schedules_are_listed_run_paused_resumed_and_reloaded() {
    let (s, dir) = start().await;
    let (status, list, _) = s.req("GET", "/v1/schedules", Some(ROOT), None).await;
    assert_eq!(status, 200, "{list}");
    let digest = find(&list, "digest");
    assert_eq!(digest["skill"], "s");
    assert_eq!(digest["cron"], "30 7 * * mon-fri");
    assert_eq!(digest["timezone"], "Europe/Oslo");
    assert_eq!(digest["overlap"], "skip");
    let zoned = digest["next_fire"].as_str().unwrap();
    assert!(
        zoned.contains("T07:30:00+0") && zoned.ends_with("[Europe/Oslo]"),
        "{zoned}"
    );
    let utc = digest["next_fire_utc"].as_str().unwrap();
    assert!(
        utc.ends_with('Z') && (utc.contains("T06:30:00") || utc.contains("T05:30:00")),
        "{utc}"
    );
    assert_eq!(digest["paused"], false);
    assert_eq!(digest["streak"], 0);

    // Run now: the run is the host's, listed with its schedule.
    let (status, fired, _) = s
        .req("POST", "/v1/schedules/digest/run", Some(ROOT), None)
        .await;
    assert_eq!(
        (status, &fired["fired"]),
        (202, &json!("started")),
        "{fired}"
    );
    let run_id = loop {
        let (_, list, _) = s.req("GET", "/v1/schedules", Some(ROOT), None).await;
        let d = find(&list, "digest");
        if d["running"] == 0 && d["last_outcome"].is_string() {
            assert_eq!(d["last_outcome"], "succeeded", "{d}");
            break d["last_run_id"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    s.host.wait_idle().await;
    let (_, runs, _) = s.req("GET", "/v1/runs", Some(ROOT), None).await;
    let item = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == run_id.as_str())
        .unwrap_or_else(|| panic!("{runs}"));
    assert_eq!(item["schedule"], "digest");
    assert_eq!(item["caller_id"], "schedule:digest");
    // `?schedule=` lists that schedule's runs only.
    let (_, only, _) = s
        .req("GET", "/v1/runs?schedule=digest", Some(ROOT), None)
        .await;
    let ids: Vec<&str> = only["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [run_id.as_str()], "{only}");
    let (_, none, _) = s
        .req("GET", "/v1/runs?schedule=hourly", Some(ROOT), None)
        .await;
    assert_eq!(none["runs"], json!([]), "{none}");

    // Pause with a reason, then resume.
    let (status, paused, _) = s
        .req(
            "POST",
            "/v1/schedules/digest/pause",
            Some(ROOT),
            Some(json!({ "reason": "holiday" })),
        )
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(
        (&paused["paused"], &paused["paused_why"]),
        (&json!(true), &json!("holiday"))
    );
    assert_eq!(paused["paused_auto"], false);
    let (status, resumed, _) = s
        .req("POST", "/v1/schedules/digest/resume", Some(ROOT), None)
        .await;
    assert_eq!((status, &resumed["paused"]), (200, &json!(false)));
    // Without a body, the pause names its caller.
    let (_, paused, _) = s
        .req("POST", "/v1/schedules/hourly/pause", Some(ROOT), None)
        .await;
    assert_eq!(paused["paused_why"], "paused by root");

    // Unknown schedule: 404 naming the known ones.
    let (status, err, _) = s
        .req("POST", "/v1/schedules/nope/run", Some(ROOT), None)
        .await;
    assert_eq!(status, 404);
    assert!(
        err["error"]["message"].as_str().unwrap().contains("digest"),
        "{err}"
    );

    // Reload: a refused repository changes nothing.
    dir.file(
        "agentvisor.yaml",
        "schedules:\n  - { name: x, skill: gone, cron: \"bad\" }\n",
    );
    let (status, err, _) = s
        .req("POST", "/v1/schedules/reload", Some(ROOT), None)
        .await;
    assert_eq!(status, 422, "{err}");
    assert_eq!(err["error"]["kind"], "invalid_repo");
    let (_, list, _) = s.req("GET", "/v1/schedules", Some(ROOT), None).await;
    assert_eq!(list["schedules"].as_array().unwrap().len(), 2);
    // A good one: one schedule gone, one new.
    dir.file(
        "agentvisor.yaml",
        &MANIFEST.replace(
            "name: hourly, skill: s, cron: \"@hourly\"",
            "name: nightly, skill: s, cron: \"@daily\"",
        ),
    );
    let (status, summary, _) = s
        .req("POST", "/v1/schedules/reload", Some(ROOT), None)
        .await;
    assert_eq!(status, 200, "{summary}");
    assert_eq!(summary["added"], json!(["nightly"]));
    assert_eq!(summary["removed"], json!(["hourly"]));
    assert_eq!(summary["unchanged"], json!(["digest"]));
    s.server.scheduler().unwrap().stop().await;
}

#[tokio::test]
async fn schedules_are_for_admins_and_need_a_repository() {
    let (s, _dir) = start().await;
    // A caller's token sees no schedule (as it sees no run but its own).
    let (status, list, _) = s.req("GET", "/v1/schedules", Some(ALICE), None).await;
    assert_eq!(
        (status, list),
        (200, json!({ "repo": null, "schedules": [] }))
    );
    let (status, _, _) = s.req("GET", "/v1/schedules", None, None).await;
    assert_eq!(status, 401);
    for (method, path) in [
        ("POST", "/v1/schedules/digest/run"),
        ("POST", "/v1/schedules/digest/pause"),
        ("POST", "/v1/schedules/reload"),
    ] {
        let (status, body, _) = s.req(method, path, Some(ALICE), None).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
        let (status, _, _) = s.req(method, path, None, None).await;
        assert_eq!(status, 401, "{method} {path}");
    }
    s.server.scheduler().unwrap().stop().await;
    // A server without --skills lists none and has none to command.
    let (host, store) = support::host().await;
    let bare = support::loopback::start(host, store, &[], false).await;
    let (status, list, _) = bare.req("GET", "/v1/schedules", None, None).await;
    assert_eq!(
        (status, list),
        (200, json!({ "repo": null, "schedules": [] }))
    );
    let (status, err, _) = bare.req("POST", "/v1/schedules/x/run", None, None).await;
    assert_eq!(
        (status, &err["error"]["kind"]),
        (404, &json!("no_schedules"))
    );
}
