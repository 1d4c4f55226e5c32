#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! A session's prompt on a streaming model is supervised as a plain run
//! is, on paused time: streamed pieces are heartbeats (a long answer is not
//! `stalled`), the wait for the first token has its own bound
//! (`first_token_timeout`), and a prompt killed mid-stream keeps the text
//! it received.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::{KillReason, RunStatus, SessionOptions};
use support::streaming::{streamer, Streamer};

async fn session_on(model: Arc<Streamer>, limits: &str) -> (agentvisor::Host, agentvisor::Session) {
    let (host, _) = support::host_from(support::builder().model("streamer", model)).await;
    let spec = support::spec(&format!("name: chat\nmodel: streamer\nlimits: {limits}\n"));
    let session = host
        .open_session(spec, SessionOptions::default())
        .await
        .unwrap();
    (host, session)
}

#[tokio::test(start_paused = true)]
async fn a_long_streamed_answer_in_a_session_is_not_stalled() {
    // 12 pieces 500 ms apart: 5.5 s of streaming with a 2 s stall bound.
    let (host, session) =
        session_on(streamer(Some(100), 12, 500, false), "{ stall_timeout: 2s }").await;
    let r = session.prompt("go").await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.critic.is_empty(), "{:?}", r.critic);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_session_prompt_waits_for_its_first_token_under_its_own_bound() {
    // Never a first token: killed at `first_token_timeout`, said so.
    let (host, session) = session_on(
        streamer(None, 0, 0, false),
        "{ stall_timeout: 1s, first_token_timeout: 3s }",
    )
    .await;
    let t0 = tokio::time::Instant::now();
    let r = session.prompt("go").await.unwrap();
    assert!(t0.elapsed() >= Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(r.kill_reason, Some(KillReason::Stalled), "{r:?}");
    assert_eq!(r.error_kind.as_deref(), Some("first_token_timeout"));
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_session_prompt_that_stalls_mid_stream_keeps_its_text() {
    let (host, session) = session_on(
        streamer(Some(500), 4, 100, true),
        "{ stall_timeout: 1s, first_token_timeout: 3s }",
    )
    .await;
    let r = session.prompt("go").await.unwrap();
    assert_eq!(r.kill_reason, Some(KillReason::Stalled), "{r:?}");
    assert_eq!(r.error_kind.as_deref(), Some("stalled"));
    assert_eq!(r.output.as_deref(), Some("The answer is five, "));
    host.shutdown().await;
}
