//! The `BudgetLedger` port: per-caller limits and what each caller spent over
//! a window. The budget actor owns the live accounts; the ledger is where
//! limits come from (and are set: `agentvisor budget set`) and where
//! committed spend goes.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A caller's limits. `None` means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLimits {
    /// Input + output tokens per window.
    pub tokens: Option<u64>,
    /// Cost in micro-dollars per window.
    pub cost_micros: Option<u64>,
    /// Run time in seconds per window.
    pub runtime_secs: Option<u64>,
    /// Runs in flight at once.
    pub concurrent_runs: Option<u32>,
    /// The window spend is counted over, in seconds (`None`: the host's,
    /// `HostConfig::budget_window`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_secs: Option<u64>,
}

/// What a caller spent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    /// Input + output tokens.
    pub tokens: u64,
    /// Micro-dollars.
    pub cost_micros: u64,
    /// Milliseconds of run time.
    pub runtime_ms: u64,
    /// Runs committed.
    pub runs: u64,
}

impl Spend {
    /// Adds another spend into this one (saturating).
    pub fn add(&mut self, other: &Spend) {
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.cost_micros = self.cost_micros.saturating_add(other.cost_micros);
        self.runtime_ms = self.runtime_ms.saturating_add(other.runtime_ms);
        self.runs = self.runs.saturating_add(other.runs);
    }
}

/// A ledger failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetLedgerError {
    /// The ledger could not be read or written.
    #[error("budget ledger unavailable: {0}")]
    Unavailable(String),
}

/// Per-caller limits and committed spend. Object-safe; `Arc<dyn BudgetLedger>`.
#[async_trait]
pub trait BudgetLedger: Send + Sync + 'static {
    /// The caller's limits (the default limits when none were set for it).
    async fn limits(&self, caller: &str) -> Result<BudgetLimits, BudgetLedgerError>;

    /// What the caller spent within the last `window`.
    async fn spent(&self, caller: &str, window: Duration) -> Result<Spend, BudgetLedgerError>;

    /// Adds committed spend (a batch of callers at once).
    async fn commit(&self, spends: &[(String, Spend)]) -> Result<(), BudgetLedgerError>;

    /// Sets one caller's limits (they hold for every host on this ledger;
    /// a host picks them up at its next account refresh).
    async fn set_limits(&self, caller: &str, limits: BudgetLimits)
        -> Result<(), BudgetLedgerError>;

    /// The callers that have limits of their own, with them, by caller.
    async fn list_limits(&self) -> Result<Vec<(String, BudgetLimits)>, BudgetLedgerError>;
}
