//! A shard's timers: one ordered set of `(deadline, run key)` and one
//! sleeper task that wakes the shard at the earliest (and every [`PULSE`]
//! while it has runs, to tell a pause of the process from a stall); when a
//! run's timer fires, its deadlines are judged: the hard deadline, a
//! parent's cap, a stall, the soft timeout.

use std::collections::BTreeSet;
use std::time::Duration;

use ractor::ActorRef;
use tokio::sync::watch;
use tokio::time::Instant;

use super::decisions::{decision, view_of};
use super::{Critic, CriticMsg, CriticState, PAUSE_GAP, PULSE};
use crate::actors::run::RunState;
use crate::actors::watch::SLOW_HANDLER;
use crate::ports::critic::{Decision, Trigger, Verdict};
use crate::ports::run::{CriticAction, KillReason};
use crate::record::Ending;

impl Critic {
    pub(super) fn tick(&self, myself: &ActorRef<CriticMsg>, st: &mut CriticState) {
        let now = Instant::now();
        while let Some(&(at, key)) = st.timers.first() {
            if at > now {
                break;
            }
            st.timers.pop_first();
            let Some(run) = st.runs.get_mut(&key) else {
                continue;
            };
            if run.watch.armed != Some(at) {
                continue;
            }
            run.watch.armed = None;
            self.with_run(myself, st, key, now, |critic, run| {
                critic.evaluate(myself, run)
            });
        }
        // Always answer the sleeper, which waits for a change after a tick.
        st.wake_at = None;
    }

    /// Re-evaluates one run's deadlines when its timer fires.
    pub(super) fn evaluate(&self, myself: &ActorRef<CriticMsg>, run: &mut RunState) {
        let now = run.now;
        if let Some(at) = run.stop_deadline() {
            if now >= at {
                run.stop_now();
            }
            return;
        }
        if run.done {
            return;
        }
        if let Some((_, until)) = run.watch.parked {
            // Waiting for an operator: no deadline but the approval's.
            if now >= until {
                run.approval_timed_out();
            }
            return;
        }
        let w = &mut run.watch;
        let trigger = if now >= w.deadline() {
            Trigger::HardDeadline
        } else if now >= w.last_beat + w.stall_bound(&run.limits) {
            // Whatever is decided, the next stall is judged a whole stall
            // window from now: the timer never fires again at this instant.
            w.last_beat = now;
            if w.pending {
                return;
            }
            Trigger::Stall
        } else if now >= w.next_soft {
            w.next_soft = now + run.limits.extension.max(Duration::from_millis(1));
            if w.pending {
                return;
            }
            Trigger::SoftTimeout
        } else {
            return;
        };
        if trigger == Trigger::HardDeadline {
            if run.watch.at_parent_deadline() {
                return self.parent_deadline(run);
            }
            return self.hard_deadline(run);
        }
        if trigger == Trigger::SoftTimeout
            && run.judging.is_some()
            && self.judge_soft_timeout(myself, run)
        {
            return;
        }
        self.ask(myself, run, trigger);
    }

    /// The hard deadline: the policy may extend it once more (within
    /// `max_extensions` and the 24 h cap) or name another kill; anything
    /// else — continue, steer, an answer it would give later — ends the run
    /// `timeout`/`deadline`.
    pub(super) fn hard_deadline(&self, run: &mut RunState) {
        let view = view_of(run);
        let asked = std::time::Instant::now();
        let verdict = self.policy.decide(Trigger::HardDeadline, &view);
        let took = asked.elapsed();
        if took > SLOW_HANDLER {
            run.slow("the critic policy", took);
        }
        let d = match verdict {
            Verdict::Now(d @ Decision::Extend(_))
                if run.watch.extensions < run.limits.max_extensions =>
            {
                d
            }
            Verdict::Now(d @ Decision::Kill(_)) => d,
            _ => Decision::Kill(KillReason::Deadline),
        };
        self.apply(run, Trigger::HardDeadline, d);
        if !run.done && run.now >= run.watch.deadline() {
            // The extension did not move it (the 24 h cap).
            let dec = decision(run, CriticAction::Kill, "deadline", None);
            self.stop(run, Ending::killed(KillReason::Deadline), Some(dec));
        }
    }

