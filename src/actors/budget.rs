//! The budget actor: per-caller accounts over the [`BudgetLedger`] port.
//!
//! The only round trip is the first admission of a caller, which loads its
//! limits and its spend over the window from the ledger into an [`Account`].
//! After that, runs charge the account's atomic counters themselves (so a
//! run that crosses its limit sees it before its very next model call) and
//! cast `Meter` / `Commit` here; the actor batches that spend into the ledger
//! every `flush_every`, and `Drain` writes what is pending before it answers.
//! Accounts are reloaded from the ledger when older than `refresh_every`, so
//! a sliding window moves and limits changed in the ledger take effect.
//!
//! Rate: at most one `Meter` per run handler (a model call that answered
//! after a wait) and one `Commit` per run; both are
//! O(1) map updates. What is lost on a crash: spend not yet flushed (at most
//! `flush_every` of it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;

use crate::ports::budget::{BudgetLedger, BudgetLimits, Spend};

/// A caller's live account.
#[derive(Debug)]
pub struct Account {
    caller: Arc<str>,
    limits: BudgetLimits,
    tokens: AtomicU64,
    in_flight: AtomicU32,
    loaded: Instant,
}

impl Account {
    /// The caller.
    #[allow(dead_code)]
    pub fn caller(&self) -> &str {
        &self.caller
    }

    /// The caller's limits.
    #[allow(dead_code)]
    pub fn limits(&self) -> BudgetLimits {
        self.limits
    }

    /// Tokens spent in the window so far.
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// Runs of this caller in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn over_tokens(&self) -> bool {
        self.limits.tokens.is_some_and(|l| self.tokens() >= l)
    }

    /// Admits one more run, or says why not.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<Ticket, Denied> {
        if self.over_tokens() {
            return Err(Denied::Tokens);
        }
        let cap = self.limits.concurrent_runs.unwrap_or(u32::MAX);
        let mut cur = self.in_flight.load(Ordering::Relaxed);
        loop {
            if cur >= cap {
                return Err(Denied::Concurrency);
            }
            match self.in_flight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Ok(Ticket {
                        account: self.clone(),
                    })
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// Why admission said no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The caller's token budget is spent.
    Tokens,
    /// The caller has as many runs in flight as it may.
    Concurrency,
}

/// One admitted run's hold on its caller's account; dropping it releases
/// the concurrency slot (so a panicked run releases it too).
#[derive(Debug)]
pub struct Ticket {
    account: Arc<Account>,
}

impl Ticket {
    /// Charges tokens to the caller.
    pub fn charge(&self, tokens: u64) {
        self.account.tokens.fetch_add(tokens, Ordering::Relaxed);
    }

    /// Whether the caller's token budget is spent.
    pub fn exhausted(&self) -> bool {
        self.account.over_tokens()
    }

    /// The caller.
    #[allow(dead_code)]
    pub fn caller(&self) -> &str {
        &self.account.caller
    }

    /// The caller, shared.
    pub fn caller_arc(&self) -> Arc<str> {
        self.account.caller.clone()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.account.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Messages to the budget actor.
pub enum BudgetMsg {
    /// Which account does this caller have? (loads it on first sight)
    GetAccount {
        /// The caller.
        caller: Arc<str>,
        /// The answer: the account, or the ledger's error text.
        reply: RpcReplyPort<Result<Arc<Account>, String>>,
    },
    /// Tokens a run used in one model call.
    Meter {
        /// The caller.
        caller: Arc<str>,
        /// Input + output tokens.
        tokens: u64,
    },
    /// A run ended.
    Commit {
        /// The caller.
        caller: Arc<str>,
        /// Tokens not metered yet (a run meters at most once per handler
        /// and leaves its last model call's tokens to the commit).
        tokens: u64,
        /// Its run time.
        runtime_ms: u64,
    },
    /// Write pending spend to the ledger (timer).
    Flush,
    /// Write pending spend and answer (shutdown).
    Drain(RpcReplyPort<()>),
}

/// The budget actor.
pub struct Budget {
    pub(crate) ledger: Arc<dyn BudgetLedger>,
    pub(crate) window: Duration,
    pub(crate) flush_every: Duration,
    pub(crate) refresh_every: Duration,
}

/// Its state.
pub struct BudgetState {
    accounts: HashMap<Arc<str>, Arc<Account>>,
    pending: HashMap<Arc<str>, Spend>,
    flush_armed: bool,
}

impl Actor for Budget {
    type Msg = BudgetMsg;
    type State = BudgetState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<BudgetMsg>,
        _: (),
    ) -> Result<BudgetState, ActorProcessingErr> {
        Ok(BudgetState {
            accounts: HashMap::new(),
            pending: HashMap::new(),
            flush_armed: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<BudgetMsg>,
        msg: BudgetMsg,
        st: &mut BudgetState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BudgetMsg::GetAccount { caller, reply } => {
                let fresh = st
                    .accounts
                    .get(&caller)
                    .filter(|a| a.loaded.elapsed() < self.refresh_every)
                    .cloned();
                let answer = match fresh {
                    Some(a) => Ok(a),
                    None => self.load(st, caller).await,
                };
                let _ = reply.send(answer);
            }
            BudgetMsg::Meter { caller, tokens } => {
                st.pending.entry(caller).or_default().tokens += tokens;
                self.arm(&myself, st);
            }
            BudgetMsg::Commit {
                caller,
                tokens,
                runtime_ms,
            } => {
                let s = st.pending.entry(caller).or_default();
                s.tokens += tokens;
                s.runtime_ms += runtime_ms;
                s.runs += 1;
                self.arm(&myself, st);
            }
            BudgetMsg::Flush => {
                st.flush_armed = false;
                self.flush(st).await;
            }
            BudgetMsg::Drain(reply) => {
                self.flush(st).await;
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

impl Budget {
    async fn load(&self, st: &mut BudgetState, caller: Arc<str>) -> Result<Arc<Account>, String> {
        let limits = self
            .ledger
            .limits(&caller)
            .await
            .map_err(|e| e.to_string())?;
        let spent = self
            .ledger
            .spent(&caller, self.window)
            .await
            .map_err(|e| e.to_string())?;
        let unflushed = st.pending.get(&caller).map(|s| s.tokens).unwrap_or(0);
        let in_flight = st.accounts.get(&caller).map(|a| a.in_flight()).unwrap_or(0);
        let account = Arc::new(Account {
            caller: caller.clone(),
            limits,
            tokens: AtomicU64::new(spent.tokens + unflushed),
            in_flight: AtomicU32::new(in_flight),
            loaded: Instant::now(),
        });
        st.accounts.insert(caller, account.clone());
        Ok(account)
    }

    fn arm(&self, myself: &ActorRef<BudgetMsg>, st: &mut BudgetState) {
        if !st.flush_armed {
            st.flush_armed = true;
            myself.send_after(self.flush_every, || BudgetMsg::Flush);
        }
    }

    async fn flush(&self, st: &mut BudgetState) {
        if st.pending.is_empty() {
            return;
        }
        let batch: Vec<(String, Spend)> = st
            .pending
            .drain()
            .map(|(c, s)| (c.to_string(), s))
            .collect();
        if let Err(e) = self.ledger.commit(&batch).await {
            tracing::warn!(error = %e, "budget ledger commit failed; keeping the spend for the next flush");
            for (c, s) in batch {
                st.pending.entry(Arc::from(c)).or_default().add(&s);
            }
        }
    }
}
