//! The host's registry of runs in flight ([`HostRuns`]: how many, which by
//! id, and whoever waits for none) and its host-wide feed of run starts,
//! ends and critic decisions ([`HostFeed`]). A run is in the registry from
//! its admission until its terminal record is handed to the audit actor.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use serde::Serialize;
use tokio::sync::Notify;

use super::RunShared;
use crate::ports::audit::AuditStore;
use crate::ports::run::{unix_ms, CriticDecision, KillReason, RunId, RunResult, RunStatus};

/// A hasher for run ids: one multiply of the id's two halves (ids are
/// unique and already spread; SipHash would cost more than the lookup).
#[derive(Clone, Copy, Default)]
pub(crate) struct RunIdHash;

/// The [`RunIdHash`] hasher's state.
#[derive(Default)]
pub(crate) struct RunIdHasher(u64);

impl Hasher for RunIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u128(&mut self, v: u128) {
        let folded = (v as u64) ^ ((v >> 64) as u64).rotate_left(29);
        self.0 = (self.0 ^ folded).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl BuildHasher for RunIdHash {
    type Hasher = RunIdHasher;
    fn build_hasher(&self) -> RunIdHasher {
        RunIdHasher(0)
    }
}

/// What the host-wide feed says (`Host::watch`): runs starting and
/// ending, critic decisions. On the wire: `{"type": "run.started", …}`.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(tag = "type")]
#[non_exhaustive]
pub enum HostEvent {
    /// A run was admitted to the host (it may still be refused: a
    /// `run.ended` with status `rejected` follows at once).
    #[serde(rename = "run.started")]
    RunStarted {
        /// The run.
        run_id: RunId,
        /// Its agent.
        agent: Arc<str>,
        /// Who submitted it.
        caller_id: Option<Arc<str>>,
        /// Its parent, for a sub-agent run.
        parent_run_id: Option<RunId>,
        /// Unix ms.
        at_ms: u64,
    },
    /// A run ended (its terminal record is on its way to the audit log).
    #[serde(rename = "run.ended")]
    RunEnded {
        /// The run.
        run_id: RunId,
        /// Its agent.
        agent: Arc<str>,
        /// Who submitted it.
        caller_id: Option<Arc<str>>,
        /// Its parent, for a sub-agent run.
        parent_run_id: Option<RunId>,
        /// How it ended.
        status: RunStatus,
        /// Why it was killed, when it was.
        kill_reason: Option<KillReason>,
        /// The error kind, when not ok.
        error_kind: Option<String>,
        /// Model iterations.
        iterations: u32,
        /// Tokens used.
        tokens: u64,
        /// Cost in micro-dollars.
        cost_micros: u64,
        /// Wall time, ms.
        duration_ms: u64,
        /// Unix ms.
        at_ms: u64,
    },
    /// The critic (or an operator) decided something about a run.
    #[serde(rename = "critic.decision")]
    CriticDecision {
        /// The run.
        run_id: RunId,
        /// Its agent.
        agent: Arc<str>,
        /// Who submitted it.
        caller_id: Option<Arc<str>>,
        /// The decision.
        decision: CriticDecision,
    },
    /// This watcher fell behind and missed `missed` events (the feed is
    /// lossy: it is for dashboards; a run's own stream loses nothing).
    #[serde(rename = "lagged")]
    Lagged {
        /// How many events were dropped.
        missed: u64,
    },
}

impl HostEvent {
    /// The run the event is about (`None` for `lagged`).
    pub fn run_id(&self) -> Option<RunId> {
        match self {
            HostEvent::RunStarted { run_id, .. }
            | HostEvent::RunEnded { run_id, .. }
            | HostEvent::CriticDecision { run_id, .. } => Some(*run_id),
            HostEvent::Lagged { .. } => None,
        }
    }

