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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::sync::Notify;

use crate::actors::audit::{Audit, AuditMsg};
use crate::actors::budget::{Account, Budget, BudgetMsg, Denied, Ticket};
use crate::actors::critic::{Critic, CriticMsg};
use crate::actors::host::{HostActor, HostMsg};
use crate::actors::run::{RunActor, RunArgs};
use crate::agent::Agent;
use crate::handle::{Ending, RunEvents, RunHandle, RunShared};
use crate::policy::RulesPolicy;
use crate::ports::audit::{AuditStats, AuditStore, RunInfo};
use crate::ports::budget::BudgetLedger;
use crate::ports::critic::CriticPolicy;
use crate::ports::model::ChatModel;
use crate::ports::run::{cap_text, RunStatus};
use crate::ports::tool::Tool;
use crate::providers::ScriptedModel;
use crate::spec::{AgentSpec, Invocation, LimitsSpec};
use crate::stores::{MemoryAuditStore, MemoryBudgetLedger};
use crate::tools::{RegistryError, ToolRegistry};

/// Host-wide settings. Every field has a default.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Critic shards (default: the number of CPUs).
    pub critic_shards: usize,
    /// Limits for keys neither the invocation nor the manifest sets.
    pub default_limits: LimitsSpec,
    /// Audit records per store write, at most.
    pub audit_batch: usize,
    /// How long a record may wait in the audit buffer.
    pub audit_max_age: Duration,
    /// Where audit batches go while the audit store fails (an append-only
    /// file of JSON lines, replayed into the store once it works again).
    /// `None`: they are held in memory, bounded (default).
    pub audit_spool: Option<std::path::PathBuf>,
    /// The window budgets are counted over.
    pub budget_window: Duration,
    /// How often budget spend is written to the ledger.
    pub budget_flush_every: Duration,
    /// How often an account is reloaded from the ledger.
    pub budget_refresh_every: Duration,
    /// The admission round trip's timeout.
    pub admission_timeout: Duration,
    /// Runs in flight at once on this host (`None`: no cap).
    pub max_concurrent_runs: Option<usize>,
    /// The caller id of invocations that name none.
    pub default_caller: String,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            critic_shards: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            default_limits: LimitsSpec::default(),
            audit_batch: 1024,
            audit_max_age: Duration::from_millis(1),
            audit_spool: None,
            budget_window: Duration::from_secs(24 * 3600),
            budget_flush_every: Duration::from_millis(100),
            budget_refresh_every: Duration::from_secs(60),
            admission_timeout: Duration::from_secs(5),
            max_concurrent_runs: None,
            default_caller: "anonymous".into(),
        }
    }
}

