//! A shard's decisions on its runs: a question put to the
//! [`CriticPolicy`](crate::ports::critic::CriticPolicy) (answered now, or
//! later by a task within [`POLICY_TIMEOUT`]), the decision carried out
//! (steer, extend, raise the step ceiling, kill) and recorded where the
//! caller sees it, and a sticky stop.

use std::sync::atomic::Ordering;

use ractor::ActorRef;

use super::{Critic, CriticMsg, FIRST_TOKEN_TIMEOUT, MAX_PENDING_DECISIONS, POLICY_TIMEOUT};
use crate::actors::run::{spans, RunState};
use crate::actors::watch::SLOW_HANDLER;
use crate::policy::rules;
use crate::ports::critic::{Decision, RunView, Trigger, Verdict};
use crate::ports::event::RunEvent;
use crate::ports::run::{CriticAction, CriticDecision, LoopKind};
use crate::record::Ending;

impl Critic {
    pub(super) fn ask(&self, myself: &ActorRef<CriticMsg>, run: &mut RunState, trigger: Trigger) {
        let view = view_of(run);
        let asked = std::time::Instant::now();
        let verdict = self.policy.decide(trigger, &view);
        let took = asked.elapsed();
        if took > SLOW_HANDLER {
            run.slow("the critic policy", took);
        }
        match verdict {
            Verdict::Now(d) => self.apply(run, trigger, d),
            Verdict::Later(fut) => {
                if run.watch.pending
                    || self.pending.load(Ordering::Relaxed) >= MAX_PENDING_DECISIONS
                {
                    // One question per run, a bounded number per shard:
                    // beyond that the rules decide now.
                    return self.apply(run, trigger, rules(trigger, &view));
                }
                run.watch.pending = true;
                self.pending.fetch_add(1, Ordering::Relaxed);
                let pending = self.pending.clone();
                let me = myself.clone();
                let key = run.addr.key;
                tokio::spawn(async move {
                    let decision = match tokio::time::timeout(POLICY_TIMEOUT, fut).await {
                        Ok(d) => d,
                        Err(_) => {
                            tracing::warn!(
                                ?trigger,
                                "the critic policy did not answer in time: the rules decide"
                            );
                            rules(trigger, &view)
                        }
                    };
                    pending.fetch_sub(1, Ordering::Relaxed);
                    let _ = me.cast(CriticMsg::Decided {
                        key,
                        trigger,
                        decision,
                    });
                });
            }
        }
    }

    pub(super) fn apply(&self, run: &mut RunState, trigger: Trigger, d: Decision) {
        self.carry_out(run, Some(trigger), None, None, d);
    }

