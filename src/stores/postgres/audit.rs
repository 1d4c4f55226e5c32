//! `AuditStore` and `RunIndex` on PostgreSQL (see the module doc for the
//! layout).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use tokio_postgres::types::ToSql;

use super::outbox::OutboxRows;
use super::{to_i64, to_u64, Cause, PostgresStore};
use crate::ports::audit::{
    AuditEntry, AuditRecord, AuditStats, AuditStore, AuditStoreError, RunFilter, RunIndex,
    RunSummary,
};
use crate::ports::checkpoint::EncodedJson;
use crate::ports::outbox::OutboxStore;
use crate::ports::retention::{PruneReport, PrunedCount, Retention};
use crate::ports::run::{RunId, RunResult, RunStatus};

/// A record's `kind` column.
const KIND_START: i16 = 0;
const KIND_EVENT: i16 = 1;
const KIND_END: i16 = 2;

/// A manifest unused since this long before the oldest kept run's start is
/// named by no record (a batch refreshes `used_ms` at most once a minute).
const MANIFEST_MARGIN_MS: i64 = 120_000;

fn unavailable(e: impl Into<Cause>) -> AuditStoreError {
    AuditStoreError::Unavailable(crate::secrets::redact_string(e.into().0))
}

/// A snake_case serde name back to its enum (`"killed"` → `Killed`).
fn from_name<T: serde::de::DeserializeOwned>(name: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}

fn parse_id(s: &str) -> Result<RunId, AuditStoreError> {
    s.parse()
        .map_err(|_| AuditStoreError::Unavailable(format!("bad run id `{s}` in the database")))
}

/// The columns of `runs` a summary is read from, in [`summary`]'s order.
const SUMMARY_COLUMNS: &str = "run_id, agent, caller_id, parent_run_id, root_run_id, status, \
     kill_reason, error_kind, started_at, finished_at, forked_from";

fn summary(row: &tokio_postgres::Row) -> Result<RunSummary, AuditStoreError> {
    let id = |i: usize| -> Result<Option<RunId>, AuditStoreError> {
        row.get::<_, Option<String>>(i)
            .map(|s| parse_id(&s))
            .transpose()
    };
    let status: String = row.get(5);
    Ok(RunSummary {
        run_id: parse_id(&row.get::<_, String>(0))?,
        agent: row.get(1),
        caller_id: row.get(2),
        parent_run_id: id(3)?,
        root_run_id: id(4)?,
        status: from_name(&status).ok_or_else(|| {
            AuditStoreError::Unavailable(format!("unknown status `{status}` in the database"))
        })?,
        kill_reason: row.get::<_, Option<String>>(6).and_then(|k| from_name(&k)),
        error_kind: row.get(7),
        started_at: to_u64(row.get(8)),
        finished_at: to_u64(row.get(9)),
        forked_from: row
            .get::<_, Option<String>>(10)
            .and_then(|f| serde_json::from_str(&f).ok()),
    })
}

/// A batch, column by column, ready to bind as arrays.
#[derive(Default)]
struct Columns {
    run_id: Vec<String>,
    seq: Vec<i32>,
    at_ms: Vec<i64>,
    kind: Vec<i16>,
    record: Vec<String>,
}

/// The finished runs of a batch, column by column.
#[derive(Default)]
struct Finished {
    run_id: Vec<String>,
    agent: Vec<String>,
    caller_id: Vec<Option<String>>,
    parent_run_id: Vec<Option<String>>,
    root_run_id: Vec<Option<String>>,
    forked_from: Vec<Option<String>>,
    status: Vec<String>,
    kill_reason: Vec<Option<String>>,
    error_kind: Vec<Option<String>>,
    started_at: Vec<i64>,
    finished_at: Vec<i64>,
}

impl Finished {
    fn push(&mut self, r: &RunResult) {
        self.run_id.push(r.run_id.to_string());
        self.agent.push(r.agent.clone());
        self.caller_id.push(r.caller_id.clone());
        self.parent_run_id
            .push(r.parent_run_id.map(|p| p.to_string()));
        self.root_run_id.push(r.root_run_id.map(|p| p.to_string()));
        self.forked_from
            .push(r.forked_from.and_then(|f| serde_json::to_string(&f).ok()));
        self.status.push(r.status.as_str().to_string());
        self.kill_reason
            .push(r.kill_reason.map(|k| k.as_str().to_string()));
        self.error_kind.push(r.error_kind.clone());
        self.started_at.push(to_i64(r.started_at));
        self.finished_at.push(to_i64(r.finished_at));
    }
}

/// The manifests a batch's `run.start` records name: id and JSON, each
/// once (the records name them by id).
type Manifests = Vec<(i64, String)>;

