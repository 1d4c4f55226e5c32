//! Command-line parsing and the commands. Each command builds a host from
//! the embedded defaults (scripted model, the SQLite store at `--db`, or the
//! in-memory stores with `--db :memory:`), runs, prints, shuts the host down
//! (so every record is written) and maps the outcome to an exit code.
//!
//! The database: `--db PATH`, else `AGENTVISOR_DB`, else
//! `.agentvisor/agentvisor.db` under the working directory. It holds the
//! audit log (read back by `agentvisor runs`) and the budget ledger, so a
//! caller's token budget holds across invocations, and durable runs'
//! checkpoints, which `agentvisor recover` resumes after a crash. While it cannot be
//! written, audit batches go to `PATH.spool` (or `--spool`) and are
//! replayed later; records that neither takes are counted, and the command
//! says so and exits non-zero. A database that cannot be opened (or, with
//! `--check`, is damaged) is refused with exit code 2.
//!
//! `--db postgres://…` (a build with the `postgres` feature) puts the same
//! stores on a PostgreSQL server ([`Opened::Postgres`]): every command
//! that builds a host goes through [`open`] and [`on_stores`], so `run`,
//! `swarm`, `soak`, `chat`, `recover` and `skill run` (its publishes in
//! the server's outbox, its parked git writes on the server) run on it,
//! and `runs`, `sessions` and `budget` read it. Its spool is
//! `.agentvisor/postgres-SERVER_DB.spool` (or `--spool`). The commands
//! not moved onto it yet refuse it with exit code 2 ([`not_on_postgres`]):
//! `serve` (serving from PostgreSQL comes with the run queue's workers),
//! `runs prune`, `replay`, `fork`, `diff` and `eval`.
//!
//! # Output
//! Every line goes out through [`outln!`] (stdout) or [`errln!`] (stderr),
//! never `println!`, which panics when the reader of a pipe went away
//! (`agentvisor mcp tools FILE | head -1`): a closed stdout stops the
//! output, and the command ends as it would have, exit code included. The
//! lints below hold every command to it.
#![deny(clippy::print_stdout, clippy::print_stderr)]

/// Prints a line to stdout. Once stdout is gone (the reader of a pipe, such
/// as `head -1`, went away) nothing more is printed, and the command goes on
/// quietly: it still finishes its runs and writes their records.
macro_rules! outln {
    () => { $crate::cli::write_line(false, format_args!("")) };
    ($($t:tt)*) => { $crate::cli::write_line(false, format_args!($($t)*)) };
}

/// Prints a line to stderr, quietly giving up if stderr is gone.
macro_rules! errln {
    ($($t:tt)*) => { $crate::cli::write_line(true, format_args!($($t)*)) };
}

mod approvals;
mod budget;
mod chat;
mod client;
mod diff;
mod eval;
mod flags;
mod fork;
mod keep;
mod logs;
mod mcp;
mod recover;
mod replay;
mod run;
mod runs;
mod serve;
mod sessions;
mod signals;
mod skill;
mod soak;
mod swarm;
mod tree;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use agentvisor::providers::{ModelResolver, ProviderConfig};
use agentvisor::stores::{MemoryBudgetLedger, SqliteStore};
use agentvisor::tools::RegistryError;
use agentvisor::{Agent, AgentSpec, Host, HostBuilder, HostConfig, SubmitError};

/// The database path when neither `--db` nor `AGENTVISOR_DB` names one.
const DEFAULT_DB: &str = ".agentvisor/agentvisor.db";

/// agentvisor: run LLM agent runs as supervised actors.
#[derive(Parser, Debug)]
#[command(name = "agentvisor", version, about)]
pub(crate) struct Cli {
    /// The run-history and budget database: a SQLite file (default
    /// `.agentvisor/agentvisor.db`; `sqlite://PATH` names one too), a
    /// PostgreSQL server (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`, in a
    /// build with the `postgres` feature; `run`, `swarm`, `soak`, `chat`,
    /// `recover`, `runs list|show|approve|deny`, `sessions` and `budget`),
    /// or
    /// `:memory:` to keep everything in memory. Other URLs are refused.
    #[arg(long, global = true, env = "AGENTVISOR_DB", value_name = "PATH")]
    db: Option<PathBuf>,
    /// Where audit records go while the database cannot be written (put it
    /// on another disk); default: `PATH.spool` beside the database.
    #[arg(long, global = true, env = "AGENTVISOR_SPOOL", value_name = "PATH")]
    spool: Option<PathBuf>,
    /// Check the whole database file when it is opened (`PRAGMA
    /// quick_check`): a damaged file is refused with exit code 2.
    #[arg(long, global = true)]
    check: bool,
    /// How long this process's leases in the database hold without
    /// renewal (default 30s; renewed every third of it): a process that
    /// dies or stops leaves its runs to `recover` elsewhere after this
    /// long. From 100ms to 24h.
    #[arg(long, global = true, value_name = "DURATION", allow_hyphen_values = true, value_parser = lease_ttl_flag)]
    lease_ttl: Option<Duration>,
    #[command(subcommand)]
    command: Command,
}

