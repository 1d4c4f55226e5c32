//! The audit log on SQLite: `append` (one transaction per batch: segments
//! and terminal `runs` rows), reading a run's records
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
//! would not give ([`Limits::to_minimal_spec`]). So are rows (version 4):
//! a record's `at_ms` is an offset from its segment's base (the first
//! record's time), and a result leaves out what its row's columns hold and
//! its fields at their defaults ([`write_result`]). Bytes are what the
//! writer thread, the one serial stage of a swarm, pays for: version 4 cut
//! a typical run's row by a fifth (2.1 to 1.7 KB) and raised a swarm's
//! runs/s by about 6 %. Version 5 leaves a result's steps out when its
//! row's tail holds all the run's records and they say the same steps
//! (`"steps":"tail"`, see [`each_tail_step`]): 12 % off a hello run's row.
//! Readers put all of it back, and still read what versions 1
//! (`audit_records`, one row per record), 2 (full payloads, every segment
//! in `audit_segments`) and 3 (absolute times, whole results) wrote.
//!
//! Speed (the audit log is the hot write path): segments are encoded by the
//! caller, then moved (not copied) to the writer thread, which steps one
//! prepared single-row `INSERT` per row on its own connection, one
//! `BEGIN IMMEDIATE` transaction per batch (see the writer module for why).

use std::collections::{BTreeMap, HashMap};
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
use crate::ports::run::{
    cap_text, KillReason, RunEvent, RunId, RunResult, RunStatus, StepRecord, Usage, SUMMARY_BYTES,
};
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

/// Writes a `run.start` payload: the [`RunInfo`]'s JSON with its absent
/// optional fields left out and its limits reduced to
/// [`Limits::to_minimal_spec`]. Runs of one agent share their limits, so
/// the last run's (as given, and as written) are kept for the next.
fn write_info(
    out: &mut Vec<u8>,
    info: &RunInfo,
    last: &mut Option<(LimitsSpec, Vec<u8>)>,
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
    out.extend_from_slice(b"{\"agent\":");
    push_str(out, agent);
    out.extend_from_slice(b",\"model\":");
    push_str(out, model);
    if let Some(c) = caller_id {
        out.extend_from_slice(b",\"caller_id\":");
        push_str(out, c);
    }
    if let Some(c) = channel_id {
        out.extend_from_slice(b",\"channel_id\":");
        push_str(out, c);
    }
    if let Some(p) = parent_run_id {
        out.extend_from_slice(b",\"parent_run_id\":\"");
        out.extend_from_slice(&p.to_hex());
        out.push(b'"');
    }
    if let Some(s) = session_id {
        out.extend_from_slice(b",\"session_id\":");
        push_str(out, s);
    }
    out.extend_from_slice(b",\"prompt\":");
    push_str(out, prompt);
    out.extend_from_slice(b",\"tools\":[");
    for (i, t) in tools.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_str(out, t);
    }
    out.push(b']');
    if let Some(full) = limits {
        if last.as_ref().is_none_or(|(f, _)| f != full) {
            let minimal = full.resolve(&LimitsSpec::default()).to_minimal_spec();
            *last = Some((*full, serde_json::to_vec(&minimal)?));
        }
        if let Some((_, json)) = last {
            out.extend_from_slice(b",\"limits\":");
            out.extend_from_slice(json);
        }
    }
    out.push(b'}');
    Ok(())
}

/// Writes an event payload without its `type` tag (the record's kind says
/// it); returns the kind. An event whose tag is not a known kind keeps it.
/// The events every run has are written by [`write_common_event`].
fn write_event(out: &mut Vec<u8>, ev: &RunEvent) -> serde_json::Result<&'static str> {
    if let Some(kind) = write_common_event(out, ev) {
        return Ok(kind);
    }
    write_event_serde(out, ev)
}

/// [`write_event`] through serde: any event.
fn write_event_serde(out: &mut Vec<u8>, ev: &RunEvent) -> serde_json::Result<&'static str> {
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

