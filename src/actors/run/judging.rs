//! What a run tells and asks its model judges (see `crate::judge` and
//! `crate::actors::judging`): the evidence the critic's judge is shown,
//! the charge of a judge's tokens, and the approval judge's question and
//! answer.
//!
//! A judge's tokens go through the run's own budget path: counted in the
//! run's `usage.critic` (apart from its own calls) and charged to its
//! ticket (`Ticket::charge_beside`: the caller's account and the run's
//! allowances), checked by the run's next call as any charge is.
//!
//! The approval judge sees only the run's original request (its first
//! user message) and the proposed calls' tools and arguments (secrets
//! redacted): never a tool result and never the model's text, so what a
//! tool returned cannot talk it round. Its question is a task of the run;
//! its answer comes back as `RunMsg::ApprovalJudged`.

use std::sync::Arc;

use super::tools::Gate;
use super::RunMsg;
use super::RunState;
use crate::judge::{
    self, ApprovalDecision, CallVerdict, Evidence, JudgeError, ProposedCall, APPROVAL_SCHEMA,
    APPROVAL_TIMEOUT, REPLY_TOKENS, REQUEST_BYTES, TRACE_STEPS,
};
use crate::ports::event::RunEvent;
use crate::ports::model::Role;
use crate::ports::run::{cap_text, CriticUsage};

/// The bytes of the model's last text the critic's judge is shown.
const LAST_TEXT_BYTES: usize = 1000;

impl RunState {
    /// The run's original request: its first user message (capped).
    pub(crate) fn original_request(&self) -> String {
        self.transcript
            .iter()
            .find(|m| m.role == Role::User)
            .map(|m| cap_text(&m.content, REQUEST_BYTES))
            .unwrap_or_default()
    }

    /// What the critic's judge is shown of the run now.
    pub(crate) fn evidence(&self) -> Evidence {
        let (trace, last_text) = {
            let p = self.shared.partial();
            let from = p.steps.len().saturating_sub(TRACE_STEPS);
            let trace = p.steps[from..].to_vec();
            let last = p.last_text.as_deref().map(|t| cap_text(t, LAST_TEXT_BYTES));
            (trace, last)
        };
        let w = &self.watch;
        Evidence {
            agent: self.shared.agent.to_string(),
            request: self.original_request(),
            steps: w.steps,
            max_steps: self.max_iterations,
            tool_calls: w.tool_calls,
            tokens: w.tokens,
            elapsed: self.now.saturating_duration_since(self.started),
            progress_since_decision: w.progress().saturating_sub(w.progress_at_decision),
            trace,
            last_text,
        }
    }

    /// Charges what a judge's question used: the run's `usage.critic`,
    /// and the caller and the run's allowances through its ticket.
    pub(crate) fn charge_critic(&mut self, usage: &CriticUsage) {
        if usage.calls == 0 {
            return;
        }
        self.shared
            .partial()
            .critic_usage
            .get_or_insert_with(Default::default)
            .add(usage);
        if let Some(t) = &mut self.ticket {
            t.charge_beside(usage.total(), usage.cost_micros);
        }
    }

    /// The agent the run runs.
    pub(crate) fn agent(&self) -> &crate::agent::Agent {
        &self.agent
    }

    /// Puts the parked turn's gated calls to the approval judge, when the
    /// agent has one and it is still asked in this run. `false` when it
    /// is not asked (a person decides).
    pub(super) fn ask_approval_judge(&mut self) -> bool {
        let Some(judge) = self.agent.judges().approval.clone() else {
            return false;
        };
        let request = self.original_request();
        let Some(state) = self.judging.as_mut().and_then(|j| j.approval.as_mut()) else {
            return false;
        };
        if state.off {
            return false;
        }
        let Some(parked) = self.parked.as_ref() else {
            return false;
        };
        let calls: Vec<ProposedCall> = parked
            .calls
            .iter()
            .filter(|c| c.gate == Gate::Pending)
            .map(|c| ProposedCall {
                call_id: c.outcome.call_id.clone(),
                tool: c.outcome.tool.clone(),
                arguments: crate::secrets::redact(c.arguments.as_deref().unwrap_or_default())
                    .to_string(),
            })
            .collect();
        if calls.is_empty() {
            return false;
        }
        let index = state.asked;
        state.asked += 1;
        let me = self.addr.clone();
        let task = tokio::spawn(async move {
            let question = judge::approval_question(&request, &calls);
            let asked = judge::ask(
                &judge,
                question,
                &APPROVAL_SCHEMA,
                index,
                REPLY_TOKENS,
                APPROVAL_TIMEOUT,
            )
            .await;
            let (usage, outcome) = match asked {
                Ok(a) => (a.usage, judge::parse_approval(&a.text)),
                Err(e) => (CriticUsage::default(), Err(e)),
            };
            me.send(RunMsg::ApprovalJudged { usage, outcome });
        });
        state.task = Some(task.abort_handle());
        true
    }

