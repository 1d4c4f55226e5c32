#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `agentvisor budget set/show` manage the persistent per-caller limits, and
//! a persistent token limit holds under a concurrent swarm: 200 runs at
//! concurrency 100 of a 1000-token-a-call agent against `--tokens 10000`
//! spend less than the limit plus one reply (they spent 108 000 before
//! admission reserved the first call's tokens).

mod support;

use serde_json::Value;
use support::cli::{agentvisor, ok_json};
use support::scratch::Scratch;

#[test]
fn budget_set_changes_the_limits_given_and_show_prints_them_with_the_spend() {
    let dir = Scratch::new("set");
    let db = dir.arg("a.db");
    let out = agentvisor(&[
        "--db",
        &db,
        "budget",
        "set",
        "alice",
        "--tokens",
        "5000",
        "--concurrent",
        "3",
        "--window",
        "1h",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = agentvisor(&[
        "--db",
        &db,
        "budget",
        "set",
        "alice",
        "--cost-micros",
        "700",
        "--runtime",
        "90",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let shown = ok_json(&agentvisor(&[
        "--db", &db, "budget", "show", "alice", "--json",
    ]));
    assert_eq!(shown["caller"], "alice");
    assert_eq!(shown["limits"]["tokens"], 5000);
    assert_eq!(shown["limits"]["cost_micros"], 700);
    assert_eq!(shown["limits"]["runtime_secs"], 90);
    assert_eq!(shown["limits"]["concurrent_runs"], 3);
    assert_eq!(shown["window_secs"], 3600);
    assert_eq!(shown["spent"]["tokens"], 0);

    // Runs of alice are charged to her; `none` removes a limit.
    let out = agentvisor(&[
        "--db",
        &db,
        "run",
        "examples/agents/hello.yaml",
        "--caller",
        "alice",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = agentvisor(&["--db", &db, "budget", "set", "alice", "--tokens", "none"]);
    assert_eq!(out.status.code(), Some(0));
    let shown = ok_json(&agentvisor(&[
        "--db", &db, "budget", "show", "alice", "--json",
    ]));
    assert!(
        shown["limits"].get("tokens").is_none_or(Value::is_null),
        "{shown}"
    );
    assert!(shown["spent"]["tokens"].as_u64().unwrap() > 0, "{shown}");
    assert_eq!(shown["spent"]["runs"], 1);

    agentvisor(&["--db", &db, "budget", "set", "bob", "--tokens", "1"]);
    let all = ok_json(&agentvisor(&["--db", &db, "budget", "show", "--json"]));
    let callers: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["caller"].as_str().unwrap())
        .collect();
    assert_eq!(callers, ["alice", "bob"]);
    let human = agentvisor(&["--db", &db, "budget", "show"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("alice") && text.contains("tokens"), "{text}");
}

#[test]
fn bad_budget_values_exit_2_naming_the_flag() {
    let dir = Scratch::new("bad");
    let db = dir.arg("a.db");
    for (flag, value) in [
        ("--tokens", "-1"),
        ("--tokens", "99999999999999999999"),
        ("--concurrent", "4294967296"),
        ("--window", "0s"),
        ("--window", "400d"),
        ("--runtime", "forever"),
    ] {
        let out = agentvisor(&["--db", &db, "budget", "set", "carol", flag, value]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }
    let out = agentvisor(&["--db", ":memory:", "budget", "show"]);
    assert_eq!(out.status.code(), Some(2));
}

/// A 1 000-token-a-call agent (`extra` added to its manifest) swarmed 200
/// times by caller `swarm` against a stored limit of 10 000, with `args`
/// added to the swarm: the tokens the ledger recorded (and the check that
/// most runs were stopped by the budget).
fn swarm_against_a_stored_limit(name: &str, extra: &str, args: &[&str]) -> u64 {
    let dir = Scratch::new(name);
    let db = dir.arg("a.db");
    let manifest = dir.arg("k.yaml");
    std::fs::write(
        &manifest,
        format!("name: k\ntools: [echo]\n{extra}script:\n  - {{ tool: echo, args: {{ text: a }}, usage: {{ input: 900, output: 100 }}, latency: 20ms }}\n  - {{ tool: echo, args: {{ text: b }}, usage: {{ input: 900, output: 100 }}, latency: 20ms }}\n  - {{ text: done, usage: {{ input: 900, output: 100 }}, latency: 20ms }}\n"),
    )
    .unwrap();
    let out = agentvisor(&["--db", &db, "budget", "set", "swarm", "--tokens", "10000"]);
    assert_eq!(out.status.code(), Some(0));
    let mut swarm = vec!["--db", &db, "swarm", &manifest, "--runs", "200", "--json"];
    swarm.extend_from_slice(args);
    let summary = agentvisor(&swarm);
    assert_eq!(summary.status.code(), Some(1), "not every run can be ok");
    let summary: Value = serde_json::from_slice(&summary.stdout).unwrap();
    assert_eq!(summary["runs"], 200);
    assert!(
        summary["by_status"]["budget_exceeded"].as_u64().unwrap() > 150,
        "{summary}"
    );
    let shown = ok_json(&agentvisor(&[
        "--db", &db, "budget", "show", "swarm", "--json",
    ]));
    shown["spent"]["tokens"].as_u64().unwrap()
}

#[test]
fn a_persistent_token_limit_holds_under_a_concurrent_swarm() {
    let spent = swarm_against_a_stored_limit("race", "", &["--concurrency", "100"]);
    // The bound: less than the limit plus one reply (1000 tokens).
    assert!(spent < 11_000, "spent {spent}");
    assert!(spent >= 9_000, "spent {spent}");
}

#[test]
fn a_manifest_budget_and_budget_tokens_add_to_the_stored_limit_not_replace_it() {
    // The stored limit (10 000) is the tightest: the manifest's per-run
    // budget and --budget-tokens do not lift it, and every token is
    // recorded in the ledger (before, either one swapped the ledger for
    // an in-memory one: 600 000 spent, 0 recorded).
    let spent = swarm_against_a_stored_limit(
        "layered",
        "budget: { tokens: 100000 }\n",
        &["--concurrency", "50", "--budget-tokens", "600000"],
    );
    assert!(spent < 11_000, "spent {spent}");
    assert!(spent >= 9_000, "recorded in the ledger: spent {spent}");
}
