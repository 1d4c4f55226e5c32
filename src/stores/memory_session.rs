//! The in-memory `SessionStore`: sessions live as long as the store (one
//! process). A host built with nothing uses it; the SQLite store keeps
//! sessions across processes.
//!
//! The same rules as any battery (see `crate::ports::session`): an append
//! is all or nothing, a taken `seq` is a conflict, history comes back in
//! `seq` order.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::ports::session::{SessionMessage, SessionMeta, SessionStore, SessionStoreError};

/// Sessions in a map.
#[derive(Default)]
pub struct MemorySessionStore {
    sessions: Mutex<HashMap<String, Kept>>,
}

struct Kept {
    meta: SessionMeta,
    messages: Vec<SessionMessage>,
}

impl MemorySessionStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl SessionStore for MemorySessionStore {
    async fn create(&self, meta: &SessionMeta) -> Result<(), SessionStoreError> {
        let mut g = self.lock();
        if g.contains_key(&meta.id) {
            return Err(SessionStoreError::Exists(meta.id.clone()));
        }
        g.insert(
            meta.id.clone(),
            Kept {
                meta: meta.clone(),
                messages: Vec::new(),
            },
        );
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<SessionMeta>, SessionStoreError> {
        Ok(self.lock().get(id).map(|k| k.meta.clone()))
    }

    async fn update(&self, meta: &SessionMeta) -> Result<(), SessionStoreError> {
        let mut g = self.lock();
        let kept = g
            .get_mut(&meta.id)
            .ok_or_else(|| SessionStoreError::NotFound(meta.id.clone()))?;
        kept.meta = meta.clone();
        Ok(())
    }

    async fn append(
        &self,
        meta: &SessionMeta,
        messages: &[SessionMessage],
    ) -> Result<(), SessionStoreError> {
        let mut g = self.lock();
        let kept = g
            .get_mut(&meta.id)
            .ok_or_else(|| SessionStoreError::NotFound(meta.id.clone()))?;
        // Checked before anything changes: all or nothing.
        let first = kept.messages.len() as u32;
        for (expected, m) in (first..).zip(messages) {
            if m.seq != expected {
                return Err(SessionStoreError::Conflict {
                    id: meta.id.clone(),
                    seq: m.seq,
                });
            }
        }
        kept.messages.extend_from_slice(messages);
        kept.meta = meta.clone();
        Ok(())
    }

    async fn messages(&self, id: &str) -> Result<Vec<SessionMessage>, SessionStoreError> {
        Ok(self
            .lock()
            .get(id)
            .map(|k| k.messages.clone())
            .unwrap_or_default())
    }

    async fn list(&self, limit: usize) -> Result<Vec<SessionMeta>, SessionStoreError> {
        let mut all: Vec<SessionMeta> = self.lock().values().map(|k| k.meta.clone()).collect();
        all.sort_by(|a, b| {
            b.updated_at
                .cmp(&a.updated_at)
                .then_with(|| b.id.cmp(&a.id))
        });
        all.truncate(limit);
        Ok(all)
    }

    async fn remove(&self, id: &str) -> Result<bool, SessionStoreError> {
        Ok(self.lock().remove(id).is_some())
    }
}
