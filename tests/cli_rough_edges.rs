#![allow(clippy::unwrap_used, clippy::expect_used)]
//! CLI rough edges: output into a closed pipe ends quietly (no panic),
//! `--input -` reads the prompt from stdin, and a caught tool panic is one
//! warn line on stderr even with `RUST_BACKTRACE=1`.

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use support::scratch::Scratch;

fn command(args: &[&str]) -> Command {
    let mut c = support::cli::command(args);
    c.env_remove("AGENTVISOR_LOG").env("RUST_BACKTRACE", "1");
    c
}

fn agentvisor(args: &[&str]) -> Output {
    command(args).output().expect("the binary runs")
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let dir = Scratch::new("pipe");
    let db = dir.arg("a.db");
    let out = agentvisor(&[
        "--db",
        &db,
        "swarm",
        "examples/agents/hello.yaml",
        "--runs",
        "300",
        "--concurrency",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(0));
    for args in [
        vec!["--db", &db, "runs", "list", "--limit", "300"],
        vec!["--db", &db, "runs", "list", "--json", "--limit", "300"],
        vec!["--db", &db, "run", "examples/agents/hello.yaml", "--events"],
        vec!["mcp", "tools", "examples/agents/hello.yaml"],
        vec!["mcp", "tools", "examples/agents/hello.yaml", "--json"],
        vec!["--db", &db, "sessions", "list"],
        vec!["token", "new", "--caller", "alice"],
    ] {
        // The reading end is closed before the child writes anything:
        // every line it prints goes into a broken pipe.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = command(&args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(stderr.trim().is_empty(), "{args:?}: {stderr}");
        assert!(
            matches!(out.status.code(), Some(0)),
            "{args:?}: {:?}",
            out.status
        );
    }
}

#[test]
fn input_dash_reads_the_prompt_from_stdin() {
    let dir = Scratch::new("stdin");
    let db = dir.arg("a.db");
    let prompt = "a prompt\nfrom stdin, two lines";
    for cmd in ["run", "swarm"] {
        let mut args = vec![
            "--db",
            &db,
            cmd,
            "examples/agents/hello.yaml",
            "--input",
            "-",
            "--json",
        ];
        if cmd == "swarm" {
            args.extend(["--runs", "3"]);
        }
        let mut child = command(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(prompt.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let list = agentvisor(&["--db", &db, "runs", "list", "--json", "--limit", "5000"]);
    let runs: Value = serde_json::from_slice(&list.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 4, "{runs:?}");
    for r in runs {
        let id = r["run_id"].as_str().unwrap();
        let show = agentvisor(&["--db", &db, "runs", "show", id, "--json"]);
        let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
        let started = &shown["records"][0];
        assert_eq!(started["entry"]["record"], "run_started", "{started}");
        let text = started.to_string();
        assert!(text.contains("from stdin, two lines"), "{text}");
    }
}

#[test]
fn a_caught_tool_panic_is_one_warn_line_even_with_backtraces_on() {
    let dir = Scratch::new("panic");
    let manifest = dir.arg("panic.yaml");
    std::fs::write(
        &manifest,
        "name: panicky\ntools: [panic]\nscript:\n  - { tool: panic, args: { message: on purpose } }\n  - { text: survived }\n",
    )
    .unwrap();
    // The binary offers the `panic` tool only when a test asks for it.
    let out = command(&["--db", ":memory:", "run", &manifest, "--json"])
        .env("AGENTVISOR_TEST_TOOLS", "1")
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // A loaded machine may also say that a handler held its critic shard
    // long (capturing the backtrace takes a while): that is about the
    // load, not the panic, and is left out.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("held the critic shard"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("WARN") && lines[0].contains("on purpose"),
        "{stderr}"
    );
    assert!(lines[0].contains("run_id"), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["output"], "survived");
}

#[test]
fn inputs_fill_the_manifest_template_and_a_missing_one_exits_2() {
    let dir = Scratch::new("inputs");
    let db = dir.arg("a.db");
    let manifest = dir.arg("weather.yaml");
    std::fs::write(
        &manifest,
        "name: weather\nprompt: \"Forecast for {{inputs.city}}, {{inputs.days}} days\"\nscript: [{ text: sunny }]\n",
    )
    .unwrap();
    let out = agentvisor(&[
        "--db",
        &db,
        "run",
        &manifest,
        "--inputs",
        r#"{"city": "Oslo", "days": 3}"#,
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = result["run_id"].as_str().unwrap();
    let show = agentvisor(&["--db", &db, "runs", "show", id, "--json"]);
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        shown["records"][0]["entry"]["prompt"],
        "Forecast for Oslo, 3 days"
    );

    for cmd in ["run", "swarm"] {
        let out = agentvisor(&[
            "--db",
            ":memory:",
            cmd,
            &manifest,
            "--inputs",
            r#"{"city": "Oslo"}"#,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {stderr}");
        assert!(stderr.contains("inputs.days"), "{cmd}: {stderr}");
        let out = agentvisor(&["--db", ":memory:", cmd, &manifest, "--inputs", "[1, 2]"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {stderr}");
        assert!(stderr.contains("--inputs"), "{cmd}: {stderr}");
    }
}
