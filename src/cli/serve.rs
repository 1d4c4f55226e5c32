//! `agentvisor serve`: the HTTP API, its dashboard and `/metrics` over a
//! host on the database (`--db`).
//!
//! `serve [--addr 127.0.0.1:7070] [--agents DIR] [--tokens FILE] [--drain 30s]`
//! loads every manifest in `--agents` (by `name`; one that cannot be
//! prepared is skipped with a warning and listed under `failed` by
//! `GET /v1/agents`; one with MCP servers starts them on its first use, see
//! `agentvisor::server::catalog`) and the tokens file;
//! SIGHUP reloads both (a directory or file that does not load is refused
//! and the previous one stays). SIGTERM (or Ctrl-C) drains: the server
//! keeps listening, `/readyz` answers 503 and new runs and messages 503
//! with `retry-after`, while reads and the event streams of the runs in
//! flight are served on; the runs get `--drain` to finish, then the rest
//! end `cancelled` (durable runs keep their checkpoint for `agentvisor
//! recover`); then the listener closes and it exits 0.
//!
//! At its start, on a database file, it recovers as `agentvisor recover`
//! does (the same call, `super::recover::at_start`) before it accepts a
//! request: the durable runs whose hosts are gone (their leases expired,
//! or their process ended on this machine) resume here, the other
//! unfinished runs of those hosts end on record, and a run parked for
//! approval resumes parked, approvable through the API
//! (`POST /v1/runs/{id}/approve|deny`, `agentvisor runs approve|deny
//! --server`). `--no-recover` skips it. Chat sessions live in the
//! database with the runs (their history, state and `on_busy`), so a
//! restarted server serves them on.
//!
//! `--skills REPO` runs the schedules of a skills repository (see
//! docs/skills.md): their state is kept in the database (SQLite by
//! default), their runs are the host's like any (caller `schedule:NAME`),
//! and `/v1/schedules` lists and controls them. SIGHUP and `POST
//! /v1/schedules/reload` re-read the repository (one that is refused
//! leaves the schedules as they were); a drain stops firing first.
//!
//! Prints `listening on http://ADDR` once it accepts connections. Exit 2
//! when the database, the agents, the tokens or the address are refused.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use agentvisor::ports::audit::{AuditStore, RunIndex};
use agentvisor::ports::budget::BudgetLedger;
use agentvisor::ports::schedule::ScheduleStore;
use agentvisor::schedules::{HostRunner, Scheduler, SchedulerClock, SchedulerConfig};
use agentvisor::server::auth::{new_token, token_line, Role, TokenTable};
use agentvisor::server::catalog::Catalog;
use agentvisor::server::{Server, ServerConfig};
use agentvisor::skills::SkillsRepo;
use agentvisor::stores::{MemoryAuditStore, MemoryBudgetLedger, MemoryScheduleStore};
use agentvisor::Host;

use super::Db;

/// The host and the stores `serve` runs on.
type Stores = (
    Host,
    Arc<dyn RunIndex>,
    Arc<dyn ScheduleStore>,
    Arc<dyn BudgetLedger>,
    Arc<dyn agentvisor::ports::writeback::WriteIntents>,
);

/// Flags of `agentvisor serve`.
#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// What the database keeps (`--retain`).
    #[command(flatten)]
    pub(crate) keep: super::keep::KeepArgs,
    /// The address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:7070")]
    addr: SocketAddr,
    /// A directory of agent manifests (`*.yaml`), served by `name`.
    #[arg(long, value_name = "DIR")]
    agents: Option<PathBuf>,
    /// The tokens file: lines `- { caller: NAME, role: caller|admin, sha256: HEX }`.
    /// Without it, every request is the admin `anonymous`.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// How long runs in flight may go on after SIGTERM before they are
    /// cancelled.
    #[arg(long, default_value = "30s", allow_hyphen_values = true, value_parser = super::signals::drain_flag)]
    drain: Duration,
    /// Requests per second per caller: 0 (no limit), or from 0.001 to
    /// 1000000.
    #[arg(long, value_name = "PER_SEC", default_value_t = 200.0, allow_hyphen_values = true, value_parser = super::flags::rate_limit)]
    rate_limit: f64,
    /// Event-stream subscribers per run (1 to 100000).
    #[arg(long, value_name = "N", default_value_t = 64, allow_hyphen_values = true, value_parser = super::flags::whole_usize(1, super::flags::MAX_SUBSCRIBERS))]
    max_subscribers: usize,
    /// Do not recover at start: the durable runs an earlier process left
    /// stay on record for `agentvisor recover`.
    #[arg(long)]
    no_recover: bool,
    /// A skills repository (the folder with `agentvisor.yaml`) whose
    /// schedules the server runs (`/v1/schedules`; SIGHUP re-reads it).
    #[arg(long, value_name = "REPO")]
    skills: Option<PathBuf>,
}

