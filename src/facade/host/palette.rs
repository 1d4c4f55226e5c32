//! Palettes (D1–D3): an agent's sub-agents as tools. Each `agents:` entry
//! of a manifest becomes a tool `agent__NAME`, and each skill its
//! `skills:` offers a tool `skill__NAME` (see `crate::spec`'s palette
//! module for the manifest built from the skill), whose call starts a
//! child run — an actor like any run, supervised by its critic shard,
//! reachable by its id, with `parent_run_id` and `root_run_id` set — and
//! whose result is the child's answer. Both kinds go through the one
//! `PaletteTool`: they differ only in their arguments and in how the
//! answer is read.
//!
//! A skill's call: its argument `input` is the child's prompt; its result
//! is the answer read as a skill run reads it (`crate::skills::parse_answer`:
//! every `<memory>` block and named `<output>` block stripped). A palette
//! call is no scheduled run: nothing is published and no memory is
//! written back.
//!
//! Guarantees:
//! - A child that fails is an error result carrying its `status`,
//!   `kill_reason`/`error_kind`, error and partial output: the parent's
//!   model reads it and goes on; the parent never fails because of it.
//! - Time: the child's hard deadline never passes its parent's as it is
//!   now: it starts capped at the parent's deadline and follows it when
//!   the parent is extended (see `crate::actors::run::parent`); the child
//!   ends `killed`/`parent` when the parent ends. While the parent waits, each of
//!   the child's events is a heartbeat of the parent's call, so a working
//!   child keeps its parent from `stalled`; the parent's own deadline holds.
//! - A parent that is killed, cancelled or times out ends its children
//!   `killed`/`parent` first (see `RunState::finish`); a call dropped on
//!   its tool timeout kills its child the same way.
//! - A child's tools are its manifest's intersected with its parent's,
//!   plus its own palette; so are its MCP servers (`within_parent`): a
//!   server its parent does not have is not started for it and its tools
//!   are not offered; one its parent has (the same server: name, command
//!   or URL, environment, headers, scope) is the parent's, already
//!   started — a `scope: host` server is the very process the parent
//!   calls, a `scope: run` server is started for the child's run as for
//!   any run — and of its tools the child sees those both manifests'
//!   `allow` lets through. Depth, children at once and descendants per
//!   root are capped by the host (`HostConfig`), and a call past a cap is
//!   an error result.
//! - The child spends its parent's caller's budget (the same account,
//!   reserve-and-settle), so a tree cannot spend more than its root.
//! - The child's events reach the parent's subscribers too (tagged with
//!   the child's `run_id` and `parent_run_id`), live and in the order the
//!   child made them.

use std::sync::Weak;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{Host, HostInner};
use crate::agent::Agent;
use crate::handle::RunRef;
use crate::mcp::ServedTool;
use crate::ports::model::ToolSpec;
use crate::ports::run::{KillReason, RunStatus};
use crate::ports::tool::{Tool, ToolContext, ToolEffect, ToolError};
use crate::spec::{AgentSpec, Invocation, PaletteKind, SubAgent};

pub use crate::spec::{AGENT_TOOL_PREFIX, SKILL_TOOL_PREFIX};

/// A sub-agent's manifest as its parent lets it run, and the MCP tools it
/// gets: its `tools` are those its parent has too; its MCP servers are
/// those its parent has too (the same server, `allow` aside), and its MCP
/// tools are the parent's tools of those servers that its own `allow`
/// lets through (`parent_mcp`: the parent's, already started).
pub(super) fn within_parent(
    parent: &AgentSpec,
    child: &AgentSpec,
    parent_mcp: &[ServedTool],
) -> (AgentSpec, Vec<ServedTool>) {
    let mut spec = child.clone();
    spec.tools.retain(|t| parent.tools.contains(t));
    let parents_servers = parent.mcp.as_ref().map_or(&[][..], |m| &m.servers[..]);
    let mut tools = Vec::new();
    if let Some(mcp) = spec.mcp.as_mut() {
        mcp.servers.retain(|own| {
            let shared = parents_servers.iter().any(|p| p.same_server(own));
            if !shared {
                tracing::debug!(server = %own.name, agent = %child.name, "a sub-agent's mcp server that its parent does not have is left out");
            }
            shared
        });
        for own in &mcp.servers {
            tools.extend(
                parent_mcp
                    .iter()
                    .filter(|t| *t.server == *own.name && own.allows(&t.remote))
                    .cloned(),
            );
        }
        if mcp.servers.is_empty() {
            spec.mcp = None;
        }
    }
    (spec, tools)
}

/// How a palette tool's arguments become the child's invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arguments {
    /// `{prompt}`: the child's prompt (a sub-agent without `inputs:`).
    Prompt,
    /// The sub-agent's own `inputs:` schema: the child's inputs.
    Inputs,
    /// `{input}`: the child's prompt (an offered skill).
    Input,
}

