//! The in-memory run queue: the [`RunQueue`] port for tests and for one
//! host on its own.
//!
//! It lives as long as the process: "on disk" is "in this process's
//! memory", and a crash loses every job it holds (use the PostgreSQL or
//! the NATS battery for runs that must outlive a process). Leases expire
//! on tokio's clock, so tests drive expiry with paused time. Jobs are
//! delivered in the order they were submitted; a job delivered again
//! keeps its place.
//!
//! A run id is remembered while its job is queued or leased: once it is
//! completed (or dead-lettered) the id may be submitted again. Dead
//! letters are kept for the process's life.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::ports::queue::{
    Claimed, DeadLetter, DeadReason, Job, JobLease, LostReason, QueueError, QueueLimits,
    ReleaseReason, RunQueue, Submitted,
};
use crate::ports::run::{unix_ms, RunId};

/// Jobs, their leases and dead letters, in memory.
pub struct MemoryQueue {
    limits: QueueLimits,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for MemoryQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryQueue")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inner {
    /// Queued and leased jobs, by run.
    jobs: HashMap<RunId, Entry>,
    /// Queued jobs by submission order.
    ready: BTreeMap<u64, RunId>,
    /// Leased jobs by submission order (at most `max_in_flight`).
    leased: BTreeMap<u64, RunId>,
    next_seq: u64,
    /// The last fencing token handed out.
    last_fence: u64,
    dead: Vec<DeadLetter>,
}

struct Entry {
    job: Job,
    seq: u64,
    /// The fencing token of its latest delivery (0 before the first).
    fence: u64,
    deliveries: u32,
    state: State,
}

enum State {
    Queued {
        /// Given back by its last holder (rather than expired).
        released: bool,
    },
    Leased {
        deadline: Instant,
    },
}

impl MemoryQueue {
    /// An empty queue with these bounds (each at least 1).
    pub fn new(limits: QueueLimits) -> Self {
        MemoryQueue {
            limits: QueueLimits {
                max_deliver: limits.max_deliver.max(1),
                max_in_flight: limits.max_in_flight.max(1),
            },
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for MemoryQueue {
    fn default() -> Self {
        Self::new(QueueLimits::default())
    }
}

impl Inner {
    /// Moves leases that expired by `now` back to the queue.
    fn reap(&mut self, now: Instant) {
        let expired: Vec<(u64, RunId)> = self
            .leased
            .iter()
            .filter(|(_, id)| {
                matches!(
                    self.jobs.get(id).map(|e| &e.state),
                    Some(State::Leased { deadline }) if *deadline <= now
                )
            })
            .map(|(seq, id)| (*seq, *id))
            .collect();
        for (seq, id) in expired {
            self.leased.remove(&seq);
            if let Some(e) = self.jobs.get_mut(&id) {
                e.state = State::Queued { released: false };
                self.ready.insert(seq, id);
            }
        }
    }

    /// Whether `lease` still holds its job at `now`.
    fn check(&self, lease: &JobLease, now: Instant) -> Result<(), QueueError> {
        let lost = |reason| QueueError::LeaseLost {
            run_id: lease.run_id,
            fence: lease.fence,
            reason,
        };
        let Some(e) = self.jobs.get(&lease.run_id) else {
            return Err(lost(LostReason::Finished));
        };
        if e.fence != lease.fence {
            return Err(lost(LostReason::Superseded));
        }
        match e.state {
            State::Leased { deadline } if deadline > now => Ok(()),
            State::Leased { .. } | State::Queued { released: false } => {
                Err(lost(LostReason::Expired))
            }
            State::Queued { released: true } => Err(lost(LostReason::Released)),
        }
    }
}

#[async_trait]
impl RunQueue for MemoryQueue {
    async fn submit(&self, job: &Job) -> Result<Submitted, QueueError> {
        let mut g = self.lock();
        if g.jobs.contains_key(&job.run_id) {
            return Ok(Submitted::AlreadyQueued);
        }
        let seq = g.next_seq;
        g.next_seq += 1;
        g.ready.insert(seq, job.run_id);
        g.jobs.insert(
            job.run_id,
            Entry {
                job: job.clone(),
                seq,
                fence: 0,
                deliveries: 0,
                state: State::Queued { released: false },
            },
        );
        Ok(Submitted::Queued)
    }

    async fn claim(
        &self,
        worker: &str,
        max: usize,
        lease_ttl: Duration,
    ) -> Result<Vec<Claimed>, QueueError> {
        let now = Instant::now();
        let deadline = now + lease_ttl;
        let mut g = self.lock();
        g.reap(now);
        let room = (self.limits.max_in_flight as usize).saturating_sub(g.leased.len());
        let want = max.min(room);
        let mut out = Vec::with_capacity(want);
        while out.len() < want {
            let Some((seq, id)) = g.ready.pop_first() else {
                break;
            };
            let Some(mut e) = g.jobs.remove(&id) else {
                continue;
            };
            if e.deliveries >= self.limits.max_deliver {
                g.dead.push(DeadLetter {
                    job: e.job,
                    reason: DeadReason::MaxDeliveries {
                        deliveries: e.deliveries,
                    },
                    at_ms: unix_ms(),
                });
                continue;
            }
            g.last_fence += 1;
            e.fence = g.last_fence;
            e.deliveries += 1;
            e.state = State::Leased { deadline };
            out.push(Claimed {
                job: e.job.clone(),
                lease: JobLease {
                    run_id: id,
                    worker: worker.to_string(),
                    fence: e.fence,
                    deliveries: e.deliveries,
                    ttl: lease_ttl,
                    deadline,
                    receipt: String::new(),
                },
            });
            g.leased.insert(seq, id);
            g.jobs.insert(id, e);
        }
        Ok(out)
    }

    async fn renew(&self, lease: &mut JobLease) -> Result<(), QueueError> {
        let now = Instant::now();
        let mut g = self.lock();
        g.check(lease, now)?;
        let deadline = now + lease.ttl;
        if let Some(e) = g.jobs.get_mut(&lease.run_id) {
            e.state = State::Leased { deadline };
        }
        lease.deadline = deadline;
        Ok(())
    }

    async fn complete(&self, lease: &JobLease) -> Result<(), QueueError> {
        let mut g = self.lock();
        g.check(lease, Instant::now())?;
        if let Some(e) = g.jobs.remove(&lease.run_id) {
            g.leased.remove(&e.seq);
        }
        Ok(())
    }

    async fn release(&self, lease: &JobLease, _reason: &ReleaseReason) -> Result<(), QueueError> {
        let mut g = self.lock();
        g.check(lease, Instant::now())?;
        let Some(e) = g.jobs.get_mut(&lease.run_id) else {
            return Ok(());
        };
        e.state = State::Queued { released: true };
        let seq = e.seq;
        g.leased.remove(&seq);
        g.ready.insert(seq, lease.run_id);
        Ok(())
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        Ok(self.lock().dead.iter().take(limit).cloned().collect())
    }
}
