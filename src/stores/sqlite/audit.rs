//! The audit log on SQLite: `append` (one transaction per batch, multi-row
//! inserts, segments and terminal `runs` rows), reading a run's records
//! back, and the run index behind `agentvisor runs`.
//!
//! Records are written in segments (schema version 2): a run's records of
//! one batch are one `audit_segments` row, a JSON array of `[seq, at_ms,
//! kind, payload]` where the payload is the record's JSON — the
//! [`RunInfo`] of `run.start`, the [`RunEvent`] of an event (its kind is the
//! event's wire name). A `run.end` record's [`RunResult`] is stored once, in
//! `runs.result`, and its payload is `null`. Since a run that finishes
//! within a batch sends all its records in it, a typical run costs two rows
//! (its segment and its `runs` row) instead of one per record: rows, not
//! bytes, are what an embedded store pays for. The view `audit_log` gives
//! one row per record for SQL queries by kind. Rows written by version 1
//! (`audit_records`, one per record) are still read.
//!
//! Speed (the audit log is the hot write path): segments are encoded by the
//! caller, then moved (not copied) to the writer thread, which inserts them
//! with multi-row `INSERT`s of power-of-two sizes (each prepared once), one
//! `BEGIN IMMEDIATE` transaction per batch.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite};

use super::writer::{RunRow, SegmentRow};
use super::{to_i64, to_u64, SqliteStore};
use crate::ports::audit::{
    AuditEntry, AuditRecord, AuditStats, AuditStore, AuditStoreError, RunFilter, RunIndex, RunInfo,
    RunSummary,
};
use crate::ports::run::{KillReason, RunEvent, RunId, RunResult, RunStatus};

/// The kind of a `run.start` record.
const KIND_START: &str = "run.start";
/// The kind of a terminal record.
const KIND_END: &str = "run.end";

/// Turns a database error into the port's error (no secret reaches it: the
/// store holds none).
pub(super) fn unavailable(e: impl std::fmt::Display) -> AuditStoreError {
    AuditStoreError::Unavailable(e.to_string())
}

/// The wire name of an event, read from its JSON: serde writes an internally
/// tagged enum's tag first, so the body starts with `{"type":"…"`. Names
/// are interned (a few distinct ones, bound once per record).
fn event_kind(body: &[u8]) -> &'static str {
    const KNOWN: &[&str] = &[
        "step.start",
        "step.finish",
        "text.delta",
        "tool.call",
        "tool.result",
        "message.create",
        "critic.steer",
        "critic.extend",
        "critic.raise_iterations",
        "critic.kill",
        "run.resumed",
        "model.retry",
        "transcript.compacted",
        "warning",
        "error",
    ];
    body.strip_prefix(b"{\"type\":\"")
        .and_then(|rest| rest.iter().position(|&b| b == b'"').map(|end| &rest[..end]))
        .and_then(|kind| KNOWN.iter().find(|k| k.as_bytes() == kind).copied())
        .unwrap_or("event")
}

/// Encodes a batch: one segment per run (its records in batch order, as
/// `[[seq, at_ms, kind, payload], …]`), and a `runs` row per terminal
/// record, which takes the result JSON (its payload in the segment is
/// `null`).
fn encode(batch: &[AuditRecord]) -> Result<(Vec<SegmentRow>, Vec<RunRow>), AuditStoreError> {
    struct Open {
        row: SegmentRow,
        body: Vec<u8>,
    }
    let mut open: Vec<Open> = Vec::new();
    // A run's records usually come together: look at the last segment
    // first, the index only when they interleave.
    let mut index: HashMap<RunId, usize> = HashMap::new();
    let mut last: Option<(RunId, usize)> = None;
    let mut payload: Vec<u8> = Vec::with_capacity(1024);
    let mut runs = Vec::new();
    for r in batch {
        let bad = |e: serde_json::Error| {
            AuditStoreError::Unavailable(format!(
                "record {}/{} does not encode: {e}",
                r.run_id, r.seq
            ))
        };
        let i = match last {
            Some((run, i)) if run == r.run_id => i,
            _ => *index.entry(r.run_id).or_insert_with(|| {
                open.push(Open {
                    row: SegmentRow {
                        run_id: r.run_id.to_string(),
                        first_seq: i64::from(r.seq),
                        last_seq: i64::from(r.seq),
                        records: 0,
                        has_start: 0,
                        body: String::new(),
                    },
                    body: Vec::with_capacity(1024),
                });
                open.len() - 1
            }),
        };
        last = Some((r.run_id, i));
        let o = &mut open[i];
        let seq = i64::from(r.seq);
        o.row.first_seq = o.row.first_seq.min(seq);
        o.row.last_seq = o.row.last_seq.max(seq);
        o.body.push(if o.row.records == 0 { b'[' } else { b',' });
        o.row.records += 1;
        payload.clear();
        let kind = match &r.entry {
            AuditEntry::RunStarted(info) => {
                o.row.has_start = 1;
                serde_json::to_writer(&mut payload, info).map_err(bad)?;
                KIND_START
            }
            AuditEntry::Event(ev) => {
                serde_json::to_writer(&mut payload, ev).map_err(bad)?;
                event_kind(&payload)
            }
            AuditEntry::Terminal(res) => {
                payload.extend_from_slice(b"null");
                runs.push(RunRow {
                    run_id: o.row.run_id.clone(),
                    agent: res.agent.clone(),
                    caller_id: res.caller_id.clone(),
                    parent_run_id: res.parent_run_id.map(|p| p.to_string()),
                    status: res.status.as_str(),
                    kill_reason: res.kill_reason.map(KillReason::as_str),
                    error_kind: res.error_kind.clone(),
                    started_at: to_i64(res.started_at),
                    finished_at: to_i64(res.finished_at),
                    result: serde_json::to_string(&**res).map_err(bad)?,
                });
                KIND_END
            }
        };
        // Kinds are fixed ASCII names: nothing to escape.
        let _ = write!(o.body, "[{},{},\"{kind}\",", r.seq, r.at_ms);
        o.body.extend_from_slice(&payload);
        o.body.push(b']');
    }
    let segments = open
        .into_iter()
        .map(|mut o| {
            o.body.push(b']');
            // serde_json writes UTF-8, and so does `write!`.
            o.row.body = String::from_utf8(o.body).map_err(|e| {
                AuditStoreError::Unavailable(format!("a segment is not UTF-8: {e}"))
            })?;
            Ok(o.row)
        })
        .collect::<Result<Vec<_>, AuditStoreError>>()?;
    Ok((segments, runs))
}

