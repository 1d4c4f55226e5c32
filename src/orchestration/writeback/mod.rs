//! The memory writeback of scheduled skills: a run's memory committed to
//! its skills repository and pushed to `origin`, without ever losing a
//! write.
//!
//! [`GitWriteback::write_memory`] writes one memory: it commits the file
//! (`append` adds the memory after a line break, `replace` makes it the
//! file) as a bot identity with the message `chore(agentvisor): update
//! PATH from run ID`, then pushes the branch to `origin` with a token read
//! from a secret. Without a token, or with `skip_push`, the commit stays
//! local and the outcome says why (with a warning).
//!
//! # Guarantees
//!
//! - **Serialized per repository.** Writes to one git repository (keyed by
//!   its working tree's canonical path) run one at a time in this
//!   process, whichever [`GitWriteback`] makes them; another process's
//!   commit is never overwritten (the branch moves by compare-and-swap).
//! - **A moved remote is caught up with.** A rejected push fetches, rebases
//!   the local commits onto the remote's tip — the writeback's own are
//!   re-applied (an append after the new tip's text, a replace over it),
//!   others cherry-picked — and tries again with a growing backoff, up to
//!   [`RetryPolicy::tries`].
//! - **Parked, never dropped.** A write that still does not land (the
//!   remote unreachable, the token refused, a conflicting local commit)
//!   is parked with its content as a [`WriteIntent`] in a
//!   [`WriteIntents`] store (SQLite by default) and the outcome is a
//!   partial failure. [`GitWriteback::retry_parked`] (at host start and
//!   periodically: [`GitWriteback::spawn_retries`]) lands parked writes —
//!   it first checks whether the remote has the write already, so a write
//!   lands once — and removes an intent only once its write is on the
//!   remote.
//! - **The token stays secret.** It is registered for redaction
//!   ([`crate::secrets`]) and replaced in every error libgit2 gives before
//!   the error reaches an outcome, a log line or a parked intent; an
//!   intent names the secret, never its value.
//!
//! What it must not touch: the run, its result or its records (the skill
//! run maps the outcome: [`WriteOutcome::writeback_sha`] and
//! [`WriteOutcome::partial_failure`]).
//!
//! Files: `git` (libgit2: the commit, push, fetch and rebase of one
//! checkout), `steps` (the blocking work of one try, on the blocking
//! pool), `policy` (identity, retries, the token), `outcome` (what a write
//! came to; errors); this file holds the writeback itself: the lock per
//! repository, the tries and their waits, parking and retrying parked
//! writes.

mod git;
mod hook;
mod outcome;
mod policy;
mod steps;

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use crate::ports::run::unix_ms;
use crate::ports::writeback::{WriteIntent, WriteIntentError, WriteIntents, WriteMode};
use crate::skills::{secret_variable, Schedule, SkillsRepo, WritebackMode};

use git::{Checkout, OpenFailure};
pub use outcome::{LocalReason, PushState, RetryReport, WriteOutcome, WritebackError};
pub use policy::{GitToken, Identity, PushPolicy, RetryPolicy, DEFAULT_TOKEN_SECRET, REMOTE};
use steps::{commit_intent, prepare_retry, push_step, Step};

/// Writes skills' memory into git repositories (see the module doc).
pub struct GitWriteback {
    intents: Arc<dyn WriteIntents>,
    identity: Identity,
    retry: RetryPolicy,
    username: String,
}