/// Where a command keeps its records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Db {
    /// The in-memory batteries: nothing outlives the process.
    Memory,
    /// The SQLite database at this path.
    File(PathBuf),
    /// A PostgreSQL server (only a build with the `postgres` feature takes
    /// one: see [`db_url`]).
    Postgres(PostgresUrl),
}

/// A `--db postgres://…` URL, as given; shown (`Debug`) without its
/// password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PostgresUrl(String);

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[cfg(feature = "postgres")]
        return f.write_str(&agentvisor::stores::postgres::redact_url(&self.0));
        #[cfg(not(feature = "postgres"))]
        f.write_str("postgres://…")
    }
}

impl Db {
    /// Where `--db` (or `AGENTVISOR_DB`) says: `:memory:`, a file path, or
    /// a URL of a scheme this build stores in ([`db_url`]); a URL of any
    /// other scheme is refused (nothing is created for it).
    fn from_flag(flag: Option<PathBuf>) -> Result<Db, String> {
        let Some(p) = flag else {
            return Ok(Db::File(PathBuf::from(DEFAULT_DB)));
        };
        if p.as_os_str() == ":memory:" {
            return Ok(Db::Memory);
        }
        match p.to_str().and_then(url_scheme) {
            Some((scheme, rest)) => db_url(scheme, rest),
            None => Ok(Db::File(p)),
        }
    }
}

/// The scheme of a `--db` value written as a URL (`scheme://…`, the scheme
/// a letter then letters, digits, `+`, `-` or `.`) and what follows `://`;
/// `None` for a path.
fn url_scheme(text: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let valid = first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some((scheme, rest))
}

/// The database a `--db` URL (`scheme://rest`) names, by its scheme: the one place that knows which schemes this build stores in.
/// `sqlite://PATH` is the SQLite file at `PATH`; `postgres://` (or
/// `postgresql://`) a PostgreSQL server, in a build with the `postgres`
/// feature (one without refuses it, naming the feature); every other
/// scheme is refused, naming the scheme only (a URL may hold a password).
fn db_url(scheme: &str, rest: &str) -> Result<Db, String> {
    match scheme.to_ascii_lowercase().as_str() {
        "sqlite" if !rest.is_empty() => Ok(Db::File(PathBuf::from(rest))),
        "sqlite" => Err("--db sqlite://: name the file (`sqlite://PATH`)".into()),
        "postgres" | "postgresql" if cfg!(feature = "postgres") => Ok(Db::Postgres(PostgresUrl(
            format!("{}://{rest}", scheme.to_ascii_lowercase()),
        ))),
        "postgres" | "postgresql" => Err(format!(
            "--db: `{scheme}://` needs PostgreSQL support, which this build leaves out: build agentvisor with the `postgres` feature (`cargo install --path . --features postgres`), or give a SQLite file path (or `sqlite://PATH`), or `:memory:`"
        )),
        _ => Err(format!(
            "--db: `{scheme}://` databases are not supported by this build; give a SQLite file path (or `sqlite://PATH`), or `:memory:`"
        )),
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one agent and print its result (exit 0 iff the status is `ok`).
    Run(run::RunArgs),
    /// Run a manifest many times with bounded concurrency and print a summary.
    Swarm(swarm::SwarmArgs),
    /// Keep C runs of a manifest in flight for a while (optionally with
    /// injected faults), sample the process every second, and judge it
    /// (exit 0 iff the verdict passes).
    Soak(soak::SoakArgs),
    /// The run history in the database: list runs, show one with its records.
    Runs(runs::RunsArgs),
    /// Re-run a recorded run against its recorded model responses and tool
    /// results; exit 0 iff the trace is the same.
    Replay(replay::ReplayArgs),
    /// A new run that takes a recorded run's first K steps from its
    /// recording and goes on live under other settings (exit 0 iff it
    /// ends `ok`).
    Fork(fork::ForkArgs),
    /// Align two recorded runs step by step and print where they first
    /// differ (exit 0 iff they agree).
    Diff(diff::DiffArgs),
    /// Fork every recorded run of a cohort with the same overrides under
    /// one token budget and report what changed.
    Eval(eval::EvalArgs),
    /// Resume the durable runs an earlier process left unfinished (from
    /// their checkpoints) and end the rest on record; prints what it did.
    Recover(recover::RecoverArgs),
    /// Serve the HTTP API, the dashboard and /metrics.
    Serve(serve::ServeArgs),
    /// API tokens for `serve --tokens`.
    Token(serve::TokenArgs),
    /// MCP servers: `mcp tools FILE [--json]` starts a manifest's servers
    /// and prints every tool as the model sees it.
    Mcp(mcp::McpArgs),
    /// Per-caller budgets in the database: set limits, show them and the
    /// spend in their window.
    Budget(budget::BudgetArgs),
    /// Chat with an agent: every line a prompt of one session, answers
    /// streamed as they arrive; `--session ID` goes on with a conversation.
    Chat(chat::ChatArgs),
    /// The chat sessions in the database: list them, show one's history.
    Sessions(sessions::SessionsArgs),
    /// Scheduled skills: `check REPO` checks a skills repository, `list
    /// REPO` shows its schedules and when each fires next, `run REPO
    /// --schedule NAME --dry-run` runs one schedule's skill now.
    Skill(skill::SkillArgs),
}

/// Store options every command that opens a database follows (`--spool`,
/// `--check`), set once from the command line.
#[derive(Debug, Default)]
struct StoreOptions {
    spool: Option<PathBuf>,
    check: bool,
    lease_ttl: Option<Duration>,
    /// `--retain` of the command that runs agents.
    keep: keep::KeepArgs,
}

/// `--lease-ttl`: a duration from 100 ms to 24 h.
fn lease_ttl_flag(s: &str) -> Result<Duration, String> {
    flags::duration(Duration::from_millis(100), agentvisor::spec::MAX_DURATION)(s)
}

static STORE_OPTIONS: std::sync::OnceLock<StoreOptions> = std::sync::OnceLock::new();

fn store_options() -> &'static StoreOptions {
    STORE_OPTIONS.get_or_init(StoreOptions::default)
}

