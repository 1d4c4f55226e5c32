//! `agentvisor fork RUN_ID --at-step K`: a new run whose steps 1 to K are
//! taken from the recorded run and which then goes on live under the
//! settings given (`--model`, `--system`/`--system-file`, `--prompt`,
//! `--manifest`, `--critic-policy`), recorded in the database like any
//! run (see `agentvisor::fork`). Tool calls after K follow the effect
//! policy: `read` tools run live; `write`, `egress` and `unknown` ones are
//! answered from the recording, or get `not_executed_in_fork`, unless
//! `--live-tools` names their class.
//!
//! Without `--manifest` the fork runs the manifest the recorded run ran
//! (the database keeps it: system prompt, script, tools, policies); a run
//! recorded before it did has its agent's name, model, tools and limits
//! only, so a scripted one of those needs `--manifest` or `--model`.
//! Calls that need an operator's approval are denied (no one is asked).
//!
//! Prints the fork's result (with `forked_from`) and the first replayed
//! step that differs from the recording, if one does; `--json` prints
//! `{"result": …, "divergence": …}`, `--events` each event first.
//!
//! Exit codes: 0 iff the fork ends `ok`; 1 for any other status; 2 when
//! the run is not on record, K is past its last step, or a flag or the
//! manifest is refused. Ctrl-C cancels the fork (its result is printed).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use agentvisor::fork::{fork as start_fork, ForkError, ForkOptions, Recording};
use agentvisor::ports::audit::AuditStore;
use agentvisor::ports::tool::ToolEffect;
use agentvisor::spec::CriticSpec;
use agentvisor::{AgentSpec, RunId, RunStatus};

use super::approvals::{Approvals, ApproveMode};
use super::Db;

/// Flags of `agentvisor fork`.
#[derive(Args, Debug)]
pub(crate) struct ForkArgs {
    /// The recorded run (32 hex digits, as `agentvisor runs list` prints it).
    run_id: String,
    /// Take steps 1 to K (model calls) from the recording; 0 takes none.
    #[arg(long, value_name = "K", allow_hyphen_values = true, value_parser = super::flags::whole_u32(0, 100_000))]
    at_step: u32,
    /// Go on with this model (`openai:MODEL`, `anthropic:MODEL`,
    /// `ollama:MODEL`, `scripted`, or a tier).
    #[arg(long, value_name = "SPEC")]
    model: Option<String>,
    /// Go on with this system prompt.
    #[arg(long, value_name = "TEXT", conflicts_with = "system_file")]
    system: Option<String>,
    /// Go on with the system prompt in this file.
    #[arg(long, value_name = "F")]
    system_file: Option<PathBuf>,
    /// The prompt (default: the recorded run's).
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    prompt: Option<String>,
    /// Go on with this manifest (default: the recorded agent's name,
    /// model, tools and limits).
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// The critic section to go on with, as YAML (`{loops: {repeat: 2}}`,
    /// `{policy: judge, model: smart}`), or `rules` for the default one.
    #[arg(long, value_name = "POLICY")]
    critic_policy: Option<String>,
    /// Effect classes whose calls run live besides `read` (`write`,
    /// `egress`, `unknown`; comma-separated).
    #[arg(long, value_name = "CLASSES", value_delimiter = ',', value_parser = effect_flag)]
    live_tools: Vec<ToolEffect>,
    /// Print `{"result": …, "divergence": …}` as one JSON object.
    #[arg(long)]
    json: bool,
    /// Print every event as one JSON line before the result.
    #[arg(long)]
    events: bool,
}

/// `--live-tools`: an effect class.
fn effect_flag(s: &str) -> Result<ToolEffect, String> {
    s.trim().parse()
}