fn decode(
    run_id: RunId,
    seq: i64,
    at_ms: i64,
    kind: &str,
    body: &str,
) -> Result<AuditRecord, AuditStoreError> {
    let bad = |e: serde_json::Error| {
        AuditStoreError::Unavailable(format!(
            "record {run_id}/{seq} ({kind}) does not decode: {e}"
        ))
    };
    let entry = match kind {
        KIND_START => AuditEntry::RunStarted(Box::new(
            serde_json::from_str::<RunInfo>(body).map_err(bad)?,
        )),
        KIND_END => AuditEntry::Terminal(Arc::new(
            serde_json::from_str::<RunResult>(body).map_err(bad)?,
        )),
        _ => AuditEntry::Event(serde_json::from_str::<RunEvent>(body).map_err(bad)?),
    };
    Ok(AuditRecord {
        run_id,
        seq: u32::try_from(seq).unwrap_or(u32::MAX),
        at_ms: to_u64(at_ms),
        entry,
    })
}

/// A snake_case serde name back to its enum (`"killed"` → `RunStatus::Killed`).
fn from_name<T: serde::de::DeserializeOwned>(name: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}

fn parse_id(s: &str) -> Result<RunId, AuditStoreError> {
    s.parse()
        .map_err(|_| AuditStoreError::Unavailable(format!("bad run id `{s}` in the database")))
}

fn summary(row: &SqliteRow) -> Result<RunSummary, AuditStoreError> {
    let get_s = |i: usize| row.try_get::<Option<String>, _>(i).map_err(unavailable);
    let run_id: String = row.try_get(0).map_err(unavailable)?;
    let status: String = row.try_get(4).map_err(unavailable)?;
    Ok(RunSummary {
        run_id: parse_id(&run_id)?,
        agent: row.try_get(1).map_err(unavailable)?,
        caller_id: get_s(2)?,
        parent_run_id: get_s(3)?.map(|p| parse_id(&p)).transpose()?,
        status: from_name::<RunStatus>(&status).ok_or_else(|| {
            AuditStoreError::Unavailable(format!("unknown status `{status}` of run {run_id}"))
        })?,
        kill_reason: get_s(5)?.and_then(|k| from_name::<KillReason>(&k)),
        error_kind: get_s(6)?,
        started_at: to_u64(row.try_get(7).map_err(unavailable)?),
        finished_at: to_u64(row.try_get(8).map_err(unavailable)?),
    })
}

