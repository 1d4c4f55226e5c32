//! Chat sessions: history across prompts, one prompt at a time (wait or
//! `session_busy`), the lifecycle watch, cancelled and failed prompts,
//! reaching a session by its id.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::model::Role;
use agentvisor::{OnBusy, RunEvent, RunStatus, SessionOptions, SessionState};
use support::{builder, host_from, spec, RecordingModel};

/// A chat agent on the recording model: each prompt plays the next entry.
const CHAT: &str = r#"
name: chat
model: recorded
system: You remember what you are told.
script:
  - { text: "Hello Ada." }
  - { text: "Your name is Ada." }
  - { text: "Still Ada." }
"#;

async fn chat_host(yaml: &str) -> (agentvisor::Host, Arc<RecordingModel>) {
    let s = spec(yaml);
    let model = RecordingModel::new(&s);
    let (host, _) = host_from(builder().model("recorded", model.clone())).await;
    (host, model)
}

/// A host as [`chat_host`] makes it, and a new session of `yaml` on it.
async fn open_chat(yaml: &str) -> (agentvisor::Host, Arc<RecordingModel>, agentvisor::Session) {
    let (host, model) = chat_host(yaml).await;
    let chat = host
        .open_session(spec(yaml), SessionOptions::default())
        .await
        .unwrap();
    (host, model, chat)
}

