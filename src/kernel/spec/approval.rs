//! Human approval gates (`approval:`): tools whose calls wait for an
//! operator's decision before they run (see `crate::actors::run`'s
//! approval module for what a waiting run does).
//!
//! ```yaml
//! tools: [read_file, delete_file]
//! approval: [delete_file]          # or [*]: every tool call
//! limits: { approval_timeout: 30m } # then the call is denied (default 1h)
//! ```
//!
//! A name must be one the agent's runs can call: one of `tools`, a
//! sub-agent's `agent__NAME`, or an MCP server's `SERVER__TOOL` (the
//! server's tools are only known once it starts, so any tool of a listed
//! server is accepted, and `SERVER__*` gates them all).

use super::{line_of, AgentSpec};

/// The `approval:` entry that gates every tool.
pub const APPROVE_ALL: &str = "*";

/// How a sub-agent's tool is named (`agent__NAME`; the host's palette
/// makes these tools).
const SUB_AGENT_PREFIX: &str = "agent__";

impl AgentSpec {
    /// Whether a call of `tool` waits for an operator's decision.
    pub fn needs_approval(&self, tool: &str) -> bool {
        self.approval.tools.iter().any(|gate| {
            gate == APPROVE_ALL
                || gate == tool
                || gate.strip_suffix("__*").is_some_and(|server| {
                    tool.strip_prefix(server)
                        .is_some_and(|t| t.starts_with("__"))
                })
        })
    }

    /// Checks `approval:` (part of [`check`](Self::check)).
    pub(super) fn check_approval(&self, source: &str) -> Result<(), String> {
        let at = |name: &str| line_of(source, name);
        let mut seen = std::collections::HashSet::new();
        for gate in &self.approval.tools {
            if !seen.insert(gate.as_str()) {
                return Err(format!("`approval` lists `{gate}` twice{}", at(gate)));
            }
            if gate == APPROVE_ALL {
                continue;
            }
            let listed = self.tools.iter().any(|t| t == gate);
            let sub_agent = gate
                .strip_prefix(SUB_AGENT_PREFIX)
                .is_some_and(|name| self.agents.contains_key(name));
            let mcp = gate.split_once("__").is_some_and(|(server, tool)| {
                !tool.is_empty()
                    && self
                        .mcp
                        .as_ref()
                        .is_some_and(|m| m.servers.iter().any(|s| s.name == server))
            });
            if !(listed || sub_agent || mcp) {
                return Err(format!(
                    "`approval` names `{gate}`, which this agent cannot call{}: list one of its `tools`, an `agent__NAME` of its `agents`, an MCP server's `SERVER__TOOL` (or `SERVER__*`), or `*`",
                    at(gate)
                ));
            }
        }
        self.approval
            .check_judge()
            .map_err(|e| format!("{e}{}", at("approval")))
    }
}
