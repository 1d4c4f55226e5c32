//! A run's model call: started (polled once in place when the model
//! answers at once, otherwise a task the run holds an abort handle for),
//! what it reports while it runs (retries, a streaming model's observer),
//! what its reply costs, and what the reply makes of the loop: an answer,
//! a repair turn, or a turn of tool calls.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::time::Instant;

use super::observer::RunObserver;
use super::{panic_text, poll_once, spans, Inflight, RunMsg, RunState};
use crate::actors::watch::{Beat, SLOW_HANDLER};
use crate::output::OutputSchema;
use crate::ports::event::RunEvent;
use crate::ports::model::{
    CallObserver, CallOptions, ChatRequest, ChatResponse, Message, ModelError, RetrySink, Role,
    ToolCallRequest,
};
use crate::ports::run::{KillReason, RunStatus, Usage};
use crate::record::Ending;

/// A model call's result with its usage checked (`Usage::check_call`): a
/// reply that claims more tokens than a call can use is malformed.
pub(crate) fn checked_usage(
    result: Result<ChatResponse, ModelError>,
) -> Result<ChatResponse, ModelError> {
    let resp = result?;
    match resp.usage.check_call() {
        Ok(()) => Ok(resp),
        Err(why) => Err(ModelError::Malformed(why)),
    }
}

/// The largest reply cap a budget sends on its own (a manifest with no
/// `max_tokens`): every chat model takes a cap this small, where a larger
/// one can exceed a model's output limit and be refused; it is also the
/// Anthropic provider's default. Above it, the budget is checked when the
/// reply's usage is known.
const BUDGET_CAP_MAX: u64 = 4096;

/// The call options with the reply's token cap no larger than what the
/// run's budgets leave (`room`, see `Ticket::room`), the manifest's own
/// `max_tokens` the upper bound. The agent's options as they are (no
/// copy) when no budget is tighter.
pub(super) fn capped_options(
    options: Option<Arc<CallOptions>>,
    room: Option<u64>,
) -> Option<Arc<CallOptions>> {
    let Some(room) = room else {
        return options;
    };
    let set = options.as_ref().and_then(|o| o.max_tokens).map(u64::from);
    let bound = set.unwrap_or(BUDGET_CAP_MAX);
    if room >= bound {
        return options;
    }
    let mut o = options.as_deref().cloned().unwrap_or_default();
    // `room` is under a u32 bound here; at least 1 (0 means "no cap" to
    // some servers).
    o.max_tokens = Some(u32::try_from(room.max(1)).unwrap_or(u32::MAX));
    Some(Arc::new(o))
}

impl RunState {
    /// Starts a model call. A model that answers at once without blocking
    /// (`ChatModel::answers_at_once`) is polled once in place, and its
    /// result is returned when ready; any other call — and one that was not
    /// ready — runs in a task the run holds an abort handle for, its result
    /// coming back as `done(epoch, result)` (or `ModelPanicked`). So a
    /// provider's first poll (encoding a long transcript, connecting) never
    /// runs on the shard.
    pub(super) fn start_call(
        &mut self,
        request: ChatRequest,
        done: fn(u32, Result<ChatResponse, ModelError>) -> RunMsg,
    ) -> Option<Result<ChatResponse, ModelError>> {
        let model = self.agent.model().clone();
        let in_place = model.answers_at_once();
        let span = spans::chat(&self.span, model.name());
        let call = async move { model.complete(request).await };
        let fut = Box::pin(spans::instrument(call, spans::fork(&span)));
        self.epoch += 1;
        let epoch = self.epoch;
        let fut = if in_place {
            let polled = poll_once(fut);
            let took = Instant::now().saturating_duration_since(self.now);
            if polled.is_ok() {
                crate::telemetry::model_call(self.agent.model().name(), took);
            }
            if took > SLOW_HANDLER {
                let what = format!("the model call ({})", self.agent.model().name());
                self.slow(&what, took);
            }
            match polled {
                Ok(result) => {
                    spans::chat_done(&span, &result);
                    return Some(result);
                }
                Err(fut) => fut,
            }
        } else {
            fut
        };
        let me = self.addr.clone();
        let timed =
            crate::telemetry::enabled().then(|| (self.agent.model().clone(), Instant::now()));
        let task = tokio::spawn(async move {
            let msg = match AssertUnwindSafe(crate::panics::quietly(fut))
                .catch_unwind()
                .await
            {
                Ok(result) => {
                    if let Some((model, t0)) = timed {
                        crate::telemetry::model_call(model.name(), t0.elapsed());
                    }
                    spans::chat_done(&span, &result);
                    done(epoch, result)
                }
                Err(panic) => RunMsg::ModelPanicked {
                    epoch,
                    text: panic_text(&panic),
                },
            };
            me.send(msg);
        });
        self.inflight = Some(Inflight::Model(task.abort_handle()));
        None
    }

