//! How a run ends: its ending decided at once, its calls stopped, its
//! children ended first (`killed`/`parent`, each child's terminal record
//! before its parent's, `kill_grace` at most), then one finalization
//! through the shared record and one budget commit.

use tokio::time::Instant;

use super::{spans, Inflight, RunState};
use crate::actors::audit::send_finished;
use crate::actors::budget::BudgetMsg;
use crate::ports::run::{KillReason, RunStatus};
use crate::record::{Command, Ending, STORE_UNAVAILABLE};

use crate::record::Finished;

impl RunState {
    /// Ends the run: its ending is decided now and it stops what is in
    /// flight; then it finalizes through the shared record and commits the
    /// budget. A run with child runs in flight first ends them
    /// (`killed`/`parent`) and finalizes once they have (each child's
    /// terminal record before its parent's), or after `kill_grace`. The
    /// shard drops the run once it is finalized.
    pub(crate) fn finish(&mut self, mut ending: Ending) {
        if self.done {
            return;
        }
        // No ending keeps an output the output guard denies (see `guard`).
        self.withhold_guarded_output(&mut ending);
        self.done = true;
        match self.inflight.take() {
            Some(Inflight::Model(h)) => {
                h.abort();
                self.charge_cut_call();
            }
            // The task itself gives the calls `kill_grace`, then drops them.
            Some(Inflight::Tools { cancel, .. }) => cancel.cancel(),
            Some(Inflight::Checkpoint) if ending.kill_reason == Some(KillReason::Deadline) => {
                // Its deadline came while the store refused its last step:
                // the run could not be kept on record.
                ending = Ending::failed(
                    RunStatus::Error,
                    STORE_UNAVAILABLE,
                    "the run's checkpoint could not be written before its deadline \
                     (the checkpoint store refused it): the run stopped rather than \
                     go on off the record",
                );
            }
            Some(Inflight::Checkpoint) | None => {}
        }
        let children = self.shared.live_children();
        if children.is_empty() {
            return self.finalize(ending);
        }
        for child in children {
            if let Some(c) = self.shared.host().get(&child) {
                c.command(Command::Stop(Some(KillReason::Parent)));
            }
        }
        self.stopping = Some(Box::new((ending, self.now + self.limits.kill_grace)));
    }

    /// A child run ended: a run waiting for its children to end finalizes
    /// once the last one has.
    pub(crate) fn child_ended(&mut self) {
        if self.stopping.is_some() && !self.shared.has_children() {
            if let Some((ending, _)) = self.stopping.take().map(|b| *b) {
                self.finalize(ending);
            }
        }
    }

    /// When a stopping run finalizes without waiting longer for its
    /// children (`kill_grace` after its ending was decided).
    pub(crate) fn stop_deadline(&self) -> Option<Instant> {
        self.stopping.as_ref().map(|s| s.1)
    }

    /// The grace for a stopping run's children is over: it finalizes.
    pub(crate) fn stop_now(&mut self) {
        if let Some((ending, _)) = self.stopping.take().map(|b| *b) {
            tracing::warn!(run_id = %self.shared.run_id, "child runs did not end within kill_grace; the run finalizes without them");
            self.finalize(ending);
        }
    }

    pub(super) fn finalize(&mut self, ending: Ending) {
        self.finalized = true;
        spans::run_ended(&self.span, &ending, || self.shared.partial().usage);
        let records = std::mem::take(&mut self.pending_audit);
        let mut finished = self.shared.finish_after(ending, records);
        if let Finished::Terminal(t) = &mut finished {
            // A durable run's result waits for its record, until its deadline.
            if t.durable {
                let left = self.watch.hard_deadline.saturating_duration_since(self.now);
                t.deliver.wait_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
            }
        }
        send_finished(&self.audit, finished);
        if let Some(mut t) = self.ticket.take() {
            t.charge_runtime(self.started.elapsed());
            let mut spend = t.take_unmetered();
            spend.runs = 1;
            let _ = self.budget.cast(BudgetMsg::Commit {
                caller: t.caller_arc(),
                spend,
            });
        }
    }
}
