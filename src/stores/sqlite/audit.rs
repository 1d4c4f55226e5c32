//! The audit log on SQLite: `append` (one transaction per batch, multi-row
//! inserts, segments and terminal `runs` rows), reading a run's records
//! back, and the run index behind `agentvisor runs`.
//!
//! Records are written in segments: a run's records of one batch are one
//! JSON array of `[seq, at_ms, kind, payload]`. The segment that holds a
//! run's `run.end` record (for a run that finishes within one batch, all
//! its records) goes in the run's `runs` row, as its `tail`, next to the
//! [`RunResult`] (`runs.result`; the record's payload is `null`); other
//! segments are `audit_segments` rows. A typical run therefore costs one
//! row: rows, not bytes, are what an embedded store pays for. The view
//! `audit_log` gives one row per record for SQL queries by kind.
//!
//! Payloads are compact (schema version 3): an event's JSON without its
//! `type` tag (the record's kind is the tag), usage fields that are 0 left
//! out, a `run.start`'s limits reduced to the keys the built-in defaults
//! would not give ([`Limits::to_minimal_spec`]). Readers put all of it
//! back, and still read what versions 1 (`audit_records`, one row per
//! record) and 2 (full payloads, every segment in `audit_segments`) wrote.
//!
//! Speed (the audit log is the hot write path): segments are encoded by the
//! caller, then moved (not copied) to the writer thread, which inserts them
//! with multi-row `INSERT`s of power-of-two sizes (each prepared once), one
//! `BEGIN IMMEDIATE` transaction per batch.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite};

use super::writer::{RunRow, SegmentRow};
use super::{to_i64, to_u64, SqliteStore};
use crate::ports::audit::{
    AuditEntry, AuditRecord, AuditStats, AuditStore, AuditStoreError, RunFilter, RunIndex, RunInfo,
    RunSummary,
};
use crate::ports::run::{KillReason, RunEvent, RunId, RunResult, RunStatus};
#[cfg(doc)]
use crate::spec::Limits;
use crate::spec::LimitsSpec;

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

/// The fields of a [`RunInfo`] as a `run.start` payload stores them: the
/// same JSON, with the limits reduced to [`Limits::to_minimal_spec`].
#[derive(Serialize)]
struct StoredInfo<'a> {
    agent: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    caller_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    channel_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_run_id: Option<RunId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    prompt: &'a str,
    tools: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<&'a LimitsSpec>,
}

/// Writes a `run.start` payload. Runs of one agent share their limits, so
/// the reduced limits of the last run are kept for the next.
fn write_info(
    out: &mut Vec<u8>,
    info: &RunInfo,
    last: &mut Option<(LimitsSpec, LimitsSpec)>,
) -> serde_json::Result<()> {
    // Destructured whole: a field added to `RunInfo` must be added here.
    let RunInfo {
        agent,
        model,
        caller_id,
        channel_id,
        parent_run_id,
        session_id,
        prompt,
        tools,
        limits,
    } = info;
    let limits = match limits {
        Some(full) => {
            if last.as_ref().is_none_or(|(f, _)| f != full) {
                let minimal = full.resolve(&LimitsSpec::default()).to_minimal_spec();
                *last = Some((*full, minimal));
            }
            last.as_ref().map(|(_, m)| m)
        }
        None => None,
    };
    serde_json::to_writer(
        out,
        &StoredInfo {
            agent,
            model,
            caller_id: caller_id.as_deref(),
            channel_id: channel_id.as_deref(),
            parent_run_id: *parent_run_id,
            session_id: session_id.as_deref(),
            prompt,
            tools,
            limits,
        },
    )
}

/// Writes an event payload without its `type` tag (the record's kind says
/// it); returns the kind. An event whose tag is not a known kind keeps it.
fn write_event(out: &mut Vec<u8>, ev: &RunEvent) -> serde_json::Result<&'static str> {
    let start = out.len();
    serde_json::to_writer(&mut *out, ev)?;
    let kind = event_kind(&out[start..]);
    if kind != "event" {
        // `{"type":"<kind>"` then `,` or `}`.
        let tag = 10 + kind.len();
        let cut = if out.get(start + tag) == Some(&b',') {
            tag + 1
        } else {
            tag
        };
        out.drain(start + 1..start + cut);
    }
    strip_zero_defaults(out, start);
    Ok(kind)
}

