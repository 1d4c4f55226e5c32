//! Durable runs' checkpoints on SQLite: one row per run in `checkpoints`,
//! the whole [`Checkpoint`] as JSON in `state`, with the agent, iteration
//! and resume count beside it for `SELECT`s by hand, and its lease
//! (`owner`, `lease_until`, schema version 6). A save replaces the run's
//! row unless another owner's lease on it is live; a claim is one
//! conditional `UPDATE` on the writer thread (and under SQLite's write
//! lock against other processes), so one claimer at most wins.

use async_trait::async_trait;

use super::writer::CheckpointRow;
use super::{to_i64, SqliteStore};
use crate::ports::checkpoint::{Checkpoint, CheckpointError, Checkpointer, Claim, Lease};
use crate::ports::run::{unix_ms, RunId};

fn unavailable(e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Unavailable(e.to_string())
}

#[async_trait]
impl Checkpointer for SqliteStore {
    async fn save(&self, checkpoints: &[Checkpoint], lease: &Lease) -> Result<(), CheckpointError> {
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
        let now = unix_ms();
        self.writer
            .checkpoints(
                rows,
                Vec::new(),
                lease.owner.clone(),
                to_i64(lease.until(now)),
                to_i64(now),
            )
            .await
            .map_err(unavailable)
    }

    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        if runs.is_empty() {
            return Ok(());
        }
        let ids = runs.iter().map(RunId::to_string).collect();
        self.writer
            .checkpoints(Vec::new(), ids, String::new(), 0, 0)
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

    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError> {
        let now = unix_ms();
        let (id, owner, until) = (run_id.to_string(), lease.owner.clone(), lease.until(now));
        self.writer
            .write(move |tx| {
                let taken = tx.execute(
                    "UPDATE checkpoints SET owner = ?2, lease_until = ?3 WHERE run_id = ?1 \
                     AND (owner IS NULL OR owner = ?2 OR lease_until <= ?4)",
                    rusqlite::params![id, owner, to_i64(until), to_i64(now)],
                )?;
                if taken == 1 {
                    return Ok(Claim::Claimed);
                }
                use rusqlite::OptionalExtension;
                let holder: Option<(Option<String>, i64)> = tx
                    .query_row(
                        "SELECT owner, lease_until FROM checkpoints WHERE run_id = ?1",
                        [&id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                Ok(match holder {
                    Some((owner, until)) => Claim::HeldBy {
                        owner: owner.unwrap_or_default(),
                        until_ms: u64::try_from(until).unwrap_or(0),
                    },
                    None => Claim::Missing,
                })
            })
            .await
            .map_err(unavailable)
    }

    async fn renew(&self, lease: &Lease) -> Result<(), CheckpointError> {
        let (owner, until) = (lease.owner.clone(), to_i64(lease.until(unix_ms())));
        self.writer
            .write(move |tx| {
                tx.execute(
                    "UPDATE checkpoints SET lease_until = ?2 WHERE owner = ?1",
                    rusqlite::params![owner, until],
                )
                .map(drop)
            })
            .await
            .map_err(unavailable)
    }

    async fn release(&self, owner: &str) -> Result<(), CheckpointError> {
        let owner = owner.to_string();
        self.writer
            .write(move |tx| {
                tx.execute(
                    "UPDATE checkpoints SET owner = NULL, lease_until = 0 WHERE owner = ?1",
                    [owner],
                )
                .map(drop)
            })
            .await
            .map_err(unavailable)
    }
}
