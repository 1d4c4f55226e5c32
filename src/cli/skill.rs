//! `agentvisor skill check|list|run`: scheduled skills (see
//! `agentvisor::skills` and docs/skills.md).
//!
//! - `skill check REPO`: reads and checks the repository
//!   (`agentvisor.yaml`, every listed `SKILL.md` and its includes); prints
//!   what it holds.
//! - `skill list REPO [--json]`: the schedules, each with its next fire
//!   time in its own time zone (and in UTC with `--json`).
//! - `skill run REPO --schedule NAME [--dry-run] [--skip-push] [--json]`:
//!   runs the schedule's skill once now on a host with the usual stores
//!   (`--db`), through the host's admission like any run, delivers its
//!   publishes (recorded with its terminal record: the outbox) and waits
//!   for each outcome, and prints the result (`outcome`, `status`,
//!   `kill_reason`, usage, `cost_micros`, `output`, `outputs`, `memory`,
//!   `publish`, `writeback_sha`, `phases`). `--dry-run` stops after the
//!   model and the parsing: nothing is published or written back.
//!   `--skip-push` keeps a writeback's commit local.
//!
//! Exit codes: 0 when the check passes, the list prints, or the run
//! succeeded; 1 when the run failed (a missing secret included) or ended
//! `partial_failure` (a publish or the writeback failed); 2 when the
//! repository is refused (unknown key, bad cron, unknown time zone,
//! unknown skill, an include out of the repository, …: the message names
//! the file, the key and the line) or the schedule is unknown.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde::Serialize;

use agentvisor::skill_run::{self, SkillRunResult};
use agentvisor::skills::{Schedule, SkillsRepo, Timestamp};

use super::Db;

/// Flags of `agentvisor skill`.
#[derive(Args, Debug)]
pub(crate) struct SkillArgs {
    #[command(subcommand)]
    command: SkillCommand,
}

#[derive(Subcommand, Debug)]
enum SkillCommand {
    /// Check a skills repository (validation only).
    Check(CheckArgs),
    /// The schedules of a skills repository and when each fires next.
    List(ListArgs),
    /// Run one schedule's skill now.
    Run(RunArgs),
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// The repository (the folder with `agentvisor.yaml`).
    repo: PathBuf,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// The repository (the folder with `agentvisor.yaml`).
    repo: PathBuf,
    /// Print one JSON array.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The repository (the folder with `agentvisor.yaml`).
    repo: PathBuf,
    /// The schedule to run.
    #[arg(long, value_name = "NAME")]
    schedule: String,
    /// Stop after the model and the parsing: no publish, no writeback.
    #[arg(long)]
    dry_run: bool,
    /// Commit the memory but do not push it.
    #[arg(long)]
    skip_push: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn skill(a: SkillArgs, db: &Db) -> ExitCode {
    match a.command {
        SkillCommand::Check(a) => check(a),
        SkillCommand::List(a) => list(a),
        SkillCommand::Run(a) => run(a, db).await,
    }
}

fn open(repo: &PathBuf) -> Result<SkillsRepo, ExitCode> {
    SkillsRepo::open(repo).map_err(super::refuse)
}

fn check(a: CheckArgs) -> ExitCode {
    let repo = match open(&a.repo) {
        Ok(r) => r,
        Err(code) => return code,
    };
    outln!(
        "{}: ok: {} skill(s), {} schedule(s)",
        a.repo.display(),
        repo.skills.len(),
        repo.schedules.len()
    );
    for s in &repo.schedules {
        outln!(
            "  {} → skill {}: {} ({})",
            s.name,
            s.skill,
            s.clock.cron(),
            s.timezone
        );
    }
    ExitCode::SUCCESS
}

/// One row of `skill list --json`.
#[derive(Serialize)]
struct Row<'a> {
    name: &'a str,
    skill: &'a str,
    cron: &'a str,
    timezone: &'a str,
    jitter_secs: u64,
    /// In the schedule's time zone (RFC 9557: `2026-03-08T03:00:00-04:00[America/New_York]`).
    next_fire: Option<String>,
    /// The same instant in UTC (RFC 3339).
    next_fire_utc: Option<String>,
}

