//! Chat sessions (D5): a long-lived conversation with one agent whose
//! prompts are runs that share its message history.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use agentvisor::{AgentSpec, Host, SessionOptions};
//! let host = Host::builder().build().await?;
//! let spec = AgentSpec::from_file("examples/agents/hello.yaml")?;
//! let chat = host.open_session(spec, SessionOptions::default()).await?;
//! let first = chat.prompt("my name is Ada").await?;
//! let second = chat.prompt("what is my name?").await?; // sees the first turn
//! # let _ = (first, second);
//! // Later, anywhere (an HTTP handler, another task, after a restart on
//! // the same store): the same conversation by its id.
//! let again = host.session(chat.id()).await?;
//! # let _ = again;
//! # Ok(()) }
//! ```
//!
#![doc = include_str!("../../docs/sessions.md")]

use std::sync::Arc;

use tokio::sync::{oneshot, watch, OwnedMutexGuard};

use crate::handle::{RunEvents, RunHandle, RunRef};
use crate::host::sessions::SessionInner;
use crate::host::{AgentSource, Host, SubmitError};
use crate::ports::model::{Message, Role};
use crate::ports::run::{unix_ms, RunId, RunResult, RunStatus};
use crate::ports::session::{
    SessionMessage, SessionMeta, SessionState, SessionStore, SessionStoreError,
};
use crate::spec::{AgentSpec, Invocation};

/// The longest session id accepted.
pub const MAX_SESSION_ID_LEN: usize = 128;

pub use crate::ports::session::OnBusy;

/// How [`Host::open_session`] opens a session.
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// The session's id: reopened when the store has it, created with this
    /// id when not. `None`: a new session with a minted id.
    pub id: Option<String>,
    /// Who prompts it (budgets are per caller); a new session keeps it.
    pub caller_id: Option<String>,
    /// What a prompt does while another runs (default: wait).
    pub on_busy: OnBusy,
}

impl SessionOptions {
    /// Options for the session with this id.
    pub fn id(id: impl Into<String>) -> Self {
        SessionOptions {
            id: Some(id.into()),
            ..Default::default()
        }
    }
}

/// Why a session could not be opened or prompted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// Another prompt of the session is running ([`OnBusy::Refuse`]).
    #[error("session `{0}` is busy: a prompt is running")]
    Busy(String),
    /// The session is closed.
    #[error("session `{0}` is closed")]
    Closed(String),
    /// No session with this id.
    #[error("no session `{0}`")]
    NotFound(String),
    /// The id is not usable.
    #[error("invalid session id `{id}`: {reason}")]
    InvalidId {
        /// The id given (cut to its first 128 characters).
        id: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The session belongs to another agent.
    #[error("session `{id}` belongs to agent `{stored}`, not `{given}`")]
    AgentMismatch {
        /// The session.
        id: String,
        /// Its agent.
        stored: String,
        /// The agent given.
        given: String,
    },
    /// The stored manifest cannot be run on this host.
    #[error("session `{id}` cannot be reopened: {reason}")]
    Manifest {
        /// The session.
        id: String,
        /// Why.
        reason: String,
    },
    /// The prompt's run could not be submitted.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The session store failed.
    #[error(transparent)]
    Store(#[from] SessionStoreError),
}

impl SessionError {
    /// A stable snake_case kind (for HTTP bodies and exit messages).
    pub fn kind(&self) -> &'static str {
        match self {
            SessionError::Busy(_) => "session_busy",
            SessionError::Closed(_) => "session_closed",
            SessionError::NotFound(_) => "session_not_found",
            SessionError::InvalidId { .. } => "invalid_session_id",
            SessionError::AgentMismatch { .. } => "session_agent_mismatch",
            SessionError::Manifest { .. } => "session_manifest",
            SessionError::Submit(_) => "submit",
            SessionError::Store(_) => "session_store",
        }
    }
}

/// Checks a caller-given session id: 1 to 128 characters of ASCII letters,
/// digits, `-`, `_`, `.` and `:` (safe in a URL path, a file name, a log).
pub fn check_session_id(id: &str) -> Result<(), SessionError> {
    let bad = |reason| SessionError::InvalidId {
        id: id.chars().take(MAX_SESSION_ID_LEN).collect(),
        reason,
    };
    if id.is_empty() {
        return Err(bad("it is empty"));
    }
    if id.len() > MAX_SESSION_ID_LEN {
        return Err(bad("it is longer than 128 characters"));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        return Err(bad("use ASCII letters, digits, `-`, `_`, `.` or `:`"));
    }
    Ok(())
}

impl Host {
    /// The session store (to list or read sessions).
    pub fn session_store(&self) -> &Arc<dyn SessionStore> {
        &self.session_table().store
    }

