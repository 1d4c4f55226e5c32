//! The in-memory `Checkpointer`: checkpoints live as long as the host's
//! process, which makes durable runs resumable after a host restart within
//! one process (tests) but not after a crash. Use the SQLite store for that.
//! Leases behave as the port says (one lock for the map: a claim is atomic).

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::ports::checkpoint::{Checkpoint, CheckpointError, Checkpointer, Claim, Lease};
use crate::ports::run::{unix_ms, RunId};

/// A checkpoint and its lease.
struct Held {
    checkpoint: Checkpoint,
    owner: Option<String>,
    until_ms: u64,
}

/// Checkpoints in a map.
#[derive(Default)]
pub struct MemoryCheckpointer {
    saved: Mutex<BTreeMap<RunId, Held>>,
}

impl MemoryCheckpointer {
    /// An empty checkpointer.
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<RunId, Held>> {
        self.saved.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `owner` may take a run held by `held` at `now`.
fn free_for(held: &Held, owner: &str, now: u64) -> bool {
    held.owner.as_deref().is_none_or(|o| o == owner) || held.until_ms <= now
}

#[async_trait]
impl Checkpointer for MemoryCheckpointer {
    async fn save(&self, checkpoints: &[Checkpoint], lease: &Lease) -> Result<(), CheckpointError> {
        let now = unix_ms();
        let mut g = self.map();
        for c in checkpoints {
            if g.get(&c.run_id)
                .is_some_and(|h| !free_for(h, &lease.owner, now))
            {
                continue;
            }
            g.insert(
                c.run_id,
                Held {
                    checkpoint: c.clone(),
                    owner: Some(lease.owner.clone()),
                    until_ms: lease.until(now),
                },
            );
        }
        Ok(())
    }

    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        let mut g = self.map();
        for r in runs {
            g.remove(r);
        }
        Ok(())
    }

    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        Ok(self.map().values().map(|h| h.checkpoint.clone()).collect())
    }

    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError> {
        let now = unix_ms();
        let mut g = self.map();
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

    async fn renew(&self, lease: &Lease) -> Result<(), CheckpointError> {
        let until = lease.until(unix_ms());
        for h in self.map().values_mut() {
            if h.owner.as_deref() == Some(lease.owner.as_str()) {
                h.until_ms = until;
            }
        }
        Ok(())
    }

    async fn release(&self, owner: &str) -> Result<(), CheckpointError> {
        for h in self.map().values_mut() {
            if h.owner.as_deref() == Some(owner) {
                h.owner = None;
                h.until_ms = 0;
            }
        }
        Ok(())
    }
}
