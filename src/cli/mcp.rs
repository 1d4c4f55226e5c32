//! `agentvisor mcp tools FILE [--json]`: starts the MCP servers a manifest
//! names, prints every tool as the model would see it (its
//! `<server>__<tool>` name, description and argument schema), and stops
//! them. For people writing manifests.
//!
//! Each tool's effect class is shown (`effects`: `read`, `write`,
//! `egress`, `unknown`): from the server's annotations, or the manifest's
//! `tools_effects` where it names the tool.
//!
//! `--json` prints one array of `{server, name, description, parameters,
//! effects}`.
//!
//! Exit codes: 0 on success; 1 when a server does not start or list its
//! tools (the message names its `mcp_*` kind and its stderr tail); 2 when
//! the manifest cannot be read or is invalid.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use agentvisor::mcp::McpConfig;
use agentvisor::AgentSpec;

/// Flags of `agentvisor mcp`.
#[derive(Args, Debug)]
pub(crate) struct McpArgs {
    #[command(subcommand)]
    command: McpCommand,
}

#[derive(Subcommand, Debug)]
enum McpCommand {
    /// Start a manifest's MCP servers, print their tools, stop them.
    Tools(ToolsArgs),
}

#[derive(Args, Debug)]
struct ToolsArgs {
    /// The agent manifest (YAML).
    file: PathBuf,
    /// Print one JSON array.
    #[arg(long)]
    json: bool,
}

/// Runs `agentvisor mcp …`.
pub(crate) async fn mcp(args: McpArgs) -> ExitCode {
    match args.command {
        McpCommand::Tools(a) => tools(a).await,
    }
}

async fn tools(a: ToolsArgs) -> ExitCode {
    let spec = match AgentSpec::from_file(&a.file) {
        Ok(s) => s,
        Err(e) => return super::refuse(e),
    };
    let servers = spec.mcp.clone().map(|m| m.servers).unwrap_or_default();
    let listed = match agentvisor::host::list_mcp_tools(&servers, McpConfig::default()).await {
        Ok(mut l) => {
            for t in &mut l {
                if let Some(e) = spec.tools_effects.get(&t.name) {
                    t.effects = *e;
                }
            }
            l
        }
        Err(e) => {
            errln!("error: {} ({e})", e.kind());
            return ExitCode::from(1);
        }
    };
    if a.json {
        match serde_json::to_string_pretty(&listed) {
            Ok(text) => outln!("{text}"),
            Err(e) => {
                errln!("error: {e}");
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    if listed.is_empty() {
        outln!("no MCP tools ({} servers)", servers.len());
    }
    for t in &listed {
        outln!("{}", t.name);
        if !t.description.is_empty() {
            for line in t.description.lines() {
                outln!("    {line}");
            }
        }
        outln!("    effects: {}", t.effects);
        outln!("    schema: {}", t.parameters);
    }
    ExitCode::SUCCESS
}
