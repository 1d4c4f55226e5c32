//! Sessions on the SQLite store: a conversation goes on across two host
//! instances on one file. (The port's rules — atomic appends, the
//! sequence check, listing, removal — run on every battery in
//! `store_conformance`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use agentvisor::ports::model::Role;
use agentvisor::stores::SqliteStore;
use agentvisor::{SessionOptions, SessionState};
use support::scratch::Scratch;
use support::{builder, spec, RecordingModel};

const CHAT: &str = r#"
name: chat
model: recorded
system: You remember what you are told.
script:
  - { text: "Hello Ada." }
  - { text: "Your name is Ada." }
"#;

#[tokio::test]
async fn a_session_goes_on_in_another_host_on_the_same_file() {
    let dir = Scratch::new("session");
    let path = dir.0.join("agentvisor.db");
    let yaml = spec(CHAT);

    // The first host: one prompt, then it shuts down.
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let host = builder()
        .model("recorded", RecordingModel::new(&yaml))
        .audit_store(store.clone())
        .session_store(store.clone())
        .build()
        .await
        .unwrap();
    let chat = host
        .open_session(yaml.clone(), SessionOptions::id("ada"))
        .await
        .unwrap();
    let first = chat.prompt("My name is Ada.").await.unwrap();
    assert_eq!(first.output.as_deref(), Some("Hello Ada."));
    drop(chat);
    host.shutdown().await;
    store.close().await;
    drop(store);

    // The second host reaches the session by its id alone.
    let model = RecordingModel::new(&yaml);
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let host = builder()
        .model("recorded", model.clone())
        .audit_store(store.clone())
        .session_store(store.clone())
        .build()
        .await
        .unwrap();
    let chat = host.session("ada").await.unwrap();
    assert_eq!(chat.agent(), "chat");
    assert_eq!(chat.state(), SessionState::Idle);
    let second = chat.prompt("What is my name?").await.unwrap();
    // The script plays on from where the first host left it.
    assert_eq!(second.output.as_deref(), Some("Your name is Ada."));
    let sent: Vec<(Role, String)> = model
        .request(0)
        .into_iter()
        .map(|m| (m.role, m.content))
        .collect();
    assert_eq!(
        sent,
        vec![
            (Role::System, "You remember what you are told.".into()),
            (Role::User, "My name is Ada.".into()),
            (Role::Assistant, "Hello Ada.".into()),
            (Role::User, "What is my name?".into()),
        ]
    );
    let history = chat.history().await.unwrap();
    assert_eq!(history.len(), 4);
    assert_eq!(history[1].run_id, Some(first.run_id));
    assert_eq!(history[3].run_id, Some(second.run_id));
    let meta = chat.meta().await.unwrap();
    assert_eq!((meta.prompts, meta.messages, meta.model_calls), (2, 4, 2));
    assert_eq!(meta.last_run_id, Some(second.run_id));
    host.shutdown().await;
    store.close().await;
}