impl std::fmt::Debug for GitWriteback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitWriteback")
            .field("identity", &self.identity)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl GitWriteback {
    /// A writeback that parks writes that do not land in `intents`, with
    /// the default identity and retries.
    pub fn new(intents: Arc<dyn WriteIntents>) -> GitWriteback {
        GitWriteback {
            intents,
            identity: Identity::default(),
            retry: RetryPolicy::default(),
            username: "x-access-token".into(),
        }
    }

    /// Commits as `identity`.
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identity = identity;
        self
    }

    /// Retries pushes as `retry` says.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = RetryPolicy {
            tries: retry.tries.max(1),
            ..retry
        };
        self
    }

    /// The user name sent with the token (`x-access-token`, which GitHub
    /// takes; GitLab takes `oauth2`). A user name in the remote's URL wins.
    pub fn token_user(mut self, user: &str) -> Self {
        self.username = user.to_string();
        self
    }

    /// The intent store.
    pub fn intents(&self) -> &Arc<dyn WriteIntents> {
        &self.intents
    }

    /// Writes `content` (a run's memory) to `path` of the skills
    /// repository at `repo` as `mode` says, commits it as run `run_id`'s,
    /// and pushes it as `push` says. Bad input (a path outside the
    /// repository, no git repository, a detached HEAD) is an error and
    /// changes nothing; a write that does not land is parked and the
    /// outcome says so ([`WriteOutcome::partial_failure`]).
    pub async fn write_memory(
        &self,
        repo: &Path,
        path: &str,
        mode: WritebackMode,
        content: &str,
        run_id: &str,
        push: &PushPolicy,
    ) -> Result<WriteOutcome, WritebackError> {
        let path = normalize(path)?;
        let root = canonical_root(repo)?;
        let mode = match mode {
            WritebackMode::Append => WriteMode::Append,
            WritebackMode::Replace => WriteMode::Replace,
        };
        let intent = WriteIntent {
            id: format!("{run_id}:{path}"),
            repo: root.display().to_string(),
            path: path.clone(),
            mode,
            content: content.to_string(),
            run_id: run_id.to_string(),
            token_secret: push.token.as_ref().map(|t| t.secret.clone()),
            parked_at_ms: unix_ms(),
            attempts: 1,
            last_error: String::new(),
        };
        let token = push.token.as_ref().map(|t| t.value.as_str());
        let checkout = open(&root)?;
        let lock = repo_lock(&checkout.workdir);
        let _serial = lock.lock().await;
        let (checkout, committed) = {
            let (identity, intent) = (self.identity.clone(), intent.clone());
            blocking(move || {
                let r = commit_intent(&checkout, &intent, &identity);
                (checkout, r)
            })
            .await
        };
        let (sha, mut warnings) = match committed {
            Ok(c) => c,
            Err(e) => {
                let error = scrub(&e, token);
                return self.park(intent, None, error, Vec::new()).await;
            }
        };
        let Some(token) = push.token.as_ref().filter(|_| !push.skip_push) else {
            let reason = if push.skip_push {
                LocalReason::SkipPush
            } else {
                let variable = secret_variable(&push.secret);
                let warning = format!(
                    "no push token: commit {sha} of `{path}` stays local (set {variable} to push it to {REMOTE})"
                );
                tracing::warn!(repo = %root.display(), %path, %sha, "{warning}");
                warnings.push(warning);
                LocalReason::NoToken
            };
            return Ok(WriteOutcome {
                sha: Some(sha),
                push: PushState::Local { reason },
                warnings,
            });
        };
        match self.land(checkout, &token.value, false).await {
            Ok((sha, tries, more)) => {
                warnings.extend(more);
                Ok(WriteOutcome {
                    sha: Some(sha),
                    push: PushState::Pushed { tries },
                    warnings,
                })
            }
            Err((head, error, more)) => {
                warnings.extend(more);
                self.park(intent, head.or(Some(sha)), error, warnings).await
            }
        }
    }

    /// A skill run's writeback in one call: `memory` of run `run_id`
    /// written as `schedule`'s `writeback:` says, into `repo`, pushed with
    /// the token of secret [`DEFAULT_TOKEN_SECRET`] read through `lookup`
    /// unless `skip_push`. `None` when the schedule has no writeback or
    /// has it `enabled: false` (nothing to do, not a failure).
    pub async fn write_schedule_memory(
        &self,
        repo: &SkillsRepo,
        schedule: &Schedule,
        memory: &str,
        run_id: &str,
        skip_push: bool,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Option<Result<WriteOutcome, WritebackError>> {
        let w = schedule.settings.writeback.as_ref().filter(|w| w.enabled)?;
        let push = PushPolicy::from_secret(DEFAULT_TOKEN_SECRET, skip_push, lookup);
        Some(
            self.write_memory(&repo.root, &w.path, w.mode, memory, run_id, &push)
                .await,
        )
    }

    /// Tries to land every parked write, oldest first, reading each one's
    /// token through `lookup` (`std::env::var` outside tests). A write
    /// the remote has already is removed without a new commit; one that
    /// lands is removed; one that does not stays parked with its new error.
    pub async fn retry_parked(
        &self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<RetryReport, WriteIntentError> {
        let mut report = RetryReport::default();
        for intent in self.intents.parked().await? {
            match self.retry_one(&intent, &lookup).await {
                Ok(sha) => {
                    self.intents.resolve(&intent.id).await?;
                    tracing::info!(intent = %intent.id, %sha, "parked memory write landed");
                    report.landed.push((intent.id, sha));
                }
                Err(error) => {
                    self.intents.record_attempt(&intent.id, &error).await?;
                    tracing::warn!(intent = %intent.id, %error, "parked memory write still does not land");
                    report.parked.push((intent.id, error));
                }
            }
        }
        Ok(report)
    }

    /// Calls [`GitWriteback::retry_parked`] now and every `every` after,
    /// until the task is aborted.
    pub fn spawn_retries(
        self: &Arc<Self>,
        every: Duration,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = this.retry_parked(&lookup).await {
                    tracing::warn!(error = %e, "parked memory writes could not be read");
                }
            }
        })
    }

    /// One parked write: landed already, or committed again if the local
    /// branch lost it, then pushed. Answers the commit, or why not.
    async fn retry_one(
        &self,
        intent: &WriteIntent,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> Result<String, String> {
        let secret = intent
            .token_secret
            .clone()
            .unwrap_or_else(|| DEFAULT_TOKEN_SECRET.into());
        let variable = secret_variable(&secret);
        let Some(token) = lookup(&variable).filter(|v| !v.is_empty()) else {
            return Err(format!("no push token: set {variable}"));
        };
        let token = GitToken::new(&secret, &token);
        let checkout = open(Path::new(&intent.repo)).map_err(|e| e.to_string())?;
        let lock = repo_lock(&checkout.workdir);
        let _serial = lock.lock().await;
        let (checkout, state) = {
            let (intent, identity, value, user) = (
                intent.clone(),
                self.identity.clone(),
                token.value.clone(),
                self.username.clone(),
            );
            blocking(move || {
                let r = prepare_retry(&checkout, &intent, &identity, &value, &user);
                (checkout, r)
            })
            .await
        };
        match state {
            Err(e) => Err(scrub(&e, Some(&token.value))),
            Ok(Some(sha)) => Ok(sha),
            Ok(None) => self
                .land(checkout, &token.value, true)
                .await
                .map(|(sha, _, _)| sha)
                .map_err(|(_, e, _)| e),
        }
    }

    /// Pushes the branch, fetching and rebasing when the remote moved, up
    /// to the policy's tries. Answers the pushed tip, the tries and
    /// warnings, or the local tip, the last error (redacted) and warnings.
    #[allow(clippy::type_complexity)]
    async fn land(
        &self,
        checkout: Checkout,
        token: &str,
        fetch_first: bool,
    ) -> Result<(String, u32, Vec<String>), (Option<String>, String, Vec<String>)> {
        let mut checkout = checkout;
        let mut warnings = Vec::new();
        let mut catch_up = fetch_first;
        let mut last = String::new();
        for attempt in 1..=self.retry.tries {
            if attempt > 1 {
                tokio::time::sleep(self.retry.wait_before(attempt)).await;
            }
            let (identity, value, user) = (
                self.identity.clone(),
                token.to_string(),
                self.username.clone(),
            );
            let (back, step) = blocking(move || {
                let r = push_step(&checkout, catch_up, &identity, &value, &user);
                (checkout, r)
            })
            .await;
            checkout = back;
            match step {
                Step::Pushed { head, warnings: w } => {
                    warnings.extend(w);
                    return Ok((head, attempt, warnings));
                }
                Step::Retry { error, warnings: w } => {
                    warnings.extend(w);
                    last = scrub(&error, Some(token));
                    catch_up = true;
                }
                Step::Stop { error } => {
                    last = scrub(&error, Some(token));
                    break;
                }
            }
        }
        let head = checkout.head().ok().flatten().map(|h| h.to_string());
        tracing::warn!(repo = %checkout.workdir.display(), error = %last, "memory write did not land");
        Err((head, last, warnings))
    }

    /// Parks `intent` after `error`; the outcome of a write that did not land.
    async fn park(
        &self,
        mut intent: WriteIntent,
        sha: Option<String>,
        error: String,
        warnings: Vec<String>,
    ) -> Result<WriteOutcome, WritebackError> {
        intent.last_error.clone_from(&error);
        if let Err(store) = self.intents.park(&intent).await {
            return Err(WritebackError::NotParked {
                path: intent.path,
                run_id: intent.run_id,
                error,
                store,
            });
        }
        tracing::warn!(intent = %intent.id, %error, "memory write parked");
        Ok(WriteOutcome {
            sha,
            push: PushState::Parked {
                intent_id: intent.id,
                error,
            },
            warnings,
        })
    }
}

