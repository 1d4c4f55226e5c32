//! MCP servers over stdio, against the in-repo test server
//! (`examples/mcp_test_server.rs`, built by `cargo test`). Real processes,
//! so real time: every wait is bounded and polls for a state, never sleeps
//! for a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentvisor::mcp::McpConfig;
use agentvisor::ports::audit::RunIndex;
use agentvisor::{Agent, Host, HostConfig, Invocation, RunEvent, RunHandle, RunResult, RunStatus};
use support::{collect, kinds, spec};

/// The test server's path: `target/<profile>/examples/mcp_test_server`,
/// beside this test's `deps/` directory.
fn server() -> String {
    let exe = std::env::current_exe().expect("test exe");
    let dir: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("examples")
        .join("mcp_test_server");
    assert!(
        dir.exists(),
        "build the test server first: {}",
        dir.display()
    );
    dir.display().to_string()
}

fn config(mcp: McpConfig) -> HostConfig {
    HostConfig {
        critic_shards: 2,
        mcp,
        ..HostConfig::default()
    }
}

async fn host_with(mcp: McpConfig) -> Host {
    Host::builder()
        .config(config(mcp))
        .build()
        .await
        .expect("host")
}

/// A manifest whose server `t` is the test server (with `flags`), whose
/// script is `script`, with `extra` YAML (limits) appended.
fn manifest(flags: &str, server_extra: &str, script: &str, extra: &str) -> String {
    let flags: Vec<String> = flags.split_whitespace().map(|f| format!("{f:?}")).collect();
    let mut cmd = vec![format!("{:?}", server())];
    cmd.extend(flags);
    format!(
        "name: mcp-test\nmcp:\n  servers:\n    - {{ name: t, command: [{}]{server_extra} }}\nscript:\n{script}{extra}",
        cmd.join(", ")
    )
}

async fn run(host: &Host, yaml: &str) -> (RunResult, Vec<RunEvent>) {
    let (handle, events) = host
        .submit_streaming(spec(yaml), Invocation::default())
        .await
        .expect("submit");
    let events = collect(events).await;
    (handle.await, events)
}

/// A manifest whose first call hangs in the test server, which writes to
/// `marker` when the call is cancelled.
fn hanging(marker: &Path, extra: &str) -> String {
    manifest(
        "",
        "",
        &format!(
            "  - {{ tool: t__hang, args: {{ marker: {:?} }} }}\n  - {{ text: done }}\n",
            marker.display().to_string()
        ),
        extra,
    )
}

/// Waits (5 s at most) until the test server says, through `marker`, that
/// it heard `notifications/cancelled`.
async fn hears_cancelled(marker: &Path) {
    says(marker, "cancelled").await;
}

/// Waits (5 s at most) until the test server has written `line` to
/// `marker` (`started` when a `hang` call reached it).
async fn says(marker: &Path, line: &str) {
    let t0 = Instant::now();
    while !std::fs::read_to_string(marker).is_ok_and(|t| t.lines().any(|l| l == line)) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no {line} in {marker:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Submits `n` runs of `agent` at once.
async fn submit_n(host: &Host, agent: &Agent, n: usize) -> Vec<RunHandle> {
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(
            host.submit(agent, Invocation::default())
                .await
                .expect("submit"),
        );
    }
    handles
}

fn alive(pid: i32) -> bool {
    // A zombie (exited, not yet reaped by its new parent) counts as dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn gone_within(pid: i32, limit: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !alive(pid)
}

fn pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Runs `t__pid` once on the test server started with `flags` (which
/// include `--grandchild`): the pids it reports, the server's and its
/// child's.
async fn server_and_grandchild(host: &Host, flags: &str) -> Vec<i32> {
    let yaml = manifest(
        flags,
        "",
        "  - { tool: t__pid, args: {} }\n  - { text: done }\n",
        "",
    );
    let (r, _) = run(host, &yaml).await;
    let p = pids(&r.steps[0].result);
    assert_eq!(p.len(), 2, "{r:?}");
    p
}

/// Each of `pids` is gone within 5 s (the host that started them has
/// stopped).
async fn none_outlives_the_host(pids: Vec<i32>) {
    for pid in pids {
        assert!(
            gone_within(pid, Duration::from_secs(5)).await,
            "{pid} outlived the host"
        );
    }
}

#[tokio::test]
async fn tools_are_named_for_their_server_and_answer_through_a_run() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        "",
        "  - { tool: t__echo, args: { text: hello } }\n  - { tool: t__add, args: { a: 2, b: 3 } }\n  - { text: done }\n",
        "",
    );
    let agent = host.prepare(spec(&yaml)).await.expect("prepare");
    let names: Vec<String> = agent
        .tools()
        .specs()
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert!(
        names.contains(&"t__echo".to_string()) && names.contains(&"t__add".to_string()),
        "{names:?}"
    );
    let (r, events) = run(&host, &yaml).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.steps[0].result, "hello");
    assert_eq!(r.steps[1].result, "5");
    let k = kinds(&events);
    assert_eq!(
        k.iter().filter(|k| *k == "mcp.tool.call.ok").count(),
        2,
        "{k:?}"
    );
    // Events carry no arguments or results.
    for e in &events {
        if let RunEvent::McpToolCallOk { tool, .. } = e {
            assert!(tool.starts_with("t__"));
        }
    }
    host.shutdown().await;
}