/// Runs the chosen command.
pub(crate) async fn dispatch(cli: Cli) -> ExitCode {
    let _ = STORE_OPTIONS.set(StoreOptions {
        spool: cli.spool.clone(),
        check: cli.check,
        lease_ttl: cli.lease_ttl,
        keep: match &cli.command {
            Command::Run(a) => a.keep.clone(),
            Command::Swarm(a) => a.keep.clone(),
            Command::Soak(a) => a.keep.clone(),
            Command::Serve(a) => a.keep.clone(),
            _ => keep::KeepArgs::default(),
        },
    });
    let db = match cli.command {
        // The commands that open no database take any `--db`.
        Command::Token(_) | Command::Mcp(_) => Ok(Db::Memory),
        Command::Runs(ref a) if a.server.is_some() => Ok(Db::Memory),
        Command::Replay(ref a) if a.server.is_some() => Ok(Db::Memory),
        _ => Db::from_flag(cli.db),
    };
    let db = match db {
        Ok(db) => db,
        Err(e) => return refuse(e),
    };
    match cli.command {
        Command::Runs(mut a) if a.server.is_some() => {
            let url = a.server.take().unwrap_or_default();
            client::runs(a, &url).await
        }
        Command::Replay(mut a) if a.server.is_some() => {
            let url = a.server.take().unwrap_or_default();
            client::replay(a, &url).await
        }
        Command::Serve(a) => serve::serve(a, &db).await,
        Command::Token(a) => serve::token(a),
        Command::Run(a) => run::run(a, &db).await,
        Command::Swarm(a) => logs::once_per_warning(swarm::swarm(a, &db)).await,
        Command::Soak(a) => logs::once_per_warning(soak::soak(a, &db)).await,
        Command::Runs(a) => runs::runs(a, &db).await,
        Command::Replay(a) => replay::replay_run(a, &db).await,
        Command::Fork(a) => fork::fork(a, &db).await,
        Command::Diff(a) => diff::diff(a, &db).await,
        Command::Eval(a) => eval::eval(a, &db).await,
        Command::Recover(a) => recover::recover(a, &db).await,
        Command::Mcp(a) => mcp::mcp(a).await,
        Command::Budget(a) => budget::budget(a, &db).await,
        Command::Chat(a) => chat::chat(a, &db).await,
        Command::Sessions(a) => sessions::sessions(a, &db).await,
        Command::Skill(a) => skill::skill(a, &db).await,
    }
}

