//! Repeat detection compares tool arguments as canonical JSON: the same call
//! sent with different spacing and key order still counts as a repeat, is
//! steered at `repeat_limit` and killed `runaway` on the next one.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, ToolCallRequest};
use agentvisor::{CriticAction, Invocation, KillReason, RunStatus};
use async_trait::async_trait;

/// `add(1, 2)`, written a different way on every call.
const FORMS: [&str; 6] = [
    r#"{"a":1,"b":2}"#,
    r#"{ "a": 1, "b": 2 }"#,
    r#"{"b":2,"a":1}"#,
    "{\n  \"b\" : 2,\n  \"a\" : 1\n}",
    r#"  {"a" :1 ,"b":2}  "#,
    "{\t\"b\":2,\"a\":1}",
];

struct Respelling {
    calls: AtomicU32,
}

#[async_trait]
impl ChatModel for Respelling {
    fn name(&self) -> &str {
        "respelling"
    }

    async fn complete(&self, _request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) as usize;
        Ok(ChatResponse {
            text: String::new(),
            tool_calls: vec![ToolCallRequest {
                id: Arc::from(format!("call_{n}")),
                name: Arc::from("add"),
                arguments: Arc::from(FORMS[n % FORMS.len()]),
            }],
            usage: Default::default(),
            finish_reason: None,
        })
    }
}

#[tokio::test(start_paused = true)]
async fn the_same_call_respelled_is_steered_then_killed_runaway() {
    let spec = support::spec(
        r#"
name: respelled
model: respelling
tools: [add]
limits: { repeat_limit: 5, max_iterations: 20 }
# The same call with the same result: `same_observation` (at 4) and `poll`
# would see it first; this test is about `repeat`'s canonical hash.
critic: { loops: { same_observation: 0, poll: 0 } }
"#,
    );
    let model = Arc::new(Respelling {
        calls: AtomicU32::new(0),
    });
    let (host, _store) =
        support::host_from(support::builder().model("respelling", model.clone())).await;
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Killed, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Runaway));
    let decisions: Vec<CriticAction> = r.critic.iter().map(|d| d.action).collect();
    assert_eq!(decisions, [CriticAction::Steer, CriticAction::Kill]);
    assert_eq!(r.iterations, 6, "steer at the 5th call, kill at the 6th");
    // Every call was a different text: only the canonical form repeats.
    let args: std::collections::HashSet<&str> = r.steps.iter().map(|s| s.args.as_str()).collect();
    assert_eq!(args.len(), 6, "{args:?}");
    host.shutdown().await;
}