    /// A sub-agent's run reached its parent's deadline as it knows it: it
    /// ends `killed`/`parent` if the parent has ended, and goes on while
    /// the parent is in flight (see `crate::actors::run::parent`). No
    /// policy is asked: the cause is not the run's.
    pub(super) fn parent_deadline(&self, run: &mut RunState) {
        if run.at_parent_cap() {
            let dec = decision(run, CriticAction::Kill, "parent", None);
            self.stop(run, Ending::killed(KillReason::Parent), Some(dec));
        }
    }
}

/// Arms the run's next timer if it is earlier than the one armed (a
/// stopping run's: the end of its children's grace).
pub(super) fn arm(timers: &mut BTreeSet<(Instant, u64)>, key: u64, run: &mut RunState) {
    let due = run
        .stop_deadline()
        .unwrap_or_else(|| run.watch.next_due(&run.limits));
    if run.watch.armed.is_some_and(|a| a <= due) {
        return;
    }
    if let Some(old) = run.watch.armed.replace(due) {
        timers.remove(&(old, key));
    }
    timers.insert((due, key));
}

/// Points the sleeper at the earliest timer.
pub(super) fn rewake(st: &mut CriticState) {
    let first = st.timers.first().map(|(at, _)| *at);
    if first != st.wake_at {
        st.wake_at = first;
        let _ = st.wake_tx.send(first);
    }
}

/// The shard's one timer task: sleeps until the earliest deadline, then
/// casts `Tick`. While the shard has runs it also wakes every [`PULSE`] and
/// measures the real time between wake-ups: a gap far past the pulse (the
/// process was not scheduled) is cast as `Paused` before the `Tick`, so the
/// shard moves stall windows before it judges them. (The real clock, not
/// tokio's: under a paused test clock, time that jumps is not a pause.)
/// Ends when the critic is gone.
pub(super) async fn sleeper(critic: ActorRef<CriticMsg>, mut rx: watch::Receiver<Option<Instant>>) {
    let mut last_wake = std::time::Instant::now();
    let mut last_wake_at = Instant::now();
    loop {
        let next = *rx.borrow_and_update();
        match next {
            None => {
                if rx.changed().await.is_err() {
                    return;
                }
                last_wake = std::time::Instant::now();
                last_wake_at = Instant::now();
            }
            Some(at) => {
                // From the last wake-up, not from now: timer changes that
                // keep coming must not hold the pulse off.
                let pulse = last_wake_at + PULSE;
                tokio::select! {
                    _ = tokio::time::sleep_until(at.min(pulse)) => {
                        let real = std::time::Instant::now();
                        let paused = pause_gap(last_wake, real);
                        last_wake = real;
                        last_wake_at = Instant::now();
                        if let Some(gap) = paused {
                            if critic.cast(CriticMsg::Paused { gap }).is_err() {
                                return;
                            }
                        }
                        if Instant::now() < at {
                            continue;
                        }
                        if critic.cast(CriticMsg::Tick).is_err() {
                            return;
                        }
                        if rx.changed().await.is_err() {
                            return;
                        }
                    }
                    changed = rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// How long the process was not scheduled between two pulses that the
/// real clock read at `last` and `now`: `None` for a gap within the pulse
/// and its slack.
pub(super) fn pause_gap(last: std::time::Instant, now: std::time::Instant) -> Option<Duration> {
    let gap = now.saturating_duration_since(last);
    (gap > PULSE + PAUSE_GAP).then(|| gap - PULSE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_far_past_the_pulse_is_a_pause() {
        let t0 = std::time::Instant::now();
        assert_eq!(pause_gap(t0, t0 + PULSE), None);
        assert_eq!(pause_gap(t0, t0 + PULSE + PAUSE_GAP), None);
        assert_eq!(
            pause_gap(t0, t0 + Duration::from_secs(12)),
            Some(Duration::from_secs(12) - PULSE)
        );
        // A clock read out of order is no pause.
        assert_eq!(pause_gap(t0 + Duration::from_secs(5), t0), None);
    }

    #[test]
    fn a_pause_moves_the_stall_window_but_not_past_now() {
        use crate::actors::watch::Watched;
        use crate::spec::Limits;
        let t0 = Instant::now();
        let mut w = Watched::new(&Limits::default(), Default::default(), t0);
        let hard = w.hard_deadline;
        w.shift(Duration::from_secs(10), t0 + Duration::from_secs(30));
        assert_eq!(w.last_beat, t0 + Duration::from_secs(10));
        assert_eq!(w.hard_deadline, hard, "hard deadlines still hold");
        w.shift(Duration::from_secs(60), t0 + Duration::from_secs(30));
        assert_eq!(w.last_beat, t0 + Duration::from_secs(30));
    }
}
