//! Durable runs' checkpoints on SQLite: one row per run in `checkpoints`,
//! the whole [`Checkpoint`] as JSON in `state` (its manifest and invocation
//! as they were encoded once for the run, so rows of every version read
//! the same), with the agent, iteration and resume count beside it for
//! `SELECT`s by hand, and its lease (`owner`, `lease_until`, schema
//! version 6). A run's first save creates its row; later saves update it
//! only while the saver holds it (fencing: see the port). A claim is one
//! conditional `UPDATE` on the writer thread (and under SQLite's write
//! lock against other processes), so one claimer at most wins; so is a
//! host take-over (`host_leases`, schema version 8).

use async_trait::async_trait;

use super::writer::CheckpointRow;
use super::{to_i64, SqliteStore};
use crate::ports::checkpoint::{
    Checkpoint, CheckpointError, Checkpointer, Claim, HostClaim, Lease, Renewal,
};
use crate::ports::run::{unix_ms, RunId};

fn unavailable(e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Unavailable(e.to_string())
}

#[async_trait]
impl Checkpointer for SqliteStore {
    async fn save(
        &self,
        checkpoints: &[Checkpoint],
        lease: &Lease,
    ) -> Result<Vec<RunId>, CheckpointError> {
        if checkpoints.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows = Vec::with_capacity(checkpoints.len());
        for c in checkpoints {
            rows.push(CheckpointRow {
                run_id: c.run_id.to_string(),
                agent: c.agent.to_string(),
                iteration: i64::from(c.iteration),
                attempts: i64::from(c.resumes),
                state: serde_json::to_string(c).map_err(unavailable)?,
                updated_at: to_i64(c.saved_at),
                first: c.is_first(),
            });
        }
        let now = unix_ms();
        let lost = self
            .writer
            .checkpoints(
                rows,
                Vec::new(),
                lease.owner.clone(),
                to_i64(lease.until(now)),
                to_i64(now),
            )
            .await
            .map_err(unavailable)?;
        Ok(lost
            .into_iter()
            .filter_map(|i| checkpoints.get(i).map(|c| c.run_id))
            .collect())
    }

    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        if runs.is_empty() {
            return Ok(());
        }
        let ids = runs.iter().map(RunId::to_string).collect();
        self.writer
            .checkpoints(Vec::new(), ids, String::new(), 0, 0)
            .await
            .map(drop)
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

    async fn renew(&self, lease: &Lease) -> Result<Renewal, CheckpointError> {
        let (owner, until) = (lease.owner.clone(), to_i64(lease.until(unix_ms())));
        self.writer
            .write(move |tx| {
                use rusqlite::OptionalExtension;
                let prior: Option<i64> = tx
                    .prepare_cached("SELECT taken_over FROM host_leases WHERE owner = ?1")?
                    .query_row([&owner], |r| r.get(0))
                    .optional()?;
                tx.prepare_cached(
                    "INSERT INTO host_leases (owner, lease_until, taken_over) VALUES (?1, ?2, 0) \
                     ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until, \
                     taken_over = 0",
                )?
                .execute(rusqlite::params![owner, until])?;
                let runs = tx
                    .prepare_cached("UPDATE checkpoints SET lease_until = ?2 WHERE owner = ?1")?
                    .execute(rusqlite::params![owner, until])?;
                Ok(Renewal {
                    runs: runs as u64,
                    taken_over: prior.is_some_and(|t| t != 0),
                })
            })
            .await
            .map_err(unavailable)
    }

    async fn held_by(&self, owner: &str) -> Result<Vec<RunId>, CheckpointError> {
        let owner = owner.to_string();
        let ids: Vec<String> = self
            .read(move |c| {
                let mut stmt = c
                    .prepare("SELECT run_id FROM checkpoints WHERE owner = ?1")
                    .map_err(unavailable)?;
                let rows = stmt.query_map([owner], |r| r.get(0)).map_err(unavailable)?;
                rows.collect::<Result<_, _>>().map_err(unavailable)
            })
            .await?;
        Ok(ids.iter().filter_map(|s| s.parse().ok()).collect())
    }

    async fn take_over_host(&self, owner: &str, gone: bool) -> Result<HostClaim, CheckpointError> {
        let owner = owner.to_string();
        let now = to_i64(unix_ms());
        self.writer
            .write(move |tx| {
                use rusqlite::OptionalExtension;
                // Live: a lease not expired and not taken over since it was
                // last renewed.
                let taken = tx.execute(
                    "UPDATE host_leases SET taken_over = ?2 WHERE owner = ?1 \
                     AND (lease_until <= ?2 OR taken_over <> 0 OR ?3)",
                    rusqlite::params![owner, now, gone],
                )?;
                if taken == 1 {
                    return Ok(HostClaim::TakenOver);
                }
                let until: Option<i64> = tx
                    .query_row(
                        "SELECT lease_until FROM host_leases WHERE owner = ?1",
                        [&owner],
                        |r| r.get(0),
                    )
                    .optional()?;
                match until {
                    Some(until) => Ok(HostClaim::Live {
                        until_ms: u64::try_from(until).unwrap_or(0),
                    }),
                    // It holds none (released, or it never took one): a row
                    // that says it was taken over, should it come back.
                    None => {
                        tx.execute(
                            "INSERT INTO host_leases (owner, lease_until, taken_over) \
                             VALUES (?1, 0, ?2)",
                            rusqlite::params![owner, now],
                        )?;
                        Ok(HostClaim::TakenOver)
                    }
                }
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
                    [&owner],
                )?;
                tx.execute("DELETE FROM host_leases WHERE owner = ?1", [&owner])
                    .map(drop)
            })
            .await
            .map_err(unavailable)
    }
}
