//! The HTTP API on a loopback socket: routes, status codes, the error
//! shape, auth, idempotency, `?wait=`, pagination, event streams (ids,
//! resumption, the end), limits, draining, the OpenAPI document and the
//! metrics scrape.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use agentvisor::server::ServerConfig;
use serde_json::{json, Value};
use support::loopback::{events_of, read_sse, Running, ALICE, BOB, QUICK, ROOT, SLOW};

async fn start(config: ServerConfig, auth: bool) -> Running {
    let (host, store) = support::host().await;
    support::loopback::start_with(host, store, &[QUICK, SLOW], auth, config).await
}

#[tokio::test]
async fn submit_waits_for_the_result_and_the_run_reads_back() {
    let s = start(ServerConfig::default(), false).await;
    let (code, v, h) = s
        .req(
            "POST",
            "/v1/runs?wait=10",
            None,
            Some(json!({"agent": "quick", "input": "hi"})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"], "ok");
    assert_eq!(v["output"], "five");
    assert!(
        v["result"]["usage"]["input_tokens"].as_u64().unwrap() >= 10,
        "{v}"
    );
    let id = v["run_id"].as_str().unwrap().to_string();
    assert_eq!(h["location"], format!("/v1/runs/{id}").as_str());
    let (code, got, _) = s.req("GET", &format!("/v1/runs/{id}"), None, None).await;
    assert_eq!(code, 200);
    assert_eq!(got["status"], "ok");
    assert_eq!(got["run_id"], id.as_str());
    let (code, list, _) = s.req("GET", "/v1/runs?status=ok", None, None).await;
    assert_eq!(code, 200);
    assert_eq!(list["runs"][0]["run_id"], id.as_str());
    let (code, agents, _) = s.req("GET", "/v1/agents", None, None).await;
    assert_eq!(code, 200);
    let names: Vec<&str> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["quick", "slow"]);
}

#[tokio::test]
async fn errors_have_one_shape_and_the_right_status() {
    let s = start(ServerConfig::default(), false).await;
    let (code, v, _) = s.submit("/v1/runs", None, "nope").await;
    assert_eq!(code, 404);
    assert_eq!(v["error"]["kind"], "unknown_agent");
    let (code, v, _) = s
        .req("POST", "/v1/runs", None, Some(json!({"input": "x"})))
        .await;
    assert_eq!(code, 422);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("agent"),
        "{v}"
    );
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs",
            None,
            Some(json!({"agent": "quick", "budget_tokens": "lots"})),
        )
        .await;
    assert_eq!(code, 422);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budget_tokens")
            || v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("invalid type"),
        "{v}"
    );
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs",
            None,
            Some(json!({"agent": "quick", "colour": 1})),
        )
        .await;
    assert_eq!(code, 422);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("colour"),
        "{v}"
    );
    let big = "x".repeat(2 << 20);
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs",
            None,
            Some(json!({"agent": "quick", "input": big})),
        )
        .await;
    assert_eq!(code, 413, "{v}");
    assert_eq!(v["error"]["kind"], "payload_too_large");
    let (code, v, _) = s
        .req(
            "GET",
            "/v1/runs/0123456789abcdef0123456789abcdef",
            None,
            None,
        )
        .await;
    assert_eq!(code, 404);
    assert_eq!(v["error"]["kind"], "not_found");
    let (code, _, _) = s.req("GET", "/v1/runs/not-an-id", None, None).await;
    assert_eq!(code, 404);
    let (code, v, _) = s.req("GET", "/v1/runs?limit=0", None, None).await;
    assert_eq!(code, 422, "{v}");
    let (code, v, _) = s.req("GET", "/v1/runs?status=sideways", None, None).await;
    assert_eq!(code, 422, "{v}");
    // A wait longer than any duration is clamped, not a failure.
    let (code, v, _) = s.submit("/v1/runs?wait=1.8e19", None, "quick").await;
    assert_eq!(code, 201, "{v}");
    let (code, v, _) = s.submit("/v1/runs?wait=-1", None, "quick").await;
    assert_eq!(code, 422, "{v}");
}

