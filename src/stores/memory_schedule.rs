//! The in-memory `ScheduleStore`: states live as long as the store (one
//! process). The SQLite store keeps them across restarts.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::ports::schedule::{ScheduleState, ScheduleStore, ScheduleStoreError};

/// Schedule states in a map.
#[derive(Default)]
pub struct MemoryScheduleStore {
    states: Mutex<BTreeMap<String, ScheduleState>>,
}

impl MemoryScheduleStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ScheduleState>> {
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl ScheduleStore for MemoryScheduleStore {
    async fn load_all(&self) -> Result<Vec<ScheduleState>, ScheduleStoreError> {
        Ok(self.lock().values().cloned().collect())
    }

    async fn get(&self, name: &str) -> Result<Option<ScheduleState>, ScheduleStoreError> {
        Ok(self.lock().get(name).cloned())
    }

    async fn put_all(&self, states: &[ScheduleState]) -> Result<(), ScheduleStoreError> {
        let mut map = self.lock();
        for s in states {
            map.insert(s.name.clone(), s.clone());
        }
        Ok(())
    }

    async fn remove(&self, names: &[String]) -> Result<(), ScheduleStoreError> {
        let mut map = self.lock();
        for n in names {
            map.remove(n);
        }
        Ok(())
    }
}