/// A batch encoded: its rows, its finished runs, its manifests, its
/// publish intents.
type Encoded = (Columns, Finished, Manifests, OutboxRows);

/// Encodes a batch. Its [`AuditEntry::Publish`] records are not records
/// of the log: their intents go to the outbox, in the batch's transaction.
fn encode(batch: &[AuditRecord]) -> Result<Encoded, AuditStoreError> {
    let mut rows = Columns::default();
    let mut finished = Finished::default();
    let mut manifests: Manifests = Vec::new();
    let mut outbox = OutboxRows::default();
    for r in batch {
        if matches!(r.entry, AuditEntry::Publish(_)) {
            outbox.push(r)?;
            continue;
        }
        let bad = |e: serde_json::Error| {
            AuditStoreError::Unavailable(format!(
                "record {}/{} does not encode: {e}",
                r.run_id, r.seq
            ))
        };
        let (kind, json) = match &r.entry {
            AuditEntry::RunStarted(info) => {
                let mut named = r.clone();
                if let (Some(m), AuditEntry::RunStarted(info)) = (&info.manifest, &mut named.entry)
                {
                    if let Some(json) = &m.json {
                        let id = m.id as i64;
                        if !manifests.iter().any(|(i, _)| *i == id) {
                            manifests.push((id, json.text().to_string()));
                        }
                    }
                    if let Some(m) = &mut info.manifest {
                        m.json = None;
                    }
                }
                (KIND_START, serde_json::to_string(&named).map_err(bad)?)
            }
            AuditEntry::Event(_) => (KIND_EVENT, serde_json::to_string(r).map_err(bad)?),
            AuditEntry::Publish(_) => continue,
            AuditEntry::Terminal(res) => {
                finished.push(res);
                (KIND_END, serde_json::to_string(r).map_err(bad)?)
            }
        };
        rows.run_id.push(r.run_id.to_string());
        rows.seq.push(i32::try_from(r.seq).unwrap_or(i32::MAX));
        rows.at_ms.push(to_i64(r.at_ms));
        rows.kind.push(kind);
        rows.record.push(json);
    }
    Ok((rows, finished, manifests, outbox))
}

fn decode(json: &str) -> Result<AuditRecord, AuditStoreError> {
    serde_json::from_str(json)
        .map_err(|e| AuditStoreError::Unavailable(format!("a stored record does not decode: {e}")))
}

