//! The `Checkpointer` port: where a durable run's state is saved after every
//! step, so a process that dies mid-run can resume it (`Host::recover`).
//!
//! Lifecycle: saved when a durable run is accepted and after every step;
//! cleared once the run's terminal record is on record (success, failure or
//! kill — a killed run is never resumed); kept when the host shuts down or
//! the process dies. A resumed run repeats at most the step it was in.

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

/// Saves and loads checkpoints. Object-safe; `Arc<dyn Checkpointer>`.
#[async_trait]
pub trait Checkpointer: Send + Sync + 'static {
    /// Saves (replaces) checkpoints, one transaction for the batch.
    async fn save(&self, checkpoints: &[Checkpoint]) -> Result<(), CheckpointError>;

    /// Removes the checkpoints of these runs.
    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError>;

    /// Every saved checkpoint (the runs to resume).
    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError>;
}
