//! Durable runs while the disk is full (a fault-injecting audit store and
//! checkpointer that refuse every write with "no space" until the test
//! frees them, and a spool that cannot be written): a durable run takes
//! no step, and reports no result, that is not on record. It waits —
//! bounded by its deadline, then `error`/`store_unavailable` — and so a
//! run reported `ok` is never run again by `recover`. Each tool counts its
//! real executions, per run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::AuditStore;
use agentvisor::ports::checkpoint::Checkpointer;
use agentvisor::stores::SqliteStore;
use agentvisor::{Host, HostConfig, Invocation, RunId, RunResult, RunStatus};
use support::outage::{unwritable_spool, Counted, Disk, FullAudit, FullCheckpointer, Tally};
use support::scratch::Scratch;
use support::small_disk::SmallDisk;
use support::{records, spec, terminal_count};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Two tool steps, then the answer; every step is checkpointed.
const TALLY: &str = r#"
name: tally
model: scripted
durable: true
prompt: count twice
tools: [first, second]
limits: { max_runtime: 60s, stall_timeout: 10s, soft_timeout: 50s }
script:
  - { tool: first, args: {} }
  - { tool: second, args: {} }
  - { text: "counted" }
"#;

/// How many runs each test keeps in flight.
const RUNS: usize = 8;

/// Where a host of these tests writes, and what its tools count.
struct Bench {
    _dir: Scratch,
    spool: std::path::PathBuf,
    /// The audit store's disk.
    audit_disk: Arc<Disk>,
    /// The checkpointer's disk (the same one, or another).
    checkpoint_disk: Arc<Disk>,
    audit: Arc<FullAudit>,
    checkpoints: Arc<FullCheckpointer>,
    tally: Arc<Tally>,
}

impl Bench {
    /// Both stores on one disk, the spool nowhere.
    fn one_disk(name: &str) -> Self {
        let disk = Disk::new();
        Self::new(name, disk.clone(), disk)
    }

    fn new(name: &str, audit_disk: Arc<Disk>, checkpoint_disk: Arc<Disk>) -> Self {
        let dir = Scratch::new(name);
        Bench {
            spool: unwritable_spool(&dir),
            _dir: dir,
            audit: FullAudit::new(&audit_disk),
            checkpoints: FullCheckpointer::new(&checkpoint_disk),
            audit_disk,
            checkpoint_disk,
            tally: Tally::new(),
        }
    }

    /// A host on these stores; `second` waits for `gate`.
    async fn host(&self, gate: watch::Receiver<bool>) -> Host {
        Host::builder()
            .config(HostConfig {
                critic_shards: 2,
                audit_spool: Some(self.spool.clone()),
                ..HostConfig::default()
            })
            .audit_store(self.audit.clone())
            .checkpointer(self.checkpoints.clone())
            .tool(Counted::new("first", &self.tally))
            .tool(Counted::gated("second", &self.tally, gate))
            .build()
            .await
            .unwrap()
    }

    /// `RUNS` runs submitted, each awaited in a task of its own.
    async fn submit(&self, host: &Host) -> Vec<(RunId, JoinHandle<RunResult>)> {
        let agent = host.agent(spec(TALLY)).unwrap();
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            let h = host.submit(&agent, Invocation::default()).await.unwrap();
            runs.push((h.run_id(), tokio::spawn(h)));
        }
        // Every run's first step is on record and its second is running.
        until("every run is in its second step", || {
            self.tally.total("second") == RUNS
        })
        .await;
        runs
    }

    /// How many terminal records the store holds for `run`.
    async fn on_record(&self, run: RunId) -> usize {
        terminal_count(&records(&self.audit.inner, run).await)
    }
}

/// Waits (at most two seconds of paused time) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("timed out waiting: {what}");
}

