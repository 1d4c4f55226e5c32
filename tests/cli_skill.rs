//! `agentvisor skill check|list|run` as a user runs them, on the example
//! repository (examples/skills) and on broken ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::cli::{agentvisor, command, ok_json};
use support::scratch::Scratch;

const EXAMPLE: &str = "examples/skills";

#[test]
fn check_and_list_the_example() {
    let out = agentvisor(&["skill", "check", EXAMPLE]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("2 skill(s), 3 schedule(s)"), "{text}");
    let rows = ok_json(&agentvisor(&["skill", "list", EXAMPLE, "--json"]));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let weekday = &rows[0];
    assert_eq!(weekday["name"], "weekday-digest");
    let next = weekday["next_fire"].as_str().unwrap();
    assert!(
        next.contains("T07:30:00") && next.ends_with("[Europe/Oslo]"),
        "{next}"
    );
    let weekly = &rows[1];
    assert!(weekly["jitter_secs"].as_u64().unwrap() < 600);
    assert!(weekly["next_fire"]
        .as_str()
        .unwrap()
        .ends_with("[America/New_York]"));
    let human = agentvisor(&["skill", "list", EXAMPLE]);
    assert!(String::from_utf8(human.stdout).unwrap().contains("triage"));
}

#[test]
fn a_dry_run_of_the_example_runs_the_scripted_model() {
    let out = agentvisor(&[
        "skill",
        "run",
        EXAMPLE,
        "--schedule",
        "weekday-digest",
        "--dry-run",
        "--json",
        "--db",
        ":memory:",
    ]);
    let r = ok_json(&out);
    assert_eq!(r["outcome"], "succeeded");
    assert_eq!(r["status"], "ok");
    assert!(r["kill_reason"].is_null());
    assert_eq!(r["memory"], "2026-11-26: 3 changes, release green");
    assert_eq!(r["outputs"]["summary"], "3 changes, release green");
    assert_eq!(
        r["output"],
        "Three changes landed yesterday; the release branch is green."
    );
    assert_eq!(r["publish"], serde_json::json!([]));
    assert!(r["writeback_sha"].is_null());
    assert_eq!(r["usage"]["input_tokens"], 420);
    assert!(r["cost_micros"].is_u64());
    let human = agentvisor(&[
        "skill",
        "run",
        EXAMPLE,
        "--schedule",
        "weekly-digest",
        "--dry-run",
        "--db",
        ":memory:",
    ]);
    assert_eq!(human.status.code(), Some(0));
    let text = String::from_utf8(human.stdout).unwrap();
    assert!(
        text.contains("succeeded") && text.contains("memory: week 48: quiet"),
        "{text}"
    );
}

#[test]
fn a_secret_stays_out_of_the_result_and_the_database() {
    let secret = "trk-5ecret-value-0042";
    let dir = Scratch::new("cli-skill");
    let db = dir.arg("skills.db");
    let out = command(&[
        "skill",
        "run",
        EXAMPLE,
        "--schedule",
        "triage",
        "--dry-run",
        "--json",
        "--db",
        &db,
    ])
    .env("AGENTVISOR_SECRET_TRACKER_TOKEN", secret)
    .output()
    .unwrap();
    let r = ok_json(&out);
    assert_eq!(r["outcome"], "succeeded");
    assert_eq!(r["memory"], "last triaged: #41, #42");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(secret));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(secret));
    let id = r["run_id"].as_str().unwrap();
    let shown = agentvisor(&["runs", "show", id, "--json", "--db", &db]);
    assert_eq!(
        shown.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let text = String::from_utf8(shown.stdout).unwrap();
    assert!(
        text.contains("TRACKER_TOKEN=[secret]") || !text.contains("TRACKER_TOKEN"),
        "{text}"
    );
    assert!(!text.contains(secret), "the records hold the secret");
    let bytes = std::fs::read(dir.path("skills.db")).unwrap();
    let raw = String::from_utf8_lossy(&bytes);
    assert!(!raw.contains(secret), "the database file holds the secret");

    // Without it: the run fails, naming the variable, before any model call.
    let out = command(&[
        "skill",
        "run",
        EXAMPLE,
        "--schedule",
        "triage",
        "--dry-run",
        "--json",
        "--db",
        ":memory:",
    ])
    .env_remove("AGENTVISOR_SECRET_TRACKER_TOKEN")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["outcome"], "failed");
    assert_eq!(r["error_kind"], "missing_secret");
    assert!(r["error"]
        .as_str()
        .unwrap()
        .contains("AGENTVISOR_SECRET_TRACKER_TOKEN"));
    assert_eq!(
        r["phases"].as_array().unwrap().last().unwrap()["prev"],
        "secrets"
    );
}

