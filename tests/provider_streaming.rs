#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Signs of life from a streaming model, on paused time: every streamed
//! piece is a heartbeat (a long answer is not `stalled`), the wait for the
//! first token has its own bound (`first_token_timeout`, reported as its
//! own `error_kind`), and the text received so far is the result's output
//! when the run is killed, cancelled, timed out or stalls mid-stream.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::{Invocation, KillReason, RunStatus};
use support::streaming::{streamer, Streamer};
use tokio::time::Instant;

async fn run_on(
    model: Arc<Streamer>,
    limits: &str,
) -> (agentvisor::Host, agentvisor::RunHandle, Instant) {
    let (host, _) = support::host_from(support::builder().model("streamer", model)).await;
    let spec = support::spec(&format!(
        "name: s\nmodel: streamer\nlimits: {limits}\nprompt: go\n"
    ));
    let t0 = Instant::now();
    let handle = host.submit(spec, Invocation::default()).await.unwrap();
    (host, handle, t0)
}

#[tokio::test(start_paused = true)]
async fn a_long_answer_that_keeps_streaming_is_not_stalled() {
    // 12 pieces 500 ms apart: 5.5 s of streaming with a 2 s stall bound.
    let (host, handle, t0) =
        run_on(streamer(Some(100), 12, 500, false), "{ stall_timeout: 2s }").await;
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(t0.elapsed() >= Duration::from_millis(5600));
    assert!(r.critic.is_empty(), "{:?}", r.critic);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_queued_call_within_its_first_token_bound_is_not_stalled() {
    // 5 s in the server's queue, then a quick answer: the stall bound (1 s)
    // does not apply before the first token; `first_token_timeout` (10 s) does.
    let (host, handle, _) = run_on(
        streamer(Some(5000), 3, 100, false),
        "{ stall_timeout: 1s, first_token_timeout: 10s }",
    )
    .await;
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn no_first_token_is_told_apart_from_a_stall_mid_stream() {
    // Never a first token: killed at the first-token bound, said so.
    let (host, handle, t0) = run_on(
        streamer(None, 0, 0, false),
        "{ stall_timeout: 1s, first_token_timeout: 3s }",
    )
    .await;
    let r = handle.await;
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_millis(3100),
        "{waited:?}"
    );
    assert_eq!(r.status, RunStatus::Killed);
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    assert_eq!(r.error_kind.as_deref(), Some("first_token_timeout"));
    assert!(r.error.as_deref().unwrap().contains("first token"), "{r:?}");
    assert_eq!(r.critic[0].detail.as_deref(), Some("first_token_timeout"));
    host.shutdown().await;

    // Without `first_token_timeout` the bound is `stall_timeout`.
    let (host, handle, t0) = run_on(streamer(None, 0, 0, false), "{ stall_timeout: 2s }").await;
    let r = handle.await;
    assert!(t0.elapsed() < Duration::from_millis(2100));
    assert_eq!(r.error_kind.as_deref(), Some("first_token_timeout"));
    host.shutdown().await;

    // Tokens came, then nothing: a stall, and the text so far is the output.
    let (host, handle, t0) = run_on(
        streamer(Some(500), 4, 100, true),
        "{ stall_timeout: 1s, first_token_timeout: 3s }",
    )
    .await;
    let r = handle.await;
    assert!(
        t0.elapsed() < Duration::from_millis(2000),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    assert_eq!(r.error_kind.as_deref(), Some("stalled"));
    assert_eq!(r.output.as_deref(), Some("The answer is five, "));
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_kill_a_cancel_and_a_deadline_keep_the_text_streamed_so_far() {
    for how in ["kill", "cancel", "deadline"] {
        let (host, handle, _) = run_on(
            streamer(Some(100), 3, 100, true),
            "{ stall_timeout: 1h, max_runtime: 2s, soft_timeout: 1h, hard_timeout: 2s }",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        match how {
            "kill" => handle.kill(),
            "cancel" => handle.cancel(),
            _ => {}
        }
        let r = handle.await;
        let expected = match how {
            "kill" => RunStatus::Killed,
            "cancel" => RunStatus::Cancelled,
            _ => RunStatus::Timeout,
        };
        assert_eq!(r.status, expected, "{how}: {r:?}");
        assert_eq!(r.output.as_deref(), Some("The answer is "), "{how}");
        host.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_step_records_why_the_model_stopped() {
    let (host, store) =
        support::host_from(support::builder().model("streamer", streamer(Some(10), 2, 10, false)))
            .await;
    let spec = support::spec("name: s\nmodel: streamer\nprompt: go\n");
    let r = host
        .submit(spec, Invocation::default())
        .await
        .unwrap()
        .await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    host.shutdown().await;
    let reasons: Vec<Option<String>> = support::records(&store, r.run_id)
        .await
        .into_iter()
        .filter_map(|rec| match rec.entry {
            agentvisor::ports::audit::AuditEntry::Event(agentvisor::RunEvent::StepFinish {
                finish_reason,
                ..
            }) => Some(finish_reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, [Some("stop".to_string())]);
}
