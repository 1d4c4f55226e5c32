//! What a write came to ([`WriteOutcome`]), what a retry of parked
//! writes came to ([`RetryReport`]), and the errors of bad requests.

use serde::Serialize;

use crate::ports::writeback::WriteIntentError;

/// Why a commit was not pushed, by design.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalReason {
    /// `skip_push` was asked for.
    SkipPush,
    /// No token is set.
    NoToken,
}

/// Where the write went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PushState {
    /// On `origin`.
    Pushed {
        /// Pushes it took (1 when the remote had not moved).
        tries: u32,
    },
    /// Committed locally only, by design.
    Local {
        /// Why.
        reason: LocalReason,
    },
    /// Not on `origin`: parked, to be retried (a partial failure).
    Parked {
        /// The parked intent.
        intent_id: String,
        /// Why the last try failed (secrets redacted).
        error: String,
    },
}

/// What [`GitWriteback::write_memory`](super::GitWriteback::write_memory) did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriteOutcome {
    /// The commit that holds the write, on the local branch (and on
    /// `origin` when pushed); none when not even the local commit could be
    /// made (then the write is parked).
    pub sha: Option<String>,
    /// Pushed, local, or parked.
    pub push: PushState,
    /// What a person should know (no token, a working tree not updated).
    pub warnings: Vec<String>,
}

impl WriteOutcome {
    /// The run's `writeback_sha`.
    pub fn writeback_sha(&self) -> Option<&str> {
        self.sha.as_deref()
    }

    /// Whether the write failed to land, so the run is a
    /// `partial_failure` (a local commit by design is not a failure).
    pub fn partial_failure(&self) -> bool {
        matches!(self.push, PushState::Parked { .. })
    }
}

/// A write that could not be made or parked. Every variant makes the run
/// a `partial_failure`; none holds a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WritebackError {
    /// The path is not a file inside the repository.
    #[error("writeback: path `{path}`: {why}")]
    InvalidPath {
        /// The path given.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The skills repository is not in a git working tree.
    #[error("writeback: {repo} is not in a git repository with a working tree: {reason}")]
    NotARepository {
        /// The skills repository.
        repo: String,
        /// Why.
        reason: String,
    },
    /// HEAD names no branch, so there is nothing to commit on and push.
    #[error("writeback: {repo}: HEAD is detached; check out a branch to write memory to")]
    DetachedHead {
        /// The skills repository.
        repo: String,
    },
    /// The write did not land and could not be parked either.
    #[error("writeback: `{path}` of run {run_id} did not land ({error}) and could not be parked: {store}")]
    NotParked {
        /// The file.
        path: String,
        /// The run.
        run_id: String,
        /// Why it did not land.
        error: String,
        /// Why the intent store failed.
        store: WriteIntentError,
    },
}

/// What [`GitWriteback::retry_parked`](super::GitWriteback::retry_parked) did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RetryReport {
    /// Intents landed now (and removed): `(intent id, commit)`.
    pub landed: Vec<(String, String)>,
    /// Intents still parked: `(intent id, why)`.
    pub parked: Vec<(String, String)>,
}
