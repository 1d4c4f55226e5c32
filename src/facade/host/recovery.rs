//! Recovery at boot ([`Host::recover`]): durable runs an earlier process
//! left unfinished are claimed under a lease and resumed from their
//! checkpoints (whose manifest and invocation are decoded here: the port
//! keeps them as JSON); the unfinished runs of hosts that are gone end
//! with one terminal record each; the runs of live hosts are left to them.
//!
//! A run that owed publishes (a scheduled skill's) has its publish plan
//! made again from the recipe its invocation kept
//! ([`crate::ports::outbox::PublishRecipe`]), so its terminal record
//! carries its intents wherever it ends; this host's publisher delivers
//! them once the resumed run has ended (a run ended here without being
//! resumed leaves them to the outbox's next scan).
//!
//! Runs parked for approval ([`ParkedCalls`]): a host that stays up with
//! an operator (`agentvisor serve`) resumes them, and they wait again,
//! approvable there ([`ParkedRuns::Resume`]); a host about to exit with
//! nobody to decide (`agentvisor recover`) leaves them parked on record,
//! checkpoint and lease-free, and lists them ([`ParkedRuns::Leave`]).
//! A decision on such a run is recorded on its checkpoint
//! ([`decide_on_record`]: `agentvisor runs approve|deny ID` against the
//! database); once no call of its turn waits, the next `recover` resumes
//! it and the decisions apply.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Host;
use crate::actors::audit::checkpoints::{lease_owner, owner_is_gone};
use crate::actors::audit::spool::SpoolIndex;
use crate::actors::audit::AuditMsg;
use crate::handle::RunHandle;
use crate::ports::audit::{AuditEntry, AuditRecord};
use crate::ports::checkpoint::{Checkpoint, Checkpointer, Claim, HostClaim, Lease};
use crate::ports::run::{unix_ms, RunId, RunResult, RunStatus};
use crate::record::Delivery;
use crate::spec::{AgentSpec, Invocation};

use crate::ports::checkpoint::{CallDecision, CheckpointError, ParkedCalls, WaitingCall};

/// What [`Host::recover_with`] does with a durable run that was parked
/// for approval and still waits for a decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParkedRuns {
    /// Resume it: it parks again on this host, approvable
    /// ([`RunRef::approve`](crate::RunRef::approve)); for a host that
    /// stays up (a server).
    #[default]
    Resume,
    /// Leave it parked on record (checkpoint and decisions kept), listed
    /// in [`Recovery::awaiting_approval`]; for a host about to exit with
    /// nobody to decide.
    Leave,
}

/// How many times `recover` resumes one run at most; a run interrupted
/// again after that ends `error`/`crash_loop`.
pub const MAX_RESUMES: u32 = 3;

/// What [`Host::recover`] did.
#[derive(Default)]
#[non_exhaustive]
pub struct Recovery {
    /// Runs resumed from their checkpoints (await them for their results).
    pub resumed: Vec<RunHandle>,
    /// Checkpointed runs whose terminal record was already on file (cleared).
    pub already_finished: Vec<RunId>,
    /// Runs ended `error`/`crash_loop` (resumed too often).
    pub crash_loops: Vec<RunId>,
    /// Runs ended `error`/`unrecoverable` (their manifest no longer prepares).
    pub unrecoverable: Vec<RunId>,
    /// Runs that were not durable, ended `error`/`interrupted` (their
    /// host is gone).
    pub interrupted: Vec<RunId>,
    /// Runs another live host runs, left to it: durable runs whose lease it
    /// holds, and unfinished runs of a host whose host lease is live.
    pub leased: Vec<RunId>,
    /// Runs parked for approval, still waiting for a decision, left parked
    /// on record ([`ParkedRuns::Leave`]).
    pub awaiting_approval: Vec<RunId>,
}

impl std::fmt::Debug for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovery")
            .field("resumed", &self.resumed.len())
            .field("already_finished", &self.already_finished.len())
            .field("crash_loops", &self.crash_loops.len())
            .field("unrecoverable", &self.unrecoverable.len())
            .field("interrupted", &self.interrupted.len())
            .field("leased", &self.leased.len())
            .field("awaiting_approval", &self.awaiting_approval.len())
            .finish()
    }
}

