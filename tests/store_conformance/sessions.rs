//! The `SessionStore` port on every battery: a session's metadata and
//! history read back as written, atomic appends refused on a taken or
//! skipped `seq`, two writers of one session never interleaved, listing
//! by last update, removal.

use std::sync::Arc;

use agentvisor::ports::model::{Message, Role};
use agentvisor::ports::run::Usage;
use agentvisor::ports::session::{
    OnBusy, SessionMessage, SessionMeta, SessionState, SessionStore, SessionStoreError,
};
use agentvisor::stores::{MemorySessionStore, SqliteStore};
use agentvisor::RunId;

use crate::support::scratch::Scratch;

async fn memory() -> Arc<dyn SessionStore> {
    Arc::new(MemorySessionStore::new())
}

async fn sqlite(dir: &Scratch) -> Arc<dyn SessionStore> {
    Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap())
}

#[cfg(feature = "postgres")]
async fn postgres() -> Arc<dyn SessionStore> {
    Arc::new(crate::support::postgres::fresh_store().await)
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

async fn a_session_and_its_history_read_back_as_written(store: Arc<dyn SessionStore>) {
    // Every field of the metadata set, a manifest included.
    let mut m = meta("full", 7);
    m.manifest = serde_json::json!({ "name": "chat", "model": "scripted", "tools": ["add"] });
    m.caller_id = None;
    m.on_busy = Some(OnBusy::Refuse);
    store.create(&m).await.unwrap();
    assert_eq!(store.get("full").await.unwrap(), Some(m.clone()));
    let run = RunId::new();
    let turn = [
        SessionMessage {
            seq: 0,
            run_id: Some(run),
            at_ms: 11,
            message: Message::text(Role::User, "héllo, \"quoted\"\nnew line"),
        },
        SessionMessage {
            seq: 1,
            run_id: None,
            at_ms: 12,
            message: Message::text(Role::Assistant, ""),
        },
    ];
    m.state = SessionState::Idle;
    m.prompts = 1;
    m.messages = 2;
    m.model_calls = 3;
    m.usage = Usage {
        input_tokens: 120,
        output_tokens: 8,
        ..Usage::default()
    };
    m.last_run_id = Some(run);
    m.updated_at = 12;
    store.append(&m, &turn).await.unwrap();
    assert_eq!(store.get("full").await.unwrap(), Some(m.clone()));
    assert_eq!(store.messages("full").await.unwrap(), turn.to_vec());
    // A state change alone.
    m.state = SessionState::Closed;
    store.update(&m).await.unwrap();
    assert_eq!(store.get("full").await.unwrap(), Some(m.clone()));
    assert_eq!(store.list(10).await.unwrap(), vec![m]);
}

async fn the_battery_keeps_the_ports_rules(store: Arc<dyn SessionStore>) {
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
    // The first of an append right, the second not: none of it.
    let err = store
        .append(
            &a3,
            &[message(2, Role::User, "ok"), message(4, Role::User, "gap")],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionStoreError::Conflict { seq: 4, .. }),
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

    // Newest update first; ties: the larger id first.
    store.create(&meta("c", 20)).await.unwrap();
    let ids: Vec<String> = store
        .list(10)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, vec!["a", "c", "b"]);
    assert_eq!(store.list(1).await.unwrap().len(), 1);

    assert!(store.remove("a").await.unwrap());
    assert!(!store.remove("a").await.unwrap());
    assert!(store.messages("a").await.unwrap().is_empty());
    assert_eq!(store.list(10).await.unwrap().len(), 2);
    // An id removed is free again, with an empty history.
    store.create(&a).await.unwrap();
    assert!(store.messages("a").await.unwrap().is_empty());
}

async fn two_writers_of_one_session_never_interleave(store: Arc<dyn SessionStore>) {
    let mut m = meta("shared", 1);
    store.create(&m).await.unwrap();
    m.messages = 2;
    // Eight writers append the same next turn at once: one wins, every
    // other finds its seq taken.
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (store, m) = (store.clone(), m.clone());
            tokio::spawn(async move {
                let turn = [
                    message(0, Role::User, &format!("writer {w}")),
                    message(1, Role::Assistant, &format!("answer {w}")),
                ];
                store.append(&m, &turn).await
            })
        })
        .collect();
    let mut won = 0;
    for w in writers {
        match w.await.unwrap() {
            Ok(()) => won += 1,
            Err(SessionStoreError::Conflict { seq: 0, .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(won, 1);
    let history = store.messages("shared").await.unwrap();
    assert_eq!(history.len(), 2);
    let writer = history[0].message.content.trim_start_matches("writer ");
    assert_eq!(
        history[1].message.content,
        format!("answer {writer}"),
        "both turns of one writer"
    );
}

conformance!(a_session_and_its_history_read_back_as_written);
conformance!(the_battery_keeps_the_ports_rules);
conformance!(two_writers_of_one_session_never_interleave);
