//! Diff (P3): two recorded runs aligned step by step, their first
//! divergence, and what differs in each aligned pair and in their endings.
//!
//! A run's steps are read from its audit records ([`StepTrace`], one per
//! model call: the text, the tool calls with a hash of their canonical
//! arguments, the results the model was shown, the call's usage and
//! latency, the critic's decisions while it was the current step). Step
//! `i` of one run is paired with step `i` of the other; a pair
//! **agrees** when both have the step, their tool calls are the same
//! (tool and canonical-argument hash, in order), their results are the
//! same, and their texts are similar: a word-multiset Jaccard similarity
//! of at least [`SAME_TEXT`] (identical texts are 1, two empty ones too).
//! Tokens, latency and critic decisions are reported as differences of
//! the pair but do not make it disagree.
//!
//! [`first_divergence`](TraceDiff::first_divergence) is the first pair
//! that disagrees (`null` when every pair agrees and the endings too);
//! when every pair agrees but the endings differ, it is the last step
//! with `what: ["ending"]`.
//!
//! The JSON form ([`TraceDiff`]) is stable: its keys are documented in
//! `docs/fork.md`, and a rename is a breaking change.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::dispatch::validate;
use crate::ports::audit::{AuditEntry, AuditRecord, RunInfo};
use crate::ports::event::RunEvent;
use crate::ports::run::{ForkOrigin, KillReason, RunId, RunResult, RunStatus, Usage};

/// Texts at least this similar (word-multiset Jaccard) count as the same.
pub const SAME_TEXT: f64 = 0.9;

/// A latency difference smaller than this (ms) is not reported.
const LATENCY_SLACK_MS: u64 = 100;

/// One tool call of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallTrace {
    /// The tool's name as the model gave it.
    pub tool: String,
    /// A hash of the tool and its canonical arguments (16 hex digits):
    /// two calls with the same hash are the same call.
    pub args_hash: String,
    /// The arguments in canonical form (keys sorted; capped).
    pub args: String,
}

/// One tool result of a step, as the model was shown it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResultTrace {
    /// The tool.
    pub tool: String,
    /// Whether the call succeeded.
    pub ok: bool,
    /// The result (or `error: KIND: MESSAGE`).
    pub result: String,
}

/// One model call of a run and what followed it, from the run's records.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepTrace {
    /// The model call (1-based: the `iteration`).
    pub step: u32,
    /// The assistant's text.
    pub text: String,
    /// The tool calls it asked for, in order.
    pub calls: Vec<CallTrace>,
    /// The results of those calls, in the order they came back.
    pub results: Vec<ResultTrace>,
    /// The call's usage.
    pub usage: Usage,
    /// From `step.start` to `step.finish`, in ms (when both are on record).
    pub latency_ms: Option<u64>,
    /// The critic's decisions while this was the current step
    /// (`action/reason`).
    pub critic: Vec<String>,
}

impl StepTrace {
    /// Whether the model answered the same and the tools said the same:
    /// text, calls and results equal (what a fork's replayed steps must
    /// keep; timing and usage aside).
    pub fn same_as(&self, other: &StepTrace) -> bool {
        self.text == other.text && self.calls == other.calls && self.results == other.results
    }
}

/// A call's canonical form as the diff keeps it.
fn call_trace(tool: &str, arguments: &str) -> CallTrace {
    CallTrace {
        tool: tool.to_string(),
        args_hash: format!("{:016x}", validate::canonical_hash(tool, arguments)),
        args: crate::ports::run::cap_text(&validate::canonical_json(arguments), 512),
    }
}

/// Builds [`StepTrace`]s from a run's events in order, each with the
/// Unix ms it was recorded at (0 when unknown).
#[derive(Default)]
pub(crate) struct StepBuilder {
    steps: Vec<StepTrace>,
    started: HashMap<u32, u64>,
    current: u32,
}

