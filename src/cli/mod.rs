//! Command-line parsing and the commands. Each command builds a host from
//! the embedded defaults (scripted model, in-memory stores), runs, prints,
//! shuts the host down (so every record is written) and maps the outcome to
//! an exit code.

mod run;
mod swarm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use agentvisor::ports::budget::BudgetLimits;
use agentvisor::stores::MemoryBudgetLedger;
use agentvisor::tools::RegistryError;
use agentvisor::{Agent, AgentSpec, Host, HostBuilder, SubmitError};

/// agentvisor: run LLM agent runs as supervised actors.
#[derive(Parser, Debug)]
#[command(name = "agentvisor", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one agent and print its result (exit 0 iff the status is `ok`).
    Run(run::RunArgs),
    /// Run a manifest many times with bounded concurrency and print a summary.
    Swarm(swarm::SwarmArgs),
}

/// Runs the chosen command.
pub(crate) async fn dispatch(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run(a) => run::run(a).await,
        Command::Swarm(a) => swarm::swarm(a).await,
    }
}

/// Logs to stderr, filtered by `AGENTVISOR_LOG` (default: warnings).
pub(crate) fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENTVISOR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Input refused before any run: print it and exit 2.
pub(crate) fn refuse(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

/// Loads a manifest and prepares it on a host with the embedded defaults;
/// the caller's token budget comes from `budget_tokens` or the manifest.
pub(crate) async fn prepare(file: &PathBuf, budget_tokens: Option<u64>) -> Result<(Host, Agent), ExitCode> {
    let spec = AgentSpec::from_file(file).map_err(refuse)?;
    let tokens = budget_tokens.or(spec.budget.and_then(|b| b.tokens));
    let ledger = MemoryBudgetLedger::with_default_limits(BudgetLimits {
        tokens,
        ..Default::default()
    });
    let host = host_builder()
        .budget_ledger(std::sync::Arc::new(ledger))
        .build()
        .await
        .map_err(refuse)?;
    let agent = host.agent(spec).map_err(|e| {
        let line = match &e {
            SubmitError::Tool(RegistryError::UnknownTool { name, .. }) => std::fs::read_to_string(file)
                .map(|text| agentvisor::spec::line_of(&text, name))
                .unwrap_or_default(),
            _ => String::new(),
        };
        refuse(format!("invalid manifest {}: {e}{line}", file.display()))
    })?;
    Ok((host, agent))
}

fn host_builder() -> HostBuilder {
    Host::builder()
}

/// Peak resident set size of this process, in bytes (Linux; 0 elsewhere).
pub(crate) fn peak_rss_bytes() -> u64 {
    proc_status_kib("VmHWM:") * 1024
}

/// Current resident set size, in bytes (Linux; 0 elsewhere).
#[allow(dead_code)]
pub(crate) fn rss_bytes() -> u64 {
    proc_status_kib("VmRSS:") * 1024
}

fn proc_status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
