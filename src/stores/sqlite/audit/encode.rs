//! The encoder: a batch of [`AuditRecord`]s to the rows the writer thread
//! inserts (one segment per run; a `runs` row for a run whose terminal
//! record is in the batch), in the compact stored form (see the module
//! above). Runs on the caller of `append`, never on the writer thread.
//!
//! Guarantee: what it writes reads back equal ([`super::decode`]); the
//! hand-written fast paths write byte for byte what serde_json would (the
//! tests in `super::tests` hold both).

use std::collections::HashMap;
use std::sync::Arc;

use super::json::{push_int, push_run_usage, push_str, push_usage, strip_zero_defaults};
use super::steps::{steps_are_in, STEPS_IN_TAIL};
use super::{KIND_END, KIND_START};
use crate::ports::audit::{AuditEntry, AuditRecord, AuditStoreError, RunInfo};
use crate::ports::event::RunEvent;
use crate::ports::limits::Limits;
use crate::ports::run::{KillReason, RunId, RunResult, StepRecord};
use crate::stores::sqlite::to_i64;
use crate::stores::sqlite::writer::{ManifestRow, RunRow, SegmentRow, TemplateRow};

/// Writes a `run.start` payload: the [`RunInfo`]'s JSON with its absent
/// optional fields left out and its limits reduced to
/// [`Limits::to_minimal_spec`]. Runs of one agent share their limits, so
/// the last run's (as given, and as written) are kept for the next.
pub(super) fn write_info(
    out: &mut Vec<u8>,
    info: &RunInfo,
    last: &mut Option<(Limits, Vec<u8>)>,
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
        host,
        manifest,
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
            *last = Some((*full, serde_json::to_vec(&full.to_minimal_spec())?));
        }
        if let Some((_, json)) = last {
            out.extend_from_slice(b",\"limits\":");
            out.extend_from_slice(json);
        }
    }
    if let Some(h) = host {
        out.extend_from_slice(b",\"host\":");
        push_str(out, h);
    }
    // The id alone: the JSON is a `manifests` row (schema version 14). A
    // manifest without its JSON (a record read back from a store that did
    // not keep it) is not named: nothing would answer the id.
    if let Some(m) = manifest.as_ref().filter(|m| m.json.is_some()) {
        out.extend_from_slice(b",\"manifest\":\"");
        out.extend_from_slice(m.id_hex().as_bytes());
        out.push(b'"');
    }
    out.push(b'}');
    Ok(())
}

/// Writes an event payload without its `type` tag (the record's kind says
/// it); returns the kind, [`RunEvent::kind`].
/// The events every run has are written by [`write_common_event`].
pub(super) fn write_event(out: &mut Vec<u8>, ev: &RunEvent) -> serde_json::Result<&'static str> {
    if let Some(kind) = write_common_event(out, ev) {
        return Ok(kind);
    }
    write_event_serde(out, ev)
}

