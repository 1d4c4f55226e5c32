//! The in-memory `Checkpointer`: checkpoints live as long as the host's
//! process, which makes durable runs resumable after a host restart within
//! one process (tests) but not after a crash. Use the SQLite store for that.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::ports::checkpoint::{Checkpoint, CheckpointError, Checkpointer};
use crate::ports::run::RunId;

/// Checkpoints in a map.
#[derive(Default)]
pub struct MemoryCheckpointer {
    saved: Mutex<BTreeMap<RunId, Checkpoint>>,
}

impl MemoryCheckpointer {
    /// An empty checkpointer.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Checkpointer for MemoryCheckpointer {
    async fn save(&self, checkpoints: &[Checkpoint]) -> Result<(), CheckpointError> {
        let mut g = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        for c in checkpoints {
            g.insert(c.run_id, c.clone());
        }
        Ok(())
    }

    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        let mut g = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        for r in runs {
            g.remove(r);
        }
        Ok(())
    }

    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        Ok(self
            .saved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect())
    }
}
