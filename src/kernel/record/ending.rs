//! How a run ends before it becomes a [`RunResult`] ([`Ending`]), the
//! `error_kind`s of endings the host itself decides, and the events a
//! terminal result ends a stream with.

use crate::ports::event::RunEvent;
use crate::ports::run::{KillReason, LoopKind, RunResult, RunStatus};

/// How a run ends, before it becomes a [`RunResult`].
#[derive(Debug, Clone)]
pub struct Ending {
    pub(crate) status: RunStatus,
    pub(crate) kill_reason: Option<KillReason>,
    /// The loop a `runaway` kill answers.
    pub(crate) loop_kind: Option<LoopKind>,
    pub(crate) error_kind: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) output: Option<String>,
}

impl Ending {
    pub(crate) fn ok(output: String) -> Self {
        Ending {
            status: RunStatus::Ok,
            kill_reason: None,
            loop_kind: None,
            error_kind: None,
            error: None,
            output: Some(output),
        }
    }

    pub(crate) fn failed(status: RunStatus, kind: &str, error: impl Into<String>) -> Self {
        Ending {
            status,
            kill_reason: None,
            loop_kind: None,
            error_kind: Some(kind.to_string()),
            error: Some(error.into()),
            output: None,
        }
    }

    pub(crate) fn killed(reason: KillReason) -> Self {
        Ending {
            status: reason.status(),
            kill_reason: Some(reason),
            loop_kind: None,
            error_kind: Some(reason.as_str().to_string()),
            error: Some(format!("killed: {reason}")),
            output: None,
        }
    }

    /// The ending of a run the host cancelled while shutting down.
    pub(crate) fn suspended() -> Self {
        Ending::failed(RunStatus::Cancelled, SUSPENDED, "the host shut down")
    }

    /// The ending of a durable run this host lost to another (its lease
    /// expired while it was paused, and a `recover` elsewhere claimed it).
    pub(crate) fn fenced() -> Self {
        Ending::failed(
            RunStatus::Cancelled,
            LEASE_LOST,
            "another host took this run over (this host's lease on it expired, \
             e.g. while the process was paused): it goes on there, and this host \
             writes nothing more of it",
        )
    }
}

/// The `error_kind` of runs the host's shutdown cancels; a durable run
/// ending so is suspended, not finished (see [`super::RunShared::finish_after`]).
pub(crate) const SUSPENDED: &str = "shutdown";

/// The `error_kind` of a durable run this host lost to another host (its
/// lease expired, e.g. while the process was paused, and a `recover`
/// elsewhere claimed the run): its caller gets a `cancelled` result with
/// it, and nothing of the run is written here — no terminal record, no
/// checkpoint, none of its records still unsent (the run belongs to the
/// other host).
pub const LEASE_LOST: &str = "lease_lost";

/// The `error_kind` of a run whose record cannot be written: refused at
/// admission while neither the audit store nor its spool takes records,
/// or a durable run that could write neither its checkpoint nor its
/// terminal record before its deadline.
pub const STORE_UNAVAILABLE: &str = "store_unavailable";

/// What a durable run's caller is told when the run's terminal record
/// (`result`) could be written neither to the store nor to the spool
/// before its deadline: `error`/[`STORE_UNAVAILABLE`], never its status
/// off the record. Its output is kept; its checkpoint stays, so `recover`
/// may resume it.
pub(crate) fn off_record(result: &RunResult) -> RunResult {
    if result.error_kind.as_deref() == Some(STORE_UNAVAILABLE) {
        // It ended so already (its checkpoint could not be written).
        return result.clone();
    }
    RunResult {
        status: RunStatus::Error,
        kill_reason: None,
        loop_kind: None,
        error_kind: Some(STORE_UNAVAILABLE.to_string()),
        error: Some(format!(
            "the run ended `{}`, but its terminal record could be written neither to the \
             audit store nor to its spool before its deadline: it is not on record",
            result.status
        )),
        ..result.clone()
    }
}

/// The events a terminal result ends a stream with: `error` (when the run
/// did not end ok) and `run.end`.
pub(crate) fn terminal_events(r: &RunResult) -> Vec<RunEvent> {
    let mut out = Vec::with_capacity(2);
    if r.status != RunStatus::Ok {
        if let Some(kind) = &r.error_kind {
            out.push(RunEvent::Error {
                kind: kind.clone(),
                message: r.error.clone().unwrap_or_default(),
            });
        }
    }
    out.push(RunEvent::RunEnd {
        status: r.status,
        kill_reason: r.kill_reason,
        error_kind: r.error_kind.clone(),
        output: r.output.clone(),
        usage: r.usage.own,
        cost_micros: r.cost_micros,
        duration_ms: r.duration_ms(),
    });
    out
}