/// [`write_event`] through serde: any event.
pub(super) fn write_event_serde(
    out: &mut Vec<u8>,
    ev: &RunEvent,
) -> serde_json::Result<&'static str> {
    let start = out.len();
    serde_json::to_writer(&mut *out, ev)?;
    let kind = ev.kind();
    // serde writes an internally tagged enum's tag first: `{"type":"<kind>"`
    // then `,` or `}`. Were it ever otherwise, the tag would stay in the
    // payload (and be read back all the same).
    let tag = 10 + kind.len();
    if out[start..].starts_with(b"{\"type\":\"")
        && out.get(start + 9..start + tag - 1) == Some(kind.as_bytes())
        && out.get(start + tag - 1) == Some(&b'"')
    {
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

/// Writes the events every run has (steps, tool calls and results, the
/// final message) as [`write_event_serde`] would, byte for byte (a test
/// holds them equal), without serde: their keys are fixed ASCII written as
/// they are, where serde scans each for characters to escape — on a swarm
/// of short runs that scan was most of the encoding time. `None`: an event
/// of another kind.
pub(super) fn write_common_event(out: &mut Vec<u8>, ev: &RunEvent) -> Option<&'static str> {
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
            finish_reason,
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
            if let Some(reason) = finish_reason {
                out.extend_from_slice(b",\"finish_reason\":");
                push_str(out, reason);
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
pub(super) fn write_result(
    out: &mut Vec<u8>,
    res: &RunResult,
    steps_in_tail: bool,
) -> serde_json::Result<()> {
    // Destructured whole: a field added to `RunResult` must be added here.
    let RunResult {
        run_id: _,
        agent: _,
        caller_id: _,
        parent_run_id: _,
        root_run_id: _,
        status: _,
        kill_reason: _,
        loop_kind,
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
        forked_from: _,
    } = res;
    out.extend_from_slice(b"{\"iterations\":");
    push_int(out, *iterations);
    out.extend_from_slice(b",\"usage\":");
    push_run_usage(out, usage);
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
    if let Some(kind) = loop_kind {
        out.extend_from_slice(b",\"loop\":");
        push_str(out, kind.as_str());
    }
    out.push(b'}');
    Ok(())
}

/// The texts (tails, results) recently written, by hash: one written again
/// is stored once, as a template (schema version 11). Bounded: past
/// [`Repeats::CAPACITY`] hashes it starts over.
#[derive(Default)]
pub(in crate::stores::sqlite) struct Repeats {
    seen: std::collections::HashSet<u64>,
}

impl Repeats {
    /// Hashes remembered, at most.
    const CAPACITY: usize = 4096;
    /// Texts shorter than this are not worth a reference.
    const MIN_BYTES: usize = 48;
    /// Nor are texts longer than this kept as templates.
    const MAX_BYTES: usize = 16 * 1024;

    /// The template id of `text` if it was seen before (else remembers it).
    fn template(&mut self, text: &str) -> Option<i64> {
        use std::hash::{Hash, Hasher};
        if text.len() < Self::MIN_BYTES || text.len() > Self::MAX_BYTES {
            return None;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        let hash = h.finish();
        if self.seen.contains(&hash) {
            return Some((hash >> 1) as i64);
        }
        if self.seen.len() >= Self::CAPACITY {
            self.seen.clear();
        }
        self.seen.insert(hash);
        None
    }
}

/// Points `row`'s tail and result at templates where [`Repeats`] says
/// they repeat, counting the references in `templates`.
fn use_templates(row: &mut RunRow, repeats: &mut Repeats, templates: &mut Vec<TemplateRow>) {
    let mut point = |text: &str| -> Option<i64> {
        let id = repeats.template(text)?;
        match templates.iter_mut().find(|t| t.id == id) {
            Some(t) if t.body == text => t.refs += 1,
            Some(_) => return None,
            None => templates.push(TemplateRow {
                id,
                body: text.to_string(),
                refs: 1,
            }),
        }
        Some(id)
    };
    row.tail_ref = point(&row.tail);
    row.result_ref = point(&row.result);
}

/// What a batch encodes to: segments, `runs` rows, the templates the rows
/// point at, and the manifests its `run.start` records name (each once).
pub(super) type Encoded = (
    Vec<SegmentRow>,
    Vec<RunRow>,
    Vec<TemplateRow>,
    Vec<ManifestRow>,
);

/// Encodes a batch: one segment per run, its records in batch order, as
/// `[[seq, at_ms, kind, payload], …]`. A run whose terminal record is in
/// the batch gets a `runs` row, which takes the result JSON (the record's
/// payload in the segment is `null`) and the segment itself, as its tail;
/// the other segments are `audit_segments` rows.
pub(super) fn encode(
    batch: &[AuditRecord],
    repeats: Option<&mut Repeats>,
) -> Result<Encoded, AuditStoreError> {
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
    let mut manifests: Vec<ManifestRow> = Vec::new();
    for r in batch {
        if matches!(r.entry, AuditEntry::Publish(_)) {
            // Not a record of the log: its intents go to the outbox
            // (`super::super::outbox`), in this batch's transaction.
            continue;
        }
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
                if let Some(m) = &info.manifest {
                    if let Some(json) = &m.json {
                        let id = m.id as i64;
                        if !manifests.iter().any(|row| row.id == id) {
                            manifests.push(ManifestRow {
                                id,
                                body: json.text().to_string(),
                            });
                        }
                    }
                }
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
            // Left out above.
            AuditEntry::Publish(_) => {}
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
                root_run_id: res.root_run_id.map(|p| p.to_string()),
                forked_from: res.forked_from.and_then(|f| serde_json::to_string(&f).ok()),
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
                tail_ref: None,
                result_ref: None,
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
    let mut templates = Vec::new();
    if let Some(repeats) = repeats {
        for row in &mut runs {
            use_templates(row, repeats, &mut templates);
        }
    }
    Ok((segments, runs, templates, manifests))
}
