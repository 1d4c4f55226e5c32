#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Guards at the command line: a bad `guard:` or `output_guard:` entry is
//! refused at load, exit 2, naming the key and the line; the guard example
//! runs to `ok` with each guard's decision in its `--json` result.

mod support;

use std::process::Output;

use serde_json::Value;
use support::scratch::Scratch;

fn agentvisor(args: &[&str]) -> Output {
    support::cli::command(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the binary runs")
}

#[test]
fn bad_guard_entries_exit_2_naming_the_key_and_line() {
    let dir = Scratch::new("cli-guards-bad");
    let cases = [
        ("  - { tool: add, acton: deny }", "unknown field `acton`"),
        ("  - { tool: add }", "needs `action`"),
        (
            "  - { tool: add, args: { pointer: /a, matches: \"(\" }, action: deny }",
            "`args.matches` is not a usable regular expression",
        ),
        (
            "  - { tool: add, action: deny, max_calls: 2 }",
            "`max_calls` with `action: deny`",
        ),
    ];
    for (i, (entry, says)) in cases.iter().enumerate() {
        let file = dir.path(&format!("bad{i}.yaml"));
        std::fs::write(
            &file,
            format!("name: g\ntools: [add]\nguard:\n{entry}\nscript:\n  - {{ text: hi }}\n"),
        )
        .unwrap();
        let out = agentvisor(&["--db", ":memory:", "run", &file.display().to_string()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{entry}: {stderr}");
        assert!(stderr.contains(says), "{entry}: {stderr}");
        assert!(stderr.contains("line 4"), "{entry}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn the_guard_example_records_each_decision() {
    let out = agentvisor(&[
        "--db",
        ":memory:",
        "run",
        "examples/agents/guard.yaml",
        "--json",
        "--approve",
        "all",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON result");
    assert_eq!(r["status"], "ok", "{r}");
    let decided: Vec<(String, String)> = r["critic"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["action"].as_str().unwrap().to_string(),
                d["detail"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let want = [
        ("deny", "upper: no shouting"),
        ("deny", "echo: nothing under /etc"),
        ("ask", "echo"),
        ("deny", "add: max_calls 2 reached"),
        ("deny", "pattern 1 matched the final answer"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, d)| (a.to_string(), d.to_string()))
        .collect();
    assert_eq!(decided, want, "{r}");
    // `--approve all`: the asked-for call ran.
    let rm = &r["steps"][2];
    assert_eq!(rm["ok"], true, "{rm}");
    assert!(!r["output"].as_str().unwrap().contains("API_KEY"), "{r}");
}
