//! The audit log on SQLite: `append` (one transaction per batch:
//! segments and terminal `runs` rows), reading a run's records back, and
//! the run index behind `agentvisor runs`. The encoder (`encode`), the
//! readers of every schema version (`decode`), the JSON primitives
//! (`json`) and the steps a tail gives back (`steps`) are submodules.
//!
//! # Layout
//!
//! Records are written in segments: a run's records of one batch are one
//! JSON array of `[seq, at_ms, kind, payload]`. The segment that holds a
//! run's `run.end` record (for a run that finishes within one batch, all
//! its records) goes in the run's `runs` row, as its `tail`, next to the
//! [`RunResult`](crate::ports::run::RunResult) (`runs.result`; the
//! record's payload is `null`); other segments are `audit_segments` rows.
//! A typical run therefore costs one row. The view `audit_log` gives one
//! row per record for SQL queries by kind.
//!
//! Stored forms are compact: an event's JSON without its `type` tag (the
//! record's kind is the tag), usage fields that are 0 left out, a
//! `run.start`'s limits reduced to the keys the built-in defaults would
//! not give (schema version 3); a record's `at_ms` as an offset from its
//! row's base, a result without what its row's columns hold and its fields
//! at their defaults (version 4); a result's steps left to the tail when
//! its records say the same (version 5). Why each was worth it, with the
//! figures, is in the commit history and `docs/PERFORMANCE.md`.
//!
//! # Guarantees
//!
//! - A batch is written whole or not at all (one transaction).
//! - `(run_id, seq)` is a record's identity and `run_id` a run's: a
//!   segment or a terminal row written again (a spool replay) is neither
//!   stored nor counted twice, and a segment of a run that already has its
//!   `runs` row is a replay.
//! - Readers give back exactly what was appended, from rows of every
//!   schema version (1 to the current one).
//! - Encoding runs on the caller of `append`; the writer thread only
//!   inserts (one prepared single-row `INSERT` per row).

mod decode;
pub(super) mod encode;
mod json;
mod steps;
#[cfg(test)]
mod tests;

use std::sync::atomic::Ordering;

use async_trait::async_trait;

use super::SqliteStore;
use crate::ports::audit::{
    AuditEntry, AuditRecord, AuditStats, AuditStore, AuditStoreError, RunFilter, RunIndex,
    RunSummary,
};
use crate::ports::outbox::OutboxStore;
use crate::ports::retention::{PruneReport, PrunedCount, Retention};
use crate::ports::run::{RunId, RunResult, RunStatus};

/// The kind of a `run.start` record.
const KIND_START: &str = "run.start";
/// The kind of a terminal record.
const KIND_END: &str = "run.end";

/// Turns a database error into the port's error (no secret reaches it: the
/// store holds none).
pub(super) fn unavailable(e: impl std::fmt::Display) -> AuditStoreError {
    AuditStoreError::Unavailable(e.to_string())
}