#[tokio::test]
async fn schemas_are_checked_before_the_server_is_called() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        "",
        "  - { tool: t__add, args: { a: two, b: 3 } }\n  - { text: done }\n",
        "",
    );
    let (r, events) = run(&host, &yaml).await;
    assert!(!r.steps[0].ok);
    let err = r.steps[0].error.clone().unwrap_or_default();
    assert!(err.starts_with("invalid_arguments"), "{err}");
    assert!(!kinds(&events)
        .iter()
        .any(|k| k.starts_with("mcp.tool.call")));
    host.shutdown().await;
}

#[tokio::test]
async fn allow_limits_the_tools_and_an_unknown_allowed_name_is_invalid() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest("", ", allow: [echo]", "  - { text: done }\n", "");
    let agent = host.prepare(spec(&yaml)).await.expect("prepare");
    let names: Vec<String> = agent
        .tools()
        .specs()
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(names, ["t__echo"]);
    let yaml = manifest("", ", allow: [echo, nope]", "  - { text: done }\n", "");
    let (r, _) = run(&host, &yaml).await;
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(
        r.error_kind.as_deref(),
        Some("mcp_tool_invalid_name"),
        "{r:?}"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_fails_the_run_with_its_stderr() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest("--fail-start", "", "  - { text: done }\n", "");
    let (r, _) = run(&host, &yaml).await;
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("mcp_server_start_failed"));
    let err = r.error.unwrap_or_default();
    assert!(err.contains("bad configuration"), "{err}");
    let missing = "name: m\nmcp:\n  servers:\n    - { name: t, command: [/nonexistent/server] }\nscript:\n  - { text: done }\n";
    let (r, _) = run(&host, missing).await;
    assert_eq!(r.error_kind.as_deref(), Some("mcp_server_start_failed"));
    host.shutdown().await;
}

/// A server that closes its pipes first and says why only as it exits: the
/// failed `initialize` (a broken pipe, at once) is not the end of the
/// story, its last words on stderr are still in the error.
#[tokio::test]
async fn a_start_failure_waits_for_the_servers_last_words() {
    let host = host_with(McpConfig::default()).await;
    let script =
        "exec </dev/null >/dev/null; sleep 0.3; echo 'bad configuration, said late' >&2; exit 2";
    let yaml = format!(
        "name: late\nmcp:\n  servers:\n    - {{ name: t, command: [sh, -c, {script:?}] }}\nscript:\n  - {{ text: done }}\n"
    );
    let (r, _) = run(&host, &yaml).await;
    assert_eq!(r.error_kind.as_deref(), Some("mcp_server_start_failed"));
    let err = r.error.unwrap_or_default();
    assert!(err.contains("said late"), "{err}");
    host.shutdown().await;
}

#[tokio::test]
async fn results_map_errors_media_and_size() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        "",
        "  - { tool: t__fail, args: { message: no such city } }\n  - { tool: t__image, args: {} }\n  - { tool: t__huge, args: { bytes: 100000 } }\n  - { text: done }\n",
        "limits: { max_tool_result_bytes: 4096 }\n",
    );
    let (r, _) = run(&host, &yaml).await;
    assert_eq!(
        r.status,
        RunStatus::Ok,
        "an isError result is not fatal: {r:?}"
    );
    assert!(!r.steps[0].ok);
    assert!(r.steps[0]
        .error
        .clone()
        .unwrap_or_default()
        .contains("no such city"));
    assert!(r.steps[1].ok);
    assert!(
        r.steps[1].result.contains("[image, image/png, "),
        "{}",
        r.steps[1].result
    );
    assert!(r.steps[2].ok);
    host.shutdown().await;
}

