//! The `AuditStore` port: an append-only log of what every run did. The
//! audit actor batches records and calls `append` once per batch; a store
//! writes a batch atomically (one transaction) or fails it whole.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::run::{RunEvent, RunId, RunResult};

/// Who and what a run is, recorded at its start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Agent name.
    pub agent: String,
    /// Model name.
    pub model: String,
    /// Who submitted the run.
    pub caller_id: Option<String>,
    /// The channel it came from (chat bots).
    pub channel_id: Option<String>,
    /// The parent run, for sub-agents.
    pub parent_run_id: Option<RunId>,
    /// The session it belongs to.
    pub session_id: Option<String>,
    /// The prompt (capped).
    pub prompt: String,
}

/// What an audit record says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum AuditEntry {
    /// The run started executing.
    RunStarted(RunInfo),
    /// Something happened in the run (a step, a tool call, a critic decision, an error).
    Event(RunEvent),
    /// The terminal roll-up: exactly one per run.
    Terminal(Arc<RunResult>),
}

/// One audit record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// The run.
    pub run_id: RunId,
    /// Order within the run (0-based; the terminal record may come from the
    /// critic and then carries `u32::MAX`).
    pub seq: u32,
    /// Unix ms.
    pub at_ms: u64,
    /// The content.
    pub entry: AuditEntry,
}

impl AuditRecord {
    /// Whether this is a run's terminal roll-up.
    pub fn is_terminal(&self) -> bool {
        matches!(self.entry, AuditEntry::Terminal(_))
    }
}

/// Counts a store keeps, for verdicts ("every run has exactly one terminal record").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditStats {
    /// Records written.
    pub records: u64,
    /// Terminal records written.
    pub terminal_records: u64,
    /// Batches written.
    pub batches: u64,
}

/// An audit store failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AuditStoreError {
    /// The store could not write or read.
    #[error("audit store unavailable: {0}")]
    Unavailable(String),
}

/// Where audit records go. Object-safe; used as `Arc<dyn AuditStore>`.
#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// Writes a batch atomically.
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError>;

    /// Every stored record of one run, in order.
    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError>;

    /// What has been written so far.
    async fn stats(&self) -> Result<AuditStats, AuditStoreError>;
}
