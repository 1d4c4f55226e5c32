//! The scheduler's clock: the system's wall clock, or a wall time that
//! moves with tokio's clock (tests and benches walk a paused clock across
//! any date with `advance`).

use jiff::{SignedDuration, Timestamp};

/// Where the scheduler reads the time: the system's wall clock, or (tests,
/// benches) a fixed wall time that moves with tokio's clock, so a paused
/// clock and `advance` walk it across any date.
#[derive(Clone, Copy, Debug)]
pub enum SchedulerClock {
    /// `Timestamp::now()`.
    System,
    /// `wall` at tokio instant `at`, moving with tokio's clock.
    Anchored {
        /// The wall time at `at`.
        wall: Timestamp,
        /// The tokio instant it was taken.
        at: tokio::time::Instant,
    },
}

impl SchedulerClock {
    /// The wall time `wall` now, moving with tokio's clock.
    pub fn starting_at(wall: Timestamp) -> Self {
        SchedulerClock::Anchored {
            wall,
            at: tokio::time::Instant::now(),
        }
    }

    /// The time now.
    pub fn now(&self) -> Timestamp {
        match self {
            SchedulerClock::System => Timestamp::now(),
            SchedulerClock::Anchored { wall, at } => {
                let gone = SignedDuration::try_from(at.elapsed()).unwrap_or(SignedDuration::MAX);
                wall.checked_add(gone).unwrap_or(Timestamp::MAX)
            }
        }
    }
}
