//! A stdio server's process: spawned in its own process group under a
//! guard that kills the group when the host dies, with an allowlisted
//! environment, its stderr tail kept, its exit watched, and stopped by the
//! sequence stdin closed → grace → SIGTERM to the group → grace → SIGKILL.
//!
//! # Why `unsafe` here
//! Three things std and tokio do not offer safely: signalling a whole
//! process group (`killpg`, so a server's own children go with it), asking
//! the kernel for a signal when a parent dies (`prctl(PR_SET_PDEATHSIG)`)
//! and forking the guard, both of which must run in the child between fork
//! and exec (a `pre_exec` hook). All are system calls on plain integers and
//! stack values; the hook calls only async-signal-safe functions and
//! allocates nothing. This is the crate's only `unsafe` code.
//!
#![doc = include_str!("../../docs/mcp-process.md")]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

/// How a child ended: its exit code, `None` when a signal ended it.
pub(crate) type ExitCode = Option<i32>;

/// The last bytes a server wrote to stderr.
#[derive(Clone)]
pub(crate) struct StderrTail {
    inner: Arc<Mutex<std::collections::VecDeque<u8>>>,
    cap: usize,
    secrets: Arc<Vec<String>>,
    /// Becomes `true` when the stream has ended (every writer closed it).
    ended: watch::Receiver<bool>,
}

impl StderrTail {
    /// A tail and the sender its reader says "ended" with.
    fn new(cap: usize, secrets: Vec<String>) -> (Self, watch::Sender<bool>) {
        let (tx, ended) = watch::channel(false);
        let tail = StderrTail {
            inner: Arc::default(),
            cap,
            secrets: Arc::new(secrets),
            ended,
        };
        (tail, tx)
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

    /// The tail once the stream has ended, or once `limit` has passed (a
    /// descendant that left the process group may hold it open): what a
    /// server says as it exits arrives after its pipes may have closed.
    pub(crate) async fn last_words(&self, limit: Duration) -> String {
        let mut ended = self.ended.clone();
        let _ = tokio::time::timeout(limit, ended.wait_for(|e| *e)).await;
        self.text()
    }
}

/// A running stdio server process (the pipes for its protocol are
/// returned beside it by [`spawn`]).
pub(crate) struct ServerProcess {
    /// The host's child: on Linux the guard, elsewhere the server; either
    /// way the leader of the server's process group.
    pid: i32,
    exit: watch::Receiver<Option<ExitCode>>,
    pub(crate) stderr: StderrTail,
    /// The group was signalled to death already (by `stop` or `Drop`).
    reaped_group: bool,
}

/// A spawned server: its process and its stdout/stdin pipes.
pub(crate) type Spawned = (ServerProcess, ChildStdout, ChildStdin);

/// Starts `command` with exactly the environment `env`, in a process
/// group of its own under a guard (see the module docs), stderr kept (the
/// last `tail` bytes, `secrets` scrubbed).
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
    guard_the_group(&mut cmd);
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
    let (stderr, ended) = StderrTail::new(tail, secrets);
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
        let _ = ended.send(true);
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

/// The guard's parent-death signal: blocked and waited for, and acted on
/// only when the host is really gone (the guard's parent changed).
#[cfg(target_os = "linux")]
const HOST_GONE: libc::c_int = libc::SIGHUP;

/// Forks every server under a guard (see the module docs): the pre-exec
/// hook turns the forked child into the guard and returns only in the
/// guard's own child, which then execs the server.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn guard_the_group(cmd: &mut Command) {
    let host = std::process::id() as libc::pid_t;
    // SAFETY: the hook runs in the forked child before exec and calls only
    // system calls (`sigprocmask`, `sigaction`, `prctl`, `getppid`,
    // `getpid`, `fork`, and in the guard `close_range`/`close`,
    // `sigwaitinfo`, `waitpid`, `getpgid`, `setpgid`, `kill`, `_exit`),
    // all async-signal-safe; it allocates nothing and touches only its
    // own stack and the one integer it captured.
    unsafe {
        cmd.pre_exec(move || split_off_the_guard(host));
    }
}