impl StepBuilder {
    /// Takes the next event.
    pub(crate) fn push(&mut self, at_ms: u64, event: &RunEvent) {
        match event {
            RunEvent::StepStart { iteration } => {
                self.current = *iteration;
                self.started.insert(*iteration, at_ms);
            }
            RunEvent::StepFinish {
                iteration,
                text,
                usage,
                calls,
                ..
            } => {
                self.current = *iteration;
                let latency_ms = self
                    .started
                    .get(iteration)
                    .filter(|_| at_ms > 0)
                    .map(|s| at_ms.saturating_sub(*s));
                self.steps.push(StepTrace {
                    step: *iteration,
                    text: text.clone(),
                    calls: calls
                        .iter()
                        .map(|c| call_trace(&c.name, &c.arguments))
                        .collect(),
                    results: Vec::new(),
                    usage: *usage,
                    latency_ms,
                    critic: Vec::new(),
                });
            }
            RunEvent::ToolResult {
                iteration,
                tool,
                ok,
                result,
                ..
            } => {
                if let Some(s) = self.steps.iter_mut().rev().find(|s| s.step == *iteration) {
                    s.results.push(ResultTrace {
                        tool: tool.to_string(),
                        ok: *ok,
                        result: result.clone(),
                    });
                }
            }
            RunEvent::CriticSteer(d)
            | RunEvent::CriticExtend(d)
            | RunEvent::CriticRaiseIterations(d)
            | RunEvent::CriticKill(d)
            | RunEvent::CriticDeny(d)
            | RunEvent::CriticAsk(d) => {
                let current = self.current;
                if let Some(s) = self.steps.iter_mut().rev().find(|s| s.step == current) {
                    let action = serde_json::to_value(d.action)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    s.critic.push(format!("{action}/{}", d.reason));
                }
            }
            _ => {}
        }
    }

    /// The steps so far.
    pub(crate) fn steps(&self) -> &[StepTrace] {
        &self.steps
    }

    /// The steps.
    pub(crate) fn finish(self) -> Vec<StepTrace> {
        self.steps
    }
}

/// The steps of a recorded run, from its audit records.
pub fn steps_of(records: &[AuditRecord]) -> Vec<StepTrace> {
    let mut b = StepBuilder::default();
    for r in records {
        if let AuditEntry::Event(e) = &r.entry {
            b.push(r.at_ms, e);
        }
    }
    b.finish()
}

/// The tokens of a run or a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tokens {
    /// Prompt tokens.
    pub input: u64,
    /// Completion tokens.
    pub output: u64,
}

impl From<&Usage> for Tokens {
    fn from(u: &Usage) -> Self {
        Tokens {
            input: u.input_tokens,
            output: u.output_tokens,
        }
    }
}

/// One side of a diff: the run and how it ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSide {
    /// The run.
    pub run_id: RunId,
    /// Its agent.
    pub agent: String,
    /// Its model, as its start record names it.
    pub model: Option<String>,
    /// How it ended (`null`: not ended on record).
    pub status: Option<RunStatus>,
    /// Why it was killed.
    pub kill_reason: Option<KillReason>,
    /// Its error kind.
    pub error_kind: Option<String>,
    /// Its output.
    pub output: Option<String>,
    /// Whether its answer met its `output_schema`: `false` when it ended
    /// `invalid_output`, `true` when it ended `ok` after a repair turn,
    /// `null` when the records cannot tell (no schema, or none needed).
    pub output_valid: Option<bool>,
    /// Model calls on record.
    pub steps: usize,
    /// Its tokens (its own calls').
    pub tokens: Tokens,
    /// Its cost in micro-dollars.
    pub cost_micros: u64,
    /// Start to end, in ms.
    pub duration_ms: u64,
    /// The critic's decisions (`action/reason`), in order.
    pub critic: Vec<String>,
    /// The run it was forked from, if it is a fork.
    pub forked_from: Option<ForkOrigin>,
}

/// One aligned pair of steps.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepPair {
    /// The step (model call, 1-based).
    pub step: u32,
    /// Whether the pair agrees (see the module doc).
    pub same: bool,
    /// The texts' similarity (0 to 1; `null` when a side has no step).
    pub text_similarity: Option<f64>,
    /// What differs: `missing`, `text`, `calls`, `results`, `tokens`,
    /// `latency`, `critic`.
    pub differences: Vec<&'static str>,
    /// Run A's step.
    pub a: Option<StepTrace>,
    /// Run B's step.
    pub b: Option<StepTrace>,
}

