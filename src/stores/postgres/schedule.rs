//! The scheduler's state on PostgreSQL (schema version 6): one row per
//! schedule in `schedules`, keyed by name. A batch of states is one
//! transaction, each row replaced whole (as on SQLite).

use async_trait::async_trait;

use super::{to_i64, to_u64, Cause, PostgresStore};
use crate::ports::schedule::{Pause, ScheduleState, ScheduleStore, ScheduleStoreError};

fn unavailable(e: impl Into<Cause>) -> ScheduleStoreError {
    ScheduleStoreError::Unavailable(crate::secrets::redact_string(e.into().0))
}

const COLUMNS: &str = "name, config_hash, next_fire_ms, last_fire_ms, last_outcome, \
     last_reason, last_run_id, streak, streak_reason, paused_why, paused_at_ms, paused_auto, \
     spent_day, spent_tokens, spent_cost_micros, updated_at_ms";

fn from_row(r: &tokio_postgres::Row) -> ScheduleState {
    let paused = r.get::<_, Option<String>>(9).map(|why| Pause {
        why,
        at_ms: r.get::<_, Option<i64>>(10).map_or(0, to_u64),
        auto: r.get(11),
    });
    ScheduleState {
        name: r.get(0),
        config_hash: r.get(1),
        next_fire_ms: r.get::<_, Option<i64>>(2).map(to_u64),
        last_fire_ms: r.get::<_, Option<i64>>(3).map(to_u64),
        last_outcome: r.get(4),
        last_reason: r.get(5),
        last_run_id: r.get(6),
        streak: u32::try_from(r.get::<_, i64>(7).max(0)).unwrap_or(u32::MAX),
        streak_reason: r.get(8),
        paused,
        spent_day: r.get(12),
        spent_tokens: to_u64(r.get(13)),
        spent_cost_micros: to_u64(r.get(14)),
        updated_at_ms: to_u64(r.get(15)),
    }
}

#[async_trait]
impl ScheduleStore for PostgresStore {
    async fn load_all(&self) -> Result<Vec<ScheduleState>, ScheduleStoreError> {
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                &format!("SELECT {COLUMNS} FROM schedules ORDER BY name"),
                &[],
            )
            .await
            .map_err(unavailable)?;
        Ok(rows.iter().map(from_row).collect())
    }

    async fn get(&self, name: &str) -> Result<Option<ScheduleState>, ScheduleStoreError> {
        let client = self.client().await.map_err(unavailable)?;
        let row = client
            .query_opt(
                &format!("SELECT {COLUMNS} FROM schedules WHERE name = $1"),
                &[&name],
            )
            .await
            .map_err(unavailable)?;
        Ok(row.as_ref().map(from_row))
    }

    async fn put_all(&self, states: &[ScheduleState]) -> Result<(), ScheduleStoreError> {
        if states.is_empty() {
            return Ok(());
        }
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        let stmt = tx
            .prepare(&format!(
                "INSERT INTO schedules ({COLUMNS}) VALUES \
                 ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
                 ON CONFLICT (name) DO UPDATE SET config_hash = EXCLUDED.config_hash, \
                 next_fire_ms = EXCLUDED.next_fire_ms, last_fire_ms = EXCLUDED.last_fire_ms, \
                 last_outcome = EXCLUDED.last_outcome, last_reason = EXCLUDED.last_reason, \
                 last_run_id = EXCLUDED.last_run_id, streak = EXCLUDED.streak, \
                 streak_reason = EXCLUDED.streak_reason, paused_why = EXCLUDED.paused_why, \
                 paused_at_ms = EXCLUDED.paused_at_ms, paused_auto = EXCLUDED.paused_auto, \
                 spent_day = EXCLUDED.spent_day, spent_tokens = EXCLUDED.spent_tokens, \
                 spent_cost_micros = EXCLUDED.spent_cost_micros, \
                 updated_at_ms = EXCLUDED.updated_at_ms"
            ))
            .await
            .map_err(unavailable)?;
        for s in states {
            tx.execute(
                &stmt,
                &[
                    &s.name,
                    &s.config_hash,
                    &s.next_fire_ms.map(to_i64),
                    &s.last_fire_ms.map(to_i64),
                    &s.last_outcome,
                    &s.last_reason,
                    &s.last_run_id,
                    &i64::from(s.streak),
                    &s.streak_reason,
                    &s.paused.as_ref().map(|p| p.why.as_str()),
                    &s.paused.as_ref().map(|p| to_i64(p.at_ms)),
                    &s.paused.as_ref().is_some_and(|p| p.auto),
                    &s.spent_day,
                    &to_i64(s.spent_tokens),
                    &to_i64(s.spent_cost_micros),
                    &to_i64(s.updated_at_ms),
                ],
            )
            .await
            .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)
    }

    async fn remove(&self, names: &[String]) -> Result<(), ScheduleStoreError> {
        if names.is_empty() {
            return Ok(());
        }
        let client = self.client().await.map_err(unavailable)?;
        client
            .execute("DELETE FROM schedules WHERE name = ANY($1)", &[&names])
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
