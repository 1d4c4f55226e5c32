//! `agentvisor diff RUN_A RUN_B`: aligns two recorded runs step by step
//! (see `agentvisor::diff`) and prints their first divergence, then each
//! pair of steps that differs in anything, then the two endings.
//! `--json` prints the stable JSON form (`docs/fork.md`).
//!
//! Exit codes, as `diff(1)`'s: 0 when the traces agree (no
//! `first_divergence`), 1 when they differ, 2 when an id is malformed, a
//! run is not on record or the database cannot be opened.

use std::process::ExitCode;

use clap::Args;

use agentvisor::diff::{diff as diff_runs, RunSide, StepTrace};
use agentvisor::ports::audit::AuditStore;
use agentvisor::RunId;

use super::Db;

/// Flags of `agentvisor diff`.
#[derive(Args, Debug)]
pub(crate) struct DiffArgs {
    /// The first run (32 hex digits).
    run_a: String,
    /// The second run.
    run_b: String,
    /// Print the diff as one JSON object.
    #[arg(long)]
    json: bool,
}

fn run_id(text: &str) -> Result<RunId, ExitCode> {
    match text.parse() {
        Ok(id) if text.len() == 32 => Ok(id),
        _ => Err(super::refuse(format!(
            "`{text}` is not a run id (32 hex digits)"
        ))),
    }
}

pub(crate) async fn diff(a: DiffArgs, db: &Db) -> ExitCode {
    let path = match db {
        Db::Memory => {
            return super::refuse("--db :memory: keeps no run history; name a database file")
        }
        Db::File(p) => p,
        Db::Postgres(_) => return super::not_on_postgres("diff"),
    };
    let (id_a, id_b) = match (run_id(&a.run_a), run_id(&a.run_b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let store = match super::open_existing_db(path).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let (ra, rb) = (store.run_records(id_a).await, store.run_records(id_b).await);
    store.close().await;
    let (ra, rb) = match (ra, rb) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return super::refuse(format!("{}: {e}", path.display())),
    };
    let d = match diff_runs(id_a, &ra, id_b, &rb) {
        Ok(d) => d,
        Err(e) => return super::refuse(format!("{e} in {}", path.display())),
    };
    if a.json {
        outln!("{}", serde_json::to_string(&d).unwrap_or_default());
    } else {
        match &d.first_divergence {
            None => outln!("runs {id_a} and {id_b} agree ({} steps)", d.steps.len()),
            Some(f) => outln!(
                "first divergence at step {} ({})",
                f.step,
                f.what.join(", ")
            ),
        }
        for p in d.steps.iter().filter(|p| !p.differences.is_empty()) {
            outln!("step {}: {}", p.step, p.differences.join(", "));
            outln!("  a: {}", step_line(p.a.as_ref()));
            outln!("  b: {}", step_line(p.b.as_ref()));
        }
        outln!("a: {}", side_line(&d.a));
        outln!("b: {}", side_line(&d.b));
    }
    if d.first_divergence.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn step_line(s: Option<&StepTrace>) -> String {
    let Some(s) = s else {
        return "(no step)".into();
    };
    let calls: Vec<String> = s
        .calls
        .iter()
        .map(|c| format!("{}({})", c.tool, c.args))
        .collect();
    let results: Vec<String> = s
        .results
        .iter()
        .map(|r| format!("{}{}", if r.ok { "" } else { "error " }, r.result))
        .collect();
    format!(
        "text {:?}, calls [{}], results [{}], {} tokens{}",
        agentvisor::ports::run::cap_text(&s.text, 120),
        calls.join(", "),
        results.join(", "),
        s.usage.input_tokens + s.usage.output_tokens,
        s.latency_ms
            .map(|l| format!(", {l} ms"))
            .unwrap_or_default()
    )
}

fn side_line(s: &RunSide) -> String {
    let status = s.status.map_or("not ended".to_string(), |x| x.to_string());
    let why = s
        .kill_reason
        .map(|k| k.to_string())
        .or_else(|| s.error_kind.clone())
        .map(|w| format!(" ({w})"))
        .unwrap_or_default();
    format!(
        "run {} {status}{why}, {} steps, {} tokens, {} µ$, {} ms, output {:?}{}",
        s.run_id,
        s.steps,
        s.tokens.input + s.tokens.output,
        s.cost_micros,
        s.duration_ms,
        s.output
            .as_deref()
            .map(|o| agentvisor::ports::run::cap_text(o, 120)),
        s.forked_from
            .map(|f| format!(", forked from {} at step {}", f.run_id, f.step))
            .unwrap_or_default()
    )
}
