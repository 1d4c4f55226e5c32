//! Recovery at boot ([`Host::recover`]): durable runs an earlier process
//! left unfinished are claimed under a lease and resumed from their
//! checkpoints (whose manifest and invocation are decoded here: the port
//! keeps them as JSON); the unfinished runs of hosts that are gone end
//! with one terminal record each; the runs of live hosts are left to them.

#[allow(unused_imports)]
use super::*;

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
    /// otherwise it must expire first ([`HostConfig::lease_ttl`]). A
    /// terminal record still in the spool (`HostConfig::audit_spool`)
    /// counts as finished.
    pub async fn recover(&self) -> Result<Recovery, RecoverError> {
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
                Ok(d) => d,
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
            let (handle, _) = self
                .start(agent, inv, false, Some((Box::new(c), next_seq)))
                .await_started()
                .await;
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
            error_kind: Some(kind.to_string()),
            error: Some(error),
            output: None,
            steps: c.steps.clone(),
            iterations: c.iteration,
            usage: c.usage,
            cost_micros: 0,
            critic: c.critic.clone(),
            started_at: c.started_at,
            finished_at: now.max(c.started_at),
        });
        let deliver = Delivery::none();
        let _ = self.inner.audit.cast(AuditMsg::Terminal {
            preceding: Vec::new(),
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