/// Writes the events every run has (steps, tool calls and results, the
/// final message) as [`write_event_serde`] would, byte for byte (a test
/// holds them equal), without serde: their keys are fixed ASCII written as
/// they are, where serde scans each for characters to escape — on a swarm
/// of short runs that scan was most of the encoding time. `None`: an event
/// of another kind.
fn write_common_event(out: &mut Vec<u8>, ev: &RunEvent) -> Option<&'static str> {
    match ev {
        RunEvent::StepStart { iteration } => {
            out.extend_from_slice(b"{\"iteration\":");
            push_int(out, *iteration);
            out.push(b'}');
            Some("step.start")
        }
        RunEvent::StepFinish {
            iteration,
            text,
            tool_calls,
            usage,
            calls,
        } => {
            out.extend_from_slice(b"{\"iteration\":");
            push_int(out, *iteration);
            out.extend_from_slice(b",\"text\":");
            push_str(out, text);
            out.extend_from_slice(b",\"tool_calls\":");
            push_int(out, *tool_calls);
            out.extend_from_slice(b",\"usage\":");
            push_usage(out, usage);
            if !calls.is_empty() {
                out.extend_from_slice(b",\"calls\":[");
                for (i, c) in calls.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(b"{\"id\":");
                    push_str(out, &c.id);
                    out.extend_from_slice(b",\"name\":");
                    push_str(out, &c.name);
                    out.extend_from_slice(b",\"arguments\":");
                    push_str(out, &c.arguments);
                    out.push(b'}');
                }
                out.push(b']');
            }
            out.push(b'}');
            Some("step.finish")
        }
        RunEvent::ToolCall {
            iteration,
            call_id,
            tool,
            args,
        } => {
            out.extend_from_slice(b"{\"iteration\":");
            push_int(out, *iteration);
            out.extend_from_slice(b",\"call_id\":");
            push_str(out, call_id);
            out.extend_from_slice(b",\"tool\":");
            push_str(out, tool);
            out.extend_from_slice(b",\"args\":");
            push_str(out, args);
            out.push(b'}');
            Some("tool.call")
        }
        RunEvent::ToolResult {
            iteration,
            call_id,
            tool,
            ok,
            result,
            duration_ms,
        } => {
            out.extend_from_slice(b"{\"iteration\":");
            push_int(out, *iteration);
            out.extend_from_slice(b",\"call_id\":");
            push_str(out, call_id);
            out.extend_from_slice(b",\"tool\":");
            push_str(out, tool);
            out.extend_from_slice(if *ok {
                b",\"ok\":true,\"result\":"
            } else {
                b",\"ok\":false,\"result\":"
            });
            push_str(out, result);
            out.extend_from_slice(b",\"duration_ms\":");
            push_int(out, *duration_ms);
            out.push(b'}');
            Some("tool.result")
        }
        RunEvent::MessageCreate { role, text } => {
            out.extend_from_slice(b"{\"role\":");
            push_str(out, role);
            out.extend_from_slice(b",\"text\":");
            push_str(out, text);
            out.push(b'}');
            Some("message.create")
        }
        _ => None,
    }
}

/// Writes a run's result in its stored form (schema version 4): the keys
/// its `runs` row's columns hold left out (see [`full_result`]), and those
/// at their defaults (`error` and `output` when null, `steps` and `critic`
/// when empty, `cost_micros` when 0, usage counters when 0); otherwise as
/// serde_json writes it, byte for byte (a test holds them equal), without
/// serde for all but its critic decisions (see [`write_common_event`] for
/// why).
fn write_result(out: &mut Vec<u8>, res: &RunResult, steps_in_tail: bool) -> serde_json::Result<()> {
    // Destructured whole: a field added to `RunResult` must be added here.
    let RunResult {
        run_id: _,
        agent: _,
        caller_id: _,
        parent_run_id: _,
        status: _,
        kill_reason: _,
        error_kind: _,
        error,
        output,
        steps,
        iterations,
        usage,
        cost_micros,
        critic,
        started_at: _,
        finished_at: _,
    } = res;
    out.extend_from_slice(b"{\"iterations\":");
    push_int(out, *iterations);
    out.extend_from_slice(b",\"usage\":");
    push_usage(out, usage);
    if let Some(e) = error {
        out.extend_from_slice(b",\"error\":");
        push_str(out, e);
    }
    if let Some(o) = output {
        out.extend_from_slice(b",\"output\":");
        push_str(out, o);
    }
    if steps_in_tail {
        out.extend_from_slice(STEPS_IN_TAIL);
    } else if !steps.is_empty() {
        out.extend_from_slice(b",\"steps\":[");
        for (i, step) in steps.iter().enumerate() {
            let StepRecord {
                iteration,
                tool,
                args,
                ok,
                error,
                result,
                duration_ms,
            } = step;
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"iteration\":");
            push_int(out, *iteration);
            out.extend_from_slice(b",\"tool\":");
            push_str(out, tool);
            out.extend_from_slice(b",\"args\":");
            push_str(out, args);
            out.extend_from_slice(if *ok {
                b",\"ok\":true"
            } else {
                b",\"ok\":false"
            });
            if let Some(e) = error {
                out.extend_from_slice(b",\"error\":");
                push_str(out, e);
            }
            out.extend_from_slice(b",\"result\":");
            push_str(out, result);
            out.extend_from_slice(b",\"duration_ms\":");
            push_int(out, *duration_ms);
            out.push(b'}');
        }
        out.push(b']');
    }
    if *cost_micros != 0 {
        out.extend_from_slice(b",\"cost_micros\":");
        push_int(out, *cost_micros);
    }
    if !critic.is_empty() {
        out.extend_from_slice(b",\"critic\":");
        serde_json::to_writer(&mut *out, critic)?;
    }
    out.push(b'}');
    Ok(())
}

