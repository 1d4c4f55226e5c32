//! The scheduler's state on SQLite (schema version 16): one row per
//! schedule in `schedules`, keyed by name. A batch of states is one
//! transaction on the store's writer thread (each row replaced whole);
//! reads run on the store's read connections.

use async_trait::async_trait;
use rusqlite::OptionalExtension;

use super::connection::ReadFailure;
use super::{to_i64, to_u64, SqliteStore};
use crate::ports::schedule::{Pause, ScheduleState, ScheduleStore, ScheduleStoreError};

impl From<ReadFailure> for ScheduleStoreError {
    fn from(e: ReadFailure) -> Self {
        ScheduleStoreError::Unavailable(e.0)
    }
}

fn unavailable(e: impl std::fmt::Display) -> ScheduleStoreError {
    ScheduleStoreError::Unavailable(e.to_string())
}

const COLUMNS: &str = "name, config_hash, next_fire_ms, last_fire_ms, last_outcome, \
     last_reason, last_run_id, streak, streak_reason, paused_why, paused_at_ms, paused_auto, \
     spent_day, spent_tokens, spent_cost_micros, updated_at_ms";

fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(to_i64)
}

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ScheduleState> {
    let why: Option<String> = r.get(9)?;
    let paused = why.map(|why| -> rusqlite::Result<Pause> {
        Ok(Pause {
            why,
            at_ms: r.get::<_, Option<i64>>(10)?.map_or(0, to_u64),
            auto: r.get::<_, i64>(11)? != 0,
        })
    });
    Ok(ScheduleState {
        name: r.get(0)?,
        config_hash: r.get(1)?,
        next_fire_ms: r.get::<_, Option<i64>>(2)?.map(to_u64),
        last_fire_ms: r.get::<_, Option<i64>>(3)?.map(to_u64),
        last_outcome: r.get(4)?,
        last_reason: r.get(5)?,
        last_run_id: r.get(6)?,
        streak: u32::try_from(r.get::<_, i64>(7)?.max(0)).unwrap_or(u32::MAX),
        streak_reason: r.get(8)?,
        paused: paused.transpose()?,
        spent_day: r.get(12)?,
        spent_tokens: to_u64(r.get(13)?),
        spent_cost_micros: to_u64(r.get(14)?),
        updated_at_ms: to_u64(r.get(15)?),
    })
}

#[async_trait]
impl ScheduleStore for SqliteStore {
    async fn load_all(&self) -> Result<Vec<ScheduleState>, ScheduleStoreError> {
        self.read(|c| {
            let mut stmt = c
                .prepare(&format!("SELECT {COLUMNS} FROM schedules ORDER BY name"))
                .map_err(unavailable)?;
            let rows = stmt.query_map([], from_row).map_err(unavailable)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(unavailable)
        })
        .await
    }

    async fn get(&self, name: &str) -> Result<Option<ScheduleState>, ScheduleStoreError> {
        let key = name.to_string();
        self.read(move |c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM schedules WHERE name = ?1"),
                [key],
                from_row,
            )
            .optional()
            .map_err(unavailable)
        })
        .await
    }

    async fn put_all(&self, states: &[ScheduleState]) -> Result<(), ScheduleStoreError> {
        if states.is_empty() {
            return Ok(());
        }
        let states = states.to_vec();
        self.writer
            .write(move |tx| {
                let mut stmt = tx.prepare_cached(&format!(
                    "INSERT OR REPLACE INTO schedules ({COLUMNS}) VALUES \
                     (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
                ))?;
                for s in &states {
                    stmt.execute(rusqlite::params![
                        s.name,
                        s.config_hash,
                        opt_i64(s.next_fire_ms),
                        opt_i64(s.last_fire_ms),
                        s.last_outcome,
                        s.last_reason,
                        s.last_run_id,
                        i64::from(s.streak),
                        s.streak_reason,
                        s.paused.as_ref().map(|p| p.why.as_str()),
                        s.paused.as_ref().map(|p| to_i64(p.at_ms)),
                        i64::from(s.paused.as_ref().is_some_and(|p| p.auto)),
                        s.spent_day,
                        to_i64(s.spent_tokens),
                        to_i64(s.spent_cost_micros),
                        to_i64(s.updated_at_ms),
                    ])?;
                }
                Ok(())
            })
            .await
            .map_err(unavailable)
    }

    async fn remove(&self, names: &[String]) -> Result<(), ScheduleStoreError> {
        if names.is_empty() {
            return Ok(());
        }
        let names = names.to_vec();
        self.writer
            .write(move |tx| {
                let mut stmt = tx.prepare_cached("DELETE FROM schedules WHERE name = ?1")?;
                for n in &names {
                    stmt.execute([n])?;
                }
                Ok(())
            })
            .await
            .map_err(unavailable)
    }
}
