#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Exactly-once recovery: hosts on one database — a SQLite file, and (the
//! `postgres` feature) a PostgreSQL database of the test's own. A host holds a
//! lease on the durable runs it runs, and one of its own; `recover` beside
//! it leaves its runs alone (durable or not), and two `recover`s at once
//! resume each run once. A host whose leases expired while it was paused
//! (simulated here by expiring them in the database) loses its runs to a
//! `recover` elsewhere, and stops them without writing anything more of
//! them (fencing). (The leases' port semantics — a claim won once, a
//! host taken over once expired — run on every battery in
//! `store_conformance`.)
//!
//! Waits for a state of the file are bounded polls (10 ms apart, 60 s at
//! most), never a wait for a deadline.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentvisor::ports::audit::{AuditRecord, AuditStore, RunIndex};
use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError};
use agentvisor::providers::ScriptedModel;
use agentvisor::{RunStatus, LEASE_LOST};
use async_trait::async_trait;
use tokio::sync::watch;

use agentvisor::ports::checkpoint::Checkpointer;
use agentvisor::stores::SqliteStore;
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunId};
use support::scratch::Scratch;

/// One step, then a model call that never answers (the critic's limits
/// are far away): the run stays in flight, checkpointed after its step.
const WAITS: &str = r#"
name: waits
model: scripted
durable: true
prompt: add, then wait
tools: [add]
limits: { max_runtime: 1h, soft_timeout: 1h, stall_timeout: 1h, hard_timeout: 2h }
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { hang: true }
"#;

/// The stores a host here is built on.
trait Store: AuditStore + RunIndex + Checkpointer {}
impl<T: AuditStore + RunIndex + Checkpointer> Store for T {}

/// The database the hosts of a test share.
enum Db {
    /// A SQLite file.
    Sqlite(Scratch),
    /// A PostgreSQL database (its URL).
    #[cfg(feature = "postgres")]
    Postgres(String),
}

impl Db {
    fn sqlite(name: &str) -> Self {
        Db::Sqlite(Scratch::new(name))
    }

    #[cfg(feature = "postgres")]
    async fn postgres() -> Self {
        Db::Postgres(support::postgres::fresh_database().await)
    }

    /// A store of its own on the database.
    async fn open(&self) -> Arc<dyn Store> {
        match self {
            Db::Sqlite(dir) => Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap()),
            #[cfg(feature = "postgres")]
            Db::Postgres(url) => Arc::new(
                agentvisor::stores::PostgresStore::connect(url)
                    .await
                    .unwrap(),
            ),
        }
    }

    /// What the time of a paused host does to its leases in the database:
    /// they expire (as they would after `lease_ttl` without a renewal).
    async fn expire_leases_of(&self, owner: &str) {
        let statements = [
            "UPDATE checkpoints SET lease_until = 0 WHERE owner = ",
            "UPDATE host_leases SET lease_until = 0 WHERE owner = ",
        ];
        match self {
            Db::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path("a.db")).unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                for s in statements {
                    conn.execute(&format!("{s}?1"), [owner]).unwrap();
                }
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(url) => {
                let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                for s in statements {
                    client.execute(&format!("{s}$1"), &[&owner]).await.unwrap();
                }
            }
        }
    }
}

/// A host on a store of its own on `db`.
async fn host_on(db: &Db) -> (Host, Arc<dyn Store>) {
    host_with(db, Host::builder()).await
}

/// A host on a store of its own on `db`, built from `builder`.
async fn host_with(db: &Db, builder: agentvisor::HostBuilder) -> (Host, Arc<dyn Store>) {
    let store = db.open().await;
    let host = builder
        .config(HostConfig::default())
        .audit_store(store.clone())
        .checkpointer(store.clone())
        .build()
        .await
        .unwrap();
    (host, store)
}

/// Polls (bounded) until `done` holds.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let bound = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(Instant::now() < bound, "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The terminal records of a run in the database.
async fn terminals(store: &Arc<dyn Store>, run: RunId) -> usize {
    store
        .run_records(run)
        .await
        .unwrap()
        .iter()
        .filter(|r| AuditRecord::is_terminal(r))
        .count()
}

/// A run that is not durable and waits (far from its limits).
const HANGS: &str = r#"
name: hangs
model: scripted
prompt: wait
limits: { max_runtime: 1h, soft_timeout: 1h, stall_timeout: 1h, hard_timeout: 2h }
script:
  - { hang: true }
"#;