#[async_trait]
impl AuditStore for PostgresStore {
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (rows, finished, manifests, outbox) = encode(batch)?;
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        if !manifests.is_empty() {
            let now = to_i64(crate::ports::run::unix_ms());
            let ids: Vec<i64> = manifests.iter().map(|(i, _)| *i).collect();
            let bodies: Vec<&str> = manifests.iter().map(|(_, b)| b.as_str()).collect();
            tx.execute(
                "INSERT INTO manifests (id, body, used_ms) \
                 SELECT id, body, $3 FROM UNNEST($1::int8[], $2::text[]) AS m(id, body) \
                 ON CONFLICT (id) DO UPDATE SET used_ms = EXCLUDED.used_ms \
                 WHERE manifests.used_ms < EXCLUDED.used_ms - 60000",
                &[&ids, &bodies, &now],
            )
            .await
            .map_err(unavailable)?;
        }
        let inserted = tx
            .execute(
                "INSERT INTO audit_records (run_id, seq, at_ms, kind, record) \
                 SELECT * FROM UNNEST($1::text[], $2::int4[], $3::int8[], $4::int2[], $5::text[]) \
                 ON CONFLICT DO NOTHING",
                &[
                    &rows.run_id,
                    &rows.seq,
                    &rows.at_ms,
                    &rows.kind,
                    &rows.record,
                ],
            )
            .await
            .map_err(unavailable)?;
        let mut terminal = 0;
        if !finished.run_id.is_empty() {
            let f = &finished;
            terminal = tx
                .execute(
                    "INSERT INTO runs (run_id, agent, caller_id, parent_run_id, root_run_id, \
                     forked_from, status, kill_reason, error_kind, started_at, finished_at) \
                     SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], \
                     $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::int8[], \
                     $11::int8[]) ON CONFLICT (run_id) DO NOTHING",
                    &[
                        &f.run_id,
                        &f.agent,
                        &f.caller_id,
                        &f.parent_run_id,
                        &f.root_run_id,
                        &f.forked_from,
                        &f.status,
                        &f.kill_reason,
                        &f.error_kind,
                        &f.started_at,
                        &f.finished_at,
                    ],
                )
                .await
                .map_err(unavailable)?;
        }
        if !outbox.is_empty() {
            // A run's intents are on file exactly when its terminal
            // record is; one on file already is left as it stands.
            super::outbox::insert(&tx, &outbox)
                .await
                .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        self.count(inserted, terminal);
        Ok(())
    }

    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        let client = self.client().await.map_err(unavailable)?;
        // Kind 3: publish records schema version 5 kept with the log.
        let rows = client
            .query(
                "SELECT record FROM audit_records WHERE run_id = $1 AND kind <> 3 ORDER BY seq",
                &[&run_id.to_string()],
            )
            .await
            .map_err(unavailable)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut record = decode(row.get(0))?;
            if let AuditEntry::RunStarted(info) = &mut record.entry {
                if let Some(m) = info.manifest.as_mut().filter(|m| m.json.is_none()) {
                    let body = client
                        .query_opt(
                            "SELECT body FROM manifests WHERE id = $1",
                            &[&(m.id as i64)],
                        )
                        .await
                        .map_err(unavailable)?;
                    m.json = body.and_then(|b| EncodedJson::from_text(b.get(0)).ok());
                }
            }
            out.push(record);
        }
        Ok(out)
    }

    async fn stats(&self) -> Result<AuditStats, AuditStoreError> {
        Ok(AuditStats {
            records: self.records.load(Ordering::Relaxed),
            terminal_records: self.terminal_records.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            ..AuditStats::default()
        })
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunId>, AuditStoreError> {
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT a.run_id FROM audit_records a WHERE a.kind = 0 \
                 AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = a.run_id) \
                 ORDER BY a.run_id",
                &[],
            )
            .await
            .map_err(unavailable)?;
        rows.iter().map(|r| parse_id(r.get(0))).collect()
    }

    async fn prune(
        &self,
        retention: &Retention,
        now_ms: u64,
        batch: usize,
        dry_run: bool,
    ) -> Result<PruneReport, AuditStoreError> {
        if retention.max_bytes.is_some() {
            return Err(AuditStoreError::Unavailable(
                "retention max_bytes is not supported on PostgreSQL (the server manages its \
                 files): use max_age or max_runs"
                    .into(),
            ));
        }
        let mut report = PruneReport {
            dry_run,
            ..PruneReport::default()
        };
        let limit = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut client = self.client().await.map_err(unavailable)?;
        // The oldest runs past either bound, oldest first, at most `batch`.
        let mut chosen: BTreeMap<String, (String, String)> = BTreeMap::new();
        if let Some(age) = retention.max_age {
            let before = to_i64(now_ms.saturating_sub(age.as_millis() as u64));
            for row in client
                .query(
                    "SELECT run_id, agent, status FROM runs WHERE finished_at < $1 \
                     AND NOT EXISTS (SELECT 1 FROM checkpoints k WHERE k.run_id = runs.run_id) \
                     ORDER BY finished_at, run_id LIMIT $2",
                    &[&before, &limit],
                )
                .await
                .map_err(unavailable)?
            {
                chosen.insert(row.get(0), (row.get(1), row.get(2)));
            }
        }
        if let Some(max) = retention.max_runs {
            for row in client
                .query(
                    "SELECT run_id, agent, status FROM runs \
                     WHERE (finished_at, run_id) <= (SELECT finished_at, run_id FROM runs \
                     ORDER BY finished_at DESC, run_id DESC OFFSET $1 LIMIT 1) \
                     AND NOT EXISTS (SELECT 1 FROM checkpoints k WHERE k.run_id = runs.run_id) \
                     ORDER BY finished_at DESC, run_id DESC LIMIT $2",
                    &[&to_i64(max), &limit],
                )
                .await
                .map_err(unavailable)?
            {
                chosen.insert(row.get(0), (row.get(1), row.get(2)));
            }
        }
        report.more = chosen.len() >= batch.max(1);
        let ids: Vec<String> = chosen.keys().take(batch.max(1)).cloned().collect();
        if ids.is_empty() {
            return Ok(report);
        }
        let tx = client.transaction().await.map_err(unavailable)?;
        let counted = if dry_run {
            "SELECT run_id, count(*) FROM audit_records WHERE run_id = ANY($1) GROUP BY run_id"
        } else {
            "WITH d AS (DELETE FROM audit_records WHERE run_id = ANY($1) RETURNING run_id) \
             SELECT run_id, count(*) FROM d GROUP BY run_id"
        };
        let records: BTreeMap<String, i64> = tx
            .query(counted, &[&ids])
            .await
            .map_err(unavailable)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if !dry_run {
            tx.execute("DELETE FROM runs WHERE run_id = ANY($1)", &[&ids])
                .await
                .map_err(unavailable)?;
            // Their settled publishes go with them; one still owed stays
            // until it is delivered (as on SQLite).
            tx.execute(
                "DELETE FROM outbox WHERE run_id = ANY($1) AND state <> 'owed'",
                &[&ids],
            )
            .await
            .map_err(unavailable)?;
        }
        let mut by: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
        for id in &ids {
            let (agent, status) = &chosen[id];
            let n = records.get(id).copied().unwrap_or(0);
            let c = by.entry((agent.clone(), status.clone())).or_default();
            c.0 += 1;
            c.1 += n;
            let status = from_name::<RunStatus>(status).unwrap_or(RunStatus::Error);
            report.add(agent, status, to_u64(n));
        }
        if !dry_run {
            for ((agent, status), (runs, records)) in &by {
                tx.execute(
                    "INSERT INTO runs_pruned (agent, status, runs, records) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (agent, status) DO UPDATE SET \
                     runs = runs_pruned.runs + EXCLUDED.runs, \
                     records = runs_pruned.records + EXCLUDED.records",
                    &[agent, status, runs, records],
                )
                .await
                .map_err(unavailable)?;
            }
            // Manifests no kept run ran, when there are many (the oldest
            // start is a scan): see the SQLite store for the rule.
            let many: bool = tx
                .query_one(
                    "SELECT count(*) > 256 FROM (SELECT 1 FROM manifests LIMIT 257) m",
                    &[],
                )
                .await
                .map_err(unavailable)?
                .get(0);
            if many {
                let now = to_i64(now_ms);
                tx.execute(
                    "DELETE FROM manifests WHERE used_ms < LEAST(\
                     COALESCE((SELECT MIN(started_at) FROM runs), $1), \
                     COALESCE((SELECT MIN(at_ms) FROM audit_records a WHERE a.kind = 0 \
                     AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = a.run_id)), $1), \
                     $1) - $2",
                    &[&now, &MANIFEST_MARGIN_MS],
                )
                .await
                .map_err(unavailable)?;
            }
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(report)
    }

    /// Its `outbox` table, written in the transaction of each batch.
    fn outbox(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn OutboxStore>> {
        Some(self)
    }

    async fn pruned(&self) -> Result<Vec<PrunedCount>, AuditStoreError> {
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT agent, status, runs, records FROM runs_pruned ORDER BY agent, status",
                &[],
            )
            .await
            .map_err(unavailable)?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                Some(PrunedCount {
                    agent: r.get(0),
                    status: from_name(r.get::<_, &str>(1))?,
                    runs: to_u64(r.get(2)),
                    records: to_u64(r.get(3)),
                })
            })
            .collect())
    }
}

