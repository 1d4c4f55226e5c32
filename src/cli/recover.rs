//! `agentvisor recover`: after a process running durable runs died (a
//! crash, SIGKILL, a power cut), resumes each of its interrupted durable
//! runs from its last checkpoint, waits for them, and ends every other
//! interrupted run on record, so each run in the database has exactly one
//! terminal record. Prints what it did (`--json`: one object).
//!
//! Runs parked for approval: nobody can decide here, so a run that was
//! parked and still waits is left parked on record (its checkpoint kept)
//! and listed as `awaiting_approval`, and a resumed run that parks on a
//! gated call is no longer waited for: the command returns, and the run
//! is kept parked on record the same way. Decide with `agentvisor runs
//! approve|deny ID` against the database (then `recover` again resumes
//! it), or start `agentvisor serve` on it (which resumes it, approvable
//! through its API).
//!
//! [`at_start`] is the recovery `serve` runs when it starts, the same
//! call with parked runs resumed (the server's operators decide them).
//!
//! A resumed run that owes publishes (a durable scheduled skill's) has
//! them delivered before the command returns (within two minutes; what is
//! still owed then is the next host's).
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

use agentvisor::{Host, ParkedRuns, RunEvent, RunHandle, RunId, RunStatus};

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
    /// Durable runs parked for approval, kept parked on record: left so,
    /// or resumed and parked again on a gated call.
    awaiting_approval: Vec<RunId>,
}

/// Recovery at a host's start (`recover`, `serve`): [`Host::recover_with`]
/// on the host's stores, its failure printed (exit 1).
pub(crate) async fn at_start(
    host: &Host,
    database: &str,
    parked: ParkedRuns,
) -> Result<agentvisor::Recovery, ExitCode> {
    host.recover_with(parked).await.map_err(|e| {
        errln!("error: cannot recover from {database}: {e}");
        ExitCode::from(1)
    })
}

/// One line on what a recovery did (`serve` prints it at its start).
pub(crate) fn summary_line(r: &agentvisor::Recovery) -> String {
    format!(
        "recovered: {} run(s) resumed; {} already finished; {} crash loop(s); {} unrecoverable; {} interrupted (not durable); {} held by a live host; {} awaiting approval",
        r.resumed.len(),
        r.already_finished.len(),
        r.crash_loops.len(),
        r.unrecoverable.len(),
        r.interrupted.len(),
        r.leased.len(),
        r.awaiting_approval.len()
    )
}

/// How long `recover` waits for what the resumed runs owe (a scheduled
/// skill's publishes) before it stops; what is still owed then is
/// delivered by the next host that opens the database.
const PUBLISH_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// How a resumed run's wait ended.
enum Waited {
    /// It ended, with this status.
    Ended(RunId, RunStatus),
    /// It parked for approval (its handle is let go: the host's shutdown
    /// keeps it parked on record).
    Parked(RunId),
}

/// Waits for a resumed run to end, or to park for approval (nobody here
/// decides: waiting would last its `approval_timeout`).
async fn until_ended_or_parked(mut handle: RunHandle) -> Waited {
    let run = handle.run_ref();
    let mut events = handle.subscribe();
    let parked = async {
        // The stream starts with the records of the run before it was
        // resumed (an old request among them): what counts comes after
        // `run.resumed`, and only while a call does wait.
        let mut resumed = false;
        while let Some(ev) = events.next().await {
            match ev.event {
                RunEvent::Resumed { .. } => resumed = true,
                RunEvent::ApprovalRequested { .. }
                    if resumed && !run.pending_approvals().is_empty() =>
                {
                    return;
                }
                _ => {}
            }
        }
        std::future::pending::<()>().await
    };
    let ended = tokio::select! {
        biased;
        result = &mut handle => Some(result),
        () = parked => None,
    };
    match ended {
        Some(result) => Waited::Ended(result.run_id, result.status),
        None => {
            // Dropped unfinished, a handle cancels its run.
            handle.detach();
            Waited::Parked(run.run_id())
        }
    }
}

pub(crate) async fn recover(a: RecoverArgs, db: &super::Db) -> ExitCode {
    match db {
        super::Db::Memory => {
            return super::refuse(
                "recover reads a database: `--db :memory:` holds nothing to recover",
            )
        }
        // Damage anywhere in the file is refused before anything is resumed.
        super::Db::File(path) => match super::open_db(path).await {
            Ok(store) => {
                if let Err(code) = super::check_db(&store).await {
                    return code;
                }
                store.close().await;
            }
            Err(code) => return code,
        },
        super::Db::Postgres(_) => {}
    }
    let opened = match super::open(db).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let name = opened.name();
    let host = match super::host_on(super::host_builder(), db, opened, None).await {
        Ok(h) => h,
        Err(code) => return code,
    };
    let recovery = match at_start(&host, &name, ParkedRuns::Leave).await {
        Ok(r) => r,
        Err(code) => {
            host.shutdown().await;
            return code;
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
        awaiting_approval: recovery.awaiting_approval,
    };
    let waits = recovery.resumed.into_iter().map(until_ended_or_parked);
    let mut ended = Vec::new();
    for waited in futures_util::future::join_all(waits).await {
        match waited {
            Waited::Ended(run_id, status) => {
                *summary.by_status.entry(status.to_string()).or_default() += 1;
                ended.push(run_id);
            }
            Waited::Parked(run_id) => summary.awaiting_approval.push(run_id),
        }
    }
    // What the ended runs owe is delivered before the host stops (a run
    // that owes nothing answers at once).
    if host.outbox().is_some() {
        let publishes = ended.iter().map(|id| host.publish(*id, PUBLISH_WAIT));
        futures_util::future::join_all(publishes).await;
    }
    let stats = host.shutdown().await;
    let lost = super::report_unwritten(&host, &stats);
    if a.json {
        outln!("{}", serde_json::to_string(&summary).unwrap_or_default());
    } else {
        outln!(
            "resumed {} run(s); {} already finished; {} crash loop(s); {} unrecoverable; {} interrupted (not durable); {} held by a live host; {} awaiting approval",
            summary.resumed,
            summary.already_finished,
            summary.crash_loop.len(),
            summary.unrecoverable.len(),
            summary.interrupted.len(),
            summary.leased.len(),
            summary.awaiting_approval.len()
        );
        for (status, n) in &summary.by_status {
            outln!("  {status}: {n}");
        }
        for run_id in &summary.awaiting_approval {
            outln!("  awaiting approval: {run_id} (agentvisor runs approve|deny {run_id})");
        }
    }
    if lost {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
