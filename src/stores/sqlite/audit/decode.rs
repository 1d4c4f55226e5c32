//! The readers: stored rows of every schema version back to records and
//! results — version 1's `audit_records` rows (one per record, whole
//! payloads), version 2's segments (whole payloads, absolute times),
//! version 3's tails in `runs` (compact payloads, absolute times, whole
//! results), versions 4 and 5 (times as offsets, results without what
//! their row's columns hold, steps left to the tail).
//!
//! Guarantee: a run's records come back in seq order, each seq once
//! (a record replayed into another segment is read once), equal to what
//! was appended.

use std::collections::BTreeMap;
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension};

use super::steps::each_tail_step;
use super::{unavailable, KIND_END, KIND_START};
use crate::ports::audit::{AuditEntry, AuditRecord, AuditStoreError, RunInfo, RunSummary};
use crate::ports::checkpoint::EncodedJson;
use crate::ports::event::RunEvent;
use crate::ports::limits::LimitsSpec;
use crate::ports::run::{KillReason, RunId, RunResult, RunStatus};
use crate::stores::sqlite::to_u64;

/// A stored result back to the [`RunResult`]: one written by schema version
/// 4 (no `run_id` key) gets the keys its row's columns hold and the
/// defaults [`write_result`] left out; an older one is whole.
pub(super) fn full_result(
    body: &str,
    row: &RunSummary,
    tail: Option<&str>,
) -> Result<RunResult, AuditStoreError> {
    let bad = |e: serde_json::Error| {
        AuditStoreError::Unavailable(format!(
            "the result of run {} does not decode: {e}",
            row.run_id
        ))
    };
    let mut v: serde_json::Value = serde_json::from_str(body).map_err(bad)?;
    let mut steps_in_tail = false;
    if let serde_json::Value::Object(map) = &mut v {
        if map.get("steps").and_then(serde_json::Value::as_str) == Some("tail") {
            map.remove("steps");
            steps_in_tail = true;
        }
        if !map.contains_key("run_id") {
            let columns = serde_json::json!({
                "run_id": row.run_id,
                "agent": row.agent,
                "caller_id": row.caller_id,
                "parent_run_id": row.parent_run_id,
                "root_run_id": row.root_run_id,
                "status": row.status,
                "kill_reason": row.kill_reason,
                "error_kind": row.error_kind,
                "started_at": row.started_at,
                "finished_at": row.finished_at,
                "forked_from": row.forked_from,
                "error": null,
                "output": null,
                "steps": [],
                "cost_micros": 0,
                "critic": [],
            });
            if let serde_json::Value::Object(columns) = columns {
                for (k, v) in columns {
                    map.entry(k).or_insert(v);
                }
            }
        }
    }
    let mut result: RunResult = serde_json::from_value(v).map_err(bad)?;
    if steps_in_tail {
        let events = tail_events(row.run_id, tail.unwrap_or("[]"))?;
        let mut steps = Vec::new();
        if !each_tail_step(events.iter(), |v| {
            steps.push(v.to_step());
            true
        }) {
            return Err(AuditStoreError::Unavailable(format!(
                "the steps of run {} are not in its records",
                row.run_id
            )));
        }
        result.steps = steps;
    }
    Ok(result)
}

/// The tool events of a stored tail (`[[seq, at_ms, kind, payload], …]`), in order.
pub(super) fn tail_events(run_id: RunId, tail: &str) -> Result<Vec<RunEvent>, AuditStoreError> {
    let items: Vec<(i64, i64, String, serde_json::Value)> =
        serde_json::from_str(tail).map_err(|e| {
            AuditStoreError::Unavailable(format!("the records of run {run_id} do not decode: {e}"))
        })?;
    let mut events = Vec::new();
    for (seq, _, kind, payload) in items {
        if kind == "tool.call" || kind == "tool.result" {
            if let AuditEntry::Event(ev) =
                decode(run_id, seq, 0, &kind, &restore(&kind, payload).to_string())?.entry
            {
                events.push(ev);
            }
        }
    }
    Ok(events)
}