#[tokio::test]
async fn an_answer_over_the_size_cap_fails_its_call_at_once() {
    // The default cap (16 MiB) against a 17 MiB answer, under a minute's
    // tool_timeout: the call fails as soon as the cap is passed.
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        "",
        &format!(
            "  - {{ tool: t__huge, args: {{ bytes: {} }} }}\n  - {{ tool: t__echo, args: {{ text: still here }} }}\n  - {{ text: done }}\n",
            17 << 20
        ),
        "limits: { tool_timeout: 60s, max_runtime: 120s, stall_timeout: 90s }\n",
    );
    let t0 = Instant::now();
    let (r, events) = run(&host, &yaml).await;
    let took = t0.elapsed();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let err = r.steps[0].error.clone().unwrap_or_default();
    assert!(err.starts_with("mcp_result_too_large"), "{err}");
    assert!(err.contains("16777216 bytes"), "{err}");
    assert!(took < Duration::from_secs(30), "the call waited: {took:?}");
    let failed: Vec<&RunEvent> = events
        .iter()
        .filter(|e| matches!(e, RunEvent::McpToolCallFail { .. }))
        .collect();
    assert!(
        matches!(failed.first(), Some(RunEvent::McpToolCallFail { error_kind, .. }) if error_kind == "mcp_result_too_large"),
        "{failed:?}"
    );
    // The connection is still good: the next call is answered.
    assert!(r.steps[1].ok, "{:?}", r.steps[1]);
    assert_eq!(r.steps[1].result, "still here");
    host.shutdown().await;
}

