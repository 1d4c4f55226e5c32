//! Chat sessions over HTTP: create, send messages (answers as event
//! streams), read state and history, one message at a time (`session_busy`
//! or `on_busy: wait`), close and remove, and who may use whose session.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use support::loopback::{events_of, read_sse, Running, ALICE, BOB, ROOT};

const CHAT: &str = r#"
name: chat
model: scripted
script:
  - { text: "hello Ada" }
  - { text: "your name is Ada" }
"#;

const SLOW_CHAT: &str = r#"
name: slowchat
model: scripted
tools: [sleep]
limits: { max_runtime: 120s, stall_timeout: 120s }
script:
  - { tool: sleep, args: { ms: 60000 } }
  - { text: "second" }
  - { text: "third" }
"#;

async fn start(auth: bool) -> Running {
    let (host, store) = support::host().await;
    support::loopback::start(host, store, &[CHAT, SLOW_CHAT], auth).await
}

/// `POST /v1/sessions` of `body`: its status, body and headers.
async fn create(s: &Running, token: Option<&str>, body: Value) -> (u16, Value, HeaderMap) {
    s.req("POST", "/v1/sessions", token, Some(body)).await
}

/// A message `text` to session `id`, not yet sent.
fn message(s: &Running, id: &str, token: Option<&str>, text: &str) -> reqwest::RequestBuilder {
    s.request(
        "POST",
        &format!("/v1/sessions/{id}/messages"),
        token,
        Some(json!({ "text": text })),
    )
}

/// Sends a message and reads its whole answer stream.
async fn say(s: &Running, id: &str, token: Option<&str>, text: &str) -> (u16, Vec<Value>, String) {
    let resp = message(s, id, token, text).send().await.unwrap();
    let code = resp.status().as_u16();
    let run_id = resp
        .headers()
        .get("run-id")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    if code != 200 {
        let v: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        return (code, vec![v], run_id);
    }
    let frames = read_sse(resp, 10_000).await;
    // Records carry their seq as the frame id; deltas carry none.
    for f in frames.iter().filter(|f| !f.comment) {
        let v: Value = serde_json::from_str(&f.data).unwrap();
        if v["type"] != "text.delta" && v["type"] != "error" {
            assert_eq!(f.id.as_deref(), Some(v["seq"].to_string().as_str()), "{v}");
        }
    }
    (code, events_of(&frames), run_id)
}

#[tokio::test]
async fn a_session_keeps_its_conversation() {
    let s = start(false).await;
    let (code, v, h) = create(&s, None, json!({"agent": "chat"})).await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["state"], "created");
    assert_eq!(v["on_busy"], "refuse");
    assert_eq!(v["messages"], json!([]));
    let id = v["session_id"].as_str().unwrap().to_string();
    assert_eq!(h["location"], format!("/v1/sessions/{id}").as_str());

    let (code, events, run_id) = say(&s, &id, None, "my name is Ada").await;
    assert_eq!(code, 200);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run.end", "{events:?}");
    assert_eq!(last["status"], "ok");
    assert_eq!(last["output"], "hello Ada");
    assert!(events.iter().all(|e| e["run_id"] == run_id.as_str()));

    // The stream ended once the turn was kept: it reads back at once.
    let (code, v, _) = s
        .req("GET", &format!("/v1/sessions/{id}"), None, None)
        .await;
    assert_eq!(code, 200);
    assert_eq!(v["state"], "idle");
    assert_eq!(v["prompts"], 1);
    assert_eq!(v["last_run_id"], run_id.as_str());
    assert_eq!(v["current_run_id"], Value::Null);
    let turns: Vec<(String, String)> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        turns,
        [
            ("user".to_string(), "my name is Ada".to_string()),
            ("assistant".to_string(), "hello Ada".to_string())
        ]
    );

    let (_, events, run2) = say(&s, &id, None, "what is my name?").await;
    assert_eq!(events.last().unwrap()["output"], "your name is Ada");
    assert_ne!(run2, run_id);
    // The message's run is a run like any other.
    let (code, run, _) = s.req("GET", &format!("/v1/runs/{run2}"), None, None).await;
    assert_eq!(code, 200);
    assert_eq!(run["status"], "ok");
    let (_, v, _) = s
        .req("GET", &format!("/v1/sessions/{id}"), None, None)
        .await;
    assert_eq!(v["messages"].as_array().unwrap().len(), 4);
    assert_eq!(v["messages"][3]["seq"], 3);

    // Closed: history kept, messages refused.
    let (code, v, _) = s
        .req("POST", &format!("/v1/sessions/{id}/close"), None, None)
        .await;
    assert_eq!(code, 200);
    assert_eq!(v["state"], "closed");
    assert_eq!(v["messages"].as_array().unwrap().len(), 4);
    let (code, v, _) = say(&s, &id, None, "hello?").await;
    assert_eq!(code, 409);
    assert_eq!(v[0]["error"]["kind"], "session_closed");

    // Removed: gone.
    let (code, _, _) = s
        .req("DELETE", &format!("/v1/sessions/{id}"), None, None)
        .await;
    assert_eq!(code, 204);
    let (code, v, _) = s
        .req("GET", &format!("/v1/sessions/{id}"), None, None)
        .await;
    assert_eq!(code, 404);
    assert_eq!(v["error"]["kind"], "not_found");
}

