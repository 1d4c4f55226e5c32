//! `agentvisor run FILE`: one run, its events (with `--events`), its result;
//! with `--explain`, where its model resolves (tiers, provider, base URL,
//! key variable), and no run.
//! Ctrl-C cancels the run; the result is still printed (status `cancelled`,
//! with the text streamed so far as its output). SIGTERM or SIGHUP give the
//! run `--drain` (default 10 s) to finish, then cancel it, print its result
//! and exit 143 / 129 (a second signal cancels at once); see `signals`.
//!
//! A manifest with `phases:` runs as a pipeline (`agentvisor::pipeline`):
//! its phases in order, each a run of its own recorded under the
//! pipeline's id (`agentvisor runs show ID --tree` prints them); `--events`
//! prints every phase's events, `--json` the pipeline's result; a signal
//! stops the phase in flight as it would a run, and the rest do not run.
//!
//! `--attach PATH` (repeatable) sends a file with the prompt: a PNG, JPEG,
//! GIF or WebP image as an image, a UTF-8 file as text; at most 5 MiB each
//! (`ports::model::MAX_ATTACHMENT_BYTES`). A file that cannot be read, is
//! too large or is neither is refused with exit 2 before anything runs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use agentvisor::spec::Attachment;
use agentvisor::{
    Event, Host, Invocation, PipelineResult, PipelineRun, RunEvents, RunHandle, RunResult,
    RunStatus,
};

use super::approvals::{Approvals, ApproveMode};
use super::signals::{Caught, Signals};

/// Flags of `agentvisor run`.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// What the database keeps (`--retain`).
    #[command(flatten)]
    pub(crate) keep: super::keep::KeepArgs,
    /// The agent manifest (YAML).
    file: PathBuf,
    /// The prompt (default: the manifest's `prompt`); `-` reads it from stdin.
    #[arg(long, allow_hyphen_values = true)]
    input: Option<String>,
    /// Named inputs as a JSON object (`{"city": "Oslo"}`): they fill the
    /// manifest's `{{inputs.NAME}}` placeholders in `prompt` and `system`.
    #[arg(long, value_name = "JSON")]
    inputs: Option<String>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Print every event as one JSON line before the result.
    #[arg(long)]
    events: bool,
    /// A token budget for this command (at least 1): on top of the
    /// manifest's `budget` and the caller's stored limits; the tightest
    /// wins.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = super::flags::whole(1, u64::MAX))]
    budget_tokens: Option<u64>,
    /// The caller id the run is charged to.
    #[arg(long, default_value = "cli")]
    caller: String,
    /// After SIGTERM or SIGHUP, how long the run may go on before it is
    /// cancelled (default 10s).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = super::signals::drain_flag)]
    drain: Option<std::time::Duration>,
    /// Run on this model instead of the manifest's (`openai:MODEL`,
    /// `anthropic:MODEL`, `ollama:MODEL`, `scripted`, or a tier).
    #[arg(long, value_name = "SPEC")]
    model: Option<String>,
    /// Send this file with the prompt (an image, or a text file; at most
    /// 5 MiB). Repeatable.
    #[arg(long, value_name = "PATH")]
    attach: Vec<PathBuf>,
    /// How tool calls the manifest gates (`approval:`) are decided: `ask`
    /// at the terminal (denied when stdin is not one), `all` approved,
    /// `none` denied.
    #[arg(long, value_enum, default_value_t = ApproveMode::Ask)]
    approve: ApproveMode,
    /// Print where the model resolves (the tiers followed, the provider,
    /// its base URL, its key's variable) and exit without running.
    #[arg(long)]
    explain: bool,
}

