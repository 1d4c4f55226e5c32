//! The scripted model's responses as a manifest writes them (`script:`):
//! one [`ScriptEntry`] per model call (played by
//! `crate::providers::scripted`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ports::duration::opt_duration_serde;

/// Token usage a scripted entry reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptUsage {
    /// Input tokens.
    #[serde(default)]
    pub input: u64,
    /// Output tokens.
    #[serde(default)]
    pub output: u64,
}

/// One call of a parallel tool turn in a script.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    /// Tool name.
    pub tool: String,
    /// Arguments (any JSON; validation happens at call time).
    #[serde(default)]
    pub args: Value,
}

/// A provider failure a script can provoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptFailure {
    /// A 429.
    RateLimited,
    /// A 5xx.
    Server,
    /// A 400.
    BadRequest,
    /// A tool call whose arguments are not valid JSON.
    Malformed,
}

/// One scripted model response.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptEntry {
    /// Final (or interim) assistant text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A single tool call: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A single tool call: its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    /// Parallel tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ScriptToolCall>>,
    /// Delay before the response.
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub latency: Option<Duration>,
    /// Never answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hang: bool,
    /// Fail this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail: Option<ScriptFailure>,
    /// Usage to report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ScriptUsage>,
    /// Play this entry N times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    /// Play this entry for every call from here on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forever: bool,
}
