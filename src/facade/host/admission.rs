//! Admission: what happens between `submit` and a run's start on its
//! shard — the run's record and handle, the host's checks (closed, run
//! cap, the model's circuit, the store's health, the delegation tree's
//! caps), a durable run's first checkpoint, the caller's account — and the
//! hand-over to the shard. A refused run still gets a handle and a terminal
//! record.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ractor::rpc::CallResult;
use ractor::ActorRef;

use super::{Host, SubmitError};
use crate::actors::audit::{send_finished, AuditMsg};
use crate::actors::budget::{Account, BudgetMsg, Denied, Ticket};
use crate::actors::critic::CriticMsg;
use crate::actors::run::{DurableRun, RunArgs};
use crate::agent::Agent;
use crate::handle::{RunEvents, RunHandle};
use crate::ports::audit::RunInfo;
use crate::ports::checkpoint::{Checkpoint, EncodedJson, Unchanged};
use crate::ports::model::{Message, Role};
use crate::ports::run::{cap_text, unix_ms, RunId, RunStatus};
use crate::record::{
    self, Allowance, Allowances, Ending, RunIdentity, RunShared, SUBSCRIBER_BUFFER,
};
use crate::spec::{AgentSpec, Invocation, LimitsSpec};

/// A ticket from `account` and the run's `allowances` (reserving
/// `estimate` tokens of each for the first call), or why the run may not
/// start now.
fn take_ticket(
    caller: &str,
    account: &Arc<Account>,
    estimate: u64,
    allowances: Option<&Allowances>,
) -> Result<Ticket, Ending> {
    let ticket = account.admit(estimate).map_err(|d| match d {
        Denied::Tokens | Denied::Cost | Denied::Runtime => Ending::failed(
            RunStatus::BudgetExceeded,
            "budget",
            format!("caller `{caller}` has spent its {} budget", d.what()),
        ),
        Denied::Concurrency => Ending::failed(
            RunStatus::Rejected,
            "caller_concurrency",
            format!("caller `{caller}` has as many runs in flight as it may"),
        ),
    })?;
    match allowances {
        None => Ok(ticket),
        Some(list) => ticket
            .with_allowances(list)
            .map_err(|spent| Ending::failed(RunStatus::BudgetExceeded, "budget", spent.message())),
    }
}

/// A run started, or the rest of its admission to wait for.
pub(super) enum Started<'a> {
    /// Started (or refused) at once.
    Now((RunHandle, Option<RunEvents>)),
    /// Admission waits (a durable run's first checkpoint, a caller's first
    /// admission).
    Later(Pin<Box<dyn Future<Output = (RunHandle, Option<RunEvents>)> + Send + 'a>>),
}

impl Started<'_> {
    pub(super) async fn await_started(self) -> (RunHandle, Option<RunEvents>) {
        match self {
            Started::Now(started) => started,
            Started::Later(rest) => rest.await,
        }
    }
}

/// A run between the host's checks and its start: what admission may still
/// refuse (a durable run's first checkpoint, the caller's account).
struct Opening {
    /// Everything the shard starts it with (the ticket comes last); boxed
    /// once, handed to the shard as is.
    args: Box<RunArgs>,
    /// The critic shard that will host it.
    shard: ActorRef<CriticMsg>,
    caller: Arc<str>,
    handle: RunHandle,
    events: Option<RunEvents>,
    /// A durable run's first checkpoint, still to be saved.
    first_checkpoint: Option<Box<Checkpoint>>,
}

impl Opening {
    /// The allowances the run spends against besides its caller's account.
    fn allowances(&self) -> Option<&Allowances> {
        self.args.shared.allowances.as_ref()
    }

    /// Ends the run before it started: finalized with `ending`, its handle
    /// resolves.
    fn refuse(self, ending: Ending, audit: &ActorRef<AuditMsg>) -> (RunHandle, Option<RunEvents>) {
        send_finished(audit, self.args.shared.finish_after(ending, Vec::new()));
        (self.handle, self.events)
    }
}

/// The transcript a new run starts from: the system prompt (its
/// `{{inputs.NAME}}` filled), then the input (with the invocation's
/// attachments).
fn initial_transcript(
    spec: &AgentSpec,
    prompt: &str,
    inputs: &std::collections::BTreeMap<String, serde_json::Value>,
    attachments: Vec<crate::spec::Attachment>,
) -> Vec<Message> {
    // Room for the first tool turn; a run that waits on its first call
    // holds no more than that.
    let mut t = Vec::with_capacity(4);
    if !spec.system.is_empty() {
        let system = crate::spec::fill_inputs("system", &spec.system, inputs)
            .map(|s| s.into_owned())
            .unwrap_or_else(|_| spec.system.clone());
        t.push(Message::text(Role::System, system));
    }
    let mut input = Message::text(Role::User, prompt);
    input.attachments = attachments;
    t.push(input);
    t
}

