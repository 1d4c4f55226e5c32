//! The default [`CriticPolicy`]: plain rules, decided at once.
//!
//! - Soft timeout: extend the hard deadline by `extension` if the run made
//!   progress (a model call or a tool call that finished) since the last
//!   decision, at most `max_extensions` times; otherwise steer once with a
//!   wrap-up nudge.
//! - Stall: kill (`stalled`).
//! - The same tool call `critic.loops.repeat` (`limits.repeat_limit`)
//!   times in a row: steer once; one more repeat: kill (`runaway`).
//! - Any other loop detector (`same_observation`, `same_error`, `cycle`,
//!   `poll`, `no_progress`, `chant`): two strikes — the first detection is a
//!   steer that names the pattern ([`loop_steer`]), the next of the same
//!   kind kills (`runaway`, its `loop` recorded).
//! - Hard deadline: kill (`deadline`).

use crate::ports::critic::{CriticPolicy, Decision, RunView, Trigger, Verdict};
use crate::ports::run::{KillReason, LoopKind};

/// The message a soft timeout injects when the run made no progress.
pub const WRAP_UP: &str =
    "You are running out of time. Stop calling tools and give your final answer now.";

/// The rules policy. Stateless; share one per host.
#[derive(Clone, Copy, Debug, Default)]
pub struct RulesPolicy;

impl CriticPolicy for RulesPolicy {
    fn decide(&self, trigger: Trigger, view: &RunView) -> Verdict {
        Verdict::Now(rules(trigger, view))
    }
}

/// The rules as a pure function (a model-backed policy can fall back to it).
pub fn rules(trigger: Trigger, view: &RunView) -> Decision {
    match trigger {
        Trigger::SoftTimeout => {
            if view.steps_since_decision > 0 && view.extensions < view.limits.max_extensions {
                Decision::Extend(view.limits.extension)
            } else if view.steers == 0 {
                Decision::Steer(WRAP_UP.to_string())
            } else {
                Decision::Continue
            }
        }
        Trigger::Stall => Decision::Kill(KillReason::Stalled),
        Trigger::Repeat { count } => {
            let limit = u32::from(view.loops.repeat);
            if limit == 0 || count < limit {
                Decision::Continue
            } else if count > limit || view.runaway_steered {
                Decision::Kill(KillReason::Runaway)
            } else {
                Decision::Steer(loop_steer(LoopKind::Repeat, count))
            }
        }
        Trigger::Loop { kind, count } => {
            if view.loops_steered.contains(kind) {
                Decision::Kill(KillReason::Runaway)
            } else {
                Decision::Steer(loop_steer(kind, count))
            }
        }
        Trigger::HardDeadline => Decision::Kill(KillReason::Deadline),
    }
}

/// The steer for a loop the detectors saw `count` times: it names the
/// pattern and says what to do instead (a poll: the `wait` tool).
pub fn loop_steer(kind: LoopKind, count: u32) -> String {
    let what = match kind {
        LoopKind::Repeat => format!(
            "You have made the same tool call with the same arguments {count} times. \
             It will not give a different result: change your approach or give your final answer."
        ),
        LoopKind::SameObservation => format!(
            "You have made the same tool call and got the same result {count} times. \
             Calling it again will not change it: use what you have, change your approach, \
             or give your final answer. To wait for something to change, call the `wait` tool once \
             instead of calling the tool again."
        ),
        LoopKind::SameError => format!(
            "The same tool has failed with the same error {count} times in a row. \
             Stop retrying it this way: read the error, try a different approach, \
             or give your final answer saying what went wrong."
        ),
        LoopKind::Cycle => format!(
            "You are going round in a cycle: the same sequence of tool calls, with the same results, \
             {count} times. Break the cycle: do something different or give your final answer."
        ),
        LoopKind::Poll => format!(
            "You are polling: the same tool call has answered the same thing {count} times. \
             Do not poll through the model: call the `wait` tool with this tool, its arguments and \
             the condition you are waiting for (`until`); it calls the tool on a timer and answers once. \
             Or give your final answer."
        ),
        LoopKind::NoProgress => format!(
            "Your last {count} steps produced nothing new: no new tool results and no new text. \
             Change your approach, or give your final answer with what you have."
        ),
        LoopKind::Chant => format!(
            "You are repeating the same text over and over ({count} times). \
             Stop repeating yourself and give your final answer, briefly."
        ),
    };
    format!("Loop detected ({kind}). {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Limits;
    use std::time::Duration;

    fn view() -> RunView {
        RunView {
            agent: "a".into(),
            elapsed: Duration::from_secs(60),
            steps: 3,
            steps_since_decision: 1,
            tool_calls: 2,
            tokens: 0,
            extensions: 0,
            steers: 0,
            runaway_steered: false,
            limits: Limits::default(),
            trace: Default::default(),
            since_progress: Duration::ZERO,
            tokens_since_progress: 0,
            loops: Default::default(),
            loops_steered: Default::default(),
        }
    }

    #[test]
    fn soft_timeout_extends_on_progress_then_steers() {
        let mut v = view();
        assert_eq!(
            rules(Trigger::SoftTimeout, &v),
            Decision::Extend(Duration::from_secs(60))
        );
        v.extensions = 2;
        assert!(matches!(
            rules(Trigger::SoftTimeout, &v),
            Decision::Steer(_)
        ));
        v.extensions = 0;
        v.steps_since_decision = 0;
        assert!(matches!(
            rules(Trigger::SoftTimeout, &v),
            Decision::Steer(_)
        ));
        v.steers = 1;
        assert_eq!(rules(Trigger::SoftTimeout, &v), Decision::Continue);
    }

    #[test]
    fn repeats_steer_then_kill() {
        let mut v = view();
        assert_eq!(rules(Trigger::Repeat { count: 2 }, &v), Decision::Continue);
        assert!(matches!(
            rules(Trigger::Repeat { count: 3 }, &v),
            Decision::Steer(_)
        ));
        v.runaway_steered = true;
        assert_eq!(
            rules(Trigger::Repeat { count: 4 }, &v),
            Decision::Kill(KillReason::Runaway)
        );
        assert_eq!(
            rules(Trigger::Stall, &v),
            Decision::Kill(KillReason::Stalled)
        );
        assert_eq!(
            rules(Trigger::HardDeadline, &v),
            Decision::Kill(KillReason::Deadline)
        );
        v.loops.repeat = 0;
        assert_eq!(rules(Trigger::Repeat { count: 9 }, &v), Decision::Continue);
    }

    #[test]
    fn other_loops_take_two_strikes_and_a_poll_points_at_wait() {
        let mut v = view();
        for kind in LoopKind::ALL {
            let Decision::Steer(text) = rules(Trigger::Loop { kind, count: 5 }, &v) else {
                panic!("{kind}: a steer first");
            };
            assert!(
                text.starts_with(&format!("Loop detected ({kind}).")),
                "{text}"
            );
            if kind == LoopKind::Poll {
                assert!(text.contains("`wait` tool"), "{text}");
            }
            v.loops_steered.insert(kind);
            assert_eq!(
                rules(Trigger::Loop { kind, count: 6 }, &v),
                Decision::Kill(KillReason::Runaway)
            );
        }
    }
}
