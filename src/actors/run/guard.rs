//! Guards in the run (the rules themselves are `crate::spec::guard`'s):
//! every call the model makes that passed validation is screened before
//! it runs, and every final answer before it is given.
//!
//! Screening a call ([`RunState::screen`]): the first guard rule that
//! matches decides — `deny` (and `max_calls` once reached) makes the call
//! an error result the model reads (`guard_denied: REASON`), `ask` parks
//! it for an operator exactly as `approval:` does (the approval module's
//! park, decisions and timeout) — then `approval:` is consulted as before.
//! A call of a tool that works through its run (`wait`) has the call it
//! will make screened too: the tool must be one of the run's, its
//! arguments valid, its guards looked at (a `max_calls` rule counts each
//! call the wait makes, when it makes it) and its approval asked for once,
//! for the whole wait.
//!
//! Every guard decision is a critic decision (`deny`, `ask`; reason
//! `guard`, or `output_guard`), in the result, the event stream
//! (`critic.deny`, `critic.ask`) and the audit log, in the run's order.
//!
//! The output guard: a final answer that matches one of `deny_patterns`
//! gets one repair turn (recognised in the transcript by
//! [`OUTPUT_REPAIR_PREFIX`], so a resumed run does not repair twice); a
//! second match ends the run `error`/`guardrail`. A refused answer is
//! never the run's output, and no other ending keeps an output (or a
//! partial output) that matches (streamed deltas have gone out already;
//! the audit log keeps what the model said).
//!
//! Cost: a run whose manifest has no guard pays one branch per call and
//! per answer, and allocates nothing.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use serde_json::Value;

use super::RunState;
use crate::dispatch::PreparedCall;
use crate::ports::event::RunEvent;
use crate::ports::model::{Message, Role, ToolCallRequest};
use crate::ports::run::{CriticAction, CriticDecision, RunStatus};
use crate::ports::tool::{ToolError, GUARD_DENIED};
use crate::record::Ending;
use crate::spec::{GuardVerdict, GUARDRAIL};

/// How the output guard's repair turn starts.
pub const OUTPUT_REPAIR_PREFIX: &str = "Your answer was withheld";

/// What screening says of a call.
#[derive(Debug, PartialEq)]
pub(super) enum Screened {
    /// It may run.
    Free,
    /// It waits for an operator (a guard's `ask`, or `approval:`).
    Ask,
    /// It is refused: the error the model reads.
    Denied(ToolError),
}

impl RunState {
    /// Screens a call that passed validation (see the module doc).
    pub(super) fn screen(&mut self, call: &ToolCallRequest, prepared: &PreparedCall) -> Screened {
        let mut ask = self.agent.spec().needs_approval(&call.name);
        match self.guard(&call.name, &prepared.args, true, "") {
            Screened::Free => {}
            Screened::Ask => ask = true,
            denied => return denied,
        }
        if prepared.tool.uses_run() {
            if let Some((tool, args)) = prepared.tool.call_through_run(&prepared.args) {
                match self.screen_inner(&call.name, tool, args) {
                    Screened::Free => {}
                    Screened::Ask => ask = true,
                    denied => return denied,
                }
            }
        }
        if ask {
            Screened::Ask
        } else {
            Screened::Free
        }
    }

    /// Screens the call a `wait` will make: `tool` with `args`.
    fn screen_inner(&mut self, outer: &str, tool: &str, args: Option<&Value>) -> Screened {
        let args = args
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        let inner = match self.agent.tools().prepare_value(tool, args) {
            Ok(p) => p,
            Err(e) => return Screened::Denied(e),
        };
        if inner.tool.uses_run() {
            return Screened::Denied(ToolError::InvalidArguments(format!(
                "`{outer}` cannot call `{tool}`"
            )));
        }
        // Looked at, not counted: each call the wait makes is counted
        // when it is made.
        let via = format!(" (through {outer})");
        match self.guard(tool, &inner.args, false, &via) {
            Screened::Free if self.agent.spec().needs_approval(tool) => Screened::Ask,
            other => other,
        }
    }

    /// The guards' verdict on a call, its decision recorded. `via` is
    /// added to the decision's detail (a call a `wait` makes).
    fn guard(&mut self, tool: &str, args: &Value, count: bool, via: &str) -> Screened {
        let Some(guards) = self.agent.guards().filter(|g| g.guards_calls()) else {
            return Screened::Free;
        };
        if self.guard_counts.is_none() && guards.counters() > 0 {
            let counts: Arc<[AtomicU32]> =
                (0..guards.counters()).map(|_| AtomicU32::new(0)).collect();
            self.recount(guards, &counts);
            self.guard_counts = Some(counts);
        }
        let counts = self.guard_counts.as_deref().unwrap_or(&[]);
        match guards.check(tool, args, counts, count) {
            GuardVerdict::Pass => Screened::Free,
            GuardVerdict::Ask { detail } => {
                self.guard_decided(CriticAction::Ask, "guard", format!("{detail}{via}"));
                Screened::Ask
            }
            GuardVerdict::Deny { message, detail } => {
                self.guard_decided(CriticAction::Deny, "guard", format!("{detail}{via}"));
                Screened::Denied(ToolError::Typed {
                    kind: GUARD_DENIED,
                    message,
                })
            }
        }
    }

