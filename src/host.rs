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
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};

use crate::actors::audit::checkpoints::{lease_owner, owner_is_gone};
use crate::actors::audit::spool::SpoolIndex;
use crate::actors::audit::{send_finished, Audit, AuditHealth, AuditMsg};
use crate::actors::budget::{Account, Budget, BudgetMsg, Denied, Ticket};
use crate::actors::critic::{CriticMsg, Fault};
use crate::actors::host::{HostActor, HostMsg, ShardSet};
use crate::actors::run::{DurableRun, RunArgs};
use crate::agent::Agent;
use crate::handle::{RunEvents, RunHandle, RunRef};
use crate::policy::RulesPolicy;
use crate::ports::audit::{AuditEntry, AuditRecord, AuditStats, AuditStore, RunInfo};
use crate::ports::budget::BudgetLedger;
use crate::ports::checkpoint::{Checkpoint, Checkpointer, Claim, Lease};
use crate::ports::critic::CriticPolicy;
use crate::ports::model::{ChatModel, Message, Role};
use crate::ports::run::{cap_text, unix_ms, RunId, RunResult, RunStatus};
use crate::ports::tool::Tool;
use crate::providers::{ModelResolver, ProviderConfig, ResolveError};
use crate::record::{self, Delivery, Ending, HostRuns, RunIdentity, RunShared, SUBSCRIBER_BUFFER};
use crate::spec::{AgentSpec, Invocation, LimitsSpec};
use crate::stores::{MemoryAuditStore, MemoryBudgetLedger, MemoryCheckpointer};
use crate::tools::{RegistryError, ToolRegistry};

pub mod palette;

/// Host-wide settings. Every field has a default.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Critic shards (default: the number of CPUs).
    pub critic_shards: usize,
    /// Limits for keys neither the invocation nor the manifest sets.
    pub default_limits: LimitsSpec,
    /// Audit records per store write, at most.
    pub audit_batch: usize,
    /// How long a record may wait in the audit buffer while the audit
    /// writer is busy (an idle writer takes the buffer at once).
    pub audit_max_age: Duration,
    /// Where audit batches go while the audit store fails (an append-only
    /// file of JSON lines, replayed into the store once it works again).
    /// `None`: they are held in memory, bounded (default).
    pub audit_spool: Option<std::path::PathBuf>,
    /// The window budgets are counted over.
    pub budget_window: Duration,
    /// How often budget spend is written to the ledger.
    pub budget_flush_every: Duration,
    /// How often an account is reloaded from the ledger (its limits, and
    /// its spend as the window moves).
    pub budget_refresh_every: Duration,
    /// Tokens reserved for a run's first model call at admission, against
    /// its caller's token limit (later calls reserve what the run's
    /// previous call used): see `actors::budget`.
    pub budget_reserve_tokens: u64,
    /// The admission round trip's timeout.
    pub admission_timeout: Duration,
    /// Runs in flight at once on this host (`None`: no cap).
    pub max_concurrent_runs: Option<usize>,
    /// The caller id of invocations that name none.
    pub default_caller: String,
    /// Every run is durable (checkpointed after every step), whatever its
    /// manifest says (default: only manifests with `durable: true`).
    pub durable_default: bool,
    /// How deep sub-agents nest at most (a top-level run is depth 0).
    pub max_depth: u32,
    /// Child runs one run has in flight at once, at most.
    pub max_children: u32,
    /// Child runs (at any depth) one top-level run starts, at most.
    pub max_descendants: u32,
    /// How long [`Host::shutdown`] waits for cancelled runs to finalize
    /// through their shards; after it, what is left ends `cancelled` at
    /// once (durable runs keep their checkpoint).
    pub shutdown_timeout: Duration,
    /// How MCP servers are started, restarted and stopped.
    pub mcp: crate::mcp::McpConfig,
    /// How long this host's lease on a durable run holds without renewal
    /// (renewed every third of it while the host lives): a host that dies
    /// leaves its runs to `recover` elsewhere after this long (at once on
    /// the same machine, where a dead process is known to be dead).
    pub lease_ttl: Duration,
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
            budget_reserve_tokens: 1000,
            admission_timeout: Duration::from_secs(5),
            max_concurrent_runs: None,
            default_caller: "anonymous".into(),
            durable_default: false,
            shutdown_timeout: Duration::from_secs(30),
            max_depth: 3,
            max_children: 8,
            max_descendants: 64,
            mcp: crate::mcp::McpConfig::default(),
            lease_ttl: Duration::from_secs(30),
        }
    }
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
    /// Runs that were not durable, ended `error`/`interrupted`.
    pub interrupted: Vec<RunId>,
    /// Durable runs another live host holds (its lease is live): left to it.
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