    /// Counts a call's usage in the run's usage and cost (and its answer,
    /// if substantive, as the partial output) and charges it to the caller's
    /// budget; returns its tokens.
    pub(super) fn charge(&mut self, usage: &Usage, answer: Option<&str>) -> u64 {
        let tokens = usage.total();
        let mut cost = 0;
        {
            let mut p = self.shared.partial();
            p.usage.add(usage);
            if let Some(price) = self.agent.price() {
                let total = price.cost_micros(&p.usage);
                cost = total.saturating_sub(p.cost_micros);
                p.cost_micros = total;
            }
            if let Some(text) = answer.filter(|t| !t.trim().is_empty()) {
                p.last_text = Some(text.to_string());
            }
        }
        if let Some(t) = &mut self.ticket {
            // The account sees it now; the ledger with the handler's end.
            t.charge(tokens, cost);
        }
        tokens
    }

    /// Charges a streamed model call cut before its end with what arrived
    /// (see `observer`): its usage counts in the run's usage, cost and
    /// budgets like a finished call's.
    pub(crate) fn charge_cut_call(&mut self) {
        let Some(o) = &self.observer else {
            return;
        };
        if let Some(usage) = o.cut_usage(&self.transcript) {
            self.charge(&usage, None);
        }
    }

    pub(super) fn model_done(&mut self, result: Result<ChatResponse, ModelError>) {
        if let Some(o) = &self.observer {
            o.call_ended();
        }
        let resp = match checked_usage(result) {
            Ok(r) => r,
            Err(e) => {
                self.beat(Beat::StepFinished { tokens: 0 });
                return self.finish(Ending::failed(RunStatus::Error, e.kind(), e.to_string()));
            }
        };
        // The transcript is still the one the call saw.
        let sent = self.transcript.len();
        self.compaction.observe(sent, resp.usage.input_tokens);
        let tokens = self.charge(&resp.usage, Some(&resp.text));
        let passed = self.ticket.as_ref().and_then(|t| t.passed());
        if let (1, Some(id)) = (self.iteration, self.agent.unpriced_model()) {
            let message = format!("the price table has no model `{id}`: its cost counts as 0");
            tracing::warn!(run_id = %self.shared.run_id, kind = "unknown_price", "{message}");
            self.event(RunEvent::Warning {
                kind: "unknown_price".into(),
                message,
            });
        }
        self.beat(Beat::StepFinished { tokens });
        if !resp.tool_calls.is_empty() {
            // The critic reads the text of a reply the run goes on from
            // (one that ends it is not judged).
            self.watch.reply(self.now, &resp.text);
        }
        self.event(RunEvent::StepFinish {
            iteration: self.iteration,
            text: resp.text.clone(),
            tool_calls: resp.tool_calls.len() as u32,
            usage: resp.usage,
            // Recorded as sent, but for arguments past what any tool
            // accepts: those are kept capped (head, tail, full size).
            calls: resp
                .tool_calls
                .iter()
                .map(|c| ToolCallRequest {
                    arguments: crate::ports::run::cap_arguments(&c.arguments),
                    ..c.clone()
                })
                .collect(),
            finish_reason: resp.finish_reason.clone(),
        });
        if let Some(spent) = passed {
            // The reply passed a budget: the run ends here, the reply's
            // text kept as its output, its tool calls not run.
            let mut e = Ending::killed(KillReason::Budget);
            e.error = Some(spent.message());
            if !resp.text.trim().is_empty() {
                e.output = Some(resp.text);
            }
            return self.finish(e);
        }
        if resp.tool_calls.is_empty() {
            self.push_message(Message::text(Role::Assistant, resp.text.clone()));
            self.event(RunEvent::MessageCreate {
                role: "assistant".into(),
                text: resp.text.clone(),
            });
            // The output guard: one repair turn, then `guardrail`.
            if self.output_refused(&resp.text) {
                return;
            }
            // Structured output (M7): one repair turn, then `invalid_output`.
            if let Some(Err(why)) = self.agent.output().map(|o| o.check(&resp.text)) {
                if OutputSchema::repaired(&self.transcript) {
                    let mut e = Ending::failed(RunStatus::Error, "invalid_output", why);
                    e.output = Some(resp.text);
                    return self.finish(e);
                }
                let text = self
                    .agent
                    .output()
                    .map(|o| o.repair_prompt(&why))
                    .unwrap_or_default();
                self.steer(text);
                self.step_due = true;
                return;
            }
            return self.finish(Ending::ok(resp.text));
        }
        // The calls start (each polled once in place) before the assistant
        // message takes them into the transcript: no copy of the list.
        let ready = self.dispatch_tools(&resp.tool_calls, &[]);
        self.push_message(Message {
            role: Role::Assistant,
            content: resp.text,
            tool_calls: resp.tool_calls,
            tool_call_id: None,
            attachments: Vec::new(),
        });
        if let Some(outcomes) = ready {
            self.tools_done(outcomes);
        } else if self.parked.is_some() {
            // Parked: saved with the turn, so a resumed run waits again.
            self.checkpoint();
        }
    }

