//! The default [`CriticPolicy`]: plain rules, decided at once.
//!
//! - Soft timeout: extend the hard deadline by `extension` if the run made
//!   progress (a model call or a tool call that finished) since the last
//!   decision, at most `max_extensions` times; otherwise steer once with a
//!   wrap-up nudge.
//! - Stall: kill (`stalled`).
//! - The same tool call `repeat_limit` times in a row: steer once; one more
//!   repeat: kill (`runaway`).
//! - Hard deadline: kill (`deadline`).

use crate::ports::critic::{CriticPolicy, Decision, RunView, Trigger, Verdict};
use crate::ports::run::KillReason;

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
            if count > view.limits.repeat_limit
                || (count == view.limits.repeat_limit && view.runaway_steered)
            {
                Decision::Kill(KillReason::Runaway)
            } else if count == view.limits.repeat_limit {
                Decision::Steer(format!(
                    "You have made the same tool call with the same arguments {count} times. \
                     It will not give a different result: change your approach or give your final answer."
                ))
            } else {
                Decision::Continue
            }
        }
        Trigger::HardDeadline => Decision::Kill(KillReason::Deadline),
    }
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
    }
}
