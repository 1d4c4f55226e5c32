//! A run's tool calls: dispatched (in place when a tool answers at once,
//! otherwise in one task with the batch's cancellation signal, heartbeat
//! and deadline), and their outcomes taken into the transcript, the steps
//! and the records.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{poll_once, spans, Inflight, RunMsg, RunState};
use crate::actors::watch::{Beat, Observation, SLOW_HANDLER};
use crate::ports::event::RunEvent;
use crate::ports::model::{Message, Role, ToolCallRequest};
use crate::ports::run::{cap_text, RunStatus, StepRecord, SUMMARY_BYTES};
use crate::ports::tool::{Beater, ToolContext, ToolError, ToolEvents};
use crate::record::Ending;

use super::guard::Screened;
use crate::dispatch::{validate, PreparedCall};
use crate::ports::checkpoint::CallDecision;

/// A tool call still running after its first poll.
type PendingTool = Pin<Box<dyn Future<Output = Result<String, ToolError>> + Send>>;

/// The outcome of one tool call.
#[derive(Debug)]
pub struct ToolOutcome {
    pub(super) call_id: Arc<str>,
    pub(super) tool: Arc<str>,
    /// The call's canonical hash (tool and arguments), for the critic.
    call: u64,
    args: String,
    result: Result<String, ToolError>,
    duration_ms: u64,
}

/// One call of a turn, checked, before it runs.
pub(super) struct TurnCall {
    pub(super) outcome: ToolOutcome,
    /// The tool and its validated arguments, or why the call is refused.
    prepared: Result<PreparedCall, ToolError>,
    /// Whether it may run (see `approval`).
    pub(super) gate: Gate,
    /// The arguments as the model sent them (for a call that waits for
    /// approval: what the operator is shown).
    pub(super) arguments: Option<String>,
}

/// Whether a call of a turn may run.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Gate {
    /// It needs no approval.
    Free,
    /// It waits for an operator's decision.
    Pending,
    /// An operator approved it.
    Approved,
    /// It was denied: the error the model reads.
    Denied(ToolError),
}

impl RunState {
    /// Starts a turn's tool calls: each is announced (`tool.call`, a
    /// heartbeat) and checked; a turn with a call that needs approval is
    /// parked until an operator decides (see `approval`), any other runs
    /// at once (see [`run_tools`](Self::run_tools)). A call `decided`
    /// names (a resumed parked turn's decisions) is not asked about again:
    /// its decision applies. Returns the outcomes when all answered at once.
    pub(super) fn dispatch_tools(
        &mut self,
        calls: &[ToolCallRequest],
        decided: &[CallDecision],
    ) -> Option<Vec<ToolOutcome>> {
        let mut turn = Vec::with_capacity(calls.len());
        let mut gated = false;
        for call in calls {
            // The critic counts repeats (arguments compared as canonical
            // JSON); one that reaches the limit is decided on before the
            // next step (the shard reviews the run).
            // Validation parses the arguments once; the hash reads them.
            let prepared = self.agent.tools().prepare(call);
            let hash = match &prepared {
                Ok(p) => validate::canonical_hash_of(&call.name, &p.args),
                Err(_) => validate::canonical_hash(&call.name, &call.arguments),
            };
            self.beat(Beat::ToolStarted { hash });
            let args = cap_text(&call.arguments, SUMMARY_BYTES);
            self.event(RunEvent::ToolCall {
                iteration: self.iteration,
                call_id: call.id.clone(),
                tool: call.name.clone(),
                args: args.clone(),
            });
            // A call that cannot run (unknown tool, bad arguments) goes
            // back to the model as an error: no guard or operator is asked.
            // Guards and `approval:` decide the others (see `guard`).
            let screened = match &prepared {
                Ok(p) => self.screen(call, p),
                Err(_) => Screened::Free,
            };
            let needs = screened == Screened::Ask;
            let gate = match (
                screened,
                decided.iter().rev().find(|d| d.call_id == call.id),
            ) {
                (Screened::Denied(e), _) => Gate::Denied(e),
                (Screened::Ask, Some(d)) => self.take_decision(d, &call.name),
                (Screened::Ask, None) => Gate::Pending,
                (Screened::Free, _) => Gate::Free,
            };
            gated |= gate == Gate::Pending;
            turn.push(TurnCall {
                outcome: ToolOutcome {
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    call: hash,
                    args,
                    result: Ok(String::new()),
                    duration_ms: 0,
                },
                prepared,
                gate,
                arguments: needs.then(|| call.arguments.to_string()),
            });
        }
        if gated {
            self.park(turn, decided.to_vec());
            return None;
        }
        self.run_tools(turn)
    }