/// Flags of `agentvisor token`.
#[derive(Args, Debug)]
pub(crate) struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(clap::Subcommand, Debug)]
enum TokenCommand {
    /// Print a fresh random token, then the tokens-file line to add for it.
    New {
        /// The caller the token acts as.
        #[arg(long)]
        caller: String,
        /// `caller` (its own runs) or `admin` (every run, inline manifests).
        #[arg(long, default_value = "caller", value_parser = parse_role)]
        role: Role,
    },
}

fn parse_role(s: &str) -> Result<Role, String> {
    match s {
        "caller" => Ok(Role::Caller),
        "admin" => Ok(Role::Admin),
        other => Err(format!("`{other}` is not a role (caller, admin)")),
    }
}

pub(crate) fn token(a: TokenArgs) -> ExitCode {
    match a.command {
        TokenCommand::New { caller, role } => {
            let ok = !caller.is_empty()
                && caller
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
            if !ok {
                return super::refuse(format!(
                    "`{caller}` is not a caller name (letters, digits, - _ . @)"
                ));
            }
            match new_token() {
                Ok(t) => {
                    outln!("{t}");
                    outln!("{}", token_line(&caller, role, &t));
                    ExitCode::SUCCESS
                }
                Err(e) => super::refuse(e),
            }
        }
    }
}

pub(crate) async fn serve(a: ServeArgs, db: &Db) -> ExitCode {
    let providers = match super::providers(None) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // The skills repository is read before anything starts: one that is
    // refused exits 2 with its error.
    let repo = match &a.skills {
        Some(dir) => match SkillsRepo::open(dir) {
            Ok(r) => Some(r),
            Err(e) => return super::refuse(e),
        },
        None => None,
    };
    let (host, index, states, ledger, intents): Stores = match db {
        // Serving from PostgreSQL comes with the run queue.
        Db::Postgres(_) => return super::not_on_postgres("serve"),
        Db::Memory => {
            let store = Arc::new(MemoryAuditStore::new());
            let ledger = Arc::new(MemoryBudgetLedger::new());
            let host = agentvisor::Host::builder()
                .providers(providers)
                .config(super::memory_config())
                .audit_store(store.clone() as Arc<dyn AuditStore>)
                .budget_ledger(ledger.clone())
                .build()
                .await;
            match host {
                Ok(h) => (
                    h,
                    store,
                    Arc::new(MemoryScheduleStore::new()),
                    ledger,
                    Arc::new(agentvisor::stores::MemoryWriteIntents::new()),
                ),
                Err(e) => return super::refuse(e),
            }
        }
        Db::File(path) => {
            let store = match super::open_db(path).await {
                Ok(s) => Arc::new(s),
                Err(code) => return code,
            };
            let host = agentvisor::Host::builder()
                .providers(providers)
                .config(super::sqlite_config(path))
                .audit_store(store.clone())
                .checkpointer(store.clone())
                .session_store(store.clone())
                .budget_ledger(store.clone())
                .build()
                .await;
            let host = match host {
                Ok(h) => h,
                Err(e) => return super::refuse(e),
            };
            // Before any run is submitted (recovery runs once, at boot).
            if !a.no_recover {
                let parked = agentvisor::ParkedRuns::Resume;
                match super::recover::at_start(&host, &path.display().to_string(), parked).await {
                    Ok(recovery) => {
                        errln!("{}", super::recover::summary_line(&recovery));
                        // They go on here; a dropped handle would cancel them.
                        for run in recovery.resumed {
                            run.detach();
                        }
                    }
                    Err(code) => {
                        host.shutdown().await;
                        return code;
                    }
                }
            }
            (host, store.clone(), store.clone(), store.clone(), store)
        }
    };
    let config = ServerConfig {
        rate_per_sec: a.rate_limit,
        max_subscribers: a.max_subscribers,
        ..ServerConfig::default()
    };
    let server = Server::new(host.clone(), index, config);
    if let Err(code) = load(&server, &a) {
        host.shutdown().await;
        return code;
    }
    if let Some(repo) = repo {
        let count = repo.schedules.len();
        // The memory of each run written back; writes parked by an
        // earlier process (or this one) retried now and every minute.
        let writeback = super::git_writeback(intents);
        writeback.spawn_retries(std::time::Duration::from_secs(60), |k| {
            std::env::var(k).ok()
        });
        let config = SchedulerConfig {
            store: states,
            runner: Arc::new(HostRunner::new(host.clone()).with_writeback(writeback)),
            ledger: Some(ledger),
            clock: SchedulerClock::System,
        };
        match Scheduler::start(repo, config).await {
            Ok(s) => {
                errln!("running {count} schedule(s) of {}", s.root().display());
                server.set_scheduler(Some(s));
            }
            Err(e) => {
                host.shutdown().await;
                return super::refuse(e);
            }
        }
    }
    if a.tokens.is_none() && !a.addr.ip().is_loopback() {
        tracing::warn!(addr = %a.addr, "serving without --tokens on a non-loopback address: anyone who reaches it is admin");
    }
    agentvisor::server::metrics::recorder();
    let listener = match tokio::net::TcpListener::bind(a.addr).await {
        Ok(l) => l,
        Err(e) => {
            host.shutdown().await;
            return super::refuse(format!("cannot listen on {}: {e}", a.addr));
        }
    };
    let local = listener.local_addr().unwrap_or(a.addr);
    // Caught from before the line that says it serves: a SIGTERM sent as
    // soon as it is read drains too.
    let signals = Signals::install();
    outln!("listening on http://{local}");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = {
        let server = server.clone();
        tokio::spawn(async move {
            let stopped = async {
                let _ = stop_rx.await;
            };
            server
                .serve(listener, stopped, Duration::from_secs(5))
                .await
        })
    };
    signals.wait_for_stop(&server, &a).await;
    // Refuse new runs, still listening: a client polling `/readyz` or
    // submitting reads 503 (not a refused connection), and the runs in
    // flight are read and streamed to their end.
    server.start_draining();
    // No fire starts from now on; the runs of schedules in flight drain
    // with the others.
    if let Some(s) = server.scheduler() {
        s.stop().await;
    }
    tracing::info!(drain_s = a.drain.as_secs_f64(), "draining");
    host.shutdown_after(a.drain).await;
    // Every run has ended: stop accepting, end the host-wide feeds.
    let _ = stop_tx.send(());
    server.close_streams();
    let _ = serving.await;
    ExitCode::SUCCESS
}