    /// Opens a chat session with `agent`: a new one, or — when
    /// `options.id` names a session the store has — that session, which
    /// must belong to an agent of the same name (its stored manifest is
    /// replaced by this one, so a changed manifest applies from the next
    /// prompt). A session already open on this host is returned as it is.
    pub async fn open_session(
        &self,
        agent: impl Into<AgentSource>,
        options: SessionOptions,
    ) -> Result<Session, SessionError> {
        let agent = match agent.into() {
            AgentSource::Agent(a) => a,
            AgentSource::Spec(s) => self.agent(s)?,
        };
        let table = self.session_table();
        let id = match &options.id {
            Some(id) => {
                check_session_id(id)?;
                id.clone()
            }
            None => RunId::new().to_string(),
        };
        if let Some(inner) = table.live(&id) {
            if inner.agent.name() != agent.name() {
                return Err(SessionError::AgentMismatch {
                    id,
                    stored: inner.agent.name().to_string(),
                    given: agent.name().to_string(),
                });
            }
            return Ok(Session::from_inner(self.clone(), inner, options.on_busy));
        }
        let manifest = serde_json::to_value(agent.spec()).unwrap_or(serde_json::Value::Null);
        let meta = match table.store.get(&id).await? {
            Some(mut meta) => {
                if meta.agent != agent.name() {
                    return Err(SessionError::AgentMismatch {
                        id,
                        stored: meta.agent,
                        given: agent.name().to_string(),
                    });
                }
                if meta.manifest != manifest {
                    meta.manifest = manifest;
                    meta.updated_at = unix_ms();
                    table.store.update(&meta).await?;
                }
                meta
            }
            None => {
                let now = unix_ms();
                let meta = SessionMeta {
                    id: id.clone(),
                    agent: agent.name().to_string(),
                    manifest,
                    caller_id: options.caller_id.clone(),
                    state: SessionState::Created,
                    created_at: now,
                    updated_at: now,
                    prompts: 0,
                    messages: 0,
                    model_calls: 0,
                    usage: Default::default(),
                    last_run_id: None,
                    on_busy: None,
                };
                match table.store.create(&meta).await {
                    Ok(()) => meta,
                    // Created meanwhile by another task or process: reopen it.
                    Err(SessionStoreError::Exists(_)) => table
                        .store
                        .get(&id)
                        .await?
                        .ok_or_else(|| SessionError::NotFound(id.clone()))?,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let inner = SessionInner::new(table.store.clone(), agent, meta);
        Ok(Session::from_inner(
            self.clone(),
            table.register(inner),
            options.on_busy,
        ))
    }

    /// The session with this id: the handle open on this host, else the
    /// session as the store keeps it, prepared from its stored manifest.
    /// [`SessionError::NotFound`] when the store has no such session. A
    /// closed session is returned too (its history is readable; prompts
    /// are refused).
    pub async fn session(&self, id: &str) -> Result<Session, SessionError> {
        check_session_id(id)?;
        let table = self.session_table();
        if let Some(inner) = table.live(id) {
            return Ok(Session::from_inner(self.clone(), inner, OnBusy::default()));
        }
        let meta = table
            .store
            .get(id)
            .await?
            .ok_or_else(|| SessionError::NotFound(id.to_string()))?;
        let spec: AgentSpec =
            serde_json::from_value(meta.manifest.clone()).map_err(|e| SessionError::Manifest {
                id: id.to_string(),
                reason: format!("its stored manifest does not parse: {e}"),
            })?;
        let agent = self.agent(spec).map_err(|e| SessionError::Manifest {
            id: id.to_string(),
            reason: e.to_string(),
        })?;
        let inner = SessionInner::new(table.store.clone(), agent, meta);
        Ok(Session::from_inner(
            self.clone(),
            table.register(inner),
            OnBusy::default(),
        ))
    }
}

/// A chat handle on one session. Cheap to clone; every handle of a session
/// on one host shares its prompt gate and lifecycle (see the module doc).
#[derive(Clone)]
pub struct Session {
    host: Host,
    inner: Arc<SessionInner>,
    on_busy: OnBusy,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id)
            .field("agent", &self.inner.agent.name())
            .field("state", &self.state())
            .finish()
    }
}

impl Session {
    fn from_inner(host: Host, inner: Arc<SessionInner>, on_busy: OnBusy) -> Self {
        Session {
            host,
            inner,
            on_busy,
        }
    }

