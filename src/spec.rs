//! What a run is asked to be: the agent manifest ([`AgentSpec`], YAML), its
//! [`Limits`], and the per-run [`Invocation`].
//!
//! Limits resolve in three layers: the invocation's override, then the
//! manifest, then the host's defaults. The derived defaults (`soft_timeout`
//! = `max_runtime`, `hard_timeout` = 2 × `max_runtime`, `extension` =
//! `max_runtime`) apply only where no layer set the key.
//!
//! Parsing is strict: an unknown key, a bad duration or an empty script entry
//! is a [`SpecError`] that names the key or value and, where the YAML parser
//! knows it, the line.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::ports::run::RunId;

/// A manifest that could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The file could not be read.
    #[error("cannot read manifest {path}: {reason}")]
    Read {
        /// The path given.
        path: String,
        /// Why.
        reason: String,
    },
    /// The YAML is malformed or has an unknown key or a bad value.
    #[error("invalid manifest{}: {message}", .path.as_ref().map(|p| format!(" {p}")).unwrap_or_default())]
    Parse {
        /// The file, when parsed from one.
        path: Option<String>,
        /// The parser's message (names the key and line).
        message: String,
    },
    /// The manifest parsed but is not usable.
    #[error("invalid manifest{}: {message}", .path.as_ref().map(|p| format!(" {p}")).unwrap_or_default())]
    Invalid {
        /// The file, when parsed from one.
        path: Option<String>,
        /// What is wrong (names the key or value, and the line when known).
        message: String,
    },
}

/// Parses a duration: `500ms`, `2s`, `1m`, `1h`, `1m30s`, or a bare number of
/// seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let bad = || format!("bad duration `{s}` (use e.g. 500ms, 2s, 1m, 1h)");
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        let secs = value * scale;
        if !secs.is_finite() || secs > 1e9 {
            return Err(bad());
        }
        total += Duration::from_secs_f64(secs);
    }
    Ok(total)
}

/// Formats a duration the way manifests write it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else if !ms.is_multiple_of(60_000) || ms == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m", ms / 60_000)
    }
}

/// serde glue for `Duration` fields written as strings.
pub mod duration_serde {
    use super::*;

    /// Serializes as `500ms` / `2s` / `1m`.
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    /// Deserializes from a duration string or a number of seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Duration::from_secs(n)),
            Raw::Text(s) => parse_duration(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// serde glue for optional durations.
pub mod opt_duration_serde {
    use super::*;

    /// Serializes `Some` as a duration string.
    pub fn serialize<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    /// Deserializes a duration string or a number of seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        super::duration_serde::deserialize(d).map(Some)
    }
}

/// The limits of one run, fully resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Model calls before the run ends `error`/`max_iterations`.
    pub max_iterations: u32,
    /// Run time budget, from the run's start.
    #[serde(with = "duration_serde")]
    pub max_runtime: Duration,
    /// When the critic first decides (steer or extend).
    #[serde(with = "duration_serde")]
    pub soft_timeout: Duration,
    /// When the run ends `timeout`/`deadline` (plus extensions; never past 24 h).
    #[serde(with = "duration_serde")]
    pub hard_timeout: Duration,
    /// No heartbeat this long while a call is in flight → `killed`/`stalled`.
    #[serde(with = "duration_serde")]
    pub stall_timeout: Duration,
    /// How far one extension pushes the hard deadline.
    #[serde(with = "duration_serde")]
    pub extension: Duration,
    /// Extensions at most.
    pub max_extensions: u32,
    /// Identical consecutive tool calls before a steer (one more → `runaway`).
    pub repeat_limit: u32,
    /// Per tool call.
    #[serde(with = "duration_serde")]
    pub tool_timeout: Duration,
    /// Consecutive steps whose tool calls all failed before `error`/`tool_errors`.
    pub max_tool_errors: u32,
    /// Tool results longer than this are capped (head + tail + marker).
    pub max_tool_result_bytes: u32,
    /// Grace between asking a killed run to stop and hard-killing it. A run
    /// hosted on a critic shard stops in the handler that kills it (its
    /// handler never waits), so no grace is ever taken; the key is kept for
    /// manifests and for runs that may be slow to stop.
    #[serde(with = "duration_serde")]
    pub kill_grace: Duration,
    /// The model's context window in tokens, over the price table's; `0`
    /// turns context compaction off. `None`: the price table's window (a
    /// model it does not know never compacts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}

impl Limits {
    /// These limits as a layer with every key set.
    pub fn to_spec(&self) -> LimitsSpec {
        LimitsSpec {
            max_iterations: Some(self.max_iterations),
            max_runtime: Some(self.max_runtime),
            soft_timeout: Some(self.soft_timeout),
            hard_timeout: Some(self.hard_timeout),
            stall_timeout: Some(self.stall_timeout),
            extension: Some(self.extension),
            max_extensions: Some(self.max_extensions),
            repeat_limit: Some(self.repeat_limit),
            tool_timeout: Some(self.tool_timeout),
            max_tool_errors: Some(self.max_tool_errors),
            max_tool_result_bytes: Some(self.max_tool_result_bytes),
            kill_grace: Some(self.kill_grace),
            context_window: self.context_window,
        }
    }