/// Loads (or reloads) the agents and the tokens into `server`.
fn load(server: &Server, a: &ServeArgs) -> Result<(), ExitCode> {
    if let Some(dir) = &a.agents {
        let catalog = Catalog::load(dir, server.host()).map_err(super::refuse)?;
        for failed in catalog.failed() {
            errln!("warning: {failed}");
        }
        server.set_catalog(catalog);
    }
    if let Some(file) = &a.tokens {
        let table = TokenTable::load(file).map_err(super::refuse)?;
        server.set_tokens(Some(table));
    }
    Ok(())
}

/// The signals `serve` stops (SIGTERM, Ctrl-C) and reloads on (SIGHUP).
struct Signals {
    #[cfg(unix)]
    caught: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Catches them from now on.
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let caught = match (
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
            ) {
                (Ok(term), Ok(hup)) => Some((term, hup)),
                _ => None,
            };
            Signals { caught }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Waits for SIGTERM or Ctrl-C, reloading on SIGHUP meanwhile.
    #[cfg(unix)]
    async fn wait_for_stop(self, server: &Server, a: &ServeArgs) {
        let Some((mut term, mut hup)) = self.caught else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = tokio::signal::ctrl_c() => return,
                _ = hup.recv() => {
                    if load(server, a).is_ok() {
                        errln!("reloaded: {} agents", server_agents(server));
                    } else {
                        errln!("reload refused; the previous agents and tokens stay");
                    }
                    reload_schedules(server).await;
                }
            }
        }
    }

    #[cfg(not(unix))]
    async fn wait_for_stop(self, _server: &Server, _a: &ServeArgs) {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Re-reads the skills repository (SIGHUP): a repository that is refused
/// leaves the schedules as they were.
async fn reload_schedules(server: &Server) {
    let Some(s) = server.scheduler() else {
        return;
    };
    match s.reload_from_disk().await {
        Ok(r) => errln!(
            "reloaded schedules: {} added, {} removed, {} changed, {} unchanged",
            r.added.len(),
            r.removed.len(),
            r.changed.len(),
            r.unchanged.len()
        ),
        Err(e) => errln!("schedules reload refused ({e}); the previous schedules stay"),
    }
}

fn server_agents(server: &Server) -> usize {
    server.catalog_len()
}

/// The `/metrics` endpoint of `swarm` and `soak` (`--metrics-addr`): served
/// until the returned guard is dropped. Exit 2 when the address is refused.
pub(crate) async fn metrics_endpoint(
    addr: Option<SocketAddr>,
    host: &Host,
) -> Result<Option<AbortOnDrop>, ExitCode> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| super::refuse(format!("--metrics-addr {addr}: {e}")))?;
    let local = listener.local_addr().unwrap_or(addr);
    errln!("metrics at http://{local}/metrics");
    let task = tokio::spawn(agentvisor::server::metrics::serve_alone(
        listener,
        host.clone(),
    ));
    Ok(Some(AbortOnDrop(task)))
}

/// Stops a task when dropped.
pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<std::io::Result<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