/// `run --explain`: where the manifest's model (or `--model`) resolves.
fn explain(a: &RunArgs) -> ExitCode {
    let config = match super::providers(a.model.clone()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let spec = match agentvisor::AgentSpec::from_file(&a.file) {
        Ok(s) => s,
        Err(e) => return super::refuse(e),
    };
    match agentvisor::providers::ModelResolver::new(config).explain(&spec) {
        Ok(x) => {
            for line in x.to_string().lines() {
                outln!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => super::refuse(format!("{}: {e}", a.file.display())),
    }
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

pub(crate) async fn run(mut a: RunArgs, db: &super::Db) -> ExitCode {
    if a.explain {
        return explain(&a);
    }
    let mut signals = match Signals::listen() {
        Ok(s) => s,
        Err(e) => return super::refuse(format!("cannot listen for signals: {e}")),
    };
    let attachments = match attachments(&a.attach) {
        Ok(x) => x,
        Err(code) => return code,
    };
    a.input = match super::input_text(a.input.take()) {
        Ok(i) => i,
        Err(code) => return code,
    };
    let (host, agent) = match super::prepare(&a.file, a.budget_tokens, db, a.model.clone()).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    let inputs = match super::inputs_flag(a.inputs.as_deref()) {
        Ok(i) => i,
        Err(code) => return code,
    };
    let inv = Invocation {
        prompt: a.input.take().unwrap_or_default(),
        inputs,
        caller_id: Some(a.caller.clone()),
        attachments,
        ..Default::default()
    };
    if !agent.spec().phases.is_empty() {
        return pipeline(host, agent.spec().clone(), inv, &a, &mut signals).await;
    }
    let (caught, result) = match host.submit_streaming(&agent, inv).await {
        Ok((mut handle, events)) => {
            let mut run = Streaming {
                handle: &handle,
                events,
            };
            let caught = follow(&host, &mut run, &a, &mut signals, ("the run", "it")).await;
            (caught, (&mut handle).await)
        }
        Err(e) => return super::refuse(e),
    };
    // The result is on record (in the database or its spool) once it is
    // delivered: print it now, before the shutdown drains the rest.
    if a.json {
        outln!("{}", serde_json::to_string(&result).unwrap_or_default());
    } else {
        print_human(&result);
    }
    let (caught, unanswered) = caught;
    let stats = host.shutdown().await;
    let code = if super::report_unwritten(&host, &stats) {
        1
    } else if let Some(s) = caught {
        s.exit_code()
    } else if result.status == RunStatus::Ok {
        0
    } else {
        1
    };
    exit(code, unanswered)
}

/// What `run` follows to its end: a run, or a pipeline.
trait Followed {
    /// The next event, or `None` once it has ended.
    async fn next_event(&mut self) -> Option<Event>;
    /// Cancels it (a pipeline: the phase in flight, and the rest do not run).
    fn cancel(&self);
}

/// A run's handle and its events.
struct Streaming<'a> {
    handle: &'a RunHandle,
    events: RunEvents,
}

impl Followed for Streaming<'_> {
    async fn next_event(&mut self) -> Option<Event> {
        self.events.next().await
    }

    fn cancel(&self) {
        self.handle.cancel();
    }
}

impl Followed for PipelineRun {
    async fn next_event(&mut self) -> Option<Event> {
        PipelineRun::next_event(self).await
    }

    fn cancel(&self) {
        PipelineRun::cancel(self);
    }
}

/// Prints the events of `run` (with `--events`) until it ends, deciding
/// the tool calls it asks approval for (`--approve`, see `approvals`) and
/// answering signals: Ctrl-C, or a second signal, cancels it at once; a
/// first SIGTERM or SIGHUP lets it go on for `--drain`, then cancels it.
/// `said` names what may finish and what is then cancelled, for the line
/// that tells so. Returns the SIGTERM or SIGHUP caught, if one was, and
/// whether a question at the terminal was left unanswered (the run ended
/// while it waited: the command must then exit without waiting for the
/// read of stdin, see [`exit`]).
async fn follow(
    host: &Host,
    run: &mut impl Followed,
    a: &RunArgs,
    signals: &mut Signals,
    said: (&str, &str),
) -> (Option<Caught>, bool) {
    let (finishing, cancelled_then) = said;
    let mut approvals = Approvals::new(a.approve);
    let mut caught: Option<Caught> = None;
    let mut cancelled = false;
    let drain = a.drain.unwrap_or(super::signals::DEFAULT_DRAIN);
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            ev = run.next_event() => match ev {
                Some(ev) => {
                    if a.events {
                        outln!("{}", serde_json::to_string(&ev).unwrap_or_default());
                    }
                    approvals.requested(host, &ev);
                }
                None => break,
            },
            answer = approvals.answer(), if approvals.is_asking() => {
                approvals.answered(host, &answer);
            }
            s = signals.next() => {
                if s == Caught::Int || caught.is_some() {
                    // Ctrl-C, or a second signal: cancel now.
                    cancelled = true;
                    run.cancel();
                } else {
                    caught = Some(s);
                    errln!("{}: {finishing} may finish within {}; then {cancelled_then} is cancelled", s.name(), agentvisor::spec::format_duration(drain));
                    drain_until = Some(tokio::time::Instant::now() + drain);
                }
            }
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now)), if drain_until.is_some() && !cancelled => {
                cancelled = true;
                run.cancel();
            }
        }
    }
    (caught, approvals.is_asking())
}