/// Why a host could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// A tool could not be registered.
    #[error(transparent)]
    Tool(#[from] RegistryError),
    /// An actor could not start.
    #[error("cannot start the {what} actor: {reason}")]
    Spawn {
        /// Which actor.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The configuration is not usable.
    #[error("invalid host configuration: {0}")]
    Config(String),
}

/// Why a run could not be submitted (a caller error; nothing ran).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The manifest names a tool this host does not have.
    #[error(transparent)]
    Tool(#[from] RegistryError),
    /// The manifest names a model this host does not have.
    #[error("unknown model `{model}` (known: {known})")]
    UnknownModel {
        /// The model asked for.
        model: String,
        /// What the host knows.
        known: String,
    },
}

/// Builds a [`Host`].
pub struct HostBuilder {
    config: HostConfig,
    tools: ToolRegistry,
    extra_tools: Vec<Arc<dyn Tool>>,
    models: HashMap<String, Arc<dyn ChatModel>>,
    audit: Option<Arc<dyn AuditStore>>,
    ledger: Option<Arc<dyn BudgetLedger>>,
    policy: Option<Arc<dyn CriticPolicy>>,
}

impl HostBuilder {
    /// Host settings.
    pub fn config(mut self, config: HostConfig) -> Self {
        self.config = config;
        self
    }

    /// Adds a tool.
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.extra_tools.push(tool);
        self
    }

    /// Starts from this tool registry instead of the built-in tools.
    pub fn tools(mut self, registry: ToolRegistry) -> Self {
        self.tools = registry;
        self
    }

    /// Makes a model available under `name` (manifests say `model: NAME`).
    pub fn model(mut self, name: impl Into<String>, model: Arc<dyn ChatModel>) -> Self {
        self.models.insert(name.into(), model);
        self
    }

    /// Where audit records go (default: in memory).
    pub fn audit_store(mut self, store: Arc<dyn AuditStore>) -> Self {
        self.audit = Some(store);
        self
    }

    /// Where budgets come from (default: in memory, no limits).
    pub fn budget_ledger(mut self, ledger: Arc<dyn BudgetLedger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// How the critic decides (default: [`RulesPolicy`]).
    pub fn critic_policy(mut self, policy: Arc<dyn CriticPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Starts the actors and returns the host.
    pub async fn build(self) -> Result<Host, HostError> {
        let mut tools = self.tools;
        for t in self.extra_tools {
            tools.register(t)?;
        }
        let c = self.config;
        if c.critic_shards == 0 || c.audit_batch == 0 {
            return Err(HostError::Config(
                "critic_shards and audit_batch must be at least 1".into(),
            ));
        }
        let spawn_err = |what: &'static str| {
            move |e: ractor::SpawnErr| HostError::Spawn {
                what,
                reason: e.to_string(),
            }
        };
        let (root, _) = Actor::spawn(None, HostActor, ())
            .await
            .map_err(spawn_err("host"))?;
        let audit_store = self
            .audit
            .unwrap_or_else(|| Arc::new(MemoryAuditStore::new()));
        let ledger = self
            .ledger
            .unwrap_or_else(|| Arc::new(MemoryBudgetLedger::new()));
        let audit_actor = Audit {
            store: audit_store.clone(),
            max_batch: c.audit_batch,
            max_age: c.audit_max_age,
            spool: c.audit_spool.clone(),
        };
        let (audit, _) = Actor::spawn_linked(None, audit_actor, (), root.get_cell())
            .await
            .map_err(spawn_err("audit"))?;
        let budget_actor = Budget {
            ledger: ledger.clone(),
            window: c.budget_window,
            flush_every: c.budget_flush_every,
            refresh_every: c.budget_refresh_every,
        };
        let (budget, _) = Actor::spawn_linked(None, budget_actor, (), root.get_cell())
            .await
            .map_err(spawn_err("budget"))?;
        let policy = self.policy.unwrap_or_else(|| Arc::new(RulesPolicy));
        let mut critics = Vec::with_capacity(c.critic_shards);
        for _ in 0..c.critic_shards {
            let critic = Critic {
                policy: policy.clone(),
                audit: audit.clone(),
            };
            let (r, _) = Actor::spawn_linked(None, critic, (), root.get_cell())
                .await
                .map_err(spawn_err("critic"))?;
            critics.push(r);
        }
        Ok(Host {
            inner: Arc::new(HostInner {
                config: c,
                tools,
                models: self.models,
                root,
                critics,
                audit,
                budget,
                audit_store,
                accounts: DashMap::new(),
                live: Arc::new(LiveRuns::default()),
                closed: AtomicBool::new(false),
                next_shard: AtomicU64::new(0),
            }),
        })
    }
}

/// Counts runs in flight and wakes whoever waits for none.
#[derive(Default)]
pub(crate) struct LiveRuns {
    count: AtomicUsize,
    idle: Notify,
}

impl LiveRuns {
    pub(crate) fn enter(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn leave(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct HostInner {
    config: HostConfig,
    tools: ToolRegistry,
    models: HashMap<String, Arc<dyn ChatModel>>,
    root: ActorRef<HostMsg>,
    critics: Vec<ActorRef<CriticMsg>>,
    audit: ActorRef<AuditMsg>,
    budget: ActorRef<BudgetMsg>,
    audit_store: Arc<dyn AuditStore>,
    accounts: DashMap<Arc<str>, Arc<Account>>,
    live: Arc<LiveRuns>,
    closed: AtomicBool,
    next_shard: AtomicU64,
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
        HostBuilder {
            config: HostConfig::default(),
            tools: ToolRegistry::with_builtins(),
            extra_tools: Vec::new(),
            models: HashMap::new(),
            audit: None,
            ledger: None,
            policy: None,
        }
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

    /// Prepares an agent: resolves its model, selects its tools, resolves its limits.
    pub fn agent(&self, spec: impl Into<Arc<AgentSpec>>) -> Result<Agent, SubmitError> {
        let spec: Arc<AgentSpec> = spec.into();
        let tools = self.inner.tools.select(&spec.tools)?;
        let model: Arc<dyn ChatModel> = match self.inner.models.get(&spec.model) {
            Some(m) => m.clone(),
            None if spec.model == "scripted" => Arc::new(ScriptedModel::new(spec.script.clone())),
            None => {
                let mut known: Vec<&str> = self.inner.models.keys().map(String::as_str).collect();
                known.push("scripted");
                known.sort_unstable();
                return Err(SubmitError::UnknownModel {
                    model: spec.model.clone(),
                    known: known.join(", "),
                });
            }
        };
        let limits = spec.limits.resolve(&self.inner.config.default_limits);
        Ok(Agent::new(spec, model, tools, limits))
    }

    /// Submits a run. The handle resolves to its result.
    pub async fn submit(
        &self,
        agent: impl Into<AgentSource>,
        invocation: Invocation,
    ) -> Result<RunHandle, SubmitError> {
        let agent = self.resolve(agent.into())?;
        // Boxed: the spawn future is large and would otherwise sit in every
        // caller's future for as long as it awaits the run.
        Ok(Box::pin(self.start(agent, invocation, false)).await.0)
    }

    /// Submits a run and subscribes to its events.
    pub async fn submit_streaming(
        &self,
        agent: impl Into<AgentSource>,
        invocation: Invocation,
    ) -> Result<(RunHandle, RunEvents), SubmitError> {
        let agent = self.resolve(agent.into())?;
        let (handle, events) = Box::pin(self.start(agent, invocation, true)).await;
        Ok((handle, events.unwrap_or_else(RunEvents::closed)))
    }

    /// Submits a run and waits for its result.
    pub async fn run(
        &self,
        agent: impl Into<AgentSource>,
        invocation: Invocation,
    ) -> Result<crate::RunResult, SubmitError> {
        Ok(self.submit(agent, invocation).await?.await)
    }

    fn resolve(&self, source: AgentSource) -> Result<Agent, SubmitError> {
        match source {
            AgentSource::Agent(a) => Ok(a),
            AgentSource::Spec(s) => self.agent(s),
        }
    }

    async fn start(
        &self,
        agent: Agent,
        inv: Invocation,
        with_events: bool,
    ) -> (RunHandle, Option<RunEvents>) {
        let h = &self.inner;
        let run_id = inv.run_id.unwrap_or_default();
        let limits = if inv.limits == LimitsSpec::default() {
            *agent.limits()
        } else {
            inv.limits
                .resolve(&agent.spec().limits.over(&h.config.default_limits))
        };
        let caller: Arc<str> =
            Arc::from(inv.caller_id.as_deref().unwrap_or(&h.config.default_caller));
        let (shared, result_rx, events) = RunShared::new(
            run_id,
            agent.name_arc(),
            Some(caller.clone()),
            inv.parent_run_id,
            limits.max_iterations,
            with_events,
            h.live.clone(),
        );
        let shard = (h.next_shard.fetch_add(1, Ordering::Relaxed) as usize) % h.critics.len();
        let critic = h.critics[shard].clone();
        let mut handle = RunHandle {
            run_id,
            shared: Some(shared.clone()),
            result_rx,
            run: None,
            critic: Some(critic.clone()),
            done: false,
            detached: false,
        };

        // Admission: host cap, then the caller's account.
        if h.closed.load(Ordering::Acquire) {
            shared.finish(
                Ending::failed(
                    RunStatus::Rejected,
                    "shutting_down",
                    "the host is shutting down",
                ),
                &h.audit,
            );
            return (handle, events);
        }
        if let Some(cap) = h.config.max_concurrent_runs {
            // `live` already counts this run.
            if h.live.count() > cap {
                shared.finish(
                    Ending::failed(
                        RunStatus::Rejected,
                        "concurrency",
                        format!("the host runs {cap} runs at most"),
                    ),
                    &h.audit,
                );
                return (handle, events);
            }
        }
        let ticket = match self.admit(&caller).await {
            Ok(t) => t,
            Err(ending) => {
                shared.finish(ending, &h.audit);
                return (handle, events);
            }
        };

        let prompt = if !inv.prompt.is_empty() {
            inv.prompt
        } else if let Some(p) = &agent.spec().prompt {
            p.clone()
        } else if !inv.inputs.is_empty() {
            serde_json::to_string(&inv.inputs).unwrap_or_default()
        } else {
            String::new()
        };
        let info = RunInfo {
            agent: agent.name().to_string(),
            model: agent.model().name().to_string(),
            caller_id: Some(caller.to_string()),
            channel_id: inv.channel_id,
            parent_run_id: inv.parent_run_id,
            session_id: inv.session_id,
            prompt: cap_text(&prompt, 2048),
            tools: agent.tool_names(),
            limits: Some(limits.to_spec()),
        };
        let args = RunArgs {
            shared: shared.clone(),
            agent,
            limits,
            prompt,
            info: Some(info),
            critic: critic.clone(),
            audit: h.audit.clone(),
            budget: h.budget.clone(),
            ticket: Some(ticket),
        };
        match Actor::spawn_linked(None, RunActor, args, critic.get_cell()).await {
            Ok((run, _)) => handle.run = Some(run),
            Err(e) => {
                shared.finish(
                    Ending::failed(RunStatus::Error, "spawn_failed", e.to_string()),
                    &h.audit,
                );
            }
        }
        (handle, events)
    }

    /// Finds (or loads) the caller's account and takes a ticket from it.
    async fn admit(&self, caller: &Arc<str>) -> Result<Ticket, Ending> {
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
        account.admit().map_err(|d| match d {
            Denied::Tokens => Ending::failed(
                RunStatus::BudgetExceeded,
                "budget",
                format!("caller `{caller}` has spent its token budget"),
            ),
            Denied::Concurrency => Ending::failed(
                RunStatus::Rejected,
                "caller_concurrency",
                format!("caller `{caller}` has as many runs in flight as it may"),
            ),
        })
    }

    /// Forgets cached accounts so the next run of each caller reloads its
    /// limits from the ledger (after changing limits there).
    pub fn reload_budgets(&self) {
        self.inner.accounts.clear();
    }

    /// Waits until no run is in flight.
    pub async fn wait_idle(&self) {
        self.inner.live.wait_idle().await;
    }

    /// Stops accepting runs, cancels what still runs, waits for every
    /// terminal record, drains the audit and budget actors, stops the actors.
    pub async fn shutdown(&self) -> AuditStats {
        let h = &self.inner;
        h.closed.store(true, Ordering::Release);
        for c in &h.critics {
            let _ = c.cast(CriticMsg::CancelAll);
        }
        self.wait_idle().await;
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
        for c in &h.critics {
            let _ = c
                .stop_children_and_wait(None, Some(Duration::from_secs(5)))
                .await;
        }
        let _ = h
            .root
            .stop_children_and_wait(None, Some(Duration::from_secs(10)))
            .await;
        h.root.stop(None);
        stats
    }
}