    /// Who submitted the run the event is about.
    pub fn caller_id(&self) -> Option<&str> {
        match self {
            HostEvent::RunStarted { caller_id, .. }
            | HostEvent::RunEnded { caller_id, .. }
            | HostEvent::CriticDecision { caller_id, .. } => caller_id.as_deref(),
            HostEvent::Lagged { .. } => None,
        }
    }
}

/// Events the host-wide feed holds for its slowest watcher before that
/// watcher is told it lagged.
pub const FEED_CAPACITY: usize = 4096;

/// A watcher of the host-wide feed ([`HostEvent`]s, in the order the host
/// saw them). Lossy by design: a watcher more than [`FEED_CAPACITY`]
/// events behind gets a [`HostEvent::Lagged`] and goes on from the oldest
/// event still held. Nothing is sent while no one watches.
pub struct HostFeed {
    rx: tokio::sync::broadcast::Receiver<HostEvent>,
    host: Arc<HostRuns>,
}

impl HostFeed {
    /// The next event; `None` once the host is gone.
    pub async fn next(&mut self) -> Option<HostEvent> {
        use tokio::sync::broadcast::error::RecvError;
        match self.rx.recv().await {
            Ok(ev) => Some(ev),
            Err(RecvError::Lagged(missed)) => Some(HostEvent::Lagged { missed }),
            Err(RecvError::Closed) => None,
        }
    }
}

impl Drop for HostFeed {
    fn drop(&mut self) {
        self.host.watchers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The host's runs in flight: how many, which (by id), and whoever waits
/// for none. Shared by the host and every run's record.
pub(crate) struct HostRuns {
    count: AtomicUsize,
    idle: Notify,
    registry: DashMap<RunId, Arc<RunShared>, RunIdHash>,
    /// Where subscribers catch up from.
    pub(crate) store: Arc<dyn AuditStore>,
    /// The host-wide feed, and how many watch it (counted apart, so a host
    /// nobody watches sends nothing and takes no lock).
    feed: tokio::sync::broadcast::Sender<HostEvent>,
    watchers: AtomicUsize,
}

impl HostRuns {
    pub(crate) fn new(store: Arc<dyn AuditStore>) -> Self {
        HostRuns {
            count: AtomicUsize::new(0),
            idle: Notify::new(),
            registry: DashMap::with_hasher(RunIdHash),
            store,
            feed: tokio::sync::broadcast::Sender::new(FEED_CAPACITY),
            watchers: AtomicUsize::new(0),
        }
    }

    /// A new watcher of the host-wide feed.
    pub(crate) fn watch(self: &Arc<Self>) -> HostFeed {
        self.watchers.fetch_add(1, Ordering::SeqCst);
        HostFeed {
            rx: self.feed.subscribe(),
            host: self.clone(),
        }
    }

    /// Whether anyone watches the feed.
    #[inline]
    pub(super) fn watched(&self) -> bool {
        self.watchers.load(Ordering::Relaxed) > 0
    }

    pub(super) fn announce(&self, ev: HostEvent) {
        let _ = self.feed.send(ev);
    }

    pub(super) fn enter(&self, run: &Arc<RunShared>) {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.registry.insert(run.run_id, run.clone());
        if self.watched() {
            self.announce(HostEvent::RunStarted {
                run_id: run.run_id,
                agent: run.agent.clone(),
                caller_id: run.caller_id.clone(),
                parent_run_id: run.parent_run_id,
                at_ms: unix_ms(),
            });
        }
    }

    /// A run ended with `result` (finalized; its record is on its way).
    pub(super) fn ended(&self, result: &RunResult) {
        crate::telemetry::run_ended(result);
        if self.watched() {
            self.announce(HostEvent::RunEnded {
                run_id: result.run_id,
                agent: Arc::from(result.agent.as_str()),
                caller_id: result.caller_id.as_deref().map(Arc::from),
                parent_run_id: result.parent_run_id,
                status: result.status,
                kill_reason: result.kill_reason,
                error_kind: result.error_kind.clone(),
                iterations: result.iterations,
                tokens: result.usage.total(),
                cost_micros: result.cost_micros,
                duration_ms: result.duration_ms(),
                at_ms: result.finished_at,
            });
        }
    }

    pub(super) fn leave(&self, run_id: RunId) {
        self.registry.remove(&run_id);
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Runs in flight.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// A run in flight, by id.
    pub(crate) fn get(&self, run_id: &RunId) -> Option<Arc<RunShared>> {
        self.registry.get(run_id).map(|r| r.value().clone())
    }

    /// Every run in flight (a snapshot).
    pub(crate) fn all(&self) -> Vec<Arc<RunShared>> {
        self.registry.iter().map(|r| r.value().clone()).collect()
    }

    /// Waits until no run is in flight.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}