#[async_trait]
impl AuditStore for SqliteStore {
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        // Encode here, on the caller: the writer thread only inserts.
        let (rows, runs, templates, manifests) = {
            let mut repeats = self.repeats.lock().unwrap_or_else(|p| p.into_inner());
            encode::encode(batch, Some(&mut repeats))?
        };
        // A scheduled skill's intents ride in the same transaction.
        let outbox = if batch
            .iter()
            .any(|r| matches!(r.entry, AuditEntry::Publish(_)))
        {
            super::outbox::outbox_rows(batch)?
        } else {
            Vec::new()
        };
        let (inserted, terminal) = self
            .writer
            .append(rows, runs, templates, manifests, outbox)
            .await
            .map_err(unavailable)?;
        self.records.fetch_add(inserted, Ordering::Relaxed);
        self.terminal_records.fetch_add(terminal, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Yes: the writer thread takes batches in the order `append` was
    /// first polled (it encodes, then queues), and refuses one queued behind
    /// a batch that failed.
    fn pipelines(&self) -> bool {
        true
    }

    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        self.read(move |c| decode::run_records(c, run_id)).await
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunId>, AuditStoreError> {
        let ids: Vec<String> = self
            .read(|c| {
                let mut stmt = c
                    .prepare(
                        "SELECT s.run_id FROM (\
                         SELECT run_id FROM audit_segments WHERE has_start = 1 \
                         UNION SELECT run_id FROM audit_records WHERE kind = 'run.start') s \
                         WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = s.run_id) \
                         ORDER BY s.run_id",
                    )
                    .map_err(unavailable)?;
                let rows = stmt.query_map([], |r| r.get(0)).map_err(unavailable)?;
                rows.collect::<Result<_, _>>().map_err(unavailable)
            })
            .await?;
        ids.iter().map(|s| decode::parse_id(s)).collect()
    }

    async fn prune(
        &self,
        retention: &Retention,
        now_ms: u64,
        batch: usize,
        dry_run: bool,
    ) -> Result<PruneReport, AuditStoreError> {
        self.prune_runs(retention, now_ms, batch, dry_run).await
    }

    async fn settle(&self) {
        SqliteStore::close(self).await;
    }

    async fn pruned(&self) -> Result<Vec<PrunedCount>, AuditStoreError> {
        self.pruned_counts().await
    }

    /// Its `outbox` table, written in the transaction of each batch.
    fn outbox(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn OutboxStore>> {
        Some(self)
    }

    /// What this handle wrote since it was opened: records and terminal
    /// records actually inserted (replayed duplicates are not counted),
    /// batches committed. [`SqliteStore::totals`] counts the whole file.
    async fn stats(&self) -> Result<AuditStats, AuditStoreError> {
        Ok(AuditStats {
            records: self.records.load(Ordering::Relaxed),
            terminal_records: self.terminal_records.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            store_lost: self.writer.file_lost(),
            ..AuditStats::default()
        })
    }
}

#[async_trait]
impl RunIndex for SqliteStore {
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, AuditStoreError> {
        let (sql, args) = list_query(filter);
        self.read(move |c| {
            let mut stmt = c.prepare(&sql).map_err(unavailable)?;
            let mut rows = stmt
                .query(rusqlite::params_from_iter(args))
                .map_err(unavailable)?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(unavailable)? {
                out.push(decode::summary(row)?);
            }
            Ok(out)
        })
        .await
    }

    async fn run_result(&self, run_id: RunId) -> Result<Option<RunResult>, AuditStoreError> {
        self.read(move |c| decode::stored_result(c, run_id, None))
            .await
    }
}

/// The query of [`RunIndex::list_runs`] for `filter`, and its arguments.
fn list_query(filter: &RunFilter) -> (String, Vec<rusqlite::types::Value>) {
    let mut sql = format!("SELECT {} FROM runs WHERE 1 = 1", decode::SUMMARY_COLUMNS);
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    // `runs_by_status` holds only runs that did not end `ok` (schema
    // version 5). For another status, `status <> 'ok'` lets the planner
    // use it; `ok` rows are most rows, found by walking `runs_by_finish`
    // newest first: `status || ''` keeps the planner from scanning the
    // table and sorting it all instead (as it would for `status = ?`).
    match filter.status {
        Some(RunStatus::Ok) => {
            sql.push_str(" AND status || '' = ?");
            args.push(RunStatus::Ok.as_str().to_string().into());
        }
        Some(status) => {
            sql.push_str(" AND status = ? AND status <> 'ok'");
            args.push(status.as_str().to_string().into());
        }
        None => {}
    }
    if let Some(caller) = &filter.caller {
        sql.push_str(" AND caller_id = ?");
        args.push(caller.clone().into());
    }
    if let Some(root) = filter.root {
        // The root's own row by its key, the rest through `runs_by_root`.
        sql.push_str(
            " AND run_id IN (SELECT run_id FROM runs WHERE root_run_id = ? UNION ALL SELECT ?)",
        );
        args.push(root.to_string().into());
        args.push(root.to_string().into());
    }
    if let Some(after) = &filter.after {
        // Keyset paging: the bound on `finished_at` alone lets the
        // planner seek in whichever index it walks (each ends in
        // `finished_at`, then the rowid), so a page after a cursor
        // reads what the first page does; `run_id` (fixed-width hex,
        // so text order is numeric order) breaks ties.
        let at = i64::try_from(after.finished_at).unwrap_or(i64::MAX);
        sql.push_str(" AND finished_at <= ? AND (finished_at < ? OR run_id < ?)");
        args.push(at.into());
        args.push(at.into());
        args.push(after.run_id.to_string().into());
    }
    sql.push_str(" ORDER BY finished_at DESC, run_id DESC");
    if let Some(limit) = filter.limit {
        sql.push_str(" LIMIT ?");
        args.push(i64::from(limit).into());
    }
    (sql, args)
}
