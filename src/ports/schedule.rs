//! The `ScheduleStore` port: what the scheduler remembers of each schedule
//! across restarts — the hash of its effective configuration, its next
//! fire, its last fire and outcome, its failure streak (one reason at a
//! time), whether it is paused and why, and what it spent today.
//!
//! The scheduler owns the rows: it writes a schedule's state after every
//! change, in order, through one writer (`put_all` gets batches), and
//! reads them all once when it starts. A battery keeps whatever it is
//! given; it checks nothing.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// Why a schedule is paused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// In words ("3 consecutive failures: error:provider_server",
    /// "paused by admin").
    pub why: String,
    /// When (Unix ms).
    pub at_ms: u64,
    /// Whether the scheduler paused it (`pause_after`), rather than an
    /// operator: a change of the schedule lifts an automatic pause only.
    pub auto: bool,
}

/// What the store keeps of one schedule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleState {
    /// The schedule's name (the key).
    pub name: String,
    /// A hash of its effective configuration: a different one means the
    /// schedule changed (its streak and an automatic pause are reset).
    pub config_hash: String,
    /// When it fires next (Unix ms); `None` when its cron never fires.
    pub next_fire_ms: Option<u64>,
    /// When it last fired (Unix ms).
    pub last_fire_ms: Option<u64>,
    /// How its last fire ended: `succeeded`, `partial_failure`, `failed`,
    /// `cancelled`, `over_budget` (stopped by its daily budget) or
    /// `skipped`.
    pub last_outcome: Option<String>,
    /// Why (a failure's reason, a skip's reason).
    pub last_reason: Option<String>,
    /// The run of its last fire.
    pub last_run_id: Option<String>,
    /// Consecutive failures of `streak_reason`.
    pub streak: u32,
    /// The typed reason of the failures in the streak (the run's status,
    /// kill reason or error kind: `killed:runaway`, `error:provider_server`).
    pub streak_reason: Option<String>,
    /// Set while the schedule is paused.
    pub paused: Option<Pause>,
    /// The day `spent_tokens` and `spent_cost_micros` count (`YYYY-MM-DD`
    /// in the schedule's time zone).
    pub spent_day: Option<String>,
    /// Tokens its runs used that day (their real usage).
    pub spent_tokens: u64,
    /// What they cost, in micro-dollars.
    pub spent_cost_micros: u64,
    /// When the row was written (Unix ms).
    pub updated_at_ms: u64,
}

/// A store failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleStoreError {
    /// The store could not be read or written.
    #[error("schedule store unavailable: {0}")]
    Unavailable(String),
}

/// Schedule states by name. Object-safe; `Arc<dyn ScheduleStore>`.
#[async_trait]
pub trait ScheduleStore: Send + Sync + 'static {
    /// Every state, by name.
    async fn load_all(&self) -> Result<Vec<ScheduleState>, ScheduleStoreError>;

    /// One schedule's state.
    async fn get(&self, name: &str) -> Result<Option<ScheduleState>, ScheduleStoreError>;

    /// Writes states (each replaces its name's), all or none.
    async fn put_all(&self, states: &[ScheduleState]) -> Result<(), ScheduleStoreError>;

    /// Forgets schedules (ones no longer in the repository).
    async fn remove(&self, names: &[String]) -> Result<(), ScheduleStoreError>;
}