#[tokio::test]
async fn a_timeout_is_mcp_tool_timeout_and_the_server_hears_cancelled() {
    let dir = std::env::temp_dir().join(format!("mcp-timeout-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let host = host_with(McpConfig::default()).await;
    let yaml = hanging(&dir, "limits: { tool_timeout: 1s }\n");
    let (r, events) = run(&host, &yaml).await;
    let err = r.steps[0].error.clone().unwrap_or_default();
    assert!(err.starts_with("mcp_tool_timeout"), "{err}");
    assert!(kinds(&events).contains(&"mcp.tool.call.timeout".to_string()));
    hears_cancelled(&dir).await;
    let _ = std::fs::remove_file(&dir);
    host.shutdown().await;
}

#[tokio::test]
async fn a_killed_run_sends_cancelled_for_its_call() {
    let dir = std::env::temp_dir().join(format!("mcp-kill-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let host = host_with(McpConfig::default()).await;
    let yaml = hanging(&dir, "limits: { tool_timeout: 60s, kill_grace: 1s }\n");
    let (handle, mut events) = host
        .submit_streaming(spec(&yaml), Invocation::default())
        .await
        .expect("submit");
    while let Some(e) = events.next().await {
        if matches!(e.event, RunEvent::ToolCall { .. }) {
            break;
        }
    }
    // The call has reached the server: a kill now must cancel it there.
    says(&dir, "started").await;
    handle.kill();
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Killed);
    hears_cancelled(&dir).await;
    let _ = std::fs::remove_file(&dir);
    host.shutdown().await;
}

#[tokio::test]
async fn a_crash_fails_the_call_and_the_server_restarts_with_its_stderr_tail() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        "",
        "  - { tool: t__flood, args: { kib: 64 } }\n  - { tool: t__crash, args: {} }\n  - { tool: t__echo, args: { text: back } }\n  - { text: done }\n",
        "",
    );
    let (r, events) = run(&host, &yaml).await;
    assert!(r.steps[0].ok);
    let err = r.steps[1].error.clone().unwrap_or_default();
    assert!(err.starts_with("mcp_server_crashed"), "{err}");
    assert_eq!(
        r.steps[2].result, "back",
        "the restarted server answers: {r:?}"
    );
    let exit = events.iter().find_map(|e| match e {
        RunEvent::McpServerExit {
            code, stderr_tail, ..
        } => Some((*code, stderr_tail.clone())),
        _ => None,
    });
    let Some((code, tail)) = exit else {
        panic!("no mcp.server.exit in {:?}", kinds(&events))
    };
    assert_eq!(code, Some(3));
    assert!(tail.len() <= 1024, "{}", tail.len());
    assert!(tail.contains("crashing on purpose"), "{tail}");
    assert!(kinds(&events).contains(&"mcp.server.restart".to_string()));
    host.shutdown().await;
}

#[tokio::test]
async fn a_crash_loop_cools_down() {
    let host = host_with(McpConfig {
        max_restarts: 2,
        backoff: Duration::from_millis(10),
        ..McpConfig::default()
    })
    .await;
    // Distinct arguments: the critic would stop a run that repeats a call.
    let crashes: String = (3..7)
        .map(|c| format!("  - {{ tool: t__crash, args: {{ code: {c} }} }}\n"))
        .collect();
    let yaml = manifest(
        "",
        "",
        &format!("{crashes}  - {{ tool: t__echo, args: {{ text: x }} }}\n  - {{ text: done }}\n"),
        "limits: { max_tool_errors: 10 }\n",
    );
    let (r, _) = run(&host, &yaml).await;
    let last = r.steps.last().expect("steps");
    let err = last.error.clone().unwrap_or_default();
    assert!(
        err.starts_with("mcp_server_crashed") && err.contains("cooling down"),
        "{r:?}"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn progress_is_a_heartbeat_and_silence_is_a_stall() {
    let host = host_with(McpConfig::default()).await;
    let limits = "limits: { stall_timeout: 1s, tool_timeout: 30s }\n";
    let yaml = manifest(
        "",
        "",
        "  - { tool: t__progress, args: { steps: 12, interval_ms: 250 } }\n  - { text: done }\n",
        limits,
    );
    let (r, _) = run(&host, &yaml).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let yaml = manifest(
        "",
        "",
        "  - { tool: t__slow, args: { ms: 3000 } }\n  - { text: done }\n",
        limits,
    );
    let (r, _) = run(&host, &yaml).await;
    assert_eq!(r.status, RunStatus::Killed, "{r:?}");
    assert_eq!(
        r.kill_reason.map(|k| k.as_str().to_string()).as_deref(),
        Some("stalled")
    );
    host.shutdown().await;
}

#[tokio::test]
async fn one_server_serves_200_concurrent_runs() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        "",
        "  - { tool: t__pid, args: {} }\n  - { text: done }\n",
        "",
    );
    let agent = host.prepare(spec(&yaml)).await.expect("prepare");
    let handles = submit_n(&host, &agent, 200).await;
    let mut seen = std::collections::HashSet::new();
    for h in handles {
        let r = h.await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        seen.insert(r.steps[0].result.clone());
    }
    assert_eq!(seen.len(), 1, "one server process: {seen:?}");
    host.shutdown().await;
}

#[tokio::test]
async fn the_environment_is_allowlisted_and_secrets_come_by_reference() {
    // Names unique to this test: the process environment is shared.
    std::env::set_var("MCP_TEST_HOST_ONLY", "leaked");
    std::env::set_var("AGENTVISOR_SECRET_MCP_TEST_TOKEN", "s3cret-value");
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        ", env: { GREETING: hi, TOKEN: { secret: MCP_TEST_TOKEN } }",
        "  - { tool: t__env, args: { name: MCP_TEST_HOST_ONLY } }\n  - { tool: t__env, args: { name: GREETING } }\n  - { tool: t__env, args: { name: TOKEN } }\n  - { tool: t__env, args: { name: PATH } }\n  - { text: done }\n",
        "",
    );
    let (r, _) = run(&host, &yaml).await;
    assert_eq!(r.steps[0].result, "<unset>");
    assert_eq!(r.steps[1].result, "hi");
    // The server got the secret; what comes back of it is redacted.
    assert_eq!(r.steps[2].result, "[REDACTED]");
    assert_ne!(r.steps[3].result, "<unset>");
    let yaml = manifest(
        "",
        ", env: { TOKEN: { secret: MCP_TEST_MISSING } }",
        "  - { text: done }\n",
        "",
    );
    let (r, _) = run(&host, &yaml).await;
    assert_eq!(r.error_kind.as_deref(), Some("mcp_env_resolve"));
    assert!(r
        .error
        .unwrap_or_default()
        .contains("AGENTVISOR_SECRET_MCP_TEST_MISSING"));
    host.shutdown().await;
}

