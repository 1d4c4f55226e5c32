//! Durable runs' checkpoints on SQLite: one row per run in `checkpoints`,
//! the whole [`Checkpoint`] as JSON in `state`, with the agent, iteration
//! and resume count beside it for `SELECT`s by hand. A save replaces the
//! run's row; saves and clears of one call share one transaction.

use async_trait::async_trait;

use super::writer::CheckpointRow;
use super::{to_i64, SqliteStore};
use crate::ports::checkpoint::{Checkpoint, CheckpointError, Checkpointer};
use crate::ports::run::RunId;

fn unavailable(e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Unavailable(e.to_string())
}

#[async_trait]
impl Checkpointer for SqliteStore {
    async fn save(&self, checkpoints: &[Checkpoint]) -> Result<(), CheckpointError> {
        if checkpoints.is_empty() {
            return Ok(());
        }
        let mut rows = Vec::with_capacity(checkpoints.len());
        for c in checkpoints {
            rows.push(CheckpointRow {
                run_id: c.run_id.to_string(),
                agent: c.spec.name.clone(),
                iteration: i64::from(c.iteration),
                attempts: i64::from(c.resumes),
                state: serde_json::to_string(c).map_err(unavailable)?,
                updated_at: to_i64(c.saved_at),
            });
        }
        self.writer
            .checkpoints(rows, Vec::new())
            .await
            .map_err(unavailable)
    }

    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        if runs.is_empty() {
            return Ok(());
        }
        let ids = runs.iter().map(RunId::to_string).collect();
        self.writer
            .checkpoints(Vec::new(), ids)
            .await
            .map_err(unavailable)
    }

    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        let rows: Vec<(String, String)> = self
            .read(|c| {
                let mut stmt = c
                    .prepare("SELECT run_id, state FROM checkpoints ORDER BY updated_at, run_id")
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(unavailable)?;
                rows.collect::<Result<_, _>>().map_err(unavailable)
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (run_id, state) in rows {
            match serde_json::from_str::<Checkpoint>(&state) {
                Ok(c) => out.push(c),
                // One unreadable row must not keep every other run from
                // resuming: it is reported and left in place.
                Err(e) => {
                    tracing::error!(%run_id, error = %e, "a checkpoint does not parse; skipped")
                }
            }
        }
        Ok(out)
    }
}