#[tokio::test]
async fn a_second_message_while_one_runs_is_refused_or_waits() {
    let s = start(false).await;
    // Refused (the default).
    let (_, v, _) = create(&s, None, json!({"agent": "slowchat", "id": "busy-1"})).await;
    assert_eq!(v["session_id"], "busy-1");
    let first = message(&s, "busy-1", None, "take your time")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let (_, v, _) = s.req("GET", "/v1/sessions/busy-1", None, None).await;
    assert_eq!(v["state"], "running");
    assert!(v["current_run_id"].is_string(), "{v}");
    let (code, v, _) = say(&s, "busy-1", None, "are you there?").await;
    assert_eq!(code, 409);
    assert_eq!(v[0]["error"]["kind"], "session_busy");
    // Closing cancels the message in flight; its stream ends with it.
    let (code, _, _) = s.req("POST", "/v1/sessions/busy-1/close", None, None).await;
    assert_eq!(code, 200);
    let events = events_of(&read_sse(first, 10_000).await);
    let end = events.last().unwrap();
    assert_eq!(end["type"], "run.end");
    assert_eq!(end["status"], "cancelled");

    // Waits: the second message runs once the first has ended.
    let (code, v, _) = create(
        &s,
        None,
        json!({"agent": "slowchat", "id": "busy-2", "on_busy": "wait"}),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["on_busy"], "wait");
    let first = message(&s, "busy-2", None, "take your time")
        .send()
        .await
        .unwrap();
    let first_run = first.headers()["run-id"].to_str().unwrap().to_string();
    let mut second = tokio::spawn({
        let req = message(&s, "busy-2", None, "and now?");
        async move { req.send().await.unwrap() }
    });
    // The second waits for the gate: no answer while the first runs.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut second)
            .await
            .is_err(),
        "the second message was answered while the first ran"
    );
    let (code, _, _) = s
        .req("POST", &format!("/v1/runs/{first_run}/kill"), None, None)
        .await;
    assert_eq!(code, 202);
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.status(), 200);
    let second_run = second.headers()["run-id"].to_str().unwrap().to_string();
    assert_ne!(second_run, first_run);
    let events = events_of(&read_sse(second, 10_000).await);
    let end = events.last().unwrap();
    assert_eq!(end["status"], "ok", "{events:?}");
    assert_eq!(end["output"], "second");
    let (_, v, _) = s.req("GET", "/v1/sessions/busy-2", None, None).await;
    // The killed message was not kept; the second was.
    assert_eq!(v["prompts"], 1);
    assert_eq!(v["messages"][0]["content"], "and now?");
}