/// Stdout or stderr was found closed: print nothing more to it.
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static STDERR_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes one line to stdout (`err`: stderr); a write that fails (a closed
/// pipe, a full disk) stops output to that stream for the rest of the
/// process instead of panicking as `println!` does.
pub(crate) fn write_line(err: bool, args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    let gone = if err { &STDERR_GONE } else { &STDOUT_GONE };
    if gone.load(Ordering::Relaxed) {
        return;
    }
    let written = if err {
        writeln!(std::io::stderr().lock(), "{args}")
    } else {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{args}").and_then(|()| out.flush())
    };
    if written.is_err() {
        gone.store(true, Ordering::Relaxed);
    }
}

/// What [`init_tracing`] set up that must be ended before the process
/// exits: the trace exporter (`otel` feature), whose buffered spans are
/// exported by [`Tracing::finish`].
pub(crate) struct Tracing {
    #[cfg(feature = "otel")]
    traces: Option<agentvisor::otel::Traces>,
}

impl Tracing {
    /// Exports the spans still buffered (call it outside the runtime).
    pub(crate) fn finish(self) {
        #[cfg(feature = "otel")]
        if let Some(Err(e)) = self.traces.map(agentvisor::otel::Traces::shutdown) {
            errln!("warning: {e}");
        }
    }
}

/// The process's [`Tracing`], for a command that must leave through
/// [`exit_now`]; `main` finishes it otherwise.
static TRACING: std::sync::Mutex<Option<Tracing>> = std::sync::Mutex::new(None);

/// Keeps `tracing` for [`finish_tracing`] / [`exit_now`].
pub(crate) fn keep_tracing(tracing: Tracing) {
    *TRACING.lock().unwrap_or_else(|p| p.into_inner()) = Some(tracing);
}

/// Exports the spans still buffered, once (call it outside the runtime).
pub(crate) fn finish_tracing() {
    let tracing = TRACING.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(t) = tracing {
        t.finish();
    }
}

/// Ends the process with `code` from inside the runtime, without waiting
/// for the runtime to stop (a read of stdin on its blocking pool would
/// hold it): stdout is flushed and the buffered spans exported first, on a
/// thread of their own (the exporter blocks, which a runtime thread must
/// not).
pub(crate) fn exit_now(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::thread::spawn(finish_tracing).join();
    std::process::exit(i32::from(code))
}

/// Logs to stderr, filtered by `AGENTVISOR_LOG` (default: warnings), in
/// colour only on a terminal without `NO_COLOR`, runs' repeated warnings
/// held back once a command asks (see `logs`). With
/// the `otel` feature, also exports traces when the `OTEL_*` variables name
/// an endpoint (see `agentvisor::otel`); a setting it cannot follow is a
/// warning, and the command runs without traces.
pub(crate) fn init_tracing() -> Tracing {
    use tracing_subscriber::filter::FilterExt;
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENTVISOR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(logs::colour())
        .with_writer(std::io::stderr)
        .with_filter(filter.and(logs::RunWarnings));
    #[cfg(feature = "otel")]
    {
        let traces = agentvisor::otel::Traces::from_env().unwrap_or_else(|e| {
            errln!("warning: no traces: {e}");
            None
        });
        if let Some(t) = &traces {
            let _ = tracing_subscriber::registry()
                .with(logs)
                .with(t.layer())
                .try_init();
            return Tracing { traces };
        }
    }
    let _ = tracing_subscriber::registry().with(logs).try_init();
    Tracing {
        #[cfg(feature = "otel")]
        traces: None,
    }
}

/// The largest input `--input -` reads from stdin (16 MiB).
const MAX_STDIN_INPUT: u64 = 16 * 1024 * 1024;

/// The prompt a `--input` flag gives: `-` reads it from stdin (to its end,
/// at most 16 MiB of UTF-8), anything else is the text itself.
pub(crate) fn input_text(flag: Option<String>) -> Result<Option<String>, ExitCode> {
    match flag.as_deref() {
        Some("-") => {
            use std::io::Read;
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .take(MAX_STDIN_INPUT + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| refuse(format!("--input -: cannot read stdin: {e}")))?;
            if bytes.len() as u64 > MAX_STDIN_INPUT {
                return Err(refuse("--input -: stdin holds more than 16 MiB"));
            }
            String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| refuse("--input -: stdin is not UTF-8 text"))
        }
        _ => Ok(flag),
    }
}

