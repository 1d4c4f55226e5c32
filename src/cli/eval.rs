//! `agentvisor eval --agent NAME --budget-tokens T`: forks every recorded
//! run of a cohort (the agent's runs, newest first: `--status`, `--since`,
//! `--limit`) with the same overrides (`--model`, `--manifest`,
//! `--at-step`), `--repeats` times each, at most `--concurrency` in
//! flight, under one token budget for the whole sweep, and reports what
//! changed (see `agentvisor::eval`). `--report DIR` writes `eval.json` and
//! `index.html` (the table and a histogram of first divergences).
//!
//! Without `--manifest`, the forks run the newest recorded run's agent
//! (name, tools, limits) on `--model`.
//!
//! Exit codes: 0 when every planned fork ran; 1 when the budget stopped
//! the sweep first (the report says what ran); 2 for a refused flag or
//! manifest, or a cohort with no run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use agentvisor::eval::{cohort, eval as sweep, html, EvalOptions};
use agentvisor::fork::Recording;
use agentvisor::ports::audit::AuditStore;
use agentvisor::ports::tool::ToolEffect;
use agentvisor::{AgentSpec, RunStatus};

use super::Db;

/// Flags of `agentvisor eval`.
#[derive(Args, Debug)]
pub(crate) struct EvalArgs {
    /// The cohort's agent (its manifest `name`).
    #[arg(long, value_name = "NAME")]
    agent: String,
    /// Only runs that ended with this status.
    #[arg(long, value_name = "S")]
    status: Option<RunStatus>,
    /// Only runs started at most this long ago (`24h`, `7d` is `168h`).
    #[arg(long, value_name = "DURATION", value_parser = super::flags::duration(std::time::Duration::from_millis(1), std::time::Duration::from_secs(3650 * 24 * 3600)))]
    since: Option<std::time::Duration>,
    /// At most this many runs, newest first.
    #[arg(long, value_name = "N", value_parser = super::flags::whole_u32(1, 1_000_000))]
    limit: Option<u32>,
    /// Go on with this model.
    #[arg(long, value_name = "SPEC")]
    model: Option<String>,
    /// Go on with this manifest.
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// Take steps 1 to K from each recording (capped at its last step).
    #[arg(long, value_name = "K", default_value_t = 0, value_parser = super::flags::whole_u32(0, 100_000))]
    at_step: u32,
    /// Forks of each run.
    #[arg(long, value_name = "R", default_value_t = 1, value_parser = super::flags::whole_u32(1, 1000))]
    repeats: u32,
    /// The token budget of the whole sweep: once spent, no fork is started.
    #[arg(long, value_name = "T", value_parser = super::flags::whole(1, u64::MAX))]
    budget_tokens: u64,
    /// Forks in flight at most.
    #[arg(long, value_name = "C", default_value_t = 4, value_parser = super::flags::whole_usize(1, 10_000))]
    concurrency: usize,
    /// Effect classes whose calls run live besides `read`.
    #[arg(long, value_name = "CLASSES", value_delimiter = ',', value_parser = |s: &str| s.trim().parse::<ToolEffect>())]
    live_tools: Vec<ToolEffect>,
    /// Write `eval.json` and `index.html` to this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn eval(a: EvalArgs, db: &Db) -> ExitCode {
    let path = match db {
        Db::Memory => {
            return super::refuse("--db :memory: keeps no run history; name a database file")
        }
        Db::File(p) => p.clone(),
        Db::Postgres(_) => return super::not_on_postgres("eval"),
    };
    if a.manifest.is_none() && a.model.is_none() {
        return super::refuse("eval: give --model SPEC, --manifest FILE, or both");
    }
    let store = match super::open_existing_db(&path).await {
        Ok(s) => Arc::new(s),
        Err(code) => return code,
    };
    let options = EvalOptions {
        agent: a.agent.clone(),
        status: a.status,
        since: a.since,
        limit: a.limit,
        at_step: a.at_step,
        repeats: a.repeats,
        concurrency: a.concurrency,
        live: a.live_tools.clone(),
    };
    let runs = match cohort(&*store, &options).await {
        Ok(r) if !r.is_empty() => r,
        Ok(_) => {
            return super::refuse(format!(
                "no run of agent `{}` matches in {}",
                a.agent,
                path.display()
            ))
        }
        Err(e) => return super::refuse(format!("{}: {e}", path.display())),
    };
    let mut spec = match &a.manifest {
        Some(file) => match AgentSpec::from_file(file) {
            Ok(s) => s,
            Err(e) => return super::refuse(e),
        },
        None => {
            let records = store.run_records(runs[0].run_id).await.unwrap_or_default();
            match Recording::from_records(runs[0].run_id, &records) {
                Ok(r) => r.spec(),
                Err(e) => return super::refuse(e),
            }
        }
    };
    if let Some(m) = &a.model {
        spec.model = m.clone();
    }
    if let Err(e) = spec.check_changed() {
        return super::refuse(format!("the forks' manifest: {e}"));
    }
    let config = match super::providers(a.model.clone()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(flag) = &a.model {
        if let Err(code) = super::check_model_flag(flag, &config) {
            return code;
        }
    }
    let base = super::host_builder().providers(config);
    let host = match super::host_on(
        base,
        db,
        super::Opened::Sqlite(store),
        Some(a.budget_tokens),
    )
    .await
    {
        Ok(h) => h,
        Err(code) => return code,
    };
    let report = sweep(&host, &runs, spec, &options).await;
    let stats = host.shutdown().await;
    let t = &report.totals;
    if let Some(dir) = &a.report {
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| {
                std::fs::write(
                    dir.join("eval.json"),
                    serde_json::to_string_pretty(&report).unwrap_or_default(),
                )
            })
            .and_then(|()| std::fs::write(dir.join("index.html"), html(&report)));
        if let Err(e) = written {
            errln!("error: --report {}: {e}", dir.display());
            return ExitCode::from(1);
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        outln!("{}", t.sweep_line());
        for (change, n) in &t.status_changes {
            outln!("  {change}: {n}");
        }
        outln!("{}", t.usage_line());
        let histogram: Vec<String> = t
            .divergence_histogram
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        outln!("first divergence: {}", histogram.join(", "));
        for id in &t.changed {
            outln!("ending changed: {id}");
        }
    }
    if super::report_unwritten(&host, &stats) || t.not_run > 0 {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