/// The manifest the fork goes on with, its overrides applied and checked.
fn fork_spec(a: &ForkArgs, recording: &Recording) -> Result<AgentSpec, ExitCode> {
    let mut spec = match &a.manifest {
        Some(file) => AgentSpec::from_file(file).map_err(super::refuse)?,
        None => {
            let spec = recording.spec();
            if spec.model.starts_with("scripted") && a.model.is_none() && !recording.has_manifest()
            {
                return Err(super::refuse(format!(
                    "run {} ran on the scripted model, whose script is not on record: give --manifest FILE (with the script to go on with) or --model",
                    recording.run_id()
                )));
            }
            spec
        }
    };
    if let Some(m) = &a.model {
        // `--model` replaces the manifest's model (and its script, unless
        // it names the scripted model): checked as such.
        spec.model = m.clone();
    }
    if let Some(text) = &a.system {
        spec.system = text.clone();
    }
    if let Some(file) = &a.system_file {
        spec.system = std::fs::read_to_string(file).map_err(|e| {
            super::refuse(format!(
                "--system-file {}: cannot read it: {e}",
                file.display()
            ))
        })?;
    }
    if let Some(policy) = &a.critic_policy {
        spec.critic = if policy.trim() == "rules" {
            CriticSpec::default()
        } else {
            serde_norway::from_str(policy)
                .map_err(|e| super::refuse(format!("--critic-policy: {e}")))?
        };
    }
    spec.check_changed()
        .map_err(|e| super::refuse(format!("the fork's manifest: {e}")))?;
    Ok(spec)
}

pub(crate) async fn fork(a: ForkArgs, db: &Db) -> ExitCode {
    let path = match db {
        Db::Memory => {
            return super::refuse("--db :memory: keeps no run history; name a database file")
        }
        Db::File(p) => p.clone(),
        Db::Postgres(_) => return super::not_on_postgres("fork"),
    };
    let run_id: RunId = match a.run_id.parse() {
        Ok(id) if a.run_id.len() == 32 => id,
        _ => return super::refuse(format!("`{}` is not a run id (32 hex digits)", a.run_id)),
    };
    let store = match super::open_existing_db(&path).await {
        Ok(s) => Arc::new(s),
        Err(code) => return code,
    };
    let records = match store.run_records(run_id).await {
        Ok(r) => r,
        Err(e) => return super::refuse(format!("{}: {e}", path.display())),
    };
    let recording = match Recording::from_records(run_id, &records) {
        Ok(r) => r,
        Err(ForkError::NotRecorded(_)) => {
            return super::refuse(format!("no run {run_id} in {}", path.display()))
        }
        Err(e) => return super::refuse(e),
    };
    let spec = match fork_spec(&a, &recording) {
        Ok(s) => s,
        Err(code) => return code,
    };
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
    let host = match super::host_on(base, db, super::Opened::Sqlite(store), None).await {
        Ok(h) => h,
        Err(code) => return code,
    };
    let options = ForkOptions {
        at_step: a.at_step,
        live: a.live_tools.clone(),
        prompt: a.prompt.clone(),
        ..Default::default()
    };
    let mut run = match start_fork(&host, spec, &recording, options).await {
        Ok(r) => r,
        Err(e) => {
            host.shutdown().await;
            return super::refuse(e);
        }
    };
    let mut approvals = Approvals::new(ApproveMode::None);
    let mut cancelled = false;
    loop {
        tokio::select! {
            ev = run.next_event() => match ev {
                Some(ev) => {
                    if a.events {
                        outln!("{}", serde_json::to_string(&ev).unwrap_or_default());
                    }
                    approvals.requested(&host, &ev);
                }
                None => break,
            },
            _ = tokio::signal::ctrl_c(), if !cancelled => {
                cancelled = true;
                run.handle().cancel();
            }
        }
    }
    let outcome = run.finish().await;
    if a.json {
        outln!("{}", serde_json::to_string(&outcome).unwrap_or_default());
    } else {
        super::run::print_human(&outcome.result);
        if let Some(f) = outcome.result.forked_from {
            outln!("forked from run {} at step {}", f.run_id, f.step);
        }
        match &outcome.divergence {
            None if a.at_step == 0 => {}
            None => outln!("replayed steps 1 to {}: as recorded", a.at_step),
            Some(d) => outln!(
                "replayed step {} differs from the recording: recorded {}, forked {}",
                d.step,
                serde_json::to_string(&d.recorded).unwrap_or_default(),
                serde_json::to_string(&d.forked).unwrap_or_default()
            ),
        }
    }
    let stats = host.shutdown().await;
    if super::report_unwritten(&host, &stats) {
        return ExitCode::from(1);
    }
    if outcome.result.status == RunStatus::Ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
