//! `agentvisor replay RUN_ID`: re-runs a recorded run against its recorded
//! model responses and tool results and reports whether the trace is the
//! same. Exit 0 iff it is; 1 when it differs or the run is not on record; 2
//! when the database cannot be opened or the id is malformed.

use std::process::ExitCode;

use clap::Args;

use agentvisor::ports::audit::AuditStore;
use agentvisor::replay::replay;
use agentvisor::tools::ToolRegistry;
use agentvisor::RunId;

use super::Db;

/// Flags of `agentvisor replay`.
#[derive(Args, Debug)]
pub(crate) struct ReplayArgs {
    /// The run id (32 hex digits, as `agentvisor runs list` prints it).
    pub(super) run_id: String,
    /// Print the report (both traces) as one JSON object.
    #[arg(long)]
    pub(super) json: bool,
    /// Replay a run of this server (its records, read over its API)
    /// instead of the database's; the token comes from `AGENTVISOR_TOKEN`.
    #[arg(long, env = "AGENTVISOR_URL", value_name = "URL")]
    pub(super) server: Option<String>,
}

pub(crate) async fn replay_run(a: ReplayArgs, db: &Db) -> ExitCode {
    let path = match db {
        Db::Memory => {
            return super::refuse("--db :memory: keeps no run history; name a database file")
        }
        Db::File(p) => p,
        Db::Postgres(_) => return super::not_on_postgres("replay"),
    };
    let run_id: RunId = match a.run_id.parse() {
        Ok(id) if a.run_id.len() == 32 => id,
        _ => return super::refuse(format!("`{}` is not a run id (32 hex digits)", a.run_id)),
    };
    let store = match super::open_existing_db(path).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let records = store.run_records(run_id).await;
    store.close().await;
    let records = match records {
        Ok(r) if !r.is_empty() => r,
        Ok(_) => {
            errln!("error: no run {run_id} in {}", path.display());
            return ExitCode::from(1);
        }
        Err(e) => return super::refuse(format!("{}: {e}", path.display())),
    };
    report_replay(run_id, &records, a.json).await
}

/// Replays `records` (of `run_id`) and prints the report; exit 0 iff the
/// trace is the same.
pub(super) async fn report_replay(
    run_id: RunId,
    records: &[agentvisor::ports::audit::AuditRecord],
    json: bool,
) -> ExitCode {
    let a = ReplayJson { json };
    let report = match replay(records, &ToolRegistry::with_builtins()).await {
        Ok(r) => r,
        Err(e) => {
            errln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    if a.json {
        outln!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else if report.same {
        outln!(
            "replay of {run_id}: same trace ({} items)",
            report.recorded.len()
        );
    } else {
        let i = report.first_difference.unwrap_or(0);
        outln!("replay of {run_id}: the trace differs at item {i}");
        outln!(
            "  recorded: {}",
            serde_json::to_string(&report.recorded.get(i)).unwrap_or_default()
        );
        outln!(
            "  replayed: {}",
            serde_json::to_string(&report.replayed.get(i)).unwrap_or_default()
        );
    }
    if report.same {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

struct ReplayJson {
    json: bool,
}
