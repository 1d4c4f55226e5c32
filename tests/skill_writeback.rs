//! The git writeback of skills' memory (`agentvisor::writeback`), against
//! real repositories made in each test with libgit2: a bare repository as
//! `origin` and clones of it as the skills repositories. No network.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::writeback::{WriteIntents, WriteMode};
use agentvisor::skills::WritebackMode;
use agentvisor::stores::{MemoryWriteIntents, SqliteStore};
use agentvisor::writeback::{
    GitWriteback, LocalReason, PushPolicy, PushState, RetryPolicy, WriteOutcome,
};
use support::scratch::Scratch;

const TOKEN: &str = "tok-writeback-7f3a9c1e55";

/// A bare `origin` with one commit on `main` (a README), in `dir`.
fn origin(dir: &Scratch) -> PathBuf {
    let bare = dir.path("origin.git");
    let mut opts = git2::RepositoryInitOptions::new();
    opts.bare(true).initial_head("main");
    git2::Repository::init_opts(&bare, &opts).unwrap();
    let seed = clone(&bare, &dir.path("seed"));
    commit_file(&seed, "README.md", "skills\n", "initial");
    push(&seed);
    bare
}

/// A clone of `origin` at `to` (its skills repository).
fn clone(origin: &Path, to: &Path) -> PathBuf {
    let mut opts = git2::RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = git2::Repository::init_opts(to, &opts).unwrap();
    repo.remote("origin", origin.to_str().unwrap()).unwrap();
    let mut remote = repo.find_remote("origin").unwrap();
    remote
        .fetch(&["+refs/heads/*:refs/remotes/origin/*"], None, None)
        .unwrap();
    if let Ok(tip) = repo.refname_to_id("refs/remotes/origin/main") {
        repo.reference("refs/heads/main", tip, true, "clone")
            .unwrap();
        let mut co = git2::build::CheckoutBuilder::new();
        co.force();
        repo.checkout_head(Some(&mut co)).unwrap();
    }
    to.to_path_buf()
}

/// Commits `text` to `file` in the clone at `at` as a person would.
fn commit_file(at: &Path, file: &str, text: &str, message: &str) -> git2::Oid {
    let repo = git2::Repository::open(at).unwrap();
    let full = at.join(file);
    std::fs::create_dir_all(full.parent().unwrap()).unwrap();
    std::fs::write(&full, text).unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new(file)).unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let who = git2::Signature::now("Person", "person@example.com").unwrap();
    let parent = repo.head().ok().map(|h| h.peel_to_commit().unwrap());
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    repo.commit(Some("HEAD"), &who, &who, message, &tree, &parents)
        .unwrap()
}

/// Pushes `main` of the clone at `at` to its origin.
fn push(at: &Path) {
    let repo = git2::Repository::open(at).unwrap();
    let mut remote = repo.find_remote("origin").unwrap();
    remote
        .push(&["refs/heads/main:refs/heads/main"], None)
        .unwrap();
}

/// `file` on `main` of the bare repository.
fn on_origin(origin: &Path, file: &str) -> Option<String> {
    let repo = git2::Repository::open_bare(origin).unwrap();
    let tree = repo
        .revparse_single("refs/heads/main")
        .unwrap()
        .peel_to_tree()
        .unwrap();
    let entry = tree.get_path(Path::new(file)).ok()?;
    let blob = entry.to_object(&repo).unwrap().peel_to_blob().unwrap();
    Some(String::from_utf8(blob.content().to_vec()).unwrap())
}

/// `main`'s tip of the repository at `at` (bare or not).
fn tip(at: &Path) -> String {
    let repo = git2::Repository::open(at).unwrap();
    repo.refname_to_id("refs/heads/main").unwrap().to_string()
}

fn token() -> PushPolicy {
    PushPolicy::from_secret("git_token", false, |v| {
        (v == "AGENTVISOR_SECRET_GIT_TOKEN").then(|| TOKEN.to_string())
    })
}

/// Retries quick enough for a test (the waits are real: libgit2 works on
/// real files), with jitter as in production.
fn quick() -> RetryPolicy {
    RetryPolicy {
        tries: 30,
        backoff: Duration::from_millis(2),
        max_backoff: Duration::from_millis(40),
    }
}

fn writeback() -> GitWriteback {
    GitWriteback::new(Arc::new(MemoryWriteIntents::new())).retry(quick())
}

