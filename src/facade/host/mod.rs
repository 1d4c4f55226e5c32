//! [`Host`]: the library handle. Build it from ports ([`HostBuilder`]),
//! prepare agents, submit runs, shut down.
//!
//! Admission happens in `submit`, before any actor exists: the host's run
//! cap, then the caller's account (budget tokens and concurrency). A refused
//! run still gets a handle and a terminal record (`rejected` or
//! `budget_exceeded`); only a caller error (an unknown tool or model) is an
//! `Err`.
//!
//! `shutdown` cancels what still runs, waits for every run's terminal
//! record, then drains the audit and budget actors before it returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use ractor::rpc::CallResult;
use ractor::ActorRef;

use crate::actors::audit::{send_finished, AuditHealth, AuditMsg};
use crate::actors::budget::{Account, BudgetMsg};
use crate::actors::critic::{CriticMsg, Fault};
use crate::actors::host::{HostMsg, ShardSet};
use crate::agent::Agent;
use crate::dispatch::{RegistryError, ToolRegistry};
use crate::handle::{RunEvents, RunHandle, RunRef};
use crate::ports::audit::{AuditStats, AuditStore};
use crate::ports::checkpoint::{Checkpointer, Lease};
use crate::ports::model::ChatModel;
use crate::ports::run::RunId;
use crate::ports::tool::Tool;
use crate::providers::{ModelResolver, ResolveError};
use crate::record::{self, Allowances, Ending, HostRuns};
use crate::spec::{AgentSpec, Invocation};

mod admission;
mod builder;
mod config;
pub mod palette;
mod publishing;
mod recovery;
mod retention;
pub(crate) mod sessions;

#[cfg(feature = "mcp")]
pub use crate::actors::mcp::{list_mcp_tools, ListedTool};
pub use builder::{HostBuilder, HostError};
pub use config::HostConfig;
pub use publishing::PublishWaitError;
pub use recovery::{
    decide_on_record, ParkedRuns, RecordDecisionError, RecoverError, Recovery, MAX_RESUMES,
};

use admission::{check_invocation, check_submission};

