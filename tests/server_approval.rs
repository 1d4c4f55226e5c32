//! Approval over HTTP and from the command line: a run parked on a gated
//! tool call shows what it waits for, `approve` runs the call, `deny`
//! gives the model the operator's reason, and a run that waits for nothing
//! answers 409. Another caller's run is 404, as everywhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Command;

use serde_json::{json, Value};
use support::loopback::{Running, ALICE, BOB, SLOW};

const GATED: &str = r#"
name: gated
model: scripted
prompt: go
tools: [add, upper]
approval: [add]
limits: { max_runtime: 120s, stall_timeout: 120s }
script:
  - { tools: [ { tool: add, args: { a: 2, b: 3 } }, { tool: add, args: { a: 1, b: 1 } } ] }
  - { text: "done" }
"#;

async fn start(auth: bool) -> Running {
    let (host, store) = support::host().await;
    support::loopback::start(host, store, &[GATED, SLOW], auth).await
}

/// Submits `agent` and reads its events until it waits for approval (or
/// ends); returns the run id.
async fn parked(s: &Running, token: Option<&str>) -> String {
    let (code, v, _) = s
        .req("POST", "/v1/runs", token, Some(json!({"agent": "gated"})))
        .await;
    assert_eq!(code, 201, "{v}");
    let id = v["run_id"].as_str().unwrap().to_string();
    let resp = s
        .request("GET", &format!("/v1/runs/{id}/events"), token, None)
        .send()
        .await
        .unwrap();
    // Read frames until both requests are out (the stream goes on).
    let mut resp = resp;
    let mut buf = String::new();
    while buf.matches("approval.requested").count() < 2 {
        let chunk = resp.chunk().await.unwrap().expect("the run waits");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    id
}

/// `agentvisor_runs_awaiting_approval` as `/metrics` shows it.
async fn awaiting_gauge(s: &Running) -> f64 {
    let text = s.metrics_text().await;
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == "agentvisor_runs_awaiting_approval")
        .unwrap_or_else(|| panic!("no awaiting gauge in:\n{text}"));
    match sample.value {
        prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn approve_and_deny_decide_what_a_run_waits_for() {
    let s = start(true).await;
    let id = parked(&s, Some(ALICE)).await;
    let (code, v, _) = s
        .req("GET", &format!("/v1/runs/{id}"), Some(ALICE), None)
        .await;
    assert_eq!(code, 200);
    let waiting = v["live"]["awaiting_approval"].as_array().unwrap().clone();
    assert_eq!(waiting.len(), 2, "{v}");
    assert_eq!(waiting[0]["tool"], "add");
    assert!(waiting[0]["arguments"].as_str().unwrap().contains("\"a\""));
    let first = waiting[0]["call_id"].as_str().unwrap().to_string();
    let second = waiting[1]["call_id"].as_str().unwrap().to_string();
    // The run list says so too.
    let (_, list, _) = s
        .req("GET", "/v1/runs?status=running", Some(ALICE), None)
        .await;
    assert_eq!(
        list["runs"][0]["live"]["awaiting_approval"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Operators see it on the metrics scrape.
    assert_eq!(awaiting_gauge(&s).await, 1.0);

    // Not bob's to decide: 404, as for no such run.
    let (code, _, _) = s
        .req("POST", &format!("/v1/runs/{id}/approve"), Some(BOB), None)
        .await;
    assert_eq!(code, 404);
    // A call it does not wait for.
    let (code, v, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/approve"),
            Some(ALICE),
            Some(json!({"call_id": "call_nope"})),
        )
        .await;
    assert_eq!(code, 409);
    assert_eq!(v["error"]["kind"], "unknown_call");
    let (code, v, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/approve"),
            Some(ALICE),
            Some(json!({"call_id": first})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["action"], "approve");
    assert_eq!(v["calls"][0]["call_id"], first.as_str());
    let (code, v, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/deny"),
            Some(ALICE),
            Some(json!({"note": "one is enough"})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["calls"][0]["call_id"], second.as_str());

    let (_, v, _) = s
        .req("GET", &format!("/v1/runs/{id}?wait=10"), Some(ALICE), None)
        .await;
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(awaiting_gauge(&s).await, 0.0);
    let steps = v["result"]["steps"].as_array().unwrap();
    assert_eq!(steps[0]["ok"], true);
    assert_eq!(steps[1]["ok"], false);
    assert_eq!(
        steps[1]["error"],
        "approval_denied: denied by operator: one is enough"
    );
    // Over: nothing to decide.
    let (code, _, _) = s
        .req("POST", &format!("/v1/runs/{id}/approve"), Some(ALICE), None)
        .await;
    assert_eq!(code, 409);
    // The records hold both requests and both decisions.
    let (_, records, _) = s
        .req("GET", &format!("/v1/runs/{id}/records"), Some(ALICE), None)
        .await;
    let text = records.to_string();
    assert_eq!(text.matches("approval.requested").count(), 2);
    assert_eq!(text.matches("approval.decided").count(), 2);
}

#[tokio::test]
async fn a_run_that_waits_for_nothing_answers_409() {
    let s = start(false).await;
    let (_, v, _) = s
        .req("POST", "/v1/runs", None, Some(json!({"agent": "slow"})))
        .await;
    let id = v["run_id"].as_str().unwrap().to_string();
    for action in ["approve", "deny"] {
        let (code, v, _) = s
            .req("POST", &format!("/v1/runs/{id}/{action}"), None, None)
            .await;
        assert_eq!(code, 409, "{v}");
        assert_eq!(v["error"]["kind"], "not_awaiting_approval");
    }
    let (code, _, _) = s
        .req("POST", &format!("/v1/runs/{id}/kill"), None, None)
        .await;
    assert_eq!(code, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_approves_and_denies_on_a_server() {
    let s = start(false).await;
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
            .args(args)
            .env("AGENTVISOR_URL", &s.base)
            .env_remove("AGENTVISOR_TOKEN")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let id = parked(&s, None).await;
    let (_, v, _) = s.req("GET", &format!("/v1/runs/{id}"), None, None).await;
    let first = v["live"]["awaiting_approval"][0]["call_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, out, err) = cli(&["runs", "approve", &id, "--call", &first]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&first) && out.contains("add"), "{out}");
    let (code, out, err) = cli(&["runs", "deny", &id, "--reason", "not today"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (_, v, _) = s
        .req("GET", &format!("/v1/runs/{id}?wait=10"), None, None)
        .await;
    assert_eq!(v["status"], "ok");
    assert_eq!(
        v["result"]["steps"][1]["error"],
        "approval_denied: denied by operator: not today"
    );
    let (code, _, err) = cli(&["runs", "approve", &id]);
    assert_eq!(code, Some(1), "an ended run: {err}");
    let doc: Value = s.req("GET", "/openapi.json", None, None).await.1;
    assert!(doc["components"]["schemas"]["ApprovalDecision"].is_object());
}
