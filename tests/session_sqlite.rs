//! Sessions on the SQLite store: a conversation goes on across two host
//! instances on one file, and the battery keeps the port's rules (atomic
//! appends, the sequence check, listing, removal).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use agentvisor::ports::model::{Message, Role};
use agentvisor::ports::session::{SessionMessage, SessionMeta, SessionStoreError};
use agentvisor::stores::SqliteStore;
use agentvisor::{RunId, SessionOptions, SessionState, SessionStore};
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

fn meta(id: &str, updated_at: u64) -> SessionMeta {
    SessionMeta {
        id: id.into(),
        agent: "chat".into(),
        manifest: serde_json::Value::Null,
        caller_id: Some("me".into()),
        state: SessionState::Created,
        created_at: 1,
        updated_at,
        prompts: 0,
        messages: 0,
        model_calls: 0,
        usage: Default::default(),
        last_run_id: None,
        on_busy: None,
    }
}

fn message(seq: u32, role: Role, text: &str) -> SessionMessage {
    SessionMessage {
        seq,
        run_id: Some(RunId::new()),
        at_ms: 5,
        message: Message::text(role, text),
    }
}

#[tokio::test]
async fn the_battery_keeps_the_ports_rules() {
    let store = SqliteStore::open_memory().await.unwrap();
    let a = meta("a", 10);
    store.create(&a).await.unwrap();
    assert!(matches!(
        store.create(&a).await,
        Err(SessionStoreError::Exists(_))
    ));
    store.create(&meta("b", 20)).await.unwrap();
    assert_eq!(store.get("a").await.unwrap(), Some(a.clone()));
    assert_eq!(store.get("zz").await.unwrap(), None);

    let mut a2 = a.clone();
    a2.state = SessionState::Idle;
    a2.messages = 2;
    a2.updated_at = 30;
    let turn = [
        message(0, Role::User, "hi"),
        message(1, Role::Assistant, "hello"),
    ];
    store.append(&a2, &turn).await.unwrap();
    assert_eq!(store.messages("a").await.unwrap(), turn.to_vec());
    assert_eq!(store.get("a").await.unwrap(), Some(a2.clone()));

    // A seq on file already, or one past a gap: refused, nothing written.
    let mut a3 = a2.clone();
    a3.updated_at = 40;
    let err = store
        .append(&a3, &[message(1, Role::User, "again")])
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionStoreError::Conflict { seq: 1, .. }),
        "{err}"
    );
    let err = store
        .append(&a3, &[message(3, Role::User, "gap")])
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionStoreError::Conflict { seq: 3, .. }),
        "{err}"
    );
    assert_eq!(store.messages("a").await.unwrap().len(), 2);
    assert_eq!(store.get("a").await.unwrap(), Some(a2.clone()));

    // Unknown sessions.
    let ghost = meta("ghost", 1);
    assert!(matches!(
        store.update(&ghost).await,
        Err(SessionStoreError::NotFound(_))
    ));
    assert!(matches!(
        store.append(&ghost, &[message(0, Role::User, "x")]).await,
        Err(SessionStoreError::NotFound(_))
    ));
    assert!(store.messages("ghost").await.unwrap().is_empty());

    // Newest update first.
    let ids: Vec<String> = store
        .list(10)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, vec!["a", "b"]);
    assert_eq!(store.list(1).await.unwrap().len(), 1);

    assert!(store.remove("a").await.unwrap());
    assert!(!store.remove("a").await.unwrap());
    assert!(store.messages("a").await.unwrap().is_empty());
    assert_eq!(store.list(10).await.unwrap().len(), 1);
}