/// A ticket from `account` (reserving `estimate` tokens for the first
/// call), or why the caller may not run now.
fn take_ticket(caller: &str, account: &Arc<Account>, estimate: u64) -> Result<Ticket, Ending> {
    account.admit(estimate).map_err(|d| match d {
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
    })
}

/// A run started, or the rest of its admission to wait for.
enum Started<'a> {
    /// Started (or refused) at once.
    Now((RunHandle, Option<RunEvents>)),
    /// Admission waits (a durable run's first checkpoint, a caller's first
    /// admission).
    Later(Pin<Box<dyn Future<Output = (RunHandle, Option<RunEvents>)> + Send + 'a>>),
}

impl Started<'_> {
    async fn await_started(self) -> (RunHandle, Option<RunEvents>) {
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

/// Checks an invocation's attachments (size cap, image type and content)
/// before anything runs.
fn check_attachments(inv: &Invocation) -> Result<(), SubmitError> {
    for a in &inv.attachments {
        a.check()?;
    }
    Ok(())
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
    /// The manifest names no model and nothing configures the default
    /// tier (the message says how to set one).
    #[error("{0}")]
    NoModel(String),
    /// An attachment is too large or not usable.
    #[error(transparent)]
    Attachment(#[from] crate::ports::model::AttachmentError),
}

/// Builds a [`Host`].
pub struct HostBuilder {
    config: HostConfig,
    tools: ToolRegistry,
    extra_tools: Vec<Arc<dyn Tool>>,
    models: HashMap<String, Arc<dyn ChatModel>>,
    providers: ProviderConfig,
    audit: Option<Arc<dyn AuditStore>>,
    ledger: Option<Arc<dyn BudgetLedger>>,
    policy: Option<Arc<dyn CriticPolicy>>,
    checkpointer: Option<Arc<dyn Checkpointer>>,
    sessions: Option<Arc<dyn crate::ports::session::SessionStore>>,
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

    /// Maps a model tier (`fast`, `smart`, …) to a model spec
    /// (`openai:gpt-4o-mini`, `ollama:llama3.2`) or a registered name.
    pub fn tier(mut self, tier: impl Into<String>, spec: impl Into<String>) -> Self {
        self.providers.tiers.insert(tier.into(), spec.into());
        self
    }

    /// How models are resolved and wrapped: tiers, retries, circuit
    /// breakers (default: [`ProviderConfig::default`]).
    pub fn providers(mut self, providers: ProviderConfig) -> Self {
        self.providers = providers;
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

    /// Where durable runs' checkpoints go (default: in memory, which
    /// resumes runs within one process only).
    pub fn checkpointer(mut self, checkpointer: Arc<dyn Checkpointer>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// Where chat sessions are kept (default: in memory; see
    /// [`crate::session`]).
    pub fn session_store(mut self, store: Arc<dyn crate::ports::session::SessionStore>) -> Self {
        self.sessions = Some(store);
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
        let audit_store = self
            .audit
            .unwrap_or_else(|| Arc::new(MemoryAuditStore::new()));
        let ledger = self
            .ledger
            .unwrap_or_else(|| Arc::new(MemoryBudgetLedger::new()));
        let checkpointer = self
            .checkpointer
            .unwrap_or_else(|| Arc::new(MemoryCheckpointer::new()));
        let policy = self.policy.unwrap_or_else(|| Arc::new(RulesPolicy));
        let live = Arc::new(HostRuns::new(audit_store.clone()));
        let shards = Arc::new(ShardSet::new(live.clone(), policy));
        let root_actor = HostActor {
            shards: shards.clone(),
        };
        let (root, _) = Actor::spawn(None, root_actor, ())
            .await
            .map_err(spawn_err("host"))?;
        // Durability: the audit actor reports whether records can be
        // written; admission reads it (see `open`).
        let audit_health = Arc::new(AuditHealth::default());
        // Exactly-once recovery: this host's lease on its durable runs.
        let lease = Lease {
            owner: lease_owner(),
            ttl: c.lease_ttl,
        };
        let audit_actor = Audit {
            store: audit_store.clone(),
            max_batch: c.audit_batch,
            max_age: c.audit_max_age,
            spool: c.audit_spool.clone(),
            checkpointer: checkpointer.clone(),
            health: audit_health.clone(),
            lease: lease.clone(),
        };
        let (audit, _) = Actor::spawn_linked(None, audit_actor, (), root.get_cell())
            .await
            .map_err(spawn_err("audit"))?;
        let _ = shards.audit.set(audit.clone());
        let budget_actor = Budget {
            ledger: ledger.clone(),
            window: c.budget_window,
            flush_every: c.budget_flush_every,
            refresh_every: c.budget_refresh_every,
        };
        let (budget, _) = Actor::spawn_linked(None, budget_actor, (), root.get_cell())
            .await
            .map_err(spawn_err("budget"))?;
        for i in 0..c.critic_shards {
            shards
                .spawn(&root.get_cell(), i)
                .await
                .map_err(spawn_err("critic"))?;
        }
        let default_caller = Arc::from(c.default_caller.as_str());
        Ok(Host {
            inner: Arc::new(HostInner {
                #[cfg(feature = "mcp")]
                mcp: crate::mcp::hub::McpHub::new(c.mcp.clone()),
                config: c,
                tools,
                models: self.models,
                resolver: ModelResolver::new(self.providers),
                root,
                shards,
                audit,
                budget,
                audit_store,
                audit_health,
                lease,
                checkpointer,
                booted: AtomicBool::new(false),
                accounts: DashMap::new(),
                live,
                closed: AtomicBool::new(false),
                next_key: AtomicU64::new(0),
                default_caller,
                sessions: crate::session::SessionTable::new(
                    self.sessions
                        .unwrap_or_else(|| Arc::new(crate::stores::MemorySessionStore::new())),
                ),
            }),
        })
    }
}

pub(crate) struct HostInner {
    /// The host's MCP servers (shared by every run that uses them).
    #[cfg(feature = "mcp")]
    mcp: crate::mcp::hub::McpHub,
    config: HostConfig,
    tools: ToolRegistry,
    models: HashMap<String, Arc<dyn ChatModel>>,
    resolver: ModelResolver,
    root: ActorRef<HostMsg>,
    shards: Arc<ShardSet>,
    audit: ActorRef<AuditMsg>,
    budget: ActorRef<BudgetMsg>,
    audit_store: Arc<dyn AuditStore>,
    /// Durability: whether the audit actor can write records (admission).
    audit_health: Arc<AuditHealth>,
    /// Exactly-once recovery: this host's lease on its durable runs.
    lease: Lease,
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
    /// The chat sessions open on this host, and their store.
    sessions: crate::session::SessionTable,
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
            providers: ProviderConfig::default(),
            audit: None,
            ledger: None,
            policy: None,
            checkpointer: None,
            sessions: None,
        }
    }

    /// The chat sessions open on this host (see [`crate::session`]).
    pub(crate) fn session_table(&self) -> &crate::session::SessionTable {
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

    /// Prepares an agent: resolves its model, selects its tools, resolves its limits.
    ///
    /// A manifest's sub-agents (`agents:`) become tools `agent__NAME`, each
    /// prepared here too, with the tools of its own manifest that this one
    /// may use (see [`palette`]). A manifest that names MCP servers needs
    /// them started: prepare it with [`prepare`](Self::prepare) (or submit
    /// the manifest).
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

    /// [`agent`](Self::agent), with the tools of its MCP servers.
    fn agent_with(
        &self,
        spec: Arc<AgentSpec>,
        mcp_tools: &[crate::tools::CompiledTool],
    ) -> Result<Agent, SubmitError> {
        let tools = self.inner.tools.select_with(&spec.tools, mcp_tools)?;
        let model = self.model_for(&spec)?;
        let limits = spec.limits.resolve(&self.inner.config.default_limits);
        let mut palette: Vec<Arc<dyn Tool>> = Vec::with_capacity(spec.sub_agents.len());
        for sub in &spec.sub_agents {
            // A child may use only tools its parent may use (D3).
            let mut child = AgentSpec::clone(&sub.spec);
            child.tools.retain(|t| spec.tools.contains(t));
            let child = self.agent(child)?;
            palette.push(Arc::new(palette::PaletteTool::new(
                sub,
                child,
                Arc::downgrade(&self.inner),
            )));
        }
        let tools = tools.with_tools(palette)?;
        Ok(Agent::new(spec, model, tools, limits))
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
        let found: Result<Vec<crate::tools::CompiledTool>, _> = {
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
            if let ResolveError::NoModel { .. } = e {
                return SubmitError::NoModel(e.to_string());
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
        check_attachments(&invocation)?;
        let agent = self.resolve_async(agent.into()).await?;
        agent.spec().check_inputs(&invocation.inputs)?;
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
        check_attachments(&invocation)?;
        let agent = self.resolve_async(agent.into()).await?;
        agent.spec().check_inputs(&invocation.inputs)?;
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

    /// The agent of a submission: a manifest with MCP servers is prepared
    /// with them ([`prepare`](Self::prepare)); the rest at once.
    async fn resolve_async(&self, source: AgentSource) -> Result<Agent, SubmitError> {
        match source {
            AgentSource::Agent(a) => Ok(a),
            AgentSource::Spec(s) if s.mcp.is_some() => self.prepare(s).await,
            AgentSource::Spec(s) => self.agent(s),
        }
    }

    /// Admits and starts a run: a new one, or (`resumed`) a durable run
    /// from its checkpoint. Synchronous unless admission must wait — for a
    /// durable run's first checkpoint or a caller's first admission — and
    /// then the rest is a boxed future, which only those runs pay for: a
    /// caller's future holds no admission state while it awaits its run.
    fn start(
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
            if let Some(admitted) = self.admit_cached(&run.caller) {
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
        match self.admit(&run.caller).await {
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
        let limits = if inv.limits == LimitsSpec::default() {
            *agent.limits()
        } else {
            inv.limits
                .resolve(&agent.spec().limits.over(&h.config.default_limits))
        };
        // A child run: in its parent's tree, spending its parent's caller.
        let parent = inv.parent_run_id.and_then(|p| h.live.get(&p));
        if let (Some(p), None) = (&parent, &inv.caller_id) {
            inv.caller_id = p.caller_id.as_deref().map(str::to_string);
        }
        let caller = self.caller_arc(inv.caller_id.as_deref());
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
                depth: parent.as_ref().map_or(0, |p| p.depth + 1),
                max_iterations: limits.max_iterations,
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
                .any(|s| s.scope == crate::mcp::spec::McpScope::Run)
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
                "store_unavailable",
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
            let d = Arc::new(DurableRun {
                spec: agent.spec_arc(),
                invocation: Invocation {
                    run_id: Some(run_id),
                    caller_id: Some(caller.to_string()),
                    prompt: prompt.to_string(),
                    ..inv.clone()
                },
                resumes: resumed.as_ref().map_or(0, |c| c.resumes),
                started_at: resumed.as_ref().map_or_else(unix_ms, |c| c.started_at),
            });
            first_checkpoint = Some(Box::new(match &resumed {
                Some(c) => Checkpoint::clone(c),
                None => Checkpoint {
                    run_id,
                    spec: d.spec.clone(),
                    invocation: d.invocation.clone(),
                    transcript: transcript.clone(),
                    iteration: 0,
                    steps: Vec::new(),
                    usage: Default::default(),
                    critic: Vec::new(),
                    resumes: 0,
                    started_at: d.started_at,
                    saved_at: unix_ms(),
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
            limits: Some(limits.to_spec()),
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
            }),
            shard,
            caller,
            handle,
            events,
            first_checkpoint,
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

    /// The caller id as shared text: the host's default caller's is made
    /// once, not per run.
    fn caller_arc(&self, caller: Option<&str>) -> Arc<str> {
        match caller {
            Some(c) => Arc::from(c),
            None => self.inner.default_caller.clone(),
        }
    }

    /// Resumes the durable runs an earlier process left unfinished, each
    /// from its last checkpoint and with no new input, and ends the rest:
    ///
    /// - a checkpointed run whose terminal record is on file (the process
    ///   ended between the record and the clearing) is only cleared;
    /// - a run resumed [`MAX_RESUMES`] times already ends `error`/`crash_loop`;
    /// - a run whose manifest no longer prepares on this host (an unknown
    ///   model or tool) ends `error`/`unrecoverable`;
    /// - a run on record with neither a terminal record nor a checkpoint (it
    ///   was not durable) ends `error`/`interrupted`.
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
            if c.resumes >= MAX_RESUMES {
                let error = format!(
                    "resumed {} times and interrupted again; not resumed",
                    c.resumes
                );
                self.end_unresumed(&c, next_seq, "crash_loop", error);
                out.crash_loops.push(c.run_id);
                continue;
            }
            let agent = match self.prepare(c.spec.clone()).await {
                Ok(a) => a,
                Err(e) => {
                    let error = format!("its manifest does not prepare on this host: {e}");
                    self.end_unresumed(&c, next_seq, "unrecoverable", error);
                    out.unrecoverable.push(c.run_id);
                    continue;
                }
            };
            c.resumes += 1;
            c.saved_at = unix_ms();
            let inv = c.invocation.clone();
            let (handle, _) = self
                .start(agent, inv, false, Some((Box::new(c), next_seq)))
                .await_started()
                .await;
            out.resumed.push(handle);
        }
        if !cleared.is_empty() {
            h.checkpointer.clear(&cleared).await?;
        }
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
            let iterations = records
                .iter()
                .filter(|r| {
                    matches!(
                        r.entry,
                        AuditEntry::Event(crate::ports::run::RunEvent::StepStart { .. })
                    )
                })
                .count() as u32;
            let now = unix_ms();
            let result = RunResult {
                run_id,
                agent: info.agent.to_string(),
                caller_id: info.caller_id.as_deref().map(str::to_string),
                parent_run_id: info.parent_run_id,
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
    /// (built from the checkpoint) is written and its checkpoint cleared.
    fn end_unresumed(&self, c: &Checkpoint, seq: u32, kind: &str, error: String) {
        let now = unix_ms();
        let result = Arc::new(RunResult {
            run_id: c.run_id,
            agent: c.spec.name.clone(),
            caller_id: c.invocation.caller_id.clone(),
            parent_run_id: c.invocation.parent_run_id,
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

    /// Saves a checkpoint with the audit actor's next batch and waits until
    /// it is written (at most the admission timeout).
    async fn save_checkpoint(&self, checkpoint: Box<Checkpoint>) -> Result<(), String> {
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
    fn admit_cached(&self, caller: &Arc<str>) -> Option<Result<Ticket, Ending>> {
        let account = self.inner.accounts.get(caller).map(|a| a.clone())?;
        Some(take_ticket(
            caller,
            &account,
            self.inner.config.budget_reserve_tokens,
        ))
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
        take_ticket(caller, &account, h.config.budget_reserve_tokens)
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
}
