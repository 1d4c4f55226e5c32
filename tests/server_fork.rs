//! Fork and diff over HTTP: `POST /v1/runs/{id}/fork` and `GET /v1/diff`
//! on a caller's own runs; another caller's run is 404, as no run is.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::json;
use support::loopback::{ALICE, BOB, QUICK, SLOW};

#[tokio::test]
async fn a_caller_forks_and_diffs_its_own_runs_and_no_one_elses() {
    let (host, store) = support::host().await;
    let s = support::loopback::start(host, store, &[QUICK, SLOW], true).await;
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs?wait=10",
            Some(ALICE),
            Some(json!({"agent": "quick"})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let id = v["run_id"].as_str().unwrap().to_string();
    // The catalog shows each tool's effect class.
    let (code, agents, _) = s.req("GET", "/v1/agents", Some(ALICE), None).await;
    assert_eq!(code, 200);
    assert_eq!(agents["agents"][0]["tool_effects"], json!({"add": "read"}));
    assert_eq!(
        agents["agents"][1]["tool_effects"],
        json!({"sleep": "read"})
    );

    let (code, f, h) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/fork?wait=10"),
            Some(ALICE),
            Some(json!({"at_step": 1})),
        )
        .await;
    assert_eq!(code, 201, "{f}");
    assert_eq!(f["status"], "ok", "{f}");
    assert_eq!(f["result"]["forked_from"]["run_id"], id.as_str());
    assert_eq!(f["result"]["forked_from"]["step"], 1);
    assert_eq!(f["result"]["caller_id"], "alice");
    let fork_id = f["run_id"].as_str().unwrap().to_string();
    assert_ne!(fork_id, id);
    assert_eq!(h["location"], format!("/v1/runs/{fork_id}").as_str());

    let (code, d, _) = s
        .req(
            "GET",
            &format!("/v1/diff?a={id}&b={fork_id}"),
            Some(ALICE),
            None,
        )
        .await;
    assert_eq!(code, 200, "{d}");
    assert!(d["first_divergence"].is_null(), "{d:#}");
    assert_eq!(d["b"]["forked_from"]["step"], 1);

    // Bob sees neither run.
    let (code, v, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/fork"),
            Some(BOB),
            Some(json!({"at_step": 1})),
        )
        .await;
    assert_eq!(code, 404, "{v}");
    assert_eq!(v["error"]["kind"], "not_found");
    let (code, _, _) = s
        .req(
            "GET",
            &format!("/v1/diff?a={id}&b={fork_id}"),
            Some(BOB),
            None,
        )
        .await;
    assert_eq!(code, 404);

    // A step past the recording is refused.
    let (code, v, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/fork"),
            Some(ALICE),
            Some(json!({"at_step": 3})),
        )
        .await;
    assert_eq!(code, 422, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("recorded 2 step(s)"),
        "{v}"
    );
}