/// `path` as a `/`-separated path inside the repository.
fn normalize(path: &str) -> Result<String, WritebackError> {
    let bad = |why| WritebackError::InvalidPath {
        path: path.to_string(),
        why,
    };
    if path.trim().is_empty() {
        return Err(bad("empty"));
    }
    let mut parts: Vec<String> = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(p) => {
                parts.push(p.to_str().ok_or_else(|| bad("not UTF-8"))?.to_string())
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(bad("`..` climbs out of the repository"));
                }
            }
            _ => {
                return Err(bad(
                    "an absolute path: name a file relative to the repository",
                ))
            }
        }
    }
    if parts.is_empty() {
        return Err(bad("names the repository itself, not a file"));
    }
    if parts.iter().any(|p| p == ".git") {
        return Err(bad("inside `.git`"));
    }
    Ok(parts.join("/"))
}

fn canonical_root(repo: &Path) -> Result<PathBuf, WritebackError> {
    repo.canonicalize()
        .map_err(|e| WritebackError::NotARepository {
            repo: repo.display().to_string(),
            reason: e.to_string(),
        })
}

fn open(root: &Path) -> Result<Checkout, WritebackError> {
    let repo = root.display().to_string();
    Checkout::open(root).map_err(|e| match e {
        OpenFailure::NotARepository(reason) => WritebackError::NotARepository { repo, reason },
        OpenFailure::Bare => WritebackError::NotARepository {
            repo,
            reason: "a bare repository has no working tree".into(),
        },
        OpenFailure::Detached => WritebackError::DetachedHead { repo },
    })
}