/// The inputs an `--inputs JSON` flag gives: a JSON object whose values
/// fill the manifest's `{{inputs.NAME}}` placeholders.
pub(crate) fn inputs_flag(
    flag: Option<&str>,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, ExitCode> {
    match flag {
        None => Ok(Default::default()),
        Some(text) => serde_json::from_str(text).map_err(|e| {
            refuse(format!(
                "--inputs: not a JSON object of named inputs ({e}); e.g. --inputs '{{\"city\": \"Oslo\"}}'"
            ))
        }),
    }
}

/// Input refused before any run: print it and exit 2.
pub(crate) fn refuse(message: impl std::fmt::Display) -> ExitCode {
    errln!("error: {message}");
    ExitCode::from(2)
}

/// Loads a manifest and prepares it on a host with the embedded defaults
/// and the stores of `db`.
///
/// Every budget applies together, the tightest winning: the caller's
/// limits and spend in the database's ledger (which every token is
/// recorded in, and which hold across processes), the manifest's
/// `budget.tokens` (each run's own, see `Invocation::budget_tokens`) and a
/// token budget given on the command line (`--budget-tokens`): this
/// command's runs together, counted from zero (`HostConfig::allowance_tokens`).
///
/// `model` (`--model`) runs the agent on that model spec instead of its
/// manifest's (see [`providers`]).
pub(crate) async fn prepare(
    file: &PathBuf,
    budget_tokens: Option<u64>,
    db: &Db,
    model: Option<String>,
) -> Result<(Host, Agent), ExitCode> {
    let config = providers(model.clone())?;
    if let Some(flag) = &model {
        check_model_flag(flag, &config)?;
    }
    prepare_with(file, budget_tokens, db, |_, builder| {
        Ok(builder.providers(config))
    })
    .await
}

/// Refuses a `--model` value that names no model (exit 2), naming the
/// flag and the value, not the manifest.
pub(crate) fn check_model_flag(flag: &str, config: &ProviderConfig) -> Result<(), ExitCode> {
    let resolver = ModelResolver::new(config.clone());
    let known = || resolver.known().join(", ");
    match resolver.follow_tiers(flag) {
        Ok(target) if agentvisor::providers::ModelSpec::parse(&target).is_some() => Ok(()),
        Ok(target) if target != flag.trim() => Err(refuse(format!(
            "--model `{flag}`: the tier maps to `{target}`, which is not a model (known: {})",
            known()
        ))),
        Ok(_) => Err(refuse(format!(
            "--model `{flag}`: unknown model (use one of: {})",
            known()
        ))),
        Err(e) => Err(refuse(format!("--model `{flag}`: {e}"))),
    }
}

/// [`prepare`], with `customize` given the manifest and the host builder
/// before the stores are set (`soak` registers its fault-injecting model).
pub(crate) async fn prepare_with(
    file: &PathBuf,
    budget_tokens: Option<u64>,
    db: &Db,
    customize: impl FnOnce(&AgentSpec, HostBuilder) -> Result<HostBuilder, ExitCode>,
) -> Result<(Host, Agent), ExitCode> {
    let spec = AgentSpec::from_file(file).map_err(refuse)?;
    let base = customize(&spec, host_builder())?;
    let opened = open(db).await?;
    let host = host_on(base, db, opened, budget_tokens).await?;
    let agent = host.prepare(spec).await.map_err(|e| {
        if let SubmitError::NoModel(_) | SubmitError::Tier(_) = e {
            return refuse(format!("{}: {e}", file.display()));
        }
        let line = match &e {
            SubmitError::Tool(RegistryError::UnknownTool { name, .. }) => {
                std::fs::read_to_string(file)
                    .map(|text| agentvisor::spec::line_of(&text, name))
                    .unwrap_or_default()
            }
            _ => String::new(),
        };
        refuse(format!("invalid manifest {}: {e}{line}", file.display()))
    })?;
    Ok((host, agent))
}

/// A database a command opened: the batteries its host keeps records in.
#[derive(Clone)]
pub(crate) enum Opened {
    /// The in-memory batteries (`--db :memory:`).
    Memory,
    /// The SQLite file: every store port.
    Sqlite(Arc<SqliteStore>),
    /// The PostgreSQL server: the audit log, run index, budget ledger,
    /// checkpoints (with their leases), sessions, the outbox of publish
    /// intents, schedules and parked git writes.
    #[cfg(feature = "postgres")]
    Postgres(Arc<agentvisor::stores::PostgresStore>),
}

impl Opened {
    /// The run history (audit log and run index), or `None` in memory.
    pub(crate) fn history(
        &self,
    ) -> Option<(
        Arc<dyn agentvisor::ports::audit::AuditStore>,
        Arc<dyn agentvisor::ports::audit::RunIndex>,
    )> {
        match self {
            Opened::Memory => None,
            Opened::Sqlite(s) => Some((s.clone(), s.clone())),
            #[cfg(feature = "postgres")]
            Opened::Postgres(s) => Some((s.clone(), s.clone())),
        }
    }

    /// The durable runs' checkpoints, or `None` in memory.
    pub(crate) fn checkpointer(
        &self,
    ) -> Option<Arc<dyn agentvisor::ports::checkpoint::Checkpointer>> {
        match self {
            Opened::Memory => None,
            Opened::Sqlite(s) => Some(s.clone()),
            #[cfg(feature = "postgres")]
            Opened::Postgres(s) => Some(s.clone()),
        }
    }

    /// The budget ledger, or `None` in memory.
    pub(crate) fn ledger(&self) -> Option<Named<dyn agentvisor::ports::budget::BudgetLedger>> {
        let store: Arc<dyn agentvisor::ports::budget::BudgetLedger> = match self {
            Opened::Memory => return None,
            Opened::Sqlite(s) => s.clone(),
            #[cfg(feature = "postgres")]
            Opened::Postgres(s) => s.clone(),
        };
        Some(Named {
            store,
            name: self.name(),
        })
    }

    /// The chat sessions, or `None` in memory.
    pub(crate) fn sessions(&self) -> Option<Named<dyn agentvisor::ports::session::SessionStore>> {
        let store: Arc<dyn agentvisor::ports::session::SessionStore> = match self {
            Opened::Memory => return None,
            Opened::Sqlite(s) => s.clone(),
            #[cfg(feature = "postgres")]
            Opened::Postgres(s) => s.clone(),
        };
        Some(Named {
            store,
            name: self.name(),
        })
    }

    /// The database as messages name it: the file's path, or the URL
    /// without its password.
    pub(crate) fn name(&self) -> String {
        match self {
            Opened::Memory => ":memory:".into(),
            Opened::Sqlite(s) => s.path().display().to_string(),
            #[cfg(feature = "postgres")]
            Opened::Postgres(s) => s.target().to_string(),
        }
    }

    /// Done with it: a SQLite file is closed (its journal folded in).
    pub(crate) async fn close(self) {
        if let Opened::Sqlite(s) = self {
            s.close().await;
        }
    }
}

/// A store of a database, and the database's name for messages.
pub(crate) struct Named<T: ?Sized> {
    /// The store.
    pub(crate) store: Arc<T>,
    /// The database, as [`Opened::name`] names it.
    pub(crate) name: String,
}

impl<T: ?Sized> std::ops::Deref for Named<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.store
    }
}

