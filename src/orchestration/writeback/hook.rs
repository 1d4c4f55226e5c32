//! The git writeback as a skill run's `writeback` phase
//! ([`crate::skill_run::MemoryWriteback`]).

use async_trait::async_trait;

use super::{GitWriteback, PushState};
use crate::ports::run::RunId;
use crate::skill_run::{MemoryWriteback, WritebackError};
use crate::skills::{Schedule, SkillsRepo};

/// A write that landed (pushed, or kept local by design: `--skip-push`, no
/// token) answers its commit; one that was parked, or could not be made,
/// is the run's `partial_failure`, with why (the parked intent is retried
/// later and never discarded). Tokens are read from the environment
/// (`AGENTVISOR_SECRET_GIT_TOKEN`).
#[async_trait]
impl MemoryWriteback for GitWriteback {
    async fn write_back(
        &self,
        repo: &SkillsRepo,
        schedule: &Schedule,
        run_id: RunId,
        memory: &str,
        skip_push: bool,
    ) -> Result<Option<String>, WritebackError> {
        let written = self
            .write_schedule_memory(
                repo,
                schedule,
                memory,
                &run_id.to_string(),
                skip_push,
                |k| std::env::var(k).ok(),
            )
            .await;
        match written {
            None => Ok(None),
            Some(Err(e)) => Err(WritebackError(e.to_string())),
            Some(Ok(outcome)) => {
                for w in &outcome.warnings {
                    tracing::warn!(schedule = %schedule.name, run_id = %run_id, "writeback: {w}");
                }
                match &outcome.push {
                    PushState::Parked { intent_id, error } => Err(WritebackError(format!(
                        "the memory's commit could not be pushed and is parked as {intent_id} (retried later): {error}"
                    ))),
                    _ => Ok(outcome.sha),
                }
            }
        }
    }
}
