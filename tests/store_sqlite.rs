#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The SQLite store (P1, B1, B3): batches written and read back in order,
//! terminal rows and the run index, duplicates ignored, budget spend that
//! holds across processes, files refused without being touched (newer
//! schema, corrupt, foreign, unwritable), and the audit actor's spool
//! taking the records while the store fails and replaying them after.

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::{
    AuditEntry, AuditRecord, AuditStats, AuditStore, AuditStoreError, RunFilter, RunIndex,
};
use agentvisor::ports::budget::{BudgetLedger, BudgetLimits, Spend};
use agentvisor::ports::run::{cap_text, SUMMARY_BYTES};
use agentvisor::stores::{MemoryAuditStore, SqliteStore, StoreError};
use agentvisor::{
    AgentSpec, Host, HostConfig, Invocation, KillReason, RunEvent, RunId, RunResult, RunStatus,
};
use async_trait::async_trait;
use support::rekey;
use support::scratch::Scratch;

fn hello() -> AgentSpec {
    support::hello_spec()
}

/// The records of one real run of `hello` (start, events, terminal).
async fn real_run() -> (RunResult, Vec<AuditRecord>) {
    support::hello_run().await
}

#[tokio::test]
async fn a_batch_is_written_and_read_back_in_order() {
    let dir = Scratch::new("order");
    let store = SqliteStore::open(&dir.path("a.db")).await.unwrap();
    let (result, records) = real_run().await;
    assert!(records.len() >= 5, "{records:?}");
    let (a, run_a) = rekey(&records, |_| {});
    let (b, run_b) = rekey(&records, |_| {});
    // Interleave two runs in one batch, newest seq first for one of them.
    let mut batch: Vec<AuditRecord> = Vec::new();
    for (x, y) in run_a.iter().zip(run_b.iter().rev()) {
        batch.push(x.clone());
        batch.push(y.clone());
    }
    store.append(&batch).await.unwrap();

    assert_eq!(store.run_records(a).await.unwrap(), run_a);
    assert_eq!(store.run_records(b).await.unwrap(), run_b);
    assert!(matches!(
        store.run_records(a).await.unwrap().last().map(|r| &r.entry),
        Some(AuditEntry::Terminal(res)) if res.output == result.output
    ));
    let stats = store.stats().await.unwrap();
    assert_eq!(
        stats,
        AuditStats {
            records: batch.len() as u64,
            terminal_records: 2,
            batches: 1,
            ..AuditStats::default()
        }
    );
    assert!(store.run_records(RunId::new()).await.unwrap().is_empty());
}

#[tokio::test]
async fn terminal_records_fill_the_run_index() {
    let dir = Scratch::new("index");
    let store = SqliteStore::open(&dir.path("a.db")).await.unwrap();
    let (_, records) = real_run().await;
    let (ok_id, ok) = rekey(&records, |r| {
        r.caller_id = Some("alice".into());
        r.finished_at = 1_000;
    });
    let (killed_id, killed) = rekey(&records, |r| {
        r.caller_id = Some("bob".into());
        r.status = RunStatus::Killed;
        r.kill_reason = Some(KillReason::Stalled);
        r.error_kind = Some("stalled".into());
        r.finished_at = 2_000;
    });
    store.append(&ok).await.unwrap();
    store.append(&killed).await.unwrap();

    let all = store.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(
        all.iter().map(|s| s.run_id).collect::<Vec<_>>(),
        vec![killed_id, ok_id],
        "most recently finished first"
    );
    assert_eq!(all[0].status, RunStatus::Killed);
    assert_eq!(all[0].kill_reason, Some(KillReason::Stalled));
    assert_eq!(all[0].error_kind.as_deref(), Some("stalled"));
    assert_eq!(all[0].caller_id.as_deref(), Some("bob"));

    let killed_only = RunFilter {
        status: Some(RunStatus::Killed),
        ..Default::default()
    };
    assert_eq!(
        store
            .list_runs(&killed_only)
            .await
            .unwrap()
            .iter()
            .map(|s| s.run_id)
            .collect::<Vec<_>>(),
        vec![killed_id]
    );
    // `ok` runs are not in the index by status (schema version 5): they
    // are found all the same, and no other status lists them.
    let by_status = |status| RunFilter {
        status: Some(status),
        ..Default::default()
    };
    let ok_only = store.list_runs(&by_status(RunStatus::Ok)).await.unwrap();
    assert_eq!(
        ok_only.iter().map(|s| s.run_id).collect::<Vec<_>>(),
        vec![ok_id]
    );
    assert!(store
        .list_runs(&by_status(RunStatus::Error))
        .await
        .unwrap()
        .is_empty());
    let alice = RunFilter {
        caller: Some("alice".into()),
        ..Default::default()
    };
    assert_eq!(store.list_runs(&alice).await.unwrap()[0].run_id, ok_id);
    let one = RunFilter {
        limit: Some(1),
        ..Default::default()
    };
    assert_eq!(store.list_runs(&one).await.unwrap().len(), 1);

    let res = store.run_result(killed_id).await.unwrap().unwrap();
    assert_eq!(res.status, RunStatus::Killed);
    assert_eq!(res.run_id, killed_id);
    assert_eq!(store.run_result(RunId::new()).await.unwrap(), None);

    // The memory store answers the same questions.
    let mem = MemoryAuditStore::new();
    mem.append(&ok).await.unwrap();
    mem.append(&killed).await.unwrap();
    assert_eq!(mem.list_runs(&RunFilter::default()).await.unwrap(), all);
    assert_eq!(mem.run_result(killed_id).await.unwrap(), Some(res));
}

#[tokio::test]
async fn a_replayed_record_is_never_a_duplicate() {
    let dir = Scratch::new("dup");
    let store = SqliteStore::open(&dir.path("a.db")).await.unwrap();
    let (_, records) = real_run().await;
    let (id, run) = rekey(&records, |_| {});
    store.append(&run).await.unwrap();
    store.append(&run).await.unwrap();
    store.append(&run[..2]).await.unwrap();
    assert_eq!(store.run_records(id).await.unwrap(), run);
    let totals = store.totals().await.unwrap();
    assert_eq!(totals.records, run.len() as u64);
    assert_eq!(totals.terminal_records, 1);
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.records, stats.terminal_records, stats.batches),
        (run.len() as u64, 1, 3)
    );
    assert_eq!(
        store.list_runs(&RunFilter::default()).await.unwrap().len(),
        1
    );
    // A replay and a new run in one batch: only the new one counts.
    let (other_id, other) = rekey(&records, |_| {});
    let mixed: Vec<AuditRecord> = run.iter().chain(other.iter()).cloned().collect();
    store.append(&mixed).await.unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.records, stats.terminal_records),
        ((run.len() + other.len()) as u64, 2)
    );
    assert_eq!(store.run_records(other_id).await.unwrap(), other);
    assert_eq!(store.totals().await.unwrap().records, stats.records);
}