async fn results(runs: Vec<(RunId, JoinHandle<RunResult>)>) -> Vec<RunResult> {
    let mut out = Vec::new();
    for (_, h) in runs {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_durable_run_waits_for_its_checkpoint_and_goes_on_once_the_store_takes_it() {
    let bench = Bench::one_disk("waits");
    let (open, gate) = watch::channel(false);
    let host = bench.host(gate).await;
    let runs = bench.submit(&host).await;

    // The disk fills while every run is in its second step.
    bench.audit_disk.fill();
    open.send(true).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        bench.checkpoint_disk.refused() > 0,
        "the saves were refused"
    );
    for (id, h) in &runs {
        assert!(
            !h.is_finished(),
            "run {id} went on (and ended) while its second step was on record nowhere"
        );
    }

    // Space returns: the saves are retried, and every run goes on.
    bench.audit_disk.free();
    let ids: Vec<RunId> = runs.iter().map(|(id, _)| *id).collect();
    for r in results(runs).await {
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    }
    let stats = host.shutdown().await;
    assert_eq!((stats.unwritten, stats.spooled), (0, 0), "{stats:?}");
    for id in ids {
        assert_eq!(bench.on_record(id).await, 1, "run {id} is on record once");
        assert_eq!(bench.tally.of("first", id), 1);
        assert_eq!(bench.tally.of("second", id), 1);
    }
    assert!(bench.checkpoints.load_all().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_run_reported_ok_is_never_run_again_by_recover() {
    let bench = Bench::one_disk("recover");
    let (open, gate) = watch::channel(false);
    let first = bench.host(gate.clone()).await;
    let runs = bench.submit(&first).await;
    let ids: Vec<RunId> = runs.iter().map(|(id, _)| *id).collect();

    // The disk fills under the runs, and the process ends before space
    // returns (its shutdown cannot write either).
    bench.audit_disk.fill();
    open.send(true).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    first.shutdown().await;
    let told = results(runs).await;

    // Space returns; the next process recovers what the first left.
    bench.audit_disk.free();
    let second = bench.host(gate).await;
    let recovery = second.recover().await.unwrap();
    for h in recovery.resumed {
        let r = h.await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    }
    second.shutdown().await;

    for r in &told {
        let id = r.run_id;
        assert_eq!(
            bench.tally.of("first", id),
            1,
            "run {id}: a step on record never runs again"
        );
        if r.status == RunStatus::Ok {
            assert_eq!(
                bench.tally.of("second", id),
                1,
                "run {id} was reported ok, and its tool ran again"
            );
        }
    }
    for id in ids {
        assert_eq!(bench.on_record(id).await, 1, "run {id} is on record once");
    }
    assert!(bench.checkpoints.load_all().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_durable_run_whose_step_cannot_be_recorded_ends_store_unavailable_at_its_deadline() {
    let bench = Bench::one_disk("deadline");
    let (open, gate) = watch::channel(false);
    let host = bench.host(gate).await;
    let runs = bench.submit(&host).await;
    let ids: Vec<RunId> = runs.iter().map(|(id, _)| *id).collect();

    bench.audit_disk.fill();
    open.send(true).unwrap();
    // Past every run's deadline (soft timeouts may extend it), the disk
    // still full.
    for _ in 0..600 {
        if runs.iter().all(|(_, h)| h.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for r in results(runs).await {
        assert_eq!(r.status, RunStatus::Error, "{r:?}");
        assert_eq!(r.error_kind.as_deref(), Some("store_unavailable"), "{r:?}");
    }

    // Once space returns, the record says what the callers were told.
    bench.audit_disk.free();
    host.shutdown().await;
    for id in ids {
        let recs = records(&bench.audit.inner, id).await;
        assert_eq!(terminal_count(&recs), 1);
        let last = match &recs.last().unwrap().entry {
            agentvisor::ports::audit::AuditEntry::Terminal(r) => r.clone(),
            other => panic!("not a terminal record: {other:?}"),
        };
        assert_eq!(last.status, RunStatus::Error);
        assert_eq!(last.error_kind.as_deref(), Some("store_unavailable"));
        assert_eq!(bench.tally.of("second", id), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_durable_runs_result_waits_for_its_terminal_record_to_be_written_or_spooled() {
    // The checkpoints are written; the audit store and the spool are not.
    let bench = Bench::new("terminal", Disk::new(), Disk::new());
    let (open, gate) = watch::channel(false);
    let host = bench.host(gate).await;
    let runs = bench.submit(&host).await;

    bench.audit_disk.fill();
    open.send(true).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(bench.audit_disk.refused() > 0, "the audit store refused");
    for (id, h) in &runs {
        assert!(
            !h.is_finished(),
            "run {id}'s result was delivered while its terminal record was on record nowhere"
        );
    }

    // Before the deadline the store takes them: the results are delivered.
    bench.audit_disk.free();
    let ids: Vec<RunId> = runs.iter().map(|(id, _)| *id).collect();
    for r in results(runs).await {
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    }
    host.shutdown().await;
    for id in ids {
        assert_eq!(bench.on_record(id).await, 1);
    }

    // Past the deadline, the caller is told the run is not on record.
    let bench = Bench::new("terminal-late", Disk::new(), Disk::new());
    let (open, gate) = watch::channel(false);
    let host = bench.host(gate).await;
    let runs = bench.submit(&host).await;
    bench.audit_disk.fill();
    open.send(true).unwrap();
    let ids: Vec<RunId> = runs.iter().map(|(id, _)| *id).collect();
    for r in results(runs).await {
        assert_eq!(r.status, RunStatus::Error, "{r:?}");
        assert_eq!(r.error_kind.as_deref(), Some("store_unavailable"), "{r:?}");
        assert_eq!(r.output.as_deref(), Some("counted"), "the answer is kept");
    }
    bench.audit_disk.free();
    host.shutdown().await;
    for id in ids {
        let recs = records(&bench.audit.inner, id).await;
        match &recs.last().unwrap().entry {
            agentvisor::ports::audit::AuditEntry::Terminal(r) => {
                assert_eq!(r.error_kind.as_deref(), Some("store_unavailable"))
            }
            other => panic!("not a terminal record: {other:?}"),
        }
    }
}

/// As root, on a real full disk: an 8 MiB tmpfs holds the SQLite database
/// (audit log, checkpoints, ledger) and its spool. It fills while a
/// durable swarm is in its second step, the process ends before space
/// returns, and the next one recovers: no run reported `ok` runs a tool
/// again, and every run ends on record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mounts a tmpfs: needs root (run with --ignored, as CI does)"]
async fn on_a_real_full_disk_a_run_reported_ok_is_never_run_again_by_recover() {
    const SWARM: usize = 20;
    let dir = Scratch::new("small-disk");
    let disk = SmallDisk::mount(
        "on_a_real_full_disk_a_run_reported_ok_is_never_run_again_by_recover",
        &dir.0,
        "8m",
    );
    let db = disk.path("a.db");
    let spool = disk.path("a.db.spool");
    let tally = Tally::new();
    let (open, gate) = watch::channel(false);
    let host = |store: Arc<SqliteStore>| {
        Host::builder()
            .config(HostConfig {
                critic_shards: 2,
                audit_spool: Some(spool.clone()),
                ..HostConfig::default()
            })
            .audit_store(store.clone())
            .checkpointer(store.clone())
            .budget_ledger(store)
            .tool(Counted::new("first", &tally))
            .tool(Counted::gated("second", &tally, gate.clone()))
            .build()
    };
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let first = host(store.clone()).await.unwrap();
    let agent = first.agent(spec(TALLY)).unwrap();
    let mut runs = Vec::new();
    for _ in 0..SWARM {
        let h = first.submit(&agent, Invocation::default()).await.unwrap();
        runs.push((h.run_id(), tokio::spawn(h)));
    }
    let ids: Vec<RunId> = runs.iter().map(|(id, _)| *id).collect();
    let t0 = std::time::Instant::now();
    while tally.total("second") < SWARM {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the runs reach their second step"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The disk fills under the runs' second step.
    let filler = disk.fill();
    open.send(true).unwrap();
    // A window to go on in (before the fix, every run ended `ok` within
    // it, off the record); not a deadline: the runs' are a minute away.
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(2) && !runs.iter().all(|(_, h)| h.is_finished()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The process ends before space returns.
    let owner = first.host_id().to_string();
    first.shutdown().await;
    let told = results(runs).await;
    store.close().await;
    drop(store);

    std::fs::remove_file(&filler).unwrap();
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    // Its shutdown could not release its leases (the disk was full); it
    // is gone, as a process of its own would be found gone by its pid.
    store.release(&owner).await.unwrap();
    let second = host(store.clone()).await.unwrap();
    let recovery = second.recover().await.unwrap();
    for h in recovery.resumed {
        let r = h.await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    }
    let stats = second.shutdown().await;
    assert_eq!((stats.unwritten, stats.spooled), (0, 0), "{stats:?}");

    let ok = told.iter().filter(|r| r.status == RunStatus::Ok).count();
    println!("{ok} of {SWARM} runs were reported ok by the first process");
    for r in &told {
        let id = r.run_id;
        assert_eq!(
            tally.of("first", id),
            1,
            "run {id}: a step on record never runs again"
        );
        if r.status == RunStatus::Ok {
            assert_eq!(
                tally.of("second", id),
                1,
                "run {id} was reported ok, and its tool ran again"
            );
        }
    }
    for id in ids {
        let recs = store.run_records(id).await.unwrap();
        assert_eq!(terminal_count(&recs), 1, "run {id} is on record once");
    }
    assert!(store.load_all().await.unwrap().is_empty());
    store.close().await;
}