#[tokio::test]
async fn list_changed_refreshes_the_tools_of_later_runs() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        "",
        "  - { tool: t__add_tool, args: {} }\n  - { text: done }\n",
        "",
    );
    let (r, _) = run(&host, &yaml).await;
    assert!(r.steps[0].ok);
    let t0 = Instant::now();
    loop {
        let agent = host.prepare(spec(&yaml)).await.expect("prepare");
        if agent.tools().contains("t__extra") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the list did not refresh"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    host.shutdown().await;
}

#[tokio::test]
async fn shutdown_kills_a_server_that_ignores_sigterm_and_its_children() {
    let host = host_with(McpConfig {
        term_grace: Duration::from_millis(300),
        ..McpConfig::default()
    })
    .await;
    let p = server_and_grandchild(&host, "--ignore-sigterm --grandchild").await;
    assert!(alive(p[0]) && alive(p[1]));
    host.shutdown().await;
    none_outlives_the_host(p).await;
}

#[tokio::test]
async fn no_orphan_after_the_host_is_dropped() {
    let host = host_with(McpConfig::default()).await;
    let p = server_and_grandchild(&host, "--grandchild").await;
    drop(host);
    none_outlives_the_host(p).await;
}

/// A host process (the test server's `--parent` mode) whose server starts
/// a grandchild (`--grandchild`, a `sleep`) is SIGKILLed: the server and
/// the grandchild both end with it. The parent-death signal reaches the
/// server alone; its group is killed whole only because the host forks
/// each server under a guard that outlives the host to do it.
#[tokio::test]
async fn nothing_a_server_started_outlives_a_sigkilled_host() {
    use tokio::io::AsyncBufReadExt;
    let mut parent = tokio::process::Command::new(server())
        .args(["--parent", "--grandchild"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("parent");
    let out = parent.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(out).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the parent reports")
        .expect("read")
        .expect("a line");
    let p = pids(&line);
    assert_eq!(p.len(), 2, "the server and its grandchild: {line}");
    assert!(alive(p[0]) && alive(p[1]));
    parent.start_kill().expect("SIGKILL");
    let _ = parent.wait().await;
    let mut survivors = Vec::new();
    for pid in p {
        if !gone_within(pid, Duration::from_secs(5)).await {
            survivors.push(pid);
        }
    }
    // Whatever failed the test is not left running for an hour.
    for pid in &survivors {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(survivors.is_empty(), "{survivors:?} outlived the host");
}

#[tokio::test]
async fn scope_run_gives_each_run_its_own_server_stopped_with_it() {
    let host = host_with(McpConfig::default()).await;
    let yaml = manifest(
        "",
        ", scope: run",
        "  - { tool: t__pid, args: {} }\n  - { tool: t__pid, args: {} }\n  - { text: done }\n",
        "",
    );
    let agent = host.prepare(spec(&yaml)).await.expect("prepare");
    assert!(agent.tools().contains("t__pid"));
    let handles = submit_n(&host, &agent, 3).await;
    let mut seen = std::collections::HashSet::new();
    for h in handles {
        let r = h.await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        assert_eq!(r.steps[0].result, r.steps[1].result, "one server per run");
        let pid = pids(&r.steps[0].result)[0];
        assert!(
            gone_within(pid, Duration::from_secs(10)).await,
            "{pid} outlived its run"
        );
        seen.insert(pid);
    }
    assert_eq!(seen.len(), 3, "a server per run: {seen:?}");
    host.shutdown().await;
}

#[tokio::test]
async fn list_tools_shows_what_the_model_sees_and_stops_the_servers() {
    let yaml = manifest("", ", allow: [echo, pid]", "  - { text: done }\n", "");
    let servers = spec(&yaml).mcp.expect("mcp").servers;
    let listed = agentvisor::host::list_mcp_tools(&servers, McpConfig::default())
        .await
        .expect("listed");
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["t__echo", "t__pid"]);
    assert_eq!(listed[0].parameters["required"][0], "text");
    // Effect classes from the server's annotations: `echo` says it is
    // read-only, `pid` says nothing.
    use agentvisor::ports::tool::ToolEffect;
    assert_eq!(listed[0].effects, ToolEffect::Read);
    assert_eq!(listed[1].effects, ToolEffect::Unknown);
    let bad = manifest("--fail-start", "", "  - { text: done }\n", "");
    let servers = spec(&bad).mcp.expect("mcp").servers;
    let err = agentvisor::host::list_mcp_tools(&servers, McpConfig::default()).await;
    assert_eq!(
        err.map(|_| ()).map_err(|e| e.kind()),
        Err("mcp_server_start_failed")
    );
}

/// A sub-agent's MCP servers are its parent's that it names too: the same
/// process (a `scope: host` server is shared), the tools both `allow`
/// lists let through, and nothing of a server the parent does not have.
#[tokio::test]
async fn a_sub_agent_shares_its_parents_servers_and_gets_no_other() {
    let scratch = support::scratch::Scratch::new("mcp-palette");
    let d = scratch.0.clone();
    let server = format!("{:?}", server());
    // The child names `t` (no `allow`: whatever its parent may use of it)
    // and `u`, which its parent does not have.
    let child = d.join("helper.yaml");
    std::fs::write(
        &child,
        format!(
            "name: helper\nmcp:\n  servers:\n    - {{ name: t, command: [{server}] }}\n    - {{ name: u, command: [{server}] }}\nscript:\n  - tools:\n      - {{ tool: t__pid, args: {{}} }}\n      - {{ tool: t__add, args: {{ a: 1, b: 2 }} }}\n      - {{ tool: u__echo, args: {{ text: x }} }}\n  - {{ text: child done }}\n"
        ),
    )
    .unwrap();
    let parent = d.join("parent.yaml");
    std::fs::write(
        &parent,
        format!(
            "name: parent\nmcp:\n  servers:\n    - {{ name: t, command: [{server}], allow: [echo, pid] }}\nagents:\n  helper: {}\nscript:\n  - {{ tool: t__pid, args: {{}} }}\n  - {{ tool: agent__helper, args: {{ prompt: go }} }}\n  - {{ text: done }}\n",
            child.display()
        ),
    )
    .unwrap();
    let store = Arc::new(agentvisor::stores::MemoryAuditStore::new());
    let host = Host::builder()
        .config(config(McpConfig::default()))
        .audit_store(store.clone())
        .build()
        .await
        .expect("host");
    let r = host
        .execute(
            agentvisor::AgentSpec::from_file(&parent).unwrap(),
            Invocation::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.steps[1].ok, "{:?}", r.steps[1]);
    let parent_pid = pids(&r.steps[0].result);
    host.shutdown().await;
    let child_id = store
        .list_runs(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.agent == "helper")
        .expect("the child ran")
        .run_id;
    let c = store.run_result(child_id).await.unwrap().unwrap();
    assert_eq!(c.status, RunStatus::Ok, "{c:?}");
    let step = |tool: &str| {
        c.steps
            .iter()
            .find(|s| &*s.tool == tool)
            .unwrap_or_else(|| panic!("no {tool} step: {:?}", c.steps))
    };
    // The parent's server, the very process.
    assert!(step("t__pid").ok);
    assert_eq!(pids(&step("t__pid").result), parent_pid);
    // `add` is the server's, but the parent's `allow` leaves it out.
    assert!(!step("t__add").ok);
    assert!(step("t__add")
        .error
        .as_deref()
        .unwrap_or_default()
        .contains("unknown"));
    // `u` is not the parent's: not started, its tools not offered.
    assert!(!step("u__echo").ok);
    assert!(step("u__echo")
        .error
        .as_deref()
        .unwrap_or_default()
        .contains("unknown"));
}

#[tokio::test]
async fn tool_choice_names_a_server_tool_that_is_not_in_tools() {
    // `tool_choice` names a tool of the server only: the agent sees it,
    // so it is prepared and runs; `required` counts the server's tools.
    let host = host_with(McpConfig::default()).await;
    for choice in ["t__echo", "required"] {
        let yaml = manifest(
            "",
            "",
            "  - { tool: t__echo, args: { text: hello } }\n  - { text: done }\n",
            &format!("tool_choice: {choice}\n"),
        );
        host.prepare(spec(&yaml))
            .await
            .unwrap_or_else(|e| panic!("{choice}: {e}"));
        let (r, _) = run(&host, &yaml).await;
        assert_eq!(r.status, RunStatus::Ok, "{choice}: {r:?}");
    }
    // A name the server does not have is refused once its tools are known.
    let yaml = manifest("", "", "  - { text: done }\n", "tool_choice: t__nope\n");
    let e = host.prepare(spec(&yaml)).await.expect_err("refused");
    let e = e.to_string();
    assert!(e.contains("`t__nope`") && e.contains("t__echo"), "{e}");
    host.shutdown().await;
}