/// Where two runs first part.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Divergence {
    /// The first model call that differs (see the module doc).
    pub step: u32,
    /// What differs there (`missing`, `text`, `calls`, `results`, or
    /// `ending`).
    pub what: Vec<&'static str>,
}

/// The two endings compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Endings {
    /// Whether status, kill reason, error kind, output and output validity
    /// are the same.
    pub same: bool,
    /// Which of them differ.
    pub differences: Vec<&'static str>,
}

/// `agentvisor diff A B`: the stable JSON form (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceDiff {
    /// Run A.
    pub a: RunSide,
    /// Run B.
    pub b: RunSide,
    /// The first pair that disagrees, or `null` when the traces agree.
    pub first_divergence: Option<Divergence>,
    /// Every aligned pair, in step order.
    pub steps: Vec<StepPair>,
    /// The endings compared.
    pub endings: Endings,
}

/// Why a diff could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiffError {
    /// A run has no records.
    #[error("run {0} has no records")]
    NoRecords(RunId),
}

/// Word-multiset Jaccard similarity of two texts (1 for two empty ones).
pub fn text_similarity(a: &str, b: &str) -> f64 {
    if a == b {
        return 1.0;
    }
    let mut counts: HashMap<&str, (u32, u32)> = HashMap::new();
    for w in a.split_whitespace() {
        counts.entry(w).or_default().0 += 1;
    }
    for w in b.split_whitespace() {
        counts.entry(w).or_default().1 += 1;
    }
    let (mut both, mut any) = (0u64, 0u64);
    for (x, y) in counts.values() {
        both += u64::from((*x).min(*y));
        any += u64::from((*x).max(*y));
    }
    if any == 0 {
        // Texts that differ in whitespace only.
        return 1.0;
    }
    both as f64 / any as f64
}

fn side(run_id: RunId, records: &[AuditRecord], steps: &[StepTrace]) -> RunSide {
    let info: Option<&RunInfo> = records.iter().find_map(|r| match &r.entry {
        AuditEntry::RunStarted(i) => Some(&**i),
        _ => None,
    });
    let end: Option<&Arc<RunResult>> = records.iter().find_map(|r| match &r.entry {
        AuditEntry::Terminal(res) => Some(res),
        _ => None,
    });
    let repaired = records.iter().any(|r| {
        matches!(&r.entry, AuditEntry::Event(RunEvent::MessageCreate { role, text })
            if role == "user" && text.starts_with(crate::output::REPAIR_PREFIX))
    });
    let output_valid = end.and_then(|e| {
        if e.error_kind.as_deref() == Some("invalid_output") {
            Some(false)
        } else if e.status == RunStatus::Ok && repaired {
            Some(true)
        } else {
            None
        }
    });
    let tokens = match end {
        Some(e) => Tokens::from(&e.usage.own),
        None => steps.iter().fold(Tokens::default(), |t, s| Tokens {
            input: t.input + s.usage.input_tokens,
            output: t.output + s.usage.output_tokens,
        }),
    };
    RunSide {
        run_id,
        agent: end
            .map(|e| e.agent.clone())
            .or_else(|| info.map(|i| i.agent.to_string()))
            .unwrap_or_default(),
        model: info.map(|i| i.model.to_string()),
        status: end.map(|e| e.status),
        kill_reason: end.and_then(|e| e.kill_reason),
        error_kind: end.and_then(|e| e.error_kind.clone()),
        output: end.and_then(|e| e.output.clone()),
        output_valid,
        steps: steps.len(),
        tokens,
        cost_micros: end.map_or(0, |e| e.cost_micros),
        duration_ms: end.map_or(0, |e| e.duration_ms()),
        critic: end
            .map(|e| {
                e.critic
                    .iter()
                    .map(|d| {
                        let action = serde_json::to_value(d.action)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default();
                        format!("{action}/{}", d.reason)
                    })
                    .collect()
            })
            .unwrap_or_default(),
        forked_from: end.and_then(|e| e.forked_from),
    }
}