#[async_trait]
impl RunIndex for PostgresStore {
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, AuditStoreError> {
        let mut sql = format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE TRUE");
        let mut args: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
        // Binds `v` as the next argument; its placeholder.
        fn bind(
            args: &mut Vec<Box<dyn ToSql + Sync + Send>>,
            v: impl ToSql + Sync + Send + 'static,
        ) -> String {
            args.push(Box::new(v));
            format!("${}", args.len())
        }
        if let Some(status) = filter.status {
            let p = bind(&mut args, status.as_str().to_string());
            sql.push_str(&format!(" AND status = {p}"));
        }
        if let Some(caller) = &filter.caller {
            let p = bind(&mut args, caller.clone());
            sql.push_str(&format!(" AND caller_id = {p}"));
        }
        if let Some(root) = filter.root {
            let p = bind(&mut args, root.to_string());
            sql.push_str(&format!(" AND (root_run_id = {p} OR run_id = {p})"));
        }
        if let Some(after) = &filter.after {
            // Keyset paging: the row comparison seeks in `runs_by_finish`.
            let at = bind(&mut args, to_i64(after.finished_at));
            let id = bind(&mut args, after.run_id.to_string());
            sql.push_str(&format!(" AND (finished_at, run_id) < ({at}, {id})"));
        }
        sql.push_str(" ORDER BY finished_at DESC, run_id DESC");
        if let Some(limit) = filter.limit {
            let p = bind(&mut args, i64::from(limit));
            sql.push_str(&format!(" LIMIT {p}"));
        }
        let client = self.client().await.map_err(unavailable)?;
        let params: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| &**a as &(dyn ToSql + Sync)).collect();
        let rows = client.query(&sql, &params).await.map_err(unavailable)?;
        rows.iter().map(summary).collect()
    }

    async fn run_result(&self, run_id: RunId) -> Result<Option<RunResult>, AuditStoreError> {
        let client = self.client().await.map_err(unavailable)?;
        let row = client
            .query_opt(
                "SELECT record FROM audit_records WHERE run_id = $1 AND kind = 2 \
                 ORDER BY seq DESC LIMIT 1",
                &[&run_id.to_string()],
            )
            .await
            .map_err(unavailable)?;
        match row {
            None => Ok(None),
            Some(row) => match decode(row.get(0))?.entry {
                AuditEntry::Terminal(res) => Ok(Some(RunResult::clone(&res))),
                _ => Ok(None),
            },
        }
    }
}