/// Checks an invocation before anything runs: its attachments (size cap,
/// image type and content) and its budget.
pub(super) fn check_invocation(inv: &Invocation) -> Result<(), SubmitError> {
    if inv.budget_tokens == Some(0) {
        return Err(SubmitError::ZeroBudget);
    }
    for a in &inv.attachments {
        a.check()?;
    }
    Ok(())
}

/// Checks an invocation against the agent it runs: the manifest's
/// `{{inputs.NAME}}` are all given, and a model that needs something to
/// answer ([`ChatModel::needs_input`]: the HTTP providers) gets it — a
/// prompt (the invocation's or the manifest's), inputs or an attachment.
///
/// [`ChatModel::needs_input`]: crate::ports::model::ChatModel::needs_input
pub(super) fn check_submission(agent: &Agent, inv: &Invocation) -> Result<(), SubmitError> {
    let spec = agent.spec();
    spec.check_inputs(&inv.inputs)?;
    let prompt = |p: &str| !p.trim().is_empty();
    let has_input = prompt(&inv.prompt)
        || spec.prompt.as_deref().is_some_and(prompt)
        || !inv.inputs.is_empty()
        || !inv.attachments.is_empty();
    if !has_input && agent.model().needs_input() {
        return Err(SubmitError::NoInput {
            agent: spec.name.clone(),
        });
    }
    Ok(())
}

