//! The git side of the writeback, through libgit2 (`git2`): every call
//! here blocks, so the module above runs them on tokio's blocking pool,
//! one repository at a time.
//!
//! A write is a commit made in the object database (the file's new blob,
//! the tree updated at one path, a commit on the branch's tip), then the
//! working tree is moved to it with a *safe* checkout (files changed by
//! hand are left alone, and said so) and the branch moved with a
//! compare-and-swap on its old tip, so a commit made meanwhile by another
//! process is never overwritten.
//!
//! A rejected push is met with a fetch and a rebase of the local commits
//! onto the remote's tip. The writeback's own commits are *re-applied*
//! rather than merged: an append adds its entry after the new tip's text,
//! a replace writes its content over it; both are told by the trailers
//! their messages carry. Any other local commit is cherry-picked (a
//! three-way merge); one that conflicts stops the rebase, and nothing is
//! moved.

use std::path::{Path, PathBuf};

use git2::build::TreeUpdateBuilder;
use git2::{
    Commit, CredentialType, ErrorCode, FetchOptions, ObjectType, Oid, PushOptions, RemoteCallbacks,
    Repository, Signature, Sort,
};

use crate::ports::writeback::WriteMode;

/// The trailer that names a writeback commit's mode.
pub(super) const MODE_TRAILER: &str = "Agentvisor-Writeback-Mode";

/// The trailer that names the file a writeback commit wrote (its path in
/// the git tree, which differs from the message's when the skills
/// repository is a folder of a larger git repository).
pub(super) const PATH_TRAILER: &str = "Agentvisor-Writeback-Path";

/// How deep a search for an already-landed write goes.
const LANDED_SEARCH_DEPTH: usize = 10_000;

/// One memory write.
pub(super) struct Op<'a> {
    /// The file, relative to the skills repository (as the message says it).
    pub(super) path: &'a str,
    /// The file's path in the git tree (`/`-separated).
    pub(super) tree_path: String,
    /// Append or replace.
    pub(super) mode: WriteMode,
    /// The memory text.
    pub(super) content: &'a str,
    /// The run that wrote it.
    pub(super) run_id: &'a str,
}

impl Op<'_> {
    /// The commit's subject: `chore(agentvisor): update PATH from run ID`.
    pub(super) fn summary(&self) -> String {
        summary(self.path, self.run_id)
    }

    fn message(&self) -> String {
        format!(
            "{}\n\n{MODE_TRAILER}: {}\n{PATH_TRAILER}: {}\n",
            self.summary(),
            self.mode.as_str(),
            self.tree_path
        )
    }
}

/// The subject of the commit that writes `path` from run `run_id`.
pub(super) fn summary(path: &str, run_id: &str) -> String {
    format!("chore(agentvisor): update {path} from run {run_id}")
}

/// The file's new bytes: `old` with `content` appended (after a line
/// break when `old` does not end with one), or `content` alone; either
/// way ending with a line break.
pub(super) fn apply(old: &[u8], mode: WriteMode, content: &str) -> Vec<u8> {
    let mut out = match mode {
        WriteMode::Append => {
            let mut out = Vec::with_capacity(old.len() + content.len() + 2);
            out.extend_from_slice(old);
            if !out.is_empty() && !out.ends_with(b"\n") {
                out.push(b'\n');
            }
            out
        }
        WriteMode::Replace => Vec::with_capacity(content.len() + 1),
    };
    out.extend_from_slice(content.as_bytes());
    if !content.ends_with('\n') {
        out.push(b'\n');
    }
    out
}

/// What an append commit added: its content, as given to [`apply`], when
/// `new` is `old` with something appended.
fn appended<'a>(old: &[u8], new: &'a [u8]) -> Option<&'a str> {
    let rest = new.strip_prefix(old)?;
    let rest = if !old.is_empty() && !old.ends_with(b"\n") {
        rest.strip_prefix(b"\n")?
    } else {
        rest
    };
    let rest = rest.strip_suffix(b"\n").unwrap_or(rest);
    std::str::from_utf8(rest).ok()
}

