#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Structured output (M7): a manifest's `output_schema` reaches the model,
//! a final answer must parse and validate, one repair turn on mismatch,
//! then `error`/`invalid_output` with the answer kept.

mod provider_wire;

use agentvisor::{AgentSpec, Host, Invocation, RunEvent, RunStatus};
use provider_wire::{serve, Reply};
use serde_json::json;

const SCHEMA: &str =
    r#"output_schema: { type: object, properties: { sum: { type: integer } }, required: [sum] }"#;

fn spec(script: &str) -> AgentSpec {
    AgentSpec::from_yaml(&format!("name: s\n{SCHEMA}\nscript:\n{script}")).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_mismatch_gets_one_repair_turn() {
    let host = Host::builder().build().await.unwrap();
    let (handle, mut events) = host
        .submit_streaming(
            spec("  - { text: \"five\" }\n  - { text: \"```json\\n{\\\"sum\\\": 5}\\n```\" }\n"),
            Invocation::prompt("2+3?"),
        )
        .await
        .unwrap();
    let mut repair = None;
    while let Some(e) = events.next().await.map(|e| e.event) {
        if let RunEvent::MessageCreate { role, text } = e {
            if role == "user" {
                repair = Some(text);
            }
        }
    }
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{:?}", r.error);
    assert_eq!(r.iterations, 2);
    assert!(r.output.unwrap().contains("\"sum\": 5"));
    let repair = repair.expect("a repair message");
    assert!(
        repair.contains("not JSON") && repair.contains("\"sum\""),
        "{repair}"
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_second_mismatch_ends_invalid_output_with_the_answer_kept() {
    let host = Host::builder().build().await.unwrap();
    let r = host
        .execute(
            spec("  - { text: \"five\" }\n  - { text: '{\"sum\": \"5\"}' }\n  - { text: '{\"sum\": 5}' }\n"),
            Invocation::prompt("2+3?"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("invalid_output"));
    assert_eq!(r.iterations, 2, "only one repair turn");
    assert_eq!(r.output.as_deref(), Some(r#"{"sum": "5"}"#));
    assert!(r.error.unwrap().contains("sum"));
    // A valid first answer needs no repair.
    let r = host
        .execute(
            spec("  - { text: '{\"sum\": 5}' }\n"),
            Invocation::prompt("2+3?"),
        )
        .await
        .unwrap();
    assert_eq!((r.status, r.iterations), (RunStatus::Ok, 1));
    host.shutdown().await;
}

#[test]
fn a_schema_that_does_not_compile_is_refused_at_parse() {
    let e = AgentSpec::from_yaml("name: s\noutput_schema: { type: 12 }\nscript: [{ text: x }]\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("output_schema") && e.contains("line 2"), "{e}");
}

#[tokio::test]
async fn the_schema_goes_to_an_openai_server_as_response_format() {
    let wire = serve(vec![Reply::ok(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"sum\": 5}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}
    }))])
    .await;
    let host = Host::builder().build().await.unwrap();
    let spec = AgentSpec::from_yaml(&format!(
        "name: s\nmodel: openai:loopback\nbase_url: {}\n{SCHEMA}\n",
        wire.base_url
    ))
    .unwrap();
    let r = host
        .execute(spec, Invocation::prompt("2+3?"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{:?}", r.error);
    let body = &wire.seen()[0].body;
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(
        body["response_format"]["json_schema"]["schema"]["required"][0],
        "sum"
    );
    host.shutdown().await;
}
