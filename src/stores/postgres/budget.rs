//! `BudgetLedger` on PostgreSQL: per-caller limits and spend by minute,
//! shared by every host on the database.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use super::{to_i64, to_u64, Cause, PostgresStore};
use crate::ports::budget::{BudgetLedger, BudgetLedgerError, BudgetLimits, Spend};
use crate::ports::run::unix_ms;

const MINUTE_MS: u64 = 60_000;

fn unavailable(e: impl Into<Cause>) -> BudgetLedgerError {
    BudgetLedgerError::Unavailable(crate::secrets::redact_string(e.into().0))
}

fn decode(caller: &str, json: &str) -> Result<BudgetLimits, BudgetLedgerError> {
    serde_json::from_str(json).map_err(|e| {
        BudgetLedgerError::Unavailable(format!(
            "the limits of caller `{caller}` do not decode: {e}"
        ))
    })
}

/// `budget_spend.COL + excluded.COL`, stopping at the largest BIGINT.
macro_rules! saturating_sum {
    ($col:literal) => {
        concat!(
            $col,
            " = LEAST(budget_spend.",
            $col,
            "::numeric + EXCLUDED.",
            $col,
            ", 9223372036854775807)::bigint"
        )
    };
}

impl PostgresStore {
    /// The limits of a caller that has none of its own.
    pub fn set_default_limits(&self, limits: BudgetLimits) {
        *self
            .default_limits
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = limits;
    }
}

#[async_trait]
impl BudgetLedger for PostgresStore {
    async fn limits(&self, caller: &str) -> Result<BudgetLimits, BudgetLedgerError> {
        let client = self.client().await.map_err(unavailable)?;
        let row = client
            .query_opt(
                "SELECT limits FROM budget_limits WHERE caller = $1",
                &[&caller],
            )
            .await
            .map_err(unavailable)?;
        match row {
            Some(row) => decode(caller, row.get(0)),
            None => Ok(*self
                .default_limits
                .lock()
                .unwrap_or_else(|p| p.into_inner())),
        }
    }

    async fn spent(&self, caller: &str, window: Duration) -> Result<Spend, BudgetLedgerError> {
        let since = to_i64(unix_ms().saturating_sub(window.as_millis() as u64) / MINUTE_MS);
        let client = self.client().await.map_err(unavailable)?;
        // Summed as numeric, so a sum past the largest BIGINT saturates
        // instead of failing.
        let row = client
            .query_one(
                "SELECT LEAST(COALESCE(SUM(tokens), 0), 9223372036854775807)::bigint, \
                 LEAST(COALESCE(SUM(cost_micros), 0), 9223372036854775807)::bigint, \
                 LEAST(COALESCE(SUM(runtime_ms), 0), 9223372036854775807)::bigint, \
                 LEAST(COALESCE(SUM(runs), 0), 9223372036854775807)::bigint \
                 FROM budget_spend WHERE caller = $1 AND minute >= $2",
                &[&caller, &since],
            )
            .await
            .map_err(unavailable)?;
        Ok(Spend {
            tokens: to_u64(row.get(0)),
            cost_micros: to_u64(row.get(1)),
            runtime_ms: to_u64(row.get(2)),
            runs: to_u64(row.get(3)),
        })
    }

    async fn commit(&self, spends: &[(String, Spend)]) -> Result<(), BudgetLedgerError> {
        if spends.is_empty() {
            return Ok(());
        }
        let mut merged: BTreeMap<&str, Spend> = BTreeMap::new();
        for (caller, s) in spends {
            merged.entry(caller.as_str()).or_default().add(s);
        }
        let minute = to_i64(unix_ms() / MINUTE_MS);
        let callers: Vec<&str> = merged.keys().copied().collect();
        let col =
            |f: fn(&Spend) -> u64| -> Vec<i64> { merged.values().map(|s| to_i64(f(s))).collect() };
        let (tokens, cost, runtime, runs) = (
            col(|s| s.tokens),
            col(|s| s.cost_micros),
            col(|s| s.runtime_ms),
            col(|s| s.runs),
        );
        let client = self.client().await.map_err(unavailable)?;
        client
            .execute(
                concat!(
                    "INSERT INTO budget_spend (caller, minute, tokens, cost_micros, runtime_ms, runs) \
                     SELECT c, $2, t, m, r, n FROM UNNEST($1::text[], $3::int8[], $4::int8[], \
                     $5::int8[], $6::int8[]) AS s(c, t, m, r, n) \
                     ON CONFLICT (caller, minute) DO UPDATE SET ",
                    saturating_sum!("tokens"),
                    ", ",
                    saturating_sum!("cost_micros"),
                    ", ",
                    saturating_sum!("runtime_ms"),
                    ", ",
                    saturating_sum!("runs")
                ),
                &[&callers, &minute, &tokens, &cost, &runtime, &runs],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn set_limits(
        &self,
        caller: &str,
        limits: BudgetLimits,
    ) -> Result<(), BudgetLedgerError> {
        let json = serde_json::to_string(&limits).map_err(unavailable)?;
        let client = self.client().await.map_err(unavailable)?;
        client
            .execute(
                "INSERT INTO budget_limits (caller, limits) VALUES ($1, $2) \
                 ON CONFLICT (caller) DO UPDATE SET limits = EXCLUDED.limits",
                &[&caller, &json],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn list_limits(&self) -> Result<Vec<(String, BudgetLimits)>, BudgetLedgerError> {
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT caller, limits FROM budget_limits ORDER BY caller",
                &[],
            )
            .await
            .map_err(unavailable)?;
        rows.iter()
            .map(|r| {
                let caller: String = r.get(0);
                let limits = decode(&caller, r.get(1))?;
                Ok((caller, limits))
            })
            .collect()
    }
}
