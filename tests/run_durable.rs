//! Durable runs: a checkpoint after every step, cleared with the terminal
//! record, kept by a shutdown; `Host::recover` resumes what an earlier host
//! left, ends crash loops, and gives every interrupted run exactly one
//! terminal record. A run parked for approval is kept parked across
//! hosts, with its decisions, and takes those recorded meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::{AuditEntry, AuditRecord, AuditStore, RunInfo};
use agentvisor::ports::checkpoint::{
    Checkpoint, CheckpointError, Checkpointer, Claim, EncodedJson, HostClaim, Lease, Renewal,
};
use agentvisor::ports::model::Role;
use agentvisor::stores::{MemoryAuditStore, MemoryCheckpointer};
use agentvisor::{
    decide_on_record, Invocation, ParkedRuns, RecoverError, RunEvent, RunId, RunStatus, MAX_RESUMES,
};
use async_trait::async_trait;
use support::{audited_events, builder, records, spec, terminal_count, RecordingModel};
use tokio::sync::Notify;

/// Two tool steps, then a slow answer (so a test can stop the host while
/// the third model call is in flight).
const SLOW_THIRD: &str = r#"
name: durable
model: recorded
durable: true
prompt: add then shout
tools: [add, upper]
limits: { max_runtime: 10m, stall_timeout: 5m, soft_timeout: 4m }
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { tool: upper, args: { text: done } }
  - { text: "5 DONE", latency: 30s }
"#;

/// The in-memory checkpointer, telling a test each time it has saved.
struct SignallingCheckpointer {
    inner: MemoryCheckpointer,
    saved: Notify,
}

#[async_trait]
impl Checkpointer for SignallingCheckpointer {
    async fn save(
        &self,
        checkpoints: &[Checkpoint],
        lease: &Lease,
    ) -> Result<Vec<RunId>, CheckpointError> {
        let saved = self.inner.save(checkpoints, lease).await;
        self.saved.notify_waiters();
        saved
    }
    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        self.inner.clear(runs).await
    }
    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        self.inner.load_all().await
    }
    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError> {
        self.inner.claim(run_id, lease).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Renewal, CheckpointError> {
        self.inner.renew(lease).await
    }
    async fn held_by(&self, owner: &str) -> Result<Vec<RunId>, CheckpointError> {
        self.inner.held_by(owner).await
    }
    async fn take_over_host(&self, owner: &str, gone: bool) -> Result<HostClaim, CheckpointError> {
        self.inner.take_over_host(owner, gone).await
    }
    async fn release(&self, owner: &str) -> Result<(), CheckpointError> {
        self.inner.release(owner).await
    }
}

struct Stores {
    audit: Arc<MemoryAuditStore>,
    checkpoints: Arc<SignallingCheckpointer>,
}

impl Stores {
    fn new() -> Self {
        Stores {
            audit: Arc::new(MemoryAuditStore::new()),
            checkpoints: Arc::new(SignallingCheckpointer {
                inner: MemoryCheckpointer::new(),
                saved: Notify::new(),
            }),
        }
    }

