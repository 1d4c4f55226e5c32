#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Exactly-once recovery: two hosts on one SQLite file. A host holds a
//! lease on the durable runs it runs, and one of its own; `recover` beside
//! it leaves its runs alone (durable or not), and two `recover`s at once
//! resume each run once. A host whose leases expired while it was paused
//! (simulated here by expiring them in the file) loses its runs to a
//! `recover` elsewhere, and stops them without writing anything more of
//! them (fencing).
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

use agentvisor::ports::checkpoint::{Checkpointer, Claim, EncodedJson, HostClaim, Lease, Renewal};
use agentvisor::stores::{MemoryCheckpointer, SqliteStore};
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

/// A host on its own handle to the file at `path`.
async fn host_on(path: &std::path::Path) -> (Host, Arc<SqliteStore>) {
    host_with(path, Host::builder()).await
}

/// A host on its own handle to the file at `path`, built from `builder`.
async fn host_with(
    path: &std::path::Path,
    builder: agentvisor::HostBuilder,
) -> (Host, Arc<SqliteStore>) {
    let store = Arc::new(SqliteStore::open(path).await.unwrap());
    let host = builder
        .config(HostConfig::default())
        .audit_store(store.clone())
        .checkpointer(store.clone())
        .budget_ledger(store.clone())
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

/// What the time of a paused host does to its leases in the file: they
/// expire (as they would after `lease_ttl` without a renewal).
fn expire_leases_of(path: &std::path::Path, owner: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute(
        "UPDATE checkpoints SET lease_until = 0 WHERE owner = ?1",
        [owner],
    )
    .unwrap();
    conn.execute(
        "UPDATE host_leases SET lease_until = 0 WHERE owner = ?1",
        [owner],
    )
    .unwrap();
}

/// The terminal records of a run in the file.
async fn terminals(store: &SqliteStore, run: RunId) -> usize {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_leaves_the_runs_of_a_live_host_and_ends_those_of_a_host_that_is_gone() {
    let dir = Scratch::new("host-lease");
    let path = dir.0.join("a.db");
    let spec = AgentSpec::from_yaml(HANGS).unwrap();
    let n = 8;
    let (live, live_store) = host_on(&path).await;
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
    let (beside, _) = host_on(&path).await;
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
    let (gone, gone_store) = host_on(&path).await;
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(gone.submit(&spec, Invocation::default()).await.unwrap());
    }
    until("the runs are on record", || async {
        gone_store.unfinished_runs().await.unwrap().len() == n
    })
    .await;
    expire_leases_of(&path, gone.host_id());
    let (after, _) = host_on(&path).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_host_whose_durable_runs_were_taken_over_stops_them_and_writes_nothing_of_them() {
    let dir = Scratch::new("fencing");
    let path = dir.0.join("a.db");
    let n = 6;
    // The first host: each run takes its step, is checkpointed, then
    // waits for its answer at the gate.
    let (open, gate) = watch::channel(false);
    let gated = Arc::new(GatedModel {
        inner: ScriptedModel::new(AgentSpec::from_yaml(FINISHES).unwrap().script),
        open: gate,
    });
    let (first, first_store) = host_with(&path, Host::builder().model("scripted", gated)).await;
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
    expire_leases_of(&path, first.host_id());
    let (second, second_store) = host_with(
        &path,
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
    let (third, third_store) = host_on(&path).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_beside_a_live_host_resumes_none_of_its_runs_and_two_recovers_share_the_rest() {
    let dir = Scratch::new("two-hosts");
    let path = dir.0.join("a.db");
    let spec = AgentSpec::from_yaml(WAITS).unwrap();
    let n = 12;

    // The first host runs n durable runs; each is accepted once its first
    // checkpoint (and lease) is in the file.
    let (first, first_store) = host_on(&path).await;
    let mut handles = Vec::new();
    for _ in 0..n {
        handles.push(first.submit(&spec, Invocation::default()).await.unwrap());
    }
    assert_eq!(first_store.load_all().await.unwrap().len(), n);
    // A recover beside it, on the same file: every run is leased.
    let (beside, _) = host_on(&path).await;
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
    let (a, _) = host_on(&path).await;
    let (b, _) = host_on(&path).await;
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

#[tokio::test]
async fn a_claim_is_won_once_while_the_lease_is_live() {
    let store = MemoryCheckpointer::new();
    let dir = Scratch::new("claim");
    let sqlite = SqliteStore::open(&dir.0.join("a.db")).await.unwrap();
    let stores: [&dyn Checkpointer; 2] = [&store, &sqlite];
    for s in stores {
        let run = RunId::new();
        let one = Lease {
            owner: "one".into(),
            ttl: Duration::from_secs(60),
        };
        let two = Lease {
            owner: "two".into(),
            ttl: Duration::from_secs(60),
        };
        assert_eq!(s.claim(run, &one).await.unwrap(), Claim::Missing);
        // Only a run's first checkpoint creates its row.
        let mut c = checkpoint(run);
        assert_eq!(s.save(std::slice::from_ref(&c), &one).await.unwrap(), [run]);
        assert!(s.load_all().await.unwrap().is_empty());
        c.iteration = 0;
        assert!(s
            .save(std::slice::from_ref(&c), &one)
            .await
            .unwrap()
            .is_empty());
        c.iteration = 1;
        assert!(s
            .save(std::slice::from_ref(&c), &one)
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            s.claim(run, &two).await.unwrap(),
            Claim::HeldBy { owner, .. } if owner == "one"
        ));
        // A save by another owner while the lease is live is not written:
        // the saver lost the run.
        c.iteration = 9;
        assert_eq!(s.save(std::slice::from_ref(&c), &two).await.unwrap(), [run]);
        assert_eq!(s.load_all().await.unwrap()[0].iteration, 1);
        assert_eq!(s.claim(run, &one).await.unwrap(), Claim::Claimed);
        s.release("one").await.unwrap();
        assert_eq!(s.claim(run, &two).await.unwrap(), Claim::Claimed);
        // An expired lease is free.
        let gone = Lease {
            owner: "gone".into(),
            ttl: Duration::ZERO,
        };
        s.release("two").await.unwrap();
        assert_eq!(s.claim(run, &gone).await.unwrap(), Claim::Claimed);
        assert_eq!(s.claim(run, &one).await.unwrap(), Claim::Claimed);
        s.renew(&one).await.unwrap();
        assert!(matches!(
            s.claim(run, &two).await.unwrap(),
            Claim::HeldBy { .. }
        ));
        // Fencing: once another owner claimed the run, its first owner's
        // saves are not written, even after its lease expired; nor once
        // the run finished there and its row was cleared.
        assert_eq!(s.held_by("one").await.unwrap(), [run]);
        s.release("one").await.unwrap();
        assert_eq!(s.claim(run, &two).await.unwrap(), Claim::Claimed);
        assert!(s.held_by("one").await.unwrap().is_empty());
        assert_eq!(s.renew(&one).await.unwrap().runs, 0);
        assert_eq!(s.save(std::slice::from_ref(&c), &one).await.unwrap(), [run]);
        s.clear(&[run]).await.unwrap();
        assert_eq!(s.save(std::slice::from_ref(&c), &one).await.unwrap(), [run]);
        assert!(s.load_all().await.unwrap().is_empty());
        assert_eq!(s.claim(run, &two).await.unwrap(), Claim::Missing);
    }
}

#[tokio::test]
async fn a_host_is_taken_over_only_once_its_lease_expired_and_learns_of_it() {
    let store = MemoryCheckpointer::new();
    let dir = Scratch::new("host-lease");
    let sqlite = SqliteStore::open(&dir.0.join("a.db")).await.unwrap();
    let stores: [&dyn Checkpointer; 2] = [&store, &sqlite];
    for s in stores {
        let live = Lease {
            owner: "live".into(),
            ttl: Duration::from_secs(60),
        };
        assert_eq!(s.renew(&live).await.unwrap(), Renewal::default());
        assert!(matches!(
            s.take_over_host("live", false).await.unwrap(),
            HostClaim::Live { .. }
        ));
        // Known to be gone (a dead process of this machine): taken over
        // whatever its lease says; it learns so at its next renewal, and
        // holds its lease again.
        assert_eq!(
            s.take_over_host("live", true).await.unwrap(),
            HostClaim::TakenOver
        );
        assert!(s.renew(&live).await.unwrap().taken_over);
        assert!(!s.renew(&live).await.unwrap().taken_over);
        // An expired lease, or none at all, is taken over.
        let paused = Lease {
            owner: "paused".into(),
            ttl: Duration::ZERO,
        };
        s.renew(&paused).await.unwrap();
        assert_eq!(
            s.take_over_host("paused", false).await.unwrap(),
            HostClaim::TakenOver
        );
        assert!(s.renew(&paused).await.unwrap().taken_over);
        assert_eq!(
            s.take_over_host("never-seen", false).await.unwrap(),
            HostClaim::TakenOver
        );
        // A clean shutdown gives the host lease up.
        s.release("live").await.unwrap();
        assert_eq!(
            s.take_over_host("live", false).await.unwrap(),
            HostClaim::TakenOver
        );
    }
}

fn checkpoint(run_id: RunId) -> agentvisor::ports::checkpoint::Checkpoint {
    agentvisor::ports::checkpoint::Checkpoint {
        run_id,
        agent: "waits".into(),
        spec: EncodedJson::encode(&AgentSpec::from_yaml(WAITS).unwrap()).unwrap(),
        invocation: EncodedJson::encode(&Invocation::default()).unwrap(),
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
    }
}
