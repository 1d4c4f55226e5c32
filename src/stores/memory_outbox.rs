//! The in-memory outbox: the intents an in-memory audit store was given
//! with its runs' terminal records, and what became of them. It lives as
//! long as the process (a crash loses what it owes, as it loses the
//! in-memory audit log: use the SQLite store for an outbox that outlives
//! the process).

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::ports::outbox::{
    DeliveryReport, DeliveryState, OutboxError, OutboxStore, PublishIntent,
};
use crate::ports::run::RunId;

/// Intents and their outcomes, in memory.
#[derive(Default)]
pub struct MemoryOutbox {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// By key.
    entries: HashMap<String, Entry>,
    /// Keys in the order they came.
    order: Vec<String>,
}

struct Entry {
    intent: PublishIntent,
    report: DeliveryReport,
    /// Who claimed it, until when (Unix ms).
    claim: Option<(String, u64)>,
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps `intents` (one already held by its key is left as it is: a
    /// batch written again).
    pub fn insert(&self, intents: &[PublishIntent]) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for i in intents {
            if g.entries.contains_key(&i.key) {
                continue;
            }
            g.order.push(i.key.clone());
            g.entries.insert(
                i.key.clone(),
                Entry {
                    report: DeliveryReport::of(i),
                    intent: i.clone(),
                    claim: None,
                },
            );
        }
    }
}

#[async_trait]
impl OutboxStore for MemoryOutbox {
    async fn owed(&self, now_ms: u64, limit: usize) -> Result<Vec<PublishIntent>, OutboxError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut owed: Vec<&PublishIntent> = g
            .order
            .iter()
            .filter_map(|k| g.entries.get(k))
            .filter(|e| e.report.state == DeliveryState::Owed)
            .filter(|e| e.claim.as_ref().is_none_or(|(_, until)| *until <= now_ms))
            .map(|e| &e.intent)
            .collect();
        // Oldest first, as the persistent stores list them (a batch that
        // came late may hold an older run's intents).
        owed.sort_by(|a, b| (a.at_ms, &a.key).cmp(&(b.at_ms, &b.key)));
        Ok(owed.into_iter().take(limit).cloned().collect())
    }

    async fn run_intents(
        &self,
        run_id: RunId,
    ) -> Result<Vec<(PublishIntent, DeliveryReport)>, OutboxError> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(PublishIntent, DeliveryReport)> = g
            .order
            .iter()
            .filter_map(|k| g.entries.get(k))
            .filter(|e| e.intent.run_id == run_id)
            .map(|e| (e.intent.clone(), e.report.clone()))
            .collect();
        out.sort_by_key(|(i, _)| i.index);
        Ok(out)
    }

    async fn claim(
        &self,
        key: &str,
        owner: &str,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<bool, OutboxError> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = g.entries.get_mut(key) else {
            return Ok(false);
        };
        if e.report.state != DeliveryState::Owed {
            return Ok(false);
        }
        let free = match &e.claim {
            None => true,
            Some((who, until)) => who == owner || *until <= now_ms,
        };
        if free {
            e.claim = Some((owner.to_string(), until_ms));
        }
        Ok(free)
    }

    async fn record_outcome(&self, report: &DeliveryReport) -> Result<(), OutboxError> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = g.entries.get_mut(&report.key) {
            e.report = report.clone();
            e.claim = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn intent(key: &str, skipped: bool) -> PublishIntent {
        PublishIntent {
            key: key.into(),
            run_id: RunId(7),
            index: 0,
            name: "hook".into(),
            kind: "webhook".into(),
            target: serde_json::Value::Null,
            shown: String::new(),
            body: "b".into(),
            skipped: skipped.then(|| "not due".to_string()),
            schedule: "s".into(),
            skill: "k".into(),
            timeout_ms: 1000,
            at_ms: 1,
        }
    }

    #[tokio::test]
    async fn claims_exclude_other_owners_until_they_run_out() {
        let o = MemoryOutbox::new();
        o.insert(&[intent("a", false), intent("b", true)]);
        // Written again (a replay): still one of each.
        o.insert(&[intent("a", false)]);
        let owed = o.owed(0, 10).await.unwrap();
        assert_eq!(
            owed.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert!(o.claim("a", "me", 100, 0).await.unwrap());
        assert!(!o.claim("a", "you", 200, 50).await.unwrap());
        assert!(o.owed(50, 10).await.unwrap().is_empty());
        // Past the claim, another owner may take it.
        assert!(o.claim("a", "you", 300, 100).await.unwrap());
        // A skipped intent is never owed nor claimed.
        assert!(!o.claim("b", "me", 100, 0).await.unwrap());
        let mut r = DeliveryReport::of(&intent("a", false));
        r.state = DeliveryState::Delivered;
        o.record_outcome(&r).await.unwrap();
        assert!(o.owed(u64::MAX, 10).await.unwrap().is_empty());
        assert!(!o.claim("a", "me", 400, 300).await.unwrap());
        let all = o.run_intents(RunId(7)).await.unwrap();
        let states: Vec<_> = all.iter().map(|(_, r)| r.state).collect();
        assert_eq!(states, [DeliveryState::Delivered, DeliveryState::Skipped]);
    }
}
