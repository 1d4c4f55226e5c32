//! Token allowances that are not a caller's: a run's own budget (its
//! manifest's `budget.tokens`, an invocation's `budget_tokens`), which its
//! sub-agents spend too, and a host-wide allowance (`--budget-tokens` of
//! one command). Each is counted in memory from what its runs spent, with
//! the same reserve-and-settle as a caller's account (see
//! `actors::budget`): a call starts only while spent + reserved is under
//! the limit, so the runs spending one allowance pass it by less than one
//! reply when their estimates hold.
//!
//! A run's ticket holds its caller's account and every allowance above it
//! (the host's, its ancestors', its own): all apply together, the tightest
//! wins. Allowances are not written to the ledger: every token they count
//! is also charged to the caller's account, which is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One token allowance (see the module doc).
#[derive(Debug)]
pub(crate) struct Allowance {
    /// What it limits, in words: "run 01ab…", "this command".
    label: Box<str>,
    limit: u64,
    spent: AtomicU64,
    /// Tokens reserved by calls about to start or in flight.
    reserved: AtomicU64,
}

/// The allowances a run spends against, outermost first; shared by the
/// run's record (its sub-agents inherit them) and its ticket.
pub(crate) type Allowances = Arc<[Arc<Allowance>]>;

impl Allowance {
    /// An allowance of `limit` tokens of which `spent` are spent (a resumed
    /// run's earlier calls).
    pub(crate) fn new(label: impl Into<Box<str>>, limit: u64, spent: u64) -> Arc<Allowance> {
        Arc::new(Allowance {
            label: label.into(),
            limit,
            spent: AtomicU64::new(spent),
            reserved: AtomicU64::new(0),
        })
    }

    /// What it limits, in words.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Tokens spent so far.
    pub(crate) fn spent(&self) -> u64 {
        self.spent.load(Ordering::Acquire)
    }

    /// Reserves `estimate` tokens if spent + reserved is under the limit.
    pub(crate) fn reserve(&self, estimate: u64) -> bool {
        // `reserved` before `spent`, as a caller's account does: a call
        // that settles adds its tokens before it releases its hold.
        let mut cur = self.reserved.load(Ordering::Acquire);
        loop {
            if self.spent().saturating_add(cur) >= self.limit {
                return false;
            }
            match self.reserved.compare_exchange_weak(
                cur,
                cur.saturating_add(estimate),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Releases a hold taken by [`reserve`](Self::reserve).
    pub(crate) fn release(&self, held: u64) {
        if held > 0 {
            self.reserved.fetch_sub(held, Ordering::AcqRel);
        }
    }

    /// Counts `tokens` spent (saturating).
    pub(crate) fn charge(&self, tokens: u64) {
        let _ = self
            .spent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                Some(s.saturating_add(tokens))
            });
    }

    /// What a call holding `held` of the reservations may still spend:
    /// the limit less what is spent and what other calls hold.
    pub(crate) fn room(&self, held: u64) -> u64 {
        let others = self.reserved.load(Ordering::Acquire).saturating_sub(held);
        self.limit
            .saturating_sub(self.spent().saturating_add(others))
    }

    /// Whether more than the limit is spent.
    pub(crate) fn passed(&self) -> bool {
        self.spent() > self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_stops_at_the_limit_and_room_counts_other_holds() {
        let a = Allowance::new("run x", 100, 40);
        assert!(a.reserve(50));
        assert_eq!(a.room(50), 60);
        assert_eq!(a.room(0), 10);
        assert!(a.reserve(50));
        // 40 spent + 100 held: no more.
        assert!(!a.reserve(1));
        a.release(50);
        a.charge(70);
        a.release(50);
        assert_eq!(a.spent(), 110);
        assert!(a.passed());
        assert_eq!(a.room(0), 0);
        a.charge(u64::MAX);
        assert_eq!(a.spent(), u64::MAX);
    }
}