    /// Counts what a resumed run's earlier calls counted: the calls of its
    /// transcript that were answered, the last as many as it has steps (a
    /// session's history before them belongs to earlier runs), except
    /// those refused before any guard counted them. Calls a `wait` made
    /// and calls cut by compaction are not in the transcript and are not
    /// counted again. A run that has made no call yet reads nothing.
    fn recount(&self, guards: &crate::spec::Guards, counts: &[AtomicU32]) {
        let steps = self.shared.partial().steps.len();
        if steps == 0 {
            return;
        }
        let results: std::collections::HashMap<&str, &str> = self
            .transcript
            .iter()
            .filter(|m| m.role == Role::Tool)
            .filter_map(|m| Some((m.tool_call_id.as_deref()?, m.content.as_str())))
            .collect();
        let answered: Vec<(&ToolCallRequest, &str)> = self
            .transcript
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .flat_map(|m| m.tool_calls.iter())
            .filter_map(|c| Some((c, *results.get(&*c.id)?)))
            .collect();
        let refused = ["guard_denied", "unknown_tool", "invalid_arguments"];
        for (call, result) in &answered[answered.len().saturating_sub(steps)..] {
            let kind = result
                .strip_prefix("error: ")
                .and_then(|e| e.split(':').next());
            if kind.is_some_and(|k| refused.contains(&k)) {
                continue;
            }
            if let Ok(args) = crate::dispatch::validate::parse_arguments(&call.arguments) {
                guards.check(&call.name, &args, counts, true);
            }
        }
    }

    /// The run's `max_calls` counters (shared with the calls a `wait`
    /// makes from its task), if its guards count anything.
    pub(super) fn guard_counters(&self) -> Option<Arc<[AtomicU32]>> {
        self.guard_counts.clone()
    }

    /// Records a guard's decision where the caller sees it: the result,
    /// the event stream and the audit log (as the critic records its own).
    pub(super) fn guard_decided(&mut self, action: CriticAction, reason: &str, detail: String) {
        let d = CriticDecision {
            action,
            reason: reason.to_string(),
            at_ms: self.now.saturating_duration_since(self.started).as_millis() as u64,
            detail: Some(detail),
            loop_kind: None,
        };
        super::spans::decided(self.span(), &d);
        let event = RunEvent::from_decision(d.clone());
        self.shared.partial().critic.push(d);
        self.event(event);
    }

    /// An ending other than a final answer (a budget passed by a reply, a
    /// kill, an error) keeps no output an output-guard pattern matches —
    /// its own, or the partial output it would fall back to: it is
    /// withheld, and that is a `deny` decision. A final answer was checked
    /// already (see [`output_refused`](Self::output_refused)).
    pub(super) fn withhold_guarded_output(&mut self, ending: &mut Ending) {
        if ending.status == RunStatus::Ok {
            return;
        }
        let Some(guards) = self.agent.guards().filter(|g| g.guards_output()) else {
            return;
        };
        // The ending's own output, then the partial output a finished
        // run falls back to without one.
        let own = ending
            .output
            .as_deref()
            .and_then(|o| guards.output_violation(o));
        if own.is_some() {
            ending.output = None;
        }
        let partial = {
            let mut p = self.shared.partial();
            let hit = p
                .last_text
                .as_deref()
                .and_then(|t| guards.output_violation(t));
            if hit.is_some() {
                p.last_text = None;
            }
            hit
        };
        let hit = own.or(partial);
        if let Some(i) = hit {
            self.guard_decided(
                CriticAction::Deny,
                "output_guard",
                format!("pattern {} matched the run's output: withheld", i + 1),
            );
        }
    }

    /// Checks a final answer against the output guard: `true` when it is
    /// refused (a repair turn is due, or the run ended `error`/`guardrail`).
    pub(super) fn output_refused(&mut self, answer: &str) -> bool {
        let Some(guards) = self.agent.guards().filter(|g| g.guards_output()) else {
            return false;
        };
        let Some(i) = guards.output_violation(answer) else {
            return false;
        };
        let pattern = guards.output_pattern(i).map(str::to_string);
        // A refused answer is no output, not even a partial one.
        self.shared.partial().last_text = None;
        self.guard_decided(
            CriticAction::Deny,
            "output_guard",
            format!("pattern {} matched the final answer", i + 1),
        );
        let repaired = self
            .transcript
            .iter()
            .any(|m: &Message| m.role == Role::User && m.content.starts_with(OUTPUT_REPAIR_PREFIX));
        if repaired {
            let e = Ending::failed(
                RunStatus::Error,
                GUARDRAIL,
                format!(
                    "the final answer matched `output_guard` pattern {} again after a repair turn: it is withheld",
                    i + 1
                ),
            );
            self.finish(e);
            return true;
        }
        let what = match pattern {
            Some(p) => format!("it matches `{p}`, which this agent may not output"),
            None => "it matches this agent's output guard".to_string(),
        };
        self.steer(format!(
            "{OUTPUT_REPAIR_PREFIX}: {what}. Answer again without it."
        ));
        self.step_due = true;
        true
    }
}