/// Usage fields that read as 0 when absent (`#[serde(default)]`), left out
/// of stored JSON when they are 0 (most providers report none of them).
const ZERO_DEFAULTS: [&[u8]; 3] = [
    b",\"cache_read_tokens\":0",
    b",\"cache_write_tokens\":0",
    b",\"reasoning_tokens\":0",
];

/// Removes the [`ZERO_DEFAULTS`] from the `"usage"` objects of
/// `json[start..]`. A usage object is flat (numbers only), and a match is a
/// field: inside a string a quote is escaped, so `"usage":{` or
/// `,"reasoning_tokens":0` cannot match there.
fn strip_zero_defaults(json: &mut Vec<u8>, start: usize) {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    // Built once: a finder's setup costs more than a short search.
    static USAGE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"usage\":{"));
    static ZEROS: LazyLock<[Finder<'static>; 3]> = LazyLock::new(|| ZERO_DEFAULTS.map(Finder::new));
    let mut at = start;
    while let Some(i) = USAGE.find(&json[at..]) {
        let open = at + i + 9;
        let Some(len) = memchr::memchr(b'}', &json[open..]) else {
            return;
        };
        let mut end = open + len;
        for (p, finder) in ZERO_DEFAULTS.iter().zip(ZEROS.iter()) {
            if let Some(j) = finder.find(&json[open..end]) {
                let s = open + j;
                if matches!(json.get(s + p.len()), Some(b',' | b'}')) {
                    json.drain(s..s + p.len());
                    end -= p.len();
                }
            }
        }
        at = end;
    }
}

/// Appends `n` in decimal.
fn push_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Encodes a batch: one segment per run, its records in batch order, as
/// `[[seq, at_ms, kind, payload], …]`. A run whose terminal record is in
/// the batch gets a `runs` row, which takes the result JSON (the record's
/// payload in the segment is `null`) and the segment itself, as its tail;
/// the other segments are `audit_segments` rows.
fn encode(batch: &[AuditRecord]) -> Result<(Vec<SegmentRow>, Vec<RunRow>), AuditStoreError> {
    struct Open {
        run_id: RunId,
        first_seq: i64,
        last_seq: i64,
        records: i64,
        has_start: bool,
        body: Vec<u8>,
        result: Option<Arc<RunResult>>,
    }
    let mut open: Vec<Open> = Vec::new();
    // A run's records usually come together: look at the last segment
    // first, the index only when they interleave.
    let mut index: HashMap<RunId, usize> = HashMap::new();
    let mut last: Option<(RunId, usize)> = None;
    let mut limits = None;
    let mut payload: Vec<u8> = Vec::with_capacity(1024);
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
                    run_id: r.run_id,
                    first_seq: i64::from(r.seq),
                    last_seq: i64::from(r.seq),
                    records: 0,
                    has_start: false,
                    body: Vec::with_capacity(2048),
                    result: None,
                });
                open.len() - 1
            }),
        };
        last = Some((r.run_id, i));
        let o = &mut open[i];
        let seq = i64::from(r.seq);
        o.first_seq = o.first_seq.min(seq);
        o.last_seq = o.last_seq.max(seq);
        o.body.push(if o.records == 0 { b'[' } else { b',' });
        o.records += 1;
        o.body.push(b'[');
        push_int(&mut o.body, r.seq);
        o.body.push(b',');
        push_int(&mut o.body, r.at_ms);
        // Kinds are fixed ASCII names: nothing to escape.
        o.body.extend_from_slice(b",\"");
        match &r.entry {
            AuditEntry::RunStarted(info) => {
                o.has_start = true;
                o.body.extend_from_slice(KIND_START.as_bytes());
                o.body.extend_from_slice(b"\",");
                write_info(&mut o.body, info, &mut limits).map_err(bad)?;
            }
            AuditEntry::Event(ev) => {
                // The payload says the kind, which goes first.
                payload.clear();
                let kind = write_event(&mut payload, ev).map_err(bad)?;
                o.body.extend_from_slice(kind.as_bytes());
                o.body.extend_from_slice(b"\",");
                o.body.extend_from_slice(&payload);
            }
            AuditEntry::Terminal(res) => {
                o.body.extend_from_slice(KIND_END.as_bytes());
                o.body.extend_from_slice(b"\",null");
                o.result = Some(res.clone());
            }
        }
        o.body.push(b']');
    }
    let text = |mut body: Vec<u8>, segment: bool| {
        if segment {
            body.push(b']');
        }
        // serde_json writes UTF-8, and so does everything else here.
        String::from_utf8(body)
            .map_err(|e| AuditStoreError::Unavailable(format!("stored JSON is not UTF-8: {e}")))
    };
    let mut segments = Vec::with_capacity(open.len());
    let mut runs = Vec::new();
    for o in open {
        let hex = o.run_id.to_hex();
        let run_id = String::from_utf8_lossy(&hex).into_owned();
        match o.result {
            Some(res) => runs.push(RunRow {
                run_id,
                agent: res.agent.clone(),
                caller_id: res.caller_id.clone(),
                parent_run_id: res.parent_run_id.map(|p| p.to_string()),
                status: res.status.as_str(),
                kill_reason: res.kill_reason.map(KillReason::as_str),
                error_kind: res.error_kind.clone(),
                started_at: to_i64(res.started_at),
                finished_at: to_i64(res.finished_at),
                result: {
                    let mut json = Vec::with_capacity(1024);
                    serde_json::to_writer(&mut json, &*res).map_err(|e| {
                        AuditStoreError::Unavailable(format!(
                            "the result of run {} does not encode: {e}",
                            o.run_id
                        ))
                    })?;
                    strip_zero_defaults(&mut json, 0);
                    text(json, false)?
                },
                tail_first_seq: o.first_seq,
                tail_records: o.records,
                tail: text(o.body, true)?,
            }),
            None => segments.push(SegmentRow {
                run_id,
                first_seq: o.first_seq,
                last_seq: o.last_seq,
                records: o.records,
                has_start: i64::from(o.has_start),
                body: text(o.body, true)?,
            }),
        }
    }
    Ok((segments, runs))
}