    /// The approval judge answered: the calls it approved run (`by:
    /// judge`), the others are announced for a person with its reason. A
    /// judge that failed passes every call to a person (a `warning`); one
    /// whose escalations passed a bound (see `crate::actors::judging`) is
    /// off for the run, and the whole turn goes to a person.
    pub(super) fn approval_judged(
        &mut self,
        usage: CriticUsage,
        outcome: Result<Vec<CallVerdict>, JudgeError>,
    ) {
        self.charge_critic(&usage);
        let Some(state) = self.judging.as_mut().and_then(|j| j.approval.as_mut()) else {
            return;
        };
        state.task = None;
        let Some(parked) = self.parked.as_ref() else {
            // Decided meanwhile (an operator, the approval timeout, a kill).
            return;
        };
        let pending: Vec<Arc<str>> = parked
            .calls
            .iter()
            .filter(|c| c.gate == Gate::Pending)
            .map(|c| c.outcome.call_id.clone())
            .collect();
        let verdicts = match outcome {
            Ok(v) => v,
            Err(e) => {
                let why = format!("the approval judge gave no answer ({})", e.kind());
                self.event(RunEvent::Warning {
                    kind: e.kind().to_string(),
                    message: format!("{e}: the calls wait for an operator"),
                });
                let escalated: Vec<(Arc<str>, String)> =
                    pending.into_iter().map(|id| (id, why.clone())).collect();
                return self.announce_waiting(&escalated, None);
            }
        };
        let mut approved = Vec::new();
        let mut escalated = Vec::new();
        let mut off = false;
        for id in pending {
            let said = verdicts.iter().find(|v| *v.call_id == *id);
            let yes = said.is_some_and(|v| v.decision == ApprovalDecision::Approve);
            let reason = said.map_or_else(
                || "the judge said nothing of this call".to_string(),
                |v| v.reason.clone(),
            );
            off |= state.count(yes);
            if yes {
                approved.push((id, reason));
            } else {
                escalated.push((id, reason));
            }
        }
        if off {
            let (row, total) = (state.in_a_row, state.total);
            let message = format!(
                "the approval judge did not approve {row} calls in a row ({total} in this run): a person decides every gated call of this run from now on"
            );
            self.event(RunEvent::Warning {
                kind: "approval_judge_off".into(),
                message: message.clone(),
            });
            // Whatever it said of this turn: a person decides all of it.
            let all: Vec<(Arc<str>, String)> = approved
                .into_iter()
                .chain(escalated)
                .map(|(id, _)| (id, message.clone()))
                .collect();
            return self.announce_waiting(&all, None);
        }
        for (id, reason) in approved {
            if self.parked.is_none() {
                break;
            }
            self.decide(Some(&id), Gate::Approved, "judge", Some(reason));
        }
        if self.parked.is_some() {
            self.announce_waiting(&escalated, None);
        }
    }

    /// Why a person decides the calls the approval judge would have been
    /// asked about, when it is off for the run (`None` when it is not).
    pub(super) fn approval_judge_off(&self) -> Option<String> {
        let state = self.judging.as_ref()?.approval.as_ref()?;
        state.off.then(|| {
            format!(
                "the approval judge is off for this run ({} calls it did not approve): a person decides",
                state.total
            )
        })
    }
}
