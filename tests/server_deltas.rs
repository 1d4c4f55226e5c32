//! Streamed text on the server's event streams: a run's `text.delta`s reach
//! a client that subscribed after the run (and its model call) started, on
//! `GET /v1/runs/{id}/events` and on a session's message stream, without an
//! `id:` (they are not records), and concatenate to the answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::{json, Value};
use support::loopback::{events_of, read_sse, Frame, Running};

/// An answer written while the client is already listening: the model
/// call starts at submission, its text arrives a second later.
const TALKER: &str = r#"
name: talker
model: scripted
prompt: talk
script:
  - { text: "one two three four five six", latency: 1s }
"#;

/// A session whose answer comes a second after the message.
const CHATTER: &str = r#"
name: chatter
model: scripted
script:
  - { text: "hello there, how are you today", latency: 1s }
"#;

async fn start() -> Running {
    let (host, store) = support::host().await;
    support::loopback::start(host, store, &[TALKER, CHATTER], false).await
}

/// The deltas of a stream's frames (each checked to carry no `id:`), and
/// its events.
fn deltas(frames: &[Frame]) -> (Vec<String>, Vec<Value>) {
    let mut out = Vec::new();
    for f in frames.iter().filter(|f| !f.comment) {
        let v: Value = serde_json::from_str(&f.data).unwrap();
        if v["type"] == "text.delta" {
            assert_eq!(f.id, None, "a delta is not a record: {f:?}");
            out.push(v["text"].as_str().unwrap().to_string());
        }
    }
    (out, events_of(frames))
}

#[tokio::test]
async fn a_runs_event_stream_carries_its_text_deltas() {
    let s = start().await;
    let (code, v, _) = s.submit("/v1/runs", None, "talker").await;
    assert_eq!(code, 201, "{v}");
    let id = v["run_id"].as_str().unwrap().to_string();
    let resp = s
        .request("GET", &format!("/v1/runs/{id}/events"), None, None)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (pieces, evs) = deltas(&read_sse(resp, 1000).await);
    let end = evs.last().unwrap();
    assert_eq!(end["type"], "run.end", "{evs:?}");
    assert_eq!(end["status"], "ok", "{end}");
    assert!(pieces.len() > 1, "no streamed text: {evs:?}");
    assert_eq!(pieces.concat(), "one two three four five six");
    // Deltas come before the step's record of the answer.
    let first_delta = evs.iter().position(|e| e["type"] == "text.delta").unwrap();
    let finish = evs.iter().position(|e| e["type"] == "step.finish").unwrap();
    assert!(first_delta < finish, "{evs:?}");
    // Not in the audit log: a second read of the ended run has none.
    let resp = s
        .request("GET", &format!("/v1/runs/{id}/events"), None, None)
        .send()
        .await
        .unwrap();
    let (again, _) = deltas(&read_sse(resp, 1000).await);
    assert!(again.is_empty(), "{again:?}");
}

#[tokio::test]
async fn a_session_message_stream_carries_its_text_deltas() {
    let s = start().await;
    let (code, v, _) = s
        .req(
            "POST",
            "/v1/sessions",
            None,
            Some(json!({"agent": "chatter"})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let id = v["session_id"].as_str().unwrap().to_string();
    let resp = s
        .request(
            "POST",
            &format!("/v1/sessions/{id}/messages"),
            None,
            Some(json!({"text": "hi"})),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (pieces, evs) = deltas(&read_sse(resp, 1000).await);
    assert_eq!(evs.last().unwrap()["type"], "run.end", "{evs:?}");
    assert!(pieces.len() > 1, "no streamed text: {evs:?}");
    assert_eq!(pieces.concat(), "hello there, how are you today");
}
