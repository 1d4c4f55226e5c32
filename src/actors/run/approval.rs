//! Human approval (C9): a turn with a call of a tool the manifest gates
//! (`approval:`) is parked until an operator decides, then it runs.
//!
//! Parking: every gated call of the turn is announced
//! (`approval.requested`, with its arguments, secrets redacted) and listed
//! in the run's live state; the turn's calls wait together, the free ones
//! too (a turn's calls run as one batch). The run has nothing in flight,
//! and its critic record holds one timer only: the approval timeout
//! (`limits.approval_timeout`). No stall, soft timeout or hard deadline
//! fires while it waits; when it goes on, its deadlines move by the time
//! it waited and a fresh stall window opens (the 24 h cap stays).
//!
//! With an approval judge (`approval: { tools, judge }`) the turn parks
//! silently first and the judge is asked (see `judging`): the calls it
//! approves run (`approval.decided`, `by: judge`); those it escalates are
//! announced as above, with its reason (`escalated`).
//!
//! Deciding (`RunRef::approve` / `RunRef::deny`, through the shard):
//! each decision is recorded (`approval.decided`, in the audit log with
//! the request); once no call of the turn waits, the turn runs — approved
//! calls are executed, denied ones are error results the model reads
//! (`approval_denied: denied by operator: REASON`). Nobody deciding within
//! the timeout denies what still waits (`by: timeout`). A kill, a cancel
//! or the host's shutdown ends a parked run like any other.
//!
//! Durable runs: parking saves a checkpoint with the turn
//! ([`ParkedCalls`]: the transcript ends with the model's turn, the calls
//! still waiting and the decisions taken so far), and so does an
//! operator's decision that leaves calls waiting. A host's shutdown (or a
//! crash) keeps that checkpoint; a run resumed from it does not call the
//! model again: it dispatches the turn anew (same call ids), applies the
//! decisions on file — those taken before, and those recorded while no
//! host ran it (`Host::decide_on_record`) — without asking again, and
//! parks for what is still undecided, with a fresh `approval_timeout`.
//! A parked run's checkpoint counts no resumes: waiting is not crashing.

use std::sync::Arc;

use tokio::time::Instant;

use super::RunState;
use crate::ports::event::RunEvent;
use crate::ports::model::Role;
use crate::ports::run::{cap_text, unix_ms};
use crate::ports::tool::ToolError;
use crate::record::PendingApproval;

use super::tools::{Gate, TurnCall};
use crate::ports::checkpoint::{CallDecision, ParkedCalls, WaitingCall};

/// The arguments an `approval.requested` event shows at most.
const SHOWN_ARGUMENTS: usize = 16 * 1024;

/// A turn waiting for an operator (or for the approval judge first).
pub(crate) struct ParkedTurn {
    pub(super) calls: Vec<TurnCall>,
    since: Instant,
    /// The decisions on the turn's calls so far, the operators' and the
    /// approval judge's (kept with its checkpoint, so a resumed run does
    /// not ask again).
    decided: Vec<CallDecision>,
}

/// The error a denied call answers the model with.
fn denial(reason: Option<&str>) -> ToolError {
    let why = reason.map(str::trim).filter(|r| !r.is_empty());
    ToolError::Typed {
        kind: APPROVAL_DENIED,
        message: match why {
            Some(r) => format!("denied by operator: {r}"),
            None => "denied by operator".to_string(),
        },
    }
}

impl RunState {
    /// Parks `turn` (whose calls `decided` were decided already): the run
    /// waits, and its gated calls are put to the approval judge when the
    /// agent has one (see `judging`), or else announced for a person.
    pub(super) fn park(&mut self, turn: Vec<TurnCall>, decided: Vec<CallDecision>) {
        let timeout = self.limits.approval_timeout;
        self.watch.park(self.now, self.now + timeout);
        self.parked = Some(Box::new(ParkedTurn {
            calls: turn,
            since: self.now,
            decided,
        }));
        if !self.ask_approval_judge() {
            let off = self.approval_judge_off();
            self.announce_waiting(&[], off.as_deref());
        }
    }

    /// Announces the parked turn's calls that wait and were not announced
    /// yet (`approval.requested`), each with the approval judge's reason
    /// for escalating it: what `escalated` says of it, else `otherwise`.
    pub(super) fn announce_waiting(
        &mut self,
        escalated: &[(Arc<str>, String)],
        otherwise: Option<&str>,
    ) {
        let timeout = self.limits.approval_timeout;
        let since_ms = unix_ms();
        let until_ms = since_ms.saturating_add(timeout.as_millis() as u64);
        let Some(parked) = self.parked.as_mut() else {
            return;
        };
        let mut announced = Vec::new();
        for c in parked.calls.iter_mut().filter(|c| c.gate == Gate::Pending) {
            let Some(raw) = c.arguments.take() else {
                continue;
            };
            let arguments = cap_text(&crate::secrets::redact(&raw), SHOWN_ARGUMENTS);
            announced.push((c.outcome.call_id.clone(), c.outcome.tool.clone(), arguments));
        }
        for (call_id, tool, arguments) in announced {
            // The call waits before anyone hears of it: a subscriber that
            // decides as soon as it reads the event (on another thread)
            // finds it waiting.
            self.shared.partial().awaiting.push(PendingApproval {
                call_id: call_id.clone(),
                tool: tool.clone(),
                arguments: arguments.clone(),
                since_ms,
                until_ms,
            });
            let why = escalated
                .iter()
                .find(|(id, _)| *id == call_id)
                .map(|(_, r)| r.clone())
                .or_else(|| otherwise.map(str::to_string));
            self.event(RunEvent::ApprovalRequested {
                iteration: self.iteration,
                call_id,
                tool,
                arguments,
                timeout_ms: timeout.as_millis() as u64,
                escalated: why,
            });
        }
    }

