#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Keep-alives are not progress: a streaming server (OpenAI-compatible or
//! Anthropic) that holds a request open and sends only `: ping` comments,
//! or events that carry nothing (an empty delta, Anthropic's `ping`), is
//! killed `stalled` at the run's stall bound — `first_token_timeout` before
//! any content, `stall_timeout` after some — not kept alive to its hard
//! deadline. Events with content still are heartbeats. A stream cut so
//! counts the tokens that arrived: the server's usage where it sent one
//! (Anthropic's `message_start`), else an estimate, marked `estimated`.
//!
//! Real sockets, so real time: the bounds are short (300 ms stall, 600 ms
//! first token) against a hard deadline of seconds, and the assertions are
//! about the kill's reason and that it came well before that deadline.

mod provider_wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentvisor::ports::model::ChatModel;
use agentvisor::providers::{
    AnthropicConfig, AnthropicModel, OpenAiConfig, OpenAiModel, StreamMode,
};
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, KillReason, RunResult, RunStatus};
use provider_wire::{serve, Reply};
use serde_json::json;

/// How often the servers here send their keep-alives.
const EVERY: Duration = Duration::from_millis(50);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Wire {
    OpenAi,
    Anthropic,
}

/// An OpenAI chunk with this delta.
fn openai_chunk(delta: serde_json::Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})
    )
}

fn anthropic_event(name: &str, data: serde_json::Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// What a server sends before its keep-alives: nothing but the opening
/// (OpenAI's role chunk, Anthropic's `message_start`), or an answer's
/// first word too (`Hello`).
fn head(wire: Wire, with_text: bool) -> Vec<String> {
    match wire {
        Wire::OpenAi => {
            let mut h = vec![openai_chunk(json!({"role": "assistant", "content": ""}))];
            if with_text {
                h.push(openai_chunk(json!({"content": "Hello"})));
            }
            h
        }
        Wire::Anthropic => {
            let mut h = vec![anthropic_event(
                "message_start",
                json!({"type": "message_start", "message": {"id": "m1", "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}}),
            )];
            if with_text {
                h.push(anthropic_event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ));
                h.push(anthropic_event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
                ));
            }
            h
        }
    }
}

/// The keep-alives of each kind a server may send.
fn keep_alives(wire: Wire) -> Vec<(&'static str, String)> {
    let mut k = vec![("comment", ": ping\n\n".to_string())];
    match wire {
        Wire::OpenAi => {
            k.push(("empty delta", openai_chunk(json!({}))));
            k.push(("empty content", openai_chunk(json!({"content": ""}))));
        }
        Wire::Anthropic => {
            k.push((
                "ping event",
                anthropic_event("ping", json!({"type": "ping"})),
            ));
            k.push((
                "empty text delta",
                anthropic_event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}),
                ),
            ));
        }
    }
    k
}

/// One streamed run against `reply`, with a 300 ms stall bound, a 600 ms
/// first-token bound and a hard deadline of `hard`.
async fn run_against(wire: Wire, reply: Reply, hard: &str) -> (RunResult, Duration) {
    let server = serve(vec![reply]).await;
    let model: Arc<dyn ChatModel> = match wire {
        Wire::OpenAi => {
            let mut c = OpenAiConfig::new("m", &server.base_url);
            c.stream = StreamMode::Always;
            Arc::new(OpenAiModel::new(c))
        }
        Wire::Anthropic => {
            let mut c = AnthropicConfig::new("m", &server.base_url);
            c.stream = StreamMode::Always;
            Arc::new(AnthropicModel::new(c))
        }
    };
    let host = Host::builder()
        .config(HostConfig {
            critic_shards: 1,
            ..HostConfig::default()
        })
        .model("wire", model)
        .build()
        .await
        .unwrap();
    let spec = AgentSpec::from_yaml(&format!(
        "name: keepalive\nmodel: wire\nprompt: hi\n\
         limits: {{ max_runtime: {hard}, soft_timeout: 1h, hard_timeout: {hard}, stall_timeout: 300ms, first_token_timeout: 600ms }}\n"
    ))
    .unwrap();
    let t0 = Instant::now();
    let r = host.execute(spec, Invocation::default()).await.unwrap();
    let took = t0.elapsed();
    host.shutdown().await;
    (r, took)
}

#[tokio::test]
async fn keep_alives_before_the_first_token_do_not_end_its_wait() {
    for wire in [Wire::OpenAi, Wire::Anthropic] {
        for (kind, keep) in keep_alives(wire) {
            let reply = Reply::SseKeepAlive {
                head: head(wire, false),
                keep,
                every: EVERY,
            };
            let (r, took) = run_against(wire, reply, "5s").await;
            let case = format!("{wire:?}, {kind}: {took:?} {r:?}");
            assert_eq!(r.status, RunStatus::Killed, "{case}");
            assert_eq!(r.kill_reason, Some(KillReason::Stalled), "{case}");
            assert_eq!(
                r.error_kind.as_deref(),
                Some("first_token_timeout"),
                "{case}"
            );
            // The first-token bound (600 ms), not the stall bound (300 ms),
            // and far from the hard deadline (5 s).
            assert!(took >= Duration::from_millis(550), "{case}");
            assert!(took < Duration::from_millis(2500), "{case}");
        }
    }
}

#[tokio::test]
async fn keep_alives_after_some_text_are_a_stall() {
    for wire in [Wire::OpenAi, Wire::Anthropic] {
        for (kind, keep) in keep_alives(wire) {
            let reply = Reply::SseKeepAlive {
                head: head(wire, true),
                keep,
                every: EVERY,
            };
            let (r, took) = run_against(wire, reply, "5s").await;
            let case = format!("{wire:?}, {kind}: {took:?} {r:?}");
            assert_eq!(r.status, RunStatus::Killed, "{case}");
            assert_eq!(r.kill_reason, Some(KillReason::Stalled), "{case}");
            assert_eq!(r.error_kind.as_deref(), Some("stalled"), "{case}");
            assert_eq!(r.output.as_deref(), Some("Hello"), "{case}");
            assert!(took < Duration::from_millis(2500), "{case}");
            // The cut call is charged what arrived.
            assert!(r.usage.output_tokens >= 1, "{case}");
            assert!(r.usage.estimated, "{case}");
            match wire {
                // Reported in `message_start`.
                Wire::Anthropic => assert_eq!(r.usage.input_tokens, 5, "{case}"),
                // Estimated over the request ("hi").
                Wire::OpenAi => assert!(r.usage.input_tokens >= 1, "{case}"),
            }
        }
    }
}

#[tokio::test]
async fn content_that_keeps_coming_is_a_heartbeat() {
    // A word every 50 ms, never a last one: alive until the hard deadline.
    for wire in [Wire::OpenAi, Wire::Anthropic] {
        let keep = match wire {
            Wire::OpenAi => openai_chunk(json!({"content": "la "})),
            Wire::Anthropic => anthropic_event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "la "}}),
            ),
        };
        let reply = Reply::SseKeepAlive {
            head: head(wire, true),
            keep,
            every: EVERY,
        };
        let (r, took) = run_against(wire, reply, "1500ms").await;
        let case = format!("{wire:?}: {took:?} {r:?}");
        assert_eq!(r.status, RunStatus::Timeout, "{case}");
        assert_eq!(r.kill_reason, Some(KillReason::Deadline), "{case}");
        assert!(r.output.as_deref().unwrap().starts_with("Hello"), "{case}");
    }
}