    /// What the retry layer calls before each backoff sleep: a `Retrying`
    /// message to the run through its shard (a heartbeat, and a
    /// `model.retry` event the run records). Made once a run,
    /// and only for a model that reports retries (see
    /// `ChatModel::reports_retries`): `None` otherwise.
    pub(super) fn retry_sink(&mut self) -> Option<RetrySink> {
        if let Some(sink) = &self.retry {
            return Some(sink.clone());
        }
        if !self.agent.model().reports_retries() {
            return None;
        }
        let addr = self.addr.clone();
        let sink: RetrySink = Arc::new(move |e: &ModelError, delay: std::time::Duration| {
            // The run records it in its own handler (so its `seq` is taken
            // in order); the message is also the heartbeat.
            addr.send(RunMsg::Retrying {
                kind: e.kind(),
                message: e.to_string(),
                delay,
            });
        });
        self.retry = Some(sink.clone());
        Some(sink)
    }

    /// The observer for the model call about to start (see
    /// `observer`): made once, for a model that streams, whose calls
    /// then have a first-token phase. `None` for other models.
    pub(super) fn call_observer(&mut self) -> Option<Arc<dyn CallObserver>> {
        if self.observer.is_none() {
            if !self.agent.model().streams() {
                return None;
            }
            let throttle =
                RunObserver::throttle(self.limits.stall_timeout, self.limits.first_token());
            self.observer = Some(Arc::new(RunObserver::new(
                self.addr.clone(),
                self.shared.clone(),
                throttle,
            )));
        }
        let observer = self.observer.as_ref()?;
        observer.call_started();
        self.watch.await_first_token();
        Some(observer.clone())
    }
}
