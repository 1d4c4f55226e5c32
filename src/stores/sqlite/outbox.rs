//! The outbox on SQLite (schema version 15): the intents an audit batch
//! brings are rows of `outbox`, inserted in that batch's transaction
//! (`writer::append`); this file turns a batch's intents into rows and
//! implements the [`OutboxStore`] port over the table (reads on a read
//! connection, outcomes and claims through the writer thread).
//!
//! Guarantees: an intent is on file exactly when its run's terminal
//! record is; one written again (a spool replay) keeps the row it has;
//! a claim is taken in one statement (`UPDATE … WHERE` the intent is
//! owed and unclaimed or its claim ran out), so two publishers on one
//! file never both hold it.

use async_trait::async_trait;
use rusqlite::params;

use super::connection::ReadFailure;
use super::writer::OutboxRow;
use super::{to_i64, to_u64, SqliteStore};
use crate::ports::audit::{AuditEntry, AuditRecord, AuditStoreError};
use crate::ports::outbox::{
    DeliveryReport, DeliveryState, OutboxError, OutboxStore, PublishIntent,
};
use crate::ports::run::RunId;

impl From<ReadFailure> for OutboxError {
    fn from(e: ReadFailure) -> Self {
        OutboxError::Unavailable(e.0)
    }
}

fn unavailable(e: impl std::fmt::Display) -> OutboxError {
    OutboxError::Unavailable(e.to_string())
}

/// The outbox rows of a batch's [`AuditEntry::Publish`] records.
pub(super) fn outbox_rows(batch: &[AuditRecord]) -> Result<Vec<OutboxRow>, AuditStoreError> {
    let mut out = Vec::new();
    for r in batch {
        let AuditEntry::Publish(intents) = &r.entry else {
            continue;
        };
        for i in intents.iter() {
            let intent = serde_json::to_string(i).map_err(|e| {
                AuditStoreError::Unavailable(format!(
                    "publish intent {} does not encode: {e}",
                    i.key
                ))
            })?;
            let report = DeliveryReport::of(i);
            out.push(OutboxRow {
                key: i.key.clone(),
                run_id: i.run_id.to_string(),
                idx: i64::from(i.index),
                created_at: to_i64(i.at_ms),
                intent,
                state: report.state.as_str(),
                detail: report.detail,
                settled_at: to_i64(report.at_ms),
            });
        }
    }
    Ok(out)
}

/// Reads one intent's JSON.
fn intent(json: &str) -> Result<PublishIntent, OutboxError> {
    serde_json::from_str(json)
        .map_err(|e| unavailable(format!("a stored intent does not read: {e}")))
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn owed(&self, now_ms: u64, limit: usize) -> Result<Vec<PublishIntent>, OutboxError> {
        let now = to_i64(now_ms);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<String> = self
            .read(move |c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT intent FROM outbox WHERE state = 'owed' \
                         AND (claimed_by IS NULL OR claim_until <= ?1) \
                         ORDER BY created_at, key LIMIT ?2",
                    )
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map(params![now, limit], |r| r.get(0))
                    .map_err(unavailable)?;
                rows.collect::<Result<_, _>>().map_err(unavailable)
            })
            .await?;
        rows.iter().map(|j| intent(j)).collect()
    }

    async fn run_intents(
        &self,
        run_id: RunId,
    ) -> Result<Vec<(PublishIntent, DeliveryReport)>, OutboxError> {
        type Row = (String, String, i64, Option<String>, Option<String>, i64);
        let id = run_id.to_string();
        let rows: Vec<Row> = self
            .read(move |c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT intent, state, attempts, error, detail, settled_at \
                         FROM outbox WHERE run_id = ?1 ORDER BY idx",
                    )
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map([id], |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                        ))
                    })
                    .map_err(unavailable)?;
                rows.collect::<Result<_, _>>().map_err(unavailable)
            })
            .await?;
        rows.into_iter()
            .map(|(json, state, attempts, error, detail, at)| {
                let i = intent(&json)?;
                let state = DeliveryState::parse(&state)
                    .ok_or_else(|| unavailable(format!("unknown outbox state `{state}`")))?;
                let report = DeliveryReport {
                    key: i.key.clone(),
                    name: i.name.clone(),
                    kind: i.kind.clone(),
                    target: i.shown.clone(),
                    state,
                    attempts: u32::try_from(attempts).unwrap_or(0),
                    error,
                    detail,
                    at_ms: to_u64(at),
                };
                Ok((i, report))
            })
            .collect()
    }

    async fn claim(
        &self,
        key: &str,
        owner: &str,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<bool, OutboxError> {
        let (key, owner) = (key.to_string(), owner.to_string());
        let (until, now) = (to_i64(until_ms), to_i64(now_ms));
        self.writer
            .write(move |tx| {
                tx.execute(
                    "UPDATE outbox SET claimed_by = ?2, claim_until = ?3 \
                     WHERE key = ?1 AND state = 'owed' \
                     AND (claimed_by IS NULL OR claimed_by = ?2 OR claim_until <= ?4)",
                    params![key, owner, until, now],
                )
            })
            .await
            .map(|n| n == 1)
            .map_err(unavailable)
    }

    async fn record_outcome(&self, report: &DeliveryReport) -> Result<(), OutboxError> {
        let r = report.clone();
        self.writer
            .write(move |tx| {
                tx.execute(
                    "UPDATE outbox SET state = ?2, attempts = ?3, error = ?4, detail = ?5, \
                     settled_at = ?6, claimed_by = NULL, claim_until = 0 WHERE key = ?1",
                    params![
                        r.key,
                        r.state.as_str(),
                        i64::from(r.attempts),
                        r.error,
                        r.detail,
                        to_i64(r.at_ms)
                    ],
                )
                .map(drop)
            })
            .await
            .map_err(unavailable)
    }
}
