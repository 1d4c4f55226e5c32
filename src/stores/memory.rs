//! In-memory batteries for the audit store and the budget ledger: what a host
//! built with nothing uses. They live as long as the process.
//!
//! The audit store is bounded: it keeps the most recent `capacity` records
//! (default [`DEFAULT_CAPACITY`], 32 768) and counts every record ever
//! written, so a soak of millions of runs keeps flat memory while its
//! verdict ("every run has one terminal record") still holds. Use the
//! SQLite store for full history.
//!
//! Batches are kept as they come (moved in: an append costs no copy of its
//! records; a batch that is mostly spare room is first shrunk to its
//! records) and dropped whole once all their records are older than the
//! window; records of the oldest batch that fell out of it are no longer
//! read, and are freed with their batch. So the store holds at most one
//! batch more than `capacity` records.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::memory_outbox::MemoryOutbox;
use crate::ports::audit::{
    AuditEntry, AuditRecord, AuditStats, AuditStore, AuditStoreError, RunFilter, RunIndex,
    RunSummary,
};
use crate::ports::budget::{BudgetLedger, BudgetLedgerError, BudgetLimits, Spend};
use crate::ports::outbox::OutboxStore;
use crate::ports::run::{unix_ms, RunId, RunResult};

/// Records an in-memory audit store keeps by default: the last few
/// thousand runs, for reading back what just ran. Every record held keeps
/// a run's strings alive, so a swarm of millions pays for the ring in
/// memory and in cache misses; 32 768 keeps it small next to the runs in
/// flight.
pub const DEFAULT_CAPACITY: usize = 32_768;

/// Keeps the most recent audit records in memory.
pub struct MemoryAuditStore {
    inner: Mutex<AuditInner>,
    capacity: usize,
    /// Where the intents of [`AuditEntry::Publish`] records go.
    outbox: Arc<MemoryOutbox>,
}

#[derive(Default)]
struct AuditInner {
    /// Batches, oldest first.
    batches: VecDeque<Vec<AuditRecord>>,
    /// Records of the oldest batch that fell out of the window.
    front_skip: usize,
    /// Records in the window.
    held: usize,
    stats: AuditStats,
}

impl AuditInner {
    /// The records in the window, oldest first.
    fn records(&self) -> impl Iterator<Item = &AuditRecord> {
        let skip = self.front_skip;
        self.batches
            .iter()
            .enumerate()
            .flat_map(move |(i, b)| b[if i == 0 { skip } else { 0 }..].iter())
    }
}

impl MemoryAuditStore {
    /// Keeps up to [`DEFAULT_CAPACITY`] records.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// Keeps up to `capacity` records (older ones are dropped; counts stay).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        MemoryAuditStore {
            inner: Mutex::new(AuditInner::default()),
            capacity,
            outbox: Arc::new(MemoryOutbox::new()),
        }
    }

    /// Every record still held, oldest first.
    pub fn records(&self) -> Vec<AuditRecord> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.records().cloned().collect()
    }
}

impl Default for MemoryAuditStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryAuditStore {
    /// Keeps `batch`, letting the oldest records past the capacity go.
    /// The batches dropped are freed after the lock is released.
    fn keep(&self, mut batch: Vec<AuditRecord>) {
        let n = batch.len();
        // A batch cut by age under light load is mostly spare room (the
        // audit actor reserves a full batch): kept, it would hold that
        // room for as long as its records are in the window.
        if batch.capacity() > 2 * n {
            batch.shrink_to_fit();
        }
        let terminal = batch.iter().filter(|r| r.is_terminal()).count() as u64;
        // The intents a batch brings go to the outbox within the append,
        // before the batch is visible: whoever sees the terminal record
        // finds them there. They are not records of the log (not counted).
        let mut intents = 0;
        for r in &batch {
            if let AuditEntry::Publish(list) = &r.entry {
                self.outbox.insert(list);
                intents += 1;
            }
        }
        let mut evicted = Vec::new();
        {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.stats.records += (n - intents) as u64;
            g.stats.terminal_records += terminal;
            g.stats.batches += 1;
            if n > 0 {
                g.batches.push_back(batch);
                g.held += n;
            }
            while g.held > self.capacity {
                let excess = g.held - self.capacity;
                let front_left = g.batches.front().map_or(0, Vec::len) - g.front_skip;
                if excess >= front_left {
                    evicted.extend(g.batches.pop_front());
                    g.held -= front_left;
                    g.front_skip = 0;
                } else {
                    g.front_skip += excess;
                    g.held -= excess;
                }
            }
        }
        drop(evicted);
    }
}

#[async_trait]
impl AuditStore for MemoryAuditStore {
    fn joins_batches(&self) -> bool {
        false
    }

    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError> {
        self.keep(batch.to_vec());
        Ok(())
    }