    /// The smallest layer that resolves (over no other layer) back to these
    /// limits: the keys the built-in defaults would not reproduce. It is
    /// what a store keeps of a run's limits; `to_minimal_spec().resolve(&
    /// LimitsSpec::default())` gives these limits again.
    pub fn to_minimal_spec(&self) -> LimitsSpec {
        let mut spec = self.to_spec();
        let none = LimitsSpec::default();
        // Greedy, key by key: a key goes if the whole resolution stays the
        // same without it (a derived default such as `soft_timeout` =
        // `max_runtime` is checked against the keys still set).
        macro_rules! drop_if_default {
            ($($key:ident),*) => {$(
                let kept = spec.$key.take();
                if spec.resolve(&none) != *self {
                    spec.$key = kept;
                }
            )*};
        }
        drop_if_default!(
            max_iterations,
            max_runtime,
            soft_timeout,
            hard_timeout,
            stall_timeout,
            extension,
            max_extensions,
            repeat_limit,
            tool_timeout,
            max_tool_errors,
            max_tool_result_bytes,
            kill_grace,
            context_window
        );
        spec
    }
}

/// The absolute failsafe: no run lives longer than this, extensions included.
pub const ABSOLUTE_DEADLINE: Duration = Duration::from_secs(24 * 3600);

impl Default for Limits {
    fn default() -> Self {
        LimitsSpec::default().resolve(&LimitsSpec::default())
    }
}

/// Limits as a manifest, an invocation or a host writes them: every key optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// See [`Limits::max_iterations`] (default 12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u32>,
    /// See [`Limits::max_runtime`] (default 60s).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_runtime: Option<Duration>,
    /// See [`Limits::soft_timeout`] (default `max_runtime`).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub soft_timeout: Option<Duration>,
    /// See [`Limits::hard_timeout`] (default 2 × `max_runtime`).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub hard_timeout: Option<Duration>,
    /// See [`Limits::stall_timeout`] (default 60s).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub stall_timeout: Option<Duration>,
    /// See [`Limits::extension`] (default `max_runtime`).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub extension: Option<Duration>,
    /// See [`Limits::max_extensions`] (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_extensions: Option<u32>,
    /// See [`Limits::repeat_limit`] (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_limit: Option<u32>,
    /// See [`Limits::tool_timeout`] (default 60s).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_timeout: Option<Duration>,
    /// See [`Limits::max_tool_errors`] (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_errors: Option<u32>,
    /// See [`Limits::max_tool_result_bytes`] (default 16384).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_result_bytes: Option<u32>,
    /// See [`Limits::kill_grace`] (default 5s).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub kill_grace: Option<Duration>,
    /// See [`Limits::context_window`] (default: the price table's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}

impl LimitsSpec {
    /// This layer over `lower`: keys set here win.
    pub fn over(&self, lower: &LimitsSpec) -> LimitsSpec {
        LimitsSpec {
            max_iterations: self.max_iterations.or(lower.max_iterations),
            max_runtime: self.max_runtime.or(lower.max_runtime),
            soft_timeout: self.soft_timeout.or(lower.soft_timeout),
            hard_timeout: self.hard_timeout.or(lower.hard_timeout),
            stall_timeout: self.stall_timeout.or(lower.stall_timeout),
            extension: self.extension.or(lower.extension),
            max_extensions: self.max_extensions.or(lower.max_extensions),
            repeat_limit: self.repeat_limit.or(lower.repeat_limit),
            tool_timeout: self.tool_timeout.or(lower.tool_timeout),
            max_tool_errors: self.max_tool_errors.or(lower.max_tool_errors),
            max_tool_result_bytes: self.max_tool_result_bytes.or(lower.max_tool_result_bytes),
            kill_grace: self.kill_grace.or(lower.kill_grace),
            context_window: self.context_window.or(lower.context_window),
        }
    }

