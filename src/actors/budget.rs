//! The budget actor: per-caller accounts over the [`BudgetLedger`] port.
//!
//! The only round trip is the first admission of a caller, which loads its
//! limits and its spend over the window from the ledger into an [`Account`].
//! After that, runs charge the account's atomic counters themselves (so a
//! run that crosses a limit sees it before its very next model call) and
//! cast `Meter` / `Commit` here; the actor batches that spend into the ledger
//! every `flush_every`, and `Drain` writes what is pending before it answers.
//!
//! # Accounts refresh in place
//! Every `refresh_every` the actor reloads each account's limits and its
//! spend over the window from the ledger, into the same account: tickets
//! of runs in flight keep pointing at it, so a reload never loses or leaks
//! a concurrency slot or a reservation. The window moves with it: a caller
//! refused at its limit is admitted again once its spend has left the
//! window. An account's spend is `base + charged`: `charged` is what this
//! host's runs charged (monotonic), `base` the ledger's spend over the
//! window at the last refresh minus what this actor had flushed to it by
//! then (wrapping arithmetic), so spend charged but not yet written is
//! counted once, whether it is still in a run, in the mailbox or pending.
//!
//! # Reservations: what a limit guarantees under concurrency
//! A caller with a token limit reserves, before every model call, an
//! estimate of the call's tokens (the first call's at admission:
//! `HostConfig::budget_reserve_tokens`; later calls: the run's previous
//! call's), and a call starts only while spent + reserved is under the
//! limit. The reservation is settled when the call's usage is known. So
//! the caller's runs together pass the limit by less than one reservation,
//! plus what calls in flight used beyond their estimates: with estimates
//! that hold, by less than one model reply in all. Cost and run-time limits
//! are checked before every call (no reservation): they are passed by at
//! most the calls in flight when they were reached, one reply per run.
//!
//! Rate: at most one `Meter` per run handler (a model call that answered
//! after a wait) and one `Commit` per run; both are O(1) map updates. What
//! is lost on a crash: spend not yet flushed (at most `flush_every` of it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;

use crate::ports::budget::{BudgetLedger, BudgetLimits, Spend};
use crate::record::Allowance;

/// "No limit" in an account's atomic limit fields.
const UNLIMITED: u64 = u64::MAX;

/// A caller's live account, shared by the host (admission), the runs that
/// hold its tickets and the budget actor (refresh).
#[derive(Debug)]
pub struct Account {
    caller: Arc<str>,
    limit_tokens: AtomicU64,
    limit_cost: AtomicU64,
    limit_runtime_ms: AtomicU64,
    limit_concurrent: AtomicU32,
    /// Spent on this host since the account was made: tokens, cost, ms.
    charged: [AtomicU64; 3],
    /// The ledger's spend at the last refresh minus what had been flushed
    /// (wrapping).
    base: [AtomicU64; 3],
    /// Tokens reserved by calls about to start or in flight.
    reserved: AtomicU64,
    in_flight: AtomicU32,
}

const TOKENS: usize = 0;
const COST: usize = 1;
const RUNTIME: usize = 2;

impl Account {
    fn new(caller: Arc<str>) -> Account {
        Account {
            caller,
            limit_tokens: AtomicU64::new(UNLIMITED),
            limit_cost: AtomicU64::new(UNLIMITED),
            limit_runtime_ms: AtomicU64::new(UNLIMITED),
            limit_concurrent: AtomicU32::new(u32::MAX),
            charged: Default::default(),
            base: Default::default(),
            reserved: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
        }
    }

    /// Sets limits and spend from the ledger (`flushed`: what this actor
    /// has written to the ledger for this caller so far).
    fn refresh(&self, limits: BudgetLimits, spent: &Spend, flushed: &Spend) {
        self.limit_tokens
            .store(limits.tokens.unwrap_or(UNLIMITED), Ordering::Relaxed);
        self.limit_cost
            .store(limits.cost_micros.unwrap_or(UNLIMITED), Ordering::Relaxed);
        self.limit_runtime_ms.store(
            limits
                .runtime_secs
                .map_or(UNLIMITED, |s| s.saturating_mul(1000)),
            Ordering::Relaxed,
        );
        self.limit_concurrent.store(
            limits.concurrent_runs.unwrap_or(u32::MAX),
            Ordering::Relaxed,
        );
        let pairs = [
            (spent.tokens, flushed.tokens),
            (spent.cost_micros, flushed.cost_micros),
            (spent.runtime_ms, flushed.runtime_ms),
        ];
        for (i, (s, f)) in pairs.into_iter().enumerate() {
            self.base[i].store(s.wrapping_sub(f), Ordering::Relaxed);
        }
    }

    /// The caller.
    #[allow(dead_code)]
    pub fn caller(&self) -> &str {
        &self.caller
    }