async fn recover_leaves_the_runs_of_a_live_host_and_ends_those_of_a_host_that_is_gone(db: Db) {
    let spec = AgentSpec::from_yaml(HANGS).unwrap();
    let n = 8;
    let (live, live_store) = host_on(&db).await;
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(live.submit(&spec, Invocation::default()).await.unwrap());
    }
    let ids: Vec<RunId> = handles.iter().map(|h| h.run_id()).collect();
    // Its runs' `run.start` records are in the file, and nothing else.
    until("the runs are on record", || async {
        live_store.unfinished_runs().await.unwrap().len() == n
    })
    .await;

    // A recover beside it ends none of them: their host's lease is live.
    let (beside, _) = host_on(&db).await;
    let recovery = beside.recover().await.unwrap();
    assert!(recovery.interrupted.is_empty(), "{recovery:?}");
    assert_eq!(recovery.leased.len(), n, "{recovery:?}");
    beside.shutdown().await;
    for id in &ids {
        assert_eq!(terminals(&live_store, *id).await, 0, "run {id} untouched");
    }

    // The live host finishes them: each has its own terminal record, once.
    live.shutdown().await;
    for h in handles {
        let r = h.await;
        assert_eq!(r.status, RunStatus::Cancelled, "{r:?}");
        assert_eq!(terminals(&live_store, r.run_id).await, 1);
        assert_ne!(
            live_store
                .run_result(r.run_id)
                .await
                .unwrap()
                .unwrap()
                .error_kind
                .as_deref(),
            Some("interrupted")
        );
    }

    // A host that is gone (its lease expired: paused, or cut off, or
    // dead elsewhere): its runs are ended, once, and the host, should it
    // come back, learns it was taken over and keeps no second record.
    let (gone, gone_store) = host_on(&db).await;
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(gone.submit(&spec, Invocation::default()).await.unwrap());
    }
    until("the runs are on record", || async {
        gone_store.unfinished_runs().await.unwrap().len() == n
    })
    .await;
    db.expire_leases_of(gone.host_id()).await;
    let (after, _) = host_on(&db).await;
    let recovery = after.recover().await.unwrap();
    assert_eq!(recovery.interrupted.len(), n, "{recovery:?}");
    assert!(recovery.leased.is_empty(), "{recovery:?}");
    after.shutdown().await;
    gone.inject_pause(Duration::from_secs(60));
    gone.shutdown().await;
    for h in handles {
        let id = h.run_id();
        let _ = h.await;
        assert_eq!(terminals(&gone_store, id).await, 1);
        assert_eq!(
            gone_store
                .run_result(id)
                .await
                .unwrap()
                .unwrap()
                .error_kind
                .as_deref(),
            Some("interrupted"),
            "the first terminal record is the one kept"
        );
    }
}

/// The scripted model, whose calls after a run's first wait until `open`.
struct GatedModel {
    inner: ScriptedModel,
    open: watch::Receiver<bool>,
}

#[async_trait]
impl ChatModel for GatedModel {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        if request.call_index >= 1 {
            let mut open = self.open.clone();
            let _ = open.wait_for(|o| *o).await;
        }
        self.inner.complete(request).await
    }
}

/// One step, then an answer.
const FINISHES: &str = r#"
name: waits
model: scripted
durable: true
prompt: add, then answer
tools: [add]
limits: { max_runtime: 1h, soft_timeout: 1h, stall_timeout: 1h, hard_timeout: 2h }
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { text: done }
"#;