    /// Resolves this layer over `lower`, then fills what is still unset with
    /// the built-in defaults and the derived ones.
    pub fn resolve(&self, lower: &LimitsSpec) -> Limits {
        let m = self.over(lower);
        let max_runtime = m.max_runtime.unwrap_or(Duration::from_secs(60));
        let hard = m.hard_timeout.unwrap_or(max_runtime * 2);
        Limits {
            max_iterations: m.max_iterations.unwrap_or(12),
            max_runtime,
            soft_timeout: m.soft_timeout.unwrap_or(max_runtime),
            hard_timeout: hard.min(ABSOLUTE_DEADLINE),
            stall_timeout: m.stall_timeout.unwrap_or(Duration::from_secs(60)),
            extension: m.extension.unwrap_or(max_runtime),
            max_extensions: m.max_extensions.unwrap_or(2),
            repeat_limit: m.repeat_limit.unwrap_or(3).max(1),
            tool_timeout: m.tool_timeout.unwrap_or(Duration::from_secs(60)),
            max_tool_errors: m.max_tool_errors.unwrap_or(3).max(1),
            max_tool_result_bytes: m.max_tool_result_bytes.unwrap_or(16 * 1024).max(256),
            kill_grace: m.kill_grace.unwrap_or(Duration::from_secs(5)),
            context_window: m.context_window,
        }
    }
}

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

/// A caller budget a manifest may carry (the CLI's `--budget-tokens` wins).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// Token limit for the caller.
    #[serde(default)]
    pub tokens: Option<u64>,
}

/// An agent manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Agent name.
    pub name: String,
    /// Model spec (`scripted`, `openai:MODEL`, `anthropic:MODEL`,
    /// `ollama:MODEL`, a tier name such as `fast`). Left out: `scripted`
    /// when the manifest has a `script`, else the default tier `fast`.
    #[serde(default)]
    pub model: String,
    /// What the agent is for (shown to parents that delegate to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// System prompt.
    #[serde(default)]
    pub system: String,
    /// The prompt used when the invocation brings none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Tools the agent may call, by name.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Limits (unset keys fall back to the host's defaults).
    #[serde(default)]
    pub limits: LimitsSpec,
    /// The scripted model's responses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script: Vec<ScriptEntry>,
    /// Caller budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
    /// Checkpoint after every step and resume after a crash (`Host::recover`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub durable: bool,
    /// The model server's API base (`http://127.0.0.1:8080/v1`), over
    /// `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL` and the public endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable that holds the API key (it must be set),
    /// instead of `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// A JSON Schema the final answer must parse and validate against (one
    /// repair turn on mismatch, then `error`/`invalid_output`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// MCP servers whose tools the agent's runs get (`<server>__<tool>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<crate::mcp::spec::McpSpec>,
}

impl AgentSpec {
    /// A minimal spec: a name and a model, nothing else.
    pub fn new(name: impl Into<String>, model: impl Into<String>) -> Self {
        AgentSpec {
            name: name.into(),
            model: model.into(),
            description: None,
            system: String::new(),
            prompt: None,
            tools: Vec::new(),
            limits: LimitsSpec::default(),
            script: Vec::new(),
            budget: None,
            durable: false,
            base_url: None,
            api_key_env: None,
            output_schema: None,
            mcp: None,
        }
    }