#[tokio::test]
async fn the_same_idempotency_key_gives_the_same_run() {
    let s = start(ServerConfig::default(), true).await;
    let body = json!({"agent": "quick", "idempotency_key": "k1"});
    let (c1, a, _) = s
        .req("POST", "/v1/runs", Some(ALICE), Some(body.clone()))
        .await;
    let (c2, b, h) = s
        .req("POST", "/v1/runs?wait=5", Some(ALICE), Some(body.clone()))
        .await;
    assert_eq!((c1, c2), (201, 201));
    assert_eq!(a["run_id"], b["run_id"]);
    assert_eq!(h["idempotent-replayed"], "true");
    // Another caller's key is its own.
    let (_, c, _) = s.req("POST", "/v1/runs", Some(BOB), Some(body)).await;
    assert_ne!(a["run_id"], c["run_id"]);
    // The header works as the field does.
    let v1 = submit_with_key_header(&s, "k2").await;
    let v2 = submit_with_key_header(&s, "k2").await;
    assert_eq!(v1["run_id"], v2["run_id"]);
}

/// Alice's `POST /v1/runs` of `quick` with `key` in the `idempotency-key`
/// header: the answer.
async fn submit_with_key_header(s: &Running, key: &str) -> Value {
    let resp = s
        .http
        .post(format!("{}/v1/runs", s.base))
        .bearer_auth(ALICE)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"agent":"quick"}"#)
        .send()
        .await
        .unwrap();
    serde_json::from_str(&resp.text().await.unwrap()).unwrap()
}

