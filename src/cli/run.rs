//! `agentvisor run FILE`: one run, its events (with `--events`), its result.
//! Ctrl-C cancels the run; the result is still printed (status `cancelled`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use agentvisor::{Invocation, RunResult, RunStatus};

/// Flags of `agentvisor run`.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The agent manifest (YAML).
    file: PathBuf,
    /// The prompt (default: the manifest's `prompt`).
    #[arg(long)]
    input: Option<String>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Print every event as one JSON line before the result.
    #[arg(long)]
    events: bool,
    /// The caller's token budget for this run.
    #[arg(long, value_name = "N")]
    budget_tokens: Option<u64>,
    /// The caller id the run is charged to.
    #[arg(long, default_value = "cli")]
    caller: String,
    /// Run on this model instead of the manifest's (`openai:MODEL`,
    /// `anthropic:MODEL`, `ollama:MODEL`, `scripted`, or a tier).
    #[arg(long, value_name = "SPEC")]
    model: Option<String>,
}

pub(crate) async fn run(a: RunArgs, db: &super::Db) -> ExitCode {
    let (host, agent) = match super::prepare(&a.file, a.budget_tokens, db, a.model.clone()).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    let inv = Invocation {
        prompt: a.input.unwrap_or_default(),
        caller_id: Some(a.caller),
        ..Default::default()
    };
    let result = match host.submit_streaming(&agent, inv).await {
        Ok((mut handle, mut events)) => {
            let mut cancelled = false;
            loop {
                tokio::select! {
                    ev = events.next() => match ev {
                        Some(ev) => {
                            if a.events {
                                println!("{}", serde_json::to_string(&ev).unwrap_or_default());
                            }
                        }
                        None => break,
                    },
                    _ = tokio::signal::ctrl_c(), if !cancelled => {
                        cancelled = true;
                        handle.cancel();
                    }
                }
            }
            (&mut handle).await
        }
        Err(e) => return super::refuse(e),
    };
    // The result is on record (in the database or its spool) once it is
    // delivered: print it now, before the shutdown drains the rest.
    if a.json {
        println!("{}", serde_json::to_string(&result).unwrap_or_default());
    } else {
        print_human(&result);
    }
    let stats = host.shutdown().await;
    if super::report_unwritten(&host, &stats) {
        return ExitCode::from(1);
    }
    if result.status == RunStatus::Ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

pub(crate) fn print_human(r: &RunResult) {
    let reason = r.kill_reason.map(|k| format!(" ({k})")).unwrap_or_default();
    println!("run {}: {}{reason}", r.run_id, r.status);
    if let Some(kind) = &r.error_kind {
        println!("error: {kind}: {}", r.error.as_deref().unwrap_or(""));
    }
    for s in &r.steps {
        let mark = if s.ok { "ok" } else { "error" };
        println!(
            "  step {} {} {} → {mark} ({} ms)",
            s.iteration, s.tool, s.args, s.duration_ms
        );
    }
    for d in &r.critic {
        println!("  critic {:?} ({}) at {} ms", d.action, d.reason, d.at_ms);
    }
    println!(
        "usage: {} input / {} output tokens, {} iterations, {} ms",
        r.usage.input_tokens,
        r.usage.output_tokens,
        r.iterations,
        r.duration_ms()
    );
    if let Some(out) = &r.output {
        println!("output: {out}");
    }
}
