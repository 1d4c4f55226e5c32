//! Chat sessions on SQLite (schema version 7): one row per session in
//! `sessions` (its whole [`SessionMeta`] as JSON in `meta`, with the agent,
//! state, caller, times and counts beside it for `SELECT`s by hand and for
//! listing), one row per message in `session_messages`, keyed by
//! `(session_id, seq)`.
//!
//! Every write is one transaction on the store's writer thread: an append
//! checks that its first `seq` follows the history's last, inserts its
//! messages and replaces the metadata, or (a conflict, an unknown session)
//! writes nothing. Reads run on the store's read connections.

use async_trait::async_trait;
use rusqlite::OptionalExtension;

use super::connection::ReadFailure;
use super::{to_i64, SqliteStore};
use crate::ports::session::{SessionMessage, SessionMeta, SessionStore, SessionStoreError};

impl From<ReadFailure> for SessionStoreError {
    fn from(e: ReadFailure) -> Self {
        SessionStoreError::Unavailable(e.0)
    }
}

fn unavailable(e: impl std::fmt::Display) -> SessionStoreError {
    SessionStoreError::Unavailable(e.to_string())
}

/// A session's row: the columns beside `meta`, and `meta` itself.
struct Row {
    id: String,
    agent: String,
    state: &'static str,
    caller_id: Option<String>,
    created_at: i64,
    updated_at: i64,
    prompts: i64,
    messages: i64,
    meta: String,
}

impl Row {
    fn of(meta: &SessionMeta) -> Result<Row, SessionStoreError> {
        Ok(Row {
            id: meta.id.clone(),
            agent: meta.agent.clone(),
            state: meta.state.as_str(),
            caller_id: meta.caller_id.clone(),
            created_at: to_i64(meta.created_at),
            updated_at: to_i64(meta.updated_at),
            prompts: i64::from(meta.prompts),
            messages: i64::from(meta.messages),
            meta: serde_json::to_string(meta).map_err(unavailable)?,
        })
    }

