//! `agentvisor serve` at its edges, as a process: a draining server keeps
//! listening (503s, not refused connections) and streams its runs to their
//! end; a token taken out of the tokens file loses its open streams and
//! every request at the reload; the CLI's `--server` commands stop quietly
//! on a closed stdout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use support::loopback::{QUICK, SLOW};
use support::scratch::Scratch;
use support::serving::Serving;

/// A directory of agents with `quick` and `slow` (a sleep of a minute).
fn agents(dir: &Scratch) -> std::path::PathBuf {
    let agents = dir.path("agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(agents.join("quick.yaml"), QUICK).unwrap();
    std::fs::write(agents.join("slow.yaml"), SLOW).unwrap();
    agents
}

/// `METHOD {base}{path}` as `token` (none: no header): status, headers,
/// JSON body. A refused connection fails the test.
async fn call(
    http: &reqwest::Client,
    method: &str,
    url: String,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut r = http.request(method, &url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = r
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: no answer: {e}"));
    let code = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    (
        code,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// Opens an event stream (`GET {url}`) as `token`.
async fn open_stream(
    http: &reqwest::Client,
    url: String,
    token: Option<&str>,
) -> reqwest::Response {
    let mut r = http.get(&url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let resp = r.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{url}");
    resp
}

/// Reads an event stream to its end, which must come within 30 s (its
/// keep-alives do not extend that); the events' JSON (keep-alive comments
/// left out).
async fn read_to_end(mut resp: reqwest::Response, what: &str) -> Vec<Value> {
    let mut text = String::new();
    let read = async {
        while let Ok(Some(c)) = resp.chunk().await {
            text.push_str(std::str::from_utf8(&c).unwrap());
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .is_err()
    {
        panic!("{what}: the stream is still open after 30 s");
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .collect()
}

fn token_new(caller: &str) -> (String, String) {
    let out = support::cli::agentvisor(&["token", "new", "--caller", caller]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    (
        lines.next().unwrap().to_string(),
        lines.next().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_server_answers_503_and_streams_its_runs_to_their_end() {
    let dir = Scratch::new("serve-edges-drain");
    let agents = agents(&dir);
    let s = Serving::start_draining_for(&dir.path("serve.db"), &agents, "60s", &[]);
    let http = support::loopback::http_client();
    let base = s.base.clone();
    let (code, _, v) = call(
        &http,
        "POST",
        format!("{base}/v1/runs"),
        None,
        Some(json!({"agent": "slow"})),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    let id = v["run_id"].as_str().unwrap().to_string();

    s.signal("TERM");
    // Still listening: readiness turns 503, and no request is refused a
    // connection (`call` fails the test on one).
    let mut ready = 200;
    for _ in 0..3000 {
        let (code, _, v) = call(&http, "GET", format!("{base}/readyz"), None, None).await;
        ready = code;
        if code == 503 {
            assert_eq!(v["status"], "draining");
            break;
        }
        assert_eq!(code, 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ready, 503, "/readyz never answered 503 after SIGTERM");
    let (code, headers, v) = call(
        &http,
        "POST",
        format!("{base}/v1/runs"),
        None,
        Some(json!({"agent": "quick"})),
    )
    .await;
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["error"]["kind"], "shutting_down");
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    // The draining run is read and streamed.
    let (code, _, v) = call(&http, "GET", format!("{base}/v1/runs/{id}"), None, None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "running", "{v}");
    let stream = open_stream(&http, format!("{base}/v1/runs/{id}/events"), None).await;
    let (code, _, v) = call(
        &http,
        "POST",
        format!("{base}/v1/runs/{id}/kill"),
        None,
        None,
    )
    .await;
    assert_eq!(code, 202, "{v}");
    let events = read_to_end(stream, "the draining run's events").await;
    let last = events.last().expect("events");
    assert_eq!(last["type"], "run.end", "{events:?}");
    assert_eq!(last["status"], "killed", "{last}");
    // Its run ended: the drain is over, the server exits 0.
    s.exited().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_loses_its_streams_and_every_request_at_the_reload() {
    let dir = Scratch::new("serve-edges-revoke");
    let agents = agents(&dir);
    let (alice, alice_line) = token_new("alice");
    let (bob, bob_line) = token_new("bob");
    let tokens = dir.file("tokens.yaml", &format!("{alice_line}\n{bob_line}\n"));
    let s = Serving::start(
        &dir.path("serve.db"),
        &agents,
        &["--tokens", &tokens.display().to_string()],
    );
    let http = support::loopback::http_client();
    let base = s.base.clone();
    let mut ids = Vec::new();
    for token in [&alice, &bob] {
        let (code, _, v) = call(
            &http,
            "POST",
            format!("{base}/v1/runs"),
            Some(token),
            Some(json!({"agent": "slow"})),
        )
        .await;
        assert_eq!(code, 201, "{v}");
        ids.push(v["run_id"].as_str().unwrap().to_string());
    }
    let (a_id, b_id) = (&ids[0], &ids[1]);
    let a_run = open_stream(&http, format!("{base}/v1/runs/{a_id}/events"), Some(&alice)).await;
    let a_feed = open_stream(&http, format!("{base}/v1/events"), Some(&alice)).await;
    let b_run = open_stream(&http, format!("{base}/v1/runs/{b_id}/events"), Some(&bob)).await;

    // Alice's token leaves the file; SIGHUP reloads it.
    std::fs::write(&tokens, format!("{bob_line}\n")).unwrap();
    s.signal("HUP");
    read_to_end(a_run, "alice's run stream").await;
    read_to_end(a_feed, "alice's host feed").await;
    let (code, _, v) = call(
        &http,
        "GET",
        format!("{base}/v1/runs/{a_id}"),
        Some(&alice),
        None,
    )
    .await;
    assert_eq!(code, 401, "{v}");
    let (code, _, _) = call(
        &http,
        "POST",
        format!("{base}/v1/runs/{a_id}/kill"),
        Some(&alice),
        None,
    )
    .await;
    assert_eq!(code, 401);
    // Bob's token and stream go on: his run's stream ends at its end.
    let (code, _, v) = call(
        &http,
        "GET",
        format!("{base}/v1/runs/{b_id}"),
        Some(&bob),
        None,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let (code, _, _) = call(
        &http,
        "POST",
        format!("{base}/v1/runs/{b_id}/kill"),
        Some(&bob),
        None,
    )
    .await;
    assert_eq!(code, 202);
    let events = read_to_end(b_run, "bob's run stream").await;
    assert_eq!(events.last().unwrap()["status"], "killed", "{events:?}");
}

/// Runs the binary with `args`, its stdout a pipe whose reader is gone.
fn into_a_closed_pipe(args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    support::cli::command(args)
        .env_remove("AGENTVISOR_LOG")
        .env_remove("AGENTVISOR_URL")
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_commands_into_a_closed_pipe_end_quietly() {
    let dir = Scratch::new("serve-edges-pipe");
    let agents = agents(&dir);
    let s = Serving::start(&dir.path("serve.db"), &agents, &[]);
    let http = support::loopback::http_client();
    let base = s.base.clone();
    let (code, _, v) = call(
        &http,
        "POST",
        format!("{base}/v1/runs?wait=30"),
        None,
        Some(json!({"agent": "quick"})),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    let id = v["run_id"].as_str().unwrap().to_string();
    for args in [
        vec!["runs", "list", "--server", &base],
        vec!["runs", "list", "--json", "--server", &base],
        vec!["runs", "show", &id, "--server", &base],
        vec!["runs", "show", &id, "--json", "--server", &base],
        vec!["runs", "show", &id, "--tree", "--server", &base],
        vec!["runs", "--server", &base, "list"],
    ] {
        let out = into_a_closed_pipe(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(stderr.trim().is_empty(), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
    s.stop().await;
}
