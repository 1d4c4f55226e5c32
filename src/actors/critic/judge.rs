//! The critic's model judge on a shard (`critic: { policy: judge, … }`;
//! what it is asked and how its answer reads are `crate::judge`'s).
//!
//! It is not a `CriticPolicy`: a policy is the host's and sees a
//! `RunView` of counters, where the judge is a manifest's and reads the
//! run's request and trace, which only the run holds.
//!
//! # When it is asked
//! After `after_steps` steps, then every 5 to 15 steps (`every_steps`,
//! moved by its last confidence: see `judge::next_interval`), and at a
//! soft timeout (instead of the host's policy: it answers `extend` for a
//! slow but healthy run, `kill` for a wedged one). One question per run
//! at a time; a soft timeout that comes while a question is in flight is
//! the host policy's. Reviewed where the repeat decision is (after each
//! of the run's handlers and inline steps): a run without a judge pays one
//! `Option` test a step.
//!
//! # Off the shard
//! A question is a task (the judge's model call, then the second opinion's
//! when it is due, each under `timeout`); its answer comes back as
//! `CriticMsg::Judged`. The task is aborted when the run ends.
//!
//! # What its answer does
//! `continue` nothing; `steer` injects its `message`; `extend` pushes the
//! hard deadline back by `limits.extension` (within `max_extensions`);
//! `raise_steps` raises the step ceiling by `every_steps`; `kill` below
//! `threshold` is a steer; at or above it, it is put to `confirm_model`
//! (when set) and the run is killed (`killed`/`policy`) only if that one
//! says `kill` too — otherwise it is a steer. The decision's `reason` is
//! the judge's. A judge that fails, times out or answers what the schema
//! refuses is a `warning` (`judge_failed`, `judge_timeout`,
//! `judge_invalid`), and the rules decide (at a soft timeout, the rules'
//! answer; on its cadence, nothing). Its tokens are charged as the run's
//! (`RunState::charge_critic`); past `budget_tokens` it is asked no more
//! (a `judge_budget` warning) and the rules decide.

use ractor::ActorRef;

use super::decisions::view_of;
use super::{Critic, CriticMsg};
use crate::actors::run::RunState;
use crate::judge::{
    self, critic_question, next_interval, JudgeError, Occasion, Verdict, VerdictKind, REPLY_TOKENS,
    VERDICT_SCHEMA,
};
use crate::policy::rules;
use crate::ports::critic::{Decision, Trigger};
use crate::ports::event::RunEvent;
use crate::ports::run::{cap_text, CriticUsage, KillReason};

/// The bytes of a judge's reason a decision records.
const REASON_BYTES: usize = 300;

/// A judge's answer about one run (`CriticMsg::Judged`).
pub(crate) struct JudgeAnswer {
    occasion: Occasion,
    outcome: Result<Verdict, JudgeError>,
    /// The second opinion, when the verdict was a kill at or above the
    /// threshold and the agent has a `confirm_model`.
    confirmed: Option<Result<Verdict, JudgeError>>,
    usage: CriticUsage,
}

impl Critic {
    /// Asks the run's judge when its cadence has come round.
    pub(super) fn review_judge(&self, myself: &ActorRef<CriticMsg>, run: &mut RunState) {
        if run.done || run.watch.parked.is_some() {
            return;
        }
        let steps = run.watch.steps;
        let due = run
            .judging
            .as_deref()
            .and_then(|j| j.critic.as_ref())
            .is_some_and(|c| !c.pending() && steps >= c.next_at);
        if due {
            self.ask_judge(myself, run, Occasion::Review);
        }
    }

    /// A soft timeout: the run's judge decides, when it can be asked now.
    /// `false` when it cannot (none, busy, its budget spent).
    pub(super) fn judge_soft_timeout(
        &self,
        myself: &ActorRef<CriticMsg>,
        run: &mut RunState,
    ) -> bool {
        let free = run
            .judging
            .as_deref()
            .and_then(|j| j.critic.as_ref())
            .is_some_and(|c| !c.pending());
        free && self.ask_judge(myself, run, Occasion::SoftTimeout)
    }