/// Why a run could not be submitted (a caller error; nothing ran).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The manifest names a tool this host does not have.
    #[error(transparent)]
    Tool(#[from] RegistryError),
    /// The manifest names MCP servers, and this build has no MCP client or
    /// the agent was prepared without starting them (see [`Host::prepare`]).
    #[error(transparent)]
    Mcp(#[from] crate::mcp::McpError),
    /// The manifest's prompt or system names an input the invocation does
    /// not bring (`{{inputs.NAME}}`).
    #[error(transparent)]
    MissingInput(#[from] crate::spec::MissingInput),
    /// The manifest names a model this host does not have.
    #[error("unknown model `{model}` (known: {known})")]
    UnknownModel {
        /// The model asked for.
        model: String,
        /// What the host knows.
        known: String,
    },
    /// The manifest names no model, or a tier that only the built-in
    /// default maps, and nothing configures it (the message says how to
    /// set one).
    #[error("{0}")]
    NoModel(String),
    /// The host's tier mappings are wrong for the model the manifest
    /// names: a tier maps to something that is no model, or tiers map
    /// onto each other in a loop.
    #[error(transparent)]
    Tier(crate::providers::ResolveError),
    /// An attachment is too large or not usable.
    #[error(transparent)]
    Attachment(#[from] crate::ports::model::AttachmentError),
    /// The invocation's `budget_tokens` is 0 (a run needs at least one).
    #[error("`budget_tokens` must be at least 1")]
    ZeroBudget,
    /// The manifest's `tool_choice` names a tool its agent does not see
    /// once its tools are known (an MCP server without that tool, a tool a
    /// sub-agent's parent does not let it have), or asks for a tool call
    /// (`required`) of an agent that sees none.
    #[error("agent `{agent}`: `tool_choice` {problem}")]
    ToolChoice {
        /// The agent's name.
        agent: String,
        /// What is wrong, with the tools the agent sees.
        problem: String,
    },
    /// The run would send a real provider nothing to answer: the manifest
    /// has no `prompt:` and the invocation brings no input, inputs or
    /// attachment.
    #[error("agent `{agent}` has nothing to answer: its manifest has no `prompt:` and no input was given (pass `--input TEXT` on the command line, `input` or `inputs` to the API, or give the manifest a `prompt:`)")]
    NoInput {
        /// The agent's name.
        agent: String,
    },
}

pub(crate) struct HostInner {
    /// The host's MCP servers (shared by every run that uses them).
    #[cfg(feature = "mcp")]
    mcp: crate::actors::mcp::hub::McpHub,
    config: HostConfig,
    tools: ToolRegistry,
    models: HashMap<String, Arc<dyn ChatModel>>,
    resolver: ModelResolver,
    root: ActorRef<HostMsg>,
    shards: Arc<ShardSet>,
    audit: ActorRef<AuditMsg>,
    budget: ActorRef<BudgetMsg>,
    audit_store: Arc<dyn AuditStore>,
    /// The audit store's outbox, if it keeps one.
    outbox: Option<Arc<dyn crate::ports::outbox::OutboxStore>>,
    /// Delivers what the outbox owes (with an outbox only).
    publisher: Option<ActorRef<crate::actors::publisher::PublisherMsg>>,
    /// Durability: whether the audit actor can write records (admission).
    audit_health: Arc<AuditHealth>,
    /// Exactly-once recovery: this host's lease on its durable runs.
    lease: Lease,
    /// The lease's owner id, shared by every run's `run.start` record.
    host_id: Arc<str>,
    checkpointer: Arc<dyn Checkpointer>,
    /// A run was submitted or `recover` ran: from then on `recover` would
    /// take this host's own runs for interrupted ones, so it refuses.
    booted: AtomicBool,
    accounts: DashMap<Arc<str>, Arc<Account>>,
    live: Arc<HostRuns>,
    closed: AtomicBool,
    /// The next run's key (its shard is the key modulo the shard count).
    next_key: AtomicU64,
    /// `config.default_caller`, shared by the runs that name no caller.
    default_caller: Arc<str>,
    /// `config.allowance_tokens`: the allowance every top-level run of the
    /// host spends against (sub-agents inherit their parent's list).
    allowance: Option<Allowances>,
    /// The chat sessions open on this host, and their store.
    sessions: crate::host::sessions::SessionTable,
    /// The background pruning (`HostConfig::retention`), stopped with the
    /// host.
    pruning: Option<retention::Pruning>,
}

/// What a run is made from: a manifest, or an agent prepared from one.
pub enum AgentSource {
    /// A manifest (prepared on every submit).
    Spec(Arc<AgentSpec>),
    /// A prepared agent.
    Agent(Agent),
}

impl From<AgentSpec> for AgentSource {
    fn from(s: AgentSpec) -> Self {
        AgentSource::Spec(Arc::new(s))
    }
}

impl From<Arc<AgentSpec>> for AgentSource {
    fn from(s: Arc<AgentSpec>) -> Self {
        AgentSource::Spec(s)
    }
}

impl From<&AgentSpec> for AgentSource {
    fn from(s: &AgentSpec) -> Self {
        AgentSource::Spec(Arc::new(s.clone()))
    }
}

impl From<Agent> for AgentSource {
    fn from(a: Agent) -> Self {
        AgentSource::Agent(a)
    }
}

impl From<&Agent> for AgentSource {
    fn from(a: &Agent) -> Self {
        AgentSource::Agent(a.clone())
    }
}

/// The runtime. Cheap to clone; every clone is the same host.
#[derive(Clone)]
pub struct Host {
    inner: Arc<HostInner>,
}

impl Host {
    /// A builder with the built-in tools, in-memory stores and the rules policy.
    pub fn builder() -> HostBuilder {
        HostBuilder::new()
    }

    /// The chat sessions open on this host (see [`crate::session`]).
    pub(crate) fn session_table(&self) -> &crate::host::sessions::SessionTable {
        &self.inner.sessions
    }

    /// The host's settings.
    pub fn config(&self) -> &HostConfig {
        &self.inner.config
    }

    /// The names of the tools agents may ask for.
    pub fn tool_names(&self) -> Vec<String> {
        self.inner.tools.names()
    }

    /// The audit store (to read records back).
    pub fn audit_store(&self) -> &Arc<dyn AuditStore> {
        &self.inner.audit_store
    }

    /// Runs in flight.
    pub fn live_runs(&self) -> usize {
        self.inner.live.count()
    }

    /// How many runs in flight wait for an operator to approve or deny a
    /// tool call (`approval:`). Visits every live run: for a scrape or a
    /// dashboard, not a hot path.
    pub fn awaiting_approval(&self) -> usize {
        self.inner
            .live
            .all()
            .iter()
            .filter(|r| r.is_awaiting_approval())
            .count()
    }

    /// Prepares an agent: resolves its model, selects its tools, resolves its limits.
    ///
    /// A manifest's sub-agents (`agents:`) become tools `agent__NAME` and
    /// the skills it offers (`skills:`) tools `skill__NAME`, each
    /// prepared here too, with the tools and MCP servers of its own
    /// manifest that this one has as well (see [`palette`]): a sub-agent
    /// of a manifest without MCP servers gets none. A manifest that names
    /// MCP servers needs them started: prepare it with
    /// [`prepare`](Self::prepare) (or submit the manifest).
    pub fn agent(&self, spec: impl Into<Arc<AgentSpec>>) -> Result<Agent, SubmitError> {
        let spec: Arc<AgentSpec> = spec.into();
        if spec.mcp.as_ref().is_some_and(|m| !m.servers.is_empty()) {
            return Err(crate::mcp::McpError::Unavailable(
                "the manifest names MCP servers: prepare it with `Host::prepare`".into(),
            )
            .into());
        }
        self.agent_with(spec, &[])
    }

    /// [`agent`](Self::agent), with the tools of its MCP servers (already
    /// started).
    fn agent_with(
        &self,
        spec: Arc<AgentSpec>,
        mcp: &[crate::mcp::ServedTool],
    ) -> Result<Agent, SubmitError> {
        let mcp_tools: Vec<crate::dispatch::CompiledTool> =
            mcp.iter().map(|t| t.tool.clone()).collect();
        let tools = self.inner.tools.select_with(&spec.tools, &mcp_tools)?;
        let model = self.model_for(&spec)?;
        let limits = spec.limits.resolve(&self.inner.config.default_limits);
        let mut palette: Vec<Arc<dyn Tool>> = Vec::with_capacity(spec.sub_agents.len());
        for sub in &spec.sub_agents {
            // A child may use only tools its parent may use (D3): its
            // manifest's tools and MCP servers intersected with its
            // parent's, the servers the parent's own (already started).
            let (child, child_mcp) = palette::within_parent(&spec, &sub.spec, mcp);
            let child = self.agent_with(Arc::new(child), &child_mcp)?;
            palette.push(Arc::new(palette::PaletteTool::new(
                sub,
                child,
                Arc::downgrade(&self.inner),
            )));
        }
        let tools = tools.with_tools(palette)?;
        check_tool_choice(&spec, &tools)?;
        let judges = self.judges_for(&spec)?;
        Ok(Agent::new(spec, model, tools, limits).with_judges(judges))
    }

    /// The model judges a manifest asks for (`critic.policy: judge`,
    /// `approval.judge`), resolved as its own model is: a judge's model is
    /// a model spec or a tier (the host's `--model` override included), on
    /// the manifest's `base_url` and `api_key_env`; `scripted` plays the
    /// judge's own `script`.
    fn judges_for(&self, spec: &AgentSpec) -> Result<crate::judge::Judges, SubmitError> {
        use crate::judge::{CriticJudge, JudgeModel, Judges};
        let resolve = |model: &str, script: &[crate::spec::ScriptEntry]| {
            let mut judge = AgentSpec::new(format!("{} judge", spec.name), model);
            judge.script = script.to_vec();
            judge.base_url = spec.base_url.clone();
            judge.api_key_env = spec.api_key_env.clone();
            self.model_for(&judge).map(JudgeModel::new)
        };
        let critic = match &spec.critic.judge {
            Some(j) if j.enabled() => Some(Arc::new(CriticJudge {
                model: resolve(&j.model, &j.script)?,
                confirm: match &j.confirm_model {
                    Some(m) => Some(resolve(m, &j.confirm_script)?),
                    None => None,
                },
                spec: j.clone(),
            })),
            _ => None,
        };
        let approval = match &spec.approval.judge {
            Some(m) => Some(resolve(m, &spec.approval.script)?),
            None => None,
        };
        Ok(Judges { critic, approval })
    }

    /// Prepares an agent as [`agent`](Self::agent) does, first starting the
    /// MCP servers its manifest names (or joining those already up on this
    /// host) and adding their tools (`<server>__<tool>`) after the
    /// manifest's own. A server that cannot start does not fail here: the
    /// agent's runs end `error` with the server's `mcp_*` error kind.
    pub async fn prepare(&self, spec: impl Into<Arc<AgentSpec>>) -> Result<Agent, SubmitError> {
        let spec: Arc<AgentSpec> = spec.into();
        let servers = match spec.mcp.as_ref() {
            Some(m) if !m.servers.is_empty() => &m.servers,
            _ => return self.agent(spec),
        };
        #[cfg(feature = "mcp")]
        let found = self.inner.mcp.tools_for(servers).await;
        #[cfg(not(feature = "mcp"))]
        let found: Result<Vec<crate::mcp::ServedTool>, _> = {
            let _ = servers;
            Err(crate::mcp::McpError::Unavailable(
                "this build has no MCP client (the `mcp` feature)".into(),
            ))
        };
        match found {
            Ok(extra) => self.agent_with(spec, &extra),
            Err(e) => {
                let model = self.model_for(&spec)?;
                let limits = spec.limits.resolve(&self.inner.config.default_limits);
                let tools = self.inner.tools.select_with(&[], &[])?;
                Ok(Agent::new(spec, model, tools, limits).unusable(e.kind(), e.to_string()))
            }
        }
    }

    /// The model a manifest names: a registered name (directly or through
    /// a tier), else what the provider resolver makes of it.
    fn model_for(&self, spec: &AgentSpec) -> Result<Arc<dyn ChatModel>, SubmitError> {
        let resolver = &self.inner.resolver;
        let named = resolver.model_of(spec);
        let target = resolver
            .follow_tiers(named)
            .unwrap_or_else(|_| named.to_string());
        for name in [named, target.as_str()] {
            if let Some(m) = self.inner.models.get(name) {
                return Ok(m.clone());
            }
        }
        resolver.resolve(spec).map_err(|e| {
            match e {
                ResolveError::NoModel { .. } | ResolveError::UnconfiguredTier { .. } => {
                    return SubmitError::NoModel(e.to_string())
                }
                ResolveError::BadTier { .. } | ResolveError::TierLoop(_) => {
                    return SubmitError::Tier(e)
                }
                _ => {}
            }
            let mut known: Vec<String> = self.inner.models.keys().cloned().collect();
            known.extend(resolver.known());
            known.sort_unstable();
            let model = match e {
                ResolveError::Unknown(m) => m,
                other => format!("{} ({other})", spec.model),
            };
            SubmitError::UnknownModel {
                model,
                known: known.join(", "),
            }
        })
    }

    /// Submits a run. The handle resolves to its result.
    pub async fn submit(
        &self,
        agent: impl Into<AgentSource>,
        invocation: Invocation,
    ) -> Result<RunHandle, SubmitError> {
        let agent = self.admissible(agent.into(), &invocation).await?;
        Ok(self
            .start(agent, invocation, false, None)
            .await_started()
            .await
            .0)
    }

    /// Submits a run and subscribes to its events.
    pub async fn submit_streaming(
        &self,
        agent: impl Into<AgentSource>,
        invocation: Invocation,
    ) -> Result<(RunHandle, RunEvents), SubmitError> {
        let agent = self.admissible(agent.into(), &invocation).await?;
        let (handle, events) = self
            .start(agent, invocation, true, None)
            .await_started()
            .await;
        Ok((handle, events.unwrap_or_else(RunEvents::closed)))
    }

    /// Submits a run and waits for its result.
    pub async fn execute(
        &self,
        agent: impl Into<AgentSource>,
        invocation: Invocation,
    ) -> Result<crate::RunResult, SubmitError> {
        Ok(self.submit(agent, invocation).await?.await)
    }

    /// The agent of a submission, once the submission is checked: every
    /// way to submit a run (the library, the CLI, the server, sessions,
    /// pipelines, sub-agents) comes through here, so a run refused as a
    /// caller error is refused the same way everywhere (see
    /// [`check_submission`]).
    async fn admissible(
        &self,
        source: AgentSource,
        invocation: &Invocation,
    ) -> Result<Agent, SubmitError> {
        check_invocation(invocation)?;
        let agent = self.resolve_async(source).await?;
        check_submission(&agent, invocation)?;
        Ok(agent)
    }

    /// The agent of a submission: a manifest with MCP servers is prepared
    /// with them ([`prepare`](Self::prepare)); the rest at once. The
    /// preparation (starting servers, listing their tools) is a large
    /// future, boxed: inline, every caller's future for every submission
    /// would carry its room (a swarm's, for each run it waits on).
    async fn resolve_async(&self, source: AgentSource) -> Result<Agent, SubmitError> {
        match source {
            AgentSource::Agent(a) => Ok(a),
            AgentSource::Spec(s) if s.mcp.is_some() => Box::pin(self.prepare(s)).await,
            AgentSource::Spec(s) => self.agent(s),
        }
    }

    /// Reloads every caller's limits and spend from the ledger now (after
    /// changing limits there; the budget actor also does so every
    /// `budget_refresh_every`). Accounts are refreshed in place, so runs in
    /// flight keep their concurrency slots and reservations.
    pub async fn reload_budgets(&self) {
        let _ = self
            .inner
            .budget
            .call(
                BudgetMsg::RefreshNow,
                Some(self.inner.config.admission_timeout),
            )
            .await;
    }

    /// Waits until no run is in flight.
    pub async fn wait_idle(&self) {
        self.inner.live.wait_idle().await;
    }

    /// A run in flight, by its id: a reference to steer, extend, kill or
    /// cancel it, read its live state, subscribe to its events or await its
    /// result. `None` once the run has ended (its record is in the audit
    /// store) or for an id this host never ran.
    pub fn run(&self, run_id: &RunId) -> Option<RunRef> {
        self.inner.live.get(run_id).map(|shared| RunRef { shared })
    }

    /// A watcher of the host-wide feed: runs starting and ending, critic
    /// decisions ([`HostEvent`](crate::record::HostEvent)). Lossy: a
    /// watcher that falls behind is told how many events it missed (a
    /// dashboard's feed; a run's own stream, [`RunRef::subscribe`], loses
    /// nothing). Costs the host nothing while no one watches.
    pub fn watch(&self) -> crate::record::HostFeed {
        self.inner.live.watch()
    }

    /// A run's events from record `from_seq` on, live or ended: a live
    /// run's subscription ([`RunRef::subscribe_from`]), else its records
    /// read back from the audit store. `Ok(None)`: no record of the run
    /// (yet: a run that just ended may take a moment to reach the store).
    pub async fn events(
        &self,
        run_id: &RunId,
        from_seq: u32,
    ) -> Result<Option<RunEvents>, crate::ports::audit::AuditStoreError> {
        if let Some(run) = self.run(run_id) {
            return Ok(Some(run.subscribe_from(from_seq)));
        }
        let stored = record::stored_events(&*self.inner.audit_store, *run_id, from_seq).await?;
        Ok(stored.map(|events| RunEvents {
            inner: Box::pin(futures_util::stream::iter(events)),
        }))
    }

    /// Every run in flight on this host (a snapshot; newest first).
    pub fn runs(&self) -> Vec<LiveRun> {
        let mut out: Vec<LiveRun> = self
            .inner
            .live
            .all()
            .into_iter()
            .map(|shared| {
                let live = shared.live();
                LiveRun {
                    run_id: shared.run_id,
                    agent: shared.agent.to_string(),
                    caller_id: shared.caller_id.as_deref().map(str::to_string),
                    parent_run_id: shared.parent_run_id,
                    status: if live.finished {
                        LiveStatus::Finishing
                    } else {
                        LiveStatus::Running
                    },
                    age_ms: live.elapsed_ms,
                    iteration: live.iteration,
                    max_iterations: live.max_iterations,
                    tokens: live.tokens,
                    tool_calls: live.tool_calls,
                    cost_micros: live.cost_micros,
                    last_decision: live.last_decision,
                    awaiting_approval: live.awaiting_approval,
                }
            })
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.run_id));
        out
    }

    /// Test hook: injects a fault into critic shard `shard` (it fails
    /// outside any run's handler, or stops handling messages).
    #[doc(hidden)]
    pub fn inject_shard_fault(&self, shard: usize, fault: Fault) {
        let actors = self.inner.shards.actors();
        if let Some(a) = actors.get(shard) {
            let _ = a.cast(CriticMsg::InjectFault(fault));
        }
    }

    /// Test hook: tells every shard the process was not scheduled for
    /// `gap`, as its sleeper does when its real-clock pulses come that late
    /// (a VM pause, SIGSTOP).
    #[doc(hidden)]
    pub fn inject_pause(&self, gap: Duration) {
        for a in self.inner.shards.actors() {
            let _ = a.cast(CriticMsg::Paused { gap });
        }
        // As a shard does when it has runs (a host without any learns of a
        // pause at its next renewal).
        let _ = self.inner.audit.cast(AuditMsg::Paused { gap });
    }

    /// This host's id as its leases name it (and its runs' `run.start`
    /// records: [`RunInfo::host`](crate::ports::audit::RunInfo::host)).
    pub fn host_id(&self) -> &str {
        &self.inner.host_id
    }

    /// Stops accepting runs, cancels what still runs, waits for every
    /// terminal record (at most `HostConfig::shutdown_timeout`; then what
    /// is left ends `cancelled` at once, durable runs keeping their
    /// checkpoint), drains the audit and budget actors, stops the actors.
    pub async fn shutdown(&self) -> AuditStats {
        self.shutdown_after(Duration::ZERO).await
    }

    /// Like [`shutdown`](Self::shutdown), but first lets the runs in flight
    /// go on for up to `drain` (no new run is admitted meanwhile).
    pub async fn shutdown_after(&self, drain: Duration) -> AuditStats {
        let h = &self.inner;
        h.closed.store(true, Ordering::Release);
        if let Some(p) = &h.pruning {
            p.stop();
        }
        if !drain.is_zero() {
            let _ = tokio::time::timeout(drain, self.wait_idle()).await;
        }
        for c in h.shards.actors() {
            let _ = c.cast(CriticMsg::CancelAll);
        }
        if tokio::time::timeout(h.config.shutdown_timeout, self.wait_idle())
            .await
            .is_err()
        {
            let left = h.live.all();
            tracing::warn!(
                runs = left.len(),
                "runs did not finalize within the shutdown timeout: they end cancelled now"
            );
            for run in left {
                send_finished(&h.audit, run.finish_after(Ending::suspended(), Vec::new()));
            }
        }
        let _ = h
            .budget
            .call(BudgetMsg::Drain, Some(Duration::from_secs(30)))
            .await;
        let stats = match h
            .audit
            .call(AuditMsg::Drain, Some(Duration::from_secs(60)))
            .await
        {
            Ok(CallResult::Success(s)) => s,
            _ => h.audit_store.stats().await.unwrap_or_default(),
        };
        // Every record is written: the store may fold its journal in.
        h.audit_store.settle().await;
        // Exactly once: the durable runs this host keeps (cancelled by the
        // shutdown) may be recovered at once, by any host.
        if let Err(e) = h.checkpointer.release(&h.lease.owner).await {
            tracing::warn!(error = %e, "cannot release this host's leases; they expire on their own");
        }
        #[cfg(feature = "mcp")]
        h.mcp.shutdown().await;
        let _ = h
            .root
            .stop_children_and_wait(None, Some(Duration::from_secs(10)))
            .await;
        h.root.stop(None);
        stats
    }
}

/// Where a live run is ([`Host::runs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LiveStatus {
    /// It runs.
    Running,
    /// It ended; its terminal record is being written.
    Finishing,
}

