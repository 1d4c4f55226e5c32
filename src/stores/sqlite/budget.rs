//! The budget ledger on SQLite: spend per caller and minute in
//! `budget_spend` (a commit adds to its minute's row), limits per caller in
//! `budget_limits`, and default limits for everyone else held in memory
//! (they come from the host's configuration, not from the file).
//!
//! Spend persists, so a caller's limit holds across processes: a new
//! process loads what the caller spent within the window before it admits
//! the caller's first run.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use super::{to_i64, to_u64, SqliteStore};
use crate::ports::budget::{BudgetLedger, BudgetLedgerError, BudgetLimits, Spend};
use crate::ports::run::unix_ms;

/// The bucket width of committed spend.
const MINUTE_MS: u64 = 60_000;

fn unavailable(e: impl std::fmt::Display) -> BudgetLedgerError {
    BudgetLedgerError::Unavailable(e.to_string())
}

impl SqliteStore {
    /// Sets the limits of callers that have no row of their own. Held in
    /// memory for this handle (each process states its defaults).
    pub fn set_default_limits(&self, limits: BudgetLimits) {
        *self
            .default_limits
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = limits;
    }

    /// Writes one caller's limits to the file (they hold for every process).
    pub async fn set_limits(
        &self,
        caller: &str,
        limits: BudgetLimits,
    ) -> Result<(), BudgetLedgerError> {
        let json = serde_json::to_string(&limits).map_err(unavailable)?;
        self.writer
            .set_limits(caller.to_string(), json)
            .await
            .map_err(unavailable)
    }
}

#[async_trait]
impl BudgetLedger for SqliteStore {
    async fn limits(&self, caller: &str) -> Result<BudgetLimits, BudgetLedgerError> {
        let who = caller.to_string();
        let row: Option<String> = self
            .read(move |c| {
                use rusqlite::OptionalExtension;
                c.query_row(
                    "SELECT limits FROM budget_limits WHERE caller = ?1",
                    [who],
                    |r| r.get(0),
                )
                .optional()
                .map_err(unavailable)
            })
            .await?;
        match row {
            Some(json) => serde_json::from_str(&json).map_err(|e| {
                BudgetLedgerError::Unavailable(format!(
                    "the limits of caller `{caller}` do not decode: {e}"
                ))
            }),
            None => Ok(*self
                .default_limits
                .lock()
                .unwrap_or_else(|p| p.into_inner())),
        }
    }

    async fn spent(&self, caller: &str, window: Duration) -> Result<Spend, BudgetLedgerError> {
        let since = unix_ms().saturating_sub(window.as_millis() as u64) / MINUTE_MS;
        let who = caller.to_string();
        // Summed here, saturating: SQLite's SUM fails on an overflow. A
        // value stored as floating point (by an older version, from an
        // absurd usage report) is read back as the integer it rounds to,
        // at most i64::MAX.
        let rows: Vec<[i64; 4]> = self
            .read(move |c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT CAST(tokens AS INTEGER), CAST(cost_micros AS INTEGER), \
                         CAST(runtime_ms AS INTEGER), CAST(runs AS INTEGER) \
                         FROM budget_spend WHERE caller = ?1 AND minute >= ?2",
                    )
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map(rusqlite::params![who, to_i64(since)], |r| {
                        Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?])
                    })
                    .map_err(unavailable)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(unavailable)
            })
            .await?;
        let mut spend = Spend::default();
        for r in rows {
            spend.add(&Spend {
                tokens: to_u64(r[0]),
                cost_micros: to_u64(r[1]),
                runtime_ms: to_u64(r[2]),
                runs: to_u64(r[3]),
            });
        }
        Ok(spend)
    }

    async fn commit(&self, spends: &[(String, Spend)]) -> Result<(), BudgetLedgerError> {
        if spends.is_empty() {
            return Ok(());
        }
        // One row per caller (Postgres refuses an upsert that touches a row
        // twice in one statement), so merge a caller's entries first.
        let mut merged: BTreeMap<&str, Spend> = BTreeMap::new();
        for (caller, s) in spends {
            merged.entry(caller.as_str()).or_default().add(s);
        }
        let minute = to_i64(unix_ms() / MINUTE_MS);
        let spends = merged
            .into_iter()
            .map(|(c, s)| (c.to_string(), s))
            .collect();
        self.writer
            .commit(spends, minute)
            .await
            .map_err(unavailable)
    }

    async fn set_limits(
        &self,
        caller: &str,
        limits: BudgetLimits,
    ) -> Result<(), BudgetLedgerError> {
        SqliteStore::set_limits(self, caller, limits).await
    }

    async fn list_limits(&self) -> Result<Vec<(String, BudgetLimits)>, BudgetLedgerError> {
        let rows: Vec<(String, String)> = self
            .read(|c| {
                let mut stmt = c
                    .prepare("SELECT caller, limits FROM budget_limits ORDER BY caller")
                    .map_err(unavailable)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                    .map_err(unavailable)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(unavailable)
            })
            .await?;
        rows.into_iter()
            .map(|(caller, json)| {
                let limits = serde_json::from_str(&json).map_err(|e| {
                    BudgetLedgerError::Unavailable(format!(
                        "the limits of caller `{caller}` do not decode: {e}"
                    ))
                })?;
                Ok((caller, limits))
            })
            .collect()
    }
}
