//! [`HostBuilder`]: a host made from its ports, and why building one can
//! fail ([`HostError`]). `build` starts the actors: the root, the audit and
//! budget actors, and the critic shards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use ractor::Actor;

use super::config::HostConfig;
use super::{Host, HostInner};
use crate::actors::audit::checkpoints::{lease_owner, LeaseWatch};
use crate::actors::audit::{Audit, AuditHealth};
use crate::actors::budget::Budget;
use crate::actors::host::{HostActor, ShardSet};
use crate::dispatch::{RegistryError, ToolRegistry};
use crate::policy::RulesPolicy;
use crate::ports::audit::AuditStore;
use crate::ports::budget::BudgetLedger;
use crate::ports::checkpoint::{Checkpointer, Lease};
use crate::ports::critic::CriticPolicy;
use crate::ports::model::ChatModel;
use crate::ports::run::unix_ms;
use crate::ports::tool::Tool;
use crate::providers::{ModelResolver, ProviderConfig};
use crate::record::HostRuns;
use crate::stores::{MemoryAuditStore, MemoryBudgetLedger, MemoryCheckpointer};

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
    publisher: Option<Arc<dyn crate::ports::outbox::Publisher>>,
    publish_scan_every: Option<Duration>,
}

impl HostBuilder {
    /// The built-in tools, in-memory stores and the rules policy.
    pub(super) fn new() -> Self {
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
            publisher: None,
            publish_scan_every: Some(Duration::from_secs(60)),
        }
    }

    /// How publish intents are delivered (default:
    /// [`Destinations::from_env`](crate::publishers::Destinations::from_env):
    /// the built-in destinations, secrets from the environment).
    pub fn publisher(mut self, publisher: Arc<dyn crate::ports::outbox::Publisher>) -> Self {
        self.publisher = Some(publisher);
        self
    }

    /// How often the publisher looks for intents still owed besides at
    /// the host's start (default: every minute; `None`: at start only).
    pub fn publish_scan_every(mut self, every: Option<Duration>) -> Self {
        self.publish_scan_every = every;
        self
    }

    /// Host settings.
    pub fn config(mut self, config: HostConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets [`HostConfig::allowance_tokens`]: tokens every run of the host
    /// may spend together (apply after [`config`](Self::config), which
    /// replaces every setting).
    pub fn allowance_tokens(mut self, tokens: Option<u64>) -> Self {
        self.config.allowance_tokens = tokens;
        self
    }

    /// Adds a tool (one named like a built-in, such as `wait`, replaces
    /// the built-in).
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.extra_tools.push(tool);
        self
    }

    /// Offers the [test tools](crate::tools::builtin::test_tools) too
    /// (`fail` and `panic`, which fail on purpose): for tests of the paths
    /// a failing tool takes. Apply after [`tools`](Self::tools), which
    /// replaces the registry.
    pub fn test_tools(mut self) -> Self {
        self.tools = std::mem::take(&mut self.tools).with_test_tools();
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
            // A host's own tool replaces a built-in of its name.
            tools.register_own(t)?;
        }
        let mut c = self.config;
        if c.critic_shards == 0 || c.audit_batch == 0 {
            return Err(HostError::Config(
                "critic_shards and audit_batch must be at least 1".into(),
            ));
        }
        // One process a spool file: this host's, or a free sibling of it
        // when another live process holds it (the config then names the
        // file this host writes). A spool that cannot be opened now is
        // left as configured: the writer finds it unwritable when it needs
        // it and holds records in memory, as it always did.
        let mut spool_claim = None;
        if let Some(path) = c.audit_spool.clone() {
            let claimed =
                tokio::task::spawn_blocking(move || crate::actors::audit::spool::claim(&path))
                    .await;
            match claimed {
                Ok(Ok(claim)) => {
                    c.audit_spool = Some(claim.path.clone());
                    spool_claim = Some(Arc::new(claim));
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot lock the audit spool; using it unlocked")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot lock the audit spool; using it unlocked")
                }
            }
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
        // Exactly-once recovery: this host's lease on its durable runs, and
        // its host lease, taken now (one write per host, none per run):
        // from here on a `recover` elsewhere leaves this host's runs alone.
        let lease = Lease {
            owner: lease_owner(),
            ttl: c.lease_ttl,
        };
        let lease_watch = Arc::new(LeaseWatch::default());
        let taken = unix_ms();
        match tokio::time::timeout(c.admission_timeout, checkpointer.renew(&lease)).await {
            Ok(Ok(_)) => lease_watch.renewed(taken, lease.ttl),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot take this host's lease yet; retrying")
            }
            Err(_) => tracing::warn!("taking this host's lease timed out; retrying"),
        }
        let audit_actor = Audit {
            store: audit_store.clone(),
            max_batch: c.audit_batch,
            max_age: c.audit_max_age,
            spool: c.audit_spool.clone(),
            spool_claim,
            checkpointer: checkpointer.clone(),
            health: audit_health.clone(),
            lease: lease.clone(),
            lease_watch,
            live: live.clone(),
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
        let allowance = c
            .allowance_tokens
            .map(|limit| -> crate::record::Allowances {
                Arc::new([crate::record::Allowance::new("this host's runs", limit, 0)])
            });
        // The outbox is the audit store's (its intents are written with
        // their runs' terminal records); a store without one: no publisher.
        let outbox = audit_store.clone().outbox();
        let publisher = match &outbox {
            Some(outbox) => {
                let actor = crate::actors::publisher::PublisherActor {
                    outbox: outbox.clone(),
                    publisher: self
                        .publisher
                        .unwrap_or_else(|| Arc::new(crate::publishers::Destinations::from_env())),
                    owner: Arc::from(lease.owner.as_str()),
                    scan_every: self.publish_scan_every,
                };
                let (publisher, _) = Actor::spawn_linked(None, actor, (), root.get_cell())
                    .await
                    .map_err(spawn_err("publisher"))?;
                Some(publisher)
            }
            None => None,
        };
        let pruning =
            super::retention::Pruning::start(audit_store.clone(), c.retention, c.retention_every);
        Ok(Host {
            inner: Arc::new(HostInner {
                pruning,
                #[cfg(feature = "mcp")]
                mcp: crate::actors::mcp::hub::McpHub::new(c.mcp.clone(), Some(root.get_cell())),
                config: c,
                tools,
                models: self.models,
                resolver: ModelResolver::new(self.providers),
                root,
                shards,
                audit,
                budget,
                audit_store,
                outbox,
                publisher,
                audit_health,
                host_id: Arc::from(lease.owner.as_str()),
                lease,
                checkpointer,
                booted: AtomicBool::new(false),
                accounts: DashMap::new(),
                live,
                closed: AtomicBool::new(false),
                next_key: AtomicU64::new(0),
                default_caller,
                allowance,
                sessions: crate::host::sessions::SessionTable::new(
                    self.sessions
                        .unwrap_or_else(|| Arc::new(crate::stores::MemorySessionStore::new())),
                ),
            }),
        })
    }
}
