//! The in-memory `Checkpointer`: checkpoints live as long as the host's
//! process, which makes durable runs resumable after a host restart within
//! one process (tests) but not after a crash. Use the SQLite store for that.
//! Leases, host leases and fencing behave as the port says (one lock for
//! the maps: a claim or a take-over is atomic).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;

use crate::ports::checkpoint::{
    Checkpoint, CheckpointError, Checkpointer, Claim, HostClaim, Lease, Renewal, Unchanged,
};
use crate::ports::run::{unix_ms, RunId};

/// A checkpoint and its lease.
struct Held {
    checkpoint: Checkpoint,
    owner: Option<String>,
    until_ms: u64,
}

/// A host's lease.
struct HostLease {
    until_ms: u64,
    /// A `recover` took the host over since it last renewed.
    taken_over: bool,
}

/// Checkpoints and host leases in maps.
#[derive(Default)]
pub struct MemoryCheckpointer {
    saved: Mutex<Maps>,
}

#[derive(Default)]
struct Maps {
    runs: BTreeMap<RunId, Held>,
    hosts: HashMap<String, HostLease>,
}

impl MemoryCheckpointer {
    /// An empty checkpointer.
    pub fn new() -> Self {
        Self::default()
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.saved.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `owner` may take a run held by `held` at `now`.
fn free_for(held: &Held, owner: &str, now: u64) -> bool {
    held.owner.as_deref().is_none_or(|o| o == owner) || held.until_ms <= now
}

#[async_trait]
impl Checkpointer for MemoryCheckpointer {
    async fn save(
        &self,
        checkpoints: &[Checkpoint],
        lease: &Lease,
    ) -> Result<Vec<RunId>, CheckpointError> {
        let now = unix_ms();
        let mut lost = Vec::new();
        let g = &mut self.maps().runs;
        for c in checkpoints {
            let may = match g.get(&c.run_id) {
                // Only a run's first save creates its row.
                None => c.is_first(),
                Some(h) if c.is_first() => free_for(h, &lease.owner, now),
                // Later saves: only while the row is the owner's.
                Some(h) => h.owner.as_deref() == Some(lease.owner.as_str()),
            };
            if !may {
                lost.push(c.run_id);
                continue;
            }
            // Kept whole (its transcript shared with the run): what the
            // previous save left unchanged does not matter here.
            let mut checkpoint = c.clone();
            checkpoint.unchanged = Unchanged::default();
            g.insert(
                c.run_id,
                Held {
                    checkpoint,
                    owner: Some(lease.owner.clone()),
                    until_ms: lease.until(now),
                },
            );
        }
        Ok(lost)
    }

    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        let g = &mut self.maps().runs;
        for r in runs {
            g.remove(r);
        }
        Ok(())
    }

    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        Ok(self
            .maps()
            .runs
            .values()
            .map(|h| h.checkpoint.clone())
            .collect())
    }

    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError> {
        let now = unix_ms();
        let g = &mut self.maps().runs;
        let Some(h) = g.get_mut(&run_id) else {
            return Ok(Claim::Missing);
        };
        if !free_for(h, &lease.owner, now) {
            return Ok(Claim::HeldBy {
                owner: h.owner.clone().unwrap_or_default(),
                until_ms: h.until_ms,
            });
        }
        h.owner = Some(lease.owner.clone());
        h.until_ms = lease.until(now);
        Ok(Claim::Claimed)
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal, CheckpointError> {
        let until = lease.until(unix_ms());
        let mut g = self.maps();
        let prior = g.hosts.insert(
            lease.owner.clone(),
            HostLease {
                until_ms: until,
                taken_over: false,
            },
        );
        let mut runs = 0;
        for h in g.runs.values_mut() {
            if h.owner.as_deref() == Some(lease.owner.as_str()) {
                h.until_ms = until;
                runs += 1;
            }
        }
        Ok(Renewal {
            runs,
            taken_over: prior.is_some_and(|p| p.taken_over),
        })
    }

    async fn held_by(&self, owner: &str) -> Result<Vec<RunId>, CheckpointError> {
        Ok(self
            .maps()
            .runs
            .iter()
            .filter(|(_, h)| h.owner.as_deref() == Some(owner))
            .map(|(id, _)| *id)
            .collect())
    }

    async fn take_over_host(&self, owner: &str, gone: bool) -> Result<HostClaim, CheckpointError> {
        let now = unix_ms();
        let mut g = self.maps();
        let host = g.hosts.entry(owner.to_string()).or_insert(HostLease {
            until_ms: 0,
            taken_over: false,
        });
        if host.until_ms > now && !host.taken_over && !gone {
            return Ok(HostClaim::Live {
                until_ms: host.until_ms,
            });
        }
        host.taken_over = true;
        Ok(HostClaim::TakenOver)
    }

    async fn release(&self, owner: &str) -> Result<(), CheckpointError> {
        let mut g = self.maps();
        g.hosts.remove(owner);
        for h in g.runs.values_mut() {
            if h.owner.as_deref() == Some(owner) {
                h.owner = None;
                h.until_ms = 0;
            }
        }
        Ok(())
    }
}
