#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Nothing lost, nothing run twice: a store that fails a chosen write (a
//! fault-injecting battery around the real ones) and the runtime around it.
//!
//! - the SQLite writer recovers from a failed write (a budget commit, a
//!   checkpoint save, an audit batch): the next write works;
//! - when neither the store nor the spool takes records, the host stops
//!   admitting runs (`rejected` / `store_unavailable`), and admits again
//!   once the store works; what could not be written is counted;
//! - a database file deleted under a running store fails its writes;
//! - a durable run's checkpoint is cleared only once its terminal record
//!   is in the store, not when it went to the spool.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::{AuditRecord, AuditStats, AuditStore, AuditStoreError};
use agentvisor::ports::budget::{BudgetLedger, Spend};
use agentvisor::ports::checkpoint::{Checkpointer, EncodedJson, Lease};
use agentvisor::stores::{MemoryAuditStore, MemoryCheckpointer, SqliteStore};
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunId, RunStatus};
use async_trait::async_trait;
use support::scratch::Scratch;
use support::small_disk::SmallDisk;

fn manifest(file: &str) -> AgentSpec {
    AgentSpec::from_file(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

/// An audit store that fails every append while its switch is on (the
/// fault-injecting battery), around a real store.
struct Switched<S> {
    inner: Arc<S>,
    failing: AtomicBool,
    failed: AtomicUsize,
}

impl<S> Switched<S> {
    fn new(inner: Arc<S>, failing: bool) -> Arc<Self> {
        Arc::new(Switched {
            inner,
            failing: AtomicBool::new(failing),
            failed: AtomicUsize::new(0),
        })
    }

    fn set_failing(&self, on: bool) {
        self.failing.store(on, Ordering::SeqCst);
    }
}

#[async_trait]
impl<S: AuditStore> AuditStore for Switched<S> {
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError> {
        if self.failing.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(AuditStoreError::Unavailable("injected: disk full".into()));
        }
        self.inner.append(batch).await
    }

    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        self.inner.run_records(run_id).await
    }

    async fn stats(&self) -> Result<AuditStats, AuditStoreError> {
        self.inner.stats().await
    }
}

/// A trigger that fails every write to `table` while `fault.on_` is 1.
fn fault_on(path: &Path, table: &str) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS fault (on_ INTEGER NOT NULL); \
         INSERT INTO fault (on_) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM fault); \
         CREATE TRIGGER fault_{table}_insert BEFORE INSERT ON {table} \
         WHEN (SELECT on_ FROM fault) = 1 BEGIN SELECT RAISE(ABORT, 'injected fault'); END; \
         CREATE TRIGGER fault_{table}_update BEFORE UPDATE ON {table} \
         WHEN (SELECT on_ FROM fault) = 1 BEGIN SELECT RAISE(ABORT, 'injected fault'); END;"
    ))
    .unwrap();
    conn
}

fn set_fault(conn: &rusqlite::Connection, on: bool) {
    conn.execute("UPDATE fault SET on_ = ?", [i64::from(on)])
        .unwrap();
}

#[tokio::test]
async fn the_sqlite_writer_recovers_after_a_failed_write_of_every_kind() {
    let dir = Scratch::new("recovers");
    let path = dir.path("a.db");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let faults = fault_on(&path, "budget_spend");
    fault_on(&path, "checkpoints");
    fault_on(&path, "runs");
    let spend = |tokens| {
        vec![(
            "c".to_string(),
            Spend {
                tokens,
                ..Spend::default()
            },
        )]
    };
    // Every kind of write fails once, in a row…
    set_fault(&faults, true);
    assert!(store.commit(&spend(5)).await.is_err());
    let checkpoint = durable_checkpoint(RunId::new());
    assert!(store
        .save(std::slice::from_ref(&checkpoint), &lease())
        .await
        .is_err());
    let run = hello_records().await;
    assert!(store.append(&run).await.is_err());
    assert!(store.commit(&spend(5)).await.is_err());
    // …and once the fault is gone, each works again at once: no write is
    // left behind a half-open transaction.
    set_fault(&faults, false);
    store.commit(&spend(7)).await.unwrap();
    store
        .save(std::slice::from_ref(&checkpoint), &lease())
        .await
        .unwrap();
    store.append(&run).await.unwrap();
    assert_eq!(
        store
            .spent("c", Duration::from_secs(3600))
            .await
            .unwrap()
            .tokens,
        7,
        "only the spend committed after the fault"
    );
    assert_eq!(store.load_all().await.unwrap().len(), 1);
    assert_eq!(store.run_records(run[0].run_id).await.unwrap(), run);
}

