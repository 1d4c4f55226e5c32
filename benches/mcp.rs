//! MCP tool calls through agentvisor against a bare rmcp client, on the
//! in-repo test server over stdio.
//!
//! Run with: `cargo bench --bench mcp` (settings: `-- --runs 2000
//! --concurrency 64 --calls 10`).
//!
//! Settings (defaults): `runs` = 2000 runs of a scripted agent whose every
//! model turn calls `t__echo` (`calls` = 10 turns, distinct arguments, then
//! an answer), `concurrency` = 64 runs in flight at once, all sharing one
//! `scope: host` server. The baseline is one rmcp client on its own server
//! process (the same binary), `concurrency` tasks each making `runs ×
//! calls / concurrency` `tools/call` requests in a row. Both sides call the
//! same tool with the same arguments; the server is this bench binary
//! itself (`--serve`, the code of `examples/mcp_test_server.rs`).
//!
//! Printed: calls/s through agentvisor (each call validated against the
//! tool's schema, timed, recorded as steps and events, audited, under the
//! critic), calls/s of the bare client, and the ratio agentvisor / bare
//! (the target: ≥ 0.7).
//!
//! `harness = false`: a plain binary that measures both sides in the same
//! run and prints their ratio.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs, dead_code)]

#[path = "../examples/mcp_test_server.rs"]
mod test_server;

use std::sync::Arc;
use std::time::Instant;

use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunStatus};
use rmcp::model::CallToolRequestParams;
use rmcp::ServiceExt;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if std::env::args().any(|a| a == "--serve") {
        return test_server::main();
    }
    let runs = arg("--runs", 2000);
    let concurrency = arg("--concurrency", 64).max(1);
    let calls = arg("--calls", 10).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench(runs, concurrency, calls));
}

async fn bench(runs: usize, concurrency: usize, calls: usize) {
    let me = std::env::current_exe().expect("exe").display().to_string();
    let total = runs * calls;
    println!("mcp bench: {runs} runs × {calls} calls, {concurrency} concurrent, stdio test server");

    // agentvisor: runs of a scripted agent, `concurrency` in flight.
    let script: String = (0..calls)
        .map(|i| format!("  - {{ tool: t__echo, args: {{ text: \"call {i}\" }} }}\n"))
        .collect();
    let yaml = format!(
        "name: mcp-bench\nmcp:\n  servers:\n    - {{ name: t, command: [{me:?}, --serve] }}\n\
         limits: {{ max_iterations: {} }}\nscript:\n{script}  - {{ text: done }}\n",
        calls + 1
    );
    let spec = AgentSpec::from_yaml(&yaml).expect("manifest");
    let host = Host::builder()
        .config(HostConfig::default())
        .build()
        .await
        .expect("host");
    let agent = host.prepare(spec).await.expect("prepare");
    // Warm up: one run.
    let r = host
        .execute(&agent, Invocation::default())
        .await
        .expect("run");
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let t0 = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let host = host.clone();
        let agent = agent.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < runs {
                let r = host
                    .execute(&agent, Invocation::default())
                    .await
                    .expect("run");
                assert_eq!(r.status, RunStatus::Ok, "{r:?}");
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let ours = total as f64 / t0.elapsed().as_secs_f64();
    host.shutdown().await;

    // The bare client: the same calls on a server of its own.
    let mut cmd = tokio::process::Command::new(&me);
    cmd.arg("--serve")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("server");
    let stdout = child.stdout.take().expect("stdout");
    let stdin = child.stdin.take().expect("stdin");
    let client = ().serve((stdout, stdin)).await.expect("client");
    let peer = client.peer().clone();
    let per_task = total / concurrency;
    let t0 = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let peer = peer.clone();
        workers.push(tokio::spawn(async move {
            for i in 0..per_task {
                let mut p = CallToolRequestParams::new("echo");
                let mut args = serde_json::Map::new();
                args.insert("text".into(), format!("call {}", i % calls).into());
                p.arguments = Some(args);
                peer.call_tool(p).await.expect("call");
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let bare = (per_task * concurrency) as f64 / t0.elapsed().as_secs_f64();
    drop(client);
    let _ = child.kill().await;

    println!("agentvisor: {ours:>10.0} calls/s");
    println!("bare rmcp:  {bare:>10.0} calls/s");
    println!("ratio agentvisor / bare: {:.2}", ours / bare);
}
