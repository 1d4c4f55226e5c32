//! `agentvisor serve` as a process: it prints where it listens, serves the
//! agents of `--agents` to token holders, reloads them on SIGHUP, answers
//! the CLI's `--server` commands, and on SIGTERM drains and exits 0.
//! `agentvisor token new` prints a token and the line that admits it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agentvisor"))
}

const QUICK: &str = "name: quick\nmodel: scripted\nprompt: add\ntools: [add]\nscript:\n  - { tool: add, args: { a: 2, b: 3 } }\n  - { text: \"five\" }\n";
const SLOW: &str = "name: slow\nmodel: scripted\nprompt: wait\ntools: [sleep]\nlimits: { max_runtime: 120s, stall_timeout: 120s }\nscript:\n  - { tool: sleep, args: { ms: 60000 } }\n  - { text: late }\n";

struct Serving {
    child: Child,
    base: String,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig}");
}

fn token_new(caller: &str, admin: bool) -> (String, String) {
    let mut c = bin();
    c.args(["token", "new", "--caller", caller]);
    if admin {
        c.args(["--role", "admin"]);
    }
    let out = c.output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let token = lines.next().unwrap().to_string();
    let line = lines.next().unwrap().to_string();
    (token, line)
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = http.request(method, url).bearer_auth(token);
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = r.send().await.unwrap();
    let code = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `POST {base}{path}` (`/v1/runs`, with its query) of `{"agent": agent}`.
async fn submit(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    token: &str,
    agent: &str,
) -> (u16, Value) {
    call(
        http,
        reqwest::Method::POST,
        &format!("{base}{path}"),
        token,
        Some(json!({ "agent": agent })),
    )
    .await
}

#[test]
fn token_new_prints_a_token_and_its_line() {
    let (token, line) = token_new("alice", false);
    assert!(token.starts_with("av_") && token.len() == 67, "{token}");
    assert!(
        line.starts_with("- { caller: alice, role: caller, sha256: "),
        "{line}"
    );
    let (_, admin) = token_new("root", true);
    assert!(admin.contains("role: admin"), "{admin}");
    let bad = bin()
        .args(["token", "new", "--caller", "a b"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reloads_answers_the_cli_and_drains_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("agentvisor-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let agents = dir.join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(agents.join("quick.yaml"), QUICK).unwrap();
    let (alice, alice_line) = token_new("alice", false);
    let (root, root_line) = token_new("root", true);
    let tokens = dir.join("tokens.yaml");
    std::fs::write(&tokens, format!("{alice_line}\n{root_line}\n")).unwrap();
    let db = dir.join("serve.db");

    let mut child = bin()
        .args(["serve", "--addr", "127.0.0.1:0", "--drain", "2s"])
        .arg("--agents")
        .arg(&agents)
        .arg("--tokens")
        .arg(&tokens)
        .arg("--db")
        .arg(&db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let base = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    let s = Serving { child, base };
    let http = support::loopback::http_client();

    let (code, v) = submit(&http, &s.base, "/v1/runs?wait=10", &alice, "quick").await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"], "ok");
    let (code, _) = submit(&http, &s.base, "/v1/runs", &alice, "slow").await;
    assert_eq!(code, 404, "slow is not loaded yet");

    // SIGHUP: the new manifest is served.
    std::fs::write(agents.join("slow.yaml"), SLOW).unwrap();
    signal(&s.child, "HUP");
    let mut slow = Value::Null;
    for _ in 0..100 {
        let (code, v) = submit(&http, &s.base, "/v1/runs", &alice, "slow").await;
        if code == 201 {
            slow = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let slow_id = slow["run_id"]
        .as_str()
        .expect("slow served after SIGHUP")
        .to_string();

    // The CLI as a client: list, show, kill.
    let cli = |args: &[&str], token: &str| {
        let out = bin()
            .args(args)
            .env("AGENTVISOR_URL", &s.base)
            .env("AGENTVISOR_TOKEN", token)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) = cli(&["runs", "list", "--json"], &alice);
    assert_eq!(code, Some(0), "{text}");
    let list: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(list.len(), 2);
    let (code, _) = cli(&["runs", "kill", &slow_id], "av_not_a_token");
    assert_eq!(code, Some(2), "a bad token is refused");
    let (code, text) = cli(&["runs", "kill", &slow_id], &alice);
    assert_eq!(code, Some(0), "{text}");
    let (_, v) = call(
        &http,
        reqwest::Method::GET,
        &format!("{}/v1/runs/{slow_id}?wait=10", s.base),
        &root,
        None,
    )
    .await;
    assert_eq!(v["status"], "killed");
    let (code, _) = cli(&["runs", "kill", &slow_id], &alice);
    assert_eq!(code, Some(1), "an ended run");
    let (code, text) = cli(&["runs", "show", &slow_id, "--json"], &root);
    assert_eq!(code, Some(0));
    let shown: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(shown["result"]["kill_reason"], "operator");

    // SIGTERM with a run in flight: it is cancelled after the drain; exit 0.
    let (_, v) = submit(&http, &s.base, "/v1/runs", &alice, "slow").await;
    let last = v["run_id"].as_str().unwrap().to_string();
    let mut s = s;
    signal(&s.child, "TERM");
    let status = tokio::task::spawn_blocking(move || {
        let st = s.child.wait().unwrap();
        std::mem::forget(s);
        st
    })
    .await
    .unwrap();
    assert!(status.success(), "{status:?}");
    let out = bin()
        .args(["runs", "show", &last, "--json"])
        .arg("--db")
        .arg(&db)
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["result"]["status"], "cancelled", "{shown}");
    let _ = std::fs::remove_dir_all(&dir);
}