#[tokio::test]
async fn history_and_spend_survive_a_reopen() {
    let dir = Scratch::new("reopen");
    let path = dir.path("nested/dirs/a.db");
    let (_, records) = real_run().await;
    let (id, run) = rekey(&records, |_| {});
    {
        let store = SqliteStore::open(&path).await.unwrap();
        store.append(&run).await.unwrap();
        let spend = Spend {
            tokens: 40,
            cost_micros: 7,
            runtime_ms: 100,
            runs: 1,
        };
        store
            .commit(&[
                ("a".into(), spend),
                ("a".into(), spend),
                ("b".into(), spend),
            ])
            .await
            .unwrap();
        store
            .set_limits(
                "a",
                BudgetLimits {
                    tokens: Some(50),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        store.set_default_limits(BudgetLimits {
            tokens: Some(1),
            ..Default::default()
        });
        store.close().await;
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store.version().await.unwrap(),
        agentvisor::stores::sqlite::SCHEMA_VERSION
    );
    assert_eq!(store.run_records(id).await.unwrap(), run);
    let a = store.spent("a", Duration::from_secs(3600)).await.unwrap();
    assert_eq!(
        a,
        Spend {
            tokens: 80,
            cost_micros: 14,
            runtime_ms: 200,
            runs: 2
        }
    );
    assert_eq!(
        store
            .spent("b", Duration::from_secs(3600))
            .await
            .unwrap()
            .tokens,
        40
    );
    assert_eq!(
        store
            .spent("nobody", Duration::from_secs(3600))
            .await
            .unwrap(),
        Spend::default()
    );
    assert_eq!(store.limits("a").await.unwrap().tokens, Some(50));
    // Default limits belong to the process that set them.
    assert_eq!(store.limits("b").await.unwrap().tokens, None);
}

#[tokio::test]
async fn a_token_budget_holds_across_hosts_on_one_file() {
    let dir = Scratch::new("budget");
    let path = dir.path("a.db");
    let limits = BudgetLimits {
        tokens: Some(150),
        ..Default::default()
    };
    let host_on = |store: Arc<SqliteStore>| async move {
        store.set_default_limits(limits);
        Host::builder()
            .audit_store(store.clone())
            .budget_ledger(store)
            .build()
            .await
            .unwrap()
    };

    // First process: one run spends more than the limit (admitted at 0;
    // the reply that passed it ends the run).
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let host = host_on(store.clone()).await;
    let first = host
        .execute(hello(), Invocation::prompt("add"))
        .await
        .unwrap();
    assert_eq!(first.status, RunStatus::BudgetExceeded, "{first:?}");
    assert!(first.usage.total() > 150, "{:?}", first.usage);
    host.shutdown().await;
    drop(host);
    store.close().await;
    drop(store);

    // Second process: the spend is on file, so the caller is refused.
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let host = host_on(store.clone()).await;
    let second = host
        .execute(hello(), Invocation::prompt("add"))
        .await
        .unwrap();
    assert_eq!(second.status, RunStatus::BudgetExceeded, "{second:?}");
    assert_eq!(second.iterations, 0);
    host.shutdown().await;
    assert_eq!(store.totals().await.unwrap().terminal_records, 2);
}

fn assert_names(e: &StoreError, path: &Path) {
    let text = e.to_string();
    assert!(
        text.contains(&path.display().to_string()),
        "the error should name {}: {text}",
        path.display()
    );
}

#[tokio::test]
async fn a_newer_schema_is_refused_with_the_path_and_left_alone() {
    let dir = Scratch::new("newer");
    let path = dir.path("a.db");
    SqliteStore::open(&path).await.unwrap().close().await;
    {
        // A newer agentvisor wrote version 99.
        let conn = connect(&path);
        conn.execute_batch(
            "INSERT INTO schema_version (version, applied_at) VALUES (99, 0); \
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
        conn.close().unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert!(
        matches!(err, StoreError::NewerSchema { found: 99, .. }),
        "{err:?}"
    );
    assert_names(&err, &path);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the file was changed"
    );
}

#[tokio::test]
async fn a_corrupt_file_is_refused_and_left_unchanged() {
    let dir = Scratch::new("corrupt");
    let path = dir.path("a.db");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 13) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_names(&err, &path);
    assert_eq!(std::fs::read(&path).unwrap(), garbage);

    // A database of another program is not ours to migrate.
    let other = dir.path("other.db");
    {
        let conn = connect(&other);
        conn.execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
            .unwrap();
        conn.close().unwrap();
    }
    let before = std::fs::read(&other).unwrap();
    let err = SqliteStore::open(&other).await.unwrap_err();
    assert!(matches!(err, StoreError::Foreign { .. }), "{err:?}");
    assert_names(&err, &other);
    assert_eq!(std::fs::read(&other).unwrap(), before);
}

#[tokio::test]
async fn an_unwritable_path_is_refused_with_the_path() {
    let dir = Scratch::new("unwritable");
    // A regular file where a directory should be (refused even for root).
    let file = dir.path("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let under_file = file.join("a.db");
    let err = SqliteStore::open(&under_file).await.unwrap_err();
    assert!(matches!(err, StoreError::CreateDir { .. }), "{err:?}");
    assert_names(&err, &under_file);
    assert_eq!(std::fs::read(&file).unwrap(), b"x");

    // A directory where the file should be.
    let err = SqliteStore::open(&dir.0).await.unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert_names(&err, &dir.0);

    // Readers never create a database.
    let missing = dir.path("missing.db");
    let err = SqliteStore::open_existing(&missing).await.unwrap_err();
    assert!(matches!(err, StoreError::Missing { .. }), "{err:?}");
    assert!(!missing.exists());
}

#[tokio::test]
async fn an_in_memory_database_works_like_a_file() {
    let store = SqliteStore::open_memory().await.unwrap();
    let (_, records) = real_run().await;
    let (id, run) = rekey(&records, |_| {});
    store.append(&run).await.unwrap();
    assert_eq!(store.run_records(id).await.unwrap(), run);
    assert_eq!(
        store.list_runs(&RunFilter::default()).await.unwrap().len(),
        1
    );
    let other = SqliteStore::open_memory().await.unwrap();
    assert!(
        other.run_records(id).await.unwrap().is_empty(),
        "each is private"
    );
}

/// Fails its first `failures` appends, then passes everything to `inner`;
/// says when an append was written (`written`).
struct FlakyStore {
    inner: Arc<SqliteStore>,
    failures: usize,
    calls: AtomicUsize,
    written: tokio::sync::Notify,
}

#[async_trait]
impl AuditStore for FlakyStore {
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(AuditStoreError::Unavailable("injected fault".into()));
        }
        let done = self.inner.append(batch).await;
        if done.is_ok() {
            self.written.notify_waiters();
        }
        done
    }

    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        self.inner.run_records(run_id).await
    }

    async fn stats(&self) -> Result<AuditStats, AuditStoreError> {
        self.inner.stats().await
    }
}

