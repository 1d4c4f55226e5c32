#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! One suite of port tests for every store battery — in memory, SQLite and
//! (with the `postgres` feature, against the server on 127.0.0.1:5432, or
//! `AGENTVISOR_TEST_POSTGRES`) PostgreSQL — so they behave the same: a
//! batch reads back in order and a replayed one adds nothing; terminal
//! records fill the run index, its filters and its keyset pages; a run in
//! flight is unfinished; a run's manifest reads back whole; retention
//! prunes the oldest runs and counts them (the persistent stores); the
//! budget ledger keeps limits and sums spend by caller; checkpoints keep
//! their leases and fencing and rebuild from deltas (`checkpoints`);
//! sessions keep their history and its rules (`sessions`); a run's
//! publish intents are written with its batch, claimed by one publisher
//! and settled once (`outbox`); schedules' states read back whole
//! (`schedules`); parked git writes keep their order until cleared
//! (`writeback`).
//!
//! Each port's tests take the port as `Arc<dyn Port>`; [`conformance!`]
//! makes one test per battery of the build from each, with the batteries
//! of the module it is used in (`memory`, `sqlite`, `postgres`).

mod support;

use std::sync::Arc;

use agentvisor::ports::audit::{
    AuditEntry, AuditRecord, AuditStore, RecordedManifest, RunCursor, RunFilter, RunIndex,
};
use agentvisor::ports::budget::{BudgetLedger, BudgetLimits, Spend};
use agentvisor::ports::checkpoint::EncodedJson;
use agentvisor::ports::retention::Retention;
use agentvisor::stores::{MemoryAuditStore, MemoryBudgetLedger, SqliteStore};
use agentvisor::{AgentSpec, RunId, RunStatus};
use support::rekey;
use support::scratch::Scratch;

trait Store: AuditStore + RunIndex {}
impl<T: AuditStore + RunIndex> Store for T {}

fn hello() -> AgentSpec {
    support::hello_spec()
}

/// The records of one real `hello` run (its start names its manifest).
async fn real_run() -> Vec<AuditRecord> {
    support::hello_run().await.1
}

const BASE: u64 = 1_700_000_000_000;

/// `n` runs: run `i` finishes at `BASE + i s` (ties every fifth pair),
/// caller `c{i % 3}`, status `error` for every fourth.
async fn fill(store: &dyn Store, n: u64) -> Vec<RunId> {
    let records = real_run().await;
    let mut batch = Vec::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let (id, run) = rekey(&records, |res| {
            let at = BASE + (i - i % 2 * u64::from(i % 5 == 1)) * 1000;
            res.started_at = at - 10;
            res.finished_at = at;
            res.caller_id = Some(format!("c{}", i % 3));
            if i % 4 == 0 {
                res.status = RunStatus::Error;
                res.error_kind = Some("tool_errors".into());
            }
        });
        ids.push(id);
        batch.extend(run);
    }
    store.append(&batch).await.unwrap();
    ids
}

async fn a_batch_reads_back_in_order_and_a_replay_adds_nothing(store: Arc<dyn Store>) {
    let records = real_run().await;
    let (id, run) = rekey(&records, |_| {});
    store.append(&run).await.unwrap();
    assert_eq!(store.run_records(id).await.unwrap(), run);
    // The same batch again (a spool replayed after an outage), and its
    // second half alone: still one copy of each record.
    store.append(&run).await.unwrap();
    store.append(&run[run.len() / 2..]).await.unwrap();
    assert_eq!(store.run_records(id).await.unwrap(), run);
    let listed = store.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(listed.iter().filter(|r| r.run_id == id).count(), 1);
    assert!(store.run_records(RunId::new()).await.unwrap().is_empty());
}

