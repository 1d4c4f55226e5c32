//! The `ScheduleStore` port on every battery: states read back whole
//! (next fire, streak, pause, the day's spend), by name; a batch replaces
//! each state whole; removal.

use std::sync::Arc;

use agentvisor::ports::schedule::{Pause, ScheduleState, ScheduleStore};
use agentvisor::stores::{MemoryScheduleStore, SqliteStore};

use crate::support::scratch::Scratch;

async fn memory() -> Arc<dyn ScheduleStore> {
    Arc::new(MemoryScheduleStore::new())
}

async fn sqlite(dir: &Scratch) -> Arc<dyn ScheduleStore> {
    Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap())
}

#[cfg(feature = "postgres")]
async fn postgres() -> Arc<dyn ScheduleStore> {
    Arc::new(crate::support::postgres::fresh_store().await)
}

/// Every field set.
fn full(name: &str) -> ScheduleState {
    ScheduleState {
        name: name.into(),
        config_hash: "h1".into(),
        next_fire_ms: Some(1_700_000_060_000),
        last_fire_ms: Some(1_700_000_000_000),
        last_outcome: Some("failed".into()),
        last_reason: Some("error:provider_server".into()),
        last_run_id: Some("0123456789abcdef0123456789abcdef".into()),
        streak: 3,
        streak_reason: Some("error:provider_server".into()),
        paused: Some(Pause {
            why: "3 consecutive failures: error:provider_server".into(),
            at_ms: 1_700_000_000_500,
            auto: true,
        }),
        spent_day: Some("2026-11-27".into()),
        spent_tokens: 4_200,
        spent_cost_micros: 17,
        updated_at_ms: 1_700_000_000_600,
    }
}

/// Only what must be set.
fn bare(name: &str) -> ScheduleState {
    ScheduleState {
        name: name.into(),
        config_hash: "h0".into(),
        updated_at_ms: 9,
        ..ScheduleState::default()
    }
}

async fn states_read_back_whole_and_a_batch_replaces_each(store: Arc<dyn ScheduleStore>) {
    assert!(store.load_all().await.unwrap().is_empty());
    assert!(store.get("weekly").await.unwrap().is_none());
    store
        .put_all(&[full("weekly"), bare("daily")])
        .await
        .unwrap();
    // By name.
    assert_eq!(
        store.load_all().await.unwrap(),
        [bare("daily"), full("weekly")]
    );
    assert_eq!(store.get("weekly").await.unwrap(), Some(full("weekly")));
    // A batch replaces each state whole: the pause lifted by an operator,
    // the streak reset, the next fire moved (a field left unset is unset).
    let resumed = ScheduleState {
        paused: None,
        streak: 0,
        streak_reason: None,
        next_fire_ms: Some(1_700_000_120_000),
        ..full("weekly")
    };
    let paused_by_hand = ScheduleState {
        paused: Some(Pause {
            why: "paused by admin".into(),
            at_ms: 10,
            auto: false,
        }),
        ..bare("daily")
    };
    store
        .put_all(&[resumed.clone(), paused_by_hand.clone()])
        .await
        .unwrap();
    assert_eq!(store.get("weekly").await.unwrap(), Some(resumed.clone()));
    assert_eq!(store.get("daily").await.unwrap(), Some(paused_by_hand));
    store.put_all(&[]).await.unwrap();
    // Removal: the names given, an unknown one ignored.
    store
        .remove(&["daily".to_string(), "nope".to_string()])
        .await
        .unwrap();
    store.remove(&[]).await.unwrap();
    assert_eq!(store.load_all().await.unwrap(), [resumed]);
    assert!(store.get("daily").await.unwrap().is_none());
}

conformance!(states_read_back_whole_and_a_batch_replaces_each);
