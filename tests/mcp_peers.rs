//! MCP against real servers (`cargo test --features peers`), which
//! `.ci/run` installs first at pinned versions: PyPI `mcp-server-time` and
//! npm `@modelcontextprotocol/server-everything` (stdio, and its streamable
//! HTTP mode on loopback).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunResult, RunStatus};
use support::spec;

async fn host() -> Host {
    Host::builder()
        .config(HostConfig {
            critic_shards: 2,
            ..HostConfig::default()
        })
        .build()
        .await
        .expect("host")
}

async fn run(host: &Host, spec: AgentSpec) -> RunResult {
    host.execute(spec, Invocation::default())
        .await
        .expect("submit")
}

#[tokio::test]
async fn the_time_example_answers_with_the_time() {
    let host = host();
    let host = host.await;
    let spec = AgentSpec::from_file("examples/agents/time.yaml").expect("manifest");
    let r = run(&host, spec).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let out = r.output.unwrap_or_default();
    assert!(out.contains("datetime") && out.contains("UTC"), "{out}");
    host.shutdown().await;
}

const EVERYTHING: &str = "  - { tool: ev__echo, args: { message: hi there } }\n  - { tool: ev__get-sum, args: { a: 2, b: 3 } }\n  - { tool: ev__get-tiny-image, args: {} }\n  - { tool: ev__trigger-long-running-operation, args: { duration: 3, steps: 6 } }\n  - { text: done }\n";

fn check_everything(r: &RunResult) {
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.steps.iter().all(|s| s.ok), "{r:?}");
    assert!(
        r.steps[0].result.contains("hi there"),
        "{}",
        r.steps[0].result
    );
    assert!(r.steps[1].result.contains('5'), "{}", r.steps[1].result);
    assert!(
        r.steps[2].result.contains("[image"),
        "{}",
        r.steps[2].result
    );
}

#[tokio::test]
async fn server_everything_over_stdio() {
    let host = host().await;
    let yaml = format!(
        "name: ev\nmcp:\n  servers:\n    - {{ name: ev, command: [mcp-server-everything, stdio] }}\n\
         limits: {{ stall_timeout: 2s, tool_timeout: 30s }}\nscript:\n{EVERYTHING}"
    );
    let r = run(&host, spec(&yaml)).await;
    check_everything(&r);
    host.shutdown().await;
}

#[tokio::test]
async fn server_everything_over_streamable_http() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr").port()
    };
    let _server = tokio::process::Command::new("mcp-server-everything")
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mcp-server-everything is installed");
    let t0 = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the server did not listen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let host = host().await;
    let yaml = format!(
        "name: ev\nmcp:\n  servers:\n    - {{ name: ev, url: \"http://127.0.0.1:{port}/mcp\" }}\n\
         limits: {{ stall_timeout: 2s, tool_timeout: 30s }}\nscript:\n{EVERYTHING}"
    );
    let r = run(&host, spec(&yaml)).await;
    check_everything(&r);
    host.shutdown().await;
}
