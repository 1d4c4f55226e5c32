//! `agentvisor serve --skills REPO` as a process: the schedules are
//! served, a pause survives a restart on the same database, SIGHUP
//! re-reads the repository, and a repository that is refused at start
//! exits 2 naming the problem.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::{json, Value};
use support::scratch::Scratch;
use support::serving::Serving;

const MANIFEST: &str = "skills: { s: skills/s }\ndefaults: { model: scripted, script: [{ text: hi }] }\nschedules:\n  - { name: digest, skill: s, cron: \"30 7 * * *\", timezone: Europe/Oslo }\n";

fn repo() -> Scratch {
    let dir = Scratch::new("serve-skills");
    std::fs::create_dir_all(dir.path("skills/s")).unwrap();
    std::fs::create_dir_all(dir.path("agents")).unwrap();
    dir.file("skills/s/SKILL.md", "---\nname: s\n---\nSay hi.\n");
    dir.file("agentvisor.yaml", MANIFEST);
    dir
}

fn names(list: &Value) -> Vec<String> {
    list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_served_kept_across_a_restart_and_reloaded_on_sighup() {
    let dir = repo();
    let db = dir.path("serve.db");
    let skills = dir.arg("");
    let s = Serving::start(&db, &dir.path("agents"), &["--skills", &skills]);
    let (code, list) = s.call("GET", "/v1/schedules", None).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(names(&list), ["digest"]);
    let (code, v) = s
        .call(
            "POST",
            "/v1/schedules/digest/pause",
            Some(json!({ "reason": "holiday" })),
        )
        .await;
    assert_eq!((code, &v["paused_why"]), (200, &json!("holiday")), "{v}");
    s.stop().await;

    // The same database: the pause and its reason are still there.
    let s = Serving::start(&db, &dir.path("agents"), &["--skills", &skills]);
    let (_, list) = s.call("GET", "/v1/schedules", None).await;
    assert_eq!(list["schedules"][0]["paused_why"], "holiday", "{list}");

    // SIGHUP re-reads the repository.
    dir.file(
        "agentvisor.yaml",
        &format!("{MANIFEST}  - {{ name: hourly, skill: s, cron: \"@hourly\" }}\n"),
    );
    s.signal("HUP");
    let list = s
        .poll("/v1/schedules", |v| {
            v["schedules"].as_array().is_some_and(|a| a.len() == 2)
        })
        .await;
    assert_eq!(names(&list), ["digest", "hourly"]);
    assert_eq!(
        list["schedules"][0]["paused"], true,
        "unchanged, still paused"
    );
    s.stop().await;
}

#[test]
fn a_refused_repository_exits_2_naming_the_problem() {
    let dir = repo();
    dir.file(
        "agentvisor.yaml",
        "skills: { s: skills/s }\nschedules:\n  - { name: x, skill: s, cron: \"61 * * * *\" }\n",
    );
    let out = support::cli::agentvisor(&[
        "--db",
        ":memory:",
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--skills",
        &dir.arg(""),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("61") && err.contains("cron"), "{err}");
}
