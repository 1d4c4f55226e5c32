//! The `WriteIntents` port on every battery: parked writes are listed in
//! the order parked; one parked again keeps its place and counts a try;
//! tries are recorded with their error; a landed one is cleared.

use std::sync::Arc;

use agentvisor::ports::writeback::{WriteIntent, WriteIntents, WriteMode};
use agentvisor::stores::{MemoryWriteIntents, SqliteStore};

use crate::support::scratch::Scratch;

async fn memory() -> Arc<dyn WriteIntents> {
    Arc::new(MemoryWriteIntents::new())
}

async fn sqlite(dir: &Scratch) -> Arc<dyn WriteIntents> {
    Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap())
}

#[cfg(feature = "postgres")]
async fn postgres() -> Arc<dyn WriteIntents> {
    Arc::new(crate::support::postgres::fresh_store().await)
}

fn parked(run: &str, path: &str, mode: WriteMode, token: Option<&str>) -> WriteIntent {
    WriteIntent {
        id: format!("{run}:{path}"),
        repo: "https://git.example.com/team/memory.git".into(),
        path: path.into(),
        mode,
        content: format!("{run} wrote {path}\n"),
        run_id: run.into(),
        token_secret: token.map(str::to_string),
        parked_at_ms: 1_700_000_000_000,
        attempts: 1,
        last_error: "push refused".into(),
    }
}

async fn parked_writes_are_kept_in_order_until_cleared(store: Arc<dyn WriteIntents>) {
    assert!(store.parked().await.unwrap().is_empty());
    let a = parked(
        "r1",
        "memory/digest.md",
        WriteMode::Append,
        Some("git_token"),
    );
    let b = parked("r2", "memory/digest.md", WriteMode::Replace, None);
    let c = parked("r3", "memory/triage.md", WriteMode::Append, None);
    for i in [&a, &b, &c] {
        store.park(i).await.unwrap();
    }
    assert_eq!(
        store.parked().await.unwrap(),
        [a.clone(), b.clone(), c.clone()]
    );
    // Parked again (a retry that failed too): it keeps its place and its
    // content, counting the try and its error.
    store
        .park(&WriteIntent {
            last_error: "still refused".into(),
            ..a.clone()
        })
        .await
        .unwrap();
    assert!(store.record_attempt(&c.id, "timed out").await.unwrap());
    assert!(!store.record_attempt("r9:nope", "x").await.unwrap());
    let a2 = WriteIntent {
        attempts: 2,
        last_error: "still refused".into(),
        ..a.clone()
    };
    let c2 = WriteIntent {
        attempts: 2,
        last_error: "timed out".into(),
        ..c.clone()
    };
    assert_eq!(
        store.parked().await.unwrap(),
        [a2.clone(), b.clone(), c2.clone()]
    );
    // Landed: cleared, once.
    assert!(store.resolve(&b.id).await.unwrap());
    assert!(!store.resolve(&b.id).await.unwrap());
    assert_eq!(store.parked().await.unwrap(), [a2, c2.clone()]);
    assert!(store.resolve(&a.id).await.unwrap());
    // Parked after a clear: last in order.
    store.park(&b).await.unwrap();
    assert_eq!(store.parked().await.unwrap(), [c2, b]);
}

conformance!(parked_writes_are_kept_in_order_until_cleared);