/// A lease for saves made by the test itself.
fn lease() -> Lease {
    Lease {
        owner: "test".into(),
        ttl: Duration::from_secs(60),
    }
}

/// A hello run's records, under a new run id.
async fn hello_records() -> Vec<AuditRecord> {
    let mem = Arc::new(MemoryAuditStore::new());
    let host = Host::builder()
        .audit_store(mem.clone())
        .build()
        .await
        .unwrap();
    let result = host
        .execute(
            manifest("examples/agents/hello.yaml"),
            Invocation::default(),
        )
        .await
        .unwrap();
    host.shutdown().await;
    mem.run_records(result.run_id).await.unwrap()
}

fn durable_checkpoint(run_id: RunId) -> agentvisor::ports::checkpoint::Checkpoint {
    agentvisor::ports::checkpoint::Checkpoint {
        run_id,
        agent: "durable".into(),
        spec: EncodedJson::encode(&manifest("examples/agents/durable.yaml")).unwrap(),
        invocation: EncodedJson::encode(&Invocation::default()).unwrap(),
        transcript: Arc::new(Vec::new()),
        // A run's first checkpoint (it creates the run's row).
        iteration: 0,
        steps: Vec::new(),
        usage: Default::default(),
        cost_micros: None,
        critic: Vec::new(),
        resumes: 0,
        started_at: 1,
        saved_at: 2,
        parked: None,
        unchanged: Default::default(),
    }
}

