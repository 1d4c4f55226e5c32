//! The `WriteIntents` port: where a memory write that could not land in
//! its git repository waits, with its content, until it does.
//!
//! A scheduled skill's memory is committed to the skills repository and
//! pushed to its `origin`. When the push still fails after its retries
//! (the remote is unreachable, refuses the token, a rebase conflicts), the
//! write is *parked* here: the repository, the file, the mode, the memory
//! text and the run it came from. A later retry (at host start and
//! periodically) lands it and only then removes it: a parked write is
//! never discarded.
//!
//! # Guarantees a battery gives
//!
//! - **Durable once parked.** [`WriteIntents::park`] returns after the
//!   intent is stored (for SQLite: committed).
//! - **Idempotent by id.** Parking an id already parked keeps the first
//!   content and counts the attempt; an intent's id is its run and file,
//!   so a run's write is parked once however often it fails.
//! - **Ordered.** [`WriteIntents::parked`] lists intents oldest first, so
//!   writes to one file land in the order they were made.
//! - **Removed only by [`WriteIntents::resolve`]**, which the writeback
//!   calls once the write is on the remote.
//!
//! No secret is stored: the token is named by its secret (`token_secret`)
//! and read again from the environment when the intent is retried.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// How a memory is written into its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// Added at the end of the file, after a line break.
    Append,
    /// The file becomes the memory.
    Replace,
}

impl WriteMode {
    /// `append` or `replace`.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteMode::Append => "append",
            WriteMode::Replace => "replace",
        }
    }
}

impl std::str::FromStr for WriteMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "append" => Ok(WriteMode::Append),
            "replace" => Ok(WriteMode::Replace),
            other => Err(format!("unknown write mode `{other}` (append | replace)")),
        }
    }
}

/// A memory write waiting to land.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteIntent {
    /// Its key: `RUN_ID:PATH` (one write per run and file).
    pub id: String,
    /// The repository's working tree, canonical.
    pub repo: String,
    /// The file, relative to the repository's root.
    pub path: String,
    /// Append or replace.
    pub mode: WriteMode,
    /// The memory text.
    pub content: String,
    /// The run that wrote it.
    pub run_id: String,
    /// The secret whose value is the push token (`AGENTVISOR_SECRET_<NAME>`);
    /// never the value itself.
    pub token_secret: Option<String>,
    /// When it was first parked (Unix ms).
    pub parked_at_ms: u64,
    /// Tries to land it so far (the write's own tries count as one).
    pub attempts: u32,
    /// Why the last try failed (secrets redacted).
    pub last_error: String,
}

impl std::fmt::Debug for WriteIntent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteIntent")
            .field("id", &self.id)
            .field("repo", &self.repo)
            .field("path", &self.path)
            .field("mode", &self.mode)
            .field("content_bytes", &self.content.len())
            .field("token_secret", &self.token_secret)
            .field("attempts", &self.attempts)
            .field("last_error", &self.last_error)
            .finish_non_exhaustive()
    }
}

/// Why the intent store could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteIntentError {
    /// The store is unreachable or failed (the reason says which).
    #[error("the write-intent store is unavailable: {0}")]
    Unavailable(String),
    /// A stored intent does not read back (its id, and why).
    #[error("write intent `{id}` does not read back: {reason}")]
    Corrupt {
        /// The intent.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

/// Where parked memory writes wait (see the module doc for the
/// guarantees).
#[async_trait]
pub trait WriteIntents: Send + Sync {
    /// Stores `intent` durably. An id already parked keeps its content and
    /// first time; its attempts grow by one and its last error is replaced.
    async fn park(&self, intent: &WriteIntent) -> Result<(), WriteIntentError>;

    /// Every parked intent, oldest first.
    async fn parked(&self) -> Result<Vec<WriteIntent>, WriteIntentError>;

    /// Counts one more failed try of intent `id`, with its error; `false`
    /// when no such intent is parked.
    async fn record_attempt(&self, id: &str, error: &str) -> Result<bool, WriteIntentError>;

    /// Removes intent `id`: its write is on the remote. `false` when no
    /// such intent was parked.
    async fn resolve(&self, id: &str) -> Result<bool, WriteIntentError>;
}