    fn used(&self, i: usize) -> u64 {
        self.base[i]
            .load(Ordering::Relaxed)
            .wrapping_add(self.charged[i].load(Ordering::Relaxed))
    }

    /// The first limit other than tokens that is spent, if any.
    fn over_other(&self) -> Option<Denied> {
        let cost = self.limit_cost.load(Ordering::Relaxed);
        if cost != UNLIMITED && self.used(COST) >= cost {
            return Some(Denied::Cost);
        }
        let runtime = self.limit_runtime_ms.load(Ordering::Relaxed);
        if runtime != UNLIMITED && self.used(RUNTIME) >= runtime {
            return Some(Denied::Runtime);
        }
        None
    }

    /// Reserves `estimate` tokens if spent + reserved is under the token
    /// limit (or there is none): the amount reserved, or `Denied::Tokens`.
    fn reserve(&self, estimate: u64) -> Result<u64, Denied> {
        let limit = self.limit_tokens.load(Ordering::Relaxed);
        if limit == UNLIMITED {
            return Ok(0);
        }
        // `reserved` is read before `used`, each time round: a call that
        // settles adds its tokens to `charged` before it releases its
        // reservation (see `Ticket::charge`), so a reservation seen released
        // is always seen charged — the two together never under-count, even
        // while other runs of the tree settle and reserve on other threads.
        let mut cur = self.reserved.load(Ordering::Acquire);
        loop {
            let used = self.used(TOKENS);
            if used.saturating_add(cur) >= limit {
                return Err(Denied::Tokens);
            }
            match self.reserved.compare_exchange_weak(
                cur,
                cur.saturating_add(estimate),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(estimate),
                Err(now) => cur = now,
            }
        }
    }

    fn release(&self, held: u64) {
        if held > 0 {
            self.reserved.fetch_sub(held, Ordering::AcqRel);
        }
    }

    /// Admits one more run, reserving `estimate` tokens for its first call,
    /// or says why not.
    pub(crate) fn admit(self: &Arc<Self>, estimate: u64) -> Result<Ticket, Denied> {
        if let Some(d) = self.over_other() {
            return Err(d);
        }
        let held = self.reserve(estimate)?;
        let cap = self.limit_concurrent.load(Ordering::Relaxed);
        let mut cur = self.in_flight.load(Ordering::Relaxed);
        loop {
            if cur >= cap {
                self.release(held);
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
                        held,
                        others: Box::default(),
                        estimate,
                        unmetered: Spend::default(),
                        runtime_charged_ms: 0,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// Why admission (or a run's next call) said no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The caller's token budget is spent (or reserved by calls in flight).
    Tokens,
    /// The caller's cost budget is spent.
    Cost,
    /// The caller's run-time budget is spent.
    Runtime,
    /// The caller has as many runs in flight as it may.
    Concurrency,
}

impl Denied {
    /// Which budget, in words.
    pub fn what(self) -> &'static str {
        match self {
            Denied::Tokens => "token",
            Denied::Cost => "cost",
            Denied::Runtime => "run-time",
            Denied::Concurrency => "concurrency",
        }
    }
}

/// A budget a run may not spend past: which limit, and whose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spent {
    /// Which limit.
    pub denied: Denied,
    /// Whose budget, in words (`caller `alice``, `run 01ab…`, `this
    /// command`).
    pub who: String,
}

impl Spent {
    /// The budget's owner and limit, in words: "the token budget of
    /// caller `a` is spent".
    pub fn message(&self) -> String {
        format!("the {} budget of {} is spent", self.denied.what(), self.who)
    }
}

/// One allowance's hold: what the run's call reserved of it.
#[derive(Debug)]
struct Hold {
    allowance: Arc<Allowance>,
    held: u64,
}

/// One admitted run's hold on its caller's account and on the allowances
/// above it (the host's, its ancestors', its own: see
/// `record::Allowance`): its concurrency slot, its reservations, and the
/// spend it has charged but not yet sent to the budget actor. All apply
/// together; the tightest wins. Dropping it releases the slot and the
/// reservations (so a panicked run releases them too).
#[derive(Debug)]
pub struct Ticket {
    account: Arc<Account>,
    /// Tokens reserved for the call about to start or in flight.
    held: u64,
    /// The allowances besides the caller's account (none for most runs:
    /// an empty list allocates nothing).
    others: Box<[Hold]>,
    /// The next call's estimate.
    estimate: u64,
    unmetered: Spend,
    runtime_charged_ms: u64,
}

impl Ticket {
    /// Adds the allowances a run spends against besides its caller's
    /// account, reserving the first call's estimate of each; `Err` names
    /// the first that is spent (the run may not start).
    pub(crate) fn with_allowances(
        mut self,
        allowances: &[Arc<Allowance>],
    ) -> Result<Ticket, Spent> {
        let mut holds = Vec::with_capacity(allowances.len());
        for a in allowances {
            if !a.reserve(self.estimate) {
                // Release the holds taken so far.
                for h in &holds {
                    let h: &Hold = h;
                    h.allowance.release(h.held);
                }
                return Err(Spent {
                    denied: Denied::Tokens,
                    who: a.label().to_string(),
                });
            }
            holds.push(Hold {
                allowance: a.clone(),
                held: self.estimate,
            });
        }
        self.others = holds.into_boxed_slice();
        Ok(self)
    }