fn roles_and_texts(messages: &[agentvisor::ports::model::Message]) -> Vec<(Role, String)> {
    messages
        .iter()
        .map(|m| (m.role, m.content.clone()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_prompt_sees_the_earlier_turns() {
    let (host, model, chat) = open_chat(CHAT).await;
    let first = chat.prompt("My name is Ada.").await.unwrap();
    assert_eq!(first.status, RunStatus::Ok);
    assert_eq!(first.output.as_deref(), Some("Hello Ada."));
    let second = chat.prompt("What is my name?").await.unwrap();
    assert_eq!(second.output.as_deref(), Some("Your name is Ada."));

    // The second run started from the system prompt, the first turn, then
    // the new prompt.
    assert_eq!(model.calls(), 2);
    assert_eq!(
        roles_and_texts(&model.request(1)),
        vec![
            (Role::System, "You remember what you are told.".into()),
            (Role::User, "My name is Ada.".into()),
            (Role::Assistant, "Hello Ada.".into()),
            (Role::User, "What is my name?".into()),
        ]
    );

    let history = chat.history().await.unwrap();
    assert_eq!(
        history.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(history[0].run_id, Some(first.run_id));
    assert_eq!(history[3].run_id, Some(second.run_id));
    assert_eq!(history[3].message.content, "Your name is Ada.");
    let meta = chat.meta().await.unwrap();
    assert_eq!((meta.prompts, meta.messages, meta.model_calls), (2, 4, 2));
    assert_eq!(meta.agent, "chat");
    assert_eq!(meta.last_run_id, Some(second.run_id));
    assert_eq!(meta.state, SessionState::Idle);

    // The runs are recorded with their session.
    let records = host.audit_store().run_records(second.run_id).await.unwrap();
    let started = serde_json::to_value(&records[0].entry).unwrap();
    assert_eq!(started["session_id"], chat.id(), "{started}");
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_prompt_leaves_the_history_as_it_was() {
    let yaml = r#"
name: chat
model: recorded
script:
  - { text: "one" }
  - { fail: bad_request }
  - { text: "three" }
"#;
    let (host, model, chat) = open_chat(yaml).await;
    chat.prompt("a").await.unwrap();
    let failed = chat.prompt("b").await.unwrap();
    assert_eq!(failed.status, RunStatus::Error);
    assert_eq!(chat.history().await.unwrap().len(), 2);
    assert_eq!(chat.state(), SessionState::Idle);
    let third = chat.prompt("c").await.unwrap();
    assert_eq!(third.output.as_deref(), Some("three"));
    // The failed prompt is not in the third run's transcript.
    let texts: Vec<String> = model.request(2).into_iter().map(|m| m.content).collect();
    assert_eq!(texts, vec!["a", "one", "c"]);
    let meta = chat.meta().await.unwrap();
    assert_eq!((meta.prompts, meta.messages, meta.model_calls), (2, 4, 3));
    host.shutdown().await;
}

const SLOW: &str = r#"
name: slow
model: recorded
script:
  - { text: "first", latency: 10s }
  - { text: "second", latency: 10s }
"#;

#[tokio::test(start_paused = true)]
async fn a_second_prompt_is_refused_while_one_runs() {
    let (host, _, chat) = open_chat(SLOW).await;
    let turn = chat.prompt_streaming("one").await.unwrap();
    // Another handle on the same session, by its id, refusing when busy.
    let other = host
        .session(chat.id())
        .await
        .unwrap()
        .on_busy(OnBusy::Refuse);
    let refused = other.prompt("two").await.unwrap_err();
    assert_eq!(refused.kind(), "session_busy");
    let first = turn.result().await.unwrap();
    assert_eq!(first.output.as_deref(), Some("first"));
    // Free again: the refusing handle gets its turn now.
    let second = other.prompt("two").await.unwrap();
    assert_eq!(second.output.as_deref(), Some("second"));
    assert_eq!(chat.history().await.unwrap().len(), 4);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_second_prompt_waits_for_the_first() {
    let (host, model, chat) = open_chat(SLOW).await;
    let first = tokio::spawn({
        let chat = chat.clone();
        async move { chat.prompt("one").await }
    });
    // The first prompt holds the session before the second asks.
    let mut watch = chat.watch();
    watch
        .wait_for(|s| *s == SessionState::Running)
        .await
        .unwrap();
    let second = tokio::spawn({
        let chat = chat.clone();
        async move { chat.prompt("two").await }
    });
    let first = first.await.unwrap().unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(first.output.as_deref(), Some("first"));
    assert_eq!(second.output.as_deref(), Some("second"));
    assert!(second.started_at >= first.finished_at);
    // The waiting prompt ran after the first was stored, with its turn.
    let texts: Vec<String> = model.request(1).into_iter().map(|m| m.content).collect();
    assert_eq!(texts, vec!["one", "first", "two"]);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_lifecycle_can_be_watched() {
    let (host, _) = chat_host(SLOW).await;
    let chat = host
        .open_session(spec(SLOW), SessionOptions::id("watched"))
        .await
        .unwrap();
    assert_eq!(chat.id(), "watched");
    let mut watch = chat.watch();
    assert_eq!(*watch.borrow(), SessionState::Created);
    assert_eq!(
        chat.meta().await.unwrap().state,
        SessionState::Created,
        "the store has the state too"
    );
    let turn = chat.prompt_streaming("one").await.unwrap();
    assert_eq!(*watch.borrow_and_update(), SessionState::Running);
    assert_eq!(chat.meta().await.unwrap().state, SessionState::Running);
    watch.changed().await.unwrap();
    assert_eq!(*watch.borrow_and_update(), SessionState::Idle);
    turn.result().await.unwrap();
    assert_eq!(chat.meta().await.unwrap().state, SessionState::Idle);
    chat.close().await.unwrap();
    watch.changed().await.unwrap();
    assert_eq!(*watch.borrow(), SessionState::Closed);
    let refused = chat.prompt("two").await.unwrap_err();
    assert_eq!(refused.kind(), "session_closed");
    // Reached again by its id, it is still closed and keeps its history.
    let again = host.session("watched").await.unwrap();
    assert_eq!(again.state(), SessionState::Closed);
    assert_eq!(again.history().await.unwrap().len(), 2);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_prompt_stops_the_answer_not_the_chat() {
    let (host, _, chat) = open_chat(SLOW).await;
    let mut turn = chat.prompt_streaming("one").await.unwrap();
    // Wait until the model call is in flight, then stop the answer.
    while let Some(e) = turn.events().next().await {
        if matches!(e.event, RunEvent::StepStart { .. }) {
            break;
        }
    }
    turn.cancel();
    let cancelled = turn.result().await.unwrap();
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert!(chat.history().await.unwrap().is_empty());
    assert_eq!(chat.state(), SessionState::Idle);
    // The chat goes on; the cancelled call used up a script entry.
    let next = chat.prompt("again").await.unwrap();
    assert_eq!(next.output.as_deref(), Some("second"));
    assert_eq!(chat.history().await.unwrap().len(), 2);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn streaming_prompts_deliver_text_deltas() {
    let (host, _, chat) = open_chat(CHAT).await;
    let mut turn = chat.prompt_streaming("hi").await.unwrap();
    let mut text = String::new();
    let mut ended = false;
    while let Some(e) = turn.events().next().await {
        match e.event {
            RunEvent::TextDelta { text: t, .. } => text.push_str(&t),
            RunEvent::RunEnd { .. } => ended = true,
            _ => {}
        }
    }
    assert!(ended);
    assert_eq!(text, "Hello Ada.");
    assert_eq!(turn_result_output(turn).await, "Hello Ada.");
    host.shutdown().await;
}

async fn turn_result_output(turn: agentvisor::SessionTurn) -> String {
    turn.result().await.unwrap().output.unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn sessions_are_found_by_id_and_keep_their_agent() {
    let (host, _) = chat_host(CHAT).await;
    let unknown = host.session("nope").await.unwrap_err();
    assert_eq!(unknown.kind(), "session_not_found");
    let bad = host.session("a/b").await.unwrap_err();
    assert_eq!(bad.kind(), "invalid_session_id");
    let chat = host
        .open_session(spec(CHAT), SessionOptions::id("s1"))
        .await
        .unwrap();
    chat.prompt("My name is Ada.").await.unwrap();
    let other = spec("name: other\nmodel: recorded\nscript: [{text: x}]\n");
    let mismatch = host
        .open_session(other, SessionOptions::id("s1"))
        .await
        .unwrap_err();
    assert_eq!(mismatch.kind(), "session_agent_mismatch");
    // Every handle dropped: the session is reopened from the store, its
    // manifest with it, and goes on where it was.
    drop(chat);
    let again = host.session("s1").await.unwrap();
    assert_eq!(again.agent(), "chat");
    assert_eq!(again.state(), SessionState::Idle);
    let second = again.prompt("What is my name?").await.unwrap();
    assert_eq!(second.output.as_deref(), Some("Your name is Ada."));
    let listed = host.session_store().list(10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, "s1");
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn closing_cancels_the_prompt_in_flight() {
    let (host, _, chat) = open_chat(SLOW).await;
    let turn = chat.prompt_streaming("one").await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    chat.close().await.unwrap();
    let r = turn.result().await.unwrap();
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(chat.state(), SessionState::Closed);
    assert_eq!(chat.meta().await.unwrap().state, SessionState::Closed);
    host.shutdown().await;
}