/// Why [`Host::recover`] could not read what it needs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoverError {
    /// Runs were submitted (or `recover` ran) on this host already.
    #[error("recover runs once, at boot, before any run is submitted")]
    NotAtBoot,
    /// The checkpoints could not be read or cleared.
    #[error(transparent)]
    Checkpoint(#[from] crate::ports::checkpoint::CheckpointError),
    /// The audit log could not be read.
    #[error(transparent)]
    Audit(#[from] crate::ports::audit::AuditStoreError),
}

impl Host {
    /// Resumes the durable runs an earlier process left unfinished, each
    /// from its last checkpoint and with no new input, and ends the rest:
    ///
    /// - a checkpointed run whose terminal record is on file (the process
    ///   ended between the record and the clearing) is only cleared;
    /// - a run resumed [`MAX_RESUMES`] times already ends `error`/`crash_loop`;
    /// - a run whose manifest no longer prepares on this host (an unknown
    ///   model or tool) ends `error`/`unrecoverable`;
    /// - a run on record with neither a terminal record nor a checkpoint (it
    ///   was not durable) ends `error`/`interrupted` — once its host is
    ///   taken over ([`Checkpointer::take_over_host`]): a run whose host's
    ///   lease is live (a host still running it) is left to that host and
    ///   listed in [`Recovery::leased`], and so is a durable run another
    ///   live host holds.
    ///
    /// Each of these gets exactly one terminal record. Call it once, at
    /// boot, before any run is submitted (afterwards it refuses with
    /// [`RecoverError::NotAtBoot`]: it would take this host's own runs for
    /// interrupted ones), with the stores the earlier process used. A
    /// killed run is never resumed: its kill wrote its terminal record and
    /// cleared its checkpoint.
    ///
    /// Exactly once: a durable run is resumed only after this host claims
    /// its lease ([`Checkpointer::claim`]); a run whose lease another live
    /// host holds (a host still running it, or another `recover`) is left
    /// to it and listed in [`Recovery::leased`]. A lease whose owner is a
    /// process of this machine that no longer runs is taken at once;
    /// otherwise it must expire first ([`HostConfig::lease_ttl`](crate::HostConfig::lease_ttl)). A
    /// terminal record still in the spool (`HostConfig::audit_spool`)
    /// counts as finished.
    ///
    /// A run parked for approval is resumed too and waits again
    /// ([`ParkedRuns::Resume`]; see [`recover_with`](Self::recover_with)).
    pub async fn recover(&self) -> Result<Recovery, RecoverError> {
        self.recover_with(ParkedRuns::Resume).await
    }

    /// [`recover`](Self::recover), with the runs parked for approval that
    /// still wait for a decision resumed or left parked on record as
    /// `parked` says. A parked run every call of whose turn is decided
    /// (see [`decide_on_record`]) is resumed either way, and goes on.
    pub async fn recover_with(&self, parked: ParkedRuns) -> Result<Recovery, RecoverError> {
        let h = &self.inner;
        if h.booted.swap(true, Ordering::AcqRel) {
            return Err(RecoverError::NotAtBoot);
        }
        let mut out = Recovery::default();
        let mut checkpointed = std::collections::HashSet::new();
        let mut cleared = Vec::new();
        // Durability: a spool left by an earlier process is replayed into
        // the store first; what stays in it (the store still fails) counts
        // too — a terminal record there means the run finished.
        let spooled = self.spooled_records().await;
        let saved = h.checkpointer.load_all().await?;
        for c in &saved {
            checkpointed.insert(c.run_id);
        }
        for mut c in saved {
            // Exactly once: resume a run only once it is ours.
            match h.checkpointer.claim(c.run_id, &h.lease).await? {
                Claim::Claimed => {}
                Claim::Missing => continue,
                Claim::HeldBy { owner, .. } => {
                    let retaken = owner_is_gone(&owner)
                        && h.checkpointer.release(&owner).await.is_ok()
                        && h.checkpointer.claim(c.run_id, &h.lease).await? == Claim::Claimed;
                    if !retaken {
                        out.leased.push(c.run_id);
                        continue;
                    }
                }
            }
            let records = h.audit_store.run_records(c.run_id).await?;
            let in_store = records.iter().any(AuditRecord::is_terminal);
            if in_store || spooled.finished.contains(&c.run_id) {
                // Cleared once its terminal record is in the store.
                if in_store {
                    cleared.push(c.run_id);
                }
                out.already_finished.push(c.run_id);
                continue;
            }
            // Nobody here to decide: it stays parked on record (its lease
            // is released with this host's).
            let waits = c.parked.as_ref().is_some_and(ParkedCalls::is_waiting);
            if waits && parked == ParkedRuns::Leave {
                out.awaiting_approval.push(c.run_id);
                continue;
            }
            let next_seq = records
                .last()
                .map_or(0, |r| r.seq + 1)
                .max(spooled.next_seq.get(&c.run_id).copied().unwrap_or(0));
            // The manifest and invocation, as the run was accepted with them.
            let decoded = c.spec.decode::<AgentSpec>().and_then(|spec| {
                let inv = c.invocation.decode::<Invocation>()?;
                Ok((spec, inv))
            });
            let (spec, inv) = match decoded {
                Ok((spec, inv)) => (spec, self.remake_publish_plan(inv)),
                Err(e) => {
                    let error = format!("its saved manifest or invocation does not decode: {e}");
                    self.end_unresumed(&c, None, next_seq, "unrecoverable", error);
                    out.unrecoverable.push(c.run_id);
                    continue;
                }
            };
            if c.resumes >= MAX_RESUMES {
                let error = format!(
                    "resumed {} times and interrupted again; not resumed",
                    c.resumes
                );
                self.end_unresumed(&c, Some((&spec, &inv)), next_seq, "crash_loop", error);
                out.crash_loops.push(c.run_id);
                continue;
            }
            let agent = match self.prepare(spec.clone()).await {
                Ok(a) => a,
                Err(e) => {
                    let error = format!("its manifest does not prepare on this host: {e}");
                    self.end_unresumed(&c, Some((&spec, &inv)), next_seq, "unrecoverable", error);
                    out.unrecoverable.push(c.run_id);
                    continue;
                }
            };
            c.resumes += 1;
            c.saved_at = unix_ms();
            let owes = inv.publish.plan().is_some();
            let (handle, _) = self
                .start(agent, inv, false, Some((Box::new(c), next_seq)))
                .await_started()
                .await;
            if owes {
                // Its submitter, which would have asked for its publishes,
                // is gone: this host delivers them once the run has ended.
                self.deliver_when_ended(handle.run_ref());
            }
            out.resumed.push(handle);
        }
        if !cleared.is_empty() {
            h.checkpointer.clear(&cleared).await?;
        }
        // Whether each host of an unfinished run is gone (taken over now)
        // or live, asked once per host.
        let mut hosts: std::collections::HashMap<Arc<str>, bool> = Default::default();
        for run_id in h.audit_store.unfinished_runs().await? {
            if checkpointed.contains(&run_id) {
                continue;
            }
            let records = h.audit_store.run_records(run_id).await?;
            let Some(first) = records.first() else {
                continue;
            };
            if records.iter().any(AuditRecord::is_terminal) || spooled.finished.contains(&run_id) {
                continue;
            }
            let AuditEntry::RunStarted(info) = &first.entry else {
                continue;
            };
            // A run of a live host is its host's to finish. (A run
            // recorded without a host is taken for one whose host is gone.)
            if let Some(host) = &info.host {
                let gone = match hosts.get(host) {
                    Some(gone) => *gone,
                    None => {
                        let known_gone = owner_is_gone(host);
                        let claim = h.checkpointer.take_over_host(host, known_gone).await?;
                        let gone = claim == HostClaim::TakenOver;
                        hosts.insert(host.clone(), gone);
                        gone
                    }
                };
                if !gone {
                    out.leased.push(run_id);
                    continue;
                }
            }
            let iterations = records
                .iter()
                .filter(|r| {
                    matches!(
                        r.entry,
                        AuditEntry::Event(crate::ports::event::RunEvent::StepStart { .. })
                    )
                })
                .count() as u32;
            let now = unix_ms();
            let result = RunResult {
                run_id,
                agent: info.agent.to_string(),
                caller_id: info.caller_id.as_deref().map(str::to_string),
                parent_run_id: info.parent_run_id,
                root_run_id: None,
                status: RunStatus::Error,
                kill_reason: None,
                loop_kind: None,
                error_kind: Some("interrupted".into()),
                error: Some("its process ended before it finished, and it was not durable".into()),
                output: None,
                steps: Vec::new(),
                iterations,
                usage: Default::default(),
                cost_micros: 0,
                critic: Vec::new(),
                started_at: first.at_ms,
                finished_at: now.max(first.at_ms),
                forked_from: None,
            };
            let seq = records
                .last()
                .map_or(0, |r| r.seq + 1)
                .max(spooled.next_seq.get(&run_id).copied().unwrap_or(0));
            let _ = h.audit.cast(AuditMsg::Records(vec![AuditRecord {
                run_id,
                seq,
                at_ms: result.finished_at,
                entry: AuditEntry::Terminal(Arc::new(result)),
            }]));
            out.interrupted.push(run_id);
        }
        Ok(out)
    }

    /// Durability: replays a spool left by an earlier process into the
    /// store (a drain of the audit actor), then reads what stays in it.
    async fn spooled_records(&self) -> SpoolIndex {
        let h = &self.inner;
        let Some(path) = h.config.audit_spool.clone() else {
            return SpoolIndex::default();
        };
        let _ = h
            .audit
            .call(AuditMsg::Drain, Some(Duration::from_secs(60)))
            .await;
        let read = tokio::task::spawn_blocking(move || crate::actors::audit::spool::scan(&path));
        match read.await {
            Ok(Ok(index)) => index,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot read the audit spool; recovering from the store alone");
                SpoolIndex::default()
            }
            Err(_) => SpoolIndex::default(),
        }
    }

    /// Ends a checkpointed run without running it: its terminal record
    /// (built from the checkpoint and, when they decode, its manifest and
    /// invocation) is written and its checkpoint cleared.
    fn end_unresumed(
        &self,
        c: &Checkpoint,
        decoded: Option<(&AgentSpec, &Invocation)>,
        seq: u32,
        kind: &str,
        error: String,
    ) {
        let now = unix_ms();
        let agent = match decoded {
            Some((spec, _)) => spec.name.clone(),
            None => c.agent.to_string(),
        };
        let inv = decoded.map(|(_, inv)| inv);
        let result = Arc::new(RunResult {
            run_id: c.run_id,
            agent,
            caller_id: inv.and_then(|i| i.caller_id.clone()),
            parent_run_id: inv.and_then(|i| i.parent_run_id),
            root_run_id: inv.and_then(|i| i.root_run_id),
            status: RunStatus::Error,
            kill_reason: None,
            loop_kind: None,
            error_kind: Some(kind.to_string()),
            error: Some(error),
            output: None,
            steps: c.steps.clone(),
            iterations: c.iteration,
            usage: c.usage.into(),
            cost_micros: 0,
            critic: c.critic.clone(),
            started_at: c.started_at,
            finished_at: now.max(c.started_at),
            forked_from: None,
        });
        // What it owes rides with its terminal record, as any run's (its
        // `on_failure` destinations get the error); delivered by the next
        // scan of the outbox.
        let preceding = inv
            .and_then(|i| i.publish.record(&result, seq))
            .into_iter()
            .collect();
        let deliver = Delivery::none();
        let _ = self.inner.audit.cast(AuditMsg::Terminal {
            preceding,
            record: AuditRecord {
                run_id: c.run_id,
                seq,
                at_ms: result.finished_at,
                entry: AuditEntry::Terminal(result),
            },
            deliver,
            durable: true,
        });
    }
}

