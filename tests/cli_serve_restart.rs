//! A server that restarts after a crash, as processes: `agentvisor serve`
//! recovers the durable runs of the server that died (unless
//! `--no-recover`), keeps its chat sessions in the database, and a durable
//! run parked for approval survives it all — `agentvisor recover` leaves
//! it parked and returns at once, `runs approve|deny ID` against the
//! database records a decision the next resume applies, and a restarted
//! server resumes it parked, approvable through its API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use serde_json::{json, Value};
use support::cli::{agentvisor, command, ok_json};
use support::loopback::{events_of, read_sse};
use support::scratch::Scratch;
use support::serving::Serving;

/// A durable run: one quick tool step, then an answer that takes 3 s (a
/// server killed meanwhile leaves it with a checkpoint past step one).
const SLOW: &str = r#"
name: slow
model: scripted
durable: true
prompt: add, then answer
tools: [add]
limits: { max_runtime: 120s, stall_timeout: 60s }
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { text: "five", latency: 3s }
"#;

/// A durable run whose first turn calls a gated tool (`add`) beside a free
/// one: it parks for an hour unless someone decides.
const GATED: &str = r#"
name: gated
model: scripted
durable: true
prompt: go
tools: [add, upper]
approval: [add]
limits: { approval_timeout: 1h, max_runtime: 120s, stall_timeout: 60s }
script:
  - { tools: [ { tool: add, args: { a: 2, b: 3 } }, { tool: upper, args: { text: hi } } ] }
  - { text: "done" }
"#;

const CHAT: &str = r#"
name: chat
model: scripted
script:
  - { text: "hello Ada" }
  - { text: "your name is Ada" }
"#;

/// A scratch directory with the agents above in `agents/`.
fn setup(name: &str) -> Scratch {
    let dir = Scratch::new(name);
    std::fs::create_dir_all(dir.path("agents")).unwrap();
    dir.file("agents/slow.yaml", SLOW);
    dir.file("agents/gated.yaml", GATED);
    dir.file("agents/chat.yaml", CHAT);
    dir
}