    /// Starts a question in a task of its own; `false` when none was
    /// started (no judge, or its budget is spent).
    fn ask_judge(
        &self,
        myself: &ActorRef<CriticMsg>,
        run: &mut RunState,
        occasion: Occasion,
    ) -> bool {
        let Some(judge) = run.agent().judges().critic.clone() else {
            return false;
        };
        let budget = judge.spec.budget_tokens;
        let spent = match run.judging.as_deref().and_then(|j| j.critic.as_ref()) {
            Some(c) => c.spent,
            None => return false,
        };
        if spent >= budget {
            let first = run
                .judging
                .as_deref_mut()
                .and_then(|j| j.critic.as_mut())
                .is_some_and(|c| {
                    c.next_at = u32::MAX;
                    !std::mem::replace(&mut c.spent_out, true)
                });
            if first {
                run.event(RunEvent::Warning {
                    kind: "judge_budget".into(),
                    message: format!(
                        "the judge spent its budget ({spent} of {budget} tokens): the rules decide from now on"
                    ),
                });
            }
            return false;
        }
        let evidence = run.evidence();
        let key = run.addr.key;
        let Some(c) = run.judging.as_deref_mut().and_then(|j| j.critic.as_mut()) else {
            return false;
        };
        let room = (budget - spent).min(REPLY_TOKENS);
        let index = c.asked;
        c.asked += 1;
        let confirm_index = c.confirms;
        let me = myself.clone();
        let task = tokio::spawn(async move {
            let timeout = judge.spec.timeout;
            let mut usage = CriticUsage::default();
            let question = critic_question(&evidence, &occasion);
            let first = judge::ask(
                &judge.model,
                question,
                &VERDICT_SCHEMA,
                index,
                room,
                timeout,
            )
            .await;
            let outcome = first.and_then(|a| {
                usage.add(&a.usage);
                judge::parse_verdict(&a.text)
            });
            let confirmed = match (&outcome, &judge.confirm) {
                (Ok(v), Some(second))
                    if v.verdict == VerdictKind::Kill && v.confidence >= judge.spec.threshold =>
                {
                    let ask = Occasion::Confirm {
                        reason: v.reason.clone(),
                    };
                    let question = critic_question(&evidence, &ask);
                    let answer = judge::ask(
                        second,
                        question,
                        &VERDICT_SCHEMA,
                        confirm_index,
                        REPLY_TOKENS,
                        timeout,
                    )
                    .await;
                    Some(answer.and_then(|a| {
                        usage.add(&a.usage);
                        judge::parse_verdict(&a.text)
                    }))
                }
                _ => None,
            };
            let answer = JudgeAnswer {
                occasion,
                outcome,
                confirmed,
                usage,
            };
            let _ = me.cast(CriticMsg::Judged {
                key,
                answer: Box::new(answer),
            });
        });
        c.task = Some(task.abort_handle());
        true
    }

    /// The judge answered: its tokens are charged, its next question
    /// scheduled, and its verdict carried out (see the module doc).
    pub(super) fn judged(&self, run: &mut RunState, a: JudgeAnswer) {
        run.charge_critic(&a.usage);
        let Some(judge) = run.agent().judges().critic.clone() else {
            return;
        };
        let steps = run.watch.steps;
        let every = judge.spec.every_steps;
        let Some(c) = run.judging.as_deref_mut().and_then(|j| j.critic.as_mut()) else {
            return;
        };
        c.task = None;
        c.spent = c.spent.saturating_add(a.usage.total());
        if a.confirmed.is_some() {
            c.confirms += 1;
        }
        let interval = match &a.outcome {
            Ok(v) => next_interval(every, v.verdict, v.confidence),
            Err(_) => every,
        };
        c.next_after(steps, interval);
        if run.done {
            return;
        }
        let trigger = (a.occasion == Occasion::SoftTimeout).then_some(Trigger::SoftTimeout);
        let v = match a.outcome {
            Ok(v) => v,
            Err(e) => {
                warn_failed(run, &e, "the rules decide");
                if let Some(t) = trigger {
                    let view = view_of(run);
                    self.apply(run, t, rules(t, &view));
                }
                return;
            }
        };
        let reason = cap_text(v.reason.trim(), REASON_BYTES);
        let steer = v
            .message
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| {
                format!(
                    "A supervisor reviewing this run says: {reason} Change your approach, or give your final answer."
                )
            });
        let mut detail = None;
        let d = match v.verdict {
            VerdictKind::Continue => Decision::Continue,
            VerdictKind::Steer => Decision::Steer(steer),
            VerdictKind::Extend => Decision::Extend(run.limits.extension),
            VerdictKind::RaiseSteps => Decision::RaiseIterations(every),
            // Not sure enough to end it: a steer.
            VerdictKind::Kill if v.confidence < judge.spec.threshold => Decision::Steer(steer),
            VerdictKind::Kill => match a.confirmed {
                None => {
                    detail = Some(format!("judge confidence {:.2}", v.confidence));
                    Decision::Kill(KillReason::Policy)
                }
                Some(Ok(second)) if second.verdict == VerdictKind::Kill => {
                    detail = Some(format!(
                        "judge confidence {:.2}, confirmed by {} ({:.2})",
                        v.confidence,
                        judge.confirm.as_ref().map_or("", |m| m.model.name()),
                        second.confidence
                    ));
                    Decision::Kill(KillReason::Policy)
                }
                // The second opinion disagrees: not killed, steered.
                Some(Ok(_)) => Decision::Steer(steer),
                Some(Err(e)) => {
                    warn_failed(run, &e, "the kill is not confirmed: a steer instead");
                    Decision::Steer(steer)
                }
            },
        };
        self.carry_out(run, trigger, Some(&reason), detail, d);
    }
}

/// A judge gave no usable answer: a `warning` event saying what follows.
fn warn_failed(run: &mut RunState, e: &JudgeError, then: &str) {
    tracing::warn!(run_id = %run.shared.run_id, kind = e.kind(), "{e}: {then}");
    run.event(RunEvent::Warning {
        kind: e.kind().to_string(),
        message: format!("{e}: {then}"),
    });
}
