//! `agentvisor run --approve ask|all|none`: the tool calls a manifest
//! gates (`approval:`) are decided by the command, since no operator can
//! reach a local run. Without a terminal on stdin, `ask` denies at once
//! instead of waiting out the approval timeout (an hour here).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::Value;
use support::cli::{command, ok_json};
use support::scratch::Scratch;

const GATED: &str = r#"
name: gated
model: scripted
prompt: go
tools: [add, upper]
approval: [add]
limits: { approval_timeout: 1h }
script:
  - { tools: [ { tool: add, args: { a: 2, b: 3 } }, { tool: upper, args: { text: hi } } ] }
  - { text: "done" }
"#;

/// `agentvisor --db :memory: run GATED --json` with `extra` flags; stdin
/// is not a terminal. The result and stderr.
fn run_gated(extra: &[&str]) -> (Value, String) {
    let dir = Scratch::new("approve");
    let manifest = dir.file("gated.yaml", GATED);
    let manifest = manifest.display().to_string();
    let mut args = vec!["--db", ":memory:", "run", &manifest, "--json"];
    args.extend_from_slice(extra);
    let out = command(&args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (ok_json(&out), stderr)
}

/// The steps of a result as (tool, ok, error).
fn steps(r: &Value) -> Vec<(String, bool, String)> {
    r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["tool"].as_str().unwrap().to_string(),
                s["ok"].as_bool().unwrap(),
                s["error"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn all_approves_every_gated_call() {
    let (r, stderr) = run_gated(&["--approve", "all"]);
    assert_eq!(r["status"], "ok", "{r}");
    let s = steps(&r);
    assert_eq!((s[0].0.as_str(), s[0].1), ("add", true), "{r}");
    assert_eq!((s[1].0.as_str(), s[1].1), ("upper", true), "{r}");
    assert!(stderr.contains("approved add"), "{stderr}");
}

#[test]
fn none_denies_them_and_the_model_reads_why() {
    let (r, stderr) = run_gated(&["--approve", "none"]);
    assert_eq!(r["status"], "ok", "{r}");
    let s = steps(&r);
    assert_eq!(
        s[0],
        (
            "add".to_string(),
            false,
            "approval_denied: denied by operator: denied by --approve none".to_string()
        ),
        "{r}"
    );
    // A call the manifest does not gate runs as ever.
    assert_eq!((s[1].0.as_str(), s[1].1), ("upper", true), "{r}");
    assert!(stderr.contains("denied add"), "{stderr}");
}

#[test]
fn ask_without_a_terminal_denies_at_once_and_says_why() {
    // The default; the approval timeout is an hour, so a run that waited
    // for it would not end within this test.
    let (r, stderr) = run_gated(&[]);
    assert_eq!(r["status"], "ok", "{r}");
    let s = steps(&r);
    assert_eq!(s[0].0, "add");
    assert!(!s[0].1, "{r}");
    assert!(s[0].2.contains("no operator to approve it"), "{r}");
    assert!(stderr.contains("stdin is not a terminal"), "{stderr}");
    let took = r["finished_at"].as_u64().unwrap() - r["started_at"].as_u64().unwrap();
    assert!(took < 60_000, "the run waited {took} ms: {r}");
}
