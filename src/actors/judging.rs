//! A run's record of its model judges ([`Judging`]): when the critic's
//! judge is next due, what it has spent, the question in flight, and the
//! approval judge's escalation counts. It lives in the run's state (boxed,
//! and only for an agent with a judge: a run without one carries a `None`
//! and pays nothing per step); the critic shard and the run read and write
//! it. The judges' questions and answers are `crate::judge`'s. Dropping it
//! aborts a question still in flight: a run that ends takes its judges'
//! calls with it.

use tokio::task::AbortHandle;

use crate::judge::{Judges, CADENCE};

/// Escalations in a row after which the approval judge is no longer asked
/// in a run: every later gated call waits for a person.
pub const ESCALATIONS_IN_A_ROW: u32 = 3;

/// Escalations in a run after which the approval judge is no longer asked.
pub const ESCALATIONS_PER_RUN: u32 = 20;

/// A run's judges' state.
#[derive(Debug, Default)]
pub struct Judging {
    /// The critic's judge (`critic.policy: judge`).
    pub(crate) critic: Option<CriticJudging>,
    /// The approval judge (`approval.judge`).
    pub(crate) approval: Option<ApprovalJudging>,
}

impl Judging {
    /// The state for an agent's judges, `None` when it has none.
    pub(crate) fn of(judges: &Judges) -> Option<Box<Judging>> {
        if judges.critic.is_none() && judges.approval.is_none() {
            return None;
        }
        Some(Box::new(Judging {
            critic: judges.critic.as_ref().map(|j| CriticJudging {
                next_at: j.spec.after_steps.max(1),
                ..Default::default()
            }),
            approval: judges.approval.as_ref().map(|_| ApprovalJudging::default()),
        }))
    }
}

/// The critic's judge in one run.
#[derive(Debug, Default)]
pub struct CriticJudging {
    /// The step at which it is next asked.
    pub(crate) next_at: u32,
    /// Tokens its questions used so far (against `budget_tokens`).
    pub(crate) spent: u64,
    /// Questions asked of the judge (its scripted model's call index).
    pub(crate) asked: u32,
    /// Questions asked of the confirming model.
    pub(crate) confirms: u32,
    /// The question in flight.
    pub(crate) task: Option<AbortHandle>,
    /// Its budget is spent: the rules decide from now on (said once).
    pub(crate) spent_out: bool,
}

impl CriticJudging {
    /// Whether a question is in flight.
    pub(crate) fn pending(&self) -> bool {
        self.task.is_some()
    }

    /// Moves the next question `interval` steps past `steps` (within the
    /// cadence's bounds).
    pub(crate) fn next_after(&mut self, steps: u32, interval: u32) {
        self.next_at = steps.saturating_add(interval.clamp(CADENCE.0, CADENCE.1));
    }
}

/// The approval judge in one run. A *denial* here is a gated call the
/// judge did not approve (it escalated it, or said nothing of it): after
/// [`ESCALATIONS_IN_A_ROW`] of them with no approval between, or
/// [`ESCALATIONS_PER_RUN`] in the run, the judge is off for the run and a
/// person decides every gated call, the turn that tripped it included.
#[derive(Debug, Default)]
pub struct ApprovalJudging {
    /// Questions asked (its scripted model's call index).
    pub(crate) asked: u32,
    /// Escalations since the judge last approved a call.
    pub(crate) in_a_row: u32,
    /// Escalations in the run.
    pub(crate) total: u32,
    /// The judge is no longer asked in this run.
    pub(crate) off: bool,
    /// The question in flight.
    pub(crate) task: Option<AbortHandle>,
}

impl ApprovalJudging {
    /// Counts the judge's decision on one call; `true` when the count
    /// passes a bound (the judge is then off).
    pub(crate) fn count(&mut self, approved: bool) -> bool {
        if approved {
            self.in_a_row = 0;
        } else {
            self.in_a_row += 1;
            self.total += 1;
        }
        if self.in_a_row >= ESCALATIONS_IN_A_ROW || self.total >= ESCALATIONS_PER_RUN {
            self.off = true;
        }
        self.off
    }
}

impl Drop for Judging {
    fn drop(&mut self) {
        if let Some(t) = self.critic.as_mut().and_then(|c| c.task.take()) {
            t.abort();
        }
        if let Some(t) = self.approval.as_mut().and_then(|a| a.task.take()) {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_escalations_in_a_row_or_twenty_in_a_run_turn_the_judge_off() {
        let mut a = ApprovalJudging::default();
        assert!(!a.count(false));
        assert!(!a.count(false));
        assert!(!a.count(true), "an approval resets the row");
        assert!(!a.count(false));
        assert!(!a.count(false));
        assert!(a.count(false), "three in a row");
        let mut b = ApprovalJudging::default();
        for _ in 0..19 {
            assert!(!b.count(false));
            b.count(true);
        }
        assert!(b.count(false), "the 20th in the run");
    }
}
