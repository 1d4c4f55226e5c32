#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Retention (P1): the oldest finished runs pruned by count, age and
//! bytes, in batches, with their counts kept; never a run in flight or one
//! with a checkpoint; the file shrinking; the host's background pruning on
//! its own clock; `--retain` and `runs prune` at the command line.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentvisor::ports::audit::{
    AuditRecord, AuditStats, AuditStore, AuditStoreError, RunFilter, RunIndex,
};
use agentvisor::ports::retention::{PruneReport, Retention};
use agentvisor::stores::{MemoryAuditStore, SqliteStore};
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunId, RunStatus};
use async_trait::async_trait;
use support::rekey;
use support::scratch::Scratch;

const DAY: u64 = 86_400_000;
const BASE: u64 = 1_700_000_000_000;

fn hello() -> AgentSpec {
    support::hello_spec()
}

/// The records of one real `hello` run (its start names its manifest).
async fn real_run() -> Vec<AuditRecord> {
    support::hello_run().await.1
}

/// `n` finished runs, run `i` finishing at `BASE + i days` (status `error`
/// for every third, so counts by status show).
async fn fill(store: &SqliteStore, records: &[AuditRecord], n: u64) -> Vec<RunId> {
    fill_with(store, records, n, false).await
}

/// [`fill`]; `unique`: each run's output differs (1 kB), so no two rows
/// share their result text.
async fn fill_with(
    store: &SqliteStore,
    records: &[AuditRecord],
    n: u64,
    unique: bool,
) -> Vec<RunId> {
    let mut ids = Vec::new();
    let mut batch = Vec::new();
    for i in 0..n {
        let (id, run) = rekey(records, |res| {
            res.started_at = BASE + i * DAY - 10;
            res.finished_at = BASE + i * DAY;
            if unique {
                res.output = Some(format!("{i:>1000}"));
            }
            if i % 3 == 0 {
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

fn retain(s: &str) -> Retention {
    s.parse().unwrap()
}

async fn listed(store: &SqliteStore) -> Vec<RunId> {
    let mut ids: Vec<RunId> = store
        .list_runs(&RunFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|r| r.run_id)
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn the_oldest_runs_past_max_runs_are_pruned_and_still_counted() {
    let dir = Scratch::new("max-runs");
    let store = SqliteStore::open(&dir.path("a.db")).await.unwrap();
    let records = real_run().await;
    let ids = fill(&store, &records, 10).await;
    let before = store.totals().await.unwrap();

    let report = store
        .prune(&retain("max_runs=4"), BASE + 20 * DAY, 100, false)
        .await
        .unwrap();
    assert_eq!(report.runs, 6);
    assert_eq!(report.records, 6 * records.len() as u64);
    assert!(!report.more);
    // The four newest stay, readable whole; the others are gone.
    let mut newest = ids[6..].to_vec();
    newest.sort();
    assert_eq!(listed(&store).await, newest);
    assert_eq!(
        store.run_records(ids[9]).await.unwrap().len(),
        records.len()
    );
    assert!(store.run_records(ids[0]).await.unwrap().is_empty());
    // Totals over the file still count every run and record.
    assert_eq!(
        store.totals().await.unwrap(),
        AuditStats {
            batches: 1,
            ..before
        }
    );
    // By agent and status: runs 0 and 3 ended `error`, 1, 2, 4, 5 `ok`.
    let mut pruned = store.pruned().await.unwrap();
    pruned.sort_by_key(|c| c.status.as_str());
    let counts: Vec<_> = pruned
        .iter()
        .map(|c| (c.agent.as_str(), c.status, c.runs))
        .collect();
    assert_eq!(
        counts,
        vec![("hello", RunStatus::Error, 2), ("hello", RunStatus::Ok, 4)]
    );
    // Again: nothing more to do.
    let again = store
        .prune(&retain("max_runs=4"), BASE + 20 * DAY, 100, false)
        .await
        .unwrap();
    assert_eq!(again.runs, 0);
}

#[tokio::test]
async fn runs_older_than_max_age_are_pruned_by_the_clock_given() {
    let dir = Scratch::new("max-age");
    let store = SqliteStore::open(&dir.path("a.db")).await.unwrap();
    let records = real_run().await;
    let ids = fill(&store, &records, 10).await;
    // At BASE + 10 days, a 7-day bound keeps the runs that finished from
    // day 3 on (day 3 is exactly 7 days old: kept).
    let now = BASE + 10 * DAY;
    let dry = store
        .prune(&retain("max_age=7d"), now, 100, true)
        .await
        .unwrap();
    assert_eq!((dry.runs, dry.dry_run), (3, true));
    assert_eq!(listed(&store).await.len(), 10, "a dry run removes nothing");
    let report = store
        .prune(&retain("max_age=7d"), now, 100, false)
        .await
        .unwrap();
    assert_eq!(report.runs, 3);
    let mut kept = ids[3..].to_vec();
    kept.sort();
    assert_eq!(listed(&store).await, kept);
    // A day later one more is too old.
    let later = store
        .prune(&retain("max_age=7d"), now + DAY, 100, false)
        .await
        .unwrap();
    assert_eq!(later.runs, 1);
}

#[tokio::test]
async fn pruning_goes_in_batches_and_never_takes_a_run_in_flight_or_checkpointed() {
    let dir = Scratch::new("never");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let records = real_run().await;
    let ids = fill(&store, &records, 6).await;
    // A run in flight: its records without the terminal one.
    let (flying, run) = rekey(&records, |_| {});
    let partial: Vec<_> = run.into_iter().filter(|r| !r.is_terminal()).collect();
    store.append(&partial).await.unwrap();
    // The oldest finished run has a checkpoint (as a durable run parked
    // for approval has).
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "INSERT INTO checkpoints (run_id, agent, iteration, attempts, state, updated_at) \
             VALUES (?1, 'hello', 1, 0, '{}', 0)",
            [ids[0].to_string()],
        )
        .unwrap();
    }
    let everything = retain("max_runs=0");
    let first = store.prune(&everything, BASE, 2, false).await.unwrap();
    assert_eq!((first.runs, first.more), (2, true), "one batch of two");
    let mut total = first.runs;
    loop {
        let r = store.prune(&everything, BASE, 2, false).await.unwrap();
        total += r.runs;
        if !r.more || r.runs == 0 {
            break;
        }
    }
    assert_eq!(total, 5);
    assert_eq!(listed(&store).await, vec![ids[0]]);
    assert_eq!(store.unfinished_runs().await.unwrap(), vec![flying]);
    assert_eq!(store.run_records(flying).await.unwrap(), partial);
}

#[tokio::test]
async fn a_new_file_shrinks_when_its_runs_are_pruned() {
    let dir = Scratch::new("shrink");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    assert!(store.footprint().await.unwrap().shrinks());
    let records = real_run().await;
    for _ in 0..4 {
        fill_with(&store, &records, 1000, true).await;
    }
    let full = store.footprint().await.unwrap();
    let report = store
        .prune(&retain("max_runs=100"), BASE, 10_000, false)
        .await
        .unwrap();
    assert_eq!(report.runs, 3900);
    let after = store.footprint().await.unwrap();
    assert!(
        after.pages * 4 < full.pages,
        "pages {} -> {}",
        full.pages,
        after.pages
    );
    // The bytes bound prunes down to it.
    // Two pages fewer: some runs go, not all.
    let bound = after.used_bytes() - 2 * after.page_size;
    let by_bytes = Retention {
        max_bytes: Some(bound),
        ..Retention::default()
    };
    let mut passes = 0;
    while store.prune(&by_bytes, BASE, 10, false).await.unwrap().more {
        passes += 1;
        assert!(passes < 100);
    }
    let end = store.footprint().await.unwrap();
    assert!(end.used_bytes() <= bound, "{} > {bound}", end.used_bytes());
    assert!(!listed(&store).await.is_empty());
    store.close().await;
    let wal = std::fs::metadata(dir.path("a.db-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert_eq!(wal, 0);
    let file = std::fs::metadata(&path).unwrap().len();
    assert!(file <= end.pages * end.page_size, "{file}");
}

/// A store that records the prune calls it gets (and prunes nothing).
#[derive(Default)]
struct Watching {
    inner: MemoryAuditStore,
    calls: Mutex<Vec<(Retention, u64)>>,
    asked: AtomicU64,
}

#[async_trait]
impl AuditStore for Watching {
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError> {
        self.inner.append(batch).await
    }
    async fn run_records(&self, id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        self.inner.run_records(id).await
    }
    async fn stats(&self) -> Result<AuditStats, AuditStoreError> {
        self.inner.stats().await
    }
    async fn prune(
        &self,
        retention: &Retention,
        now_ms: u64,
        batch: usize,
        _dry_run: bool,
    ) -> Result<PruneReport, AuditStoreError> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        self.calls.lock().unwrap().push((*retention, now_ms));
        // The first pass has two batches' worth, later ones none.
        let n = self.asked.load(Ordering::Relaxed);
        Ok(PruneReport {
            runs: if n <= 2 { batch as u64 } else { 0 },
            more: n == 1,
            ..PruneReport::default()
        })
    }
}

#[tokio::test(start_paused = true)]
async fn the_host_prunes_in_the_background_on_its_schedule_and_stops_with_it() {
    let store = Arc::new(Watching::default());
    let retention = retain("max_age=7d,max_runs=100");
    let host = Host::builder()
        .audit_store(store.clone())
        .config(HostConfig {
            retention,
            retention_every: Duration::from_secs(60),
            ..HostConfig::default()
        })
        .build()
        .await
        .unwrap();
    // The first pass at once: two batches (the first said there is more).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(store.asked.load(Ordering::Relaxed), 2);
    assert_eq!(store.calls.lock().unwrap()[0].0, retention);
    tokio::time::sleep(Duration::from_secs(58)).await;
    assert_eq!(
        store.asked.load(Ordering::Relaxed),
        2,
        "not before its time"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(store.asked.load(Ordering::Relaxed), 3);
    host.shutdown().await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        store.asked.load(Ordering::Relaxed),
        3,
        "stopped with the host"
    );
}

#[tokio::test]
async fn a_host_without_retention_never_prunes() {
    let store = Arc::new(Watching::default());
    let host = Host::builder()
        .audit_store(store.clone())
        .build()
        .await
        .unwrap();
    host.execute(hello(), Invocation::prompt("a"))
        .await
        .unwrap();
    host.shutdown().await;
    assert_eq!(store.asked.load(Ordering::Relaxed), 0);
}

#[test]
fn bad_retain_values_exit_2_naming_the_flag() {
    for cmd in [
        &["swarm", "examples/agents/hello.yaml", "--runs", "1"][..],
        &["run", "examples/agents/hello.yaml"],
        &["soak", "examples/agents/hello.yaml"],
        &["serve"],
        &["runs", "prune"],
    ] {
        for bad in [
            "max_bytes=lots",
            "max_age=7x",
            "max_rows=3",
            "max_runs=-2",
            "",
        ] {
            let mut args = cmd.to_vec();
            args.extend(["--retain", bad, "--db", ":memory:"]);
            let out = support::cli::agentvisor(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(stderr.contains("--retain"), "{args:?}: {stderr}");
        }
    }
}

#[test]
fn runs_prune_says_what_it_would_do_then_does_it() {
    let dir = Scratch::new("cli-prune");
    let db = dir.path("a.db");
    let db = db.to_str().unwrap();
    let out = support::cli::agentvisor(&[
        "swarm",
        "examples/agents/hello.yaml",
        "--runs",
        "5",
        "--db",
        db,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dry = support::cli::ok_json(&support::cli::agentvisor(&[
        "runs",
        "prune",
        "--retain",
        "max_runs=2",
        "--dry-run",
        "--json",
        "--db",
        db,
    ]));
    assert_eq!(dry["runs"], 3);
    assert_eq!(dry["dry_run"], true);
    let list = support::cli::ok_json(&support::cli::agentvisor(&[
        "runs", "list", "--json", "--db", db,
    ]));
    assert_eq!(list.as_array().map(Vec::len), Some(5));
    let done = support::cli::ok_json(&support::cli::agentvisor(&[
        "runs",
        "prune",
        "--retain",
        "max_runs=2",
        "--json",
        "--db",
        db,
    ]));
    assert_eq!(done["runs"], 3);
    assert_eq!(done["by"][0]["agent"], "hello");
    let list = support::cli::ok_json(&support::cli::agentvisor(&[
        "runs", "list", "--json", "--db", db,
    ]));
    assert_eq!(list.as_array().map(Vec::len), Some(2));
}

/// Runs that repeat their records (a swarm of one scripted agent) store
/// their tail and result once (schema version 11), read back whole, and
/// pruning the last run that points at a template deletes it.
#[tokio::test]
async fn repeated_tails_are_stored_once_read_back_whole_and_pruned_with_their_runs() {
    let dir = Scratch::new("templates");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let records = real_run().await;
    let mut runs = Vec::new();
    for _ in 0..20 {
        let (id, run) = rekey(&records, |_| {});
        store.append(&run).await.unwrap();
        runs.push((id, run));
    }
    for (id, run) in &runs {
        assert_eq!(&store.run_records(*id).await.unwrap(), run);
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    // The first run is written whole; the 19 after it point at its texts.
    assert_eq!(
        count("SELECT COUNT(*) FROM runs WHERE tail_ref IS NOT NULL"),
        19
    );
    assert_eq!(count("SELECT COUNT(*) FROM run_templates"), 2);
    assert_eq!(count("SELECT SUM(refs) FROM run_templates"), 38);
    // The view reads them too.
    assert_eq!(
        count("SELECT COUNT(*) FROM audit_log"),
        20 * records.len() as i64
    );
    store
        .prune(&retain("max_runs=0"), BASE, 1000, false)
        .await
        .unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM run_templates"), 0);
}

/// `records` of a run whose manifest is `hello` with its system prompt
/// set to `system`.
fn with_manifest(records: Vec<AuditRecord>, system: &str) -> Vec<AuditRecord> {
    use agentvisor::ports::audit::{AuditEntry, RecordedManifest};
    use agentvisor::ports::checkpoint::EncodedJson;
    let mut spec = hello();
    spec.system = system.to_string();
    let manifest = RecordedManifest::of(EncodedJson::encode(&spec).unwrap());
    records
        .into_iter()
        .map(|mut r| {
            if let AuditEntry::RunStarted(info) = &mut r.entry {
                info.manifest = Some(manifest.clone());
            }
            r
        })
        .collect()
}

/// The manifest JSON a run's records give back, as its system prompt.
async fn recorded_system(store: &SqliteStore, id: RunId) -> Option<String> {
    use agentvisor::ports::audit::AuditEntry;
    store
        .run_records(id)
        .await
        .unwrap()
        .iter()
        .find_map(|r| match &r.entry {
            AuditEntry::RunStarted(info) => info.manifest.clone(),
            _ => None,
        })
        .and_then(|m| m.json)
        .map(|j| j.decode::<AgentSpec>().unwrap().system)
}

fn manifest_rows(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT COUNT(*) FROM manifests", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test]
async fn a_manifest_is_kept_once_read_back_whole_and_pruned_after_its_last_run() {
    let dir = Scratch::new("manifests");
    let path = dir.path("a.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let records = real_run().await;

    // A real run's start record names its manifest, whole: read back from
    // the file (and after a reopen) it is the manifest the run ran.
    let (shared_id, shared) = rekey(&with_manifest(records.clone(), "You add."), |_| {});
    store.append(&shared).await.unwrap();
    // Many runs of one manifest: one row.
    for _ in 0..20 {
        let (_, run) = rekey(&with_manifest(records.clone(), "You add."), |_| {});
        store.append(&run).await.unwrap();
    }
    assert_eq!(manifest_rows(&path), 1);
    store.close().await;
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        recorded_system(&store, shared_id).await.as_deref(),
        Some("You add.")
    );
    store
        .prune(&retain("max_runs=0"), BASE + 20 * DAY, 1000, false)
        .await
        .unwrap();

    // 300 runs, each of its own manifest, run `i` starting `i` days after
    // BASE and its manifest last used then (as the writer would have).
    let mut ids = Vec::new();
    let mut batch = Vec::new();
    for i in 0..300u64 {
        let (id, run) = rekey(
            &with_manifest(records.clone(), &format!("You are {i}.")),
            |res| {
                res.started_at = BASE + i * DAY - 10;
                res.finished_at = BASE + i * DAY;
            },
        );
        ids.push(id);
        batch.extend(run);
    }
    store.append(&batch).await.unwrap();
    let mut systems = Vec::new();
    for id in &ids {
        systems.push(recorded_system(&store, *id).await.unwrap());
    }
    store.close().await;
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute("UPDATE manifests SET used_ms = 0", [])
            .unwrap();
        for (i, system) in systems.into_iter().enumerate() {
            assert_eq!(system, format!("You are {i}."));
            let mut spec = hello();
            spec.system = system;
            let json = agentvisor::ports::checkpoint::EncodedJson::encode(&spec).unwrap();
            let mid = agentvisor::ports::audit::RecordedManifest::id_of(json.text()) as i64;
            let n = conn
                .execute(
                    "UPDATE manifests SET used_ms = ?2 WHERE id = ?1",
                    rusqlite::params![mid, (BASE + i as u64 * DAY - 10) as i64],
                )
                .unwrap();
            assert_eq!(n, 1);
        }
    }
    assert!(manifest_rows(&path) >= 300);
    let store = SqliteStore::open(&path).await.unwrap();
    let report = store
        .prune(&retain("max_runs=10"), BASE + 400 * DAY, 10_000, false)
        .await
        .unwrap();
    assert_eq!(report.runs, 290);
    // The ten runs kept still have theirs; no other is left.
    assert_eq!(manifest_rows(&path), 10);
    for (i, id) in ids.iter().enumerate().skip(290) {
        assert_eq!(
            recorded_system(&store, *id).await,
            Some(format!("You are {i}."))
        );
    }
}