    /// Runs a turn's calls. A tool that answers at once without blocking
    /// (`Tool::answers_at_once`) is polled once in place; the others, and
    /// those not ready, run in one task (the run holds its abort handle
    /// and the batch's cancellation signal) whose `ToolsDone` brings every
    /// outcome back, in the model's order. A denied or refused call is
    /// its error. Returns the outcomes when all answered at once.
    pub(super) fn run_tools(&mut self, turn: Vec<TurnCall>) -> Option<Vec<ToolOutcome>> {
        let timeout = self.limits.tool_timeout;
        let cap = self.limits.max_tool_result_bytes as usize;
        let mut outcomes = Vec::with_capacity(turn.len());
        let mut running: Vec<(usize, PendingTool, spans::Traced)> = Vec::new();
        let mut cancel: Option<CancellationToken> = None;
        let mut beater: Option<Beater> = None;
        let mut events: Option<ToolEvents> = None;
        // One clock read per call: a call's time runs from the end of the
        // one before.
        let mut mark = self.now;
        for TurnCall {
            mut outcome,
            prepared,
            gate,
            ..
        } in turn
        {
            let span = spans::tool(&self.span, &outcome.tool, &outcome.call_id);
            let approved = gate == Gate::Approved;
            let prepared = match (gate, prepared) {
                (Gate::Denied(e), _) | (_, Err(e)) => {
                    outcome.result = Err(e);
                    spans::tool_done(&span, &outcome.result);
                    outcomes.push(outcome);
                    continue;
                }
                (_, Ok(p)) => p,
            };
            let in_place = prepared.tool.answers_at_once();
            let mut ctx = ToolContext::new(self.shared.run_id, outcome.call_id.clone());
            if !in_place {
                // Calls that run in a task get the batch's cancellation
                // signal (a kill gives them `kill_grace` to clean up), a
                // heartbeat, the run's deadline, and a way to add events.
                let addr = self.addr.clone();
                let beat: Beater = beater
                    .get_or_insert_with(|| Arc::new(move || addr.beat(Beat::Alive)))
                    .clone();
                let addr = self.addr.clone();
                let sink: ToolEvents = events
                    .get_or_insert_with(|| Arc::new(move |ev| addr.send(RunMsg::ToolEvent(ev))))
                    .clone();
                ctx = ctx
                    .with_cancel(cancel.get_or_insert_with(CancellationToken::new).clone())
                    .with_beat(beat)
                    .with_deadline(self.watch.deadline())
                    .with_events(sink);
            }
            let mut timeout = timeout;
            if prepared.tool.uses_run() {
                // `wait`: it reaches the run's tools and its caller's runs;
                // its own calls get the tool timeout each, and the run's
                // deadline bounds it.
                ctx = self.through_run(ctx, &prepared, approved);
                timeout = crate::spec::ABSOLUTE_DEADLINE;
            }
            let call = prepared.execute(ctx, timeout, cap);
            let fut: PendingTool = Box::pin(spans::instrument(call, spans::fork(&span)));
            if !in_place {
                // Its first poll happens in the task, not on the shard.
                running.push((outcomes.len(), fut, span));
                outcomes.push(outcome);
                continue;
            }
            let polled = poll_once(fut);
            let now = Instant::now();
            let took = now.saturating_duration_since(mark);
            outcome.duration_ms = took.as_millis() as u64;
            mark = now;
            if took > SLOW_HANDLER {
                let what = format!("the tool call `{}`", outcome.tool);
                self.slow(&what, took);
            }
            match polled {
                Ok(result) => {
                    self.beat(Beat::ToolFinished);
                    spans::tool_done(&span, &result);
                    outcome.result = result;
                    outcomes.push(outcome);
                }
                Err(fut) => {
                    // A placeholder in the model's order, filled by the task.
                    running.push((outcomes.len(), fut, span));
                    outcomes.push(outcome);
                }
            }
        }
        self.epoch += 1;
        if running.is_empty() {
            return Some(outcomes);
        }
        let epoch = self.epoch;
        let me = self.addr.clone();
        let cancel = cancel.unwrap_or_default();
        let stop = cancel.clone();
        let grace = self.limits.kill_grace;
        let task = tokio::spawn(async move {
            let t0 = Instant::now();
            let finished = running.into_iter().map(|(i, fut, span)| {
                let me = me.clone();
                async move {
                    let result = fut.await;
                    spans::tool_done(&span, &result);
                    // Each call reports as it ends: the critic sees progress.
                    me.beat(Beat::ToolFinished);
                    (i, result, t0.elapsed().as_millis() as u64)
                }
            });
            let all = futures_util::future::join_all(finished);
            tokio::pin!(all);
            tokio::select! {
                results = &mut all => {
                    for (i, result, ms) in results {
                        if let Some(o) = outcomes.get_mut(i) {
                            o.result = result;
                            o.duration_ms += ms;
                        }
                    }
                    me.send(RunMsg::ToolsDone { epoch, outcomes });
                }
                _ = stop.cancelled() => {
                    // The run was killed: its status is decided; the calls
                    // get `kill_grace` to see the signal and clean up, then
                    // they are dropped.
                    let _ = tokio::time::timeout(grace, all).await;
                }
            }
        });
        self.inflight = Some(Inflight::Tools {
            task: task.abort_handle(),
            cancel,
        });
        None
    }