    /// Carries a decision out and records it: for `trigger` (`None`: the
    /// run's model judge decided on its own cadence), with `said` as the
    /// recorded reason when given (a judge's), else the trigger's name
    /// (a kill's: its kill reason), and `kill_detail` as a kill's detail.
    pub(super) fn carry_out(
        &self,
        run: &mut RunState,
        trigger: Option<Trigger>,
        said: Option<&str>,
        kill_detail: Option<String>,
        d: Decision,
    ) {
        if run.done {
            return;
        }
        let named = match trigger {
            Some(Trigger::SoftTimeout) => "soft_timeout",
            Some(Trigger::Stall) => "stalled",
            Some(Trigger::Repeat { .. } | Trigger::Loop { .. }) => "runaway",
            Some(Trigger::HardDeadline) => "deadline",
            None => "judge",
        };
        let reason = said.unwrap_or(named);
        let looped = trigger.and_then(loop_of);
        match d {
            Decision::Continue => return,
            Decision::Steer(text) => {
                match trigger {
                    Some(Trigger::Repeat { .. }) => run.watch.runaway_steered = true,
                    _ => run.watch.steers += 1,
                }
                if let Some(kind) = looped {
                    run.watch.loops.steered.insert(kind);
                }
                let mut dec = decision(run, CriticAction::Steer, reason, Some(text.clone()));
                dec.loop_kind = looped;
                self.record(run, dec);
                run.steer(text);
            }
            Decision::Extend(by) => {
                if run.watch.extensions >= run.limits.max_extensions {
                    // C2: extensions are bounded, whatever a policy asks.
                    return;
                }
                run.watch.extensions += 1;
                run.watch.extend(run.started, by);
                run.tell_children_deadline();
                let detail = Some(format!("{}ms", by.as_millis()));
                let dec = decision(run, CriticAction::Extend, reason, detail);
                self.record(run, dec);
            }
            Decision::RaiseIterations(by) => {
                let dec = decision(
                    run,
                    CriticAction::RaiseIterations,
                    reason,
                    Some(by.to_string()),
                );
                self.record(run, dec);
                run.raise_iterations(by);
            }
            Decision::Kill(kill) => {
                let mut ending = Ending::killed(kill);
                let mut detail = kill_detail;
                if matches!(trigger, Some(Trigger::Stall)) && run.watch.awaiting_first {
                    // Told apart from a stall: the server never started answering.
                    let waited = run.limits.first_token();
                    ending.error_kind = Some(FIRST_TOKEN_TIMEOUT.to_string());
                    ending.error = Some(format!(
                        "killed: no first token within {} (a server that queues requests, or one that does not answer; see `limits.first_token_timeout`)",
                        crate::spec::format_duration(waited)
                    ));
                    detail = Some(FIRST_TOKEN_TIMEOUT.to_string());
                }
                if let Some(kind) = looped {
                    ending.loop_kind = Some(kind);
                    ending.error = Some(format!("killed: {kill} (loop: {kind})"));
                }
                let mut dec = decision(
                    run,
                    CriticAction::Kill,
                    said.unwrap_or(kill.as_str()),
                    detail,
                );
                dec.loop_kind = looped;
                self.stop(run, ending, Some(dec));
            }
        }
        run.watch.progress_at_decision = run.watch.progress();
    }

    /// Records a decision where the caller sees it: the result, the event
    /// stream and the audit log (in the run's order of records).
    pub(super) fn record(&self, run: &mut RunState, d: CriticDecision) {
        spans::decided(run.span(), &d);
        let event = RunEvent::from_decision(d.clone());
        run.shared.partial().critic.push(d);
        run.event(event);
    }

    /// Sticky stop: the first ending wins (a run that ended ignores it);
    /// the run stops its in-flight calls and finalizes now.
    pub(super) fn stop(&self, run: &mut RunState, ending: Ending, d: Option<CriticDecision>) {
        if run.done {
            return;
        }
        if let Some(d) = d {
            self.record(run, d);
        }
        run.finish(ending);
    }
}

/// What a policy sees of a run.
pub(super) fn view_of(run: &RunState) -> RunView {
    let w = &run.watch;
    RunView {
        agent: run.shared.agent.to_string(),
        elapsed: run.now.saturating_duration_since(run.started),
        steps: w.steps,
        steps_since_decision: w.progress().saturating_sub(w.progress_at_decision),
        tool_calls: w.tool_calls,
        tokens: w.tokens,
        extensions: w.extensions,
        steers: w.steers,
        runaway_steered: w.runaway_steered,
        limits: *run.limits,
        trace: w.loops.trace.clone(),
        since_progress: run.now.saturating_duration_since(w.progress_at),
        tokens_since_progress: w.tokens.saturating_sub(w.tokens_at_progress),
        loops: w.loops.limits,
        loops_steered: w.loops.steered,
    }
}

pub(super) fn decision(
    run: &RunState,
    action: CriticAction,
    reason: &str,
    detail: Option<String>,
) -> CriticDecision {
    CriticDecision {
        action,
        reason: reason.to_string(),
        at_ms: run.now.saturating_duration_since(run.started).as_millis() as u64,
        detail,
        loop_kind: None,
    }
}

/// The loop a trigger reports, if it is a loop detector's.
pub(super) fn loop_of(trigger: Trigger) -> Option<LoopKind> {
    match trigger {
        Trigger::Repeat { .. } => Some(LoopKind::Repeat),
        Trigger::Loop { kind, .. } => Some(kind),
        _ => None,
    }
}
