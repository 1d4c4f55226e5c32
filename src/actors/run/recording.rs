//! What a run records while a message is handled: events (their `seq`
//! taken in the run's order), audit records sent as one batch at the
//! handler's end, and the tokens metered to the budget actor.

use super::RunState;
use crate::actors::audit::AuditMsg;
use crate::actors::budget::BudgetMsg;
use crate::ports::audit::{AuditEntry, AuditRecord};
use crate::ports::event::RunEvent;
use crate::ports::run::unix_ms;

/// Audit records a handler's buffer has room for from its first record.
const AUDIT_RESERVE: usize = 16;

impl RunState {
    /// Sends the tokens charged since the last meter to the budget actor
    /// (once per handler; a finished run's go with its commit).
    pub(super) fn flush_meter(&mut self) {
        if self.done {
            return;
        }
        if let Some(t) = &mut self.ticket {
            let spend = t.take_unmetered();
            if spend != Default::default() {
                let _ = self.budget.cast(BudgetMsg::Meter {
                    caller: t.caller_arc(),
                    spend,
                });
            }
        }
    }

    /// Records an event: its `seq` is taken, subscribers get it, and its
    /// audit record goes out with the handler's batch.
    pub(crate) fn event(&mut self, ev: RunEvent) {
        // A subscriber may decide the moment it reads `approval.requested`,
        // on another thread: the call must wait before anyone hears of it.
        // (A race no test can time; every test that gates a call checks it.)
        #[cfg(debug_assertions)]
        if let RunEvent::ApprovalRequested { call_id, .. } = &ev {
            let waits = self
                .shared
                .partial()
                .awaiting
                .iter()
                .any(|p| p.call_id == *call_id);
            debug_assert!(waits, "approval.requested for {call_id} before it waits");
        }
        let seq = self.shared.next_seq();
        self.shared.emit(seq, &ev);
        // `audit: summary` leaves the step events to the live stream.
        if self.shared.records(&ev) {
            self.push_record(seq, AuditEntry::Event(ev));
        }
    }

    pub(crate) fn audit_entry(&mut self, entry: AuditEntry) {
        let seq = self.shared.next_seq();
        self.push_record(seq, entry);
    }

    pub(super) fn push_record(&mut self, seq: u32, entry: AuditEntry) {
        if self.clock_ms == 0 {
            self.clock_ms = unix_ms();
        }
        let at_ms = self.clock_ms;
        if self.pending_audit.capacity() == 0 {
            // Room for a whole run that answers at once (W1 makes 13
            // records): one allocation, not a chain of regrowths.
            self.pending_audit.reserve(AUDIT_RESERVE);
        }
        self.pending_audit.push(AuditRecord {
            run_id: self.shared.run_id,
            seq,
            at_ms,
            entry,
        });
    }

    pub(super) fn flush_audit(&mut self) {
        if !self.pending_audit.is_empty() {
            let mut batch = std::mem::take(&mut self.pending_audit);
            // A handler that ends on a call in flight made a few records
            // in room for a whole run: the batch waits in the audit
            // actor's mailbox, and then in the store, so it goes out at
            // its size (when a burst of runs starts or wakes at once,
            // tens of thousands of them wait there).
            if batch.capacity() > 2 * batch.len() {
                batch.shrink_to_fit();
            }
            let _ = self.audit.cast(AuditMsg::Records(batch));
        }
    }
}