/// A stored payload back to a record's JSON: the `type` tag an event was
/// stored without goes back in; a `run.start`'s limits are resolved again
/// (every key set, as the run had them).
pub(super) fn restore(kind: &str, mut payload: serde_json::Value) -> serde_json::Value {
    if let serde_json::Value::Object(map) = &mut payload {
        if kind == KIND_START {
            let spec = map
                .get("limits")
                .filter(|l| !l.is_null())
                .and_then(|l| serde_json::from_value::<LimitsSpec>(l.clone()).ok());
            if let Some(full) = spec.map(|s| s.resolve(&LimitsSpec::default()).to_spec()) {
                if let Ok(v) = serde_json::to_value(full) {
                    map.insert("limits".into(), v);
                }
            }
        } else if kind != KIND_END && !map.contains_key("type") {
            map.insert("type".into(), serde_json::Value::String(kind.into()));
        }
    }
    payload
}

/// A stored `run.start` or event record (a `run.end` record's payload is
/// its run's result: see `terminal_record`).
pub(super) fn decode(
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
pub(super) fn from_name<T: serde::de::DeserializeOwned>(name: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}

pub(super) fn parse_id(s: &str) -> Result<RunId, AuditStoreError> {
    s.parse()
        .map_err(|_| AuditStoreError::Unavailable(format!("bad run id `{s}` in the database")))
}

/// A `runs` row's result text, from its template when it points at one
/// (schema version 11).
const RESULT: &str = "CASE WHEN result_ref IS NULL THEN result ELSE \
     (SELECT t.body FROM run_templates t WHERE t.id = runs.result_ref) END";

/// A `runs` row's tail text, from its template when it points at one.
const TAIL: &str =
    "COALESCE(tail, (SELECT t.body FROM run_templates t WHERE t.id = runs.tail_ref))";

/// The columns of `runs` a [`RunSummary`] is read from, in [`summary`]'s order.
pub(super) const SUMMARY_COLUMNS: &str =
    "run_id, agent, caller_id, parent_run_id, status, kill_reason, error_kind, started_at, finished_at, root_run_id, forked_from";

pub(super) fn summary(row: &rusqlite::Row<'_>) -> Result<RunSummary, AuditStoreError> {
    let get_s = |i: usize| row.get::<_, Option<String>>(i).map_err(unavailable);
    let run_id: String = row.get(0).map_err(unavailable)?;
    let status: String = row.get(4).map_err(unavailable)?;
    Ok(RunSummary {
        run_id: parse_id(&run_id)?,
        agent: row.get(1).map_err(unavailable)?,
        caller_id: get_s(2)?,
        parent_run_id: get_s(3)?.map(|p| parse_id(&p)).transpose()?,
        status: from_name::<RunStatus>(&status).ok_or_else(|| {
            AuditStoreError::Unavailable(format!("unknown status `{status}` of run {run_id}"))
        })?,
        kill_reason: get_s(5)?.and_then(|k| from_name::<KillReason>(&k)),
        error_kind: get_s(6)?,
        started_at: to_u64(row.get(7).map_err(unavailable)?),
        finished_at: to_u64(row.get(8).map_err(unavailable)?),
        root_run_id: get_s(9)?.map(|p| parse_id(&p)).transpose()?,
        forked_from: get_s(10)?.and_then(|f| serde_json::from_str(&f).ok()),
    })
}

/// A run's result from its `runs` row. `tail`: the row's tail, when the
/// caller has read it already (otherwise it is read with the result, in
/// case the result leaves its steps to it).
pub(super) fn stored_result(
    conn: &Connection,
    run_id: RunId,
    tail: Option<&str>,
) -> Result<Option<RunResult>, AuditStoreError> {
    // The tail is read only when the caller does not have it.
    let sql = match tail {
        Some(_) => format!("SELECT {SUMMARY_COLUMNS}, {RESULT} FROM runs WHERE run_id = ?1"),
        None => format!("SELECT {SUMMARY_COLUMNS}, {RESULT}, {TAIL} FROM runs WHERE run_id = ?1"),
    };
    let mut stmt = conn.prepare_cached(&sql).map_err(unavailable)?;
    let mut rows = stmt.query([run_id.to_string()]).map_err(unavailable)?;
    let Some(row) = rows.next().map_err(unavailable)? else {
        return Ok(None);
    };
    let body: String = row.get(11).map_err(unavailable)?;
    let read: Option<String> = match tail {
        Some(_) => None,
        None => row.get(12).map_err(unavailable)?,
    };
    full_result(&body, &summary(row)?, tail.or(read.as_deref())).map(Some)
}

/// A run's `run.end` record: its payload is the run's result, in `runs`.
/// `tail`: the stored records it was found among, if the caller has them.
pub(super) fn terminal_record(
    conn: &Connection,
    run_id: RunId,
    seq: i64,
    at_ms: i64,
    tail: Option<&str>,
) -> Result<AuditRecord, AuditStoreError> {
    let result = stored_result(conn, run_id, tail)?.ok_or_else(|| {
        AuditStoreError::Unavailable(format!("run {run_id} has a run.end record but no result"))
    })?;
    Ok(AuditRecord {
        run_id,
        seq: u32::try_from(seq).unwrap_or(u32::MAX),
        at_ms: to_u64(at_ms),
        entry: AuditEntry::Terminal(Arc::new(result)),
    })
}

/// Every stored record of a run, in seq order, each once: its segments,
/// its tail (in `runs`), and rows of schema version 1.
pub(super) fn run_records(
    conn: &Connection,
    run_id: RunId,
) -> Result<Vec<AuditRecord>, AuditStoreError> {
    let id = run_id.to_string();
    // By seq: a record replayed in another segment is kept once.
    let mut out: BTreeMap<i64, AuditRecord> = BTreeMap::new();
    // Segments, then the run's tail (its last segment, in `runs`).
    // A segment's times are offsets from its base (absolute before
    // schema version 4: no base).
    let bodies: Vec<(String, i64)> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT body, at_base FROM (\
                 SELECT body, first_seq, COALESCE(at_base, 0) AS at_base FROM audit_segments \
                 WHERE run_id = ?1 \
                 UNION ALL SELECT COALESCE(tail, (SELECT t.body FROM run_templates t \
                 WHERE t.id = runs.tail_ref)), tail_first_seq, COALESCE(tail_at_base, 0) FROM runs \
                 WHERE run_id = ?1 AND (tail IS NOT NULL OR tail_ref IS NOT NULL)) ORDER BY first_seq",
            )
            .map_err(unavailable)?;
        let rows = stmt
            .query_map([&id], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(unavailable)?;
        rows.collect::<Result<_, _>>().map_err(unavailable)?
    };
    for (body, at_base) in &bodies {
        let items: Vec<(i64, i64, String, serde_json::Value)> = serde_json::from_str(body)
            .map_err(|e| {
                AuditStoreError::Unavailable(format!(
                    "a record segment of run {run_id} does not decode: {e}"
                ))
            })?;
        for (seq, offset, kind, payload) in items {
            if out.contains_key(&seq) {
                continue;
            }
            let at_ms = at_base.saturating_add(offset);
            // A run.end record's payload is its run's result, in `runs`.
            let record = if kind == KIND_END {
                terminal_record(conn, run_id, seq, at_ms, Some(body.as_str()))?
            } else {
                decode(
                    run_id,
                    seq,
                    at_ms,
                    &kind,
                    &restore(&kind, payload).to_string(),
                )?
            };
            out.insert(seq, record);
        }
    }
    // Records written by schema version 1, one row each.
    let rows: Vec<(i64, i64, String, String)> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq, at_ms, kind, body FROM audit_records WHERE run_id = ?1 ORDER BY seq",
            )
            .map_err(unavailable)?;
        let rows = stmt
            .query_map([&id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(unavailable)?;
        rows.collect::<Result<_, _>>().map_err(unavailable)?
    };
    for (seq, at_ms, kind, body) in rows {
        if out.contains_key(&seq) {
            continue;
        }
        let record = if kind == KIND_END {
            terminal_record(conn, run_id, seq, at_ms, None)?
        } else {
            decode(run_id, seq, at_ms, &kind, &body)?
        };
        out.insert(seq, record);
    }
    let mut records: Vec<AuditRecord> = out.into_values().collect();
    put_manifest_back(conn, &mut records)?;
    Ok(records)
}

/// Gives a `run.start` record that names its manifest the manifest's JSON
/// (schema version 14). One the file no longer holds stays without it.
fn put_manifest_back(
    conn: &Connection,
    records: &mut [AuditRecord],
) -> Result<(), AuditStoreError> {
    for r in records.iter_mut() {
        let AuditEntry::RunStarted(info) = &mut r.entry else {
            continue;
        };
        let Some(m) = info.manifest.as_mut().filter(|m| m.json.is_none()) else {
            continue;
        };
        let body: Option<String> = conn
            .prepare_cached("SELECT body FROM manifests WHERE id = ?1")
            .and_then(|mut stmt| stmt.query_row([m.id as i64], |row| row.get(0)).optional())
            .map_err(unavailable)?;
        m.json = body.and_then(|b| EncodedJson::from_text(b).ok());
    }
    Ok(())
}