/// The tag a caller's session ids are stored under: `c`, the first 16 hex
/// digits of the SHA-256 of the caller id, `:`.
fn caller_tag(caller: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(caller.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("c{hex}:")
}

#[tokio::test]
async fn a_session_is_its_creators() {
    let s = start(true).await;
    let (code, _, _) = create(&s, None, json!({"agent": "chat"})).await;
    assert_eq!(code, 401);
    let (code, v, _) = create(
        &s,
        Some(ALICE),
        json!({"agent": "chat", "id": "alice-chat"}),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["caller_id"], "alice");
    // Bob: 404 everywhere, as for no such session.
    for (method, path) in [
        ("GET", "/v1/sessions/alice-chat"),
        ("POST", "/v1/sessions/alice-chat/close"),
        ("DELETE", "/v1/sessions/alice-chat"),
    ] {
        let (code, v, _) = s.req(method, path, Some(BOB), None).await;
        assert_eq!(code, 404, "{method} {path}: {v}");
    }
    let (code, _, _) = say(&s, "alice-chat", Some(BOB), "hi").await;
    assert_eq!(code, 404);
    // Ids are per caller: creating one that Alice uses answers as for
    // any fresh id (nothing tells Bob hers exists), and makes his own.
    let (code, v, h) = create(&s, Some(BOB), json!({"agent": "chat", "id": "alice-chat"})).await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["session_id"], "alice-chat");
    assert_eq!(v["caller_id"], "bob");
    assert_eq!(h["location"], "/v1/sessions/alice-chat");
    let (code, _, _) = say(&s, "alice-chat", Some(BOB), "hi").await;
    assert_eq!(code, 200);
    let (_, v, _) = s
        .req("GET", "/v1/sessions/alice-chat", Some(BOB), None)
        .await;
    assert_eq!(v["prompts"], 1, "{v}");
    let (_, v, _) = s
        .req("GET", "/v1/sessions/alice-chat", Some(ALICE), None)
        .await;
    assert_eq!(v["caller_id"], "alice");
    assert_eq!(
        v["prompts"], 0,
        "Bob's message is not in Alice's session: {v}"
    );
    // Bob's delete removes his, not hers.
    let (code, _, _) = s
        .req("DELETE", "/v1/sessions/alice-chat", Some(BOB), None)
        .await;
    assert_eq!(code, 204);
    let (code, _, _) = s
        .req("GET", "/v1/sessions/alice-chat", Some(BOB), None)
        .await;
    assert_eq!(code, 404);
    // Alice reopens hers (200); the admin sees it by its stored id (her
    // tag, then her id).
    let (code, _, _) = create(
        &s,
        Some(ALICE),
        json!({"agent": "chat", "id": "alice-chat"}),
    )
    .await;
    assert_eq!(code, 200);
    let stored = format!("{}alice-chat", caller_tag("alice"));
    let (code, v, _) = s
        .req("GET", &format!("/v1/sessions/{stored}"), Some(ROOT), None)
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["caller_id"], "alice");
    assert_eq!(v["session_id"], stored.as_str());
    // Her message's run is hers.
    let (code, events, run_id) = say(&s, "alice-chat", Some(ALICE), "hi").await;
    assert_eq!(code, 200);
    assert_eq!(events.last().unwrap()["status"], "ok");
    let (code, _, _) = s
        .req("GET", &format!("/v1/runs/{run_id}"), Some(BOB), None)
        .await;
    assert_eq!(code, 404);
    let (code, run, _) = s
        .req("GET", &format!("/v1/runs/{run_id}"), Some(ALICE), None)
        .await;
    assert_eq!(code, 200);
    assert_eq!(run["caller_id"], "alice");
}

