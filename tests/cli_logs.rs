#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The log lines of the real binary: no colour codes when stderr is not a
//! terminal, and in a `swarm` a warning every run gives (`usage_estimated`
//! from a server that reports no usage, `unknown_price` for a model the
//! price table lacks) is printed once, with a count of the other runs at
//! the end. The server is the loopback fake of a llama.cpp-like server
//! (`provider_wire::vendor`), which reports no usage in streams.

mod provider_wire;

use provider_wire::vendor::{serve_vendor, Pace};

async fn swarm(manifest: &std::path::Path, runs: u32) -> std::process::Output {
    let manifest = manifest.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_agentvisor"));
        c.args([
            "swarm",
            manifest.to_str().unwrap(),
            "--runs",
            &runs.to_string(),
            "--concurrency",
            "3",
            "--db",
            ":memory:",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
        for k in [
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            "AGENTVISOR_DB",
            "AGENTVISOR_TIERS",
            "AGENTVISOR_LOG",
            "NO_COLOR",
        ] {
            c.env_remove(k);
        }
        c.output().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swarm_prints_each_runs_warning_once_with_a_count_and_no_colour_codes() {
    let server = serve_vendor(Pace::quick()).await;
    let dir = std::env::temp_dir().join(format!("agentvisor-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = dir.join("hello.yaml");
    std::fs::write(
        &manifest,
        format!(
            "name: hello\nmodel: openai:local\nbase_url: {}\nprompt: Say hello.\n",
            server.base_url
        ),
    )
    .unwrap();
    let out = swarm(&manifest, 12).await;
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains('\u{1b}'), "colour codes on a pipe: {err:?}");
    for kind in ["usage_estimated", "unknown_price"] {
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(kind)).collect();
        assert_eq!(lines.len(), 2, "{kind}: once, then the count: {err}");
        assert!(lines[0].contains("WARN"), "{err}");
        assert!(
            lines[1].starts_with("warning: 11 more run(s) gave the warning shown once above"),
            "{err}"
        );
    }
}