/// A run in flight, as [`Host::runs`] lists it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LiveRun {
    /// The run.
    pub run_id: RunId,
    /// Its agent.
    pub agent: String,
    /// Who submitted it.
    pub caller_id: Option<String>,
    /// Its parent, for a sub-agent run.
    pub parent_run_id: Option<RunId>,
    /// Running, or finishing.
    pub status: LiveStatus,
    /// Time since it started, in ms.
    pub age_ms: u64,
    /// Model iterations started.
    pub iteration: u32,
    /// The iteration ceiling.
    pub max_iterations: u32,
    /// Tokens used so far.
    pub tokens: u64,
    /// Tool calls finished so far.
    pub tool_calls: u32,
    /// Cost so far in micro-dollars.
    pub cost_micros: u64,
    /// The critic's latest decision, if it made one.
    pub last_decision: Option<crate::ports::run::CriticDecision>,
    /// Tool calls waiting for an operator's approval.
    pub awaiting_approval: Vec<crate::handle::PendingApproval>,
}

/// The manifest's `tool_choice` against the tools its agent sees, all of
/// them known now (its own, its sub-agents', its MCP servers'): a named
/// tool must be one of them, and `required` needs one.
fn check_tool_choice(
    spec: &AgentSpec,
    tools: &crate::dispatch::ToolSet,
) -> Result<(), SubmitError> {
    use crate::ports::model::ToolChoice;
    let seen = || {
        let names: Vec<String> = tools.specs().iter().map(|t| t.name.clone()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    let problem = match &spec.tool_choice {
        Some(ToolChoice::Tool(name)) if !tools.contains(name) => format!(
            "names `{name}`, which the agent does not see (its tools: {})",
            seen()
        ),
        Some(ToolChoice::Required) if tools.is_empty() => {
            "is `required`, but the agent sees no tool".to_string()
        }
        _ => return Ok(()),
    };
    Err(SubmitError::ToolChoice {
        agent: spec.name.clone(),
        problem,
    })
}