/// Runs `n` hello runs at once on a host over a store that fails its first
/// `failures` appends; returns the results, the spool's size when the last
/// result arrived, and the backing store after shutdown.
async fn swarm_over_flaky_store(
    dir: &Scratch,
    spool: Option<PathBuf>,
    n: usize,
    failures: usize,
) -> (Vec<RunResult>, u64, Arc<SqliteStore>) {
    let inner = Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap());
    let flaky = Arc::new(FlakyStore {
        inner: inner.clone(),
        failures,
        calls: AtomicUsize::new(0),
        written: tokio::sync::Notify::new(),
    });
    let host = Host::builder()
        .config(HostConfig {
            audit_spool: spool.clone(),
            audit_batch: 64,
            ..HostConfig::default()
        })
        .audit_store(flaky.clone())
        .build()
        .await
        .unwrap();
    let agent = host.agent(hello()).unwrap();
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(
            host.submit(&agent, Invocation::prompt("add"))
                .await
                .unwrap(),
        );
    }
    let mut results = Vec::new();
    for h in handles {
        // No run blocks on the failing store.
        let r = tokio::time::timeout(Duration::from_secs(20), h)
            .await
            .expect("a run blocked on its audit record");
        results.push(r);
    }
    let spooled = spool
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .unwrap_or(0);
    // The writer retries with a backoff (100 ms, doubling): wait, append
    // by append (the store says when one is written), until the store
    // works again and has taken everything. The bound only turns a hang
    // into a failure.
    let all_in = async {
        loop {
            let written = flaky.written.notified();
            if inner.totals().await.unwrap().terminal_records >= n as u64 {
                return;
            }
            written.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all_in)
        .await
        .expect("the records never reached the store");
    assert!(flaky.calls.load(Ordering::SeqCst) > failures);
    host.shutdown().await;
    (results, spooled, inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spool_takes_the_records_while_the_store_fails_and_replays_them() {
    let dir = Scratch::new("spool");
    let spool = dir.path("audit.spool");
    let n = 200;
    let (results, spooled, store) = swarm_over_flaky_store(&dir, Some(spool.clone()), n, 3).await;
    assert!(results.iter().all(|r| r.status == RunStatus::Ok));
    assert!(
        spooled > 0,
        "the spool took the records while the store failed"
    );
    let totals = store.totals().await.unwrap();
    assert_eq!(
        totals.terminal_records, n as u64,
        "one terminal record per run"
    );
    for r in results.iter().take(5) {
        let records = store.run_records(r.run_id).await.unwrap();
        assert!(matches!(
            records.first().map(|x| &x.entry),
            Some(AuditEntry::RunStarted(_))
        ));
        assert_eq!(records.iter().filter(|x| x.is_terminal()).count(), 1);
        let seqs: Vec<u32> = records.iter().map(|x| x.seq).collect();
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(seqs, sorted);
    }
    assert_eq!(
        std::fs::metadata(&spool).unwrap().len(),
        0,
        "replayed, then truncated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_spool_the_records_are_held_and_retried() {
    let dir = Scratch::new("held");
    let n = 100;
    let (results, _, store) = swarm_over_flaky_store(&dir, None, n, 3).await;
    // While records are held (nothing else takes them) no run is admitted:
    // a run is either ok or refused for that, and each is on record once.
    assert!(results.iter().all(|r| r.status == RunStatus::Ok
        || (r.status == RunStatus::Rejected
            && r.error_kind.as_deref() == Some("store_unavailable"))));
    assert!(results.iter().any(|r| r.status == RunStatus::Ok));
    assert_eq!(store.totals().await.unwrap().terminal_records, n as u64);
}

#[tokio::test]
async fn a_spool_left_by_an_earlier_process_is_replayed_at_start() {
    let dir = Scratch::new("leftover");
    let spool = dir.path("audit.spool");
    let (_, records) = real_run().await;
    let (id, run) = rekey(&records, |_| {});
    let mut lines = String::new();
    for r in &run {
        lines.push_str(&serde_json::to_string(r).unwrap());
        lines.push('\n');
    }
    // A crash cut the last line short.
    lines.push_str("{\"run_id\":\"0");
    std::fs::write(&spool, lines).unwrap();

    let store = Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap());
    let host = Host::builder()
        .config(HostConfig {
            audit_spool: Some(spool.clone()),
            ..HostConfig::default()
        })
        .audit_store(store.clone())
        .build()
        .await
        .unwrap();
    host.shutdown().await;
    assert_eq!(store.run_records(id).await.unwrap(), run);
    assert_eq!(std::fs::metadata(&spool).unwrap().len(), 0);
}

#[tokio::test]
async fn records_of_every_kind_round_trip() {
    let store = SqliteStore::open_memory().await.unwrap();
    let id = RunId::new();
    let ev = |seq: u32, e: RunEvent| AuditRecord {
        run_id: id,
        seq,
        at_ms: 1_700_000_000_000 + u64::from(seq),
        entry: AuditEntry::Event(e),
    };
    let batch = vec![
        ev(0, RunEvent::StepStart { iteration: 1 }),
        ev(
            1,
            RunEvent::Error {
                kind: "rate_limited".into(),
                message: "slow down \"now\"\n".into(),
            },
        ),
        ev(
            2,
            RunEvent::MessageCreate {
                role: "user".into(),
                text: "héllo ✓".into(),
            },
        ),
    ];
    store.append(&batch).await.unwrap();
    assert_eq!(store.run_records(id).await.unwrap(), batch);
}

#[tokio::test]
async fn checkpoints_are_replaced_cleared_and_survive_a_reopen() {
    use agentvisor::ports::checkpoint::{Checkpoint, Checkpointer, EncodedJson};
    use agentvisor::ports::model::{Message, Role};
    let dir = Scratch::new("checkpoints");
    let path = dir.path("c.db");
    let spec = EncodedJson::encode(&hello()).unwrap();
    let at = |run_id: RunId, iteration: u32| Checkpoint {
        run_id,
        agent: "hello".into(),
        spec: spec.clone(),
        invocation: EncodedJson::encode(&Invocation {
            run_id: Some(run_id),
            prompt: "go".into(),
            ..Invocation::default()
        })
        .unwrap(),
        transcript: Arc::new(vec![Message::text(Role::User, format!("step {iteration}"))]),
        iteration,
        steps: Vec::new(),
        usage: Default::default(),
        cost_micros: None,
        critic: Vec::new(),
        resumes: 0,
        started_at: 10,
        saved_at: 20 + u64::from(iteration),
        parked: None,
        unchanged: Default::default(),
    };
    let (a, b) = (RunId::new(), RunId::new());
    let lease = agentvisor::ports::checkpoint::Lease {
        owner: "test".into(),
        ttl: Duration::from_secs(60),
    };
    {
        let store = SqliteStore::open(&path).await.unwrap();
        // The first save of a run creates its row; later ones replace it.
        let lost = store.save(&[at(a, 0), at(b, 0)], &lease).await.unwrap();
        assert!(lost.is_empty(), "{lost:?}");
        store.save(&[at(a, 1), at(b, 1)], &lease).await.unwrap();
        store.save(&[at(a, 2)], &lease).await.unwrap();
        store.clear(&[b]).await.unwrap();
        store.close().await;
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let saved = store.load_all().await.unwrap();
    assert_eq!(saved, vec![at(a, 2)], "the latest save of a, nothing of b");
    store.clear(&[a]).await.unwrap();
    assert!(store.load_all().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_version_1_file_is_migrated_and_its_records_still_read_back() {
    let dir = Scratch::new("v1");
    let path = dir.path("a.db");
    let (_, records) = real_run().await;
    let (old_id, old_run) = rekey(&records, |_| {});
    {
        // A file as schema version 1 left it: one row per record.
        let conn = file_at_version(&path, 1);
        insert_version_1_records(&conn, old_id, &old_run);
        conn.close().unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store.version().await.unwrap(),
        agentvisor::stores::sqlite::SCHEMA_VERSION
    );
    assert_eq!(store.run_records(old_id).await.unwrap(), old_run);
    // New records go to segments; both generations read back, and the
    // totals count both.
    let (new_id, new_run) = rekey(&records, |_| {});
    store.append(&new_run).await.unwrap();
    assert_eq!(store.run_records(new_id).await.unwrap(), new_run);
    let totals = store.totals().await.unwrap();
    assert_eq!(totals.records, (old_run.len() + new_run.len()) as u64);
    assert_eq!(totals.terminal_records, 2);
    assert_eq!(
        store.list_runs(&RunFilter::default()).await.unwrap().len(),
        2
    );
}

#[tokio::test]
async fn records_split_over_batches_in_any_order_read_back_once_each() {
    let dir = Scratch::new("split");
    let store = SqliteStore::open(&dir.path("a.db")).await.unwrap();
    let (_, records) = real_run().await;
    let (a, run_a) = rekey(&records, |_| {});
    let (b, run_b) = rekey(&records, |_| {});
    // Two runs interleaved in one batch, the rest in a later one, and a
    // segment replayed with a different cut.
    let mid = run_a.len() / 2;
    let mut first = Vec::new();
    for i in 0..mid {
        first.push(run_a[i].clone());
        first.push(run_b[i].clone());
    }
    store.append(&first).await.unwrap();
    let mut rest: Vec<AuditRecord> = run_b[mid..].to_vec();
    rest.extend(run_a[mid..].iter().cloned());
    store.append(&rest).await.unwrap();
    store.append(&run_a[1..mid + 1]).await.unwrap();
    assert_eq!(store.run_records(a).await.unwrap(), run_a);
    assert_eq!(store.run_records(b).await.unwrap(), run_b);
    assert!(store.unfinished_runs().await.unwrap().is_empty());
    assert_eq!(store.totals().await.unwrap().terminal_records, 2);
}

/// A connection of another program to the file (created if missing).
fn connect(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

/// The migrations of every schema version, as the files hold them.
const MIGRATIONS: [(i64, &str); 17] = [
    (1, include_str!("../migrations/0001_init.sql")),
    (2, include_str!("../migrations/0002_segments.sql")),
    (3, include_str!("../migrations/0003_run_tail.sql")),
    (4, include_str!("../migrations/0004_compact_rows.sql")),
    (
        5,
        include_str!("../migrations/0005_partial_status_index.sql"),
    ),
    (6, include_str!("../migrations/0006_checkpoint_leases.sql")),
    (7, include_str!("../migrations/0007_sessions.sql")),
    (8, include_str!("../migrations/0008_host_leases.sql")),
    (9, include_str!("../migrations/0009_run_trees.sql")),
    (10, include_str!("../migrations/0010_retention.sql")),
    (11, include_str!("../migrations/0011_run_templates.sql")),
    (
        12,
        include_str!("../migrations/0012_checkpoint_entries.sql"),
    ),
    (13, include_str!("../migrations/0013_forks.sql")),
    (14, include_str!("../migrations/0014_manifests.sql")),
    (15, include_str!("../migrations/0015_outbox.sql")),
    (16, include_str!("../migrations/0016_schedules.sql")),
    (17, include_str!("../migrations/0017_writeback_intents.sql")),
];

/// Writes a run's records as schema version 1 did: one `audit_records`
/// row per record, the whole result in `runs`.
fn insert_version_1_records(conn: &rusqlite::Connection, id: RunId, run: &[AuditRecord]) {
    for r in run {
        let (kind, body) = match &r.entry {
            AuditEntry::RunStarted(info) => ("run.start", serde_json::to_string(info).unwrap()),
            AuditEntry::Event(ev) => {
                let v = serde_json::to_value(ev).unwrap();
                let kind = v["type"].as_str().unwrap().to_string();
                (Box::leak(kind.into_boxed_str()) as &str, v.to_string())
            }
            AuditEntry::Terminal(res) => {
                insert_whole_run(conn, id, res);
                ("run.end", String::new())
            }
            AuditEntry::Publish(_) => continue,
        };
        conn.execute(
            "INSERT INTO audit_records (run_id, seq, at_ms, kind, body) VALUES (?, ?, ?, ?, ?)",
            rusqlite::params![id.to_string(), i64::from(r.seq), r.at_ms as i64, kind, body],
        )
        .unwrap();
    }
}

#[tokio::test]
async fn a_file_of_every_earlier_schema_version_opens_and_reads() {
    let (_, records) = real_run().await;
    for version in 1..agentvisor::stores::sqlite::SCHEMA_VERSION {
        let dir = Scratch::new("every-version");
        let path = dir.path("a.db");
        let (id, run) = rekey(&records, |_| {});
        let AuditEntry::Terminal(res) = &run[run.len() - 1].entry else {
            panic!("the last record is not terminal");
        };
        {
            // Rows in the oldest form that version still reads.
            let conn = file_at_version(&path, version);
            if version == 1 {
                insert_version_1_records(&conn, id, &run);
            } else {
                insert_whole_segment(&conn, id, &run);
                insert_whole_run(&conn, id, res);
            }
            insert_old_checkpoint(&conn, id);
            conn.close().unwrap();
        }
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(
            store.version().await.unwrap(),
            agentvisor::stores::sqlite::SCHEMA_VERSION,
            "version {version} is migrated"
        );
        store.check().await.unwrap();
        assert_eq!(
            store.run_records(id).await.unwrap(),
            run,
            "version {version}"
        );
        assert_eq!(
            store.run_result(id).await.unwrap().as_ref(),
            Some(&**res),
            "version {version}"
        );
        let listed = store.list_runs(&RunFilter::default()).await.unwrap();
        assert_eq!(listed.len(), 1, "version {version}");
        // A checkpoint as builds before schema version 8 wrote it loads,
        // and its manifest and invocation decode.
        {
            use agentvisor::ports::checkpoint::Checkpointer;
            let saved = store.load_all().await.unwrap();
            assert_eq!(saved.len(), 1, "version {version}");
            assert_eq!(saved[0].run_id, id);
            assert_eq!(saved[0].spec.decode::<AgentSpec>().unwrap(), hello());
            let inv: Invocation = saved[0].invocation.decode().unwrap();
            assert_eq!(inv.prompt, "go");
        }
        // And it takes new runs.
        let (new_id, new_run) = rekey(&records, |_| {});
        store.append(&new_run).await.unwrap();
        assert_eq!(store.run_records(new_id).await.unwrap(), new_run);
        store.close().await;
    }
}

/// A durable run's checkpoint as builds before schema version 8 wrote it:
/// the manifest and the invocation as JSON objects inside `state`, no
/// agent name beside them.
fn insert_old_checkpoint(conn: &rusqlite::Connection, id: RunId) {
    use agentvisor::ports::checkpoint::{Checkpoint, EncodedJson};
    let now = Checkpoint {
        run_id: id,
        agent: "hello".into(),
        spec: EncodedJson::encode(&hello()).unwrap(),
        invocation: EncodedJson::encode(&Invocation {
            run_id: Some(id),
            prompt: "go".into(),
            ..Invocation::default()
        })
        .unwrap(),
        transcript: Arc::new(Vec::new()),
        iteration: 1,
        steps: Vec::new(),
        usage: Default::default(),
        cost_micros: None,
        critic: Vec::new(),
        resumes: 0,
        started_at: 1,
        saved_at: 2,
        parked: None,
        unchanged: Default::default(),
    };
    // The manifest and the invocation were nested as the same objects.
    let mut state = serde_json::to_value(&now).unwrap();
    state.as_object_mut().unwrap().remove("agent");
    conn.execute(
        "INSERT INTO checkpoints (run_id, agent, iteration, attempts, state, updated_at) \
         VALUES (?1, 'hello', 1, 0, ?2, 2)",
        rusqlite::params![id.to_string(), state.to_string()],
    )
    .unwrap();
}

/// A new file with the schema of `version` (migrations 1 to `version`).
fn file_at_version(path: &Path, version: i64) -> rusqlite::Connection {
    let conn = connect(path);
    conn.execute_batch(
        "CREATE TABLE schema_version \
         (version BIGINT NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)",
    )
    .unwrap();
    for (v, sql) in MIGRATIONS.into_iter().filter(|(v, _)| *v <= version) {
        conn.execute_batch(sql).unwrap();
        conn.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?, 0)",
            [v],
        )
        .unwrap();
    }
    conn
}

/// A segment as versions 2 and 3 wrote it: absolute times, every payload
/// as the record's own JSON, `null` for run.end.
fn whole_segment(run: &[AuditRecord]) -> String {
    let items: Vec<serde_json::Value> = run
        .iter()
        .map(|r| {
            let (kind, payload) = match &r.entry {
                AuditEntry::RunStarted(info) => {
                    ("run.start".to_string(), serde_json::to_value(info).unwrap())
                }
                AuditEntry::Event(ev) => {
                    let v = serde_json::to_value(ev).unwrap();
                    (v["type"].as_str().unwrap().to_string(), v)
                }
                AuditEntry::Terminal(_) => ("run.end".into(), serde_json::Value::Null),
                AuditEntry::Publish(_) => ("publish".into(), serde_json::Value::Null),
            };
            serde_json::json!([r.seq, r.at_ms, kind, payload])
        })
        .collect();
    serde_json::Value::Array(items).to_string()
}

/// Writes a `runs` row as versions 1 and 2 wrote it: the whole result,
/// no tail.
fn insert_whole_run(conn: &rusqlite::Connection, id: RunId, res: &RunResult) {
    conn.execute(
        "INSERT INTO runs (run_id, agent, status, started_at, finished_at, result) \
         VALUES (?, ?, ?, ?, ?, ?)",
        rusqlite::params![
            id.to_string(),
            res.agent,
            res.status.as_str(),
            res.started_at as i64,
            res.finished_at as i64,
            serde_json::to_string(res).unwrap()
        ],
    )
    .unwrap();
}

/// Writes `part` (a run's records, its `run.start` first) as a version-2
/// or -3 segment row.
fn insert_whole_segment(conn: &rusqlite::Connection, id: RunId, part: &[AuditRecord]) {
    conn.execute(
        "INSERT INTO audit_segments (run_id, first_seq, last_seq, records, has_start, body) \
         VALUES (?, ?, ?, ?, 1, ?)",
        rusqlite::params![
            id.to_string(),
            i64::from(part[0].seq),
            i64::from(part[part.len() - 1].seq),
            part.len() as i64,
            whole_segment(part)
        ],
    )
    .unwrap();
}

#[tokio::test]
async fn a_version_2_file_is_migrated_and_its_segments_still_read_back() {
    let dir = Scratch::new("v2");
    let path = dir.path("a.db");
    let (_, records) = real_run().await;
    let (old_id, old_run) = rekey(&records, |_| {});
    // A run cut in two: its first records in a version-2 segment, the rest
    // (with its terminal record) appended after the migration.
    let (split_id, split_run) = rekey(&records, |_| {});
    let cut = 3;
    {
        let conn = file_at_version(&path, 2);
        // Version 2's form: every payload as the record's own JSON (events
        // with their `type` tag, limits with every key), `null` for run.end.
        for (id, part) in [(old_id, &old_run[..]), (split_id, &split_run[..cut])] {
            insert_whole_segment(&conn, id, part);
        }
        let AuditEntry::Terminal(res) = &old_run[old_run.len() - 1].entry else {
            panic!("the last record is not terminal");
        };
        insert_whole_run(&conn, old_id, res);
        conn.close().unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store.version().await.unwrap(),
        agentvisor::stores::sqlite::SCHEMA_VERSION
    );
    assert_eq!(store.run_records(old_id).await.unwrap(), old_run);
    assert_eq!(
        store.unfinished_runs().await.unwrap(),
        vec![split_id],
        "the cut run has no terminal record yet"
    );
    store.append(&split_run[cut..]).await.unwrap();
    assert_eq!(store.run_records(split_id).await.unwrap(), split_run);
    assert!(store.unfinished_runs().await.unwrap().is_empty());
    // A run written now, in one batch: its records live in its `runs` row.
    let (new_id, new_run) = rekey(&records, |_| {});
    store.append(&new_run).await.unwrap();
    assert_eq!(store.run_records(new_id).await.unwrap(), new_run);
    let totals = store.totals().await.unwrap();
    let all = (old_run.len() + split_run.len() + new_run.len()) as u64;
    assert_eq!(totals.records, all);
    assert_eq!(totals.terminal_records, 3);
    // The view sees every record of every generation, each once.
    let conn = connect(&path);
    let (rows, kinds): (i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), COUNT(DISTINCT kind) FROM audit_log",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(rows as u64, all);
    assert!(kinds >= 5, "{kinds} kinds");
    let untagged: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM audit_log WHERE kind = 'step.start' AND run_id = ?",
            [new_id.to_string()],
            |r| r.get(0),
        )
        .unwrap();
    assert!(untagged > 0);
}

/// `records` re-keyed to a new run, their times spread over `step` ms each
/// (from `at`), so that stored times are more than one repeated value.
fn rekey_spread(records: &[AuditRecord], at: u64, step: u64) -> (RunId, Vec<AuditRecord>) {
    let (id, mut run) = rekey(records, |_| {});
    for (i, r) in run.iter_mut().enumerate() {
        r.at_ms = at + i as u64 * step;
    }
    (id, run)
}

/// Every `(seq, at_ms)` the `audit_log` view gives for a run, in order.
fn view_times(conn: &rusqlite::Connection, id: RunId) -> Vec<(i64, i64)> {
    let mut stmt = conn
        .prepare("SELECT seq, at_ms FROM audit_log WHERE run_id = ? ORDER BY seq")
        .unwrap();
    stmt.query_map([id.to_string()], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn times(run: &[AuditRecord]) -> Vec<(i64, i64)> {
    run.iter()
        .map(|r| (i64::from(r.seq), r.at_ms as i64))
        .collect()
}

#[tokio::test]
async fn a_version_3_file_is_migrated_and_its_rows_still_read_back() {
    let dir = Scratch::new("v3");
    let path = dir.path("a.db");
    let (_, records) = real_run().await;
    let (old_id, old_run) = rekey_spread(&records, 1_700_000_000_000, 7);
    // A run cut in two: its first records in a version-3 segment, the rest
    // (with its terminal record) appended after the migration.
    let (split_id, split_run) = rekey_spread(&records, 1_700_000_100_000, 1000);
    let cut = 4;
    {
        let conn = file_at_version(&path, 3);
        // Version 3's form: absolute times; a whole result in `runs.result`.
        insert_whole_segment(&conn, split_id, &split_run[..cut]);
        let AuditEntry::Terminal(res) = &old_run[old_run.len() - 1].entry else {
            panic!("the last record is not terminal");
        };
        conn.execute(
            "INSERT INTO runs (run_id, agent, caller_id, status, started_at, finished_at, result, \
             tail_first_seq, tail_records, tail) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
            rusqlite::params![
                old_id.to_string(),
                res.agent,
                res.caller_id,
                res.status.as_str(),
                res.started_at as i64,
                res.finished_at as i64,
                serde_json::to_string(&**res).unwrap(),
                old_run.len() as i64,
                whole_segment(&old_run)
            ],
        )
        .unwrap();
        conn.close().unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store.version().await.unwrap(),
        agentvisor::stores::sqlite::SCHEMA_VERSION
    );
    assert_eq!(store.run_records(old_id).await.unwrap(), old_run);
    assert_eq!(store.unfinished_runs().await.unwrap(), vec![split_id]);
    store.append(&split_run[cut..]).await.unwrap();
    assert_eq!(store.run_records(split_id).await.unwrap(), split_run);
    // A run written now, with a caller and a cost: the compact result reads
    // back whole.
    let (new_id, mut new_run) = rekey_spread(&records, 1_700_000_200_000, 123_456);
    if let Some(AuditEntry::Terminal(res)) = new_run.last().map(|r| r.entry.clone()) {
        let mut res = RunResult::clone(&res);
        res.caller_id = Some("c\"1".into());
        res.cost_micros = 42;
        res.error = Some("e".into());
        if let Some(last) = new_run.last_mut() {
            last.entry = AuditEntry::Terminal(Arc::new(res));
        }
    }
    store.append(&new_run).await.unwrap();
    assert_eq!(store.run_records(new_id).await.unwrap(), new_run);
    let AuditEntry::Terminal(new_res) = &new_run[new_run.len() - 1].entry else {
        panic!("the last record is not terminal");
    };
    assert_eq!(
        store.run_result(new_id).await.unwrap().as_ref(),
        Some(&**new_res)
    );
    let totals = store.totals().await.unwrap();
    assert_eq!(
        totals.records,
        (old_run.len() + split_run.len() + new_run.len()) as u64
    );
    assert_eq!(totals.terminal_records, 2 + 1);
    // The view gives absolute times for rows of both versions.
    let conn = connect(&path);
    assert_eq!(view_times(&conn, old_id), times(&old_run));
    assert_eq!(view_times(&conn, split_id), times(&split_run));
    assert_eq!(view_times(&conn, new_id), times(&new_run));
    // New rows store offsets: the times cost a few digits each.
    let tail: String = conn
        .query_row(
            "SELECT tail FROM runs WHERE run_id = ?",
            [new_id.to_string()],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!tail.contains("1700000"), "{tail}");
}

#[tokio::test]
async fn committed_rows_reach_the_database_file_before_the_wal_is_full() {
    // The writer's own checkpoint copies the WAL into the file at 64 MiB;
    // the background checkpointer does it while rows come, every 16 MiB.
    let dir = Scratch::new("bgckpt");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let (_, records) = real_run().await;
    let before = std::fs::metadata(&path).unwrap().len();
    let big = "x".repeat(100_000);
    for _ in 0..25 {
        let mut batch = Vec::new();
        for _ in 0..10 {
            let (_, run) = rekey(&records, |r| r.output = Some(big.clone()));
            batch.extend(run);
        }
        store.append(&batch).await.unwrap();
    }
    let wal = std::fs::metadata(dir.path("a.db-wal")).unwrap().len();
    assert!(wal < 60 << 20, "the writer's own checkpoint ran: WAL {wal}");
    // The checkpoint runs on its own thread, which says nothing when it is
    // done (a store has no hook for it): poll the file's size, a bounded
    // while — the one wall-clock wait here, with its reason.
    let mut grown = 0;
    for _ in 0..200 {
        grown = std::fs::metadata(&path)
            .unwrap()
            .len()
            .saturating_sub(before);
        if grown > 8 << 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(grown > 8 << 20, "the file grew by {grown} bytes only");
    assert_eq!(store.totals().await.unwrap().terminal_records, 250);
    store.close().await;
}

/// Polls `f` once (to queue its batch with the store), leaving it pending.
/// Polls `f` once; panics if it is done (the caller needs it queued, not
/// answered).
async fn poll_once<F: std::future::Future + Unpin>(f: &mut F) {
    std::future::poll_fn(|cx| {
        assert!(
            std::pin::Pin::new(&mut *f).poll(cx).is_pending(),
            "answered at its first poll"
        );
        std::task::Poll::Ready(())
    })
    .await;
}

/// Holds the database's write lock from another connection until
/// `COMMIT`: the writer waits at its `BEGIN` (well within its busy
/// timeout), so appends queue up behind it without one answering.
fn write_lock(conn: &rusqlite::Connection) {
    conn.execute_batch("BEGIN IMMEDIATE; UPDATE fault SET on_ = on_;")
        .unwrap();
}

/// A trigger that fails every insert into `runs` while `fault.on_` is 1,
/// and those of the run `fault.run_id` always.
fn fault_switch(path: &Path) -> rusqlite::Connection {
    let conn = connect(path);
    conn.execute_batch(
        "CREATE TABLE fault (on_ INTEGER NOT NULL, run_id TEXT); \
         INSERT INTO fault (on_) VALUES (0); \
         CREATE TRIGGER fault_runs BEFORE INSERT ON runs \
         WHEN (SELECT on_ FROM fault) = 1 OR NEW.run_id = (SELECT run_id FROM fault) \
         BEGIN SELECT RAISE(ABORT, 'injected fault'); END;",
    )
    .unwrap();
    conn
}

fn set_fault(conn: &rusqlite::Connection, on: bool) {
    conn.execute("UPDATE fault SET on_ = ?", [i64::from(on)])
        .unwrap();
}

#[tokio::test]
async fn a_batch_queued_behind_a_failed_one_is_not_written() {
    let dir = Scratch::new("chain");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    assert!(store.pipelines());
    let faults = fault_switch(&path);
    let (_, records) = real_run().await;
    let (first_id, first) = rekey(&records, |_| {});
    let (second_id, second) = rekey(&records, |_| {});
    faults
        .execute("UPDATE fault SET run_id = ?", [first_id.to_string()])
        .unwrap();
    // Both queued before either answers (the writer waits for the lock),
    // in this order: the first fails, so the second, which would be
    // written on its own, is not.
    write_lock(&faults);
    let mut a = Box::pin(store.append(&first));
    poll_once(&mut a).await;
    let mut b = Box::pin(store.append(&second));
    poll_once(&mut b).await;
    faults.execute_batch("COMMIT").unwrap();
    let (ra, rb) = (a.await, b.await);
    assert!(ra.unwrap_err().to_string().contains("injected fault"));
    let e = rb.expect_err("written ahead of the batch before it");
    assert!(e.to_string().contains("before it failed"), "{e}");
    assert!(store.run_records(second_id).await.unwrap().is_empty());
    // On its own (nothing in flight), a batch is written.
    store.append(&second).await.unwrap();
    assert_eq!(store.run_records(second_id).await.unwrap(), second);
    // And one queued behind a batch that was written is written too.
    let (third_id, third) = rekey(&records, |_| {});
    let (fourth_id, fourth) = rekey(&records, |_| {});
    write_lock(&faults);
    let mut c = Box::pin(store.append(&third));
    poll_once(&mut c).await;
    let mut d = Box::pin(store.append(&fourth));
    poll_once(&mut d).await;
    faults.execute_batch("COMMIT").unwrap();
    c.await.unwrap();
    d.await.unwrap();
    assert_eq!(store.run_records(third_id).await.unwrap(), third);
    assert_eq!(store.run_records(fourth_id).await.unwrap(), fourth);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failing_under_pipelined_batches_loses_and_reorders_nothing() {
    let dir = Scratch::new("pipefail");
    let path = dir.path("a.db");
    let spool = dir.path("audit.spool");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let faults = fault_switch(&path);
    let host = Host::builder()
        .config(HostConfig {
            audit_spool: Some(spool.clone()),
            // Small batches: many in flight one behind the other.
            audit_batch: 16,
            ..HostConfig::default()
        })
        .audit_store(store.clone())
        .build()
        .await
        .unwrap();
    let agent = host.agent(hello()).unwrap();
    let n = 300;
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(
            host.submit(&agent, Invocation::prompt("add"))
                .await
                .unwrap(),
        );
    }
    let mut results = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        // The store fails for the middle third of the results.
        if i == n / 3 {
            set_fault(&faults, true);
        }
        if i == 2 * n / 3 {
            set_fault(&faults, false);
        }
        results.push(
            tokio::time::timeout(Duration::from_secs(20), h)
                .await
                .expect("a run blocked on its audit record"),
        );
    }
    set_fault(&faults, false);
    host.shutdown().await;
    assert!(results.iter().all(|r| r.status == RunStatus::Ok));
    assert_eq!(store.totals().await.unwrap().terminal_records, n as u64);
    for r in &results {
        let records = store.run_records(r.run_id).await.unwrap();
        let seqs: Vec<u32> = records.iter().map(|x| x.seq).collect();
        let expected: Vec<u32> = (0..records.len() as u32).collect();
        assert_eq!(seqs, expected, "run {} has a gap", r.run_id);
        assert!(matches!(
            records.first().map(|x| &x.entry),
            Some(AuditEntry::RunStarted(_))
        ));
        assert!(records.last().is_some_and(AuditRecord::is_terminal));
        // The agent loop's own records; a machine under load may add a
        // critic decision or a warning (a slow handler), which are records
        // too but not the loop's.
        let own = records
            .iter()
            .filter(|x| {
                !matches!(
                    &x.entry,
                    AuditEntry::Event(
                        RunEvent::CriticSteer(_)
                            | RunEvent::CriticExtend(_)
                            | RunEvent::CriticRaiseIterations(_)
                            | RunEvent::Warning { .. }
                    )
                )
            })
            .count();
        assert_eq!(own, 13, "run {}", r.run_id);
    }
}

/// `records` re-keyed, with its second tool call failed (the `tool.result`
/// and the step say so, as the run actor writes them) and its first
/// answer too long for a summary.
fn with_error_and_long_answer(records: &[AuditRecord]) -> (RunId, Vec<AuditRecord>) {
    let long = "x".repeat(SUMMARY_BYTES * 3);
    let failure = "error: invalid_arguments: `text` is required";
    let (id, mut run) = rekey(records, |r| {
        r.steps[0].result = cap_text(&long, SUMMARY_BYTES);
        r.steps[1].ok = false;
        r.steps[1].error = Some(failure["error: ".len()..].to_string());
        r.steps[1].result = failure.to_string();
    });
    let mut results = 0;
    for r in &mut run {
        if let AuditEntry::Event(RunEvent::ToolResult { ok, result, .. }) = &mut r.entry {
            if results == 0 {
                *result = long.clone();
            } else {
                *ok = false;
                *result = failure.to_string();
            }
            results += 1;
        }
    }
    assert_eq!(results, 2, "the hello run makes two tool calls");
    (id, run)
}

#[tokio::test]
async fn a_runs_steps_are_stored_once_and_read_back_whole() {
    let dir = Scratch::new("steps");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let (_, records) = real_run().await;
    // Whole in one batch: its steps are read back from its tool records.
    let (whole_id, whole) = rekey(&records, |_| {});
    let (odd_answers_id, odd_answers) = with_error_and_long_answer(&records);
    // Steps the records do not give (a summary that is not the answer's):
    // written as they are.
    let (unlike_id, unlike) = rekey(&records, |r| {
        r.steps[0].result = "not what the tool said".into();
    });
    // Cut in two batches: its tail does not hold all its records.
    let (split_id, split) = rekey(&records, |_| {});
    store.append(&whole).await.unwrap();
    store.append(&odd_answers).await.unwrap();
    store.append(&unlike).await.unwrap();
    store.append(&split[..4]).await.unwrap();
    store.append(&split[4..]).await.unwrap();
    let runs = [
        (whole_id, &whole, true),
        (odd_answers_id, &odd_answers, true),
        (unlike_id, &unlike, false),
        (split_id, &split, false),
    ];
    let conn = connect(&path);
    for (id, run, from_tail) in runs {
        let AuditEntry::Terminal(res) = &run.last().unwrap().entry else {
            panic!("the last record is not terminal");
        };
        assert_eq!(res.steps.len(), 2);
        assert_eq!(store.run_result(id).await.unwrap().as_ref(), Some(&**res));
        assert_eq!(&store.run_records(id).await.unwrap(), run);
        let stored: String = conn
            .query_row(
                // A repeated result is stored once (schema version 11).
                "SELECT CASE WHEN result_ref IS NULL THEN result ELSE \
                 (SELECT body FROM run_templates WHERE id = result_ref) END \
                 FROM runs WHERE run_id = ?",
                [id.to_string()],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(stored.contains(r#""steps":"tail""#), from_tail, "{stored}");
        assert_eq!(stored.contains(r#""steps":["#), !from_tail, "{stored}");
    }
}

#[tokio::test]
async fn the_ledger_saturates_instead_of_storing_a_float() {
    // Two commits of every token there is, into one minute's row: the sum
    // stays an integer (SQLite would turn it into a floating-point value
    // no reader takes), and the caller's spend still reads.
    let dir = Scratch::new("ledger-overflow");
    let store = SqliteStore::open(&dir.path("a.db")).await.unwrap();
    let huge = Spend {
        tokens: u64::MAX,
        cost_micros: u64::MAX,
        runtime_ms: 1,
        runs: 1,
    };
    for _ in 0..2 {
        store.commit(&[("greedy".to_string(), huge)]).await.unwrap();
    }
    let spent = store
        .spent("greedy", Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(spent.tokens, i64::MAX as u64);
    assert_eq!(spent.cost_micros, i64::MAX as u64);
    assert_eq!(spent.runs, 2);
    // Limits still read and write for that caller.
    let limits = BudgetLimits {
        tokens: Some(10),
        ..Default::default()
    };
    store.set_limits("greedy", limits).await.unwrap();
    assert_eq!(store.limits("greedy").await.unwrap().tokens, Some(10));
}