/// Opens the database of `db` (creating a SQLite file, migrating a
/// PostgreSQL schema), or refuses with exit 2 and a message naming it.
pub(crate) async fn open(db: &Db) -> Result<Opened, ExitCode> {
    match db {
        Db::Memory => Ok(Opened::Memory),
        Db::File(path) => Ok(Opened::Sqlite(Arc::new(open_db(path).await?))),
        Db::Postgres(url) => connect_postgres(url).await,
    }
}

/// Opens the database of `db` for reading (a SQLite file must exist), or
/// refuses with exit 2.
pub(crate) async fn open_existing(db: &Db) -> Result<Opened, ExitCode> {
    match db {
        Db::Memory => Ok(Opened::Memory),
        Db::File(path) => Ok(Opened::Sqlite(Arc::new(open_existing_db(path).await?))),
        Db::Postgres(url) => connect_postgres(url).await,
    }
}

/// Connects to the PostgreSQL server of `url` and migrates its schema, or
/// refuses with exit 2 (the message names the server, never its
/// password). A `--retain max_bytes=…` is refused: the server keeps its
/// own files.
#[cfg(feature = "postgres")]
async fn connect_postgres(url: &PostgresUrl) -> Result<Opened, ExitCode> {
    if store_options()
        .keep
        .retain
        .is_some_and(|r| r.max_bytes.is_some())
    {
        return Err(refuse(
            "--retain max_bytes: PostgreSQL keeps its own files; bound the history with max_age or max_runs",
        ));
    }
    if store_options().check {
        tracing::warn!("--check checks a SQLite file; PostgreSQL checks its own pages");
    }
    let store = agentvisor::stores::PostgresStore::connect(&url.0)
        .await
        .map_err(refuse)?;
    Ok(Opened::Postgres(Arc::new(store)))
}

/// A build without the `postgres` feature never parses a PostgreSQL
/// `--db` ([`db_url`] refuses it); refused here too, should one come.
#[cfg(not(feature = "postgres"))]
async fn connect_postgres(_: &PostgresUrl) -> Result<Opened, ExitCode> {
    Err(refuse(
        "--db postgres://: this build leaves PostgreSQL out (the `postgres` feature)",
    ))
}

/// Refuses (exit 2) a command that does not run on PostgreSQL yet.
pub(crate) fn not_on_postgres(command: &str) -> ExitCode {
    refuse(format!(
        "`agentvisor {command}` does not run on PostgreSQL yet: give it a SQLite file (`--db PATH`). On PostgreSQL this build runs `run`, `swarm`, `soak`, `chat`, `recover`, `skill run`, `runs list|show|approve|deny`, `sessions` and `budget`"
    ))
}

/// A host from `base` on the stores `opened` (of `db`), with a token
/// budget for the command's runs.
pub(crate) async fn host_on(
    base: HostBuilder,
    db: &Db,
    opened: Opened,
    budget_tokens: Option<u64>,
) -> Result<Host, ExitCode> {
    on_stores(base, db, opened)
        .allowance_tokens(budget_tokens)
        .build()
        .await
        .map_err(refuse)
}

/// `builder` on the stores of `db`, and where parked git writes go: the
/// SQLite file or the PostgreSQL server (which also keep a scheduled
/// skill's publishes in their outbox), or memory.
pub(crate) async fn with_stores(
    builder: HostBuilder,
    db: &Db,
) -> Result<
    (
        HostBuilder,
        Arc<dyn agentvisor::ports::writeback::WriteIntents>,
    ),
    ExitCode,
> {
    let opened = open(db).await?;
    let intents: Arc<dyn agentvisor::ports::writeback::WriteIntents> = match &opened {
        Opened::Sqlite(s) => s.clone(),
        #[cfg(feature = "postgres")]
        Opened::Postgres(s) => s.clone(),
        Opened::Memory => Arc::new(agentvisor::stores::MemoryWriteIntents::new()),
    };
    Ok((on_stores(builder, db, opened), intents))
}

/// The git writeback of skills' memory, its parked writes in `intents`.
pub(crate) fn git_writeback(
    intents: Arc<dyn agentvisor::ports::writeback::WriteIntents>,
) -> Arc<agentvisor::writeback::GitWriteback> {
    Arc::new(agentvisor::writeback::GitWriteback::new(intents))
}