/// Why a push did not land.
pub(super) enum PushFailure {
    /// The remote refused it: its branch moved (fetch, rebase, try again).
    Rejected(String),
    /// Anything else: unreachable, refused credentials, a remote error.
    Failed(git2::Error),
}

/// Why a rebase stopped.
pub(super) enum RebaseFailure {
    /// A local commit does not apply on the remote's tip (it names it).
    Conflict(String),
    /// libgit2 failed.
    Git(git2::Error),
}

impl From<git2::Error> for RebaseFailure {
    fn from(e: git2::Error) -> Self {
        RebaseFailure::Git(e)
    }
}

/// Why a repository cannot take writes at all.
pub(super) enum OpenFailure {
    /// Not inside a git repository, or unreadable.
    NotARepository(String),
    /// A bare repository (no working tree).
    Bare,
    /// HEAD names no branch.
    Detached,
}

/// How to authenticate to the remote.
pub(super) struct Auth<'a> {
    /// The remote's name (`origin`).
    pub(super) remote: &'a str,
    /// The user name given with the token.
    pub(super) username: &'a str,
    /// The token.
    pub(super) token: &'a str,
}

impl Auth<'_> {
    /// Callbacks that answer one credential request with the token and
    /// refuse a second (libgit2 asks again when the first is refused).
    fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut callbacks = RemoteCallbacks::new();
        let mut asked = false;
        let (user, token) = (self.username, self.token);
        callbacks.credentials(move |_url, from_url, allowed| {
            if asked {
                return Err(git2::Error::from_str(
                    "the remote refused the push token (check its scope and expiry)",
                ));
            }
            asked = true;
            if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) {
                git2::Cred::userpass_plaintext(from_url.unwrap_or(user), token)
            } else {
                Err(git2::Error::from_str(
                    "the remote asks for credentials other than a token (an ssh key?): use an https remote",
                ))
            }
        });
        callbacks
    }
}

/// A working clone open for writing, on a branch.
pub(super) struct Checkout {
    repo: Repository,
    /// The working tree's root, canonical (the lock's key).
    pub(super) workdir: PathBuf,
    /// The skills repository's folder inside the working tree (`""` at
    /// its root), `/`-separated.
    prefix: String,
    /// The local branch (`refs/heads/NAME`).
    branch: String,
    /// The remote branch's name (the upstream's, or the local one's).
    remote_branch: String,
}

impl Checkout {
    /// Opens the git repository that holds `skills_root` (canonical).
    pub(super) fn open(skills_root: &Path) -> Result<Checkout, OpenFailure> {
        let repo = Repository::discover(skills_root)
            .map_err(|e| OpenFailure::NotARepository(e.message().to_string()))?;
        let workdir = repo.workdir().ok_or(OpenFailure::Bare)?;
        let workdir = workdir
            .canonicalize()
            .map_err(|e| OpenFailure::NotARepository(e.to_string()))?;
        let prefix = skills_root
            .strip_prefix(&workdir)
            .map_err(|_| {
                OpenFailure::NotARepository(format!(
                    "{} is not inside the working tree {}",
                    skills_root.display(),
                    workdir.display()
                ))
            })?
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        let head = repo
            .find_reference("HEAD")
            .map_err(|e| OpenFailure::NotARepository(e.message().to_string()))?;
        let branch = match head.symbolic_target().ok().flatten() {
            Some(target) if target.starts_with("refs/heads/") => target.to_string(),
            _ => return Err(OpenFailure::Detached),
        };
        let short = branch.trim_start_matches("refs/heads/").to_string();
        let remote_branch = repo
            .config()
            .ok()
            .and_then(|c| c.get_string(&format!("branch.{short}.merge")).ok())
            .map(|m| m.trim_start_matches("refs/heads/").to_string())
            .unwrap_or(short);
        drop(head);
        Ok(Checkout {
            repo,
            workdir,
            prefix,
            branch,
            remote_branch,
        })
    }

    /// `path` (relative to the skills repository, normalized) in the git tree.
    pub(super) fn tree_path(&self, path: &str) -> String {
        if self.prefix.is_empty() {
            path.to_string()
        } else {
            format!("{}/{path}", self.prefix)
        }
    }