async fn terminal_records_fill_the_index_its_filters_and_pages(store: Arc<dyn Store>) {
    let ids = fill(&*store, 30).await;
    let all = store.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(all.len(), 30);
    // Newest first; ties: the larger id first.
    for w in all.windows(2) {
        assert!((w[0].finished_at, w[0].run_id) > (w[1].finished_at, w[1].run_id));
    }
    let errors = store
        .list_runs(&RunFilter {
            status: Some(RunStatus::Error),
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(errors.len(), 8);
    assert!(errors.iter().all(|r| r.status == RunStatus::Error));
    let oks = store
        .list_runs(&RunFilter {
            status: Some(RunStatus::Ok),
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(oks.len(), 22);
    let c1 = store
        .list_runs(&RunFilter {
            caller: Some("c1".into()),
            limit: Some(4),
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(c1.len(), 4);
    assert!(c1.iter().all(|r| r.caller_id.as_deref() == Some("c1")));
    // Pages of 7 after a cursor: every run exactly once, in order.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_runs(&RunFilter {
                limit: Some(7),
                after,
                ..RunFilter::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(RunCursor::after(last));
        paged.extend(page);
    }
    assert_eq!(paged, all);
    // A run's result; an unknown run has none.
    let r = store.run_result(ids[3]).await.unwrap().unwrap();
    assert_eq!(r.run_id, ids[3]);
    assert_eq!(r.output.as_deref(), Some("2+3=5, DONE"));
    assert!(store.run_result(RunId::new()).await.unwrap().is_none());
}

async fn a_run_in_flight_is_unfinished_until_its_terminal_record(store: Arc<dyn Store>) {
    let records = real_run().await;
    let (id, run) = rekey(&records, |_| {});
    let (end, rest) = run.split_last().unwrap();
    store.append(rest).await.unwrap();
    assert!(store.unfinished_runs().await.unwrap().contains(&id));
    assert!(store.run_result(id).await.unwrap().is_none());
    store.append(std::slice::from_ref(end)).await.unwrap();
    assert!(!store.unfinished_runs().await.unwrap().contains(&id));
    assert_eq!(store.run_records(id).await.unwrap(), run);
}

async fn a_runs_manifest_reads_back_whole(store: Arc<dyn Store>) {
    let mut spec = hello();
    spec.system = "You are the conformance suite.".into();
    let manifest = RecordedManifest::of(EncodedJson::encode(&spec).unwrap());
    let records = real_run().await;
    let (id, mut run) = rekey(&records, |_| {});
    for r in &mut run {
        if let AuditEntry::RunStarted(info) = &mut r.entry {
            info.manifest = Some(manifest.clone());
        }
    }
    store.append(&run).await.unwrap();
    let back = store.run_records(id).await.unwrap();
    let json = back
        .iter()
        .find_map(|r| match &r.entry {
            AuditEntry::RunStarted(info) => info.manifest.clone(),
            _ => None,
        })
        .and_then(|m| m.json)
        .expect("the manifest reads back");
    assert_eq!(json.decode::<AgentSpec>().unwrap(), spec);
}

async fn the_oldest_runs_past_max_runs_are_pruned_and_counted(store: Arc<dyn Store>) {
    let ids = fill(&*store, 10).await;
    let max: Retention = "max_runs=4".parse().unwrap();
    let dry = store.prune(&max, BASE, 100, true).await.unwrap();
    assert_eq!((dry.runs, dry.dry_run), (6, true));
    assert_eq!(
        store.list_runs(&RunFilter::default()).await.unwrap().len(),
        10
    );
    let report = store.prune(&max, BASE, 100, false).await.unwrap();
    assert_eq!(report.runs, 6);
    assert_eq!(report.records, 6 * real_run().await.len() as u64);
    let kept = store.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(kept.len(), 4);
    // The newest four stay (runs 6 to 9 finish last), whole.
    for id in &ids[6..] {
        assert!(kept.iter().any(|r| r.run_id == *id));
        assert!(store.run_result(*id).await.unwrap().is_some());
    }
    for id in &ids[..6] {
        assert!(store.run_records(*id).await.unwrap().is_empty());
    }
    let counted: u64 = store.pruned().await.unwrap().iter().map(|c| c.runs).sum();
    assert_eq!(counted, 6);
    let by_error: u64 = store
        .pruned()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.status == RunStatus::Error)
        .map(|c| c.runs)
        .sum();
    // Runs 0 and 4 of the six oldest ended `error`.
    assert_eq!(by_error, 2);
}

async fn a_ledger_keeps_limits_and_sums_spend_by_caller(ledger: Arc<dyn BudgetLedger>) {
    // No limits of its own: the defaults (none).
    assert_eq!(
        ledger.limits("alice").await.unwrap(),
        BudgetLimits::default()
    );
    let alice = BudgetLimits {
        tokens: Some(1000),
        cost_micros: Some(5),
        runtime_secs: None,
        concurrent_runs: Some(3),
        window_secs: Some(3600),
    };
    ledger.set_limits("alice", alice).await.unwrap();
    let bob = BudgetLimits {
        tokens: Some(7),
        ..BudgetLimits::default()
    };
    ledger.set_limits("bob", bob).await.unwrap();
    ledger.set_limits("bob", alice).await.unwrap();
    assert_eq!(ledger.limits("alice").await.unwrap(), alice);
    assert_eq!(
        ledger.list_limits().await.unwrap(),
        vec![("alice".to_string(), alice), ("bob".to_string(), alice)]
    );
    // Spend adds up per caller, across commits and within one.
    let spend = |tokens, runs| Spend {
        tokens,
        cost_micros: tokens * 2,
        runtime_ms: 10,
        runs,
    };
    ledger
        .commit(&[
            ("alice".into(), spend(100, 1)),
            ("carol".into(), spend(1, 1)),
            ("alice".into(), spend(20, 1)),
        ])
        .await
        .unwrap();
    ledger
        .commit(&[("alice".into(), spend(3, 1))])
        .await
        .unwrap();
    let window = std::time::Duration::from_secs(3600);
    assert_eq!(
        ledger.spent("alice", window).await.unwrap(),
        Spend {
            tokens: 123,
            cost_micros: 246,
            runtime_ms: 30,
            runs: 3
        }
    );
    assert_eq!(ledger.spent("carol", window).await.unwrap(), spend(1, 1));
    assert_eq!(
        ledger.spent("dave", window).await.unwrap(),
        Spend::default()
    );
    // A sum past what a store can hold stops there instead of failing.
    ledger
        .commit(&[("eve".into(), spend(u64::MAX / 2, 0))])
        .await
        .unwrap();
    ledger
        .commit(&[("eve".into(), spend(u64::MAX / 2, 0))])
        .await
        .unwrap();
    assert!(ledger.spent("eve", window).await.unwrap().tokens >= i64::MAX as u64);
}

async fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryAuditStore::new())
}

async fn sqlite(dir: &Scratch) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap())
}

