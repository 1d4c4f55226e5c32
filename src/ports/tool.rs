//! The `Tool` port: a named function with a JSON Schema for its arguments.
//! The registry in `crate::tools` validates arguments against the schema
//! before `call` ever runs, so a tool sees only an object that passed.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::run::RunId;

/// What a model is told about a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Unique name (`add`, `server__tool`, `agent__name`).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// What a tool knows about the call it serves.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The run that made the call.
    pub run_id: RunId,
    /// The model's call id.
    pub call_id: Arc<str>,
}

/// A tool failure; its message goes back to the model as the tool result.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ToolError {
    /// No tool of that name is available to this run.
    #[error("unknown tool `{0}`")]
    UnknownTool(String),
    /// The arguments were not valid JSON, not an object, too large, or broke the schema.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
    /// The tool did not finish within the tool timeout.
    #[error("timed out after {0} ms")]
    Timeout(u64),
    /// The tool panicked.
    #[error("tool panicked: {0}")]
    Panicked(String),
}

impl ToolError {
    /// Stable snake_case kind.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::UnknownTool(_) => "unknown_tool",
            ToolError::InvalidArguments(_) => "invalid_arguments",
            ToolError::Failed(_) => "tool_failed",
            ToolError::Timeout(_) => "tool_timeout",
            ToolError::Panicked(_) => "tool_panicked",
        }
    }
}

/// A tool. Object-safe; used as `Arc<dyn Tool>`. `call` must be cancel-safe:
/// a killed run drops the future. It must not block: its first poll runs
/// in the handler of the run that called it, on the critic shard that hosts
/// the run, so a tool that blocks there holds that shard's other runs and
/// timers too. Long synchronous work belongs in `tokio::task::spawn_blocking`.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Name, description and argument schema.
    fn spec(&self) -> &ToolSpec;

    /// Runs the tool on arguments that already passed validation.
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<String, ToolError>;
}