    /// Parses and checks a manifest from YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        Self::parse(text, None)
    }

    /// Reads, parses and checks a manifest file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SpecError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| SpecError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, Some(path.display().to_string()))
    }

    fn parse(text: &str, path: Option<String>) -> Result<Self, SpecError> {
        let mut spec: AgentSpec = serde_norway::from_str(text).map_err(|e| SpecError::Parse {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if spec.model.trim().is_empty() {
            spec.model = if spec.script.is_empty() {
                crate::providers::DEFAULT_TIER.to_string()
            } else {
                "scripted".to_string()
            };
        }
        spec.check(text)
            .map_err(|message| SpecError::Invalid { path, message })?;
        Ok(spec)
    }

    /// Checks what serde cannot: a name, script entries that say something,
    /// consistent limits. `source` (the YAML text) is used to find lines.
    fn check(&self, source: &str) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("`name` must not be empty".into());
        }
        if let Some(mcp) = &self.mcp {
            mcp.check()?;
        }
        let mut seen = std::collections::HashSet::new();
        for t in &self.tools {
            if !seen.insert(t.as_str()) {
                return Err(format!("tool `{t}` is listed twice{}", line_of(source, t)));
            }
        }
        for (i, e) in self.script.iter().enumerate() {
            let n = i + 1;
            let says = e.text.is_some()
                || e.tool.is_some()
                || e.tools.is_some()
                || e.hang
                || e.fail.is_some();
            if !says {
                return Err(format!(
                    "script entry {n} says nothing: give `text`, `tool`, `tools`, `hang` or `fail`"
                ));
            }
            if e.tool.is_some() && e.tools.is_some() {
                return Err(format!("script entry {n} has both `tool` and `tools`"));
            }
            if e.args.is_some() && e.tool.is_none() {
                return Err(format!("script entry {n} has `args` without `tool`"));
            }
            if e.forever && e.repeat.is_some() {
                return Err(format!("script entry {n} has both `repeat` and `forever`"));
            }
            if e.repeat == Some(0) {
                return Err(format!("script entry {n}: `repeat` must be at least 1"));
            }
        }
        if let Some(schema) = &self.output_schema {
            crate::tools::validate::compile_schema(schema).map_err(|e| {
                format!(
                    "`output_schema` is not a usable JSON Schema{}: {e}",
                    line_of(source, "output_schema")
                )
            })?;
        }
        if self.model == "scripted" && self.script.is_empty() {
            return Err("`model: scripted` needs a `script`".into());
        }
        let l = &self.limits;
        if l.max_iterations == Some(0) {
            return Err("`limits.max_iterations` must be at least 1".into());
        }
        for (key, d) in [
            ("max_runtime", l.max_runtime),
            ("hard_timeout", l.hard_timeout),
            ("stall_timeout", l.stall_timeout),
            ("tool_timeout", l.tool_timeout),
        ] {
            if d == Some(Duration::ZERO) {
                return Err(format!(
                    "`limits.{key}` must be more than 0{}",
                    line_of(source, key)
                ));
            }
        }
        Ok(())
    }
}

/// " at line N" for the first line that mentions `needle`, or "".
pub fn line_of(source: &str, needle: &str) -> String {
    source
        .lines()
        .position(|l| {
            let l = l.split('#').next().unwrap_or("");
            l.contains(needle)
        })
        .map(|i| format!(" at line {}", i + 1))
        .unwrap_or_default()
}

/// A file, image or blob handed to a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    /// File name.
    pub name: String,
    /// MIME type.
    pub mime: String,
    /// Content (text, or base64 for binary).
    pub content: String,
}

