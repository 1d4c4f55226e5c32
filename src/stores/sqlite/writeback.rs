//! Parked memory writes on SQLite (schema version 17): one row per intent
//! in `writeback_intents`, keyed by `intent_id`, in the order parked
//! (`seq`). Writes go through the store's writer thread, one transaction
//! each, so an intent is on disk when `park` returns; reads run on the
//! store's read connections.

use async_trait::async_trait;

use super::connection::ReadFailure;
use super::{to_i64, to_u64, SqliteStore};
use crate::ports::writeback::{WriteIntent, WriteIntentError, WriteIntents};

impl From<ReadFailure> for WriteIntentError {
    fn from(e: ReadFailure) -> Self {
        WriteIntentError::Unavailable(e.0)
    }
}

fn unavailable(e: impl std::fmt::Display) -> WriteIntentError {
    WriteIntentError::Unavailable(e.to_string())
}

/// A row as read, before its mode is checked.
struct Row {
    id: String,
    repo: String,
    path: String,
    mode: String,
    content: String,
    run_id: String,
    token_secret: Option<String>,
    parked_at: i64,
    attempts: i64,
    last_error: String,
}

impl Row {
    fn into_intent(self) -> Result<WriteIntent, WriteIntentError> {
        let mode = self
            .mode
            .parse()
            .map_err(|reason| WriteIntentError::Corrupt {
                id: self.id.clone(),
                reason,
            })?;
        Ok(WriteIntent {
            id: self.id,
            repo: self.repo,
            path: self.path,
            mode,
            content: self.content,
            run_id: self.run_id,
            token_secret: self.token_secret,
            parked_at_ms: to_u64(self.parked_at),
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            last_error: self.last_error,
        })
    }
}

#[async_trait]
impl WriteIntents for SqliteStore {
    async fn park(&self, intent: &WriteIntent) -> Result<(), WriteIntentError> {
        let i = intent.clone();
        self.writer
            .write(move |tx| {
                tx.execute(
                    "INSERT INTO writeback_intents (intent_id, seq, repo, path, mode, content, \
                     run_id, token_secret, parked_at, attempts, last_error) \
                     VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM writeback_intents), \
                     ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                     ON CONFLICT (intent_id) DO UPDATE SET attempts = attempts + 1, \
                     last_error = excluded.last_error",
                    rusqlite::params![
                        i.id,
                        i.repo,
                        i.path,
                        i.mode.as_str(),
                        i.content,
                        i.run_id,
                        i.token_secret,
                        to_i64(i.parked_at_ms),
                        i64::from(i.attempts.max(1)),
                        i.last_error
                    ],
                )?;
                Ok(())
            })
            .await
            .map_err(unavailable)
    }

    async fn parked(&self) -> Result<Vec<WriteIntent>, WriteIntentError> {
        let rows: Vec<Row> = self
            .read(|c| {
                let mut stmt = c
                    .prepare(
                        "SELECT intent_id, repo, path, mode, content, run_id, token_secret, \
                         parked_at, attempts, last_error FROM writeback_intents ORDER BY seq",
                    )
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map([], |r| {
                        Ok(Row {
                            id: r.get(0)?,
                            repo: r.get(1)?,
                            path: r.get(2)?,
                            mode: r.get(3)?,
                            content: r.get(4)?,
                            run_id: r.get(5)?,
                            token_secret: r.get(6)?,
                            parked_at: r.get(7)?,
                            attempts: r.get(8)?,
                            last_error: r.get(9)?,
                        })
                    })
                    .map_err(unavailable)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(unavailable)
            })
            .await?;
        rows.into_iter().map(Row::into_intent).collect()
    }

    async fn record_attempt(&self, id: &str, error: &str) -> Result<bool, WriteIntentError> {
        let (id, error) = (id.to_string(), error.to_string());
        self.writer
            .write(move |tx| {
                let n = tx.execute(
                    "UPDATE writeback_intents SET attempts = attempts + 1, last_error = ?2 \
                     WHERE intent_id = ?1",
                    rusqlite::params![id, error],
                )?;
                Ok(n == 1)
            })
            .await
            .map_err(unavailable)
    }

    async fn resolve(&self, id: &str) -> Result<bool, WriteIntentError> {
        let id = id.to_string();
        self.writer
            .write(move |tx| {
                let n = tx.execute("DELETE FROM writeback_intents WHERE intent_id = ?1", [&id])?;
                Ok(n == 1)
            })
            .await
            .map_err(unavailable)
    }
}