/// A read-only connection to the database.
fn open(db: &Path) -> Connection {
    Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

/// The first column of the first row of `sql` with `run_id` bound as ?1.
fn query_i64(db: &Path, sql: &str, run_id: &str) -> Option<i64> {
    open(db).query_row(sql, [run_id], |r| r.get(0)).ok()
}

/// Polls the database (every 20 ms, at most a minute) until `sql` about
/// `run_id` counts at least one row: the serving process has written it.
async fn written(db: &Path, sql: &str, run_id: &str) {
    let started = Instant::now();
    while query_i64(db, sql, run_id).unwrap_or(0) < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never written: {sql}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Submits a run of `agent`: its id.
async fn submit(s: &Serving, agent: &str) -> String {
    let (code, v) = s
        .call("POST", "/v1/runs", Some(json!({ "agent": agent })))
        .await;
    assert_eq!(code, 201, "{v}");
    v["run_id"].as_str().unwrap().to_string()
}

/// `agentvisor recover --json` on `db`, which must exit 0 within a
/// minute (it is killed, and the test fails, if it does not): its summary.
async fn recover(db: &Path) -> Value {
    let mut child = command(&["--db", &db.display().to_string(), "recover", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("recover did not return within a minute");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out: Output = child.wait_with_output().unwrap();
    ok_json(&out)
}

/// `agentvisor runs show ID --json` on `db`: the run's result.
fn result_of(db: &Path, run_id: &str) -> Value {
    let out = agentvisor(&[
        "--db",
        &db.display().to_string(),
        "runs",
        "show",
        run_id,
        "--json",
    ]);
    ok_json(&out)["result"].clone()
}

/// A result's steps as (tool, ok, result or error).
fn steps(r: &Value) -> Vec<(String, bool, String)> {
    r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let text = if s["ok"].as_bool().unwrap() {
                s["result"].as_str().unwrap_or_default()
            } else {
                s["error"].as_str().unwrap_or_default()
            };
            (
                s["tool"].as_str().unwrap().to_string(),
                s["ok"].as_bool().unwrap(),
                text.to_string(),
            )
        })
        .collect()
}

fn ids(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_resumes_the_durable_runs_of_the_one_that_crashed() {
    let dir = setup("serve-recover");
    let db = dir.path("serve.db");
    let agents = dir.path("agents");

    let first = Serving::start(&db, &agents, &[]);
    let run_id = submit(&first, "slow").await;
    interrupted(first, &db, &run_id).await;

    // The restart resumes it at start, and it ends ok there.
    let second = Serving::start(&db, &agents, &[]);
    let (code, v) = second
        .call("GET", &format!("/v1/runs/{run_id}?wait=60"), None)
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["output"], "five", "{v}");
    let r = result_of(&db, &run_id);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(steps(&r), vec![("add".to_string(), true, "5".to_string())]);
    let kept = "SELECT COUNT(*) FROM checkpoints WHERE run_id = ?1";
    assert_eq!(query_i64(&db, kept, &run_id), Some(0));

    // --no-recover: a run the crash left stays as it was (a resume would
    // have saved it with one resume, and the drain kept that) for
    // `agentvisor recover`.
    let other = submit(&second, "slow").await;
    interrupted(second, &db, &other).await;
    let untouched = Serving::start(&db, &agents, &["--no-recover"]);
    untouched.stop().await;
    let attempts = "SELECT attempts FROM checkpoints WHERE run_id = ?1";
    assert_eq!(query_i64(&db, attempts, &other), Some(0), "not resumed");
    let ended = "SELECT COUNT(*) FROM runs WHERE run_id = ?1";
    assert_eq!(query_i64(&db, ended, &other), Some(0));
    let s = recover(&db).await;
    assert_eq!(s["by_status"], json!({ "ok": 1 }), "{s}");
    assert_eq!(result_of(&db, &other)["status"], "ok");
}

/// Crashes `server` once its run `run_id` is past its first step (its
/// checkpoint says so), in its 3 s answer; the run is then unfinished.
async fn interrupted(server: Serving, db: &Path, run_id: &str) {
    written(
        db,
        "SELECT COUNT(*) FROM checkpoints WHERE run_id = ?1 AND iteration >= 1",
        run_id,
    )
    .await;
    server.crash();
    let ended = "SELECT COUNT(*) FROM runs WHERE run_id = ?1";
    assert_eq!(query_i64(db, ended, run_id), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_run_parked_for_approval_outlives_its_server_and_recover_does_not_wait_for_it() {
    let dir = setup("parked");
    let db = dir.path("serve.db");
    let db_arg = db.display().to_string();
    let agents = dir.path("agents");

    let first = Serving::start(&db, &agents, &[]);
    let denied = submit(&first, "gated").await;
    let approved = submit(&first, "gated").await;
    for id in [&denied, &approved] {
        first
            .poll(&format!("/v1/runs/{id}"), |v| {
                v["live"]["awaiting_approval"]
                    .as_array()
                    .is_some_and(|a| a.len() == 1)
            })
            .await;
        written(
            &db,
            "SELECT COUNT(*) FROM checkpoints WHERE run_id = ?1",
            id,
        )
        .await;
    }
    first.crash();

    // Nobody here can decide: recover returns at once, both runs parked.
    let s = recover(&db).await;
    assert_eq!(
        ids(&s["awaiting_approval"]),
        ids(&json!([denied, approved])),
        "{s}"
    );
    assert_eq!(s["by_status"], json!({}), "{s}");
    assert_eq!(ids(&s["interrupted"]), Vec::<String>::new(), "{s}");
    let kept = "SELECT COUNT(*) FROM checkpoints WHERE run_id = ?1";
    for id in [&denied, &approved] {
        assert_eq!(query_i64(&db, kept, id), Some(1), "kept on record");
        assert_eq!(
            query_i64(&db, "SELECT COUNT(*) FROM runs WHERE run_id = ?1", id),
            Some(0),
            "not ended"
        );
    }
    // Again: still nothing to decide with.
    let s = recover(&db).await;
    assert_eq!(s["awaiting_approval"].as_array().unwrap().len(), 2, "{s}");

    // A decision recorded in the database applies at the next resume.
    let out = agentvisor(&[
        "--db",
        &db_arg,
        "runs",
        "deny",
        &denied,
        "--reason",
        "not today",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("call_0_0"));
    let out = agentvisor(&["--db", &db_arg, "runs", "deny", &denied]);
    assert_eq!(out.status.code(), Some(1), "nothing waits any more");
    let s = recover(&db).await;
    assert_eq!(s["resumed"], 1, "{s}");
    assert_eq!(s["by_status"], json!({ "ok": 1 }), "{s}");
    assert_eq!(ids(&s["awaiting_approval"]), vec![approved.clone()], "{s}");
    let r = result_of(&db, &denied);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        steps(&r),
        vec![
            (
                "add".to_string(),
                false,
                "approval_denied: denied by operator: not today".to_string()
            ),
            ("upper".to_string(), true, "HI".to_string()),
        ]
    );

    // A restarted server resumes the other one parked, approvable there.
    let second = Serving::start(&db, &agents, &[]);
    second
        .poll(&format!("/v1/runs/{approved}"), |v| {
            v["live"]["awaiting_approval"][0]["call_id"] == "call_0_0"
        })
        .await;
    let (code, v) = second
        .call(
            "POST",
            &format!("/v1/runs/{approved}/approve"),
            Some(json!({})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let (_, v) = second
        .call("GET", &format!("/v1/runs/{approved}?wait=30"), None)
        .await;
    assert_eq!(v["status"], "ok", "{v}");
    second.stop().await;
    let r = result_of(&db, &approved);
    assert_eq!(
        steps(&r),
        vec![
            ("add".to_string(), true, "5".to_string()),
            ("upper".to_string(), true, "HI".to_string()),
        ]
    );
    let s = recover(&db).await;
    assert_eq!(s["resumed"], 0, "{s}");
    assert_eq!(s["awaiting_approval"], json!([]), "{s}");
}

/// Sends `text` to session `id` and reads the whole answer: the status,
/// and the text of its `run.end` event.
async fn say(s: &Serving, id: &str, text: &str) -> (u16, String) {
    let resp = support::loopback::http_client()
        .post(format!("{}/v1/sessions/{id}/messages", s.base))
        .header("content-type", "application/json")
        .body(json!({ "text": text }).to_string())
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    let events = events_of(&read_sse(resp, 10_000).await);
    let end = events
        .iter()
        .find(|e| e["type"] == "run.end")
        .cloned()
        .unwrap_or_default();
    (code, end["output"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_keeps_its_sessions() {
    let dir = setup("serve-sessions");
    let db = dir.path("serve.db");
    let agents = dir.path("agents");

    let first = Serving::start(&db, &agents, &[]);
    let (code, v) = first
        .call(
            "POST",
            "/v1/sessions",
            Some(json!({ "agent": "chat", "id": "ada", "on_busy": "wait" })),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let (code, answer) = say(&first, "ada", "my name is Ada").await;
    assert_eq!((code, answer.as_str()), (200, "hello Ada"));
    first.stop().await;

    let second = Serving::start(&db, &agents, &[]);
    let (code, v) = second.call("GET", "/v1/sessions/ada", None).await;
    assert_eq!(code, 200, "the session is still there: {v}");
    assert_eq!(v["on_busy"], "wait", "{v}");
    assert_eq!(v["prompts"], 1, "{v}");
    let texts: Vec<&str> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, vec!["my name is Ada", "hello Ada"], "{v}");
    // The conversation goes on (the script too).
    let (code, answer) = say(&second, "ada", "what is my name?").await;
    assert_eq!((code, answer.as_str()), (200, "your name is Ada"));
    let (_, v) = second.call("GET", "/v1/sessions/ada", None).await;
    assert_eq!(v["prompts"], 2, "{v}");
    assert_eq!(v["messages"].as_array().unwrap().len(), 4, "{v}");
    second.stop().await;
}