/// In the child forked for a server (which leads the server's process
/// group): blocks the signals the guard waits for, asks for [`HOST_GONE`]
/// when the host dies, and forks again. The new child unblocks them, asks
/// for SIGKILL when the guard dies, and returns to exec the server; this
/// process never returns: it is the guard ([`guard`]).
///
/// # Safety
/// Only in a child just forked from the host (a pre-exec hook).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
#[deny(unsafe_op_in_unsafe_fn)]
unsafe fn split_off_the_guard(host: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: we are the freshly forked child (the caller's contract):
    // system calls on our own stack's values only, nothing allocated.
    unsafe {
        let mut waited: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut waited);
        libc::sigaddset(&mut waited, libc::SIGCHLD);
        libc::sigaddset(&mut waited, HOST_GONE);
        let mut before: libc::sigset_t = std::mem::zeroed();
        // Blocked before the second fork, so a server that exits at once is
        // still heard.
        if libc::sigprocmask(libc::SIG_BLOCK, &waited, &mut before) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The host may have set SIGCHLD to be ignored, and then no child is
        // ever waited for; the server gets the default too.
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGCHLD, &default, std::ptr::null_mut());
        if libc::prctl(libc::PR_SET_PDEATHSIG, HOST_GONE as libc::c_ulong) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The host died between the fork and the prctl: no server, go now.
        if libc::getppid() != host {
            libc::_exit(1);
        }
        let guard_pid = libc::getpid();
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                // The server: its signal mask as the host gave it, and SIGKILL
                // if the guard dies (the guard never has a second thread).
                libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != guard_pid {
                    libc::_exit(1);
                }
                Ok(())
            }
            server => guard(server, host, &waited),
        }
    }
}

/// The guard: holds no descriptor (the spawning parent waits for EOF on
/// its exec-error channel, and the server's pipes must close when the
/// server's side does), waits for the server to exit or the host to die,
/// then kills the server's whole process group. Its exit status is the
/// server's: a code is passed on (the guard steps out of the group into
/// the host's before the kill, so the kill spares it), a death by signal
/// is a death by SIGKILL.
///
/// # Safety
/// Only in the guard process of [`split_off_the_guard`], `waited` blocked.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
#[deny(unsafe_op_in_unsafe_fn)]
unsafe fn guard(server: libc::pid_t, host: libc::pid_t, waited: &libc::sigset_t) -> ! {
    // SAFETY: we are the guard (the caller's contract), single-threaded
    // and owning nothing another part of the program could still use.
    unsafe {
        close_every_descriptor();
        // The guard leads the group (`process_group(0)` ran before the hook).
        let group = libc::getpid();
        let status = loop {
            let signal = libc::sigwaitinfo(waited, std::ptr::null_mut());
            if signal == HOST_GONE {
                // Also sent when the thread that forked the guard ends while
                // the host lives on (the guard is then another thread's
                // child, and hears of that one's end too): only a new parent
                // means the host died.
                if libc::getppid() != host {
                    libc::kill(-group, libc::SIGKILL);
                    libc::_exit(1);
                }
                continue;
            }
            // SIGCHLD (or an interrupted wait): has the server ended?
            let mut status: libc::c_int = 0;
            match libc::waitpid(server, &mut status, libc::WNOHANG) {
                0 => continue,
                r if r == server => break Some(status),
                _ => {
                    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    break None;
                }
            }
        };
        let stepped_out = libc::setpgid(0, libc::getpgid(host)) == 0;
        libc::kill(-group, libc::SIGKILL);
        match status {
            Some(s) if stepped_out && libc::WIFEXITED(s) => libc::_exit(libc::WEXITSTATUS(s)),
            _ => {
                libc::kill(libc::getpid(), libc::SIGKILL);
                libc::_exit(1)
            }
        }
    }
}

/// Closes every open descriptor of the calling process (the guard's).
///
/// # Safety
/// Only where no code of the process uses a descriptor any more.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
#[deny(unsafe_op_in_unsafe_fn)]
unsafe fn close_every_descriptor() {
    // SAFETY: no descriptor is used after this (the caller's contract);
    // `rlimit` is a plain struct the kernel fills.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) == 0 {
            return;
        }
        // Kernels before 5.9: one by one, up to the descriptor limit.
        let mut limit: libc::rlimit = std::mem::zeroed();
        let top = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
            && limit.rlim_cur != libc::RLIM_INFINITY
        {
            limit.rlim_cur.min(1 << 20) as libc::c_int
        } else {
            1 << 16
        };
        for fd in 0..top {
            libc::close(fd);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn guard_the_group(_cmd: &mut Command) {}

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