/// A stored payload back to a record's JSON: the `type` tag an event was
/// stored without goes back in; a `run.start`'s limits are resolved again
/// (every key set, as the run had them).
fn restore(kind: &str, mut payload: serde_json::Value) -> serde_json::Value {
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

    /// Yes: the writer thread takes batches in the order `append` was
    /// first polled (it encodes, then queues), and refuses one queued behind
    /// a batch that failed.
    fn pipelines(&self) -> bool {
        true
    }

    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        let id = run_id.to_string();
        // By seq: a record replayed in another segment is kept once.
        let mut out: BTreeMap<i64, AuditRecord> = BTreeMap::new();
        // Segments, then the run's tail (its last segment, in `runs`).
        let bodies: Vec<String> = sqlx::query_scalar(
            "SELECT body FROM (\
             SELECT body, first_seq FROM audit_segments WHERE run_id = ?1 \
             UNION ALL SELECT tail, tail_first_seq FROM runs \
             WHERE run_id = ?1 AND tail IS NOT NULL) ORDER BY first_seq",
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

    #[test]
    fn zero_usage_fields_are_left_out_and_nothing_else() {
        let usage = crate::ports::run::Usage {
            input_tokens: 7,
            output_tokens: 3,
            cache_write_tokens: 5,
            ..Default::default()
        };
        let ev = RunEvent::StepFinish {
            iteration: 1,
            text: r#"a,"cache_read_tokens":0,"reasoning_tokens":0}"#.into(),
            tool_calls: 0,
            usage,
            calls: Vec::new(),
        };
        let mut out = b"[1,2,".to_vec();
        assert_eq!(write_event(&mut out, &ev).ok(), Some("step.finish"));
        let stored = String::from_utf8(out[5..].to_vec()).unwrap_or_default();
        assert!(!stored.contains("\"type\""), "{stored}");
        assert!(stored.contains("cache_write_tokens\":5"), "{stored}");
        assert!(!stored.contains(",\"reasoning_tokens\":0,"), "{stored}");
        // The text keeps its look-alikes (its quotes are escaped).
        let v: serde_json::Value = serde_json::from_str(&stored).unwrap_or_default();
        let back: Option<RunEvent> = serde_json::from_value(restore("step.finish", v)).ok();
        assert_eq!(back, Some(ev));
        let ev = RunEvent::StepStart { iteration: 2 };
        let mut out = Vec::new();
        let _ = write_event(&mut out, &ev);
        assert_eq!(out, br#"{"iteration":2}"#);
    }
}