/// What a result (schema version 5) says for `steps` when its row's tail
/// holds every record of the run and [`each_tail_step`] gives its steps back
/// from them: the steps are not written twice.
const STEPS_IN_TAIL: &[u8] = b",\"steps\":\"tail\"";

/// Hands `step` a run's steps as its `tool.call` and `tool.result` events
/// say them, in order: one a result, with the arguments of the call it
/// answers (the last call of that iteration with that id). False when a
/// result has no call or `step` said stop. The run actor writes each step
/// from the same values, so for a run whose events are all here this gives
/// its steps back; the writer checks that it does ([`steps_are_in`])
/// before it leaves them out.
fn each_tail_step<'a>(
    events: impl Iterator<Item = &'a RunEvent>,
    mut step: impl FnMut(StepView<'a>) -> bool,
) -> bool {
    let mut calls: Vec<(u32, &'a str, &'a str)> = Vec::new();
    for ev in events {
        match ev {
            RunEvent::ToolCall {
                iteration,
                call_id,
                args,
                ..
            } => calls.push((*iteration, &**call_id, args.as_str())),
            RunEvent::ToolResult {
                iteration,
                call_id,
                tool,
                ok,
                result,
                duration_ms,
            } => {
                let Some(&(_, _, args)) = calls
                    .iter()
                    .rev()
                    .find(|(i, id, _)| i == iteration && *id == &**call_id)
                else {
                    return false;
                };
                let view = StepView {
                    iteration: *iteration,
                    tool,
                    args,
                    ok: *ok,
                    result,
                    duration_ms: *duration_ms,
                };
                if !step(view) {
                    return false;
                }
            }
            _ => {}
        }
    }
    true
}

/// One step as its events give it (see [`each_tail_step`]).
struct StepView<'a> {
    iteration: u32,
    tool: &'a Arc<str>,
    args: &'a str,
    ok: bool,
    /// The tool's answer, whole (`error: …` when not ok).
    result: &'a str,
    duration_ms: u64,
}

impl StepView<'_> {
    /// The error the run recorded: the answer without its `error: ` prefix.
    fn error(&self) -> Option<&str> {
        (!self.ok).then(|| self.result.strip_prefix("error: ").unwrap_or(self.result))
    }

    /// The summary the run recorded: the answer capped.
    fn summary(&self) -> std::borrow::Cow<'_, str> {
        if self.result.len() <= SUMMARY_BYTES {
            std::borrow::Cow::Borrowed(self.result)
        } else {
            std::borrow::Cow::Owned(cap_text(self.result, SUMMARY_BYTES))
        }
    }

    fn to_step(&self) -> StepRecord {
        StepRecord {
            iteration: self.iteration,
            tool: self.tool.clone(),
            args: self.args.to_string(),
            ok: self.ok,
            error: self.error().map(str::to_string),
            result: self.summary().into_owned(),
            duration_ms: self.duration_ms,
        }
    }

    /// Whether `step` is what [`StepView::to_step`] gives (without building it).
    fn is(&self, step: &StepRecord) -> bool {
        step.iteration == self.iteration
            && step.tool == *self.tool
            && step.args == self.args
            && step.ok == self.ok
            && step.error.as_deref() == self.error()
            && step.duration_ms == self.duration_ms
            && step.result == self.summary()
    }
}

