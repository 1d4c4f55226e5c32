//! [`HostConfig`]: the host-wide settings, each with its default.

use std::time::Duration;

use crate::spec::LimitsSpec;

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
    /// Tokens every run of this host may spend together, counted from
    /// zero when the host starts (`--budget-tokens` of one command): an
    /// allowance on top of each caller's limits and each run's own budget
    /// (the tightest wins). `None`: no such allowance (default).
    pub allowance_tokens: Option<u64>,
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
    /// How long [`Host::shutdown`](crate::Host::shutdown) waits for cancelled runs to finalize
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
    /// Which finished runs the audit store keeps (`--retain`): the oldest
    /// beyond it are pruned in the background, a small batch at a time.
    /// Default: all are kept.
    pub retention: crate::ports::retention::Retention,
    /// How often the background pruning looks at the store.
    pub retention_every: Duration,
    /// How much of each run the audit log keeps, for manifests that do not
    /// say (`audit:`). Default: `full`.
    pub audit: crate::ports::audit::AuditDetail,
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
            allowance_tokens: None,
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
            retention: crate::ports::retention::Retention::default(),
            retention_every: Duration::from_secs(5),
            audit: crate::ports::audit::AuditDetail::Full,
        }
    }
}
