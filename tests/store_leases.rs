#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Exactly-once recovery: two hosts on one SQLite file. A host holds a
//! lease on the durable runs it runs; `recover` beside it leaves them
//! alone, and two `recover`s at once resume each run once.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::checkpoint::{Checkpointer, Claim, Lease};
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
    let store = Arc::new(SqliteStore::open(path).await.unwrap());
    let host = Host::builder()
        .config(HostConfig::default())
        .audit_store(store.clone())
        .checkpointer(store.clone())
        .budget_ledger(store.clone())
        .build()
        .await
        .unwrap();
    (host, store)
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
        let mut c = checkpoint(run);
        s.save(std::slice::from_ref(&c), &one).await.unwrap();
        assert!(matches!(
            s.claim(run, &two).await.unwrap(),
            Claim::HeldBy { owner, .. } if owner == "one"
        ));
        // A save by another owner while the lease is live is not written.
        c.iteration = 9;
        s.save(std::slice::from_ref(&c), &two).await.unwrap();
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
        s.clear(&[run]).await.unwrap();
        assert_eq!(s.claim(run, &two).await.unwrap(), Claim::Missing);
    }
}

fn checkpoint(run_id: RunId) -> agentvisor::ports::checkpoint::Checkpoint {
    agentvisor::ports::checkpoint::Checkpoint {
        run_id,
        spec: Arc::new(AgentSpec::from_yaml(WAITS).unwrap()),
        invocation: Invocation::default(),
        transcript: Arc::new(Vec::new()),
        iteration: 1,
        steps: Vec::new(),
        usage: Default::default(),
        critic: Vec::new(),
        resumes: 0,
        started_at: 1,
        saved_at: 2,
    }
}