/// Whether `steps` are those `events` give (see [`each_tail_step`]),
/// compared as they come: nothing is built.
fn steps_are_in<'a>(events: impl Iterator<Item = &'a RunEvent>, steps: &[StepRecord]) -> bool {
    let mut expected = steps.iter();
    each_tail_step(events, |v| expected.next().is_some_and(|s| v.is(s)))
        && expected.next().is_none()
}

/// A stored result back to the [`RunResult`]: one written by schema version
/// 4 (no `run_id` key) gets the keys its row's columns hold and the
/// defaults [`write_result`] left out; an older one is whole.
fn full_result(
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
                "status": row.status,
                "kill_reason": row.kill_reason,
                "error_kind": row.error_kind,
                "started_at": row.started_at,
                "finished_at": row.finished_at,
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
fn tail_events(run_id: RunId, tail: &str) -> Result<Vec<RunEvent>, AuditStoreError> {
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

/// Appends a usage object without its counters that are 0 (the
/// [`ZERO_DEFAULTS`]).
fn push_usage(out: &mut Vec<u8>, usage: &Usage) {
    out.extend_from_slice(b"{\"input_tokens\":");
    push_int(out, usage.input_tokens);
    out.extend_from_slice(b",\"output_tokens\":");
    push_int(out, usage.output_tokens);
    for (key, n) in [
        (ZERO_DEFAULTS[0], usage.cache_read_tokens),
        (ZERO_DEFAULTS[1], usage.cache_write_tokens),
        (ZERO_DEFAULTS[2], usage.reasoning_tokens),
    ] {
        if n != 0 {
            // The key without its `0`.
            out.extend_from_slice(&key[..key.len() - 1]);
            push_int(out, n);
        }
    }
    if usage.estimated {
        out.extend_from_slice(b",\"estimated\":true");
    }
    out.push(b'}');
}

/// Appends `s` as a JSON string, as serde_json writes it: as it is when
/// nothing in it needs escaping (the common case, checked in one pass),
/// through serde_json otherwise.
fn push_str(out: &mut Vec<u8>, s: &str) {
    if needs_no_escape(s.as_bytes()) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// Whether no byte of `s` is one JSON escapes (a control character, `"`
/// or `\`), eight bytes at a time.
fn needs_no_escape(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte of `v` is 0 ⇔ its high bit is set here (no false positives
    // once any byte is found: what matters is whether there is one).
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let chunks = s.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        let v = u64::from_le_bytes(word);
        // Bytes below 0x20: v - 0x20 per byte borrows into the high bit
        // of a byte that was below it (and had its high bit clear).
        let control = v.wrapping_sub(ONES * 0x20) & !v & HIGHS;
        if control
            | zero_byte(v ^ (ONES * u64::from(b'"')))
            | zero_byte(v ^ (ONES * u64::from(b'\\')))
            != 0
        {
            return false;
        }
    }
    rest.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
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
    struct Open<'b> {
        run_id: RunId,
        first_seq: i64,
        last_seq: i64,
        records: i64,
        has_start: bool,
        body: Vec<u8>,
        /// The first record's time: `at_ms` is written as the offset from it.
        at_base: i64,
        result: Option<Arc<RunResult>>,
        /// Its records came in seq order from 0 without a gap or a repeat.
        from_start: bool,
        /// Its tool events (for [`steps_are_in`]).
        tools: Vec<&'b RunEvent>,
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
                    at_base: to_i64(r.at_ms),
                    result: None,
                    from_start: r.seq == 0,
                    tools: Vec::new(),
                });
                open.len() - 1
            }),
        };
        last = Some((r.run_id, i));
        let o = &mut open[i];
        let seq = i64::from(r.seq);
        if o.records > 0 && seq != o.last_seq + 1 {
            o.from_start = false;
        }
        o.first_seq = o.first_seq.min(seq);
        o.last_seq = o.last_seq.max(seq);
        o.body.push(if o.records == 0 { b'[' } else { b',' });
        o.records += 1;
        o.body.push(b'[');
        push_int(&mut o.body, r.seq);
        o.body.push(b',');
        push_int(&mut o.body, to_i64(r.at_ms) - o.at_base);
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
                if matches!(ev, RunEvent::ToolCall { .. } | RunEvent::ToolResult { .. }) {
                    o.tools.push(ev);
                }
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
                    // Every record of the run is in this tail: its steps
                    // are read back from them when they say the same.
                    let steps_in_tail = o.from_start
                        && !res.steps.is_empty()
                        && steps_are_in(o.tools.iter().copied(), &res.steps);
                    write_result(&mut json, &res, steps_in_tail).map_err(|e| {
                        AuditStoreError::Unavailable(format!(
                            "the result of run {} does not encode: {e}",
                            o.run_id
                        ))
                    })?;
                    text(json, false)?
                },
                tail_first_seq: o.first_seq,
                tail_records: o.records,
                tail: text(o.body, true)?,
                tail_at_base: o.at_base,
            }),
            None => segments.push(SegmentRow {
                run_id,
                first_seq: o.first_seq,
                last_seq: o.last_seq,
                records: o.records,
                has_start: i64::from(o.has_start),
                body: text(o.body, true)?,
                at_base: o.at_base,
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

/// A stored `run.start` or event record (a `run.end` record's payload is
/// its run's result: see `terminal_record`).
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

impl SqliteStore {
    /// A run's result from its `runs` row. `tail`: the row's tail, when the
    /// caller has read it already (otherwise it is read with the result, in
    /// case the result leaves its steps to it).
    async fn stored_result(
        &self,
        run_id: RunId,
        tail: Option<&str>,
    ) -> Result<Option<RunResult>, AuditStoreError> {
        let sql = if tail.is_some() {
            "SELECT run_id, agent, caller_id, parent_run_id, status, kill_reason, error_kind, \
             started_at, finished_at, result FROM runs WHERE run_id = ?"
        } else {
            "SELECT run_id, agent, caller_id, parent_run_id, status, kill_reason, error_kind, \
             started_at, finished_at, result, tail FROM runs WHERE run_id = ?"
        };
        let row = sqlx::query(sql)
            .bind(run_id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        row.map(|row| {
            let body: &str = row.try_get(9).map_err(unavailable)?;
            let read: Option<&str> = match tail {
                Some(_) => None,
                None => row.try_get(10).map_err(unavailable)?,
            };
            full_result(body, &summary(&row)?, tail.or(read))
        })
        .transpose()
    }

    /// A run's `run.end` record: its payload is the run's result, in `runs`.
    /// `tail`: the stored records it was found among, if the caller has them.
    async fn terminal_record(
        &self,
        run_id: RunId,
        seq: i64,
        at_ms: i64,
        tail: Option<&str>,
    ) -> Result<AuditRecord, AuditStoreError> {
        let result = self.stored_result(run_id, tail).await?.ok_or_else(|| {
            AuditStoreError::Unavailable(format!("run {run_id} has a run.end record but no result"))
        })?;
        Ok(AuditRecord {
            run_id,
            seq: u32::try_from(seq).unwrap_or(u32::MAX),
            at_ms: to_u64(at_ms),
            entry: AuditEntry::Terminal(Arc::new(result)),
        })
    }
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
        // A segment's times are offsets from its base (absolute before
        // schema version 4: no base).
        let bodies: Vec<(String, i64)> = sqlx::query_as(
            "SELECT body, at_base FROM (\
             SELECT body, first_seq, COALESCE(at_base, 0) AS at_base FROM audit_segments \
             WHERE run_id = ?1 \
             UNION ALL SELECT tail, tail_first_seq, COALESCE(tail_at_base, 0) FROM runs \
             WHERE run_id = ?1 AND tail IS NOT NULL) ORDER BY first_seq",
        )
        .bind(&id)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
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
                    self.terminal_record(run_id, seq, at_ms, Some(body.as_str()))
                        .await?
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
            "SELECT seq, at_ms, kind, body FROM audit_records WHERE run_id = ? ORDER BY seq",
        )
        .bind(&id)
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        for row in &rows {
            let seq: i64 = row.try_get(0).map_err(unavailable)?;
            let at_ms: i64 = row.try_get(1).map_err(unavailable)?;
            let kind: &str = row.try_get(2).map_err(unavailable)?;
            let body: &str = row.try_get(3).map_err(unavailable)?;
            if out.contains_key(&seq) {
                continue;
            }
            let record = if kind == KIND_END {
                self.terminal_record(run_id, seq, at_ms, None).await?
            } else {
                decode(run_id, seq, at_ms, kind, body)?
            };
            out.insert(seq, record);
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
        // `runs_by_status` holds only runs that did not end `ok` (schema
        // version 5). For another status, `status <> 'ok'` lets the planner
        // use it; `ok` rows are most rows, found by walking `runs_by_finish`
        // newest first: `status || ''` keeps the planner from scanning the
        // table and sorting it all instead (as it would for `status = ?`).
        match filter.status {
            Some(RunStatus::Ok) => {
                q.push(" AND status || '' = ")
                    .push_bind(RunStatus::Ok.as_str());
            }
            Some(status) => {
                q.push(" AND status = ")
                    .push_bind(status.as_str())
                    .push(" AND status <> 'ok'");
            }
            None => {}
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
        self.stored_result(run_id, None).await
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
    fn common_events_are_written_as_serde_writes_them() {
        use crate::ports::model::ToolCallRequest;
        use crate::ports::run::Usage;
        let tricky = "quote \" backslash \\ tab \t nl \n bell \u{7} é ✓ \u{7f}";
        let call = |arguments: &str| ToolCallRequest {
            id: "call_0".into(),
            name: "add".into(),
            arguments: arguments.into(),
        };
        let events = [
            RunEvent::StepStart { iteration: 1 },
            RunEvent::StepFinish {
                iteration: 2,
                text: String::new(),
                tool_calls: 2,
                usage: Usage {
                    input_tokens: 17,
                    output_tokens: 3,
                    ..Default::default()
                },
                calls: vec![call(r#"{"a":2,"b":3}"#), call(tricky)],
            },
            RunEvent::StepFinish {
                iteration: u32::MAX,
                text: tricky.into(),
                tool_calls: 0,
                usage: Usage {
                    input_tokens: u64::MAX,
                    output_tokens: 0,
                    cache_read_tokens: 5,
                    cache_write_tokens: 0,
                    reasoning_tokens: 9,
                    estimated: false,
                },
                calls: Vec::new(),
            },
            RunEvent::ToolCall {
                iteration: 3,
                call_id: "c\"1".into(),
                tool: "upper".into(),
                args: tricky.into(),
            },
            RunEvent::ToolResult {
                iteration: 3,
                call_id: "c1".into(),
                tool: "upper".into(),
                ok: true,
                result: "DONE".into(),
                duration_ms: 12,
            },
            RunEvent::ToolResult {
                iteration: 4,
                call_id: "c2".into(),
                tool: "t".into(),
                ok: false,
                result: tricky.into(),
                duration_ms: 0,
            },
            RunEvent::MessageCreate {
                role: "assistant".into(),
                text: tricky.into(),
            },
        ];
        for ev in &events {
            let mut fast = Vec::new();
            let mut slow = Vec::new();
            let kind = write_common_event(&mut fast, ev);
            let want = write_event_serde(&mut slow, ev).ok();
            assert!(kind.is_some(), "{ev:?} has no fast path");
            assert_eq!(kind, want);
            assert_eq!(
                String::from_utf8_lossy(&fast),
                String::from_utf8_lossy(&slow)
            );
        }
        // Results, as serde writes them less the zero usage counters.
        let step = |ok: bool, error: Option<&str>| StepRecord {
            iteration: 1,
            tool: "add".into(),
            args: tricky.into(),
            ok,
            error: error.map(str::to_string),
            result: "5".into(),
            duration_ms: 3,
        };
        let results = [
            RunResult {
                run_id: RunId(7),
                agent: "hello".into(),
                caller_id: Some("swarm".into()),
                parent_run_id: None,
                status: RunStatus::Ok,
                kill_reason: None,
                error_kind: None,
                error: None,
                output: Some(tricky.into()),
                steps: vec![step(true, None), step(false, Some(tricky))],
                iterations: 3,
                usage: Usage {
                    input_tokens: 157,
                    output_tokens: 14,
                    ..Default::default()
                },
                cost_micros: 0,
                critic: Vec::new(),
                started_at: 1,
                finished_at: 2,
            },
            RunResult {
                run_id: RunId(u128::MAX),
                agent: tricky.into(),
                caller_id: None,
                parent_run_id: Some(RunId(1 << 100)),
                status: RunStatus::Killed,
                kill_reason: Some(KillReason::Runaway),
                error_kind: Some("runaway".into()),
                error: Some(tricky.into()),
                output: None,
                steps: Vec::new(),
                iterations: 0,
                usage: Usage {
                    input_tokens: 1,
                    output_tokens: 2,
                    cache_read_tokens: 3,
                    cache_write_tokens: 0,
                    reasoning_tokens: 5,
                    estimated: true,
                },
                cost_micros: u64::MAX,
                critic: vec![crate::ports::run::CriticDecision {
                    action: crate::ports::run::CriticAction::Kill,
                    reason: tricky.into(),
                    at_ms: 9,
                    detail: Some("d".into()),
                }],
                started_at: u64::MAX,
                finished_at: 0,
            },
        ];
        for res in &results {
            let mut fast = Vec::new();
            assert!(write_result(&mut fast, res, false).is_ok());
            // As serde writes it, less the keys the row holds and the
            // defaults; read back whole with the row's columns.
            let mut slow = serde_json::to_vec(res).unwrap_or_default();
            strip_zero_defaults(&mut slow, 0);
            let mut slow: serde_json::Value = serde_json::from_slice(&slow).unwrap_or_default();
            if let Some(map) = slow.as_object_mut() {
                map.retain(|k, v| {
                    let column = [
                        "run_id",
                        "agent",
                        "caller_id",
                        "parent_run_id",
                        "status",
                        "kill_reason",
                        "error_kind",
                        "started_at",
                        "finished_at",
                    ]
                    .contains(&k.as_str());
                    let default = v.is_null()
                        || *v == serde_json::json!([])
                        || (k == "cost_micros" && *v == serde_json::json!(0));
                    !column && !default
                });
            }
            let stored: serde_json::Value = serde_json::from_slice(&fast).unwrap_or_default();
            assert_eq!(stored, slow);
            assert!(stored.get("run_id").is_none());
            let text = String::from_utf8_lossy(&fast);
            let back = full_result(&text, &RunSummary::of(res), None).ok();
            assert_eq!(back.as_ref(), Some(res));
            // A result written before version 4 is whole, and read as it is.
            let whole = serde_json::to_string(res).unwrap_or_default();
            let other_row = RunSummary {
                agent: "another".into(),
                ..RunSummary::of(res)
            };
            assert_eq!(
                full_result(&whole, &other_row, None).ok().as_ref(),
                Some(res)
            );
        }
        // run.start: absent fields left out, limits reduced; read back whole.
        let full = crate::spec::LimitsSpec {
            max_runtime: Some(std::time::Duration::from_secs(30)),
            ..Default::default()
        }
        .resolve(&LimitsSpec::default())
        .to_spec();
        for (caller, parent, session) in [
            (None, None, None),
            (Some(tricky), Some(RunId(3)), Some("s")),
        ] {
            let info = RunInfo {
                agent: tricky.into(),
                model: "scripted".into(),
                caller_id: caller.map(Into::into),
                channel_id: caller.map(str::to_string),
                parent_run_id: parent,
                session_id: session.map(str::to_string),
                prompt: tricky.into(),
                tools: vec!["add".to_string(), tricky.to_string()].into(),
                limits: Some(full),
            };
            let mut out = Vec::new();
            let mut last = None;
            assert!(write_info(&mut out, &info, &mut last).is_ok());
            let stored: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
            assert_eq!(stored["limits"], serde_json::json!({"max_runtime": "30s"}));
            let back: Option<RunInfo> = serde_json::from_value(restore(KIND_START, stored)).ok();
            assert_eq!(back, Some(info));
        }
        // Other kinds go through serde.
        let ev = RunEvent::TextDelta {
            iteration: 1,
            text: "x".into(),
        };
        assert_eq!(write_common_event(&mut Vec::new(), &ev), None);
    }

    #[test]
    fn the_escape_check_matches_serde() {
        let mut cases: Vec<String> = vec![
            String::new(),
            "plain ascii text of some length, more than eight".into(),
            "é✓ unicode".into(),
            "\u{7f} del is not escaped".into(),
        ];
        for bad in ['"', '\\', '\n', '\u{0}', '\u{1f}'] {
            for at in [0, 3, 7, 8, 15, 16, 20] {
                let mut s: String = "abcdefghijklmnopqrstuvwxyz".chars().take(21).collect();
                s.insert(at, bad);
                cases.push(s);
            }
        }
        for s in &cases {
            let escaped = serde_json::to_string(s).unwrap_or_default();
            let plain = escaped.len() == s.len() + 2;
            assert_eq!(needs_no_escape(s.as_bytes()), plain, "{s:?}");
            let mut out = Vec::new();
            push_str(&mut out, s);
            assert_eq!(String::from_utf8_lossy(&out), escaped);
        }
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