    pub(super) fn tools_done(&mut self, outcomes: Vec<ToolOutcome>) {
        let mut any_ok = false;
        for o in outcomes {
            let (ok, content, error) = match o.result {
                Ok(text) => (true, text, None),
                Err(e) => {
                    let msg = format!("{}: {e}", e.kind());
                    (false, format!("error: {msg}"), Some(msg))
                }
            };
            any_ok |= ok;
            // The critic's trace: the outcome as hashes (see `watch`).
            let said = error.as_deref().unwrap_or(&content);
            let seen = Observation::of(&o.tool, o.call, ok, said);
            self.watch.observe(self.now, seen);
            let summary = cap_text(&content, SUMMARY_BYTES);
            self.event(RunEvent::ToolResult {
                iteration: self.iteration,
                call_id: o.call_id.clone(),
                tool: o.tool.clone(),
                ok,
                result: content.clone(),
                duration_ms: o.duration_ms,
            });
            self.shared.partial().steps.push(StepRecord {
                iteration: self.iteration,
                tool: o.tool,
                args: o.args,
                ok,
                error,
                result: summary,
                duration_ms: o.duration_ms,
            });
            self.push_message(Message {
                role: Role::Tool,
                content,
                tool_calls: Vec::new(),
                tool_call_id: Some(o.call_id),
                attachments: Vec::new(),
            });
        }
        self.watch.step_closed();
        if any_ok {
            self.error_steps = 0;
        } else {
            self.error_steps += 1;
            if self.error_steps >= self.limits.max_tool_errors {
                let e = Ending::failed(
                    RunStatus::Error,
                    "tool_errors",
                    format!(
                        "{} consecutive steps where every tool call failed",
                        self.error_steps
                    ),
                );
                return self.finish(e);
            }
        }
        self.checkpoint_then_step();
    }
}
