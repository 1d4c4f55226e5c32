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

/// Runs the binary with `args` (stdin empty), which must end within a
/// minute: a flag value that is wrongly accepted would start the command
/// (a server, a soak) rather than exit 2.
fn bounded(args: &[&str]) -> Output {
    let mut child = support::cli::command(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("AGENTVISOR_URL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{args:?} was accepted: it still runs after a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Every numeric flag of every command, as `(arguments before the flag,
/// the flag)`; the value goes last.
const NUMERIC_FLAGS: &[(&[&str], &str)] = &[
    (
        &["--db", ":memory:", "run", "examples/agents/hello.yaml"],
        "--budget-tokens",
    ),
    (
        &["--db", ":memory:", "run", "examples/agents/hello.yaml"],
        "--drain",
    ),
    (
        &["--db", ":memory:", "run", "examples/agents/hello.yaml"],
        "--lease-ttl",
    ),
    (
        &["--db", ":memory:", "swarm", "examples/agents/hello.yaml"],
        "--runs",
    ),
    (
        &["--db", ":memory:", "swarm", "examples/agents/hello.yaml"],
        "--concurrency",
    ),
    (
        &["--db", ":memory:", "swarm", "examples/agents/hello.yaml"],
        "--budget-tokens",
    ),
    (
        &["--db", ":memory:", "swarm", "examples/agents/hello.yaml"],
        "--drain",
    ),
    (
        &["--db", ":memory:", "soak", "examples/agents/hello.yaml"],
        "--duration",
    ),
    (
        &["--db", ":memory:", "soak", "examples/agents/hello.yaml"],
        "--concurrency",
    ),
    (
        &["--db", ":memory:", "soak", "examples/agents/hello.yaml"],
        "--chaos",
    ),
    (
        &["--db", ":memory:", "soak", "examples/agents/hello.yaml"],
        "--seed",
    ),
    (
        &["--db", ":memory:", "serve", "--addr", "127.0.0.1:0"],
        "--rate-limit",
    ),
    (
        &["--db", ":memory:", "serve", "--addr", "127.0.0.1:0"],
        "--max-subscribers",
    ),
    (
        &["--db", ":memory:", "serve", "--addr", "127.0.0.1:0"],
        "--drain",
    ),
    (
        &["--db", ":memory:", "chat", "examples/agents/hello.yaml"],
        "--budget-tokens",
    ),
    (&["--db", ":memory:", "runs", "list"], "--limit"),
    (&["--db", ":memory:", "sessions", "list"], "--limit"),
    (&["--db", ":memory:", "budget", "set", "alice"], "--tokens"),
    (
        &["--db", ":memory:", "budget", "set", "alice"],
        "--cost-micros",
    ),
    (&["--db", ":memory:", "budget", "set", "alice"], "--runtime"),
    (
        &["--db", ":memory:", "budget", "set", "alice"],
        "--concurrent",
    ),
    (&["--db", ":memory:", "budget", "set", "alice"], "--window"),
];

#[test]
fn odd_numbers_in_every_numeric_flag_exit_2_naming_the_flag_and_its_range() {
    let odd = [
        "nan",
        "NaN",
        "inf",
        "-inf",
        "1e300",
        "-1",
        "-0.5",
        "1e-300",
        "99999999999999999999999",
        "",
    ];
    for (before, flag) in NUMERIC_FLAGS {
        for value in odd {
            // A chaos rate of 1e-300 is a rate from 0 to 1.
            if *flag == "--chaos" && value == "1e-300" {
                continue;
            }
            let mut args = before.to_vec();
            args.extend([*flag, value]);
            let out = bounded(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(stderr.contains(flag), "{args:?}: {stderr}");
            assert!(
                stderr.contains(" to ") || stderr.contains("more than 0"),
                "{args:?} does not name the range: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        }
    }
    // `runs extend`'s duration is checked before any server is called.
    for value in ["nan", "inf", "1e300", "-1", "0", "25h"] {
        let args = [
            "runs",
            "extend",
            "0123456789abcdef0123456789abcdef",
            value,
            "--server",
            "http://127.0.0.1:9",
        ];
        let out = bounded(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("at most 24h"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_db_url_of_a_scheme_this_build_does_not_store_in_exits_2_creating_nothing() {
    let dir = Scratch::new("cli-bounds-db-url");
    let cwd = dir.path("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let hello = format!("{}/examples/agents/hello.yaml", env!("CARGO_MANIFEST_DIR"));
    let mut urls = vec!["mysql://root@db/agentvisor", "nats://localhost:4222"];
    // A build with the `postgres` feature takes these (`cli_postgres`);
    // one without refuses them, naming the feature.
    if cfg!(not(feature = "postgres")) {
        urls.extend([
            "postgres://agent:s3cret@localhost:5432/agentvisor",
            "postgresql://localhost/agentvisor",
        ]);
    }
    for url in urls {
        for args in [
            vec!["--db", url, "run", &hello],
            vec!["--db", url, "runs", "list"],
            vec!["--db", url, "sessions", "list"],
            vec!["--db", url, "budget", "show"],
            vec!["--db", url, "recover"],
            vec!["--db", url, "serve", "--addr", "127.0.0.1:0"],
        ] {
            let out = support::cli::command(&args)
                .current_dir(&cwd)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            let scheme = url.split("://").next().unwrap();
            assert!(
                stderr.contains(&format!("`{scheme}://`")),
                "{args:?}: {stderr}"
            );
            assert!(
                !stderr.contains("s3cret"),
                "the password is printed: {stderr}"
            );
            if scheme.starts_with("postgres") {
                assert!(stderr.contains("`postgres` feature"), "{stderr}");
            }
            let made: Vec<_> = std::fs::read_dir(&cwd).unwrap().collect();
            assert!(made.is_empty(), "{args:?} created {made:?}");
        }
        // From the environment too.
        let out = support::cli::command(&["runs", "list"])
            .env("AGENTVISOR_DB", url)
            .current_dir(&cwd)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(std::fs::read_dir(&cwd).unwrap().next().is_none());
    }
    // `sqlite://PATH` is the SQLite file at PATH.
    let db = dir.path("via-url.db");
    let url = format!("sqlite://{}", db.display());
    let out = support::cli::command(&["--db", &url, "run", &hello])
        .current_dir(&cwd)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(db.exists());
    assert!(std::fs::read_dir(&cwd).unwrap().next().is_none());
}