fn pushed(o: &WriteOutcome) -> u32 {
    match &o.push {
        PushState::Pushed { tries } => *tries,
        other => panic!("not pushed: {other:?} ({o:?})"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_and_replace_land_on_origin_as_the_bot() {
    let dir = Scratch::new("wb-modes");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    let wb = writeback();
    let path = "memory/digest.md";
    let first = wb
        .write_memory(
            &repo,
            path,
            WritebackMode::Append,
            "day 1: 3 changes",
            "run-a",
            &token(),
        )
        .await
        .unwrap();
    assert_eq!(pushed(&first), 1);
    assert!(
        !first.partial_failure() && first.warnings.is_empty(),
        "{first:?}"
    );
    let second = wb
        .write_memory(
            &repo,
            path,
            WritebackMode::Append,
            "day 2: 1 change",
            "run-b",
            &token(),
        )
        .await
        .unwrap();
    assert_eq!(
        on_origin(&origin, path).unwrap(),
        "day 1: 3 changes\nday 2: 1 change\n"
    );
    assert_eq!(second.writeback_sha(), Some(tip(&origin).as_str()));
    // The working tree follows the branch.
    assert_eq!(
        std::fs::read_to_string(repo.join(path)).unwrap(),
        "day 1: 3 changes\nday 2: 1 change\n"
    );

    let git = git2::Repository::open_bare(&origin).unwrap();
    let commit = git
        .find_commit(git2::Oid::from_str(second.sha.as_deref().unwrap()).unwrap())
        .unwrap();
    assert_eq!(
        commit.summary().unwrap(),
        Some("chore(agentvisor): update memory/digest.md from run run-b")
    );
    assert_eq!(commit.author().name().ok(), Some("agentvisor"));
    assert_eq!(commit.author().email().ok(), Some("agentvisor@localhost"));
    assert_eq!(
        commit.committer().email().ok(),
        Some("agentvisor@localhost")
    );
    assert_eq!(commit.parent_count(), 1);
    assert_eq!(commit.parent_id(0).unwrap().to_string(), first.sha.unwrap());

    let third = wb
        .write_memory(
            &repo,
            path,
            WritebackMode::Replace,
            "all caught up",
            "run-c",
            &token(),
        )
        .await
        .unwrap();
    assert_eq!(pushed(&third), 1);
    assert_eq!(on_origin(&origin, path).unwrap(), "all caught up\n");
    // The rest of the tree is kept.
    assert_eq!(on_origin(&origin, "README.md").unwrap(), "skills\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_identity_signs_the_commit() {
    let dir = Scratch::new("wb-identity");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    let wb = writeback().identity(agentvisor::writeback::Identity {
        name: "memory-bot".into(),
        email: "bot@example.org".into(),
    });
    let out = wb
        .write_memory(&repo, "m.md", WritebackMode::Append, "x", "run-1", &token())
        .await
        .unwrap();
    let git = git2::Repository::open_bare(&origin).unwrap();
    let commit = git
        .find_commit(git2::Oid::from_str(out.sha.as_deref().unwrap()).unwrap())
        .unwrap();
    assert_eq!(commit.author().name().ok(), Some("memory-bot"));
    assert_eq!(commit.author().email().ok(), Some("bot@example.org"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_commit_stays_local_with_a_warning() {
    let dir = Scratch::new("wb-no-token");
    let origin = origin(&dir);
    let before = tip(&origin);
    let repo = clone(&origin, &dir.path("skills"));
    let no_token = PushPolicy::from_secret("memory_push", false, |_| None);
    let out = writeback()
        .write_memory(
            &repo,
            "m.md",
            WritebackMode::Append,
            "kept here",
            "run-1",
            &no_token,
        )
        .await
        .unwrap();
    assert_eq!(
        out.push,
        PushState::Local {
            reason: LocalReason::NoToken
        }
    );
    assert!(!out.partial_failure());
    assert_eq!(out.warnings.len(), 1, "{out:?}");
    assert!(
        out.warnings[0].contains("AGENTVISOR_SECRET_MEMORY_PUSH"),
        "{}",
        out.warnings[0]
    );
    assert_eq!(tip(&origin), before, "nothing was pushed");
    assert_eq!(out.writeback_sha(), Some(tip(&repo).as_str()));
    assert_eq!(
        std::fs::read_to_string(repo.join("m.md")).unwrap(),
        "kept here\n"
    );

    // The next write with a token pushes both.
    let next = writeback()
        .write_memory(
            &repo,
            "m.md",
            WritebackMode::Append,
            "and pushed",
            "run-2",
            &token(),
        )
        .await
        .unwrap();
    assert_eq!(pushed(&next), 1);
    assert_eq!(
        on_origin(&origin, "m.md").unwrap(),
        "kept here\nand pushed\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_push_commits_without_pushing_even_with_a_token() {
    let dir = Scratch::new("wb-skip");
    let origin = origin(&dir);
    let before = tip(&origin);
    let repo = clone(&origin, &dir.path("skills"));
    let mut policy = token();
    policy.skip_push = true;
    let out = writeback()
        .write_memory(
            &repo,
            "m.md",
            WritebackMode::Replace,
            "local",
            "run-1",
            &policy,
        )
        .await
        .unwrap();
    assert_eq!(
        out.push,
        PushState::Local {
            reason: LocalReason::SkipPush
        }
    );
    assert!(out.warnings.is_empty() && !out.partial_failure(), "{out:?}");
    assert_eq!(tip(&origin), before);
    assert_eq!(out.writeback_sha(), Some(tip(&repo).as_str()));
}

/// Fifty writers at once on one clone: the process serializes them, so
/// none is ever rejected, and every entry lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_writes_to_one_repository_all_land() {
    let dir = Scratch::new("wb-fifty");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    let wb = Arc::new(writeback());
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (wb, repo) = (Arc::clone(&wb), repo.clone());
        tasks.push(tokio::spawn(async move {
            wb.write_memory(
                &repo,
                "memory/log.md",
                WritebackMode::Append,
                &format!("entry {i}"),
                &format!("run-{i}"),
                &token(),
            )
            .await
            .unwrap()
        }));
    }
    for t in tasks {
        assert_eq!(
            pushed(&t.await.unwrap()),
            1,
            "a serialized write is never rejected"
        );
    }
    let text = on_origin(&origin, "memory/log.md").unwrap();
    for i in 0..50 {
        assert_eq!(
            text.lines().filter(|l| *l == format!("entry {i}")).count(),
            1,
            "entry {i} in:\n{text}"
        );
    }
    assert_eq!(text.lines().count(), 50);
}

/// Fifty writers at once on two clones of one origin (two hosts): each
/// clone's writes are serialized, and the clones race on the remote, so
/// pushes are rejected and rebased; every entry still lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_writes_from_two_clones_all_land() {
    let dir = Scratch::new("wb-two-clones");
    let origin = origin(&dir);
    let clones = [
        clone(&origin, &dir.path("host-a")),
        clone(&origin, &dir.path("host-b")),
    ];
    // A clone that keeps losing the race tries again until the other's
    // queue is drained: generous tries, so a slow machine parks nothing.
    let wb = Arc::new(
        GitWriteback::new(Arc::new(MemoryWriteIntents::new())).retry(RetryPolicy {
            tries: 200,
            backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(100),
        }),
    );
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (wb, repo) = (Arc::clone(&wb), clones[i % 2].clone());
        tasks.push(tokio::spawn(async move {
            wb.write_memory(
                &repo,
                "memory/log.md",
                WritebackMode::Append,
                &format!("entry {i}"),
                &format!("run-{i}"),
                &token(),
            )
            .await
            .unwrap()
        }));
    }
    let mut rejected = 0;
    for t in tasks {
        rejected += pushed(&t.await.unwrap()) - 1;
    }
    let text = on_origin(&origin, "memory/log.md").unwrap();
    for i in 0..50 {
        assert_eq!(
            text.lines().filter(|l| *l == format!("entry {i}")).count(),
            1,
            "entry {i} in:\n{text}"
        );
    }
    assert_eq!(text.lines().count(), 50);
    println!("two clones: {rejected} pushes rejected and rebased");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_rejected_because_the_remote_moved_is_rebased_and_pushed() {
    let dir = Scratch::new("wb-rejected");
    let origin = origin(&dir);
    let ours = clone(&origin, &dir.path("ours"));
    let theirs = clone(&origin, &dir.path("theirs"));
    let wb = writeback();

    // Another clone pushes first: a memory entry and a change of its own.
    wb.write_memory(
        &theirs,
        "m.md",
        WritebackMode::Append,
        "theirs 1",
        "run-t",
        &token(),
    )
    .await
    .unwrap();
    commit_file(&theirs, "notes.txt", "their notes\n", "docs: notes");
    push(&theirs);
    // Ours has a local commit of a person's, not pushed yet.
    commit_file(&ours, "local.txt", "mine\n", "chore: local file");

    let out = wb
        .write_memory(
            &ours,
            "m.md",
            WritebackMode::Append,
            "ours 1",
            "run-o",
            &token(),
        )
        .await
        .unwrap();
    assert!(pushed(&out) >= 2, "the first push was rejected: {out:?}");
    assert_eq!(on_origin(&origin, "m.md").unwrap(), "theirs 1\nours 1\n");
    assert_eq!(on_origin(&origin, "notes.txt").unwrap(), "their notes\n");
    assert_eq!(on_origin(&origin, "local.txt").unwrap(), "mine\n");
    assert_eq!(out.writeback_sha(), Some(tip(&origin).as_str()));
    assert_eq!(
        tip(&ours),
        tip(&origin),
        "the local branch is the pushed one"
    );
    assert_eq!(
        std::fs::read_to_string(ours.join("notes.txt")).unwrap(),
        "their notes\n",
        "the working tree has the remote's changes"
    );

    // A replace over a moved remote: the replacement wins on the new tip.
    wb.write_memory(
        &theirs,
        "m.md",
        WritebackMode::Append,
        "theirs 2",
        "run-t2",
        &token(),
    )
    .await
    .unwrap();
    let out = wb
        .write_memory(
            &ours,
            "m.md",
            WritebackMode::Replace,
            "fresh",
            "run-o2",
            &token(),
        )
        .await
        .unwrap();
    assert!(pushed(&out) >= 2);
    assert_eq!(on_origin(&origin, "m.md").unwrap(), "fresh\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_origin_parks_the_write_until_a_retry_lands_it() {
    let dir = Scratch::new("wb-park");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    let db = dir.path("agentvisor.db");
    // Origin goes away (moved aside), as an unreachable remote would.
    let away = dir.path("origin-away.git");
    std::fs::rename(&origin, &away).unwrap();

    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let wb = GitWriteback::new(store.clone()).retry(RetryPolicy {
        tries: 3,
        ..quick()
    });
    let out = wb
        .write_memory(
            &repo,
            "memory/m.md",
            WritebackMode::Append,
            "must not be lost",
            "run-p",
            &token(),
        )
        .await
        .unwrap();
    assert!(out.partial_failure(), "{out:?}");
    let PushState::Parked { intent_id, error } = &out.push else {
        panic!("{out:?}")
    };
    assert_eq!(intent_id, "run-p:memory/m.md");
    assert!(error.contains("origin"), "{error}");
    assert_eq!(
        out.writeback_sha(),
        Some(tip(&repo).as_str()),
        "committed locally"
    );
    store.close().await;
    drop((wb, store));

    // The intent survives reopening the file.
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let parked = store.parked().await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].content, "must not be lost");
    assert_eq!(parked[0].mode, WriteMode::Append);
    assert_eq!(parked[0].token_secret.as_deref(), Some("git_token"));

    // Still unreachable: it stays parked, one more attempt counted.
    let wb = GitWriteback::new(store.clone()).retry(RetryPolicy {
        tries: 2,
        ..quick()
    });
    let lookup = |v: &str| (v == "AGENTVISOR_SECRET_GIT_TOKEN").then(|| TOKEN.to_string());
    let report = wb.retry_parked(lookup).await.unwrap();
    assert!(
        report.landed.is_empty() && report.parked.len() == 1,
        "{report:?}"
    );
    assert_eq!(store.parked().await.unwrap()[0].attempts, 2);

    // Origin is back: the retry lands it, once, and removes the intent.
    std::fs::rename(&away, &origin).unwrap();
    let report = wb.retry_parked(lookup).await.unwrap();
    assert_eq!(report.landed.len(), 1, "{report:?}");
    assert_eq!(
        on_origin(&origin, "memory/m.md").unwrap(),
        "must not be lost\n"
    );
    assert!(store.parked().await.unwrap().is_empty());
    let again = wb.retry_parked(lookup).await.unwrap();
    assert!(again.landed.is_empty() && again.parked.is_empty());
    assert_eq!(
        on_origin(&origin, "memory/m.md").unwrap(),
        "must not be lost\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_write_whose_local_commit_was_lost_is_written_again() {
    let dir = Scratch::new("wb-lost");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    let git = git2::Repository::open(&repo).unwrap();
    git.remote_set_url("origin", dir.path("nowhere.git").to_str().unwrap())
        .unwrap();
    let store = Arc::new(MemoryWriteIntents::new());
    let wb = GitWriteback::new(store.clone()).retry(RetryPolicy {
        tries: 1,
        ..quick()
    });
    let out = wb
        .write_memory(
            &repo,
            "m.md",
            WritebackMode::Append,
            "from the intent",
            "run-l",
            &token(),
        )
        .await
        .unwrap();
    assert!(out.partial_failure());
    // Someone resets the clone to origin: the local commit is gone.
    let base = git.revparse_single("refs/remotes/origin/main").unwrap();
    git.reset(&base, git2::ResetType::Hard, None).unwrap();
    git.remote_set_url("origin", origin.to_str().unwrap())
        .unwrap();

    let report = wb.retry_parked(|_| Some(TOKEN.to_string())).await.unwrap();
    assert_eq!(report.landed.len(), 1, "{report:?}");
    assert_eq!(on_origin(&origin, "m.md").unwrap(), "from the intent\n");
    assert!(store.parked().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_never_reaches_an_error_or_a_parked_intent() {
    let dir = Scratch::new("wb-token");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    // A remote whose path holds the token, so libgit2's error names it.
    let git = git2::Repository::open(&repo).unwrap();
    // (A folder that is no repository: libgit2 says its path.)
    let leaky = dir.path(&format!("{TOKEN}/origin.git"));
    std::fs::create_dir_all(&leaky).unwrap();
    git.remote_set_url("origin", leaky.to_str().unwrap())
        .unwrap();
    let store = Arc::new(MemoryWriteIntents::new());
    let wb = GitWriteback::new(store.clone()).retry(RetryPolicy {
        tries: 2,
        ..quick()
    });
    let out = wb
        .write_memory(&repo, "m.md", WritebackMode::Append, "x", "run-s", &token())
        .await
        .unwrap();
    let PushState::Parked { error, .. } = &out.push else {
        panic!("{out:?}")
    };
    assert!(
        error.contains("[REDACTED]"),
        "the path was named, redacted: {error}"
    );
    let shown = format!("{out:?} {}", serde_json::to_string(&out).unwrap());
    assert!(!shown.contains(TOKEN), "{shown}");
    let parked = store.parked().await.unwrap();
    assert!(!format!("{parked:?}").contains(TOKEN));
    assert!(
        !parked[0].last_error.contains(TOKEN),
        "{}",
        parked[0].last_error
    );

    let report = wb.retry_parked(|_| Some(TOKEN.to_string())).await.unwrap();
    assert!(!format!("{report:?}").contains(TOKEN), "{report:?}");
    assert!(!store.parked().await.unwrap()[0].last_error.contains(TOKEN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_what_is_wrong() {
    let dir = Scratch::new("wb-bad");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    let wb = writeback();
    let e = wb
        .write_memory(
            &repo,
            "../escape.md",
            WritebackMode::Append,
            "x",
            "r",
            &token(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("../escape.md") && e.contains("climbs out"),
        "{e}"
    );
    let plain = dir.path("not-git");
    std::fs::create_dir_all(&plain).unwrap();
    let e = wb
        .write_memory(&plain, "m.md", WritebackMode::Append, "x", "r", &token())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("not in a git repository"), "{e}");
    let git = git2::Repository::open(&repo).unwrap();
    let head = git.head().unwrap().target().unwrap();
    git.set_head_detached(head).unwrap();
    let e = wb
        .write_memory(&repo, "m.md", WritebackMode::Append, "x", "r", &token())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("detached"), "{e}");
    assert!(
        wb.intents().parked().await.unwrap().is_empty(),
        "bad input parks nothing"
    );
}

/// A skills repository that is a folder of a larger git repository: the
/// path is the skills repository's, the commit changes the folder's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skills_folder_inside_a_git_repository_writes_under_it() {
    let dir = Scratch::new("wb-subdir");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("work"));
    let skills = repo.join("examples/skills");
    std::fs::create_dir_all(&skills).unwrap();
    let out = writeback()
        .write_memory(
            &skills,
            "memory/m.md",
            WritebackMode::Append,
            "nested",
            "run-n",
            &token(),
        )
        .await
        .unwrap();
    assert_eq!(pushed(&out), 1);
    assert_eq!(
        on_origin(&origin, "examples/skills/memory/m.md").unwrap(),
        "nested\n"
    );
    assert!(on_origin(&origin, "memory/m.md").is_none());
}

/// A loopback HTTP remote that asks for credentials and refuses them:
/// the token goes out as the password of `x-access-token` (Basic), and
/// the refusal parks the write without the token in its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_style_remote_gets_the_token_as_basic_credentials() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = Scratch::new("wb-http");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let server = {
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = conn.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_string();
                            buf.drain(..end + 4);
                            seen.lock().unwrap().push(head);
                            let reply = "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: 0\r\n\r\n";
                            if conn.write_all(reply.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        })
    };
    let git = git2::Repository::open(&repo).unwrap();
    git.remote_set_url("origin", &format!("http://127.0.0.1:{port}/skills.git"))
        .unwrap();
    let wb = GitWriteback::new(Arc::new(MemoryWriteIntents::new())).retry(RetryPolicy {
        tries: 1,
        ..quick()
    });
    let out = wb
        .write_memory(&repo, "m.md", WritebackMode::Append, "x", "run-h", &token())
        .await
        .unwrap();
    server.abort();
    let PushState::Parked { error, .. } = &out.push else {
        panic!("{out:?}")
    };
    assert!(!error.contains(TOKEN), "{error}");
    assert!(error.contains("refused the push token"), "{error}");
    let expected = format!(
        "authorization: basic {}",
        base64(&format!("x-access-token:{TOKEN}"))
    )
    .to_ascii_lowercase();
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter()
            .any(|h| h.to_ascii_lowercase().lines().any(|l| l == expected)),
        "no request carried the token: {seen:?}"
    );
}

/// Standard base64 with padding.
fn base64(text: &str) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn both_intent_stores_keep_the_port_s_promises() {
    use agentvisor::ports::writeback::WriteIntent;
    let dir = Scratch::new("wb-intents");
    let sqlite = Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap());
    let stores: [Arc<dyn WriteIntents>; 2] = [Arc::new(MemoryWriteIntents::new()), sqlite];
    for store in stores {
        let intent = |id: &str, content: &str| WriteIntent {
            id: id.into(),
            repo: "/r".into(),
            path: "m.md".into(),
            mode: WriteMode::Replace,
            content: content.into(),
            run_id: id.into(),
            token_secret: None,
            parked_at_ms: 1,
            attempts: 1,
            last_error: "first".into(),
        };
        store.park(&intent("b", "one")).await.unwrap();
        store.park(&intent("a", "two")).await.unwrap();
        // Parked again: the first content stays, the attempt counts.
        store.park(&intent("b", "other")).await.unwrap();
        assert!(store.record_attempt("a", "again").await.unwrap());
        assert!(!store.record_attempt("zz", "x").await.unwrap());
        let all = store.parked().await.unwrap();
        let ids: Vec<&str> = all.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["b", "a"], "oldest first");
        assert_eq!((all[0].content.as_str(), all[0].attempts), ("one", 2));
        assert_eq!((all[1].last_error.as_str(), all[1].attempts), ("again", 2));
        assert_eq!(all[1].mode, WriteMode::Replace);
        assert!(store.resolve("b").await.unwrap());
        assert!(!store.resolve("b").await.unwrap());
        assert_eq!(store.parked().await.unwrap().len(), 1);
    }
}

/// An origin with no commit yet, cloned: the first write makes the
/// branch, locally and on the remote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_write_to_an_empty_repository_makes_its_branch() {
    let dir = Scratch::new("wb-empty");
    let bare = dir.path("origin.git");
    let mut opts = git2::RepositoryInitOptions::new();
    opts.bare(true).initial_head("main");
    git2::Repository::init_opts(&bare, &opts).unwrap();
    let repo = clone(&bare, &dir.path("skills"));
    let out = writeback()
        .write_memory(
            &repo,
            "m.md",
            WritebackMode::Append,
            "first",
            "run-1",
            &token(),
        )
        .await
        .unwrap();
    assert_eq!(pushed(&out), 1);
    assert_eq!(on_origin(&bare, "m.md").unwrap(), "first\n");
    assert_eq!(tip(&repo), tip(&bare));
    assert_eq!(
        std::fs::read_to_string(repo.join("m.md")).unwrap(),
        "first\n"
    );
}

