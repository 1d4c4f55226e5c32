//! `RunQueue` on PostgreSQL: the `run_queue` table (schema version 5), one
//! row per accepted run, its lease in the row.
//!
//! # What it guarantees, and how
//!
//! - **Submit is on disk when it returns**: the insert commits with
//!   `synchronous_commit` set to `on` for its transaction (whatever the
//!   server's default), so the commit waits for the write-ahead log to be
//!   flushed; and [`PostgresStore::run_queue`] refuses a server whose
//!   `fsync` is off. A run id is accepted once, ever: its row is kept
//!   after the run is done.
//! - **Claims**: one transaction takes the oldest claimable rows (queued,
//!   or leased with an expired lease) with `SELECT … FOR UPDATE SKIP
//!   LOCKED` and writes their lease (owner, fencing token, `expires_at`,
//!   deliveries) before it commits. Two claimers never take one row: a
//!   row locked by one is skipped by the other, and a row whose lease
//!   another claim wrote is not claimable until it expires. Claims are
//!   serialized by one transaction-level advisory lock, held for the claim
//!   (a few milliseconds), so the in-flight cap counts every worker's
//!   leases; renewals, completions and releases do not take it.
//! - **Fencing**: a delivery's token is `nextval` of one sequence, so it
//!   is higher than any token handed out before. Renew, complete and
//!   release write only where the row's `fence` is the lease's and its
//!   lease is live, in the statement that writes: a lease superseded or
//!   expired meanwhile changes nothing, and the error says which.
//! - **Time** is the database server's (`statement_timestamp()`), one
//!   clock for every worker; a queue built [`PostgresQueue::with_clock`]
//!   reads a clock of its own instead (tests).
//!
//! Dead letters stay in the table (`state = 3`) with their reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio::time::Instant;
use tokio_postgres::Row;

use super::PostgresStore;
use crate::ports::queue::{
    Claimed, DeadLetter, DeadReason, Job, JobLease, LostReason, QueueError, QueueLimits,
    ReleaseReason, RunQueue, Submitted,
};

/// The key of the advisory lock claims take (`"runqueue"`).
const CLAIM_LOCK: i64 = 0x7275_6e71_7565_7565;

/// The current Unix ms: parameter `$1` when it is set, the server's clock
/// otherwise.
macro_rules! now_ms {
    () => {
        "COALESCE($1::bigint, (extract(epoch FROM statement_timestamp()) * 1000)::bigint)"
    };
}

/// The columns a job is read from, in [`job_of`]'s order.
const JOB_COLUMNS: &str = "run_id, agent, input, caller_id, durable, submitted_at";

/// The run queue on a PostgreSQL database (see the module docs). Made by
/// [`PostgresStore::run_queue`]; shares the store's connection pool.
pub struct PostgresQueue {
    pool: Pool,
    target: String,
    limits: QueueLimits,
    /// Unix ms read from here instead of the server's clock.
    clock: Option<Arc<AtomicU64>>,
}

impl std::fmt::Debug for PostgresQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresQueue")
            .field("target", &self.target)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// The run queue on this store's database, with these bounds (each at
    /// least 1; every worker on the database should use the same). Refuses
    /// a server whose `fsync` is off: nothing it acknowledges would be
    /// sure to be on disk.
    pub async fn run_queue(&self, limits: QueueLimits) -> Result<PostgresQueue, QueueError> {
        let queue = PostgresQueue {
            pool: self.pool.clone(),
            target: self.target.clone(),
            limits: QueueLimits {
                max_deliver: limits.max_deliver.max(1),
                max_in_flight: limits.max_in_flight.max(1),
            },
            clock: None,
        };
        let client = queue.client().await?;
        let fsync: String = client
            .query_one("SHOW fsync", &[])
            .await
            .map_err(failed)?
            .get(0);
        if fsync != "on" {
            return Err(QueueError::Misconfigured {
                resource: format!("database {}", self.target),
                field: "fsync",
                found: fsync,
                expected: "on".into(),
            });
        }
        Ok(queue)
    }
}

fn unreachable(e: impl std::fmt::Display) -> QueueError {
    QueueError::Unreachable(crate::secrets::redact_string(e.to_string()))
}