    /// Before a model call: charges the run time so far if the caller has
    /// a run-time limit, checks the cost and run-time limits, and reserves
    /// the call's tokens of the caller's account and of every allowance
    /// (the first call's were reserved at admission). `Some` says which
    /// budget is spent: the call must not start.
    pub fn begin_call(&mut self, started: Instant) -> Option<Spent> {
        let a = &self.account;
        if a.limit_runtime_ms.load(Ordering::Relaxed) != UNLIMITED {
            self.charge_runtime(started.elapsed());
        }
        let caller = |denied| Spent {
            denied,
            who: format!("caller `{}`", self.account.caller),
        };
        if let Some(d) = self.account.over_other() {
            return Some(caller(d));
        }
        if self.held == 0 {
            match self.account.reserve(self.estimate) {
                Ok(held) => self.held = held,
                Err(d) => return Some(caller(d)),
            }
        }
        for h in self.others.iter_mut() {
            if h.held == 0 {
                if !h.allowance.reserve(self.estimate) {
                    return Some(Spent {
                        denied: Denied::Tokens,
                        who: h.allowance.label().to_string(),
                    });
                }
                h.held = self.estimate;
            }
        }
        None
    }

    /// The most tokens the next call may spend before a budget is passed
    /// (every token limit's rest, less what other calls hold of it); `None`
    /// when no token limit applies. A model call asks for no longer a
    /// reply than this.
    pub fn room(&self) -> Option<u64> {
        let a = &self.account;
        let limit = a.limit_tokens.load(Ordering::Relaxed);
        let mut room = (limit != UNLIMITED).then(|| {
            let others = a.reserved.load(Ordering::Acquire).saturating_sub(self.held);
            limit.saturating_sub(a.used(TOKENS).saturating_add(others))
        });
        for h in &self.others {
            let r = h.allowance.room(h.held);
            room = Some(room.map_or(r, |x| x.min(r)));
        }
        room
    }

    /// The first token budget more than spent, if any (checked after a
    /// call's usage is charged: a reply that passed its budget).
    pub fn passed(&self) -> Option<Spent> {
        let a = &self.account;
        let limit = a.limit_tokens.load(Ordering::Relaxed);
        if limit != UNLIMITED && a.used(TOKENS) > limit {
            return Some(Spent {
                denied: Denied::Tokens,
                who: format!("caller `{}`", a.caller),
            });
        }
        self.others
            .iter()
            .find(|h| h.allowance.passed())
            .map(|h| Spent {
                denied: Denied::Tokens,
                who: h.allowance.label().to_string(),
            })
    }

    /// Charges a model call's tokens and cost to the caller and to every
    /// allowance and settles the call's reservations; the call's tokens are
    /// the next call's estimate.
    pub fn charge(&mut self, tokens: u64, cost_micros: u64) {
        self.spend(tokens, cost_micros);
        // Charged first, released after (with `Release` ordering): whoever
        // sees the reservation gone sees the tokens spent (`reserve`).
        self.account.release(std::mem::take(&mut self.held));
        for h in self.others.iter_mut() {
            h.allowance.release(std::mem::take(&mut h.held));
        }
        self.estimate = tokens;
    }

    /// Charges tokens and cost spent beside the run's own calls (a critic
    /// judge's question about the run) to the caller and to every
    /// allowance, as [`charge`](Self::charge) does, leaving the run's
    /// reservations and its next call's estimate as they are (its own call
    /// may be in flight). No check: the run's next call checks, as after
    /// any charge.
    pub fn charge_beside(&mut self, tokens: u64, cost_micros: u64) {
        self.spend(tokens, cost_micros);
    }

    /// The charging both paths share: the caller's counters, every
    /// allowance and what the budget actor is told next.
    fn spend(&mut self, tokens: u64, cost_micros: u64) {
        let a = &self.account;
        add_saturating(&a.charged[TOKENS], tokens);
        if cost_micros > 0 {
            add_saturating(&a.charged[COST], cost_micros);
        }
        for h in self.others.iter() {
            h.allowance.charge(tokens);
        }
        self.unmetered.tokens = self.unmetered.tokens.saturating_add(tokens);
        self.unmetered.cost_micros = self.unmetered.cost_micros.saturating_add(cost_micros);
    }