#[test]
fn refusals_exit_2() {
    let dir = Scratch::new("cli-skill-bad");
    std::fs::create_dir_all(dir.path("skills/a")).unwrap();
    dir.file("skills/a/SKILL.md", "---\nname: a\n---\nHi\n");
    dir.file(
        "agentvisor.yaml",
        "skills: { a: skills/a }\nschedules:\n  - name: s\n    skill: a\n    cron: \"* * *\"\n    script: [{ text: x }]\n",
    );
    let out = agentvisor(&["skill", "check", &dir.arg("")]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("`cron`") && err.contains("line 5"), "{err}");
    // An unknown schedule.
    let out = agentvisor(&[
        "skill",
        "run",
        EXAMPLE,
        "--schedule",
        "nope",
        "--dry-run",
        "--db",
        ":memory:",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("known: weekday-digest"));
}

#[test]
fn a_run_publishes_and_reports_each_destination() {
    let dir = Scratch::new("cli-skill-publish");
    std::fs::create_dir_all(dir.path("skills/a")).unwrap();
    dir.file("skills/a/SKILL.md", "---\nname: a\n---\nHi\n");
    dir.file(
        "agentvisor.yaml",
        "skills: { a: skills/a }\nschedules:\n  - name: s\n    skill: a\n    cron: \"0 * * * *\"\n    script: [{ text: \"hello <memory>m</memory>\" }]\n    destinations:\n      - { type: file, path: out/a.txt, template: \"{{skill}}: {{output}}\" }\n      - { type: webhook, name: nowhere, url: \"http://127.0.0.1:9/in?token=abcdef0123456789\", when: on_failure }\n",
    );
    let out = agentvisor(&[
        "skill",
        "run",
        &dir.arg(""),
        "--schedule",
        "s",
        "--json",
        "--db",
        &dir.arg("av.db"),
    ]);
    let r = ok_json(&out);
    assert_eq!(r["outcome"], "succeeded", "{r}");
    assert_eq!(r["dry_run"], false);
    let phases: Vec<&str> = r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["boot", "secrets", "exec", "publish"]);
    assert_eq!(r["publish"][0]["state"], "delivered");
    assert_eq!(r["publish"][1]["state"], "skipped");
    assert_eq!(r["publish"][1]["target"], "http://127.0.0.1:9/…");
    assert!(r["writeback_sha"].is_null());
    assert_eq!(
        std::fs::read_to_string(dir.path("out/a.txt")).unwrap(),
        "a: hello"
    );
    assert!(!r.to_string().contains("abcdef0123456789"));
    // `runs show` gives the publishes' outcomes with the run.
    let run_id = r["run_id"].as_str().unwrap();
    let shown = ok_json(&agentvisor(&[
        "runs",
        "show",
        run_id,
        "--json",
        "--db",
        &dir.arg("av.db"),
    ]));
    assert_eq!(shown["publish"][0]["state"], "delivered");
    assert_eq!(shown["publish"][1]["state"], "skipped");
    assert!(!shown.to_string().contains("abcdef0123456789"));
    let human = agentvisor(&["runs", "show", run_id, "--db", &dir.arg("av.db")]);
    let text = String::from_utf8(human.stdout).unwrap();
    assert!(text.contains("publishes:"), "{text}");
}