/// One request to run an agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Invocation {
    /// The run's id (minted when absent).
    pub run_id: Option<RunId>,
    /// Who asks (budgets and caps are per caller).
    pub caller_id: Option<String>,
    /// The channel (chat bots).
    pub channel_id: Option<String>,
    /// The parent run (sub-agents).
    pub parent_run_id: Option<RunId>,
    /// The session whose history the run shares.
    pub session_id: Option<String>,
    /// Named inputs.
    pub inputs: BTreeMap<String, Value>,
    /// The prompt text.
    pub prompt: String,
    /// Attachments.
    pub attachments: Vec<Attachment>,
    /// Limit overrides for this run only.
    pub limits: LimitsSpec,
    /// A deadline the run may not outlive (a sub-agent's parent's): its
    /// hard deadline is capped at it, and reaching it ends the run
    /// `killed`/`parent`. In-process only (not serialized).
    #[serde(skip)]
    pub deadline: Option<tokio::time::Instant>,
}

impl Invocation {
    /// An invocation with just a prompt.
    pub fn prompt(text: impl Into<String>) -> Self {
        Invocation {
            prompt: text.into(),
            ..Default::default()
        }
    }

    /// Sets the caller.
    pub fn caller(mut self, caller: impl Into<String>) -> Self {
        self.caller_id = Some(caller.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_spec_resolves_back() {
        let none = LimitsSpec::default();
        let defaults = Limits::default();
        assert_eq!(defaults.to_minimal_spec(), none);
        let layers = [
            LimitsSpec {
                max_runtime: Some(Duration::from_secs(30)),
                ..none
            },
            LimitsSpec {
                max_runtime: Some(Duration::from_secs(30)),
                soft_timeout: Some(Duration::from_secs(60)),
                max_iterations: Some(4),
                context_window: Some(0),
                ..none
            },
            LimitsSpec {
                hard_timeout: Some(Duration::from_secs(7)),
                repeat_limit: Some(1),
                ..none
            },
        ];
        for layer in layers {
            let limits = layer.resolve(&none);
            let minimal = limits.to_minimal_spec();
            assert_eq!(minimal.resolve(&none), limits, "{layer:?}");
            assert!(minimal.kill_grace.is_none() && minimal.tool_timeout.is_none());
        }
        // A derived default is kept when its base changed but it did not.
        let limits = layers[1].resolve(&none);
        assert_eq!(
            limits.to_minimal_spec().soft_timeout,
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        for bad in ["", "5 parsecs", "ms", "10x", "-1s", "1e99h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_resolve_with_derived_defaults() {
        let l = Limits::default();
        assert_eq!(l.max_iterations, 12);
        assert_eq!(l.max_runtime, Duration::from_secs(60));
        assert_eq!(l.soft_timeout, Duration::from_secs(60));
        assert_eq!(l.hard_timeout, Duration::from_secs(120));
        assert_eq!(l.extension, Duration::from_secs(60));
        let manifest = LimitsSpec {
            max_runtime: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        let run = LimitsSpec {
            max_iterations: Some(3),
            ..Default::default()
        };
        let l = run.resolve(&manifest);
        assert_eq!(l.max_iterations, 3);
        assert_eq!(l.hard_timeout, Duration::from_secs(20));
        assert_eq!(l.soft_timeout, Duration::from_secs(10));
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let err = AgentSpec::from_yaml("name: a\nscript:\n  - {text: hi}\nlimmits: {}\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("limmits") && err.contains("line 4"), "{err}");
    }

    #[test]
    fn context_window_is_a_limit_and_typos_are_refused() {
        let yaml = "name: a\nlimits: {context_window: 8000}\nscript: [{text: hi}]\n";
        let limits = AgentSpec::from_yaml(yaml).map(|s| s.limits.resolve(&LimitsSpec::default()));
        assert_eq!(limits.ok().and_then(|l| l.context_window), Some(8000));
        assert_eq!(Limits::default().context_window, None);
        let err = AgentSpec::from_yaml(&yaml.replace("context_window", "context_windows"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("context_windows"), "{err}");
    }

    #[test]
    fn bad_duration_is_named() {
        let err = AgentSpec::from_yaml(
            "name: a\nlimits: {max_runtime: 5 parsecs}\nscript: [{text: hi}]\n",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("5 parsecs") && err.contains("line 2"), "{err}");
    }

    #[test]
    fn empty_script_entry_is_refused() {
        let err = AgentSpec::from_yaml("name: a\nscript: [{latency: 5ms}]\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("entry 1"), "{err}");
    }
}