    /// The local branch's tip (none on an unborn branch).
    pub(super) fn head(&self) -> Result<Option<Oid>, git2::Error> {
        match self.repo.refname_to_id(&self.branch) {
            Ok(id) => Ok(Some(id)),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The remote-tracking branch's tip, as last fetched.
    fn tracking(&self, remote: &str) -> Result<Option<Oid>, git2::Error> {
        let name = format!("refs/remotes/{remote}/{}", self.remote_branch);
        match self.repo.refname_to_id(&name) {
            Ok(id) => Ok(Some(id)),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Commits `op` on the branch's tip and moves the branch (and the
    /// working tree) to it. Answers the commit and any warning.
    pub(super) fn commit(
        &self,
        op: &Op<'_>,
        who: &Signature<'_>,
    ) -> Result<(Oid, Vec<String>), git2::Error> {
        let old = self.head()?;
        let parent = old.map(|id| self.repo.find_commit(id)).transpose()?;
        let before = self.file_at(parent.as_ref(), &op.tree_path)?;
        let bytes = apply(before.as_deref().unwrap_or_default(), op.mode, op.content);
        let new = self.commit_file(
            parent.as_ref(),
            &op.tree_path,
            &bytes,
            who,
            who,
            &op.message(),
        )?;
        let warnings = self.advance(old, new)?;
        Ok((new, warnings))
    }

    /// The bytes of `path` at `commit` (none when it has no such file).
    fn file_at(
        &self,
        commit: Option<&Commit<'_>>,
        path: &str,
    ) -> Result<Option<Vec<u8>>, git2::Error> {
        let Some(commit) = commit else {
            return Ok(None);
        };
        let entry = match commit.tree()?.get_path(Path::new(path)) {
            Ok(e) => e,
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if entry.kind() != Some(ObjectType::Blob) {
            return Err(git2::Error::from_str(&format!(
                "`{path}` is not a file in the repository (a folder or a submodule)"
            )));
        }
        let blob = entry.to_object(&self.repo)?.peel_to_blob()?;
        Ok(Some(blob.content().to_vec()))
    }

    /// A commit on `parent` whose tree is the parent's with `path` set to
    /// `bytes`. Moves nothing.
    fn commit_file(
        &self,
        parent: Option<&Commit<'_>>,
        path: &str,
        bytes: &[u8],
        author: &Signature<'_>,
        committer: &Signature<'_>,
        message: &str,
    ) -> Result<Oid, git2::Error> {
        let base = match parent {
            Some(p) => p.tree()?,
            None => {
                let empty = self.repo.treebuilder(None)?.write()?;
                self.repo.find_tree(empty)?
            }
        };
        let blob = self.repo.blob(bytes)?;
        let tree = TreeUpdateBuilder::new()
            .upsert(path, blob, git2::FileMode::Blob)
            .create_updated(&self.repo, &base)?;
        let tree = self.repo.find_tree(tree)?;
        let parents: Vec<&Commit<'_>> = parent.into_iter().collect();
        self.repo
            .commit(None, author, committer, message, &tree, &parents)
    }

    /// Moves the working tree (safely) and the branch from `old` to
    /// `new`. The branch moves only if it is still at `old`; a working
    /// tree that cannot be moved (files changed by hand) is a warning.
    fn advance(&self, old: Option<Oid>, new: Oid) -> Result<Vec<String>, git2::Error> {
        let mut warnings = Vec::new();
        // Checked out while HEAD is still the old tip: it is the baseline,
        // so a file that differs from it was changed by hand and is kept.
        let target = self.repo.find_commit(new)?;
        let mut opts = git2::build::CheckoutBuilder::new();
        opts.safe();
        if let Err(e) = self.repo.checkout_tree(target.as_object(), Some(&mut opts)) {
            warnings.push(format!(
                "the working tree {} was not updated ({}): the commit is on the branch; \
                 `git status` shows the difference",
                self.workdir.display(),
                e.message()
            ));
        }
        let log = "agentvisor: memory writeback";
        match old {
            Some(old) => self
                .repo
                .reference_matching(&self.branch, new, true, old, log)?,
            None => self.repo.reference(&self.branch, new, false, log)?,
        };
        Ok(warnings)
    }

    /// Pushes the local branch to the remote's branch (a fast-forward only).
    pub(super) fn push(&self, auth: &Auth<'_>) -> Result<(), PushFailure> {
        let mut remote = self
            .repo
            .find_remote(auth.remote)
            .map_err(PushFailure::Failed)?;
        let mut rejected: Option<String> = None;
        let result = {
            let mut callbacks = auth.callbacks();
            callbacks.push_update_reference(|_, status| {
                if let Some(why) = status {
                    rejected = Some(why.to_string());
                }
                Ok(())
            });
            let mut opts = PushOptions::new();
            opts.remote_callbacks(callbacks);
            let spec = format!("{}:refs/heads/{}", self.branch, self.remote_branch);
            remote.push(&[spec.as_str()], Some(&mut opts))
        };
        match result {
            Err(e) if e.code() == ErrorCode::NotFastForward => {
                Err(PushFailure::Rejected(e.message().to_string()))
            }
            Err(e) => Err(PushFailure::Failed(e)),
            Ok(()) => match rejected {
                Some(why) => Err(PushFailure::Rejected(why)),
                None => Ok(()),
            },
        }
    }

    /// Fetches the remote's branch; answers its tip (none when the remote
    /// has no such branch yet).
    pub(super) fn fetch(&self, auth: &Auth<'_>) -> Result<Option<Oid>, git2::Error> {
        let mut remote = self.repo.find_remote(auth.remote)?;
        let mut opts = FetchOptions::new();
        opts.remote_callbacks(auth.callbacks());
        let spec = format!(
            "+refs/heads/{rb}:refs/remotes/{remote}/{rb}",
            rb = self.remote_branch,
            remote = auth.remote
        );
        match remote.fetch(&[spec.as_str()], Some(&mut opts), None) {
            Ok(()) => {}
            // An empty remote, or one without the branch yet.
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        self.tracking(auth.remote)
    }

    /// Whether a commit with subject `summary` is among the first
    /// commits of `tip`'s history, not counting those of `hide`'s.
    pub(super) fn has_commit(
        &self,
        tip: Option<Oid>,
        hide: Option<Oid>,
        summary: &str,
    ) -> Result<bool, git2::Error> {
        let Some(tip) = tip else {
            return Ok(false);
        };
        let mut walk = self.repo.revwalk()?;
        walk.push(tip)?;
        if let Some(hide) = hide {
            walk.hide(hide)?;
        }
        for id in walk.take(LANDED_SEARCH_DEPTH) {
            let commit = self.repo.find_commit(id?)?;
            if commit.summary().ok().flatten() == Some(summary) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Rebases the local branch onto `upstream` (the remote's tip) and
    /// moves the branch and the working tree there; answers any warning.
    pub(super) fn rebase_onto(
        &self,
        upstream: Option<Oid>,
        who: &Signature<'_>,
    ) -> Result<Vec<String>, RebaseFailure> {
        let (Some(local), Some(upstream)) = (self.head()?, upstream) else {
            return Ok(Vec::new());
        };
        if local == upstream {
            return Ok(Vec::new());
        }
        let base = match self.repo.merge_base(local, upstream) {
            Ok(b) => b,
            Err(e) if e.code() == ErrorCode::NotFound => {
                return Err(RebaseFailure::Conflict(
                    "the local branch and the remote's share no history".into(),
                ))
            }
            Err(e) => return Err(e.into()),
        };
        if base == upstream {
            return Ok(Vec::new()); // ahead: a push is a fast-forward
        }
        if base == local {
            return Ok(self.advance(Some(local), upstream)?); // behind
        }
        let mut walk = self.repo.revwalk()?;
        walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
        walk.push(local)?;
        walk.hide(upstream)?;
        let mut tip = self.repo.find_commit(upstream)?;
        for id in walk {
            let commit = self.repo.find_commit(id?)?;
            let next = self.replay(&commit, &tip, who)?;
            tip = self.repo.find_commit(next)?;
        }
        Ok(self.advance(Some(local), tip.id())?)
    }

    /// `commit` replayed on `onto`: re-applied when it is a writeback's,
    /// cherry-picked otherwise.
    fn replay(
        &self,
        commit: &Commit<'_>,
        onto: &Commit<'_>,
        who: &Signature<'_>,
    ) -> Result<Oid, RebaseFailure> {
        let name = commit
            .summary()
            .ok()
            .flatten()
            .unwrap_or_default()
            .to_string();
        if commit.parent_count() != 1 {
            return Err(RebaseFailure::Conflict(format!(
                "local commit {} (`{name}`) is a merge: rebase it by hand",
                commit.id()
            )));
        }
        let message = commit.message_raw().unwrap_or_default();
        if let Some((mode, path)) = writeback_trailers(message) {
            let parent = commit.parent(0)?;
            let old = self.file_at(Some(&parent), &path)?.unwrap_or_default();
            let new = self.file_at(Some(commit), &path)?.unwrap_or_default();
            let tip = self.file_at(Some(onto), &path)?.unwrap_or_default();
            let bytes = match mode {
                WriteMode::Replace => Some(new),
                WriteMode::Append => {
                    appended(&old, &new).map(|c| apply(&tip, WriteMode::Append, c))
                }
            };
            if let Some(bytes) = bytes {
                return Ok(self.commit_file(
                    Some(onto),
                    &path,
                    &bytes,
                    &commit.author(),
                    who,
                    message,
                )?);
            }
        }
        let mut index = self.repo.cherrypick_commit(commit, onto, 0, None)?;
        if index.has_conflicts() {
            return Err(RebaseFailure::Conflict(format!(
                "local commit {} (`{name}`) conflicts with the remote's changes: rebase it by hand",
                commit.id()
            )));
        }
        let tree = self.repo.find_tree(index.write_tree_to(&self.repo)?)?;
        Ok(self
            .repo
            .commit(None, &commit.author(), who, message, &tree, &[onto])?)
    }
}

/// A writeback commit's mode and tree path, from its trailers.
fn writeback_trailers(message: &str) -> Option<(WriteMode, String)> {
    let mut mode = None;
    let mut path = None;
    for line in message.lines() {
        if let Some(v) = line
            .strip_prefix(MODE_TRAILER)
            .and_then(|r| r.strip_prefix(": "))
        {
            mode = v.trim().parse().ok();
        } else if let Some(v) = line
            .strip_prefix(PATH_TRAILER)
            .and_then(|r| r.strip_prefix(": "))
        {
            path = Some(v.trim().to_string());
        }
    }
    Some((mode?, path?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_separates_with_one_line_break_and_ends_with_one() {
        assert_eq!(apply(b"", WriteMode::Append, "a"), b"a\n");
        assert_eq!(apply(b"a\n", WriteMode::Append, "b"), b"a\nb\n");
        assert_eq!(apply(b"a", WriteMode::Append, "b\n"), b"a\nb\n");
        assert_eq!(apply(b"old\n", WriteMode::Replace, "new"), b"new\n");
    }

    #[test]
    fn an_append_is_read_back_from_its_commit() {
        for (old, content) in [("", "x"), ("a\n", "b"), ("a", "two\nlines")] {
            let new = apply(old.as_bytes(), WriteMode::Append, content);
            assert_eq!(appended(old.as_bytes(), &new), Some(content), "{old:?}");
        }
        assert_eq!(appended(b"abc", b"xyz"), None);
    }

    #[test]
    fn trailers_name_mode_and_path() {
        let m = "chore(agentvisor): update m.md from run r\n\nAgentvisor-Writeback-Mode: replace\nAgentvisor-Writeback-Path: s/m.md\n";
        assert_eq!(
            writeback_trailers(m),
            Some((WriteMode::Replace, "s/m.md".to_string()))
        );
        assert_eq!(writeback_trailers("fix: something"), None);
    }
}
