//! The `Checkpointer` port: where a durable run's state is saved after every
//! step, so a process that dies mid-run can resume it (`Host::recover`).
//!
//! Lifecycle: saved when a durable run is accepted and after every step;
//! cleared once the run's terminal record is in the audit store (success,
//! failure or kill — a killed run is never resumed); kept when the host
//! shuts down or the process dies. A resumed run repeats at most the step
//! it was in.
//!
//! # Leases
//!
//! A host holds a lease on each durable run it runs: an owner id and an
//! expiry, written with every save and renewed while the host lives
//! ([`Checkpointer::renew`]); a clean shutdown releases them. `recover`
//! resumes a run only after claiming it ([`Checkpointer::claim`]), which
//! succeeds for one caller at most while a lease is live: two `recover`s,
//! or a `recover` beside a live host, never run the same run twice. Times
//! are Unix milliseconds of the callers' clocks, so hosts sharing a store
//! need clocks that agree to well within the lease's length. Nothing here
//! assumes SQLite: a claim is one conditional update of one row.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::model::Message;
use super::run::{CriticDecision, RunId, StepRecord, Usage};
use crate::spec::{AgentSpec, Invocation};

/// A durable run's saved state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The run.
    pub run_id: RunId,
    /// The manifest it runs (shared with the run: a save copies no manifest).
    pub spec: Arc<AgentSpec>,
    /// How it was invoked (caller, session, limits override, …).
    pub invocation: Invocation,
    /// The transcript up to the last completed step (shared with the run
    /// until its next message).
    pub transcript: Arc<Vec<Message>>,
    /// Model iterations completed.
    pub iteration: u32,
    /// Tool calls so far.
    pub steps: Vec<StepRecord>,
    /// Usage so far.
    pub usage: Usage,
    /// Critic decisions so far.
    pub critic: Vec<CriticDecision>,
    /// How many times the run was resumed.
    pub resumes: u32,
    /// Unix ms when the run first started.
    pub started_at: u64,
    /// Unix ms of this save.
    #[serde(default)]
    pub saved_at: u64,
}

/// A checkpointer failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The store could not read or write.
    #[error("checkpoint store unavailable: {0}")]
    Unavailable(String),
}

/// A host's hold on the durable runs it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Who holds it: unique per host and process.
    pub owner: String,
    /// How long it holds without a renewal.
    pub ttl: std::time::Duration,
}

impl Lease {
    /// The Unix ms a lease taken at `now_ms` expires.
    pub fn until(&self, now_ms: u64) -> u64 {
        now_ms.saturating_add(self.ttl.as_millis() as u64)
    }
}

/// What [`Checkpointer::claim`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The run is the caller's now.
    Claimed,
    /// Another owner's lease on it is live.
    HeldBy {
        /// The owner.
        owner: String,
        /// Unix ms its lease expires (unless renewed).
        until_ms: u64,
    },
    /// No checkpoint of the run (it finished meanwhile).
    Missing,
}

/// Saves and loads checkpoints. Object-safe; `Arc<dyn Checkpointer>`.
#[async_trait]
pub trait Checkpointer: Send + Sync + 'static {
    /// Saves (replaces) checkpoints, one transaction for the batch, under
    /// `lease` (taken for runs without a live lease of another owner; a
    /// save of a run another owner holds is not written).
    async fn save(&self, checkpoints: &[Checkpoint], lease: &Lease) -> Result<(), CheckpointError>;

    /// Removes the checkpoints of these runs.
    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError>;

    /// Every saved checkpoint (the runs to resume).
    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError>;

    /// Takes the lease on a run, atomically: when nobody holds it, its
    /// lease expired, or `lease.owner` holds it already.
    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError>;

    /// Extends every lease `lease.owner` holds by `lease.ttl` from now.
    async fn renew(&self, lease: &Lease) -> Result<(), CheckpointError>;

    /// Gives up every lease `owner` holds (its runs can be claimed at once).
    async fn release(&self, owner: &str) -> Result<(), CheckpointError>;
}