async fn a_paused_host_whose_durable_runs_were_taken_over_stops_them_and_writes_nothing_of_them(
    db: Db,
) {
    let n = 6;
    // The first host: each run takes its step, is checkpointed, then
    // waits for its answer at the gate.
    let (open, gate) = watch::channel(false);
    let gated = Arc::new(GatedModel {
        inner: ScriptedModel::new(AgentSpec::from_yaml(FINISHES).unwrap().script),
        open: gate,
    });
    let (first, first_store) = host_with(&db, Host::builder().model("scripted", gated)).await;
    let spec = AgentSpec::from_yaml(FINISHES).unwrap();
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(first.submit(&spec, Invocation::default()).await.unwrap());
    }
    until("every run is checkpointed after its step", || async {
        let saved = first_store.load_all().await.unwrap();
        saved.len() == n && saved.iter().all(|c| c.iteration == 1)
    })
    .await;

    // The first host is paused past its leases: a recover elsewhere
    // claims and resumes its runs (they wait there).
    db.expire_leases_of(first.host_id()).await;
    let (second, second_store) = host_with(
        &db,
        Host::builder().model(
            "scripted",
            Arc::new(ScriptedModel::new(
                AgentSpec::from_yaml(WAITS).unwrap().script,
            )),
        ),
    )
    .await;
    let recovery = second.recover().await.unwrap();
    assert_eq!(recovery.resumed.len(), n, "{recovery:?}");

    // The first host comes back: it finds its runs lost and stops them,
    // and whatever they would have written (their answers arrive now)
    // is not written.
    first.inject_pause(Duration::from_secs(60));
    open.send(true).unwrap();
    for h in handles {
        let r = h.await;
        assert_eq!(r.status, RunStatus::Cancelled, "{r:?}");
        assert_eq!(r.error_kind.as_deref(), Some(LEASE_LOST), "{r:?}");
    }
    first.shutdown().await;
    let saved = second_store.load_all().await.unwrap();
    assert_eq!(saved.len(), n, "the second host's checkpoints stay");
    for c in &saved {
        assert_eq!(terminals(&second_store, c.run_id).await, 0);
    }

    // They are the second host's: it keeps them at its shutdown, and a
    // third host finishes them, each with one terminal record.
    second.shutdown().await;
    for h in recovery.resumed {
        let _ = h.await;
    }
    let (third, third_store) = host_on(&db).await;
    let recovery = third.recover().await.unwrap();
    assert_eq!(recovery.resumed.len(), n, "{recovery:?}");
    let ids: Vec<RunId> = recovery.resumed.iter().map(|h| h.run_id()).collect();
    for h in recovery.resumed {
        assert_eq!(h.await.status, RunStatus::Ok);
    }
    third.shutdown().await;
    for id in ids {
        assert_eq!(terminals(&third_store, id).await, 1);
    }
    assert!(third_store.load_all().await.unwrap().is_empty());
}

async fn recover_beside_a_live_host_resumes_none_of_its_runs_and_two_recovers_share_the_rest(
    db: Db,
) {
    let spec = AgentSpec::from_yaml(WAITS).unwrap();
    let n = 12;

    // The first host runs n durable runs; each is accepted once its first
    // checkpoint (and lease) is in the file.
    let (first, first_store) = host_on(&db).await;
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(first.submit(&spec, Invocation::default()).await.unwrap());
    }
    assert_eq!(first_store.load_all().await.unwrap().len(), n);
    // A recover beside it, on the same file: every run is leased.
    let (beside, _) = host_on(&db).await;
    let recovery = beside.recover().await.unwrap();
    assert!(recovery.resumed.is_empty(), "{recovery:?}");
    assert_eq!(recovery.leased.len(), n, "{recovery:?}");
    assert!(recovery.interrupted.is_empty(), "{recovery:?}");
    beside.shutdown().await;

    // The first host stops: its runs keep their checkpoints, and its
    // leases are released.
    first.shutdown().await;
    for h in handles {
        let _ = h.await;
    }
    assert_eq!(first_store.load_all().await.unwrap().len(), n);

    // Two recovers at once: each run is resumed by one of them.
    let (a, _) = host_on(&db).await;
    let (b, _) = host_on(&db).await;
    let (ra, rb) = tokio::join!(a.recover(), b.recover());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let ids =
        |r: &agentvisor::Recovery| -> Vec<RunId> { r.resumed.iter().map(|h| h.run_id()).collect() };
    let (ia, ib) = (ids(&ra), ids(&rb));
    assert_eq!(ia.len() + ib.len(), n, "a: {ra:?}, b: {rb:?}");
    assert!(ia.iter().all(|id| !ib.contains(id)), "a run resumed twice");
    assert_eq!(ra.leased.len() + rb.leased.len(), n);
    a.shutdown().await;
    b.shutdown().await;
}

/// Each test on SQLite and, with the `postgres` feature, on PostgreSQL.
macro_rules! on_both {
    ($name:ident, $dir:literal) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(Db::sqlite($dir)).await;
            }

            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(Db::postgres().await).await;
            }
        }
    };
}

on_both!(
    recover_leaves_the_runs_of_a_live_host_and_ends_those_of_a_host_that_is_gone,
    "host-lease"
);
on_both!(
    a_paused_host_whose_durable_runs_were_taken_over_stops_them_and_writes_nothing_of_them,
    "fencing"
);
on_both!(
    recover_beside_a_live_host_resumes_none_of_its_runs_and_two_recovers_share_the_rest,
    "two-hosts"
);