/// The process-wide lock of the git repository at `workdir`.
fn repo_lock(workdir: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: LazyLock<std::sync::Mutex<HashMap<PathBuf, Weak<tokio::sync::Mutex<()>>>>> =
        LazyLock::new(Default::default);
    let mut locks = LOCKS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(lock) = locks.get(workdir).and_then(Weak::upgrade) {
        return lock;
    }
    locks.retain(|_, w| w.strong_count() > 0);
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    locks.insert(workdir.to_path_buf(), Arc::downgrade(&lock));
    lock
}

/// `text` with the token (as given and as percent-encoded) and every
/// registered secret replaced by `[REDACTED]`.
fn scrub(text: &str, token: Option<&str>) -> String {
    let mut out = text.to_string();
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        out = out.replace(token, crate::secrets::REDACTED);
        let encoded: String = token
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        out = out.replace(&encoded, crate::secrets::REDACTED);
    }
    crate::secrets::redact_string(out)
}

/// Runs blocking git work on tokio's blocking pool. The work returns the
/// checkout it was handed, so a panic in it (libgit2 does not panic; the
/// bindings should not) is re-raised here rather than hidden.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_confined_and_normalized() {
        assert_eq!(normalize("memory/./a.md").unwrap(), "memory/a.md");
        assert_eq!(normalize("x/../a.md").unwrap(), "a.md");
        for bad in ["", "/etc/passwd", "../a.md", "a/../..", ".", ".git/config"] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
        let e = normalize("../x").unwrap_err().to_string();
        assert!(e.contains("../x") && e.contains("climbs out"), "{e}");
    }

    #[test]
    fn the_token_is_scrubbed_as_given_and_percent_encoded() {
        let t = "tok en/with+sign-123";
        let text = format!("https://u:{t}@h/ and https://u:tok%20en%2Fwith%2Bsign-123@h/");
        let out = scrub(&text, Some(t));
        assert!(
            !out.contains("tok en") && !out.contains("tok%20en"),
            "{out}"
        );
        assert_eq!(out.matches(crate::secrets::REDACTED).count(), 2, "{out}");
    }
}