#[async_trait]
impl AuditStore for SqliteStore {
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        // Encode here, on the caller: the writer thread only inserts.
        let (rows, runs) = encode(batch)?;
        let (inserted, terminal) = self.writer.append(rows, runs).await.map_err(unavailable)?;
        self.records.fetch_add(inserted, Ordering::Relaxed);
        self.terminal_records.fetch_add(terminal, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        let id = run_id.to_string();
        // By seq: a record replayed in another segment is kept once.
        let mut out: BTreeMap<i64, AuditRecord> = BTreeMap::new();
        let bodies: Vec<String> = sqlx::query_scalar(
            "SELECT body FROM audit_segments WHERE run_id = ? ORDER BY first_seq",
        )
        .bind(&id)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        for body in &bodies {
            let items: Vec<(i64, i64, String, serde_json::Value)> = serde_json::from_str(body)
                .map_err(|e| {
                    AuditStoreError::Unavailable(format!(
                        "a record segment of run {run_id} does not decode: {e}"
                    ))
                })?;
            for (seq, at_ms, kind, payload) in items {
                if out.contains_key(&seq) {
                    continue;
                }
                // A run.end record's payload is its run's result, in `runs`.
                let record = if kind == KIND_END {
                    let result = self.run_result(run_id).await?.ok_or_else(|| {
                        AuditStoreError::Unavailable(format!(
                            "run {run_id} has a run.end record but no result"
                        ))
                    })?;
                    AuditRecord {
                        run_id,
                        seq: u32::try_from(seq).unwrap_or(u32::MAX),
                        at_ms: to_u64(at_ms),
                        entry: AuditEntry::Terminal(Arc::new(result)),
                    }
                } else {
                    decode(run_id, seq, at_ms, &kind, &payload.to_string())?
                };
                out.insert(seq, record);
            }
        }
        // Records written by schema version 1, one row each.
        let rows = sqlx::query(
            "SELECT a.seq, a.at_ms, a.kind, \
             CASE WHEN a.kind = 'run.end' THEN r.result ELSE a.body END \
             FROM audit_records a LEFT JOIN runs r ON r.run_id = a.run_id \
             WHERE a.run_id = ? ORDER BY a.seq",
        )
        .bind(&id)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        for row in &rows {
            let seq: i64 = row.try_get(0).map_err(unavailable)?;
            let at_ms: i64 = row.try_get(1).map_err(unavailable)?;
            let kind: &str = row.try_get(2).map_err(unavailable)?;
            let body: Option<&str> = row.try_get(3).map_err(unavailable)?;
            if let std::collections::btree_map::Entry::Vacant(e) = out.entry(seq) {
                e.insert(decode(run_id, seq, at_ms, kind, body.unwrap_or_default())?);
            }
        }
        Ok(out.into_values().collect())
    }

    /// What this handle wrote since it was opened: records and terminal
    /// records actually inserted (replayed duplicates are not counted),
    /// batches committed. [`SqliteStore::totals`] counts the whole file.
    async fn unfinished_runs(&self) -> Result<Vec<RunId>, AuditStoreError> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT s.run_id FROM (\
             SELECT run_id FROM audit_segments WHERE has_start = 1 \
             UNION SELECT run_id FROM audit_records WHERE kind = 'run.start') s \
             WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = s.run_id) \
             ORDER BY s.run_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        ids.iter().map(|s| parse_id(s)).collect()
    }

    async fn stats(&self) -> Result<AuditStats, AuditStoreError> {
        Ok(AuditStats {
            records: self.records.load(Ordering::Relaxed),
            terminal_records: self.terminal_records.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
        })
    }
}

#[async_trait]
impl RunIndex for SqliteStore {
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, AuditStoreError> {
        let mut q: QueryBuilder<'_, Sqlite> = QueryBuilder::new(
            "SELECT run_id, agent, caller_id, parent_run_id, status, kill_reason, error_kind, \
             started_at, finished_at FROM runs WHERE 1 = 1",
        );
        if let Some(status) = filter.status {
            q.push(" AND status = ").push_bind(status.as_str());
        }
        if let Some(caller) = &filter.caller {
            q.push(" AND caller_id = ").push_bind(caller.as_str());
        }
        q.push(" ORDER BY finished_at DESC, run_id DESC");
        if let Some(limit) = filter.limit {
            q.push(" LIMIT ").push_bind(i64::from(limit));
        }
        let rows = q.build().fetch_all(&self.pool).await.map_err(unavailable)?;
        rows.iter().map(summary).collect()
    }

    async fn run_result(&self, run_id: RunId) -> Result<Option<RunResult>, AuditStoreError> {
        let body: Option<String> = sqlx::query_scalar("SELECT result FROM runs WHERE run_id = ?")
            .bind(run_id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        body.map(|b| {
            serde_json::from_str(&b).map_err(|e| {
                AuditStoreError::Unavailable(format!(
                    "the result of run {run_id} does not decode: {e}"
                ))
            })
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_kind_is_the_wire_name() {
        let ev = RunEvent::StepStart { iteration: 1 };
        let body = serde_json::to_string(&ev).unwrap_or_default();
        assert_eq!(event_kind(body.as_bytes()), "step.start");
        let ev = RunEvent::TranscriptCompacted {
            iteration: 3,
            messages_before: 8,
            messages_after: 5,
            tokens_before: 900,
            tokens_after: 300,
            usage: Default::default(),
            summary: "s".into(),
        };
        let body = serde_json::to_string(&ev).unwrap_or_default();
        assert_eq!(event_kind(body.as_bytes()), "transcript.compacted");
        assert_eq!(event_kind(b"{}"), "event");
    }
}