    /// The checkpoints once `done` holds of them: checked now and after
    /// every save. Bounded by a minute of (paused) time, so a save that
    /// never comes fails the test instead of hanging it.
    async fn saved_when(&self, done: impl Fn(&[Checkpoint]) -> bool) -> Vec<Checkpoint> {
        let wait = async {
            loop {
                let saved = self.checkpoints.saved.notified();
                tokio::pin!(saved);
                saved.as_mut().enable();
                let all = self.saved().await;
                if done(&all) {
                    return all;
                }
                saved.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .expect("the checkpoint was saved")
    }

    /// A host on these stores, with a recording scripted model for `yaml`.
    async fn host(&self, yaml: &str) -> (agentvisor::Host, Arc<RecordingModel>) {
        let model = RecordingModel::new(&spec(yaml));
        let host = builder()
            .model("recorded", model.clone())
            .audit_store(self.audit.clone())
            .checkpointer(self.checkpoints.clone())
            .build()
            .await
            .unwrap();
        (host, model)
    }

    async fn saved(&self) -> Vec<Checkpoint> {
        self.checkpoints.load_all().await.unwrap()
    }

    /// Saves `checkpoints` as an earlier process did: each run's first
    /// checkpoint (which creates its row), then the given one.
    async fn left_by_an_earlier_process(&self, checkpoints: &[Checkpoint]) {
        let first: Vec<Checkpoint> = checkpoints
            .iter()
            .map(|c| checkpoint(c.run_id, 0))
            .collect();
        let lease = earlier_process();
        for batch in [&first[..], checkpoints] {
            let lost = self.checkpoints.save(batch, &lease).await.unwrap();
            assert!(lost.is_empty(), "{lost:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_durable_run_is_checkpointed_after_each_step_and_cleared_when_it_ends() {
    let stores = Stores::new();
    let (host, _) = stores.host(SLOW_THIRD).await;
    let handle = host
        .submit(spec(SLOW_THIRD), Invocation::default())
        .await
        .unwrap();
    // Accepted means checkpointed: the first save is written before submit returns.
    let first = stores.saved().await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].run_id, handle.run_id());
    assert_eq!(first[0].iteration, 0);

    // The third call is in flight once time has moved (paused time moves
    // only when every task waits); its checkpoint, after the second step,
    // is saved by the audit actor, which the checkpointer says.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mid = stores
        .saved_when(|all| all.iter().any(|c| c.iteration == 2))
        .await;
    assert_eq!(
        mid.len(),
        1,
        "one checkpoint per run, replaced at every step"
    );
    assert_eq!(mid[0].iteration, 2);
    assert_eq!(mid[0].steps.len(), 2);
    let tool_texts: Vec<&str> = mid[0]
        .transcript
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(tool_texts, vec!["5", "DONE"]);

    let result = handle.await;
    assert_eq!(result.status, RunStatus::Ok, "{result:?}");
    host.shutdown().await;
    assert!(
        stores.saved().await.is_empty(),
        "success clears the checkpoint"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_keeps_a_durable_run_and_recover_resumes_it_where_it_stopped() {
    let stores = Stores::new();
    let (first, first_model) = stores.host(SLOW_THIRD).await;
    let handle = first
        .submit(spec(SLOW_THIRD), Invocation::default())
        .await
        .unwrap();
    let run_id = handle.run_id();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stores
        .saved_when(|all| all.iter().any(|c| c.iteration == 2))
        .await;
    assert_eq!(first_model.calls(), 3, "the third call is in flight");
    first.shutdown().await;
    let suspended = handle.await;
    assert_eq!(suspended.status, RunStatus::Cancelled);
    assert_eq!(suspended.error_kind.as_deref(), Some("shutdown"));
    assert_eq!(
        terminal_count(&records(&stores.audit, run_id).await),
        0,
        "a suspended run is not finished on record"
    );
    assert_eq!(
        stores.saved().await.len(),
        1,
        "shutdown keeps the checkpoint"
    );

    let (second, second_model) = stores.host(SLOW_THIRD).await;
    let recovery = second.recover().await.unwrap();
    assert_eq!(recovery.resumed.len(), 1);
    let resumed = recovery.resumed.into_iter().next().unwrap();
    assert_eq!(resumed.run_id(), run_id);
    let result = resumed.await;
    assert_eq!(result.status, RunStatus::Ok, "{result:?}");
    assert_eq!(result.output.as_deref(), Some("5 DONE"));
    assert_eq!(result.steps.len(), 2, "the steps before the stop are kept");
    assert_eq!(result.iterations, 3);
    // Only the interrupted call ran again, with the saved transcript.
    assert_eq!(second_model.calls(), 1);
    assert_eq!(second_model.tool_messages(0), vec!["5", "DONE"]);
    second.shutdown().await;

    let recs = records(&stores.audit, run_id).await;
    assert_eq!(terminal_count(&recs), 1);
    let seqs: Vec<u32> = recs.iter().map(|r| r.seq).collect();
    let mut unique = seqs.clone();
    unique.dedup();
    assert_eq!(seqs, unique, "resumed records follow the earlier ones");
    assert!(audited_events(&recs).iter().any(|e| matches!(
        e,
        RunEvent::Resumed {
            attempt: 1,
            iteration: 2
        }
    )));
    assert!(stores.saved().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_killed_durable_run_is_never_resumed() {
    let stores = Stores::new();
    let (host, _) = stores.host(SLOW_THIRD).await;
    let handle = host
        .submit(spec(SLOW_THIRD), Invocation::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    handle.kill();
    let result = handle.await;
    assert_eq!(result.status, RunStatus::Killed);
    host.shutdown().await;
    assert!(
        stores.saved().await.is_empty(),
        "a kill clears the checkpoint"
    );

    let (next, _) = stores.host(SLOW_THIRD).await;
    let recovery = next.recover().await.unwrap();
    assert!(recovery.resumed.is_empty());
    assert!(recovery.interrupted.is_empty());
    next.shutdown().await;
}

fn started(run_id: RunId, seq: u32) -> AuditRecord {
    AuditRecord {
        run_id,
        seq,
        at_ms: 1,
        entry: AuditEntry::RunStarted(Box::new(RunInfo {
            agent: "durable".into(),
            model: "recorded".into(),
            caller_id: Some("alice".into()),
            channel_id: None,
            parent_run_id: None,
            session_id: None,
            prompt: "add then shout".into(),
            tools: Arc::from(vec!["add".to_string()]),
            limits: None,
            host: None,
            manifest: None,
        })),
    }
}

fn checkpoint(run_id: RunId, resumes: u32) -> Checkpoint {
    let s = spec(SLOW_THIRD);
    Checkpoint {
        run_id,
        agent: "durable".into(),
        spec: EncodedJson::encode(&s).unwrap(),
        invocation: EncodedJson::encode(&Invocation {
            run_id: Some(run_id),
            caller_id: Some("alice".into()),
            prompt: "add then shout".into(),
            ..Invocation::default()
        })
        .unwrap(),
        transcript: Arc::new(vec![agentvisor::ports::model::Message::text(
            Role::User,
            "add then shout",
        )]),
        iteration: 0,
        steps: Vec::new(),
        usage: Default::default(),
        cost_micros: None,
        critic: Vec::new(),
        resumes,
        started_at: 1,
        saved_at: 1,
        parked: None,
        unchanged: Default::default(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_interrupted_too_often_ends_crash_loop_once() {
    let stores = Stores::new();
    let looping = RunId::new();
    stores.audit.append(&[started(looping, 0)]).await.unwrap();
    stores
        .left_by_an_earlier_process(&[checkpoint(looping, MAX_RESUMES)])
        .await;
    let (host, model) = stores.host(SLOW_THIRD).await;
    let recovery = host.recover().await.unwrap();
    assert_eq!(recovery.crash_loops, vec![looping]);
    assert!(recovery.resumed.is_empty());
    host.shutdown().await;
    assert_eq!(model.calls(), 0, "a crash loop is not run again");

    let recs = records(&stores.audit, looping).await;
    assert_eq!(terminal_count(&recs), 1);
    let AuditEntry::Terminal(result) = &recs.last().unwrap().entry else {
        panic!("the last record is the terminal one")
    };
    assert_eq!(result.status, RunStatus::Error);
    assert_eq!(result.error_kind.as_deref(), Some("crash_loop"));
    assert_eq!(result.caller_id.as_deref(), Some("alice"));
    assert!(stores.saved().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn recover_counts_resumes_and_only_clears_runs_already_on_record() {
    let stores = Stores::new();
    let finished = RunId::new();
    let pending = RunId::new();
    let orphan = RunId::new();
    // `finished` ended on record but its checkpoint was not cleared yet.
    let (host, _) = stores.host(SLOW_THIRD).await;
    let done = host
        .execute(
            spec(SLOW_THIRD),
            Invocation {
                run_id: Some(finished),
                ..Invocation::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Ok);
    host.shutdown().await;
    stores
        .left_by_an_earlier_process(&[checkpoint(finished, 0), checkpoint(pending, 1)])
        .await;
    stores
        .audit
        .append(&[started(pending, 0), started(orphan, 0)])
        .await
        .unwrap();

    let (host, _) = stores.host(SLOW_THIRD).await;
    let recovery = host.recover().await.unwrap();
    assert_eq!(recovery.already_finished, vec![finished]);
    assert_eq!(recovery.interrupted, vec![orphan]);
    assert_eq!(recovery.resumed.len(), 1);
    // The resume is counted before the run goes on, so a crash now counts.
    let saved = stores.saved().await;
    let p = saved.iter().find(|c| c.run_id == pending).unwrap();
    assert_eq!(p.resumes, 2);
    assert!(saved.iter().all(|c| c.run_id != finished));
    for h in recovery.resumed {
        assert_eq!(h.await.status, RunStatus::Ok);
    }
    assert!(matches!(host.recover().await, Err(RecoverError::NotAtBoot)));
    host.shutdown().await;

    for run in [finished, pending, orphan] {
        let recs = records(&stores.audit, run).await;
        assert_eq!(terminal_count(&recs), 1, "run {run}");
    }
    let orphan_recs = records(&stores.audit, orphan).await;
    let AuditEntry::Terminal(r) = &orphan_recs.last().unwrap().entry else {
        panic!("terminal last")
    };
    assert_eq!(r.error_kind.as_deref(), Some("interrupted"));
}

#[tokio::test(start_paused = true)]
async fn recover_refuses_once_runs_were_submitted() {
    let stores = Stores::new();
    let (host, _) = stores.host(SLOW_THIRD).await;
    let running = host
        .submit(spec(SLOW_THIRD), Invocation::default())
        .await
        .unwrap();
    assert!(matches!(host.recover().await, Err(RecoverError::NotAtBoot)));
    running.cancel();
    host.shutdown().await;
}

struct BrokenCheckpointer;

#[async_trait]
impl Checkpointer for BrokenCheckpointer {
    async fn save(&self, _: &[Checkpoint], _: &Lease) -> Result<Vec<RunId>, CheckpointError> {
        Err(CheckpointError::Unavailable("disk full".into()))
    }
    async fn clear(&self, _: &[RunId]) -> Result<(), CheckpointError> {
        Ok(())
    }
    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        Ok(Vec::new())
    }
    async fn claim(&self, _: RunId, _: &Lease) -> Result<Claim, CheckpointError> {
        Ok(Claim::Missing)
    }
    async fn renew(&self, _: &Lease) -> Result<Renewal, CheckpointError> {
        Ok(Renewal::default())
    }
    async fn held_by(&self, _: &str) -> Result<Vec<RunId>, CheckpointError> {
        Ok(Vec::new())
    }
    async fn take_over_host(&self, _: &str, _: bool) -> Result<HostClaim, CheckpointError> {
        Ok(HostClaim::TakenOver)
    }
    async fn release(&self, _: &str) -> Result<(), CheckpointError> {
        Ok(())
    }
}

/// The lease of a process that ended (it expires as it is taken).
fn earlier_process() -> Lease {
    Lease {
        owner: "an-earlier-process".into(),
        ttl: Duration::ZERO,
    }
}

#[tokio::test(start_paused = true)]
async fn a_durable_run_whose_first_checkpoint_fails_is_rejected_on_record() {
    let audit = Arc::new(MemoryAuditStore::new());
    let model = RecordingModel::new(&spec(SLOW_THIRD));
    let host = builder()
        .model("recorded", model.clone())
        .audit_store(audit.clone())
        .checkpointer(Arc::new(BrokenCheckpointer))
        .build()
        .await
        .unwrap();
    let result = host
        .execute(spec(SLOW_THIRD), Invocation::default())
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Rejected);
    assert_eq!(result.error_kind.as_deref(), Some("checkpoint_unavailable"));
    assert!(result.error.as_deref().unwrap().contains("disk full"));
    assert_eq!(model.calls(), 0);
    host.shutdown().await;
    assert_eq!(terminal_count(&records(&audit, result.run_id).await), 1);
}

/// A recording model priced as `gpt-4o-mini`, so its runs cost something.
struct Priced(Arc<RecordingModel>);

#[async_trait]
impl agentvisor::ports::model::ChatModel for Priced {
    fn name(&self) -> &str {
        "recorded"
    }
    fn price_id(&self) -> Option<&str> {
        Some("gpt-4o-mini")
    }
    async fn complete(
        &self,
        request: agentvisor::ports::model::ChatRequest,
    ) -> Result<agentvisor::ports::model::ChatResponse, agentvisor::ports::model::ModelError> {
        agentvisor::ports::model::ChatModel::complete(&*self.0, request).await
    }
}

impl Stores {
    /// A host on these stores with a priced model and `ledger`.
    async fn priced_host(
        &self,
        ledger: Arc<agentvisor::stores::MemoryBudgetLedger>,
    ) -> agentvisor::Host {
        let model = RecordingModel::new(&spec(SLOW_THIRD));
        builder()
            .model("recorded", Arc::new(Priced(model)))
            .audit_store(self.audit.clone())
            .checkpointer(self.checkpoints.clone())
            .budget_ledger(ledger)
            .build()
            .await
            .unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn a_resumed_run_is_not_charged_again_for_its_earlier_calls() {
    use agentvisor::ports::budget::BudgetLedger;
    let window = Duration::from_secs(24 * 3600);
    let inv = || Invocation::prompt("add then shout").caller("alice");

    // Uninterrupted: what the run costs its caller.
    let whole = Stores::new();
    let ledger = Arc::new(agentvisor::stores::MemoryBudgetLedger::new());
    let host = whole.priced_host(ledger.clone()).await;
    let once = host.submit(spec(SLOW_THIRD), inv()).await.unwrap().await;
    assert_eq!(once.status, RunStatus::Ok, "{once:?}");
    assert!(once.cost_micros > 0, "{once:?}");
    host.shutdown().await;
    let uninterrupted = ledger.spent("alice", window).await.unwrap();

    // Interrupted after two steps, resumed by another host on the same
    // stores and ledger.
    let stores = Stores::new();
    let ledger = Arc::new(agentvisor::stores::MemoryBudgetLedger::new());
    let first = stores.priced_host(ledger.clone()).await;
    let handle = first.submit(spec(SLOW_THIRD), inv()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stores
        .saved_when(|all| all.iter().any(|c| c.iteration == 2))
        .await;
    first.shutdown().await;
    assert_eq!(handle.await.status, RunStatus::Cancelled);
    let second = stores.priced_host(ledger.clone()).await;
    let resumed = second.recover().await.unwrap().resumed;
    let result = resumed.into_iter().next().unwrap().await;
    assert_eq!(result.status, RunStatus::Ok, "{result:?}");
    second.shutdown().await;

    assert_eq!(result.usage, once.usage);
    assert_eq!(result.cost_micros, once.cost_micros, "the run's own cost");
    let spent = ledger.spent("alice", window).await.unwrap();
    assert_eq!(spent.tokens, uninterrupted.tokens);
    assert_eq!(
        spent.cost_micros, uninterrupted.cost_micros,
        "the caller paid once for each call"
    );
}

/// A durable run whose first turn calls two gated tools: it parks until
/// both are decided (an hour at most).
const GATED: &str = r#"
name: gated
model: recorded
durable: true
prompt: go
tools: [add, upper]
approval: [add, upper]
limits: { approval_timeout: 1h, max_runtime: 10m, stall_timeout: 5m }
script:
  - { tools: [ { tool: add, args: { a: 2, b: 3 } }, { tool: upper, args: { text: hi } } ] }
  - { text: "done" }
"#;

/// Submits GATED on a host of `stores`, lets an operator approve its
/// `upper` call, and shuts the host down with the `add` call still
/// waiting: the run's id.
async fn parked_with_one_decision(stores: &Stores) -> RunId {
    let (host, model) = stores.host(GATED).await;
    let handle = host
        .submit(spec(GATED), Invocation::default())
        .await
        .unwrap();
    let run_id = handle.run_id();
    let saved = stores
        .saved_when(|all| all.iter().any(|c| c.parked.is_some()))
        .await;
    let parked = saved[0].parked.clone().unwrap();
    let waiting: Vec<&str> = parked.waiting.iter().map(|w| &*w.call_id).collect();
    assert_eq!(waiting, vec!["call_0_0", "call_0_1"]);
    assert_eq!(saved[0].iteration, 1, "saved with the turn that asks");
    handle.run_ref().approve(Some("call_0_1")).unwrap();
    // The decision is saved with the turn: it survives the host.
    stores
        .saved_when(|all| {
            all.iter()
                .any(|c| c.parked.as_ref().is_some_and(|p| p.decisions.len() == 1))
        })
        .await;
    host.shutdown().await;
    let suspended = handle.await;
    assert_eq!(suspended.error_kind.as_deref(), Some("shutdown"));
    assert_eq!(model.calls(), 1);
    run_id
}

#[tokio::test(start_paused = true)]
async fn a_parked_run_is_left_parked_and_goes_on_with_a_decision_recorded_meanwhile() {
    let stores = Stores::new();
    let run_id = parked_with_one_decision(&stores).await;

    // Nobody to decide: left parked, not resumed, not ended.
    let (second, second_model) = stores.host(GATED).await;
    let recovery = second.recover_with(ParkedRuns::Leave).await.unwrap();
    assert_eq!(recovery.awaiting_approval, vec![run_id]);
    assert!(recovery.resumed.is_empty());
    second.shutdown().await;
    assert_eq!(second_model.calls(), 0);
    assert_eq!(terminal_count(&records(&stores.audit, run_id).await), 0);
    assert_eq!(stores.saved().await.len(), 1, "kept on record");

    // A decision recorded on the checkpoint.
    let checkpoints = stores.checkpoints.as_ref();
    let unknown = decide_on_record(checkpoints, run_id, Some("call_9_9"), true, None).await;
    assert_eq!(unknown.unwrap_err().kind(), "unknown_call");
    let decided = decide_on_record(checkpoints, run_id, None, false, Some("no".into()))
        .await
        .unwrap();
    let ids: Vec<&str> = decided.iter().map(|w| &*w.call_id).collect();
    assert_eq!(ids, vec!["call_0_0"], "the call still waiting");
    let again = decide_on_record(checkpoints, run_id, None, true, None).await;
    assert_eq!(again.unwrap_err().kind(), "not_awaiting_approval");

    // Nothing waits: the next recovery resumes it, and it goes on with
    // both decisions, without asking the model for that turn again.
    let (third, third_model) = stores.host(GATED).await;
    let recovery = third.recover_with(ParkedRuns::Leave).await.unwrap();
    assert!(recovery.awaiting_approval.is_empty());
    let result = recovery.resumed.into_iter().next().unwrap().await;
    assert_eq!(result.status, RunStatus::Ok, "{result:?}");
    let steps: Vec<(&str, bool, Option<&str>)> = result
        .steps
        .iter()
        .map(|s| (&*s.tool, s.ok, s.error.as_deref()))
        .collect();
    assert_eq!(
        steps,
        vec![
            (
                "add",
                false,
                Some("approval_denied: denied by operator: no")
            ),
            ("upper", true, None),
        ]
    );
    assert_eq!(third_model.calls(), 1, "only the answer after the turn");
    third.shutdown().await;
    assert!(stores.saved().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_host_that_stays_up_resumes_a_parked_run_parked_and_approvable() {
    let stores = Stores::new();
    let run_id = parked_with_one_decision(&stores).await;
    for _ in 0..MAX_RESUMES + 1 {
        // Waiting is not crashing: resumed parked again and again, it never
        // ends in a crash loop.
        let (host, model) = stores.host(GATED).await;
        let recovery = host.recover().await.unwrap();
        assert_eq!(recovery.crash_loops, Vec::<RunId>::new());
        let handle = recovery.resumed.into_iter().next().unwrap();
        let run = handle.run_ref();
        stores
            .saved_when(|all| all.iter().any(|c| c.resumes == 0 && c.parked.is_some()))
            .await;
        let waiting: Vec<String> = run
            .pending_approvals()
            .iter()
            .map(|p| p.call_id.to_string())
            .collect();
        assert_eq!(
            waiting,
            vec!["call_0_0"],
            "the decided call is not asked again"
        );
        assert_eq!(model.calls(), 0);
        host.shutdown().await;
        let _ = handle.await;
    }
    let (host, model) = stores.host(GATED).await;
    let handle = host
        .recover()
        .await
        .unwrap()
        .resumed
        .into_iter()
        .next()
        .unwrap();
    assert_eq!(handle.run_id(), run_id);
    let run = handle.run_ref();
    stores
        .saved_when(|all| all.iter().any(|c| c.resumes == 0 && c.parked.is_some()))
        .await;
    let decided = run.approve(None).unwrap();
    assert_eq!(decided.len(), 1);
    let result = handle.await;
    assert_eq!(result.status, RunStatus::Ok, "{result:?}");
    assert!(result.steps.iter().all(|s| s.ok), "{result:?}");
    assert_eq!(model.calls(), 1);
    host.shutdown().await;
}