/// `base` on the stores `opened` (of `db`): the SQLite file or the
/// PostgreSQL server (audit log, budget ledger, checkpoints, sessions),
/// or the in-memory batteries. The one place a command's host is put on
/// its database.
fn on_stores(base: HostBuilder, db: &Db, opened: Opened) -> HostBuilder {
    match (db, opened) {
        (Db::File(path), Opened::Sqlite(store)) => base
            .config(sqlite_config(path))
            .audit_store(store.clone())
            .checkpointer(store.clone())
            .session_store(store.clone())
            .budget_ledger(store),
        #[cfg(feature = "postgres")]
        (Db::Postgres(_), Opened::Postgres(store)) => base
            .config(postgres_config(&store))
            .audit_store(store.clone())
            .checkpointer(store.clone())
            .session_store(store.clone())
            .budget_ledger(store),
        _ => base
            .config(memory_config())
            .budget_ledger(Arc::new(MemoryBudgetLedger::new())),
    }
}

/// The host the commands that run a manifest build. With
/// `AGENTVISOR_TEST_TOOLS` set (a test hook) it also offers the tools that
/// fail on purpose, `fail` and `panic`.
pub(crate) fn host_builder() -> HostBuilder {
    let builder = Host::builder();
    match std::env::var_os("AGENTVISOR_TEST_TOOLS") {
        Some(_) => builder.test_tools(),
        None => builder,
    }
}

/// How `run` and `swarm` resolve models: tiers from `AGENTVISOR_TIERS`
/// (`fast=ollama:llama3.2,smart=openai:gpt-4o`) over the default tiers, and
/// `--model SPEC` over every manifest's `model` (its `script` is then
/// ignored). Base URLs and keys come from the usual variables
/// (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, …).
pub(crate) fn providers(model: Option<String>) -> Result<ProviderConfig, ExitCode> {
    let tiers = match std::env::var("AGENTVISOR_TIERS") {
        Ok(text) => ModelResolver::parse_tiers(&text)
            .map_err(|e| refuse(format!("AGENTVISOR_TIERS: {e}")))?,
        Err(_) => agentvisor::providers::default_tiers(),
    };
    Ok(ProviderConfig {
        tiers,
        model_override: model,
        ..ProviderConfig::default()
    })
}

/// Opens (or creates) the database, or refuses with exit 2 and a message
/// naming the path; with `--check`, a damaged file is refused too.
pub(crate) async fn open_db(path: &Path) -> Result<SqliteStore, ExitCode> {
    let store = SqliteStore::open(path).await.map_err(refuse)?;
    if store_options().check {
        check_db(&store).await?;
    }
    Ok(store)
}

/// Opens an existing database (readers: `runs`, `replay`), or refuses with
/// exit 2; with `--check`, a damaged file is refused too.
pub(crate) async fn open_existing_db(path: &Path) -> Result<SqliteStore, ExitCode> {
    let store = SqliteStore::open_existing(path).await.map_err(refuse)?;
    if store_options().check {
        check_db(&store).await?;
    }
    Ok(store)
}

/// `PRAGMA quick_check` of the whole file: damage is refused with exit 2
/// and a message naming the path.
pub(crate) async fn check_db(store: &SqliteStore) -> Result<(), ExitCode> {
    store.check().await.map_err(refuse)
}