    async fn append_owned(
        &self,
        batch: Vec<AuditRecord>,
    ) -> Result<(), (AuditStoreError, Vec<AuditRecord>)> {
        self.keep(batch);
        Ok(())
    }

    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<AuditRecord> = g
            .records()
            .filter(|r| r.run_id == run_id && !matches!(r.entry, AuditEntry::Publish(_)))
            .cloned()
            .collect();
        v.sort_by_key(|r| r.seq);
        // A record appended again (a replayed spool) is one record.
        v.dedup_by_key(|r| r.seq);
        Ok(v)
    }

    async fn stats(&self) -> Result<AuditStats, AuditStoreError> {
        Ok(self.inner.lock().unwrap_or_else(|p| p.into_inner()).stats)
    }

    fn outbox(self: Arc<Self>) -> Option<Arc<dyn OutboxStore>> {
        Some(self.outbox.clone())
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunId>, AuditStoreError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut started = std::collections::BTreeSet::new();
        let mut ended = std::collections::HashSet::new();
        for r in g.records() {
            match r.entry {
                AuditEntry::RunStarted(_) => {
                    started.insert(r.run_id);
                }
                AuditEntry::Terminal(_) => {
                    ended.insert(r.run_id);
                }
                AuditEntry::Event(_) | AuditEntry::Publish(_) => {}
            }
        }
        Ok(started.into_iter().filter(|r| !ended.contains(r)).collect())
    }
}

/// Lists the terminal records still held (a bounded window of history).
#[async_trait]
impl RunIndex for MemoryAuditStore {
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, AuditStoreError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut runs: Vec<RunSummary> = g
            .records()
            .filter_map(|r| match &r.entry {
                AuditEntry::Terminal(res) => Some(RunSummary::of(res)),
                _ => None,
            })
            .filter(|s| s.matches(filter))
            .collect();
        runs.sort_by_key(|s| std::cmp::Reverse((s.finished_at, s.run_id)));
        runs.dedup_by_key(|s| s.run_id);
        if let Some(limit) = filter.limit {
            runs.truncate(limit as usize);
        }
        Ok(runs)
    }

    async fn run_result(&self, run_id: RunId) -> Result<Option<RunResult>, AuditStoreError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let found = g.records().find_map(|r| match &r.entry {
            AuditEntry::Terminal(res) if r.run_id == run_id => Some(RunResult::clone(res)),
            _ => None,
        });
        Ok(found)
    }
}

/// Per-caller limits and spend, in memory, bucketed by minute (buckets older
/// than 24 h are dropped).
///
/// Its clock is the runtime's (`tokio::time::Instant`) from the wall-clock
/// time it was made: the same as the wall clock in a running process, and
/// paused with the runtime in tests, so a test on paused time sees a
/// budget window move when it advances time.
pub struct MemoryBudgetLedger {
    inner: Mutex<LedgerInner>,
    epoch_ms: u64,
    epoch: tokio::time::Instant,
}

#[derive(Default)]
struct LedgerInner {
    default_limits: BudgetLimits,
    limits: HashMap<String, BudgetLimits>,
    spend: HashMap<String, BTreeMap<u64, Spend>>,
}

const MINUTE_MS: u64 = 60_000;
const KEEP_MS: u64 = 24 * 3600 * 1000;

impl MemoryBudgetLedger {
    /// A ledger with no limits.
    pub fn new() -> Self {
        MemoryBudgetLedger {
            inner: Mutex::new(LedgerInner::default()),
            epoch_ms: unix_ms(),
            epoch: tokio::time::Instant::now(),
        }
    }

    /// Limits for callers that have none of their own.
    pub fn with_default_limits(limits: BudgetLimits) -> Self {
        let l = Self::new();
        l.set_default_limits(limits);
        l
    }

    /// Sets the limits for callers that have none of their own.
    pub fn set_default_limits(&self, limits: BudgetLimits) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .default_limits = limits;
    }

    /// Now, in ms since the Unix epoch, on the ledger's clock.
    fn now_ms(&self) -> u64 {
        let since = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_ms.saturating_add(since)
    }

    /// Sets one caller's limits.
    pub fn set_limits(&self, caller: &str, limits: BudgetLimits) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .limits
            .insert(caller.to_string(), limits);
    }
}

impl Default for MemoryBudgetLedger {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl BudgetLedger for MemoryBudgetLedger {
    async fn limits(&self, caller: &str) -> Result<BudgetLimits, BudgetLedgerError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Ok(g.limits.get(caller).copied().unwrap_or(g.default_limits))
    }

