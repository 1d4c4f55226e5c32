//! A sub-agent's run and its parent's deadline. A child's hard deadline is
//! capped at its parent's, and the cap follows the parent:
//!
//! - **The parent tells its children.** When a run's deadline in force
//!   moves (a critic or operator extension, the end of a wait for
//!   approval, its own parent's move), it sends each child in flight its
//!   new deadline (`Command::ParentDeadline`), which raises the child's cap
//!   and goes on down the tree. This costs messages only when a deadline
//!   moves and only for a run with children; no run carries anything more.
//! - **`killed`/`parent` means the parent ended.** A child whose timer
//!   reaches its cap while its parent is still in flight does not end: the
//!   parent is at its own deadline, where it is extended (and tells the
//!   child) or ends (and ends the child `killed`/`parent` with it), or it
//!   was extended before the child was counted as its child. The child
//!   looks again every [`PARENT_POLL`], and ends `killed`/`parent` once its
//!   parent is no longer in flight. Its own limits still hold throughout.

use std::time::Duration;

use tokio::time::Instant;

use super::RunState;
use crate::record::Command;

/// How often a run past its parent's deadline as it knows it checks that
/// the parent is still in flight.
pub(crate) const PARENT_POLL: Duration = Duration::from_secs(1);

impl RunState {
    /// Tells the run's children in flight its deadline in force (call
    /// whenever it may have moved). One lock for a run without children.
    pub(crate) fn tell_children_deadline(&self) {
        if !self.shared.has_children() {
            return;
        }
        let at = self.watch.deadline();
        for child in self.shared.live_children() {
            if let Some(c) = self.shared.host().get(&child) {
                c.command(Command::ParentDeadline(at));
            }
        }
    }

    /// The parent's deadline moved to `at`: the cap follows, and the run's
    /// own children hear of it if its deadline in force moved.
    pub(crate) fn parent_deadline_moved(&mut self, at: Instant) {
        if self.watch.cap_at_parent(at) {
            self.tell_children_deadline();
        }
    }

    /// The run reached its parent's deadline as it knows it. Returns
    /// whether the parent has ended (the run is then to end
    /// `killed`/`parent`); while the parent is in flight the cap moves
    /// [`PARENT_POLL`] on and the run goes on.
    pub(crate) fn at_parent_cap(&mut self) -> bool {
        let in_flight = self
            .shared
            .parent_run_id
            .is_some_and(|p| self.shared.host().get(&p).is_some());
        if in_flight {
            self.watch.cap_at_parent(self.now + PARENT_POLL);
        }
        !in_flight
    }
}