fn pair(step: u32, a: Option<&StepTrace>, b: Option<&StepTrace>) -> StepPair {
    let (Some(x), Some(y)) = (a, b) else {
        return StepPair {
            step,
            same: false,
            text_similarity: None,
            differences: vec!["missing"],
            a: a.cloned(),
            b: b.cloned(),
        };
    };
    let similarity = text_similarity(&x.text, &y.text);
    let mut differences = Vec::new();
    if similarity < SAME_TEXT {
        differences.push("text");
    }
    if x.calls
        .iter()
        .map(|c| &c.args_hash)
        .ne(y.calls.iter().map(|c| &c.args_hash))
        || x.calls
            .iter()
            .map(|c| &c.tool)
            .ne(y.calls.iter().map(|c| &c.tool))
    {
        differences.push("calls");
    }
    if x.results != y.results {
        differences.push("results");
    }
    let same = differences.is_empty();
    if Tokens::from(&x.usage) != Tokens::from(&y.usage) {
        differences.push("tokens");
    }
    if let (Some(l), Some(m)) = (x.latency_ms, y.latency_ms) {
        let (lo, hi) = (l.min(m), l.max(m));
        if hi - lo > LATENCY_SLACK_MS && hi > lo.saturating_mul(3) / 2 {
            differences.push("latency");
        }
    }
    if x.critic != y.critic {
        differences.push("critic");
    }
    StepPair {
        step,
        same,
        text_similarity: Some(similarity),
        differences,
        a: Some(x.clone()),
        b: Some(y.clone()),
    }
}

/// Diffs two recorded runs (their audit records, in order).
pub fn diff(
    a_id: RunId,
    a: &[AuditRecord],
    b_id: RunId,
    b: &[AuditRecord],
) -> Result<TraceDiff, DiffError> {
    if a.is_empty() {
        return Err(DiffError::NoRecords(a_id));
    }
    if b.is_empty() {
        return Err(DiffError::NoRecords(b_id));
    }
    let (sa, sb) = (steps_of(a), steps_of(b));
    let (ra, rb) = (side(a_id, a, &sa), side(b_id, b, &sb));
    let n = sa.len().max(sb.len());
    let steps: Vec<StepPair> = (0..n)
        .map(|i| pair(i as u32 + 1, sa.get(i), sb.get(i)))
        .collect();
    let mut ending = Vec::new();
    if ra.status != rb.status {
        ending.push("status");
    }
    if ra.kill_reason != rb.kill_reason {
        ending.push("kill_reason");
    }
    if ra.error_kind != rb.error_kind {
        ending.push("error_kind");
    }
    if ra.output != rb.output {
        ending.push("output");
    }
    if ra.output_valid != rb.output_valid {
        ending.push("output_valid");
    }
    let first_divergence = match steps.iter().find(|p| !p.same) {
        Some(p) => Some(Divergence {
            step: p.step,
            what: p
                .differences
                .iter()
                .copied()
                .filter(|d| matches!(*d, "missing" | "text" | "calls" | "results"))
                .collect(),
        }),
        None if !ending.is_empty() => Some(Divergence {
            step: n as u32,
            what: vec!["ending"],
        }),
        None => None,
    };
    Ok(TraceDiff {
        a: ra,
        b: rb,
        first_divergence,
        steps,
        endings: Endings {
            same: ending.is_empty(),
            differences: ending,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn similar_texts_agree_and_different_ones_do_not() {
        assert_eq!(text_similarity("", ""), 1.0);
        assert_eq!(text_similarity("a b c", "a b c"), 1.0);
        assert_eq!(text_similarity("a  b", "a b"), 1.0);
        let s = text_similarity("the sum is 5", "the sum is 6");
        assert!((s - 3.0 / 5.0).abs() < 1e-9, "{s}");
        assert_eq!(text_similarity("x", ""), 0.0);
        let long_a = "word ".repeat(40) + "end";
        let long_b = "word ".repeat(40) + "fin";
        assert!(text_similarity(&long_a, &long_b) >= SAME_TEXT);
    }

    #[test]
    fn calls_compare_by_canonical_arguments() {
        assert_eq!(
            call_trace("add", r#"{"a":1,"b":2}"#),
            call_trace("add", r#"{ "b": 2, "a": 1 }"#)
        );
        assert_ne!(
            call_trace("add", r#"{"a":1}"#).args_hash,
            call_trace("add", r#"{"a":2}"#).args_hash
        );
    }
}
