//! The blocking work of a write on an open checkout — commit it, push
//! it (catching up with a moved remote first when asked), prepare a
//! parked write's retry — each returning errors as text for the caller
//! to redact.

use std::time::Duration;

use crate::ports::writeback::WriteIntent;

use super::git::{self, Auth, Checkout, Op, PushFailure, RebaseFailure};
use super::{Identity, REMOTE};

/// What one push try came to.
pub(super) enum Step {
    /// On the remote: the tip pushed.
    Pushed { head: String, warnings: Vec<String> },
    /// Worth another try (rejected, unreachable): why.
    Retry {
        error: String,
        warnings: Vec<String>,
    },
    /// Not worth another (a rebase conflict): why.
    Stop { error: String },
}

/// One try: catch up with the remote when asked (fetch, rebase), then push.
pub(super) fn push_step(
    checkout: &Checkout,
    catch_up: bool,
    identity: &Identity,
    token: &str,
    user: &str,
) -> Step {
    let auth = Auth {
        remote: REMOTE,
        username: user,
        token,
    };
    let who = match signature(identity) {
        Ok(w) => w,
        Err(e) => return Step::Stop { error: e },
    };
    let mut warnings = Vec::new();
    if catch_up {
        let upstream = match checkout.fetch(&auth) {
            Ok(u) => u,
            Err(e) => {
                return Step::Retry {
                    error: format!("fetch from {REMOTE}: {}", e.message()),
                    warnings,
                }
            }
        };
        match checkout.rebase_onto(upstream, &who) {
            Ok(w) => warnings.extend(w),
            Err(RebaseFailure::Conflict(why)) => return Step::Stop { error: why },
            Err(RebaseFailure::Git(e)) => {
                return Step::Retry {
                    error: format!("rebase onto {REMOTE}: {}", e.message()),
                    warnings,
                }
            }
        }
    }
    match checkout.push(&auth) {
        Ok(()) => match checkout.head() {
            Ok(Some(head)) => Step::Pushed {
                head: head.to_string(),
                warnings,
            },
            Ok(None) => Step::Stop {
                error: "the branch has no commit".into(),
            },
            Err(e) => Step::Stop {
                error: e.message().to_string(),
            },
        },
        Err(PushFailure::Rejected(why)) => Step::Retry {
            error: format!("push to {REMOTE} rejected ({why}): the remote moved"),
            warnings,
        },
        Err(PushFailure::Failed(e)) => Step::Retry {
            error: format!("push to {REMOTE}: {}", e.message()),
            warnings,
        },
    }
}

/// Commits `intent` on the local branch: its commit and warnings.
pub(super) fn commit_intent(
    checkout: &Checkout,
    intent: &WriteIntent,
    identity: &Identity,
) -> Result<(String, Vec<String>), String> {
    let who = signature(identity)?;
    let op = Op {
        path: &intent.path,
        tree_path: checkout.tree_path(&intent.path),
        mode: intent.mode,
        content: &intent.content,
        run_id: &intent.run_id,
    };
    // Another process (a second host on this clone, a person's `git`) may
    // move the branch or hold a lock between our read and our write: the
    // commit is made again on the new tip, a few times.
    let mut tries = 0;
    loop {
        tries += 1;
        match checkout.commit(&op, &who) {
            Ok((id, w)) => return Ok((id.to_string(), w)),
            Err(e)
                if tries < LOCAL_COMMIT_TRIES
                    && matches!(
                        e.code(),
                        git2::ErrorCode::Modified | git2::ErrorCode::Locked
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(20 * u64::from(tries)));
            }
            Err(e) => return Err(format!("commit `{}`: {}", intent.path, e.message())),
        }
    }
}

/// Tries of a local commit that another process raced (then it is parked).
const LOCAL_COMMIT_TRIES: u32 = 5;

/// Before a parked write is pushed again: `Some(tip)` when the remote has
/// it already; else makes sure the local branch has it (committing it
/// again if it was lost) and answers `None`.
pub(super) fn prepare_retry(
    checkout: &Checkout,
    intent: &WriteIntent,
    identity: &Identity,
    token: &str,
    user: &str,
) -> Result<Option<String>, String> {
    let auth = Auth {
        remote: REMOTE,
        username: user,
        token,
    };
    let summary = git::summary(&intent.path, &intent.run_id);
    let upstream = checkout
        .fetch(&auth)
        .map_err(|e| format!("fetch from {REMOTE}: {}", e.message()))?;
    let search = |tip, hide| {
        checkout
            .has_commit(tip, hide, &summary)
            .map_err(|e| e.message().to_string())
    };
    if search(upstream, None)? {
        return Ok(upstream.map(|u| u.to_string()));
    }
    let head = checkout.head().map_err(|e| e.message().to_string())?;
    if !search(head, upstream)? {
        commit_intent(checkout, intent, identity)?;
    }
    Ok(None)
}

fn signature(identity: &Identity) -> Result<git2::Signature<'static>, String> {
    git2::Signature::now(&identity.name, &identity.email)
        .map_err(|e| format!("the commit identity: {}", e.message()))
}