impl Host {
    /// Admits and starts a run: a new one, or (`resumed`) a durable run
    /// from its checkpoint. Synchronous unless admission must wait — for a
    /// durable run's first checkpoint or a caller's first admission — and
    /// then the rest is a boxed future, which only those runs pay for: a
    /// caller's future holds no admission state while it awaits its run.
    pub(super) fn start(
        &self,
        agent: Agent,
        inv: Invocation,
        with_events: bool,
        resumed: Option<(Box<Checkpoint>, u32)>,
    ) -> Started<'_> {
        let run = match self.open(agent, inv, with_events, resumed) {
            Ok(run) => run,
            Err(refused) => return Started::Now(refused),
        };
        if run.first_checkpoint.is_none() {
            if let Some(admitted) = self.admit_cached(&run.caller, run.allowances()) {
                return Started::Now(match admitted {
                    Ok(ticket) => self.launch(run, ticket),
                    Err(ending) => run.refuse(ending, &self.inner.audit),
                });
            }
        }
        Started::Later(Box::pin(self.start_waiting(run)))
    }

    /// The rest of [`start`](Self::start) for a run admission waits for.
    async fn start_waiting(&self, mut run: Opening) -> (RunHandle, Option<RunEvents>) {
        if let Some(first) = run.first_checkpoint.take() {
            // A durable run is accepted once its first checkpoint is saved:
            // from then on a crash cannot lose it (`recover` resumes or ends it).
            if let Err(e) = self.save_checkpoint(first).await {
                let ending = Ending::failed(
                    RunStatus::Rejected,
                    "checkpoint_unavailable",
                    format!("the run's first checkpoint could not be saved: {e}"),
                );
                return run.refuse(ending, &self.inner.audit);
            }
        }
        let allowances = run.args.shared.allowances.clone();
        match self.admit(&run.caller, allowances.as_ref()).await {
            Ok(ticket) => self.launch(run, ticket),
            Err(ending) => run.refuse(ending, &self.inner.audit),
        }
    }

    /// The part of admission that needs no waiting: the run's record and
    /// handle, the host's checks (closed, run cap, the model's circuit),
    /// the starting transcript, a durable run's first checkpoint. `Err` is a
    /// run refused here (finalized, its handle resolves).
    fn open(
        &self,
        agent: Agent,
        mut inv: Invocation,
        with_events: bool,
        resumed: Option<(Box<Checkpoint>, u32)>,
    ) -> Result<Opening, (RunHandle, Option<RunEvents>)> {
        let h = &self.inner;
        if resumed.is_none() && !h.booted.load(Ordering::Relaxed) {
            h.booted.store(true, Ordering::Relaxed);
        }
        let run_id = inv.run_id.unwrap_or_default();
        // The agent's own limits are shared by its runs; an invocation's
        // own make a run's own copy.
        let limits = if inv.limits == LimitsSpec::default() {
            agent.shared_limits()
        } else {
            Arc::new(
                inv.limits
                    .resolve(&agent.spec().limits.over(&h.config.default_limits)),
            )
        };
        // A child run: in its parent's tree, spending its parent's caller.
        let parent = inv.parent_run_id.and_then(|p| h.live.get(&p));
        if let (Some(p), None) = (&parent, &inv.caller_id) {
            inv.caller_id = p.caller_id.as_deref().map(str::to_string);
        }
        let caller = self.caller_arc(inv.caller_id.as_deref());
        // The tree it is recorded in: its parent's (the parent's top run,
        // or the pipeline the parent is a phase of), else the invocation's.
        inv.root_run_id = parent
            .as_ref()
            .map(|p| p.tree_root.unwrap_or(p.root_run_id))
            .or(inv.root_run_id);
        let allowances = self.allowances(
            &agent,
            &inv,
            run_id,
            parent.as_ref(),
            resumed.as_ref().map(|(c, _)| &**c),
        );
        // Runs go round the shards; a run's key is unique on its host.
        let key = h.next_key.fetch_add(1, Ordering::Relaxed);
        let shard = h.shards.route(key);
        let (shared, result_rx) = RunShared::new(
            RunIdentity {
                run_id,
                agent: agent.name_arc(),
                caller_id: Some(caller.clone()),
                parent_run_id: inv.parent_run_id,
                root_run_id: parent.as_ref().map(|p| p.root_run_id),
                tree_root: inv.root_run_id,
                depth: parent.as_ref().map_or(0, |p| p.depth + 1),
                max_iterations: limits.max_iterations,
                allowances,
                forked_from: inv.forked_from,
                // Its recipe stays in the invocation too: a durable run's
                // checkpoint keeps it (see `Host::recover`).
                publish: inv.publish.clone(),
            },
            shard.mailbox,
            key,
            h.live.clone(),
        );
        let shard = shard.actor;
        // A run's own MCP servers (`scope: run`) stop when it ends.
        #[cfg(feature = "mcp")]
        if agent.spec().mcp.as_ref().is_some_and(|m| {
            m.servers
                .iter()
                .any(|s| s.scope == crate::spec::mcp::McpScope::Run)
        }) {
            h.mcp.watch_run(shared.clone(), run_id);
        }
        // A stream asked for at submission sees every record from the first.
        let events = with_events.then(|| RunEvents {
            inner: record::subscribe(shared.clone(), 0, SUBSCRIBER_BUFFER),
        });
        let durable = resumed.is_some() || agent.spec().durable || h.config.durable_default;
        if durable {
            shared.set_durable();
        }
        shared.set_audit_detail(agent.spec().audit.unwrap_or(h.config.audit));
        let resumed = resumed.map(|(c, next_seq)| {
            // The resumed run's records follow the ones already on file.
            shared.start_seq_at(next_seq);
            c
        });
        let handle = RunHandle {
            run_id,
            shared: shared.clone(),
            result_rx,
            done: false,
            detached: false,
        };
        // Admission: host cap, then the caller's account.
        let refused = if h.closed.load(Ordering::Acquire) {
            Some(Ending::failed(
                RunStatus::Rejected,
                "shutting_down",
                "the host is shutting down",
            ))
        } else if h.audit_health.store_unavailable() {
            // Durability: a run admitted now could not be recorded.
            Some(Ending::failed(
                RunStatus::Rejected,
                record::STORE_UNAVAILABLE,
                "neither the audit store nor its spool can take records",
            ))
        } else if let Some(cap) = h
            .config
            .max_concurrent_runs
            // `live` already counts this run.
            .filter(|cap| h.live.count() > *cap)
        {
            Some(Ending::failed(
                RunStatus::Rejected,
                "concurrency",
                format!("the host runs {cap} runs at most"),
            ))
        } else if let Some((kind, message)) = agent.unusable_reason() {
            // Its MCP servers did not start.
            Some(Ending::failed(RunStatus::Error, kind, message))
        } else if let Err(e) = agent.model().admit() {
            // The model's circuit breaker: an open circuit refuses at once.
            Some(Ending::failed(RunStatus::Rejected, e.kind(), e.to_string()))
        } else if let Some(why) = self.tree_refusal(&inv, parent.as_ref(), resumed.is_some()) {
            Some(why)
        } else {
            if let Some(p) = &parent {
                p.add_child(run_id);
            }
            None
        };
        if let Some(ending) = refused {
            send_finished(&h.audit, shared.finish_after(ending, Vec::new()));
            return Err((handle, events));
        }
        // Inputs fill the manifest's `{{inputs.NAME}}` (checked in `submit`);
        // such runs do not share the agent's starting transcript.
        let templated = agent.spec().uses_inputs();
        let own_prompt = inv.prompt.is_empty()
            && agent.spec().prompt.is_some()
            && !templated
            && inv.attachments.is_empty();
        let prompt: std::borrow::Cow<'_, str> = if !inv.prompt.is_empty() {
            std::mem::take(&mut inv.prompt).into()
        } else if let Some(p) = &agent.spec().prompt {
            crate::spec::fill_inputs("prompt", p, &inv.inputs).unwrap_or_else(|_| p.as_str().into())
        } else if !inv.inputs.is_empty() {
            serde_json::to_string(&inv.inputs)
                .unwrap_or_default()
                .into()
        } else {
            "".into()
        };
        let transcript = match &resumed {
            Some(c) => c.transcript.clone(),
            // Runs of the manifest's own prompt share one starting transcript.
            None if own_prompt => agent.default_transcript(|| {
                initial_transcript(agent.spec(), &prompt, &inv.inputs, Vec::new())
            }),
            None => Arc::new(initial_transcript(
                agent.spec(),
                &prompt,
                &inv.inputs,
                inv.attachments.clone(),
            )),
        };
        // A session's prompt (`Invocation::history`): its earlier turns go
        // between the system prompt and the new input.
        let history = std::mem::take(&mut inv.history);
        let transcript = if history.is_empty() || resumed.is_some() {
            transcript
        } else {
            let system = usize::from(transcript.first().is_some_and(|m| m.role == Role::System));
            let mut t = Vec::with_capacity(transcript.len() + history.len() + 2);
            t.extend_from_slice(&transcript[..system]);
            t.extend(history);
            t.extend_from_slice(&transcript[system..]);
            Arc::new(t)
        };
        let mut first_checkpoint = None;
        let durable = if durable {
            // The manifest (once per agent) and the invocation (once per
            // run) are encoded here; a resumed run keeps its checkpoint's.
            let encoded = match &resumed {
                Some(c) => Ok((c.spec.clone(), c.invocation.clone())),
                None => agent.encoded_spec().and_then(|spec| {
                    let inv = Invocation {
                        run_id: Some(run_id),
                        caller_id: Some(caller.to_string()),
                        prompt: prompt.to_string(),
                        ..inv.clone()
                    };
                    Ok((spec, EncodedJson::encode(&inv)?))
                }),
            };
            let (spec, invocation) = match encoded {
                Ok(e) => e,
                Err(e) => {
                    let ending = Ending::failed(
                        RunStatus::Rejected,
                        "checkpoint_unavailable",
                        format!("the run's manifest or invocation does not encode: {e}"),
                    );
                    send_finished(&h.audit, shared.finish_after(ending, Vec::new()));
                    return Err((handle, events));
                }
            };
            let d = Arc::new(DurableRun {
                agent: agent.name_arc(),
                spec,
                invocation,
                resumes: resumed.as_ref().map_or(0, |c| c.resumes),
                started_at: resumed.as_ref().map_or_else(unix_ms, |c| c.started_at),
            });
            // Saved whole: a resumed run's store may hold more of it than
            // its checkpoint (saves after the one `recover` read).
            first_checkpoint = Some(Box::new(match &resumed {
                Some(c) => Checkpoint {
                    unchanged: Unchanged::default(),
                    ..Checkpoint::clone(c)
                },
                None => Checkpoint {
                    run_id,
                    agent: d.agent.clone(),
                    spec: d.spec.clone(),
                    invocation: d.invocation.clone(),
                    transcript: transcript.clone(),
                    iteration: 0,
                    steps: Vec::new(),
                    usage: Default::default(),
                    cost_micros: Some(0),
                    critic: Vec::new(),
                    resumes: 0,
                    started_at: d.started_at,
                    saved_at: unix_ms(),
                    parked: None,
                    unchanged: Unchanged::default(),
                },
            }));
            Some(d)
        } else {
            None
        };
        let info = resumed.is_none().then(|| RunInfo {
            agent: agent.name_arc(),
            model: agent.model_name(),
            caller_id: Some(caller.clone()),
            channel_id: inv.channel_id,
            parent_run_id: inv.parent_run_id,
            session_id: inv.session_id,
            prompt: cap_text(&prompt, 2048),
            tools: agent.tool_names(),
            limits: Some(*limits),
            host: Some(h.host_id.clone()),
            manifest: agent.recorded_manifest(),
        });
        Ok(Opening {
            args: Box::new(RunArgs {
                key,
                shared,
                agent,
                limits,
                transcript,
                durable,
                info,
                resumed,
                audit: h.audit.clone(),
                budget: h.budget.clone(),
                ticket: None,
                deadline_cap: inv.deadline,
                parent_span: crate::actors::run::spans::submitter(),
            }),
            shard,
            caller,
            handle,
            events,
            first_checkpoint,
        })
    }

    /// The token allowances a run spends against besides its caller's
    /// account: its parent's (a sub-agent), else the host's, and its own
    /// when the manifest (`budget.tokens`) or the invocation
    /// (`budget_tokens`) gives one — the smaller of the two. A resumed
    /// run's own allowance counts what its checkpoint spent.
    fn allowances(
        &self,
        agent: &Agent,
        inv: &Invocation,
        run_id: RunId,
        parent: Option<&Arc<RunShared>>,
        resumed: Option<&Checkpoint>,
    ) -> Option<Allowances> {
        let above = match parent {
            Some(p) => p.allowances.clone(),
            None => self.inner.allowance.clone(),
        };
        let manifest = agent.spec().budget.as_ref().and_then(|b| b.tokens);
        let own = match (manifest, inv.budget_tokens) {
            (Some(a), Some(b)) => a.min(b),
            (Some(n), None) | (None, Some(n)) => n,
            (None, None) => return above,
        };
        let spent = resumed.map_or(0, |c| c.usage.total());
        let own = Allowance::new(format!("run {run_id}"), own, spent);
        Some(match above {
            None => Arc::new([own]),
            Some(list) => list.iter().cloned().chain(std::iter::once(own)).collect(),
        })
    }

    /// Why a child run may not start: its parent is gone, or a cap of the
    /// delegation tree (depth, children at once, descendants of the root)
    /// is reached. Counts the child in its root's descendants when it may.
    fn tree_refusal(
        &self,
        inv: &Invocation,
        parent: Option<&Arc<RunShared>>,
        resumed: bool,
    ) -> Option<Ending> {
        let c = &self.inner.config;
        let parent_id = inv.parent_run_id?;
        let Some(parent) = parent else {
            if resumed {
                return None;
            }
            return Some(Ending::failed(
                RunStatus::Rejected,
                "parent_ended",
                format!("the parent run {parent_id} is not in flight"),
            ));
        };
        let depth = parent.depth + 1;
        if depth > c.max_depth {
            return Some(Ending::failed(
                RunStatus::Rejected,
                "max_depth",
                format!("sub-agents nest {} deep at most", c.max_depth),
            ));
        }
        if parent.live_children().len() >= c.max_children as usize {
            return Some(Ending::failed(
                RunStatus::Rejected,
                "max_children",
                format!(
                    "a run has {} sub-agents running at once at most",
                    c.max_children
                ),
            ));
        }
        let root = if parent.root_run_id == parent.run_id {
            Some(parent.clone())
        } else {
            self.inner.live.get(&parent.root_run_id)
        };
        if let Some(root) = root {
            if root.add_descendant() > c.max_descendants {
                return Some(Ending::failed(
                    RunStatus::Rejected,
                    "max_descendants",
                    format!(
                        "a run tree has {} sub-agent runs at most",
                        c.max_descendants
                    ),
                ));
            }
        }
        None
    }

    /// Hands an admitted run to its shard, which starts it.
    fn launch(&self, run: Opening, ticket: Ticket) -> (RunHandle, Option<RunEvents>) {
        let Opening {
            mut args,
            shard,
            handle,
            events,
            ..
        } = run;
        args.ticket = Some(ticket);
        if let Err(ractor::MessagingErr::SendErr(CriticMsg::Start(args))) =
            shard.cast(CriticMsg::Start(args))
        {
            let ending = Ending::failed(
                RunStatus::Error,
                "host_stopped",
                "the run's critic shard is gone",
            );
            send_finished(
                &self.inner.audit,
                args.shared.finish_after(ending, Vec::new()),
            );
        }
        (handle, events)
    }

    /// Records a run its caller could not start — it failed before it was
    /// submitted (a scheduled skill's missing secret, a manifest that does
    /// not prepare) — as a run of `agent` that ended `error` with
    /// `error_kind` `kind`: finalized by the path a run refused at
    /// admission takes, so it gets one terminal record and, in the same
    /// batch, the intents of the invocation's publish plan (a run that
    /// never started still owes its `on_failure` and `always`
    /// publishes). Only the invocation's id, caller, parent and tree,
    /// publish plan and fork origin are read. Answers the result once it
    /// is written (or spooled).
    pub async fn record_unstarted(
        &self,
        agent: &str,
        mut inv: Invocation,
        kind: &str,
        error: impl Into<String>,
    ) -> crate::ports::run::RunResult {
        let h = &self.inner;
        let run_id = inv.run_id.unwrap_or_default();
        let caller = self.caller_arc(inv.caller_id.as_deref());
        let key = h.next_key.fetch_add(1, Ordering::Relaxed);
        let shard = h.shards.route(key);
        let (shared, result_rx) = RunShared::new(
            RunIdentity {
                run_id,
                agent: Arc::from(agent),
                caller_id: Some(caller),
                parent_run_id: inv.parent_run_id,
                root_run_id: None,
                tree_root: inv.root_run_id,
                depth: 0,
                max_iterations: 0,
                allowances: None,
                forked_from: inv.forked_from,
                publish: std::mem::take(&mut inv.publish),
            },
            shard.mailbox,
            key,
            h.live.clone(),
        );
        let ending = Ending::failed(
            RunStatus::Error,
            kind,
            crate::secrets::redact_string(error.into()),
        );
        send_finished(&h.audit, shared.finish_after(ending, Vec::new()));
        RunHandle {
            run_id,
            shared,
            result_rx,
            done: false,
            detached: false,
        }
        .await
    }

    /// The caller id as shared text: the host's default caller's is made
    /// once, not per run.
    pub(super) fn caller_arc(&self, caller: Option<&str>) -> Arc<str> {
        match caller {
            Some(c) => Arc::from(c),
            None => self.inner.default_caller.clone(),
        }
    }

    /// Saves a checkpoint with the audit actor's next batch and waits until
    /// it is written (at most the admission timeout).
    pub(super) async fn save_checkpoint(&self, checkpoint: Box<Checkpoint>) -> Result<(), String> {
        let h = &self.inner;
        let (tx, rx) = tokio::sync::oneshot::channel();
        h.audit
            .cast(AuditMsg::Checkpoint {
                checkpoint,
                saved: Some(tx),
            })
            .map_err(|_| "the audit actor is gone".to_string())?;
        match tokio::time::timeout(h.config.admission_timeout, rx).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(_)) => Err("the audit actor stopped".into()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// Takes a ticket from the caller's account if it is cached (no
    /// waiting); `None` when it must be loaded first ([`Host::admit`]).
    fn admit_cached(
        &self,
        caller: &Arc<str>,
        allowances: Option<&Allowances>,
    ) -> Option<Result<Ticket, Ending>> {
        let account = self.inner.accounts.get(caller).map(|a| a.clone())?;
        Some(take_ticket(
            caller,
            &account,
            self.inner.config.budget_reserve_tokens,
            allowances,
        ))
    }

    /// Finds (or loads) the caller's account and takes a ticket from it.
    pub(super) async fn admit(
        &self,
        caller: &Arc<str>,
        allowances: Option<&Allowances>,
    ) -> Result<Ticket, Ending> {
        let h = &self.inner;
        let cached = h.accounts.get(caller).map(|a| a.clone());
        let account = match cached {
            Some(a) => a,
            None => {
                let answer = h
                    .budget
                    .call(
                        |reply| BudgetMsg::GetAccount {
                            caller: caller.clone(),
                            reply,
                        },
                        Some(h.config.admission_timeout),
                    )
                    .await;
                match answer {
                    Ok(CallResult::Success(Ok(a))) => {
                        h.accounts.insert(caller.clone(), a.clone());
                        a
                    }
                    Ok(CallResult::Success(Err(e))) => {
                        return Err(Ending::failed(RunStatus::Rejected, "budget_unavailable", e));
                    }
                    _ => {
                        return Err(Ending::failed(
                            RunStatus::Rejected,
                            "budget_unavailable",
                            "the budget check timed out",
                        ));
                    }
                }
            }
        };
        take_ticket(caller, &account, h.config.budget_reserve_tokens, allowances)
    }
}