    /// What a checkpoint says of the turn the run is parked in (`None`
    /// when it is not parked).
    pub(super) fn parked_calls(&self) -> Option<ParkedCalls> {
        let parked = self.parked.as_ref()?;
        let waiting = self
            .shared
            .partial()
            .awaiting
            .iter()
            .map(|p| WaitingCall {
                call_id: p.call_id.clone(),
                tool: p.tool.clone(),
                arguments: p.arguments.clone(),
                since_ms: p.since_ms,
            })
            .collect();
        Some(ParkedCalls {
            waiting,
            decisions: parked.decided.clone(),
        })
    }

    /// A resumed run's first step when it was saved parked: the turn the
    /// transcript ends with is dispatched again, `parked`'s decisions
    /// applied. `false` when the transcript ends with no such turn (the
    /// model is then called as for any resumed run).
    pub(super) fn resume_parked(&mut self, parked: ParkedCalls) -> bool {
        let calls = match self.transcript.last() {
            Some(m) if m.role == Role::Assistant && !m.tool_calls.is_empty() => {
                m.tool_calls.clone()
            }
            _ => return false,
        };
        if let Some(outcomes) = self.dispatch_tools(&calls, &parked.decisions) {
            self.tools_done(outcomes);
        } else if self.parked.is_some() {
            // At rest again: saved so (its resume no longer counts).
            self.checkpoint();
        }
        true
    }

    /// The gate of a call a decision on file covers (a resumed parked
    /// turn): recorded as decided (`approval.decided`), not asked again.
    pub(super) fn take_decision(&mut self, d: &CallDecision, tool: &Arc<str>) -> Gate {
        self.event(RunEvent::ApprovalDecided {
            call_id: d.call_id.clone(),
            tool: tool.clone(),
            approved: d.approve,
            by: d.by.clone(),
            reason: d.reason.clone(),
            waited_ms: 0,
        });
        if d.approve {
            Gate::Approved
        } else {
            Gate::Denied(denial(d.reason.as_deref()))
        }
    }

    /// An operator's decision on the waiting call `call_id` (`None`: all
    /// of them). A decision for a call that no longer waits does nothing.
    pub(crate) fn decide_approval(
        &mut self,
        call_id: Option<&str>,
        approve: bool,
        reason: Option<String>,
    ) {
        let gate = if approve {
            Gate::Approved
        } else {
            Gate::Denied(denial(reason.as_deref()))
        };
        let reason = reason.filter(|r| !r.trim().is_empty());
        self.decide(call_id, gate, "operator", reason);
    }

    /// Nobody decided within `approval_timeout`: what still waits is denied.
    pub(crate) fn approval_timed_out(&mut self) {
        let message = format!(
            "denied: nobody approved the call within {}",
            crate::spec::format_duration(self.limits.approval_timeout)
        );
        let gate = Gate::Denied(ToolError::Typed {
            kind: APPROVAL_DENIED,
            message: message.clone(),
        });
        self.decide(None, gate, "timeout", Some(message));
    }

    pub(super) fn decide(
        &mut self,
        call_id: Option<&str>,
        gate: Gate,
        by: &str,
        reason: Option<String>,
    ) {
        if self.done {
            return;
        }
        let Some(parked) = self.parked.as_mut() else {
            return;
        };
        let waited_ms = self.now.saturating_duration_since(parked.since).as_millis() as u64;
        let mut decided = Vec::new();
        for c in parked.calls.iter_mut() {
            let named = call_id.is_none_or(|id| *c.outcome.call_id == *id);
            if c.gate == Gate::Pending && named {
                c.gate = gate.clone();
                decided.push((c.outcome.call_id.clone(), c.outcome.tool.clone()));
            }
        }
        let waiting = parked.calls.iter().any(|c| c.gate == Gate::Pending);
        if by != "timeout" {
            let at_ms = unix_ms();
            parked
                .decided
                .extend(decided.iter().map(|(call_id, _)| CallDecision {
                    call_id: call_id.clone(),
                    approve: gate == Gate::Approved,
                    reason: reason.clone(),
                    by: by.to_string(),
                    at_ms,
                }));
        }
        let saved = waiting && by != "timeout" && !decided.is_empty();
        for (call_id, tool) in decided {
            self.shared
                .partial()
                .awaiting
                .retain(|p| p.call_id != call_id);
            self.event(RunEvent::ApprovalDecided {
                call_id,
                tool,
                approved: gate == Gate::Approved,
                by: by.to_string(),
                reason: reason.clone(),
                waited_ms,
            });
        }
        if waiting {
            // Durable: the decisions taken survive a restart.
            if saved {
                self.checkpoint();
            }
            return;
        }
        let Some(turn) = self.parked.take() else {
            return;
        };
        let waited = self.watch.unpark(self.started, self.now);
        self.tell_children_deadline();
        tracing::debug!(run_id = %self.shared.run_id, waited_ms = waited.as_millis() as u64, "approval decided; the run goes on");
        if let Some(outcomes) = self.run_tools(turn.calls) {
            self.tools_done(outcomes);
        }
    }
}

/// The error kind of a call an operator (or the approval timeout) denied.
pub(crate) const APPROVAL_DENIED: &str = "approval_denied";