/// Why [`decide_on_record`] recorded nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordDecisionError {
    /// No checkpoint of the run is parked for approval with calls waiting
    /// (it finished, is not durable, or waits for nothing).
    #[error("run {0} is not parked for approval on record")]
    NotParked(RunId),
    /// The run's parked turn has no waiting call with this id.
    #[error("run {run_id} awaits no approval of call `{call_id}`")]
    UnknownCall {
        /// The run.
        run_id: RunId,
        /// The call id given.
        call_id: String,
    },
    /// A live host runs it: decide there (its server's API).
    #[error("run {run_id} is held by a live host ({owner}): decide through its server")]
    HeldBy {
        /// The run.
        run_id: RunId,
        /// The host holding it.
        owner: String,
    },
    /// The checkpoints could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl RecordDecisionError {
    /// A stable snake_case kind.
    pub fn kind(&self) -> &'static str {
        match self {
            RecordDecisionError::NotParked(_) => "not_awaiting_approval",
            RecordDecisionError::UnknownCall { .. } => "unknown_call",
            RecordDecisionError::HeldBy { .. } => "held_by_live_host",
            RecordDecisionError::Checkpoint(_) => "checkpoint_unavailable",
        }
    }
}

/// Records an operator's decision on a durable run parked for approval
/// that no host runs (its checkpoint is on file, its lease free or its
/// host gone): on call `call_id` of its parked turn, or on every waiting
/// call (`None`). The calls decided leave the waiting list and their
/// decisions are kept with the checkpoint, under a lease taken for the
/// write and released after it; the next host to resume the run (a
/// server at its start, or `recover` once nothing waits) applies them.
/// Returns the calls decided.
///
/// A run a live host holds is refused ([`RecordDecisionError::HeldBy`]):
/// it is decided through that host ([`RunRef::approve`](crate::RunRef::approve)).
pub async fn decide_on_record(
    checkpointer: &dyn Checkpointer,
    run_id: RunId,
    call_id: Option<&str>,
    approve: bool,
    reason: Option<String>,
) -> Result<Vec<WaitingCall>, RecordDecisionError> {
    let parked_of = |c: &Checkpoint| c.parked.as_ref().is_some_and(ParkedCalls::is_waiting);
    let find = |all: Vec<Checkpoint>| all.into_iter().find(|c| c.run_id == run_id);
    if !find(checkpointer.load_all().await?).is_some_and(|c| parked_of(&c)) {
        return Err(RecordDecisionError::NotParked(run_id));
    }
    let lease = Lease {
        owner: lease_owner(),
        ttl: Duration::from_secs(60),
    };
    match checkpointer.claim(run_id, &lease).await? {
        Claim::Claimed => {}
        Claim::Missing => return Err(RecordDecisionError::NotParked(run_id)),
        Claim::HeldBy { owner, .. } => {
            let retaken = owner_is_gone(&owner)
                && checkpointer.release(&owner).await.is_ok()
                && checkpointer.claim(run_id, &lease).await? == Claim::Claimed;
            if !retaken {
                return Err(RecordDecisionError::HeldBy { run_id, owner });
            }
        }
    }
    let decided = record_decision(checkpointer, &lease, run_id, call_id, approve, reason).await;
    // The lease was only for this write.
    let released = checkpointer.release(&lease.owner).await;
    let decided = decided?;
    released?;
    Ok(decided)
}