#[tokio::test]
async fn tokens_decide_who_sees_what() {
    let s = start(ServerConfig::default(), true).await;
    let (code, v, _) = s.req("GET", "/v1/runs", None, None).await;
    assert_eq!(code, 401);
    assert_eq!(v["error"]["kind"], "unauthorized");
    let (code, _, _) = s.req("GET", "/v1/runs", Some("av_wrong"), None).await;
    assert_eq!(code, 401);
    let (code, v, _) = s.submit("/v1/runs?wait=5", Some(ALICE), "quick").await;
    assert_eq!(code, 201);
    assert_eq!(v["caller_id"], "alice");
    let id = v["run_id"].as_str().unwrap().to_string();
    // Bob: 404 for alice's run, everywhere; his list does not hold it.
    for path in [
        format!("/v1/runs/{id}"),
        format!("/v1/runs/{id}/events"),
        format!("/v1/runs/{id}/records"),
    ] {
        let (code, v, _) = s.req("GET", &path, Some(BOB), None).await;
        assert_eq!(code, 404, "{path}: {v}");
    }
    let (code, _, _) = s
        .req("POST", &format!("/v1/runs/{id}/kill"), Some(BOB), None)
        .await;
    assert_eq!(code, 404);
    let (_, list, _) = s.req("GET", "/v1/runs", Some(BOB), None).await;
    assert!(list["runs"].as_array().unwrap().is_empty(), "{list}");
    // Alice and the admin see it.
    assert_eq!(
        s.req("GET", &format!("/v1/runs/{id}"), Some(ALICE), None)
            .await
            .0,
        200
    );
    assert_eq!(
        s.req("GET", &format!("/v1/runs/{id}"), Some(ROOT), None)
            .await
            .0,
        200
    );
    let (_, list, _) = s.req("GET", "/v1/runs", Some(ROOT), None).await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 1);
    // Inline manifests: admin only.
    let manifest = json!({"name": "inline", "model": "scripted", "script": [{"text": "hey"}]});
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs",
            Some(ALICE),
            Some(json!({"manifest": manifest.clone()})),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs?wait=5",
            Some(ROOT),
            Some(json!({"manifest": manifest})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["output"], "hey");
    // The token may come in the query (EventSource cannot set headers).
    assert_eq!(
        s.req("GET", &format!("/v1/runs?access_token={ALICE}"), None, None)
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn a_run_streams_its_events_with_seq_ids_and_resumes_exactly() {
    let s = start(ServerConfig::default(), false).await;
    let (_, v, _) = s.submit("/v1/runs?wait=10", None, "quick").await;
    let id = v["run_id"].as_str().unwrap().to_string();
    let resp = s
        .http
        .get(format!("{}/v1/runs/{id}/events", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let frames = read_sse(resp, 1000).await;
    let evs = events_of(&frames);
    assert_eq!(evs.last().unwrap()["type"], "run.end", "{evs:?}");
    for (f, e) in frames.iter().zip(&evs) {
        assert_eq!(
            f.id.as_deref(),
            Some(e["seq"].to_string().as_str()),
            "{f:?}"
        );
    }
    let seqs: Vec<u64> = evs.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // Resume after the third event: exactly the rest.
    let third = frames[2].id.clone().unwrap();
    let resp = s
        .http
        .get(format!("{}/v1/runs/{id}/events", s.base))
        .header("last-event-id", &third)
        .send()
        .await
        .unwrap();
    let rest = events_of(&read_sse(resp, 1000).await);
    assert_eq!(rest, evs[3..].to_vec());
}

#[tokio::test]
async fn a_live_run_streams_until_it_is_killed() {
    let s = start(
        ServerConfig {
            keep_alive: Duration::from_millis(100),
            ..Default::default()
        },
        false,
    )
    .await;
    let (code, v, _) = s.submit("/v1/runs", None, "slow").await;
    assert_eq!(code, 201);
    assert_eq!(v["status"], "running");
    let id = v["run_id"].as_str().unwrap().to_string();
    let resp = s
        .http
        .get(format!("{}/v1/runs/{id}/events", s.base))
        .send()
        .await
        .unwrap();
    let reader = tokio::spawn(read_sse(resp, 1000));
    // Wait for the tool call to be in flight, then kill it.
    let mut feed = s.host.run(&id.parse().unwrap()).unwrap().subscribe();
    while let Some(ev) = feed.next().await {
        if matches!(ev.event, agentvisor::RunEvent::ToolCall { .. }) {
            break;
        }
    }
    let (code, v, _) = s
        .req("POST", &format!("/v1/runs/{id}/kill"), None, None)
        .await;
    assert_eq!(code, 202, "{v}");
    let frames = reader.await.unwrap();
    let evs = events_of(&frames);
    let end = evs.last().unwrap();
    assert_eq!(end["type"], "run.end");
    assert_eq!(end["status"], "killed");
    assert_eq!(end["kill_reason"], "operator");
    let (_, got, _) = s.req("GET", &format!("/v1/runs/{id}"), None, None).await;
    assert_eq!(got["status"], "killed");
    // Commands to an ended run: 409.
    let (code, v, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/steer"),
            None,
            Some(json!({"text": "go"})),
        )
        .await;
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error"]["kind"], "run_finished");
}

#[tokio::test]
async fn steer_extend_cancel_reach_a_live_run() {
    let s = start(ServerConfig::default(), false).await;
    let (_, v, _) = s.submit("/v1/runs", None, "slow").await;
    let id = v["run_id"].as_str().unwrap().to_string();
    let (code, v, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/extend"),
            None,
            Some(json!({"seconds": 30})),
        )
        .await;
    assert_eq!(code, 202, "{v}");
    // The run list shows a live run's cost and the critic's latest
    // decision (the dashboard reads them for runs that began before it
    // opened). The extension is applied by the run's critic shortly after
    // the 202: poll the list for it.
    let mut live = Value::Null;
    for _ in 0..500 {
        let (_, list, _) = s.req("GET", "/v1/runs?status=running", None, None).await;
        live = list["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == id.as_str())
            .map(|r| r["live"].clone())
            .unwrap_or(Value::Null);
        if !live["last_decision"].is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(live["last_decision"]["action"], "extend", "{live}");
    assert_eq!(live["last_decision"]["reason"], "operator", "{live}");
    assert!(live["cost_micros"].is_u64(), "{live}");
    let (code, _, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/extend"),
            None,
            Some(json!({"seconds": -1})),
        )
        .await;
    assert_eq!(code, 422);
    let (code, _, _) = s
        .req(
            "POST",
            &format!("/v1/runs/{id}/steer"),
            None,
            Some(json!({"text": "hurry"})),
        )
        .await;
    assert_eq!(code, 202);
    let (code, v, _) = s
        .req("POST", &format!("/v1/runs/{id}/approve"), None, None)
        .await;
    assert_eq!(code, 409);
    assert_eq!(v["error"]["kind"], "not_awaiting_approval");
    let (code, _, _) = s
        .req("POST", &format!("/v1/runs/{id}/cancel"), None, None)
        .await;
    assert_eq!(code, 202);
    let (_, v, _) = s
        .req("GET", &format!("/v1/runs/{id}?wait=10"), None, None)
        .await;
    assert_eq!(v["status"], "cancelled");
    let decisions = v["result"]["critic"].as_array().unwrap();
    assert!(decisions.iter().any(|d| d["action"] == "extend"), "{v}");
}

#[tokio::test]
async fn runs_page_newest_first_without_gaps_or_repeats() {
    let s = start(ServerConfig::default(), false).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (_, v, _) = s.submit("/v1/runs?wait=5", None, "quick").await;
        ids.push(v["run_id"].as_str().unwrap().to_string());
    }
    let (_, v, _) = s.submit("/v1/runs", None, "slow").await;
    let live = v["run_id"].as_str().unwrap().to_string();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let path = match &cursor {
            Some(c) => format!("/v1/runs?limit=2&cursor={c}"),
            None => "/v1/runs?limit=2".into(),
        };
        let (code, page, _) = s.req("GET", &path, None, None).await;
        assert_eq!(code, 200, "{page}");
        for r in page["runs"].as_array().unwrap() {
            seen.push(r["run_id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut want = vec![live.clone()];
    want.extend(ids.iter().rev().cloned());
    assert_eq!(seen, want);
    let (_, page, _) = s.req("GET", "/v1/runs?status=running", None, None).await;
    assert_eq!(page["runs"].as_array().unwrap().len(), 1);
    let (_, page, _) = s
        .req("GET", "/v1/runs?agent=quick&limit=500", None, None)
        .await;
    assert_eq!(page["runs"].as_array().unwrap().len(), 5);
    let (_, page, _) = s
        .req("GET", &format!("/v1/runs?root={}", ids[0]), None, None)
        .await;
    assert_eq!(page["runs"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn the_host_feed_tells_runs_started_and_ended() {
    let s = start(ServerConfig::default(), true).await;
    let resp = s
        .http
        .get(format!("{}/v1/events", s.base))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let reader = tokio::spawn(read_sse(resp, 4));
    // The watcher is registered once the response headers are out.
    let (_, b, _) = s.submit("/v1/runs?wait=5", Some(BOB), "quick").await;
    let (_, a, _) = s.submit("/v1/runs?wait=5", Some(ALICE), "quick").await;
    let (_, a2, _) = s.submit("/v1/runs?wait=5", Some(ALICE), "quick").await;
    let evs = events_of(&reader.await.unwrap());
    let kinds: Vec<(&str, &str)> = evs
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["run_id"].as_str().unwrap()))
        .collect();
    let (a, a2) = (
        a["run_id"].as_str().unwrap(),
        a2["run_id"].as_str().unwrap(),
    );
    assert_eq!(
        kinds,
        [
            ("run.started", a),
            ("run.ended", a),
            ("run.started", a2),
            ("run.ended", a2)
        ]
    );
    assert!(
        evs.iter().all(|e| e["run_id"] != b["run_id"]),
        "bob's runs are not alice's to see"
    );
    assert_eq!(evs[1]["status"], "ok");
}

#[tokio::test]
async fn limits_answer_429_with_retry_after() {
    let s = start(
        ServerConfig {
            rate_per_sec: 1.0,
            rate_burst: 3.0,
            max_subscribers: 1,
            ..Default::default()
        },
        true,
    )
    .await;
    for _ in 0..3 {
        assert_eq!(s.req("GET", "/v1/agents", Some(ALICE), None).await.0, 200);
    }
    let (code, v, h) = s.req("GET", "/v1/agents", Some(ALICE), None).await;
    assert_eq!(code, 429);
    assert_eq!(v["error"]["kind"], "rate_limited");
    assert!(h["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    // Bob has his own bucket. One subscriber per run: the second is refused.
    let (_, v, _) = s.submit("/v1/runs", Some(BOB), "slow").await;
    let id = v["run_id"].as_str().unwrap().to_string();
    let first = s
        .http
        .get(format!("{}/v1/runs/{id}/events", s.base))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let (code, v, h) = s
        .req("GET", &format!("/v1/runs/{id}/events"), Some(BOB), None)
        .await;
    assert_eq!(code, 429, "{v}");
    assert_eq!(v["error"]["kind"], "too_many_subscribers");
    assert!(h.contains_key("retry-after"));
    drop(first);
}

#[tokio::test]
async fn draining_refuses_new_runs_and_readiness() {
    let s = start(ServerConfig::default(), false).await;
    assert_eq!(s.req("GET", "/readyz", None, None).await.0, 200);
    assert_eq!(s.req("GET", "/healthz", None, None).await.0, 200);
    s.server.start_draining();
    let (code, v, _) = s.req("GET", "/readyz", None, None).await;
    assert_eq!(code, 503);
    assert_eq!(v["status"], "draining");
    let (code, v, h) = s.submit("/v1/runs", None, "quick").await;
    assert_eq!(code, 503);
    assert_eq!(v["error"]["kind"], "shutting_down");
    assert!(h.contains_key("retry-after"));
    assert_eq!(s.req("GET", "/healthz", None, None).await.0, 200);
}

#[tokio::test]
async fn the_openapi_document_covers_the_routes() {
    let s = start(ServerConfig::default(), false).await;
    let (code, doc, _) = s.req("GET", "/openapi.json", None, None).await;
    assert_eq!(code, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for p in [
        "/v1/runs",
        "/v1/runs/{id}",
        "/v1/runs/{id}/events",
        "/v1/events",
        "/v1/runs/{id}/kill",
        "/v1/agents",
        "/healthz",
    ] {
        assert!(doc["paths"].get(p).is_some(), "{p} missing");
    }
    assert!(doc["components"]["schemas"].get("SubmitRun").is_some());
    assert!(doc["components"]["securitySchemes"].get("bearer").is_some());
}

#[tokio::test]
async fn the_metrics_scrape_parses_and_counts_runs() {
    let s = start(ServerConfig::default(), false).await;
    // The recorder is installed with the first scrape; counting starts then.
    assert_eq!(
        s.http
            .get(format!("{}/metrics", s.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for _ in 0..3 {
        s.submit("/v1/runs?wait=5", None, "quick").await;
    }
    let text = s.metrics_text().await;
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the scrape parses");
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    assert!(
        value("agentvisor_runs_total", Some(("status", "ok"))) >= 3.0,
        "{text}"
    );
    assert!(
        value("agentvisor_tokens_total", Some(("kind", "input"))) >= 30.0,
        "{text}"
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "agentvisor_active_runs"),
        "{text}"
    );
    assert!(
        text.contains("agentvisor_model_call_duration_seconds_bucket"),
        "{text}"
    );
}

/// Reads one answer's head (and as much body as came with it) from `c`;
/// empty when the server closed the connection without answering.
async fn read_answer(c: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = c.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= len {
                break;
            }
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stalls_mid_body_or_mid_headers_does_not_hold_its_connection() {
    use tokio::io::AsyncWriteExt;
    let config = ServerConfig {
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        ..ServerConfig::default()
    };
    let s = start(config, false).await;
    let addr = s.base.strip_prefix("http://").unwrap().to_string();

    // Half a body, then nothing: 408 in the error shape once the body
    // timeout has passed, not before.
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let t0 = tokio::time::Instant::now();
    c.write_all(b"POST /v1/runs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{\"agent\":")
        .await
        .unwrap();
    let answer = read_answer(&mut c).await;
    let waited = t0.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"body_unreadable\""), "{answer}");
    assert!(
        waited >= Duration::from_secs(30),
        "answered after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(31),
        "answered after {waited:?}"
    );

    // A whole body on the same terms is read at once and answered.
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = br#"{"agent":"quick","input":"hi"}"#;
    let t0 = tokio::time::Instant::now();
    c.write_all(
        format!(
            "POST /v1/runs?wait=10 HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    c.write_all(body).await.unwrap();
    let answer = read_answer(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    // Half the headers, then nothing: the connection is closed once the
    // header timeout has passed.
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let t0 = tokio::time::Instant::now();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost:")
        .await
        .unwrap();
    let answer = read_answer(&mut c).await;
    let waited = t0.elapsed();
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(waited >= Duration::from_secs(10), "closed after {waited:?}");
    assert!(waited < Duration::from_secs(11), "closed after {waited:?}");
}

/// Each call 600 tokens, four in all; each run may spend 1 000.
const BUDGETED: &str = r#"
name: budgeted
tools: [echo]
budget: { tokens: 1000 }
script:
  - { tool: echo, args: { text: one }, usage: { input: 500, output: 100 } }
  - { tool: echo, args: { text: two }, usage: { input: 500, output: 100 } }
  - { tool: echo, args: { text: three }, usage: { input: 500, output: 100 } }
  - { text: "done", usage: { input: 500, output: 100 } }
"#;

#[tokio::test]
async fn budgets_hold_on_the_server_whatever_the_models_speed() {
    // A scripted model answers at once: the run itself must stop it.
    let (host, store) = support::host().await;
    let s = support::loopback::start(host, store, &[QUICK, BUDGETED], false).await;
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs?wait=10",
            None,
            Some(json!({"agent": "budgeted"})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"], "budget_exceeded", "{v}");
    assert_eq!(v["result"]["kill_reason"], "budget", "{v}");
    let used = &v["result"]["usage"];
    let total = used["input_tokens"].as_u64().unwrap() + used["output_tokens"].as_u64().unwrap();
    assert_eq!(total, 1200, "the reply that passed 1 000 was the last: {v}");

    // The request's own budget_tokens, on an agent without one.
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs?wait=10",
            None,
            Some(json!({"agent": "quick", "input": "hi", "budget_tokens": 10})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"], "budget_exceeded", "{v}");

    // A zero budget is refused like any invalid body.
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs",
            None,
            Some(json!({"agent": "quick", "budget_tokens": 0})),
        )
        .await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(v["error"]["kind"], "invalid_body", "{v}");
}

#[tokio::test]
async fn a_run_with_nothing_to_answer_on_a_real_model_is_a_400() {
    // A real provider at an address nothing listens on: a call would end
    // the run `transport`; the refusal comes before any.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let real = format!("name: real\nmodel: openai:local\nbase_url: {closed}\n");
    let bare_scripted = "name: bare\nmodel: scripted\nscript:\n  - { text: ok }\n";
    let s = start_manifests(&[&real, bare_scripted]).await;
    let (code, v, _) = s
        .req("POST", "/v1/runs", None, Some(json!({"agent": "real"})))
        .await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["kind"], "no_input");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("prompt:") && message.contains("input"),
        "{v}"
    );
    // The scripted model still runs without an input.
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/runs?wait=10",
            None,
            Some(json!({"agent": "bare"})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"], "ok");
}

async fn start_manifests(manifests: &[&str]) -> Running {
    let (host, store) = support::host().await;
    support::loopback::start_with(host, store, manifests, false, ServerConfig::default()).await
}