/// A driver error, with the server's message when it sent one (its
/// `Display` says only "db error").
fn failed(e: tokio_postgres::Error) -> QueueError {
    match e.as_db_error() {
        Some(db) => unreachable(format_args!("{}: {}", db.code().code(), db.message())),
        None => unreachable(e),
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn corrupt(e: impl std::fmt::Display) -> QueueError {
    QueueError::Corrupt(e.to_string())
}

/// A job from the first six columns of `row` ([`JOB_COLUMNS`]).
fn job_of(row: &Row) -> Result<Job, QueueError> {
    let run_id: &str = row.get(0);
    let agent: &str = row.get(1);
    let input: &str = row.get(2);
    Ok(Job {
        run_id: run_id.parse().map_err(corrupt)?,
        agent: serde_json::from_str(agent).map_err(corrupt)?,
        input: serde_json::from_str(input).map_err(corrupt)?,
        caller: row.get(3),
        durable: row.get(4),
        submitted_at_ms: u64::try_from(row.get::<_, i64>(5)).unwrap_or(0),
    })
}

impl PostgresQueue {
    /// Reads the time (Unix ms) from `clock` instead of the database
    /// server's: tests move it to expire leases without waiting.
    pub fn with_clock(mut self, clock: Arc<AtomicU64>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The URL of its database, its password left out.
    pub fn target(&self) -> &str {
        &self.target
    }

    fn now_param(&self) -> Option<i64> {
        self.clock
            .as_ref()
            .map(|c| i64::try_from(c.load(Ordering::SeqCst)).unwrap_or(i64::MAX))
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, QueueError> {
        self.pool.get().await.map_err(unreachable)
    }

    /// Why `lease` did not match its row: read after a fenced write
    /// changed nothing.
    async fn lost(
        &self,
        client: &deadpool_postgres::Client,
        lease: &JobLease,
    ) -> Result<QueueError, QueueError> {
        let id = lease.run_id.to_string();
        let row = client
            .query_opt(
                "SELECT state, fence FROM run_queue WHERE run_id = $1",
                &[&id],
            )
            .await
            .map_err(failed)?;
        let reason = match row {
            None => LostReason::Finished,
            Some(row) => {
                let (state, fence): (i16, i64) = (row.get(0), row.get(1));
                if u64::try_from(fence).ok() != Some(lease.fence) {
                    LostReason::Superseded
                } else {
                    match state {
                        0 => LostReason::Released,
                        1 => LostReason::Expired,
                        _ => LostReason::Finished,
                    }
                }
            }
        };
        Ok(QueueError::LeaseLost {
            run_id: lease.run_id,
            fence: lease.fence,
            reason,
        })
    }

    /// Runs a fenced write of `lease` (`$1` the time, `$2` the run, `$3`
    /// the fence, then `extra`): `Ok` when it matched the lease's row.
    async fn fenced(
        &self,
        sql: &str,
        lease: &JobLease,
        extra: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<(), QueueError> {
        let client = self.client().await?;
        let now = self.now_param();
        let id = lease.run_id.to_string();
        let fence = i64::try_from(lease.fence).unwrap_or(i64::MAX);
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&now, &id, &fence];
        params.extend_from_slice(extra);
        let n = client.execute(sql, &params).await.map_err(failed)?;
        if n == 1 {
            Ok(())
        } else {
            Err(self.lost(&client, lease).await?)
        }
    }
}

#[async_trait]
impl RunQueue for PostgresQueue {
    async fn submit(&self, job: &Job) -> Result<Submitted, QueueError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        tx.batch_execute("SET LOCAL synchronous_commit TO on")
            .await
            .map_err(failed)?;
        let at = i64::try_from(job.submitted_at_ms).unwrap_or(i64::MAX);
        let n = tx
            .execute(
                "INSERT INTO run_queue (run_id, agent, input, caller_id, durable, submitted_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (run_id) DO NOTHING",
                &[
                    &job.run_id.to_string(),
                    &job.agent.to_string(),
                    &job.input.to_string(),
                    &job.caller,
                    &job.durable,
                    &at,
                ],
            )
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        Ok(if n == 1 {
            Submitted::Queued
        } else {
            Submitted::AlreadyQueued
        })
    }

    async fn claim(
        &self,
        worker: &str,
        max: usize,
        lease_ttl: Duration,
    ) -> Result<Vec<Claimed>, QueueError> {
        let sent = Instant::now();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let now: i64 = tx
            .query_one(concat!("SELECT ", now_ms!()), &[&self.now_param()])
            .await
            .map_err(failed)?
            .get(0);
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CLAIM_LOCK])
            .await
            .map_err(failed)?;
        let in_flight: i64 = tx
            .query_one(
                "SELECT count(*) FROM run_queue WHERE state = 1 AND expires_at > $1",
                &[&now],
            )
            .await
            .map_err(failed)?
            .get(0);
        let room = i64::from(self.limits.max_in_flight).saturating_sub(in_flight);
        let mut want = i64::try_from(max).unwrap_or(i64::MAX).min(room).max(0);
        let ttl = ms(lease_ttl);
        let max_deliver = i32::try_from(self.limits.max_deliver).unwrap_or(i32::MAX);
        let mut claimed: Vec<(i64, Claimed)> = Vec::new();
        while want > 0 {
            let rows = tx
                .query(
                    "SELECT run_id, deliveries FROM run_queue \
                     WHERE state < 2 AND (state = 0 OR expires_at <= $1) \
                     ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED",
                    &[&now, &want],
                )
                .await
                .map_err(failed)?;
            if rows.is_empty() {
                break;
            }
            let mut take = Vec::new();
            for row in &rows {
                let (id, deliveries): (String, i32) = (row.get(0), row.get(1));
                if deliveries < max_deliver {
                    take.push(id);
                    continue;
                }
                let reason = DeadReason::MaxDeliveries {
                    deliveries: u32::try_from(deliveries).unwrap_or(0),
                };
                let reason = serde_json::to_string(&reason).map_err(corrupt)?;
                tx.execute(
                    "UPDATE run_queue SET state = 3, owner = NULL, expires_at = NULL, \
                     finished_at = $1, dead_reason = $2 WHERE run_id = $3",
                    &[&now, &reason, &id],
                )
                .await
                .map_err(failed)?;
            }
            let leased = tx
                .query(
                    &format!(
                        "UPDATE run_queue SET state = 1, owner = $2, \
                         fence = nextval('run_queue_fence'), expires_at = $1::bigint + $3::bigint, \
                         deliveries = deliveries + 1, released = NULL \
                         WHERE run_id = ANY($4) \
                         RETURNING {JOB_COLUMNS}, seq, fence, deliveries"
                    ),
                    &[&now, &worker, &ttl, &take],
                )
                .await
                .map_err(failed)?;
            for row in &leased {
                let job = job_of(row)?;
                let (seq, fence, deliveries): (i64, i64, i32) =
                    (row.get(6), row.get(7), row.get(8));
                let lease = JobLease {
                    run_id: job.run_id,
                    worker: worker.to_string(),
                    fence: u64::try_from(fence).unwrap_or(0),
                    deliveries: u32::try_from(deliveries).unwrap_or(0),
                    ttl: lease_ttl,
                    deadline: sent + lease_ttl,
                    receipt: String::new(),
                };
                claimed.push((seq, Claimed { job, lease }));
            }
            let asked = want;
            want -= i64::try_from(leased.len()).unwrap_or(want);
            if i64::try_from(rows.len()).unwrap_or(0) < asked {
                break;
            }
        }
        tx.commit().await.map_err(failed)?;
        claimed.sort_by_key(|(seq, _)| *seq);
        Ok(claimed.into_iter().map(|(_, c)| c).collect())
    }

    async fn renew(&self, lease: &mut JobLease) -> Result<(), QueueError> {
        let sent = Instant::now();
        let ttl = ms(lease.ttl);
        self.fenced(
            concat!(
                "UPDATE run_queue SET expires_at = ",
                now_ms!(),
                " + $4 WHERE run_id = $2 AND fence = $3 AND state = 1 AND expires_at > ",
                now_ms!()
            ),
            lease,
            &[&ttl],
        )
        .await?;
        lease.deadline = sent + lease.ttl;
        Ok(())
    }

    async fn complete(&self, lease: &JobLease) -> Result<(), QueueError> {
        self.fenced(
            concat!(
                "UPDATE run_queue SET state = 2, owner = NULL, expires_at = NULL, finished_at = ",
                now_ms!(),
                " WHERE run_id = $2 AND fence = $3 AND state = 1 AND expires_at > ",
                now_ms!()
            ),
            lease,
            &[],
        )
        .await
    }

    async fn release(&self, lease: &JobLease, reason: &ReleaseReason) -> Result<(), QueueError> {
        let reason = serde_json::to_string(reason).map_err(corrupt)?;
        self.fenced(
            concat!(
                "UPDATE run_queue SET state = 0, owner = NULL, expires_at = NULL, released = $4 \
                 WHERE run_id = $2 AND fence = $3 AND state = 1 AND expires_at > ",
                now_ms!()
            ),
            lease,
            &[&reason],
        )
        .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, dead_reason, finished_at FROM run_queue \
                     WHERE state = 3 ORDER BY finished_at, seq LIMIT $1"
                ),
                &[&limit],
            )
            .await
            .map_err(failed)?;
        rows.iter()
            .map(|row| {
                let reason: Option<String> = row.get(6);
                Ok(DeadLetter {
                    job: job_of(row)?,
                    reason: serde_json::from_str(reason.as_deref().unwrap_or_default())
                        .map_err(corrupt)?,
                    at_ms: u64::try_from(row.get::<_, Option<i64>>(7).unwrap_or(0)).unwrap_or(0),
                })
            })
            .collect()
    }
}