/// A memory file changed by hand in the working tree is left alone: the
/// write lands on the branch and the remote, with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_by_hand_is_kept_and_the_write_still_lands() {
    let dir = Scratch::new("wb-dirty");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    commit_file(&repo, "m.md", "one\n", "memory: start");
    std::fs::write(repo.join("m.md"), "one\nedited by hand\n").unwrap();
    let out = writeback()
        .write_memory(
            &repo,
            "m.md",
            WritebackMode::Append,
            "two",
            "run-d",
            &token(),
        )
        .await
        .unwrap();
    assert_eq!(pushed(&out), 1);
    assert_eq!(on_origin(&origin, "m.md").unwrap(), "one\ntwo\n");
    assert_eq!(
        std::fs::read_to_string(repo.join("m.md")).unwrap(),
        "one\nedited by hand\n"
    );
    assert!(
        out.warnings.iter().any(|w| w.contains("working tree")),
        "{out:?}"
    );
}

/// `spawn_retries` tries parked writes at once (host start), then every
/// period: on a paused clock, a write parked later lands at the next tick.
#[tokio::test(start_paused = true)]
async fn spawned_retries_land_parked_writes_at_start_and_each_period() {
    let dir = Scratch::new("wb-spawned");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    let git = git2::Repository::open(&repo).unwrap();
    let store = Arc::new(MemoryWriteIntents::new());
    let wb = Arc::new(GitWriteback::new(store.clone()).retry(RetryPolicy {
        tries: 1,
        ..quick()
    }));
    let park = |run: &'static str| {
        let (wb, repo) = (Arc::clone(&wb), repo.clone());
        async move {
            let out = wb
                .write_memory(&repo, "m.md", WritebackMode::Append, run, run, &token())
                .await
                .unwrap();
            assert!(out.partial_failure(), "{out:?}");
        }
    };
    let nowhere = dir.path("nowhere.git");
    git.remote_set_url("origin", nowhere.to_str().unwrap())
        .unwrap();
    park("run-1").await;
    git.remote_set_url("origin", origin.to_str().unwrap())
        .unwrap();

    let every = Duration::from_secs(600);
    let task = wb.spawn_retries(every, |_| Some(TOKEN.to_string()));
    // The first round runs at once.
    let mut rounds = 0;
    while !store.parked().await.unwrap().is_empty() {
        rounds += 1;
        assert!(rounds < 1000, "the first round did not land the write");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(on_origin(&origin, "m.md").unwrap(), "run-1\n");
    let started = tokio::time::Instant::now();

    git.remote_set_url("origin", nowhere.to_str().unwrap())
        .unwrap();
    park("run-2").await;
    git.remote_set_url("origin", origin.to_str().unwrap())
        .unwrap();
    while !store.parked().await.unwrap().is_empty() {
        assert!(
            started.elapsed() < every * 2,
            "no round landed the write within two periods"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        started.elapsed() >= every - Duration::from_secs(2),
        "landed by the next period's round, not before: {:?}",
        started.elapsed()
    );
    assert_eq!(on_origin(&origin, "m.md").unwrap(), "run-1\nrun-2\n");
    task.abort();
}

/// A schedule's `writeback:` in one call: the run's memory lands where the
/// schedule says; a schedule without one (or with `enabled: false`) does
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_s_writeback_is_one_call() {
    let dir = Scratch::new("wb-schedule");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills"));
    std::fs::create_dir_all(repo.join("skills/digest")).unwrap();
    std::fs::write(
        repo.join("skills/digest/SKILL.md"),
        "---\nname: digest\n---\nWrite the digest.\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("agentvisor.yaml"),
        "skills:\n  digest: skills/digest\nschedules:\n  - name: daily\n    skill: digest\n    cron: \"@daily\"\n    model: scripted\n    script: [{ text: hi }]\n    writeback: { path: memory/digest.md, mode: replace }\n  - name: off\n    skill: digest\n    cron: \"@daily\"\n    model: scripted\n    script: [{ text: hi }]\n    writeback: { enabled: false, path: memory/off.md }\n  - name: none\n    skill: digest\n    cron: \"@daily\"\n    model: scripted\n    script: [{ text: hi }]\n",
    )
    .unwrap();
    let skills = agentvisor::skills::SkillsRepo::open(&repo).unwrap();
    let wb = writeback();
    let lookup = |v: &str| (v == "AGENTVISOR_SECRET_GIT_TOKEN").then(|| TOKEN.to_string());
    let out = wb
        .write_schedule_memory(
            &skills,
            skills.schedule("daily").unwrap(),
            "today",
            "run-s1",
            false,
            lookup,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pushed(&out), 1);
    assert_eq!(on_origin(&origin, "memory/digest.md").unwrap(), "today\n");
    for name in ["off", "none"] {
        let schedule = skills.schedule(name).unwrap();
        assert!(wb
            .write_schedule_memory(&skills, schedule, "x", "run-s2", false, lookup)
            .await
            .is_none());
    }
    let local = wb
        .write_schedule_memory(
            &skills,
            skills.schedule("daily").unwrap(),
            "later",
            "run-s3",
            true,
            lookup,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        local.push,
        PushState::Local {
            reason: LocalReason::SkipPush
        }
    );
}

/// Writes kept local (no token) wait for the next push; when the remote
/// moved meanwhile, each is re-applied after the remote's entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_writes_waiting_for_a_push_are_re_applied_on_a_moved_remote() {
    let dir = Scratch::new("wb-waiting");
    let origin = origin(&dir);
    let ours = clone(&origin, &dir.path("ours"));
    let theirs = clone(&origin, &dir.path("theirs"));
    let wb = writeback();
    let no_token = PushPolicy::from_secret("git_token", false, |_| None);
    for (i, entry) in ["ours 1", "ours 2"].into_iter().enumerate() {
        let out = wb
            .write_memory(
                &ours,
                "m.md",
                WritebackMode::Append,
                entry,
                &format!("run-o{i}"),
                &no_token,
            )
            .await
            .unwrap();
        assert!(matches!(out.push, PushState::Local { .. }));
    }
    wb.write_memory(
        &theirs,
        "m.md",
        WritebackMode::Append,
        "theirs",
        "run-t",
        &token(),
    )
    .await
    .unwrap();
    let out = wb
        .write_memory(
            &ours,
            "m.md",
            WritebackMode::Append,
            "ours 3",
            "run-o3",
            &token(),
        )
        .await
        .unwrap();
    assert!(pushed(&out) >= 2, "{out:?}");
    assert_eq!(
        on_origin(&origin, "m.md").unwrap(),
        "theirs\nours 1\nours 2\nours 3\n"
    );
    // Each write is still its own commit, with its own message.
    let git = git2::Repository::open_bare(&origin).unwrap();
    let mut walk = git.revwalk().unwrap();
    walk.push_ref("refs/heads/main").unwrap();
    let summaries: Vec<String> = walk
        .take(4)
        .map(|id| {
            let c = git.find_commit(id.unwrap()).unwrap();
            c.summary().unwrap().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        summaries,
        [
            "chore(agentvisor): update m.md from run run-o3",
            "chore(agentvisor): update m.md from run run-o1",
            "chore(agentvisor): update m.md from run run-o0",
            "chore(agentvisor): update m.md from run run-t",
        ]
    );
}

/// A person's local commit that conflicts with the remote's changes stops
/// the rebase at once: nothing is moved, the write is parked (no retry
/// can settle a conflict), and its error says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_local_commit_parks_the_write_with_what_to_do() {
    let dir = Scratch::new("wb-conflict");
    let origin = origin(&dir);
    let ours = clone(&origin, &dir.path("ours"));
    let theirs = clone(&origin, &dir.path("theirs"));
    commit_file(&theirs, "README.md", "their readme\n", "docs: theirs");
    push(&theirs);
    commit_file(&ours, "README.md", "our readme\n", "docs: ours");
    let remote_tip = tip(&origin);
    let store = Arc::new(MemoryWriteIntents::new());
    let wb = GitWriteback::new(store.clone()).retry(quick());
    let out = wb
        .write_memory(
            &ours,
            "m.md",
            WritebackMode::Append,
            "kept",
            "run-c",
            &token(),
        )
        .await
        .unwrap();
    let PushState::Parked { error, .. } = &out.push else {
        panic!("{out:?}")
    };
    assert!(
        error.contains("docs: ours") && error.contains("by hand"),
        "{error}"
    );
    assert_eq!(tip(&origin), remote_tip, "nothing pushed");
    assert_eq!(store.parked().await.unwrap()[0].content, "kept");
    assert_eq!(
        std::fs::read_to_string(ours.join("README.md")).unwrap(),
        "our readme\n"
    );
}

