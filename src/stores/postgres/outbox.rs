//! The outbox on PostgreSQL (schema version 6): the intents an audit batch
//! brings are rows of `outbox`, inserted in that batch's transaction
//! ([`insert`], called by the audit store's `append`); this file
//! implements the [`OutboxStore`] port over the table.
//!
//! Guarantees, as on SQLite: an intent is on file exactly when its run's
//! terminal record is; one written again (a spool replay) keeps the row it
//! has; a claim is taken in one statement (`UPDATE … WHERE` the intent is
//! owed and unclaimed or its claim ran out: a second host's update waits
//! on the row and finds it claimed), so two publishers never both hold it.

use async_trait::async_trait;

use super::{to_i64, to_u64, Cause, PostgresStore};
use crate::ports::audit::{AuditEntry, AuditRecord, AuditStoreError};
use crate::ports::outbox::{
    DeliveryReport, DeliveryState, OutboxError, OutboxStore, PublishIntent,
};
use crate::ports::run::RunId;

fn unavailable(e: impl Into<Cause>) -> OutboxError {
    OutboxError::Unavailable(crate::secrets::redact_string(e.into().0))
}

/// The outbox rows of a batch's [`AuditEntry::Publish`] records, column
/// by column, ready to bind as arrays.
#[derive(Default)]
pub(super) struct OutboxRows {
    key: Vec<String>,
    run_id: Vec<String>,
    idx: Vec<i32>,
    created_at: Vec<i64>,
    intent: Vec<String>,
    state: Vec<&'static str>,
    detail: Vec<Option<String>>,
    settled_at: Vec<i64>,
}

impl OutboxRows {
    /// Adds the intents of `record` (one that is not a publish adds none).
    pub(super) fn push(&mut self, record: &AuditRecord) -> Result<(), AuditStoreError> {
        let AuditEntry::Publish(intents) = &record.entry else {
            return Ok(());
        };
        for i in intents.iter() {
            let json = serde_json::to_string(i).map_err(|e| {
                AuditStoreError::Unavailable(format!(
                    "publish intent {} does not encode: {e}",
                    i.key
                ))
            })?;
            let report = DeliveryReport::of(i);
            self.key.push(i.key.clone());
            self.run_id.push(i.run_id.to_string());
            self.idx.push(i32::try_from(i.index).unwrap_or(i32::MAX));
            self.created_at.push(to_i64(i.at_ms));
            self.intent.push(json);
            self.state.push(report.state.as_str());
            self.detail.push(report.detail);
            self.settled_at.push(to_i64(report.at_ms));
        }
        Ok(())
    }

    /// Whether the batch brought none.
    pub(super) fn is_empty(&self) -> bool {
        self.key.is_empty()
    }
}

/// Inserts `rows` in `tx` (the audit batch's transaction); an intent on
/// file already is left as it stands.
pub(super) async fn insert(
    tx: &tokio_postgres::Transaction<'_>,
    rows: &OutboxRows,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "INSERT INTO outbox (key, run_id, idx, created_at, intent, state, detail, settled_at) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::int4[], $4::int8[], $5::text[], \
         $6::text[], $7::text[], $8::int8[]) ON CONFLICT (key) DO NOTHING",
        &[
            &rows.key,
            &rows.run_id,
            &rows.idx,
            &rows.created_at,
            &rows.intent,
            &rows.state,
            &rows.detail,
            &rows.settled_at,
        ],
    )
    .await
    .map(drop)
}

/// Reads one intent's JSON.
fn intent(json: &str) -> Result<PublishIntent, OutboxError> {
    serde_json::from_str(json)
        .map_err(|e| OutboxError::Unavailable(format!("a stored intent does not read: {e}")))
}

#[async_trait]
impl OutboxStore for PostgresStore {
    async fn owed(&self, now_ms: u64, limit: usize) -> Result<Vec<PublishIntent>, OutboxError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT intent FROM outbox WHERE state = 'owed' \
                 AND (claimed_by IS NULL OR claim_until <= $1) \
                 ORDER BY created_at, key LIMIT $2",
                &[&to_i64(now_ms), &limit],
            )
            .await
            .map_err(unavailable)?;
        rows.iter().map(|r| intent(r.get(0))).collect()
    }

    async fn run_intents(
        &self,
        run_id: RunId,
    ) -> Result<Vec<(PublishIntent, DeliveryReport)>, OutboxError> {
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT intent, state, attempts, error, detail, settled_at \
                 FROM outbox WHERE run_id = $1 ORDER BY idx",
                &[&run_id.to_string()],
            )
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|row| {
                let i = intent(row.get(0))?;
                let state: &str = row.get(1);
                let state = DeliveryState::parse(state).ok_or_else(|| {
                    OutboxError::Unavailable(format!("unknown outbox state `{state}`"))
                })?;
                let report = DeliveryReport {
                    key: i.key.clone(),
                    name: i.name.clone(),
                    kind: i.kind.clone(),
                    target: i.shown.clone(),
                    state,
                    attempts: u32::try_from(row.get::<_, i32>(2)).unwrap_or(0),
                    error: row.get(3),
                    detail: row.get(4),
                    at_ms: to_u64(row.get(5)),
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
        let client = self.client().await.map_err(unavailable)?;
        let n = client
            .execute(
                "UPDATE outbox SET claimed_by = $2, claim_until = $3 \
                 WHERE key = $1 AND state = 'owed' \
                 AND (claimed_by IS NULL OR claimed_by = $2 OR claim_until <= $4)",
                &[&key, &owner, &to_i64(until_ms), &to_i64(now_ms)],
            )
            .await
            .map_err(unavailable)?;
        Ok(n == 1)
    }

    async fn record_outcome(&self, report: &DeliveryReport) -> Result<(), OutboxError> {
        let client = self.client().await.map_err(unavailable)?;
        let attempts = i32::try_from(report.attempts).unwrap_or(i32::MAX);
        client
            .execute(
                "UPDATE outbox SET state = $2, attempts = $3, error = $4, detail = $5, \
                 settled_at = $6, claimed_by = NULL, claim_until = 0 WHERE key = $1",
                &[
                    &report.key,
                    &report.state.as_str(),
                    &attempts,
                    &report.error,
                    &report.detail,
                    &to_i64(report.at_ms),
                ],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