/// The write of [`decide_on_record`], under `lease` (claimed): read again
/// now that it is ours.
async fn record_decision(
    checkpointer: &dyn Checkpointer,
    lease: &Lease,
    run_id: RunId,
    call_id: Option<&str>,
    approve: bool,
    reason: Option<String>,
) -> Result<Vec<WaitingCall>, RecordDecisionError> {
    let mut c = checkpointer
        .load_all()
        .await?
        .into_iter()
        .find(|c| c.run_id == run_id)
        .ok_or(RecordDecisionError::NotParked(run_id))?;
    let Some(parked) = c.parked.as_mut().filter(|p| p.is_waiting()) else {
        return Err(RecordDecisionError::NotParked(run_id));
    };
    let (decided, waiting): (Vec<WaitingCall>, Vec<WaitingCall>) = parked
        .waiting
        .drain(..)
        .partition(|w| call_id.is_none_or(|id| *w.call_id == *id));
    parked.waiting = waiting;
    if decided.is_empty() {
        return Err(RecordDecisionError::UnknownCall {
            run_id,
            call_id: call_id.unwrap_or_default().chars().take(128).collect(),
        });
    }
    let at_ms = unix_ms();
    let reason = reason.filter(|r| !r.trim().is_empty());
    parked
        .decisions
        .extend(decided.iter().map(|w| CallDecision {
            call_id: w.call_id.clone(),
            approve,
            reason: reason.clone(),
            by: "operator".to_string(),
            at_ms,
        }));
    c.saved_at = at_ms.max(c.saved_at);
    let lost = checkpointer.save(std::slice::from_ref(&c), lease).await?;
    if !lost.is_empty() {
        return Err(RecordDecisionError::HeldBy {
            run_id,
            owner: "another host".to_string(),
        });
    }
    Ok(decided)
}