/// `agentvisor skill run` end to end: the run's memory is appended to the
/// writeback file, committed as the bot and pushed to `origin`, and the
/// result names the commit; a second run appends again on top.
#[test]
fn skill_run_writes_the_memory_back_and_pushes_it() {
    let dir = Scratch::new("skill-run-writeback");
    let origin = origin(&dir);
    let repo = clone(&origin, &dir.path("skills-repo"));
    let yaml = "skills: { a: skills/a }\nschedules:\n  - name: s\n    skill: a\n    cron: \"0 * * * *\"\n    model: scripted\n    script: [{ text: \"done <memory>learned one thing</memory>\" }]\n    writeback: { path: memory/a.md, mode: append }\n";
    std::fs::create_dir_all(repo.join("skills/a")).unwrap();
    std::fs::write(
        repo.join("skills/a/SKILL.md"),
        "---\nname: a\n---\nDo it.\n",
    )
    .unwrap();
    std::fs::write(repo.join("agentvisor.yaml"), yaml).unwrap();
    commit_file(&repo, ".gitignore", "*.db*\n", "the skill");
    push(&repo);
    let db = dir.arg("a.db");
    let run = || {
        let out = support::cli::command(&[
            "skill",
            "run",
            repo.to_str().unwrap(),
            "--schedule",
            "s",
            "--json",
            "--db",
            &db,
        ])
        .env("AGENTVISOR_SECRET_GIT_TOKEN", TOKEN)
        .output()
        .unwrap();
        support::cli::ok_json(&out)
    };
    let first = run();
    assert_eq!(first["outcome"], "succeeded", "{first:#}");
    let sha = first["writeback_sha"]
        .as_str()
        .expect("a commit")
        .to_string();
    assert_eq!(tip(&origin), sha, "pushed");
    assert_eq!(
        on_origin(&origin, "memory/a.md").as_deref(),
        Some("learned one thing\n")
    );
    let second = run();
    assert_eq!(second["outcome"], "succeeded", "{second:#}");
    assert_ne!(second["writeback_sha"], first["writeback_sha"]);
    let memory = on_origin(&origin, "memory/a.md").unwrap();
    assert_eq!(memory.matches("learned one thing").count(), 2, "{memory}");
    let head = git2::Repository::open_bare(&origin).unwrap();
    let commit = head
        .revparse_single("refs/heads/main")
        .unwrap()
        .peel_to_commit()
        .unwrap();
    assert_eq!(commit.author().name().unwrap(), "agentvisor");
    assert!(commit
        .summary()
        .unwrap()
        .unwrap()
        .starts_with("chore(agentvisor): update memory/a.md from run "));
    assert!(!String::from_utf8_lossy(&serde_json::to_vec(&second).unwrap()).contains(TOKEN));
}
