#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Bad input at the command line exits 2 with a message naming what is
//! wrong, never a panic: a manifest limit out of range names its key and
//! line, a manifest over 1 MiB or nested too deep is refused, numeric flags
//! out of range name the flag.

mod support;

use std::process::Output;

use support::scratch::Scratch;

fn agentvisor(args: &[&str]) -> Output {
    support::cli::command(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the binary runs")
}

fn refused(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(needle), "expected `{needle}` in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn manifest_limits_out_of_range_exit_2_naming_the_key() {
    let dir = Scratch::new("cli-bounds-limits");
    for (key, value) in [
        ("max_runtime", "18446744073709551615"),
        ("hard_timeout", "1e30"),
        ("stall_timeout", "-3"),
        ("max_iterations", "0"),
    ] {
        let file = dir.path(&format!("{key}.yaml"));
        std::fs::write(
            &file,
            format!("name: b\nscript: [{{text: hi}}]\nlimits:\n  {key}: {value}\n"),
        )
        .unwrap();
        let f = file.display().to_string();
        for cmd in ["run", "swarm"] {
            let out = agentvisor(&["--db", ":memory:", cmd, &f]);
            refused(&out, key);
            refused(&out, "line 4");
        }
    }
}

#[test]
fn a_huge_or_deeply_nested_manifest_exits_2() {
    let dir = Scratch::new("cli-bounds-shape");
    let big = dir.path("big.yaml");
    let mut text = String::from("name: big\nscript: [{text: hi}]\nsystem: \"");
    text.push_str(&"x".repeat(2 << 20));
    text.push_str("\"\n");
    std::fs::write(&big, text).unwrap();
    let out = agentvisor(&["--db", ":memory:", "run", &big.display().to_string()]);
    refused(&out, "1 MiB");
    let deep = dir.path("deep.yaml");
    std::fs::write(
        &deep,
        format!(
            "name: d\nscript: [{{text: hi}}]\ndescription: {}\n",
            "[".repeat(200_000)
        ),
    )
    .unwrap();
    let out = agentvisor(&["--db", ":memory:", "run", &deep.display().to_string()]);
    refused(&out, "64 levels");
}

#[test]
fn numeric_flags_out_of_range_exit_2_naming_the_flag() {
    let hello = "examples/agents/hello.yaml";
    for (flag, value) in [
        ("--runs", "99999999999999999999"),
        ("--runs", "18446744073709551615"),
        ("--runs", "0"),
        ("--concurrency", "0"),
        ("--concurrency", "-1"),
        ("--concurrency", "99999999999"),
    ] {
        let out = agentvisor(&["--db", ":memory:", "swarm", hello, flag, value]);
        refused(&out, flag);
    }
    let out = agentvisor(&["--db", ":memory:", "run", hello, "--budget-tokens", "-5"]);
    refused(&out, "--budget-tokens");
}