#[cfg(feature = "postgres")]
async fn postgres() -> Arc<dyn Store> {
    Arc::new(support::postgres::fresh_store().await)
}

/// `$name` as a test of every battery the build has: memory, SQLite and
/// PostgreSQL (made by the functions of those names in the module it is
/// used in); `persistent`: only those that keep a history.
macro_rules! conformance {
    ($name:ident) => {
        conformance!($name, persistent, {
            #[tokio::test]
            async fn memory() {
                super::$name(super::memory().await).await;
            }
        });
    };
    ($name:ident, persistent) => {
        conformance!($name, persistent, {});
    };
    ($name:ident, persistent, { $($memory:tt)* }) => {
        mod $name {
            use super::*;

            $($memory)*

            #[tokio::test]
            async fn sqlite() {
                let dir = Scratch::new(stringify!($name));
                super::$name(super::sqlite(&dir).await).await;
            }

            #[cfg(feature = "postgres")]
            #[tokio::test]
            async fn postgres() {
                super::$name(super::postgres().await).await;
            }
        }
    };
}

mod a_ledger_keeps_limits_and_sums_spend_by_caller {
    use super::*;

    #[tokio::test]
    async fn memory() {
        super::a_ledger_keeps_limits_and_sums_spend_by_caller(Arc::new(MemoryBudgetLedger::new()))
            .await;
    }

    #[tokio::test]
    async fn sqlite() {
        let dir = Scratch::new("ledger");
        let store = SqliteStore::open(&dir.path("a.db")).await.unwrap();
        super::a_ledger_keeps_limits_and_sums_spend_by_caller(Arc::new(store)).await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres() {
        let store = support::postgres::fresh_store().await;
        super::a_ledger_keeps_limits_and_sums_spend_by_caller(Arc::new(store)).await;
    }
}

conformance!(a_batch_reads_back_in_order_and_a_replay_adds_nothing);
conformance!(terminal_records_fill_the_index_its_filters_and_pages);
conformance!(a_run_in_flight_is_unfinished_until_its_terminal_record);
conformance!(a_runs_manifest_reads_back_whole);
// The in-memory store keeps a window of records, not a history: it has
// nothing to prune.
conformance!(
    the_oldest_runs_past_max_runs_are_pruned_and_counted,
    persistent
);

/// Retention never prunes a run that still has a checkpoint (its record
/// is not yet settled), nor lets it shift which runs `max_runs` keeps.
mod checkpointed {
    use super::*;
    use agentvisor::ports::checkpoint::{Checkpoint, Checkpointer, Lease};

    trait Kept: Store + Checkpointer {}
    impl<T: Store + Checkpointer> Kept for T {}

    async fn sqlite(dir: &Scratch) -> Arc<dyn Kept> {
        Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap())
    }

    #[cfg(feature = "postgres")]
    async fn postgres() -> Arc<dyn Kept> {
        Arc::new(support::postgres::fresh_store().await)
    }

    async fn a_run_with_a_checkpoint_is_never_pruned(store: Arc<dyn Kept>) {
        let ids = fill(&*store, 6).await;
        // The oldest run (tied with the next) has a checkpoint still.
        let checkpoint = Checkpoint {
            run_id: ids[0],
            agent: "hello".into(),
            spec: EncodedJson::encode(&hello()).unwrap(),
            invocation: EncodedJson::encode(&agentvisor::Invocation::default()).unwrap(),
            transcript: Arc::new(Vec::new()),
            iteration: 0,
            steps: Vec::new(),
            usage: Default::default(),
            cost_micros: None,
            critic: Vec::new(),
            resumes: 0,
            started_at: BASE,
            saved_at: BASE,
            parked: None,
            unchanged: Default::default(),
        };
        let lease = Lease {
            owner: "host".into(),
            ttl: std::time::Duration::from_secs(60),
        };
        assert!(store.save(&[checkpoint], &lease).await.unwrap().is_empty());
        let max: Retention = "max_runs=2".parse().unwrap();
        let report = store.prune(&max, BASE, 100, false).await.unwrap();
        assert_eq!(report.runs, 3, "the four past the bound but one");
        assert!(store.run_result(ids[0]).await.unwrap().is_some());
        assert_eq!(
            store.list_runs(&RunFilter::default()).await.unwrap().len(),
            3
        );
    }

    conformance!(a_run_with_a_checkpoint_is_never_pruned, persistent);
}

#[path = "store_conformance/checkpoints.rs"]
mod checkpoints;
#[path = "store_conformance/outbox.rs"]
mod outbox;
#[path = "store_conformance/schedules.rs"]
mod schedules;
#[path = "store_conformance/sessions.rs"]
mod sessions;
#[path = "store_conformance/writeback.rs"]
mod writeback;