/// The command's exit: with a question left open at the terminal, at once
/// (the runtime would wait for the read of stdin), its records written
/// and its spans exported first.
fn exit(code: u8, unanswered: bool) -> ExitCode {
    if unanswered {
        errln!("(the question was left unanswered: the run has ended)");
        super::exit_now(code);
    }
    ExitCode::from(code)
}

/// `run` of a pipeline manifest (see the module doc).
async fn pipeline(
    host: Host,
    spec: agentvisor::AgentSpec,
    inv: Invocation,
    a: &RunArgs,
    signals: &mut Signals,
) -> ExitCode {
    let mut run = host.start_pipeline(spec, inv);
    let caught = follow(
        &host,
        &mut run,
        a,
        signals,
        ("the phase in flight", "the pipeline"),
    )
    .await;
    let (caught, unanswered) = caught;
    let result = run.result().await;
    let refused = match &result {
        Ok(r) => {
            if a.json {
                outln!("{}", serde_json::to_string(r).unwrap_or_default());
            } else {
                print_pipeline(r);
            }
            None
        }
        Err(e) => Some(super::refuse(e)),
    };
    let stats = host.shutdown().await;
    let code = if super::report_unwritten(&host, &stats) {
        1
    } else if let Some(s) = caught {
        s.exit_code()
    } else if let Some(refused) = refused {
        return refused;
    } else if result.is_ok_and(|r| r.status == RunStatus::Ok) {
        0
    } else {
        1
    };
    exit(code, unanswered)
}

fn print_pipeline(r: &PipelineResult) {
    let reason = r.kill_reason.map(|k| format!(" ({k})")).unwrap_or_default();
    outln!(
        "pipeline {} ({}): {}{reason}",
        r.pipeline_id,
        r.agent,
        r.status
    );
    if let (Some(phase), Some(kind)) = (&r.failed_phase, &r.error_kind) {
        outln!(
            "error: phase {phase}: {kind}: {}",
            r.error.as_deref().unwrap_or("")
        );
    }
    for p in &r.phases {
        let optional = if p.optional { " [optional]" } else { "" };
        match (p.status, p.run_id) {
            (Some(status), Some(id)) => {
                let why = p
                    .kill_reason
                    .map(|k| k.to_string())
                    .or_else(|| p.error_kind.clone())
                    .filter(|_| status != RunStatus::Ok)
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default();
                let resumed = if p.resumed {
                    ", from an earlier run"
                } else {
                    ""
                };
                outln!(
                    "  phase {}{optional}: {status}{why}, run {id}, {} tokens{resumed}",
                    p.name,
                    p.usage.total()
                );
            }
            _ => outln!("  phase {}{optional}: not run", p.name),
        }
    }
    outln!(
        "usage: {} input / {} output tokens, {} ms",
        r.usage.input_tokens,
        r.usage.output_tokens,
        r.finished_at.saturating_sub(r.started_at)
    );
    if let Some(out) = &r.output {
        outln!("output: {out}");
    }
}

pub(crate) fn print_human(r: &RunResult) {
    let reason = r.kill_reason.map(|k| format!(" ({k})")).unwrap_or_default();
    outln!("run {}: {}{reason}", r.run_id, r.status);
    if let Some(kind) = &r.error_kind {
        outln!("error: {kind}: {}", r.error.as_deref().unwrap_or(""));
    }
    for s in &r.steps {
        let mark = if s.ok { "ok" } else { "error" };
        outln!(
            "  step {} {} {} → {mark} ({} ms)",
            s.iteration,
            s.tool,
            s.args,
            s.duration_ms
        );
    }
    for d in &r.critic {
        outln!("  critic {:?} ({}) at {} ms", d.action, d.reason, d.at_ms);
    }
    outln!(
        "usage: {} input / {} output tokens, {} iterations, {} ms",
        r.usage.input_tokens,
        r.usage.output_tokens,
        r.iterations,
        r.duration_ms()
    );
    if let Some(out) = &r.output {
        outln!("output: {out}");
    }
}
