//! `SessionStore` on PostgreSQL (schema version 4), as on SQLite: one row
//! per session in `sessions` (its whole [`SessionMeta`] as JSON in `meta`,
//! the agent, state, caller, times and counts beside it), one row per
//! message in `session_messages`, keyed by `(session_id, seq)`.
//!
//! An append is one transaction that locks its session's row first
//! (`SELECT … FOR UPDATE`): appends to one session, from any host, take
//! turns, and each checks that its first `seq` follows the history's last
//! before it inserts its messages and replaces the metadata — or, a
//! conflict or an unknown session, writes nothing.

use async_trait::async_trait;

use super::{to_i64, to_u64, Cause, PostgresStore};
use crate::ports::model::Role;
use crate::ports::session::{SessionMessage, SessionMeta, SessionStore, SessionStoreError};

fn unavailable(e: impl Into<Cause>) -> SessionStoreError {
    SessionStoreError::Unavailable(crate::secrets::redact_string(e.into().0))
}

fn parse_meta(id: &str, text: &str) -> Result<SessionMeta, SessionStoreError> {
    serde_json::from_str(text)
        .map_err(|e| unavailable(format!("session `{id}`: its metadata does not parse: {e}")))
}

/// A role's name, as the `role` column holds it.
fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

/// A session's row: the columns beside `meta`, and `meta` itself.
struct Row {
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

    /// Replaces session `id`'s row; `false` when there is none.
    async fn update<C: tokio_postgres::GenericClient + Sync>(
        &self,
        client: &C,
        id: &str,
    ) -> Result<bool, tokio_postgres::Error> {
        let n = client
            .execute(
                "UPDATE sessions SET agent = $2, state = $3, caller_id = $4, created_at = $5, \
                 updated_at = $6, prompts = $7, messages = $8, meta = $9 WHERE session_id = $1",
                &[
                    &id,
                    &self.agent,
                    &self.state,
                    &self.caller_id,
                    &self.created_at,
                    &self.updated_at,
                    &self.prompts,
                    &self.messages,
                    &self.meta,
                ],
            )
            .await?;
        Ok(n == 1)
    }
}

#[async_trait]
impl SessionStore for PostgresStore {
    async fn create(&self, meta: &SessionMeta) -> Result<(), SessionStoreError> {
        let row = Row::of(meta)?;
        let client = self.client().await.map_err(unavailable)?;
        let n = client
            .execute(
                "INSERT INTO sessions (session_id, agent, state, caller_id, created_at, \
                 updated_at, prompts, messages, meta) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
                &[
                    &meta.id,
                    &row.agent,
                    &row.state,
                    &row.caller_id,
                    &row.created_at,
                    &row.updated_at,
                    &row.prompts,
                    &row.messages,
                    &row.meta,
                ],
            )
            .await
            .map_err(unavailable)?;
        if n == 1 {
            Ok(())
        } else {
            Err(SessionStoreError::Exists(meta.id.clone()))
        }
    }

    async fn get(&self, id: &str) -> Result<Option<SessionMeta>, SessionStoreError> {
        let client = self.client().await.map_err(unavailable)?;
        let row = client
            .query_opt("SELECT meta FROM sessions WHERE session_id = $1", &[&id])
            .await
            .map_err(unavailable)?;
        row.map(|r| parse_meta(id, r.get(0))).transpose()
    }

    async fn update(&self, meta: &SessionMeta) -> Result<(), SessionStoreError> {
        let row = Row::of(meta)?;
        let client = self.client().await.map_err(unavailable)?;
        if row.update(&**client, &meta.id).await.map_err(unavailable)? {
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
        let id = meta.id.as_str();
        let (mut seq, mut run_id, mut at_ms, mut role, mut body) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for m in messages {
            seq.push(i32::try_from(m.seq).unwrap_or(i32::MAX));
            run_id.push(m.run_id.map(|r| r.to_string()));
            at_ms.push(to_i64(m.at_ms));
            role.push(role_name(m.message.role));
            body.push(serde_json::to_string(&m.message).map_err(unavailable)?);
        }
        let failed =
            |e: tokio_postgres::Error| unavailable(format!("session `{id}`: {}", Cause::from(e).0));
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(failed)?;
        // Locked: another append to this session waits for this one.
        let found = tx
            .query_opt(
                "SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE",
                &[&id],
            )
            .await
            .map_err(failed)?;
        if found.is_none() {
            return Err(SessionStoreError::NotFound(meta.id.clone()));
        }
        let next: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(seq) + 1, 0)::int8 FROM session_messages \
                 WHERE session_id = $1",
                &[&id],
            )
            .await
            .map_err(failed)?
            .get(0);
        // Checked before anything changes: all or nothing.
        if let Some((_, m)) = (next..)
            .zip(messages)
            .find(|(expected, m)| i64::from(m.seq) != *expected)
        {
            return Err(SessionStoreError::Conflict {
                id: meta.id.clone(),
                seq: m.seq,
            });
        }
        row.update(&*tx, id).await.map_err(failed)?;
        if !messages.is_empty() {
            tx.execute(
                "INSERT INTO session_messages (session_id, seq, run_id, at_ms, role, message) \
                 SELECT $1, * FROM UNNEST($2::int4[], $3::text[], $4::int8[], $5::text[], \
                 $6::text[])",
                &[&id, &seq, &run_id, &at_ms, &role, &body],
            )
            .await
            .map_err(failed)?;
        }
        tx.commit().await.map_err(failed)
    }

    async fn messages(&self, id: &str) -> Result<Vec<SessionMessage>, SessionStoreError> {
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT seq, run_id, at_ms, message FROM session_messages \
                 WHERE session_id = $1 ORDER BY seq",
                &[&id],
            )
            .await
            .map_err(unavailable)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let seq: i32 = r.get(0);
            let bad = |what: String| unavailable(format!("session `{id}` message {seq}: {what}"));
            out.push(SessionMessage {
                seq: u32::try_from(seq).map_err(|e| bad(e.to_string()))?,
                run_id: r
                    .get::<_, Option<&str>>(1)
                    .map(|r| r.parse())
                    .transpose()
                    .map_err(|e| bad(format!("{e:?}")))?,
                at_ms: to_u64(r.get(2)),
                message: serde_json::from_str(r.get(3)).map_err(|e| bad(e.to_string()))?,
            });
        }
        Ok(out)
    }

    async fn list(&self, limit: usize) -> Result<Vec<SessionMeta>, SessionStoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT session_id, meta FROM sessions \
                 ORDER BY updated_at DESC, session_id DESC LIMIT $1",
                &[&limit],
            )
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|r| parse_meta(r.get(0), r.get(1)))
            .collect()
    }

    async fn remove(&self, id: &str) -> Result<bool, SessionStoreError> {
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        tx.execute("DELETE FROM session_messages WHERE session_id = $1", &[&id])
            .await
            .map_err(unavailable)?;
        let n = tx
            .execute("DELETE FROM sessions WHERE session_id = $1", &[&id])
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(n == 1)
    }
}