    /// Charges the run time up to `elapsed` (what was not charged yet).
    pub fn charge_runtime(&mut self, elapsed: Duration) {
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let new = ms.saturating_sub(self.runtime_charged_ms);
        if new > 0 {
            self.runtime_charged_ms = ms;
            add_saturating(&self.account.charged[RUNTIME], new);
            self.unmetered.runtime_ms = self.unmetered.runtime_ms.saturating_add(new);
        }
    }

    /// The spend charged since the last call, for the budget actor.
    pub fn take_unmetered(&mut self) -> Spend {
        std::mem::take(&mut self.unmetered)
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

/// Adds to a counter, stopping at `u64::MAX` instead of wrapping.
fn add_saturating(counter: &AtomicU64, n: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
        Some(c.saturating_add(n))
    });
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.account.release(self.held);
        for h in &self.others {
            h.allowance.release(h.held);
        }
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
    /// Spend a run charged since its last meter (one model call's tokens
    /// and cost, run time when the caller has a run-time limit).
    Meter {
        /// The caller.
        caller: Arc<str>,
        /// The spend (`runs` is 0).
        spend: Spend,
    },
    /// A run ended: the rest of its spend, `runs` = 1.
    Commit {
        /// The caller.
        caller: Arc<str>,
        /// The spend not metered yet, its run time included.
        spend: Spend,
    },
    /// Write pending spend to the ledger (timer).
    Flush,
    /// Reload every account's limits and spend from the ledger (timer).
    Refresh,
    /// Reload every account now and answer (`Host::reload_budgets`).
    RefreshNow(RpcReplyPort<()>),
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
    /// What was written to the ledger per caller, since its account was made.
    flushed: HashMap<Arc<str>, Spend>,
    flush_armed: bool,
    refresh_armed: bool,
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
            flushed: HashMap::new(),
            flush_armed: false,
            refresh_armed: false,
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
                let answer = match st.accounts.get(&caller) {
                    Some(a) => Ok(a.clone()),
                    None => self.open(st, caller).await,
                };
                if answer.is_ok() && !st.refresh_armed {
                    st.refresh_armed = true;
                    myself.send_after(self.refresh_every, || BudgetMsg::Refresh);
                }
                let _ = reply.send(answer);
            }
            BudgetMsg::Meter { caller, spend } | BudgetMsg::Commit { caller, spend } => {
                st.pending.entry(caller).or_default().add(&spend);
                self.arm(&myself, st);
            }
            BudgetMsg::Flush => {
                st.flush_armed = false;
                self.flush(st).await;
            }
            BudgetMsg::Refresh => {
                self.refresh_all(st).await;
                myself.send_after(self.refresh_every, || BudgetMsg::Refresh);
            }
            BudgetMsg::RefreshNow(reply) => {
                self.refresh_all(st).await;
                let _ = reply.send(());
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
    /// Makes a caller's account from the ledger.
    async fn open(&self, st: &mut BudgetState, caller: Arc<str>) -> Result<Arc<Account>, String> {
        let account = Arc::new(Account::new(caller.clone()));
        self.load(st, &account).await?;
        st.accounts.insert(caller, account.clone());
        Ok(account)
    }

    /// Loads an account's limits and windowed spend from the ledger into it.
    async fn load(&self, st: &BudgetState, account: &Account) -> Result<(), String> {
        let caller = account.caller();
        let limits = self
            .ledger
            .limits(caller)
            .await
            .map_err(|e| e.to_string())?;
        let window = limits.window_secs.map_or(self.window, Duration::from_secs);
        let spent = self
            .ledger
            .spent(caller, window)
            .await
            .map_err(|e| e.to_string())?;
        let flushed = st.flushed.get(caller).copied().unwrap_or_default();
        account.refresh(limits, &spent, &flushed);
        Ok(())
    }

    /// Reloads every account in place; one whose ledger read fails keeps
    /// what it had.
    async fn refresh_all(&self, st: &mut BudgetState) {
        let accounts: Vec<Arc<Account>> = st.accounts.values().cloned().collect();
        for a in accounts {
            if let Err(e) = self.load(st, &a).await {
                tracing::warn!(caller = %a.caller(), error = %e, "budget refresh failed; keeping the account as it was");
            }
        }
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
        let batch: Vec<(Arc<str>, Spend)> = st.pending.drain().collect();
        let rows: Vec<(String, Spend)> = batch.iter().map(|(c, s)| (c.to_string(), *s)).collect();
        match self.ledger.commit(&rows).await {
            Ok(()) => {
                for (c, s) in batch {
                    st.flushed.entry(c).or_default().add(&s);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "budget ledger commit failed; keeping the spend for the next flush");
                for (c, s) in batch {
                    st.pending.entry(c).or_default().add(&s);
                }
            }
        }
    }
}
