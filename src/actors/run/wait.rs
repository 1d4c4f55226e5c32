//! What a tool that works through its run (`wait`, see
//! `crate::tools::wait`) reaches: the run's own tools and its caller's
//! runs ([`RunAccess`]), made for each such call when it starts and
//! handed to it in its [`ToolContext`].
//!
//! A call made through the run is checked as the model's own call of the
//! same tool would be: the run's tool list and the tool's schema, then
//! its guards (a `max_calls` rule counts it; a denial is recorded as a
//! critic decision through the run's shard, in the run's order), then
//! approval — which the run asked for, if needed, when it dispatched the
//! calling tool; a call of another tool that needs it is refused. It runs
//! under the run's tool timeout, with the calling tool's cancellation
//! signal, heartbeat and deadline, and its result is capped as any.
//!
//! A run waited for must be a child of this run or a run of the same
//! caller, and neither this run nor one of its ancestors (that wait would
//! never end); any other id is answered as unknown, so a run learns
//! nothing of other callers' runs.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use super::approval::APPROVAL_DENIED;
use super::{RunAddr, RunMsg, RunState};
use crate::agent::Agent;
use crate::dispatch::PreparedCall;
use crate::ports::audit::AuditEntry;
use crate::ports::run::{RunId, RunResult};
use crate::ports::tool::{RunAccess, ToolContext, ToolError, GUARD_DENIED};
use crate::record::RunShared;
use crate::spec::GuardVerdict;

/// The run, as a tool that uses it sees it.
struct ThroughRun {
    agent: Agent,
    counts: Option<Arc<[AtomicU32]>>,
    /// The tool whose approval the run obtained when it dispatched the
    /// calling tool.
    approved: Option<String>,
    shared: Arc<RunShared>,
    addr: RunAddr,
    /// The calling tool's context (without this access: no cycle).
    ctx: ToolContext,
    tool_timeout: Duration,
    result_cap: usize,
    beat_every: Duration,
}

impl RunState {
    /// `ctx` with the run's access, for a call of a tool that uses its
    /// run; `approved` says the call was approved by an operator at
    /// dispatch (it covers the tool the call names, see `guard`).
    pub(super) fn through_run(
        &self,
        ctx: ToolContext,
        prepared: &PreparedCall,
        approved: bool,
    ) -> ToolContext {
        let approved = approved
            .then(|| {
                let call = prepared.tool.call_through_run(&prepared.args);
                call.map(|(tool, _)| tool.to_string())
            })
            .flatten();
        let access = ThroughRun {
            agent: self.agent.clone(),
            counts: self.guard_counters(),
            approved,
            shared: self.shared.clone(),
            addr: self.addr.clone(),
            ctx: ctx.clone(),
            tool_timeout: self.limits.tool_timeout,
            result_cap: self.limits.max_tool_result_bytes as usize,
            beat_every: self.limits.stall_timeout / 3,
        };
        ctx.with_run(Arc::new(access))
    }

    /// A guard denied a call a tool made through the run (from its task).
    pub(super) fn denied_through_run(&mut self, detail: String) {
        self.guard_decided(crate::ports::run::CriticAction::Deny, "guard", detail);
    }
}

/// The answer to an id that is not the caller's to wait for.
fn unknown(id: RunId) -> ToolError {
    ToolError::Failed(format!(
        "no run `{id}` of this caller is in flight or on record"
    ))
}

#[async_trait]
impl RunAccess for ThroughRun {
    async fn call_tool(&self, tool: &str, args: Value) -> Result<String, ToolError> {
        let prepared = self.agent.tools().prepare_value(tool, args)?;
        if prepared.tool.uses_run() {
            return Err(ToolError::InvalidArguments(format!(
                "`{tool}` cannot be called through another tool"
            )));
        }
        let covered = self.approved.as_deref() == Some(tool);
        if let Some(guards) = self.agent.guards().filter(|g| g.guards_calls()) {
            let counts = self.counts.as_deref().unwrap_or(&[]);
            match guards.check(tool, &prepared.args, counts, true) {
                GuardVerdict::Pass => {}
                GuardVerdict::Ask { .. } if covered => {}
                GuardVerdict::Ask { detail } => {
                    self.addr.send(RunMsg::GuardDenied {
                        detail: format!("{detail} (needs an operator: not through another tool)"),
                    });
                    return Err(ToolError::Typed {
                        kind: GUARD_DENIED,
                        message: format!("`{tool}` needs an operator's approval: call it directly"),
                    });
                }
                GuardVerdict::Deny { message, detail } => {
                    self.addr.send(RunMsg::GuardDenied {
                        detail: format!("{detail} (through wait)"),
                    });
                    return Err(ToolError::Typed {
                        kind: GUARD_DENIED,
                        message,
                    });
                }
            }
        }
        if !covered && self.agent.spec().needs_approval(tool) {
            return Err(ToolError::Typed {
                kind: APPROVAL_DENIED,
                message: format!("`{tool}` needs an operator's approval: call it directly"),
            });
        }
        prepared
            .execute(self.ctx.clone(), self.tool_timeout, self.result_cap)
            .await
    }

    async fn run_result(&self, id: RunId) -> Result<Arc<RunResult>, ToolError> {
        let me = self.shared.run_id;
        if id == me {
            return Err(ToolError::InvalidArguments(
                "a run cannot wait for itself".into(),
            ));
        }
        let host = self.shared.host();
        let mut up = self.shared.parent_run_id;
        while let Some(ancestor) = up {
            if ancestor == id {
                return Err(ToolError::InvalidArguments(format!(
                    "run `{id}` is an ancestor of this run: it waits for this run to end"
                )));
            }
            up = host.get(&ancestor).and_then(|a| a.parent_run_id);
        }
        let caller = self.shared.caller_id.as_deref();
        if let Some(target) = host.get(&id) {
            let ours = target.parent_run_id == Some(me) || target.caller_id.as_deref() == caller;
            if !ours {
                return Err(unknown(id));
            }
            return Ok(target.result().await);
        }
        // Ended already: its terminal record.
        let records = host
            .store
            .run_records(id)
            .await
            .map_err(|e| ToolError::Failed(format!("the run's record cannot be read: {e}")))?;
        let result = records.iter().rev().find_map(|r| match &r.entry {
            AuditEntry::Terminal(result) => Some(result.clone()),
            _ => None,
        });
        match result {
            Some(r) if r.parent_run_id == Some(me) || r.caller_id.as_deref() == caller => Ok(r),
            _ => Err(unknown(id)),
        }
    }

    fn beat_every(&self) -> Duration {
        self.beat_every
    }
}
