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
//! sub-agent's `agent__NAME`, an offered skill's `skill__NAME`, or an
//! MCP server's `SERVER__TOOL` (the
//! server's tools are only known once it starts, so any tool of a listed
//! server is accepted, and `SERVER__*` gates them all).

use super::{line_of, AgentSpec};

/// The `approval:` entry that gates every tool.
pub const APPROVE_ALL: &str = "*";

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
            // `SERVER__*` is a tool of the server as `can_call` reads it.
            if !self.can_call(gate) {
                return Err(format!(
                    "`approval` names `{gate}`, which this agent cannot call{}: list one of its `tools`, an `agent__NAME` of its `agents`, a `skill__NAME` of its `skills`, an MCP server's `SERVER__TOOL` (or `SERVER__*`), or `*`",
                    at(gate)
                ));
            }
        }
        self.approval
            .check_judge()
            .map_err(|e| format!("{e}{}", at("approval")))
    }
}