fn row(s: &Schedule, now: Timestamp) -> Row<'_> {
    let next = s.next_fire(now);
    Row {
        name: &s.name,
        skill: &s.skill,
        cron: s.clock.cron().as_str(),
        timezone: &s.timezone,
        jitter_secs: s.clock.offset().as_secs(),
        next_fire: next.map(|t| t.to_zoned_datetime(s.clock.time_zone().clone()).to_string()),
        next_fire_utc: next.map(|t| t.to_string()),
    }
}

fn list(a: ListArgs) -> ExitCode {
    let repo = match open(&a.repo) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let now = Timestamp::now();
    let rows: Vec<Row<'_>> = repo.schedules.iter().map(|s| row(s, now)).collect();
    if a.json {
        outln!("{}", serde_json::to_string(&rows).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    if rows.is_empty() {
        outln!("no schedules");
        return ExitCode::SUCCESS;
    }
    for r in &rows {
        outln!(
            "{}  skill {}  cron {:?}  {}  next {}",
            r.name,
            r.skill,
            r.cron,
            r.timezone,
            r.next_fire.as_deref().unwrap_or("never")
        );
    }
    ExitCode::SUCCESS
}

async fn run(a: RunArgs, db: &Db) -> ExitCode {
    let repo = match open(&a.repo) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if repo.schedule(&a.schedule).is_none() {
        let known: Vec<&str> = repo.schedules.iter().map(|s| s.name.as_str()).collect();
        return super::refuse(format!(
            "{}: no schedule `{}` (known: {})",
            a.repo.display(),
            a.schedule,
            known.join(", ")
        ));
    }
    let config = match super::providers(None) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (builder, intents) =
        match super::with_stores(super::host_builder().providers(config), db).await {
            Ok(b) => b,
            Err(code) => return code,
        };
    let host = match builder.build().await {
        Ok(h) => h,
        Err(e) => return super::refuse(e),
    };
    let options = skill_run::RunOptions {
        dry_run: a.dry_run,
        skip_push: a.skip_push,
        writeback: Some(super::git_writeback(intents)),
    };
    let result = skill_run::run(
        &host,
        &repo,
        &a.schedule,
        |k| std::env::var(k).ok(),
        &options,
    )
    .await;
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            host.shutdown().await;
            return super::refuse(e);
        }
    };
    if a.json {
        outln!("{}", serde_json::to_string(&result).unwrap_or_default());
    } else {
        print_human(&result);
    }
    let stats = host.shutdown().await;
    if super::report_unwritten(&host, &stats) {
        return ExitCode::from(1);
    }
    match result.outcome {
        skill_run::Outcome::Succeeded => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    }
}

fn print_human(r: &SkillRunResult) {
    let outcome = serde_json::to_value(r.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    outln!(
        "schedule {} (skill {}): {outcome}{}",
        r.schedule,
        r.skill,
        if r.dry_run { " (dry run)" } else { "" }
    );
    if let (Some(id), Some(status)) = (r.run_id, r.status) {
        let reason = r.kill_reason.map(|k| format!(" ({k})")).unwrap_or_default();
        outln!("run {id}: {status}{reason}");
    }
    if let Some(kind) = &r.error_kind {
        outln!("error: {kind}: {}", r.error.as_deref().unwrap_or(""));
    }
    outln!(
        "usage: {} input / {} output tokens, cost {} µ$",
        r.usage.own.input_tokens,
        r.usage.own.output_tokens,
        r.cost_micros
    );
    if let Some(out) = &r.output {
        outln!("output: {out}");
    }
    for (name, text) in &r.outputs {
        outln!("output {name}: {text}");
    }
    if let Some(m) = &r.memory {
        outln!("memory: {m}");
    }
    for p in &r.publish {
        let state = p.state.as_str();
        let more = p
            .error
            .as_deref()
            .or(p.detail.as_deref())
            .map(|t| format!(": {t}"))
            .unwrap_or_default();
        outln!(
            "publish {} ({} {}): {state} after {} tr{}{more}",
            p.name,
            p.kind,
            p.target,
            p.attempts,
            if p.attempts == 1 { "y" } else { "ies" }
        );
    }
    if let Some(sha) = &r.writeback_sha {
        outln!("writeback: {sha}");
    }
}