#[tokio::test]
async fn a_session_kept_under_its_bare_id_is_still_its_creators() {
    // Sessions created before ids were per caller are kept under their
    // bare ids: their owner still finds them, nobody else does.
    let s = start(true).await;
    let (code, v, _) = create(&s, Some(ALICE), json!({"agent": "chat", "id": "old-chat"})).await;
    assert_eq!(code, 201, "{v}");
    let store = s.host.session_store().clone();
    let tagged = format!("{}old-chat", caller_tag("alice"));
    let mut meta = store
        .get(&tagged)
        .await
        .unwrap()
        .expect("stored under her tag");
    assert!(store.remove(&tagged).await.unwrap());
    meta.id = "old-chat".to_string();
    store.create(&meta).await.unwrap();

    let (code, v, _) = s
        .req("GET", "/v1/sessions/old-chat", Some(ALICE), None)
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["session_id"], "old-chat");
    assert_eq!(v["caller_id"], "alice");
    let (code, events, _) = say(&s, "old-chat", Some(ALICE), "hi").await;
    assert_eq!(code, 200);
    assert_eq!(events.last().unwrap()["status"], "ok");
    // Bob: 404, as for no such session, on every route.
    for (method, path) in [
        ("GET", "/v1/sessions/old-chat"),
        ("POST", "/v1/sessions/old-chat/close"),
        ("DELETE", "/v1/sessions/old-chat"),
    ] {
        let (code, v, _) = s.req(method, path, Some(BOB), None).await;
        assert_eq!(code, 404, "{method} {path}: {v}");
    }
    let (code, _, _) = say(&s, "old-chat", Some(BOB), "hi").await;
    assert_eq!(code, 404);
    // Alice's delete removes it.
    let (code, _, _) = s
        .req("DELETE", "/v1/sessions/old-chat", Some(ALICE), None)
        .await;
    assert_eq!(code, 204);
    assert!(store.get("old-chat").await.unwrap().is_none());
}

#[tokio::test]
async fn bad_requests_name_what_is_wrong() {
    let s = start(false).await;
    let (code, v, _) = create(&s, None, json!({"agent": "nope"})).await;
    assert_eq!(code, 404);
    assert_eq!(v["error"]["kind"], "unknown_agent");
    let (code, v, _) = create(&s, None, json!({"agent": "chat", "id": "a b"})).await;
    assert_eq!(code, 422);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`id`"),
        "{v}"
    );
    let (code, v, _) = create(&s, None, json!({"agent": "chat", "on_busy": "sometimes"})).await;
    assert_eq!(code, 422, "{v}");
    let (code, v, _) = create(&s, None, json!({"agent": "chat", "id": "same"})).await;
    assert_eq!(code, 201, "{v}");
    let (code, v, _) = create(&s, None, json!({"agent": "slowchat", "id": "same"})).await;
    assert_eq!(code, 409);
    assert_eq!(v["error"]["kind"], "session_agent_mismatch");
    let (code, v, _) = say(&s, "same", None, "  ").await;
    assert_eq!(code, 422);
    assert!(v[0]["error"]["message"].as_str().unwrap().contains("text"));
    let (code, _, _) = say(&s, "no-such-session", None, "hi").await;
    assert_eq!(code, 404);
    let (code, _, _) = s.req("GET", "/v1/sessions/..%2Fetc", None, None).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn the_session_routes_are_in_the_openapi_document() {
    let s = start(false).await;
    let (code, doc, _) = s.req("GET", "/openapi.json", None, None).await;
    assert_eq!(code, 200);
    for (path, method) in [
        ("/v1/sessions", "post"),
        ("/v1/sessions/{id}", "get"),
        ("/v1/sessions/{id}", "delete"),
        ("/v1/sessions/{id}/messages", "post"),
        ("/v1/sessions/{id}/close", "post"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{method} {path}");
    }
    let view = &doc["components"]["schemas"]["SessionView"]["properties"];
    assert!(view["messages"].is_object() && view["state"].is_object());
}
