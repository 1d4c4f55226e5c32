//! Parked memory writes on PostgreSQL (schema version 6): one row per
//! intent in `writeback_intents`, keyed by `intent_id`, in the order
//! parked (`seq`, an identity column). Each write is one statement, so an
//! intent is committed when `park` returns.

use async_trait::async_trait;

use super::{to_i64, to_u64, Cause, PostgresStore};
use crate::ports::writeback::{WriteIntent, WriteIntentError, WriteIntents};

fn unavailable(e: impl Into<Cause>) -> WriteIntentError {
    WriteIntentError::Unavailable(crate::secrets::redact_string(e.into().0))
}

fn intent(r: &tokio_postgres::Row) -> Result<WriteIntent, WriteIntentError> {
    let id: String = r.get(0);
    let mode = r
        .get::<_, &str>(3)
        .parse()
        .map_err(|reason| WriteIntentError::Corrupt {
            id: id.clone(),
            reason,
        })?;
    Ok(WriteIntent {
        id,
        repo: r.get(1),
        path: r.get(2),
        mode,
        content: r.get(4),
        run_id: r.get(5),
        token_secret: r.get(6),
        parked_at_ms: to_u64(r.get(7)),
        attempts: u32::try_from(r.get::<_, i64>(8).max(0)).unwrap_or(u32::MAX),
        last_error: r.get(9),
    })
}

#[async_trait]
impl WriteIntents for PostgresStore {
    async fn park(&self, intent: &WriteIntent) -> Result<(), WriteIntentError> {
        let i = intent;
        let client = self.client().await.map_err(unavailable)?;
        client
            .execute(
                "INSERT INTO writeback_intents (intent_id, repo, path, mode, content, run_id, \
                 token_secret, parked_at, attempts, last_error) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (intent_id) DO UPDATE SET \
                 attempts = writeback_intents.attempts + 1, last_error = EXCLUDED.last_error",
                &[
                    &i.id,
                    &i.repo,
                    &i.path,
                    &i.mode.as_str(),
                    &i.content,
                    &i.run_id,
                    &i.token_secret,
                    &to_i64(i.parked_at_ms),
                    &i64::from(i.attempts.max(1)),
                    &i.last_error,
                ],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn parked(&self) -> Result<Vec<WriteIntent>, WriteIntentError> {
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT intent_id, repo, path, mode, content, run_id, token_secret, \
                 parked_at, attempts, last_error FROM writeback_intents ORDER BY seq",
                &[],
            )
            .await
            .map_err(unavailable)?;
        rows.iter().map(intent).collect()
    }

    async fn record_attempt(&self, id: &str, error: &str) -> Result<bool, WriteIntentError> {
        let client = self.client().await.map_err(unavailable)?;
        let n = client
            .execute(
                "UPDATE writeback_intents SET attempts = attempts + 1, last_error = $2 \
                 WHERE intent_id = $1",
                &[&id, &error],
            )
            .await
            .map_err(unavailable)?;
        Ok(n == 1)
    }

    async fn resolve(&self, id: &str) -> Result<bool, WriteIntentError> {
        let client = self.client().await.map_err(unavailable)?;
        let n = client
            .execute("DELETE FROM writeback_intents WHERE intent_id = $1", &[&id])
            .await
            .map_err(unavailable)?;
        Ok(n == 1)
    }
}
