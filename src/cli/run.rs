//! `agentvisor run FILE`: one run, its events (with `--events`), its result.
//! Ctrl-C cancels the run; the result is still printed (status `cancelled`,
//! with the text streamed so far as its output).
//!
//! `--attach PATH` (repeatable) sends a file with the prompt: a PNG, JPEG,
//! GIF or WebP image as an image, a UTF-8 file as text; at most 5 MiB each
//! (`ports::model::MAX_ATTACHMENT_BYTES`). A file that cannot be read, is
//! too large or is neither is refused with exit 2 before anything runs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use agentvisor::spec::Attachment;
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
    /// Send this file with the prompt (an image, or a text file; at most
    /// 5 MiB). Repeatable.
    #[arg(long, value_name = "PATH")]
    attach: Vec<PathBuf>,
}

/// Reads the `--attach` files, or refuses (exit 2) naming the one that
/// cannot be sent.
fn attachments(paths: &[PathBuf]) -> Result<Vec<Attachment>, ExitCode> {
    paths
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).map_err(|e| {
                super::refuse(format!("--attach {}: cannot read it: {e}", path.display()))
            })?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string());
            Attachment::from_bytes(name, &bytes)
                .map_err(|e| super::refuse(format!("--attach {}: {e}", path.display())))
        })
        .collect()
}

pub(crate) async fn run(a: RunArgs, db: &super::Db) -> ExitCode {
    let attachments = match attachments(&a.attach) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let (host, agent) = match super::prepare(&a.file, a.budget_tokens, db, a.model.clone()).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    let inv = Invocation {
        prompt: a.input.unwrap_or_default(),
        caller_id: Some(a.caller),
        attachments,
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
    host.shutdown().await;
    if a.json {
        println!("{}", serde_json::to_string(&result).unwrap_or_default());
    } else {
        print_human(&result);
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
