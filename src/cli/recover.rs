//! `agentvisor recover`: after a process running durable runs died (a
//! crash, SIGKILL, a power cut), resumes each of its interrupted durable
//! runs from its last checkpoint, waits for them, and ends every other
//! interrupted run on record, so each run in the database has exactly one
//! terminal record. Prints what it did (`--json`: one object).
//!
//! Exit 0 once recovery is done, whatever the resumed runs' statuses (they
//! are in the summary and in `agentvisor runs`); 1 when the stores cannot
//! be read or records could not be written; 2 when the database cannot be
//! opened or is damaged (`PRAGMA quick_check`, always run here). Runs
//! another live host holds are left to it (`leased`).

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use agentvisor::RunId;

/// Flags of `agentvisor recover`.
#[derive(Args, Debug)]
pub(crate) struct RecoverArgs {
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Summary {
    resumed: usize,
    /// Statuses the resumed runs ended with.
    by_status: BTreeMap<String, u64>,
    already_finished: usize,
    crash_loop: Vec<RunId>,
    unrecoverable: Vec<RunId>,
    interrupted: Vec<RunId>,
    /// Durable runs another live host holds (not resumed here).
    leased: Vec<RunId>,
}

pub(crate) async fn recover(a: RecoverArgs, db: &super::Db) -> ExitCode {
    let path = match db {
        super::Db::File(p) => p,
        super::Db::Memory => {
            return super::refuse(
                "recover reads a database: `--db :memory:` holds nothing to recover",
            )
        }
    };
    // Damage anywhere in the file is refused before anything is resumed.
    match super::open_db(path).await {
        Ok(store) => {
            if let Err(code) = super::check_db(&store).await {
                return code;
            }
            store.close().await;
        }
        Err(code) => return code,
    }
    let host = match super::sqlite_host(path).await {
        Ok(h) => h,
        Err(code) => return code,
    };
    let recovery = match host.recover().await {
        Ok(r) => r,
        Err(e) => {
            errln!("error: cannot recover from {}: {e}", path.display());
            host.shutdown().await;
            return ExitCode::from(1);
        }
    };
    let mut summary = Summary {
        resumed: recovery.resumed.len(),
        by_status: BTreeMap::new(),
        already_finished: recovery.already_finished.len(),
        crash_loop: recovery.crash_loops,
        unrecoverable: recovery.unrecoverable,
        interrupted: recovery.interrupted,
        leased: recovery.leased,
    };
    let results = futures_util::future::join_all(recovery.resumed).await;
    for r in &results {
        *summary.by_status.entry(r.status.to_string()).or_default() += 1;
    }
    let stats = host.shutdown().await;
    let lost = super::report_unwritten(&host, &stats);
    if a.json {
        outln!("{}", serde_json::to_string(&summary).unwrap_or_default());
    } else {
        outln!(
            "resumed {} run(s); {} already finished; {} crash loop(s); {} unrecoverable; {} interrupted (not durable); {} held by a live host",
            summary.resumed,
            summary.already_finished,
            summary.crash_loop.len(),
            summary.unrecoverable.len(),
            summary.interrupted.len(),
            summary.leased.len()
        );
        for (status, n) in &summary.by_status {
            outln!("  {status}: {n}");
        }
    }
    if lost {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
