//! The `SessionStore` port: where a chat session's conversation lives — its
//! metadata ([`SessionMeta`]: id, agent, times, lifecycle state, totals)
//! and its message history ([`SessionMessage`]: the user and assistant
//! turns of its prompts, in order).
//!
//! The store keeps what a session is; the chat handle that prompts it
//! (`crate::session`) decides what is written and when: a prompt's two
//! turns are appended together, with the session's new metadata, once its
//! run has ended `ok` — a failed, cancelled or interrupted prompt leaves
//! the history as it was.
//!
//! # Guarantees a battery gives
//!
//! - **Atomic appends.** [`SessionStore::append`] writes its messages and
//!   the metadata in one transaction, or nothing.
//! - **Ordered, gapless history.** Messages keep the `seq` they were given
//!   (0, 1, 2, … per session); [`SessionStore::messages`] returns them in
//!   `seq` order. Appending a `seq` already on file is refused
//!   ([`SessionStoreError::Conflict`]): two writers of one session cannot
//!   interleave unnoticed.
//! - **Plain data.** Everything here is serde data, so a battery may keep
//!   it as JSON; nothing assumes SQLite (a Postgres battery fits the same
//!   trait).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::model::Message;
use super::run::{RunId, Usage};

/// Where a session is in its lifecycle: `created → running → idle →
/// (running → idle)* → closed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Opened; no prompt has run yet.
    Created,
    /// A prompt's run is in flight.
    Running,
    /// Waiting for the next prompt.
    Idle,
    /// Closed: it takes no more prompts (its history stays readable).
    Closed,
}

impl SessionState {
    /// The state's name (`created`, `running`, `idle`, `closed`).
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Created => "created",
            SessionState::Running => "running",
            SessionState::Idle => "idle",
            SessionState::Closed => "closed",
        }
    }
}

impl std::fmt::Display for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SessionState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "created" => Ok(SessionState::Created),
            "running" => Ok(SessionState::Running),
            "idle" => Ok(SessionState::Idle),
            "closed" => Ok(SessionState::Closed),
            other => Err(format!("unknown session state `{other}`")),
        }
    }
}

/// What a prompt does when another prompt of its session is running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBusy {
    /// Wait for it to end, then run (prompts run in the order they came).
    #[default]
    Wait,
    /// Refuse at once (`session_busy`).
    Refuse,
}

/// What a session is, without its messages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionMeta {
    /// The session's id (unique in its store).
    pub id: String,
    /// The agent's name.
    pub agent: String,
    /// The agent's manifest as JSON, so a session can be reopened by its id
    /// alone (after a restart, from another process). `Null` when unknown.
    #[serde(default)]
    pub manifest: serde_json::Value,
    /// Who prompts it (budgets are per caller).
    #[serde(default)]
    pub caller_id: Option<String>,
    /// Where it is in its lifecycle.
    pub state: SessionState,
    /// Unix ms when it was created.
    pub created_at: u64,
    /// Unix ms of its last change.
    pub updated_at: u64,
    /// Prompts answered (each added two messages).
    #[serde(default)]
    pub prompts: u32,
    /// Messages in its history (the next message's `seq`).
    #[serde(default)]
    pub messages: u32,
    /// Model calls its runs made, all prompts together (a scripted model
    /// plays its script on from here, so a scripted chat goes on through
    /// its script prompt after prompt).
    #[serde(default)]
    pub model_calls: u64,
    /// Usage of its runs, all prompts together (failed ones included).
    #[serde(default)]
    pub usage: Usage,
    /// The last prompt's run.
    #[serde(default)]
    pub last_run_id: Option<RunId>,
    /// The busy rule kept with the session (`None`: none was given): what
    /// a host serving it applies to a prompt that comes while another
    /// runs (the HTTP server's `on_busy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_busy: Option<OnBusy>,
}

/// One message of a session's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionMessage {
    /// Its place in the history (0-based, gapless).
    pub seq: u32,
    /// The run that produced it (the prompt's run, for both its turns).
    #[serde(default)]
    pub run_id: Option<RunId>,
    /// Unix ms when it was added.
    pub at_ms: u64,
    /// The message (role, text).
    #[serde(flatten)]
    pub message: Message,
}

/// A session store failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SessionStoreError {
    /// A session with this id is on file already.
    #[error("session `{0}` exists already")]
    Exists(String),
    /// No session with this id.
    #[error("no session `{0}`")]
    NotFound(String),
    /// An append's `seq` is taken: another writer appended first.
    #[error("session `{id}`: message {seq} is on file already (another writer?)")]
    Conflict {
        /// The session.
        id: String,
        /// The first `seq` refused.
        seq: u32,
    },
    /// The store could not read or write.
    #[error("session store unavailable: {0}")]
    Unavailable(String),
}

/// Keeps sessions. Object-safe; used as `Arc<dyn SessionStore>`.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Records a new session (no messages yet). A taken id is
    /// [`SessionStoreError::Exists`].
    async fn create(&self, meta: &SessionMeta) -> Result<(), SessionStoreError>;

    /// A session's metadata, or `None` for an unknown id.
    async fn get(&self, id: &str) -> Result<Option<SessionMeta>, SessionStoreError>;

    /// Replaces a session's metadata (a state change).
    /// [`SessionStoreError::NotFound`] for an unknown id.
    async fn update(&self, meta: &SessionMeta) -> Result<(), SessionStoreError>;

    /// Appends messages (their `seq`s follow the history's last) and
    /// replaces the metadata, in one transaction.
    async fn append(
        &self,
        meta: &SessionMeta,
        messages: &[SessionMessage],
    ) -> Result<(), SessionStoreError>;

    /// A session's history, in `seq` order (empty for an unknown id).
    async fn messages(&self, id: &str) -> Result<Vec<SessionMessage>, SessionStoreError>;

    /// Sessions, the most recently updated first, at most `limit`.
    async fn list(&self, limit: usize) -> Result<Vec<SessionMeta>, SessionStoreError>;

    /// Removes a session and its history; `false` if there was none.
    async fn remove(&self, id: &str) -> Result<bool, SessionStoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_back() {
        for s in [
            SessionState::Created,
            SessionState::Running,
            SessionState::Idle,
            SessionState::Closed,
        ] {
            assert_eq!(s.as_str().parse::<SessionState>(), Ok(s));
            let json = serde_json::to_string(&s).unwrap_or_default();
            assert_eq!(json, format!("\"{s}\""));
        }
        assert!("stopped".parse::<SessionState>().is_err());
    }

    #[test]
    fn a_message_is_flat_json() {
        let m = SessionMessage {
            seq: 3,
            run_id: None,
            at_ms: 7,
            message: Message::text(super::super::model::Role::User, "hi"),
        };
        let v = serde_json::to_value(&m).unwrap_or_default();
        assert_eq!(v["role"], "user");
        assert_eq!(v["content"], "hi");
        assert_eq!(v["seq"], 3);
        let back: SessionMessage = serde_json::from_value(v).unwrap_or_else(|_| m.clone());
        assert_eq!(back, m);
    }
}
