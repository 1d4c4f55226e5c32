#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `agentvisor fork` and `agentvisor diff` on the SQLite store: the worked
//! example of docs/fork.md (record `hello`, fork it at step 1 onto
//! another script, diff the two), and the refusals (exit 2).

mod support;

use support::cli::{agentvisor, ok_json};
use support::scratch::Scratch;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_recorded_run_forks_onto_another_script_and_diffs_at_step_2() {
    let dir = Scratch::new("fork");
    let db = dir.arg("a.db");
    let run = ok_json(&agentvisor(&[
        "run",
        "examples/agents/hello.yaml",
        "--db",
        &db,
        "--json",
    ]));
    let source = run["run_id"].as_str().unwrap().to_string();

    let out = agentvisor(&[
        "fork",
        &source,
        "--at-step",
        "1",
        "--manifest",
        "examples/agents/hello_forked.yaml",
        "--db",
        &db,
        "--json",
    ]);
    let forked = ok_json(&out);
    let result = &forked["result"];
    assert_eq!(result["status"], "ok", "{forked:#}");
    assert_eq!(result["output"], "2+3=5, done");
    assert_eq!(result["forked_from"]["run_id"], source.as_str());
    assert_eq!(result["forked_from"]["step"], 1);
    assert!(forked["divergence"].is_null(), "{forked:#}");
    let steps: Vec<&str> = result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tool"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["add", "echo"]);
    let fork_id = result["run_id"].as_str().unwrap().to_string();

    // On record, with its origin: `runs show` reads it back.
    let shown = ok_json(&agentvisor(&[
        "runs", "show", &fork_id, "--db", &db, "--json",
    ]));
    let text = shown.to_string();
    assert!(text.contains("forked_from"), "{shown:#}");
    // And `runs list` says which run is a fork of which.
    let listed = ok_json(&agentvisor(&["runs", "list", "--db", &db, "--json"]));
    let rows = listed.as_array().unwrap();
    let row = |id: &str| rows.iter().find(|r| r["run_id"] == id).unwrap().clone();
    assert_eq!(row(&fork_id)["forked_from"]["run_id"], source.as_str());
    assert_eq!(row(&fork_id)["forked_from"]["step"], 1);
    assert!(row(&source).get("forked_from").is_none());

    let out = agentvisor(&["diff", &source, &fork_id, "--db", &db, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["first_divergence"]["step"], 2, "{d:#}");
    assert_eq!(d["steps"][0]["same"], true);
    assert_eq!(d["b"]["forked_from"]["step"], 1);
    let out = agentvisor(&["diff", &source, &source, "--db", &db]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("agree"));
}

#[test]
fn a_step_past_the_recording_or_an_unknown_run_exits_2() {
    let dir = Scratch::new("fork-refused");
    let db = dir.arg("a.db");
    let run = ok_json(&agentvisor(&[
        "run",
        "examples/agents/hello.yaml",
        "--db",
        &db,
        "--json",
    ]));
    let source = run["run_id"].as_str().unwrap().to_string();
    let manifest = "examples/agents/hello_forked.yaml";
    let out = agentvisor(&[
        "fork",
        &source,
        "--at-step",
        "4",
        "--manifest",
        manifest,
        "--db",
        &db,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("recorded 3 step(s)"),
        "{}",
        stderr(&out)
    );
    let unknown = "0123456789abcdef0123456789abcdef";
    let out = agentvisor(&[
        "fork",
        unknown,
        "--at-step",
        "1",
        "--manifest",
        manifest,
        "--db",
        &db,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no run"), "{}", stderr(&out));
    // Without a manifest the fork runs the one the recorded run ran, kept
    // in the database (its script included): it goes on as the source did.
    let out = agentvisor(&["fork", &source, "--at-step", "1", "--db", &db, "--json"]);
    let same = ok_json(&out);
    assert_eq!(same["result"]["status"], "ok", "{same:#}");
    assert_eq!(same["result"]["output"], run["output"], "{same:#}");
    assert!(same["divergence"].is_null(), "{same:#}");
    let same_id = same["result"]["run_id"].as_str().unwrap().to_string();
    let out = agentvisor(&["diff", &source, &same_id, "--db", &db, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = agentvisor(&["diff", &source, unknown, "--db", &db]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // Overrides are checked before anything runs.
    for (flag, value, says) in [
        ("--critic-policy", "{ colour: red }", "--critic-policy"),
        ("--system-file", "no/such/file", "--system-file"),
        ("--live-tools", "write,sideways", "unknown effect"),
    ] {
        let out = agentvisor(&[
            "fork",
            &source,
            "--at-step",
            "1",
            "--manifest",
            manifest,
            flag,
            value,
            "--db",
            &db,
        ]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{flag}: {}", stderr(&out));
    }
}

#[test]
fn eval_sweeps_a_cohort_writes_its_report_and_stops_at_its_budget() {
    let dir = Scratch::new("eval");
    let db = dir.arg("a.db");
    let swarm = agentvisor(&[
        "swarm",
        "examples/agents/hello.yaml",
        "--runs",
        "6",
        "--db",
        &db,
    ]);
    assert_eq!(swarm.status.code(), Some(0), "{}", stderr(&swarm));
    let report = dir.arg("report");
    let eval = |budget: &str, report: Option<&str>| {
        let mut args = vec![
            "eval",
            "--agent",
            "hello",
            "--manifest",
            "examples/agents/hello_forked.yaml",
            "--at-step",
            "1",
            "--repeats",
            "2",
            "--budget-tokens",
            budget,
            "--db",
            &db,
            "--json",
        ];
        if let Some(r) = report {
            args.extend(["--report", r]);
        }
        agentvisor(&args)
    };
    let out = eval("1000000", Some(&report));
    let v = ok_json(&out);
    assert_eq!(v["totals"]["runs"], 6, "{v:#}");
    assert_eq!(v["totals"]["forked"], 12, "{v:#}");
    assert_eq!(v["totals"]["divergence_histogram"]["2"], 12, "{v:#}");
    assert_eq!(v["totals"]["status_changes"]["ok→ok"], 12, "{v:#}");
    let json = std::fs::read_to_string(dir.path("report").join("eval.json")).unwrap();
    assert!(json.contains("\"totals\""));
    let html = std::fs::read_to_string(dir.path("report").join("index.html")).unwrap();
    assert!(html.contains("<svg id=\"histogram\""));
    // The forks of that sweep are not the next sweep's cohort; a budget
    // of 300 tokens stops this one early (exit 1), saying so.
    let out = eval("300", None);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["totals"]["runs"], 6, "{v:#}");
    assert_eq!(v["totals"]["stopped_by_budget"], true, "{v:#}");
    assert!(v["totals"]["not_run"].as_u64().unwrap() > 0, "{v:#}");
}