    /// This handle with another busy rule (other handles keep theirs).
    pub fn on_busy(mut self, on_busy: OnBusy) -> Self {
        self.on_busy = on_busy;
        self
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The agent's name.
    pub fn agent(&self) -> &str {
        self.inner.agent.name()
    }

    /// Where the session is in its lifecycle now.
    pub fn state(&self) -> SessionState {
        *self.inner.state.borrow()
    }

    /// A receiver of the session's lifecycle state: `changed().await`
    /// wakes on the next change, `borrow()` reads the latest.
    pub fn watch(&self) -> watch::Receiver<SessionState> {
        self.inner.state.subscribe()
    }

    /// The session's metadata as the store has it.
    pub async fn meta(&self) -> Result<SessionMeta, SessionError> {
        let inner = &self.inner;
        inner
            .store
            .get(&inner.id)
            .await?
            .ok_or_else(|| SessionError::NotFound(inner.id.clone()))
    }

    /// Keeps `on_busy` with the session in its store
    /// ([`SessionMeta::on_busy`]), for whoever serves it: the HTTP server
    /// applies it to every message (a library handle keeps its own rule,
    /// [`Session::on_busy`]). A change waits for a prompt in flight to end
    /// (its end rewrites the metadata).
    pub async fn keep_on_busy(&self, on_busy: Option<OnBusy>) -> Result<(), SessionError> {
        if self.meta().await?.on_busy == on_busy {
            return Ok(());
        }
        let _gate = self.inner.gate.clone().lock_owned().await;
        let mut meta = self.meta().await?;
        if meta.on_busy != on_busy {
            meta.on_busy = on_busy;
            meta.updated_at = unix_ms().max(meta.updated_at);
            self.inner.store.update(&meta).await?;
        }
        Ok(())
    }

    /// The session's history (user and assistant turns, in order).
    pub async fn history(&self) -> Result<Vec<SessionMessage>, SessionError> {
        Ok(self.inner.store.messages(&self.inner.id).await?)
    }

    /// The prompt's run in flight, if any.
    pub fn current_run(&self) -> Option<RunRef> {
        self.inner.current()
    }

    /// Cancels the prompt in flight, if any (it ends `cancelled`; its
    /// answer is not kept). The session stays open.
    pub fn cancel(&self) {
        if let Some(run) = self.inner.current() {
            run.cancel();
        }
    }

    /// Runs one prompt and waits for its result (see the module doc for
    /// what is kept).
    pub async fn prompt(&self, text: impl Into<String>) -> Result<RunResult, SessionError> {
        self.start(Invocation::prompt(text), false)
            .await?
            .result()
            .await
    }

    /// Starts one prompt and returns at once with its events (subscribed
    /// from the run's first record).
    pub async fn prompt_streaming(
        &self,
        text: impl Into<String>,
    ) -> Result<SessionTurn, SessionError> {
        self.start(Invocation::prompt(text), true).await
    }

    /// Starts one prompt from a whole invocation (caller, inputs, limits,
    /// attachments); its `session_id` and `history` are the session's.
    pub async fn send(&self, invocation: Invocation) -> Result<SessionTurn, SessionError> {
        self.start(invocation, true).await
    }

    /// Closes the session: a prompt in flight is cancelled, then the
    /// session takes no more prompts. Closing a closed session does
    /// nothing.
    pub async fn close(&self) -> Result<(), SessionError> {
        self.cancel();
        let _gate = self.inner.gate.clone().lock_owned().await;
        let mut meta = self.meta().await?;
        if meta.state != SessionState::Closed {
            meta.state = SessionState::Closed;
            meta.updated_at = unix_ms().max(meta.updated_at);
            self.inner.store.update(&meta).await?;
        }
        self.inner.state.send_replace(SessionState::Closed);
        Ok(())
    }

    async fn start(
        &self,
        mut inv: Invocation,
        streaming: bool,
    ) -> Result<SessionTurn, SessionError> {
        let inner = &self.inner;
        let gate = match self.on_busy {
            OnBusy::Refuse => inner
                .gate
                .clone()
                .try_lock_owned()
                .map_err(|_| SessionError::Busy(inner.id.clone()))?,
            OnBusy::Wait => inner.gate.clone().lock_owned().await,
        };
        // Read back, not cached: another host on the same store may have
        // added turns (the sequence check catches a race with one).
        let mut meta = self.meta().await?;
        if meta.state == SessionState::Closed || *inner.state.borrow() == SessionState::Closed {
            inner.state.send_replace(SessionState::Closed);
            return Err(SessionError::Closed(inner.id.clone()));
        }
        let before = match meta.state {
            SessionState::Created => SessionState::Created,
            _ => SessionState::Idle,
        };
        let history = inner.store.messages(&inner.id).await?;
        let next_seq = history.last().map_or(0, |m| m.seq + 1);
        meta.state = SessionState::Running;
        meta.updated_at = unix_ms().max(meta.updated_at);
        inner.store.update(&meta).await?;
        inner.state.send_replace(SessionState::Running);

        let prompt = if inv.prompt.is_empty() {
            inner.agent.spec().prompt.clone().unwrap_or_default()
        } else {
            inv.prompt.clone()
        };
        inv.session_id = Some(inner.id.clone());
        inv.history = history.into_iter().map(|m| m.message).collect();
        if inv.caller_id.is_none() {
            inv.caller_id = gate.clone();
        }
        inner.model.begin(meta.model_calls);
        let submitted = if streaming {
            self.host
                .submit_streaming(inner.agent.clone(), inv)
                .await
                .map(|(h, e)| (h, Some(e)))
        } else {
            self.host
                .submit(inner.agent.clone(), inv)
                .await
                .map(|h| (h, None))
        };
        let (handle, events) = match submitted {
            Ok(started) => started,
            Err(e) => {
                meta.state = before;
                let _ = inner.store.update(&meta).await;
                inner.state.send_replace(before);
                return Err(e.into());
            }
        };
        let run = handle.run_ref();
        inner.set_current(Some(run.clone()));
        let (tx, rx) = oneshot::channel();
        let ending = Ending {
            inner: inner.clone(),
            gate,
            meta,
            prompt,
            next_seq,
        };
        tokio::spawn(async move {
            let out = ending.finish(handle).await;
            let _ = tx.send(out);
        });
        Ok(SessionTurn {
            run,
            events: events.unwrap_or_else(RunEvents::closed),
            done: rx,
        })
    }
}

/// The end of one prompt: wait for its run, keep its turns, open the gate.
struct Ending {
    inner: Arc<SessionInner>,
    gate: OwnedMutexGuard<Option<String>>,
    meta: SessionMeta,
    prompt: String,
    next_seq: u32,
}

impl Ending {
    async fn finish(self, handle: RunHandle) -> Result<RunResult, SessionError> {
        let Ending {
            inner,
            gate,
            mut meta,
            prompt,
            next_seq,
        } = self;
        let result = handle.await;
        let now = unix_ms().max(meta.updated_at);
        meta.model_calls += inner.model.made();
        meta.usage.add(&result.usage);
        meta.last_run_id = Some(result.run_id);
        meta.updated_at = now;
        // A close that came meanwhile cancelled this run; it wins.
        let closed = *inner.state.borrow() == SessionState::Closed;
        meta.state = if closed {
            SessionState::Closed
        } else {
            SessionState::Idle
        };
        let saved = if result.status == RunStatus::Ok {
            let turn = |seq: u32, role: Role, text: String| SessionMessage {
                seq,
                run_id: Some(result.run_id),
                at_ms: now,
                message: Message::text(role, text),
            };
            let turns = [
                turn(next_seq, Role::User, prompt),
                turn(
                    next_seq + 1,
                    Role::Assistant,
                    result.output.clone().unwrap_or_default(),
                ),
            ];
            meta.prompts += 1;
            meta.messages = next_seq + 2;
            inner.store.append(&meta, &turns).await
        } else {
            inner.store.update(&meta).await
        };
        inner.set_current(None);
        inner.state.send_replace(meta.state);
        drop(gate);
        match saved {
            Ok(()) => Ok(result),
            Err(e) => {
                tracing::warn!(session = %inner.id, run_id = %result.run_id, error = %e,
                    "a session's turn could not be stored");
                Err(e.into())
            }
        }
    }
}

/// One prompt in flight: its run, its events, and its result to come.
/// Dropping it does not stop the run (see the module doc).
pub struct SessionTurn {
    run: RunRef,
    events: RunEvents,
    done: oneshot::Receiver<Result<RunResult, SessionError>>,
}

impl SessionTurn {
    /// The prompt's run id.
    pub fn run_id(&self) -> RunId {
        self.run.run_id()
    }

    /// A reference to the prompt's run (steer, extend, kill, live state).
    pub fn run(&self) -> &RunRef {
        &self.run
    }

    /// The run's events (empty for [`Session::prompt`]'s turns); the
    /// stream ends after `run.end`.
    pub fn events(&mut self) -> &mut RunEvents {
        &mut self.events
    }

    /// Cancels the prompt: its run ends `cancelled`, its answer is not kept.
    pub fn cancel(&self) {
        self.run.cancel();
    }

    /// Waits for the run's result, once the session has stored its turns.
    pub async fn result(self) -> Result<RunResult, SessionError> {
        match self.done.await {
            Ok(out) => out,
            // The runtime dropped the ending task (torn down under it).
            Err(_) => Ok(self.run.result().await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        for good in ["a", "chat-1", "user_42.main", "tenant:7", &"x".repeat(128)] {
            assert!(check_session_id(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "../etc", "é", "a/b", &"x".repeat(129)] {
            let e = check_session_id(bad).err();
            assert_eq!(e.map(|e| e.kind()), Some("invalid_session_id"), "{bad}");
        }
    }
}
