//! A stdio server's process: spawned in its own process group with a
//! parent-death signal and an allowlisted environment, its stderr tail kept,
//! its exit watched, and stopped by the sequence stdin closed → grace →
//! SIGTERM to the group → grace → SIGKILL.
//!
//! # Why `unsafe` here
//! Two things std and tokio do not offer safely: signalling a whole process
//! group (`killpg`, so a server's own children go with it) and asking the
//! kernel to kill the child when its parent dies (`prctl(PR_SET_PDEATHSIG)`,
//! which must run in the child between fork and exec: a `pre_exec` hook).
//! Both are single system calls on plain integers; the hook calls only
//! async-signal-safe functions and allocates nothing. This is the crate's
//! only `unsafe` code.
//!
//! # Parent death
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends,
//! not the process. Children are therefore forked on one keeper thread
//! that lives as long as the process, so the signal means "the host
//! process died". A child whose parent died before the hook ran exits at
//! once (the hook compares the parent pid). Elsewhere than Linux the child
//! notices its parent's death by EOF on stdin only.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

/// How a child ended: its exit code, `None` when a signal ended it.
pub(crate) type ExitCode = Option<i32>;

/// The last bytes a server wrote to stderr.
#[derive(Clone, Default)]
pub(crate) struct StderrTail {
    inner: Arc<Mutex<std::collections::VecDeque<u8>>>,
    cap: usize,
    secrets: Arc<Vec<String>>,
}

impl StderrTail {
    fn new(cap: usize, secrets: Vec<String>) -> Self {
        StderrTail {
            inner: Arc::default(),
            cap,
            secrets: Arc::new(secrets),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let Ok(mut q) = self.inner.lock() else { return };
        q.extend(bytes);
        let over = q.len().saturating_sub(self.cap);
        q.drain(..over);
    }

    /// The tail as text, secret values scrubbed.
    pub(crate) fn text(&self) -> String {
        let bytes: Vec<u8> = match self.inner.lock() {
            Ok(q) => q.iter().copied().collect(),
            Err(_) => Vec::new(),
        };
        super::env::scrub(&String::from_utf8_lossy(&bytes), &self.secrets)
    }
}

/// A running stdio server process (the pipes for its protocol are
/// returned beside it by [`spawn`]).
pub(crate) struct ServerProcess {
    pid: i32,
    exit: watch::Receiver<Option<ExitCode>>,
    pub(crate) stderr: StderrTail,
    /// The group was signalled to death already (by `stop` or `Drop`).
    reaped_group: bool,
}

/// A spawned server: its process and its stdout/stdin pipes.
pub(crate) type Spawned = (ServerProcess, ChildStdout, ChildStdin);

/// Starts `command` with exactly the environment `env`, in a process
/// group of its own, stderr kept (the last `tail` bytes, `secrets`
/// scrubbed).
pub(crate) async fn spawn(
    command: &[String],
    env: Vec<(String, String)>,
    tail: usize,
    secrets: Vec<String>,
) -> std::io::Result<Spawned> {
    let Some((program, args)) = command.split_first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ));
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    set_parent_death_signal(&mut cmd);
    let mut child = fork_on_keeper(cmd).await?;
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| std::io::Error::other("the child has no pid"))?;
    let (Some(stdin), Some(stdout), Some(mut err)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        kill_group(pid, libc::SIGKILL);
        return Err(std::io::Error::other("the child's pipes are missing"));
    };
    let stderr = StderrTail::new(tail, secrets);
    let sink = stderr.clone();
    // Read stderr to the end, whatever its volume: a full pipe would block
    // the server.
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            match err.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => sink.push(&buf[..n]),
            }
        }
    });
    let (tx, exit) = watch::channel(None);
    tokio::spawn(async move {
        let code = match child.wait().await {
            Ok(status) => status.code(),
            Err(_) => None,
        };
        let _ = tx.send(Some(code));
    });
    Ok((
        ServerProcess {
            pid,
            exit,
            stderr,
            reaped_group: false,
        },
        stdout,
        stdin,
    ))
}

impl ServerProcess {
    /// Resolves when the process has exited, with how.
    pub(crate) async fn exited(&self) -> ExitCode {
        self.on_exit().await
    }

    /// A future of the process's exit that borrows nothing (for a watcher
    /// task).
    pub(crate) fn on_exit(&self) -> impl std::future::Future<Output = ExitCode> + Send + 'static {
        let mut rx = self.exit.clone();
        async move {
            loop {
                if let Some(code) = *rx.borrow_and_update() {
                    return code;
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        }
    }

    /// Stops the process: the caller has closed its stdin already; waits
    /// `stdin_grace` for it to exit, then SIGTERMs its group, waits
    /// `term_grace`, then SIGKILLs the group. Whatever is left of the
    /// group after the leader exits is killed too.
    pub(crate) async fn stop(mut self, stdin_grace: Duration, term_grace: Duration) -> ExitCode {
        let code = match tokio::time::timeout(stdin_grace, self.exited()).await {
            Ok(code) => code,
            Err(_) => {
                kill_group(self.pid, libc::SIGTERM);
                match tokio::time::timeout(term_grace, self.exited()).await {
                    Ok(code) => code,
                    Err(_) => {
                        kill_group(self.pid, libc::SIGKILL);
                        self.exited().await
                    }
                }
            }
        };
        kill_group(self.pid, libc::SIGKILL);
        self.reaped_group = true;
        code
    }
}

impl Drop for ServerProcess {
    /// A process dropped without [`stop`](Self::stop) (its host dropped,
    /// its actor gone) is killed with its group at once: no orphan.
    fn drop(&mut self) {
        if !self.reaped_group {
            kill_group(self.pid, libc::SIGKILL);
        }
    }
}

/// Sends `signal` to process group `pgid` (an error — the group is gone —
/// is ignored).
#[allow(unsafe_code)]
fn kill_group(pgid: i32, signal: i32) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: `killpg` takes two integers and touches no memory of ours.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_parent_death_signal(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the hook runs in the forked child before exec; it calls only
    // `prctl`, `getppid` and `_exit`, which are async-signal-safe, and
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died between fork and prctl: go now.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

type ForkJob = Box<dyn FnOnce() + Send>;

/// Forks `cmd` on the keeper thread (see the module docs), in the caller's
/// tokio runtime (which reaps the child).
async fn fork_on_keeper(mut cmd: Command) -> std::io::Result<tokio::process::Child> {
    static KEEPER: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<ForkJob>>> =
        std::sync::OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<ForkJob>();
        let spawned = std::thread::Builder::new()
            .name("agentvisor-mcp-fork".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no fork thread: MCP servers are forked in place");
        }
        Mutex::new(tx)
    });
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: ForkJob = Box::new(move || {
        let _entered = handle.enter();
        let _ = tx.send(cmd.spawn());
    });
    let sent = match keeper.lock() {
        Ok(k) => k.send(job),
        Err(p) => p.into_inner().send(job),
    };
    match sent {
        Ok(()) => rx
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the fork thread is gone"))),
        Err(std::sync::mpsc::SendError(job)) => {
            // No keeper thread: fork here (the parent-death signal then
            // follows this thread).
            job();
            rx.await
                .unwrap_or_else(|_| Err(std::io::Error::other("fork failed")))
        }
    }
}