    /// Replaces the session's row; `false` when there is none.
    fn update(&self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<bool> {
        let n = tx.execute(
            "UPDATE sessions SET agent = ?2, state = ?3, caller_id = ?4, created_at = ?5, \
             updated_at = ?6, prompts = ?7, messages = ?8, meta = ?9 WHERE session_id = ?1",
            rusqlite::params![
                self.id,
                self.agent,
                self.state,
                self.caller_id,
                self.created_at,
                self.updated_at,
                self.prompts,
                self.messages,
                self.meta
            ],
        )?;
        Ok(n == 1)
    }
}

fn parse_meta(id: &str, text: &str) -> Result<SessionMeta, SessionStoreError> {
    serde_json::from_str(text)
        .map_err(|e| unavailable(format!("session `{id}`: its metadata does not parse: {e}")))
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create(&self, meta: &SessionMeta) -> Result<(), SessionStoreError> {
        let row = Row::of(meta)?;
        let created = self
            .writer
            .write(move |tx| {
                let n = tx.execute(
                    "INSERT INTO sessions (session_id, agent, state, caller_id, created_at, \
                     updated_at, prompts, messages, meta) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT DO NOTHING",
                    rusqlite::params![
                        row.id,
                        row.agent,
                        row.state,
                        row.caller_id,
                        row.created_at,
                        row.updated_at,
                        row.prompts,
                        row.messages,
                        row.meta
                    ],
                )?;
                Ok(n == 1)
            })
            .await
            .map_err(unavailable)?;
        if created {
            Ok(())
        } else {
            Err(SessionStoreError::Exists(meta.id.clone()))
        }
    }

    async fn get(&self, id: &str) -> Result<Option<SessionMeta>, SessionStoreError> {
        let key = id.to_string();
        let text: Option<String> = self
            .read(move |c| {
                c.query_row(
                    "SELECT meta FROM sessions WHERE session_id = ?1",
                    [&key],
                    |r| r.get(0),
                )
                .optional()
                .map_err(unavailable)
            })
            .await?;
        text.map(|t| parse_meta(id, &t)).transpose()
    }

    async fn update(&self, meta: &SessionMeta) -> Result<(), SessionStoreError> {
        let row = Row::of(meta)?;
        let found = self
            .writer
            .write(move |tx| row.update(tx))
            .await
            .map_err(unavailable)?;
        if found {
            Ok(())
        } else {
            Err(SessionStoreError::NotFound(meta.id.clone()))
        }
    }

    async fn append(
        &self,
        meta: &SessionMeta,
        messages: &[SessionMessage],
    ) -> Result<(), SessionStoreError> {
        let row = Row::of(meta)?;
        let mut rows = Vec::with_capacity(messages.len());
        for m in messages {
            rows.push((
                i64::from(m.seq),
                m.run_id.map(|r| r.to_string()),
                to_i64(m.at_ms),
                m.message.role,
                serde_json::to_string(&m.message).map_err(unavailable)?,
            ));
        }
        let id = meta.id.clone();
        let outcome = self
            .writer
            .write(move |tx| {
                let next: i64 = tx.query_row(
                    "SELECT COALESCE(MAX(seq) + 1, 0) FROM session_messages WHERE session_id = ?1",
                    [&row.id],
                    |r| r.get(0),
                )?;
                if let Some(wrong) = (next..)
                    .zip(&rows)
                    .find(|(expected, m)| m.0 != *expected)
                    .map(|(_, m)| m.0)
                {
                    return Ok(Err(SessionStoreError::Conflict {
                        id: row.id.clone(),
                        seq: u32::try_from(wrong).unwrap_or(u32::MAX),
                    }));
                }
                if !row.update(tx)? {
                    return Ok(Err(SessionStoreError::NotFound(row.id.clone())));
                }
                let mut insert = tx.prepare_cached(
                    "INSERT INTO session_messages (session_id, seq, run_id, at_ms, role, message) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?;
                for (seq, run_id, at_ms, role, message) in &rows {
                    let role = match role {
                        crate::ports::model::Role::System => "system",
                        crate::ports::model::Role::User => "user",
                        crate::ports::model::Role::Assistant => "assistant",
                        crate::ports::model::Role::Tool => "tool",
                    };
                    insert.execute(rusqlite::params![row.id, seq, run_id, at_ms, role, message])?;
                }
                Ok(Ok(()))
            })
            .await
            .map_err(|e| unavailable(format!("session `{id}`: {e}")))?;
        outcome
    }

    async fn messages(&self, id: &str) -> Result<Vec<SessionMessage>, SessionStoreError> {
        let key = id.to_string();
        let rows: Vec<(i64, Option<String>, i64, String)> = self
            .read(move |c| {
                let mut stmt = c
                    .prepare(
                        "SELECT seq, run_id, at_ms, message FROM session_messages \
                         WHERE session_id = ?1 ORDER BY seq",
                    )
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map([&key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .map_err(unavailable)?;
                rows.collect::<Result<_, _>>().map_err(unavailable)
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (seq, run_id, at_ms, message) in rows {
            let bad = |what: String| unavailable(format!("session `{id}` message {seq}: {what}"));
            out.push(SessionMessage {
                seq: u32::try_from(seq).map_err(|e| bad(e.to_string()))?,
                run_id: run_id
                    .map(|r| r.parse())
                    .transpose()
                    .map_err(|e| bad(format!("{e:?}")))?,
                at_ms: u64::try_from(at_ms).unwrap_or(0),
                message: serde_json::from_str(&message).map_err(|e| bad(e.to_string()))?,
            });
        }
        Ok(out)
    }

    async fn list(&self, limit: usize) -> Result<Vec<SessionMeta>, SessionStoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(String, String)> = self
            .read(move |c| {
                let mut stmt = c
                    .prepare(
                        "SELECT session_id, meta FROM sessions \
                         ORDER BY updated_at DESC, session_id DESC LIMIT ?1",
                    )
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map([limit], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(unavailable)?;
                rows.collect::<Result<_, _>>().map_err(unavailable)
            })
            .await?;
        rows.iter().map(|(id, meta)| parse_meta(id, meta)).collect()
    }

    async fn remove(&self, id: &str) -> Result<bool, SessionStoreError> {
        let key = id.to_string();
        self.writer
            .write(move |tx| {
                tx.execute("DELETE FROM session_messages WHERE session_id = ?1", [&key])?;
                let n = tx.execute("DELETE FROM sessions WHERE session_id = ?1", [&key])?;
                Ok(n == 1)
            })
            .await
            .map_err(unavailable)
    }
}