/// After a host's shutdown: says on stderr how many runs are recorded
/// nowhere (their terminal records reached neither the database nor the
/// spool: what their callers were told, by status), how many audit records
/// could not be written and where the spool is, and how many wait in the
/// spool. Returns whether records were
/// lost (the command then exits non-zero): records neither took, or — the
/// database file having been deleted or replaced while the command ran —
/// records that did not reach it.
pub(crate) fn report_unwritten(host: &Host, stats: &agentvisor::ports::audit::AuditStats) -> bool {
    let spool = host
        .config()
        .audit_spool
        .as_ref()
        .map_or_else(|| "none".to_string(), |p| p.display().to_string());
    if !stats.unrecorded.is_empty() {
        // What the callers were told that no record backs.
        errln!(
            "error: {} run(s) ended but are recorded nowhere ({}): their terminal records could be written neither to the database nor to the spool ({spool}), so `runs list` does not show them",
            stats.unrecorded.total(),
            stats
                .unrecorded
                .by_status()
                .map(|(s, n)| format!("{s} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if stats.store_lost && stats.spooled + stats.unwritten > 0 {
        errln!(
            "error: the database file was deleted or replaced while this command ran: {} audit record(s) could not be written to it ({} in the spool {spool}{})",
            stats.spooled + stats.unwritten,
            stats.spooled,
            if stats.unwritten > 0 {
                format!(", {} in neither", stats.unwritten)
            } else {
                String::new()
            }
        );
        return true;
    }
    if stats.spooled > 0 {
        errln!(
            "warning: {} audit record(s) are in the spool {spool}, not yet in the database; the next command on this database replays them",
            stats.spooled
        );
    }
    if stats.unwritten > 0 {
        errln!(
            "error: {} audit record(s) could not be written: neither the database nor the spool ({spool}) took them",
            stats.unwritten
        );
        return true;
    }
    false
}

/// Host settings for the SQLite store: larger, slightly older audit batches
/// (a transaction costs the same for 1 or 4096 records), and a spool beside
/// the database.
pub(crate) fn sqlite_config(path: &Path) -> HostConfig {
    let spool = store_options().spool.clone().unwrap_or_else(|| {
        let mut spool = path.as_os_str().to_owned();
        spool.push(".spool");
        PathBuf::from(spool)
    });
    database_config(spool)
}

/// Host settings for a database (SQLite or PostgreSQL) whose spool is
/// `spool`, with the lease and retention flags.
fn database_config(spool: PathBuf) -> HostConfig {
    let defaults = HostConfig::default();
    HostConfig {
        audit_batch: 4096,
        audit_max_age: Duration::from_millis(5),
        audit_spool: Some(spool),
        lease_ttl: store_options().lease_ttl.unwrap_or(defaults.lease_ttl),
        retention: store_options().keep.retain.unwrap_or_default(),
        audit: store_options().keep.audit.unwrap_or_default(),
        ..defaults
    }
}

/// Host settings for the PostgreSQL store: as for SQLite (larger audit
/// batches, the lease and retention flags), with a spool in
/// `.agentvisor/` named for the server and database (`--spool` names
/// another), so an outage of the server loses no record: the next command
/// on that database replays it.
#[cfg(feature = "postgres")]
pub(crate) fn postgres_config(store: &agentvisor::stores::PostgresStore) -> HostConfig {
    let spool = store_options().spool.clone().unwrap_or_else(|| {
        let target = store.target();
        let server = target.split_once("://").map_or(target, |(_, s)| s);
        let server = server.rsplit_once('@').map_or(server, |(_, s)| s);
        let name: String = server
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
                _ => '_',
            })
            .collect();
        PathBuf::from(".agentvisor").join(format!("postgres-{name}.spool"))
    });
    if store_options().spool.is_none() {
        // Best effort: a spool that cannot be made is said when needed.
        let _ = std::fs::create_dir_all(".agentvisor");
    }
    database_config(spool)
}

/// Host settings for the in-memory stores: the defaults, with `--audit`.
/// `--retain` bounds a database file; the in-memory audit store is a ring
/// of its latest records whatever it is told, so the flag is said to do
/// nothing there rather than silently taken.
pub(crate) fn memory_config() -> HostConfig {
    if store_options().keep.retain.is_some() {
        tracing::warn!(
            "--retain bounds a database file; with --db :memory: the audit store keeps only its latest {} records (every run is still counted), so --retain has nothing to prune",
            agentvisor::stores::memory::DEFAULT_CAPACITY
        );
    }
    HostConfig {
        audit: store_options().keep.audit.unwrap_or_default(),
        ..HostConfig::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_db_url_is_known_by_its_scheme() {
        let db = |s: &str| Db::from_flag(Some(PathBuf::from(s)));
        assert_eq!(db(":memory:"), Ok(Db::Memory));
        assert_eq!(db("a/b.db"), Ok(Db::File(PathBuf::from("a/b.db"))));
        assert_eq!(db("C:\\x.db"), Ok(Db::File(PathBuf::from("C:\\x.db"))));
        assert_eq!(db("sqlite://a/b.db"), Ok(Db::File(PathBuf::from("a/b.db"))));
        assert_eq!(
            db("SQLite:///tmp/x.db"),
            Ok(Db::File(PathBuf::from("/tmp/x.db")))
        );
        assert!(db("sqlite://").is_err());
        for url in ["mysql://u:pw@h", "nats+tls://h", "x-y.z://"] {
            let e = db(url).unwrap_err();
            assert!(e.contains("not supported"), "{e}");
            assert!(!e.contains("pw"), "{e}");
        }
        // PostgreSQL: taken by a build with the `postgres` feature, refused
        // naming the feature by one without; never its password shown.
        let taken = cfg!(feature = "postgres");
        for url in ["postgres://u:pw@h/db", "PostgreSQL://h/db"] {
            match db(url) {
                Ok(Db::Postgres(u)) if taken => {
                    assert_eq!(u.0.to_lowercase(), url.to_lowercase());
                    assert!(!format!("{u:?}").contains("pw"), "{u:?}");
                }
                Err(e) if !taken => {
                    assert!(e.contains("`postgres` feature"), "{e}");
                    assert!(!e.contains("pw"), "{e}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        // Not a scheme: a path that holds `://` further on.
        assert_eq!(db("./a://b"), Ok(Db::File(PathBuf::from("./a://b"))));
        assert_eq!(db("1x://b"), Ok(Db::File(PathBuf::from("1x://b"))));
        assert_eq!(Db::from_flag(None), Ok(Db::File(PathBuf::from(DEFAULT_DB))));
    }
}
