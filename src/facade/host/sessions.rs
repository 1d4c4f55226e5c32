//! The sessions open on one host ([`SessionTable`], owned by the host) and
//! the state every handle of one session shares: its prompt gate, its
//! lifecycle, the prompt's run in flight and its model's call numbering.
//! Nothing here submits a run: the handles (`crate::session::Session`) do, through
//! the host they hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::agent::Agent;
use crate::handle::RunRef;
use crate::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, ModelWrapper};
use crate::ports::session::{SessionMeta, SessionState, SessionStore};

/// The sessions open on one host: one shared state per session id, held
/// only while a handle or a prompt uses it. Owned by the host.
pub(crate) struct SessionTable {
    pub(crate) store: Arc<dyn SessionStore>,
    open: Mutex<HashMap<String, Weak<SessionInner>>>,
}

impl SessionTable {
    pub(crate) fn new(store: Arc<dyn SessionStore>) -> Self {
        SessionTable {
            store,
            open: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn live(&self, id: &str) -> Option<Arc<SessionInner>> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(id).and_then(Weak::upgrade)
    }

    /// Keeps `inner` as the session's shared state, unless another task
    /// registered one first (then that one wins and is returned).
    pub(crate) fn register(&self, inner: Arc<SessionInner>) -> Arc<SessionInner> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = open.get(&inner.id).and_then(Weak::upgrade) {
            return existing;
        }
        open.insert(inner.id.clone(), Arc::downgrade(&inner));
        inner
    }
}

/// What every handle of one session on one host shares.
pub(crate) struct SessionInner {
    pub(crate) id: String,
    pub(crate) store: Arc<dyn SessionStore>,
    /// The agent, with its model behind [`SessionModel`].
    pub(crate) agent: Agent,
    pub(crate) model: Arc<SessionModel>,
    /// Held by a prompt from its start until its answer is stored: one
    /// prompt at a time. Holds the caller the session was opened for.
    pub(crate) gate: Arc<tokio::sync::Mutex<Option<String>>>,
    pub(crate) state: watch::Sender<SessionState>,
    /// The prompt's run in flight.
    current: Mutex<Option<RunRef>>,
}

impl SessionInner {
    pub(crate) fn new(store: Arc<dyn SessionStore>, agent: Agent, meta: SessionMeta) -> Arc<Self> {
        let model = Arc::new(SessionModel::new(agent.model().clone(), meta.model_calls));
        let agent = Agent::new(
            agent.spec_arc(),
            model.clone(),
            agent.tools().clone(),
            *agent.limits(),
        );
        let state = match meta.state {
            // Its process ended mid-prompt: that answer was never kept.
            SessionState::Running => SessionState::Idle,
            s => s,
        };
        Arc::new(SessionInner {
            id: meta.id,
            store,
            agent,
            model,
            gate: Arc::new(tokio::sync::Mutex::new(meta.caller_id)),
            state: watch::Sender::new(state),
            current: Mutex::new(None),
        })
    }

    pub(crate) fn set_current(&self, run: Option<RunRef>) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = run;
    }

    pub(crate) fn current(&self) -> Option<RunRef> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The session's view of its agent's model: the call index a model sees
/// continues across the session's prompts (a scripted model plays on
/// through its script), and the calls a prompt makes are counted.
/// Everything else is the wrapped model's.
pub(crate) struct SessionModel {
    inner: Arc<dyn ChatModel>,
    /// Calls the session made before the prompt in flight.
    offset: AtomicU64,
    /// Calls the prompt in flight made.
    made: AtomicU64,
}

impl SessionModel {
    /// Wraps a session's model; `calls` were made in earlier prompts.
    pub(crate) fn new(inner: Arc<dyn ChatModel>, calls: u64) -> Self {
        SessionModel {
            inner,
            offset: AtomicU64::new(calls),
            made: AtomicU64::new(0),
        }
    }

    /// A prompt starts: `calls` were made before it. Prompts run one at a
    /// time (the session's gate), so no run sees another's numbering.
    pub(crate) fn begin(&self, calls: u64) {
        self.offset.store(calls, Ordering::Relaxed);
        self.made.store(0, Ordering::Relaxed);
    }

    pub(crate) fn made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }
}

/// Forwards every capability (that it streams, too: a session's prompt is
/// supervised as a plain run is); only the call index changes.
#[async_trait]
impl ModelWrapper for SessionModel {
    fn inner(&self) -> &dyn ChatModel {
        &*self.inner
    }

    async fn complete(&self, mut request: ChatRequest) -> Result<ChatResponse, ModelError> {
        self.made.fetch_add(1, Ordering::Relaxed);
        let offset = u32::try_from(self.offset.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
        request.call_index = request.call_index.saturating_add(offset);
        self.inner.complete(request).await
    }
}
