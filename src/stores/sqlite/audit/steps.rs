//! A run's steps as its tool events say them. A result stored with
//! `"steps":"tail"` (schema version 5) has its steps given back from the
//! records in its row's tail: the encoder leaves them out only when
//! [`steps_are_in`] finds the events give exactly those steps, so reading
//! them back ([`each_tail_step`]) returns the result as it was.

use std::sync::Arc;

use crate::ports::event::RunEvent;
use crate::ports::run::{cap_text, StepRecord, SUMMARY_BYTES};

/// What a result (schema version 5) says for `steps` when its row's tail
/// holds every record of the run and [`each_tail_step`] gives its steps back
/// from them: the steps are not written twice.
pub(super) const STEPS_IN_TAIL: &[u8] = b",\"steps\":\"tail\"";

/// Hands `step` a run's steps as its `tool.call` and `tool.result` events
/// say them, in order: one a result, with the arguments of the call it
/// answers (the last call of that iteration with that id). False when a
/// result has no call or `step` said stop. The run actor writes each step
/// from the same values, so for a run whose events are all here this gives
/// its steps back; the writer checks that it does ([`steps_are_in`])
/// before it leaves them out.
pub(super) fn each_tail_step<'a>(
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
pub(super) struct StepView<'a> {
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

    pub(super) fn to_step(&self) -> StepRecord {
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
pub(super) fn steps_are_in<'a>(
    events: impl Iterator<Item = &'a RunEvent>,
    steps: &[StepRecord],
) -> bool {
    let mut expected = steps.iter();
    each_tail_step(events, |v| expected.next().is_some_and(|s| v.is(s)))
        && expected.next().is_none()
}