impl Arguments {
    /// The tool's parameters, for `kind` and its child's manifest.
    fn of(kind: PaletteKind, child: &AgentSpec) -> (Self, Value) {
        let text = |key: &str, what: &str| {
            json!({
                "type": "object",
                "properties": { key: {"type": "string", "description": what} },
                "required": [key],
                "additionalProperties": false
            })
        };
        match (kind, &child.inputs) {
            (PaletteKind::Skill, _) => (
                Arguments::Input,
                text("input", "What the skill works on, in full."),
            ),
            (PaletteKind::Agent, Some(schema)) => (Arguments::Inputs, schema.clone()),
            (PaletteKind::Agent, None) => (
                Arguments::Prompt,
                text("prompt", "The task for the sub-agent, in full."),
            ),
        }
    }

    /// Fills `inv` from the call's arguments.
    fn fill(self, args: Value, inv: &mut Invocation) {
        let text = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        match self {
            Arguments::Prompt => inv.prompt = text("prompt"),
            Arguments::Input => inv.prompt = text("input"),
            Arguments::Inputs => {
                if let Value::Object(map) = args {
                    inv.inputs = map.into_iter().collect();
                }
            }
        }
    }
}

/// One palette entry — a sub-agent or an offered skill — as a tool.
pub(super) struct PaletteTool {
    spec: ToolSpec,
    child: Agent,
    kind: PaletteKind,
    arguments: Arguments,
    host: Weak<HostInner>,
}

impl PaletteTool {
    pub(super) fn new(sub: &SubAgent, child: Agent, host: Weak<HostInner>) -> Self {
        let (arguments, parameters) = Arguments::of(sub.kind, &sub.spec);
        PaletteTool {
            spec: ToolSpec {
                name: sub.tool_name(),
                description: sub.description.clone(),
                parameters,
            },
            child,
            kind: sub.kind,
            arguments,
            host,
        }
    }

    /// The child's answer as the tool gives it: a skill's read as a skill
    /// run reads it (memory and named output blocks stripped).
    fn answer(&self, text: String) -> String {
        match self.kind {
            PaletteKind::Agent => text,
            PaletteKind::Skill => crate::skills::parse_answer(&text).output,
        }
    }
}

/// Kills the child if the call is dropped before the child ended (a tool
/// timeout, or the parent's grace running out).
struct KillOnDrop(Option<RunRef>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.kill(KillReason::Parent);
        }
    }
}

#[async_trait]
impl Tool for PaletteTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// A sub-agent's: `read` when every tool it may call is `read` (its
    /// manifest's `tools_effects` applied); otherwise `unknown`: the child
    /// may do anything its tools do. An offered skill's: `unknown` (the
    /// parent's `tools_effects` may say otherwise).
    fn effect(&self) -> ToolEffect {
        if self.kind == PaletteKind::Skill {
            return ToolEffect::Unknown;
        }
        let tools = self.child.tools().specs();
        let all_read = tools
            .iter()
            .all(|t| self.child.tool_effect(&t.name) == Some(ToolEffect::Read));
        if all_read {
            ToolEffect::Read
        } else {
            ToolEffect::Unknown
        }
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<String, ToolError> {
        let Some(inner) = self.host.upgrade() else {
            return Err(ToolError::Failed("the host is shutting down".into()));
        };
        let host = Host { inner };
        let mut inv = Invocation {
            parent_run_id: Some(ctx.run_id),
            deadline: ctx.deadline(),
            ..Default::default()
        };
        self.arguments.fill(args, &mut inv);
        let what = match self.kind {
            PaletteKind::Agent => "sub-agent",
            PaletteKind::Skill => "skill",
        };
        let (handle, mut events) = host
            .submit_streaming(&self.child, inv)
            .await
            .map_err(|e| ToolError::Failed(format!("the {what} could not start: {e}")))?;
        let mut guard = KillOnDrop(Some(handle.run_ref()));
        let child = handle.run_ref();
        // Until the child's stream ends (it ends with the child): each of
        // its events (and its own sub-agents') is a sign of life of this
        // call. The parent's subscribers get them from the child itself
        // (`RunShared::publish`), in order.
        let mut cancelled = false;
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(_) => ctx.beat(),
                    None => break,
                },
                _ = ctx.cancelled(), if !cancelled => {
                    cancelled = true;
                    child.kill(KillReason::Parent);
                }
            }
        }
        let result = handle.await;
        guard.0 = None;
        if result.status == RunStatus::Ok {
            return Ok(self.answer(result.output.unwrap_or_default()));
        }
        let report = json!({
            "sub_agent_run_id": result.run_id,
            "status": result.status,
            "kill_reason": result.kill_reason,
            "error_kind": result.error_kind,
            "error": result.error,
            "partial_output": result.output.map(|o| self.answer(o)),
        });
        Err(ToolError::Failed(format!(
            "the {what} did not finish: {report}"
        )))
    }
}