    async fn spent(&self, caller: &str, window: Duration) -> Result<Spend, BudgetLedgerError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let window = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        let since = self.now_ms().saturating_sub(window) / MINUTE_MS;
        let mut total = Spend::default();
        if let Some(buckets) = g.spend.get(caller) {
            for (_, s) in buckets.range(since..) {
                total.add(s);
            }
        }
        Ok(total)
    }

    async fn commit(&self, spends: &[(String, Spend)]) -> Result<(), BudgetLedgerError> {
        let now = self.now_ms();
        let minute = now / MINUTE_MS;
        let oldest = now.saturating_sub(KEEP_MS) / MINUTE_MS;
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (caller, s) in spends {
            let buckets = g.spend.entry(caller.clone()).or_default();
            buckets.entry(minute).or_default().add(s);
            while let Some((&k, _)) = buckets.first_key_value() {
                if k >= oldest {
                    break;
                }
                buckets.remove(&k);
            }
        }
        Ok(())
    }

    async fn set_limits(
        &self,
        caller: &str,
        limits: BudgetLimits,
    ) -> Result<(), BudgetLedgerError> {
        MemoryBudgetLedger::set_limits(self, caller, limits);
        Ok(())
    }

    async fn list_limits(&self) -> Result<Vec<(String, BudgetLimits)>, BudgetLedgerError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(String, BudgetLimits)> =
            g.limits.iter().map(|(c, l)| (c.clone(), *l)).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::event::RunEvent;

    fn rec(run: RunId, seq: u32) -> AuditRecord {
        AuditRecord {
            run_id: run,
            seq,
            at_ms: 0,
            entry: AuditEntry::Event(RunEvent::StepStart { iteration: seq }),
        }
    }

    #[tokio::test]
    async fn audit_store_is_bounded_but_counts_everything() {
        let s = MemoryAuditStore::with_capacity(3);
        let run = RunId::new();
        let batch: Vec<_> = (0..5).map(|i| rec(run, i)).collect();
        assert!(s.append(&batch).await.is_ok());
        let kept = s.run_records(run).await.unwrap_or_default();
        assert_eq!(
            kept.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        let st = s.stats().await.unwrap_or_default();
        assert_eq!((st.records, st.batches, st.terminal_records), (5, 1, 0));
    }

    #[tokio::test]
    async fn the_window_slides_over_batches_and_drops_the_ones_it_left() {
        let s = MemoryAuditStore::with_capacity(3);
        let run = RunId::new();
        let seqs = |s: &MemoryAuditStore| s.records().iter().map(|r| r.seq).collect::<Vec<_>>();
        assert!(s
            .append_owned((0..4).map(|i| rec(run, i)).collect())
            .await
            .is_ok());
        assert_eq!(seqs(&s), vec![1, 2, 3]);
        assert!(s.append_owned(vec![rec(run, 4)]).await.is_ok());
        assert_eq!(seqs(&s), vec![2, 3, 4]);
        assert!(s
            .append_owned((5..7).map(|i| rec(run, i)).collect())
            .await
            .is_ok());
        assert_eq!(seqs(&s), vec![4, 5, 6]);
        // Only the window is read back; what fell out of it is gone.
        let kept = s.run_records(run).await.unwrap_or_default();
        assert_eq!(
            kept.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![4, 5, 6]
        );
        {
            let g = s.inner.lock().unwrap_or_else(|p| p.into_inner());
            assert_eq!(
                g.batches.len(),
                2,
                "the batches wholly out of the window are dropped"
            );
            assert_eq!((g.held, g.front_skip), (3, 0));
        }
        let st = s.stats().await.unwrap_or_default();
        assert_eq!((st.records, st.batches), (7, 3));
    }

    #[tokio::test]
    async fn a_batch_that_is_mostly_spare_room_is_kept_compact() {
        let s = MemoryAuditStore::new();
        let run = RunId::new();
        let mut sparse = Vec::with_capacity(1024);
        sparse.extend((0..3).map(|i| rec(run, i)));
        assert!(s.append_owned(sparse).await.is_ok());
        let mut full = Vec::with_capacity(8);
        full.extend((3..8).map(|i| rec(run, i)));
        assert!(s.append_owned(full).await.is_ok());
        let caps: Vec<usize> = {
            let g = s.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.batches.iter().map(Vec::capacity).collect()
        };
        assert_eq!(
            caps[1], 8,
            "a batch with little spare room is kept as it came"
        );
        assert!(
            caps[0] < 8,
            "the sparse batch was shrunk: capacity {}",
            caps[0]
        );
        assert_eq!(s.records().len(), 8);
    }

    #[tokio::test]
    async fn ledger_sums_commits_per_caller() {
        let l = MemoryBudgetLedger::new();
        l.set_limits(
            "a",
            BudgetLimits {
                tokens: Some(10),
                ..Default::default()
            },
        );
        let spend = Spend {
            tokens: 4,
            ..Default::default()
        };
        assert!(l
            .commit(&[
                ("a".into(), spend),
                ("a".into(), spend),
                ("b".into(), spend)
            ])
            .await
            .is_ok());
        let a = l
            .spent("a", Duration::from_secs(3600))
            .await
            .unwrap_or_default();
        assert_eq!(a.tokens, 8);
        assert_eq!(l.limits("a").await.ok().and_then(|x| x.tokens), Some(10));
        assert_eq!(l.limits("zzz").await.ok().and_then(|x| x.tokens), None);
    }
}