#[tokio::test]
async fn a_database_file_deleted_under_the_store_fails_its_writes() {
    let dir = Scratch::new("deleted");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let run = hello_records().await;
    store.append(&run[..3]).await.unwrap();
    std::fs::remove_file(&path).unwrap();
    let e = store.append(&run[3..]).await.unwrap_err();
    assert!(e.to_string().contains("a.db"), "{e}");
    assert!(e.to_string().contains("gone"), "{e}");

    // Replaced by another file: the same.
    let other = dir.path("b.db");
    let store = SqliteStore::open(&other).await.unwrap();
    store.append(&run[..3]).await.unwrap();
    let moved = dir.path("b-moved.db");
    std::fs::rename(&other, &moved).unwrap();
    std::fs::copy(&moved, &other).unwrap();
    let e = store.append(&run[3..]).await.unwrap_err();
    assert!(e.to_string().contains("replaced"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn with_neither_store_nor_spool_runs_are_refused_until_the_store_works_again() {
    let dir = Scratch::new("unavailable");
    // The spool cannot be written: its directory is a regular file.
    std::fs::write(dir.path("not-a-dir"), b"x").unwrap();
    let spool = dir.path("not-a-dir/audit.spool");
    let store = Switched::new(Arc::new(MemoryAuditStore::new()), true);
    let host = Host::builder()
        .config(HostConfig {
            audit_spool: Some(spool.clone()),
            ..HostConfig::default()
        })
        .audit_store(store.clone())
        .build()
        .await
        .unwrap();
    let agent = host.agent(manifest("examples/agents/hello.yaml")).unwrap();
    // The first run ends: its result is delivered, its records are held.
    let first = host.execute(&agent, Invocation::default()).await.unwrap();
    assert_eq!(first.status, RunStatus::Ok);
    assert!(store.failed.load(Ordering::SeqCst) > 0);
    // Then nothing is admitted: it could not be recorded.
    let refused = host.execute(&agent, Invocation::default()).await.unwrap();
    assert_eq!(refused.status, RunStatus::Rejected);
    assert_eq!(refused.error_kind.as_deref(), Some("store_unavailable"));

    // Space returns: the held records are written at the next retry, and
    // runs are admitted again.
    store.set_failing(false);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let again = host.execute(&agent, Invocation::default()).await.unwrap();
    assert_eq!(again.status, RunStatus::Ok, "{again:?}");
    let stats = host.shutdown().await;
    assert_eq!(stats.unwritten, 0);
    for r in [&first, &refused, &again] {
        let records = store.run_records(r.run_id).await.unwrap();
        assert_eq!(
            records.iter().filter(|x| x.is_terminal()).count(),
            1,
            "run {} is on record once",
            r.run_id
        );
    }
}

#[tokio::test(start_paused = true)]
async fn records_that_nothing_takes_are_counted_at_shutdown() {
    let dir = Scratch::new("lost");
    std::fs::write(dir.path("not-a-dir"), b"x").unwrap();
    let store = Switched::new(Arc::new(MemoryAuditStore::new()), true);
    let host = Host::builder()
        .config(HostConfig {
            audit_spool: Some(dir.path("not-a-dir/audit.spool")),
            ..HostConfig::default()
        })
        .audit_store(store.clone())
        .build()
        .await
        .unwrap();
    let r = host
        .execute(
            manifest("examples/agents/hello.yaml"),
            Invocation::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok);
    let stats = host.shutdown().await;
    assert_eq!(stats.unwritten, 13, "a hello run's records, none written");
    assert_eq!(stats.spooled, 0);
    // Its caller was told `ok`, and that is recorded nowhere.
    assert_eq!(stats.unrecorded.total(), 1);
    assert_eq!(stats.unrecorded.of(RunStatus::Ok), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_runs_checkpoint_stays_until_its_terminal_record_is_in_the_store() {
    let dir = Scratch::new("checkpoint-on-disk");
    let spool = dir.path("audit.spool");
    let store = Switched::new(Arc::new(MemoryAuditStore::new()), true);
    let checkpoints = Arc::new(MemoryCheckpointer::new());
    let host = Host::builder()
        .config(HostConfig {
            audit_spool: Some(spool.clone()),
            ..HostConfig::default()
        })
        .audit_store(store.clone())
        .checkpointer(checkpoints.clone())
        .build()
        .await
        .unwrap();
    let r = host
        .execute(
            manifest("examples/agents/durable.yaml"),
            Invocation::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok);
    // Its terminal record is in the spool, not in the store: the
    // checkpoint is what would resume it after a crash, so it stays.
    assert!(std::fs::metadata(&spool).unwrap().len() > 0);
    let saved = checkpoints.load_all().await.unwrap();
    assert_eq!(saved.len(), 1);
    assert_eq!(saved[0].run_id, r.run_id);
    // The store works again: the spool is replayed, then the checkpoint goes.
    store.set_failing(false);
    let stats = host.shutdown().await;
    assert_eq!((stats.unwritten, stats.spooled), (0, 0));
    assert_eq!(
        store
            .run_records(r.run_id)
            .await
            .unwrap()
            .iter()
            .filter(|x| x.is_terminal())
            .count(),
        1
    );
    assert!(checkpoints.load_all().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs: needs root (run with --ignored, as CI does)"]
async fn on_a_full_disk_records_go_to_the_spool_and_everything_works_once_space_returns() {
    let dir = Scratch::new("full-disk");
    let disk = SmallDisk::mount("on_a_full_disk", &dir.0, "8m");
    let path = disk.0.join("a.db");
    let spool = dir.path("audit.spool");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    // Room for the empty file's first writes, then none.
    store.append(&hello_records().await).await.unwrap();
    let filler = disk.fill();
    let host = Host::builder()
        .config(HostConfig {
            audit_spool: Some(spool.clone()),
            ..HostConfig::default()
        })
        .audit_store(store.clone())
        .checkpointer(store.clone())
        .budget_ledger(store.clone())
        .build()
        .await
        .unwrap();
    let agent = host.agent(manifest("examples/agents/hello.yaml")).unwrap();
    let mut ids = Vec::new();
    for _ in 0..200 {
        let r = host.execute(&agent, Invocation::default()).await.unwrap();
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        ids.push(r.run_id);
    }
    // The disk is full: the store refuses (SQLITE_FULL), the spool takes them.
    assert!(std::fs::metadata(&spool).unwrap().len() > 0);
    let e = store
        .commit(&[("c".to_string(), Spend::default())])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("full"), "{e}");

    // Space returns: the spool drains, and every write works again.
    std::fs::remove_file(&filler).unwrap();
    let stats = host.shutdown().await;
    assert_eq!((stats.unwritten, stats.spooled), (0, 0), "{stats:?}");
    assert_eq!(std::fs::metadata(&spool).unwrap().len(), 0);
    for id in &ids {
        let records = store.run_records(*id).await.unwrap();
        assert_eq!(records.iter().filter(|x| x.is_terminal()).count(), 1);
    }
    store
        .commit(&[(
            "c".to_string(),
            Spend {
                tokens: 3,
                ..Spend::default()
            },
        )])
        .await
        .unwrap();
    store
        .save(&[durable_checkpoint(RunId::new())], &lease())
        .await
        .unwrap();
    store.close().await;
}

/// A host on `spool` over `store`.
async fn spooled_host(spool: &Path, store: Arc<dyn AuditStore>) -> Host {
    Host::builder()
        .config(HostConfig {
            audit_spool: Some(spool.to_path_buf()),
            ..HostConfig::default()
        })
        .audit_store(store)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_on_one_spool_path_each_write_their_own_and_an_ended_ones_records_are_taken_in() {
    let dir = Scratch::new("spool-claim");
    let spool = dir.path("audit.spool");
    let hello = || manifest("examples/agents/hello.yaml");
    // A holds the configured file; B and D, started beside it (a
    // `recover` beside a `swarm`), each write a sibling of their own.
    let store_a = Switched::new(Arc::new(MemoryAuditStore::new()), true);
    let a = spooled_host(&spool, store_a.clone()).await;
    let b = spooled_host(&spool, Arc::new(MemoryAuditStore::new())).await;
    let store_d = Switched::new(Arc::new(MemoryAuditStore::new()), true);
    let d = spooled_host(&spool, store_d.clone()).await;
    assert_eq!(a.config().audit_spool.as_deref(), Some(spool.as_path()));
    assert_eq!(b.config().audit_spool, Some(dir.path("audit.spool.1")));
    assert_eq!(d.config().audit_spool, Some(dir.path("audit.spool.2")));

    // A's and D's stores fail: each run's records go to its own host's
    // spool. D ends with its records there (as a process that died would
    // leave them); B ends with none.
    let ra = a.execute(hello(), Invocation::default()).await.unwrap();
    let rd = d.execute(hello(), Invocation::default()).await.unwrap();
    let stats_d = d.shutdown().await;
    assert_eq!(stats_d.spooled, 13, "D's hello run, in its spool");
    b.shutdown().await;
    // A process that ends drops its host, and the lock on its spool with it.
    drop((b, d));

    // C starts beside A: it takes B's free file, and takes in D's records,
    // which reach C's store; D's file is gone.
    let store_c = Arc::new(MemoryAuditStore::new());
    let c = spooled_host(&spool, store_c.clone()).await;
    assert_eq!(c.config().audit_spool, Some(dir.path("audit.spool.1")));
    assert!(!dir.path("audit.spool.2").exists());
    let stats_c = c.shutdown().await;
    assert_eq!((stats_c.spooled, stats_c.unwritten), (0, 0));
    let taken = store_c.run_records(rd.run_id).await.unwrap();
    assert_eq!(taken.len(), 13, "D's run, replayed by C");

    // A's records were never touched: still in its spool, then in its
    // store once the store works again.
    assert!(std::fs::metadata(&spool).unwrap().len() > 0);
    assert!(store_c.run_records(ra.run_id).await.unwrap().is_empty());
    store_a.set_failing(false);
    let stats_a = a.shutdown().await;
    assert_eq!((stats_a.spooled, stats_a.unwritten), (0, 0));
    assert_eq!(store_a.run_records(ra.run_id).await.unwrap().len(), 13);
}
