//! The in-memory `WriteIntents`: parked memory writes live as long as the
//! store (one process). A host built with nothing uses it; the SQLite
//! store keeps them across restarts, which is what "never discarded"
//! needs once the process can end.
//!
//! The same rules as any battery (see `crate::ports::writeback`): parking
//! an id twice keeps the first content, intents come back oldest first,
//! only `resolve` removes one.

use std::sync::Mutex;

use async_trait::async_trait;

use crate::ports::writeback::{WriteIntent, WriteIntentError, WriteIntents};

/// Parked writes in a list, in the order they were parked.
#[derive(Default)]
pub struct MemoryWriteIntents {
    intents: Mutex<Vec<WriteIntent>>,
}

impl MemoryWriteIntents {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<WriteIntent>> {
        self.intents.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl WriteIntents for MemoryWriteIntents {
    async fn park(&self, intent: &WriteIntent) -> Result<(), WriteIntentError> {
        let mut all = self.lock();
        match all.iter_mut().find(|i| i.id == intent.id) {
            Some(kept) => {
                kept.attempts = kept.attempts.saturating_add(1);
                kept.last_error.clone_from(&intent.last_error);
            }
            None => all.push(intent.clone()),
        }
        Ok(())
    }

    async fn parked(&self) -> Result<Vec<WriteIntent>, WriteIntentError> {
        Ok(self.lock().clone())
    }

    async fn record_attempt(&self, id: &str, error: &str) -> Result<bool, WriteIntentError> {
        let mut all = self.lock();
        Ok(match all.iter_mut().find(|i| i.id == id) {
            Some(kept) => {
                kept.attempts = kept.attempts.saturating_add(1);
                kept.last_error = error.to_string();
                true
            }
            None => false,
        })
    }

    async fn resolve(&self, id: &str) -> Result<bool, WriteIntentError> {
        let mut all = self.lock();
        let before = all.len();
        all.retain(|i| i.id != id);
        Ok(all.len() < before)
    }
}
