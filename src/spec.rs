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
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

pub use crate::ports::model::Attachment;
use crate::ports::model::{CallOptions, ToolChoice};
use crate::ports::run::RunId;

mod approval;
mod limits;
mod palette;
mod phases;
#[cfg(test)]
mod tests;

pub use approval::APPROVE_ALL;
pub use limits::*;
pub use palette::{SubAgent, SubAgentRef};
pub use phases::*;

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

/// The longest duration a manifest may write (every limit is bounded by the
/// 24 h failsafe, so `start + 24 h + extensions` can never overflow).
pub const MAX_DURATION: Duration = ABSOLUTE_DEADLINE;

/// serde glue for `Duration` fields written as strings.
pub mod duration_serde {
    use super::*;

    /// Serializes as `500ms` / `2s` / `1m`.
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    /// Deserializes from a duration string or a number of seconds; refuses
    /// a negative, non-finite or longer than [`MAX_DURATION`] value.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(DurationVisitor)
    }

    struct DurationVisitor;

    impl serde::de::Visitor<'_> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "a duration (500ms, 2s, 1m, 1h, or seconds) from 0 to 24h"
            )
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Duration, E> {
            bounded(
                Duration::from_secs(n.min(MAX_DURATION.as_secs() + 1)),
                &n.to_string(),
            )
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Duration, E> {
            match u64::try_from(n) {
                Ok(n) => self.visit_u64(n),
                Err(_) => Err(E::custom(format!(
                    "duration `{n}` is negative (use 0 to 24h)"
                ))),
            }
        }

        fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Duration, E> {
            if !x.is_finite() || x < 0.0 || x > MAX_DURATION.as_secs_f64() {
                return Err(E::custom(format!(
                    "duration `{x:?}` is out of range (use 0 to 24h)"
                )));
            }
            Ok(Duration::from_secs_f64(x))
        }

        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Duration, E> {
            let d = parse_duration(s).map_err(E::custom)?;
            bounded(d, s)
        }
    }

    fn bounded<E: serde::de::Error>(d: Duration, text: &str) -> Result<Duration, E> {
        if d > MAX_DURATION {
            return Err(E::custom(format!(
                "duration `{text}` is longer than 24h, the longest a run may live"
            )));
        }
        Ok(d)
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

/// The largest manifest accepted, in bytes (checked before parsing).
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;
/// The deepest nesting a manifest may have (checked before parsing, so
/// parse time stays linear in the manifest's size).
pub const MAX_MANIFEST_DEPTH: usize = 64;

fn too_large() -> String {
    format!("the manifest is larger than {MAX_MANIFEST_BYTES} bytes (1 MiB), the limit")
}

/// Refuses a manifest that is too large or nested too deep, without
/// parsing it: one pass over the text. Block nesting is counted by
/// indentation (and `- - x` dashes), flow nesting by `[`/`{` outside
/// quotes; the contents of block scalars (`|`, `>`) are skipped.
pub fn check_manifest_shape(text: &str) -> Result<(), String> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(too_large());
    }
    let deep = |n: usize| {
        format!(
            "the manifest nests deeper than {MAX_MANIFEST_DEPTH} levels at line {}",
            n + 1
        )
    };
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut block_scalar: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start_matches([' ', '\t']);
        let indent = line.len() - trimmed.len();
        if let Some(owner) = block_scalar {
            if trimmed.is_empty() || indent > owner {
                continue;
            }
            block_scalar = None;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if flow == 0 {
            while indents.last().is_some_and(|&i| i >= indent) {
                indents.pop();
            }
            indents.push(indent);
            let mut rest = trimmed;
            let mut dashes = 0;
            while let Some(r) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("-\t")) {
                dashes += 1;
                rest = r.trim_start();
            }
            if indents.len() + dashes > MAX_MANIFEST_DEPTH {
                return Err(deep(n));
            }
        }
        let mut quote: Option<char> = None;
        let mut prev = ' ';
        let mut escaped = false;
        for c in trimmed.chars() {
            match quote {
                Some(q) => {
                    if q == '"' && c == '\\' && !escaped {
                        escaped = true;
                        continue;
                    }
                    if c == q && !escaped {
                        quote = None;
                    }
                    escaped = false;
                }
                None => match c {
                    '"' | '\'' if matches!(prev, ' ' | '\t' | ':' | '[' | '{' | ',' | '-') => {
                        quote = Some(c)
                    }
                    '#' if matches!(prev, ' ' | '\t') => break,
                    '[' | '{' => {
                        flow += 1;
                        if indents.len() + flow > MAX_MANIFEST_DEPTH {
                            return Err(deep(n));
                        }
                    }
                    ']' | '}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            prev = c;
        }
        let head = trimmed.split(" #").next().unwrap_or("").trim_end();
        if flow == 0
            && quote.is_none()
            && head
                .rsplit([' ', ':', '-'])
                .next()
                .is_some_and(|t| t.starts_with(['|', '>']) && t.len() <= 3)
        {
            block_scalar = Some(indent);
        }
    }
    Ok(())
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
    /// when the manifest has a `script`, else (kept empty) the default tier
    /// `fast`, if something configures it (see
    /// `providers::ResolveError::NoModel`).
    #[serde(default)]
    pub model: String,
    /// What the agent is for (shown to parents that delegate to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// System prompt.
    #[serde(default)]
    pub system: String,
    /// The prompt used when the invocation brings none. `{{inputs.NAME}}`
    /// here and in `system` is replaced by the invocation's input `NAME`
    /// (see [`fill_inputs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Tools the agent may call, by name.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Tools whose calls wait for an operator's approval (`*`: all; see
    /// `approval_timeout` in `limits`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approval: Vec<String>,
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
    /// Sub-agents this agent may delegate to, by name: each is a tool
    /// `agent__NAME` that runs the named manifest as a child run
    /// (`researcher: researcher.yaml`, or `{ file: …, description: … }`;
    /// paths relative to this manifest).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, SubAgentRef>,
    /// The sub-agents' manifests, read when this one was loaded (kept in
    /// checkpoints, so a resumed run has its palette).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "agents_resolved"
    )]
    pub sub_agents: Vec<SubAgent>,
    /// The JSON Schema of what a parent passes when it delegates to this
    /// agent (the `agent__NAME` tool's arguments, given to the run as its
    /// inputs); without it the tool takes `{prompt: string}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Value>,

    // ---- Model call options: passed through to the provider (see
    // `CallOptions`); unset keys are not sent. ----
    /// Which tool the model must call: `auto` (the default, sent whenever
    /// the agent has tools), `required`, `none`, or one of its tools' names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Sampling temperature (0 to 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The cap on each reply's tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Nucleus sampling (above 0, at most 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Sampling seed (OpenAI-compatible servers; Anthropic has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Stop sequences: one string or a list.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "one_or_many"
    )]
    pub stop: Vec<String>,
    /// A pipeline's ordered phases (see [`PhaseSpec`] and
    /// `crate::pipeline`); empty for a plain agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseSpec>,
}

/// A string or a list of strings, as a list.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::One(s) => vec![s],
        Raw::Many(v) => v,
    })
}

impl AgentSpec {
    /// The manifest's model call options, or `None` when it sets none (the
    /// defaults: `tool_choice: auto` with tools, the server's sampling).
    pub fn call_options(&self) -> Option<CallOptions> {
        let options = CallOptions {
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            top_p: self.top_p,
            seed: self.seed,
            stop: self.stop.clone(),
            tool_choice: self.tool_choice.clone().unwrap_or_default(),
        };
        (options != CallOptions::default()).then_some(options)
    }

    /// Checks the model call options (part of [`check`](Self::check)).
    fn check_call_options(&self, source: &str) -> Result<(), String> {
        let at = |key: &str| line_of(source, key);
        match &self.tool_choice {
            Some(ToolChoice::Tool(name)) if !self.tools.iter().any(|t| t == name) => {
                return Err(format!(
                    "`tool_choice` names `{name}`, which is not in `tools`{} (use auto, required, none or a listed tool)",
                    at("tool_choice")
                ));
            }
            Some(ToolChoice::Required | ToolChoice::Tool(_)) if self.tools.is_empty() => {
                return Err(format!(
                    "`tool_choice` asks for a tool call but `tools` is empty{}",
                    at("tool_choice")
                ));
            }
            _ => {}
        }
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(format!(
                    "`temperature` must be between 0 and 2, not {t}{}",
                    at("temperature")
                ));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(format!(
                    "`top_p` must be above 0 and at most 1, not {p}{}",
                    at("top_p")
                ));
            }
        }
        if self.max_tokens == Some(0) {
            return Err(format!(
                "`max_tokens` must be at least 1{}",
                at("max_tokens")
            ));
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return Err(format!("`stop` holds an empty sequence{}", at("stop")));
        }
        Ok(())
    }

    /// A minimal spec: a name and a model, nothing else.
    pub fn new(name: impl Into<String>, model: impl Into<String>) -> Self {
        AgentSpec {
            name: name.into(),
            model: model.into(),
            description: None,
            system: String::new(),
            prompt: None,
            tools: Vec::new(),
            approval: Vec::new(),
            limits: LimitsSpec::default(),
            script: Vec::new(),
            budget: None,
            durable: false,
            base_url: None,
            api_key_env: None,
            output_schema: None,
            mcp: None,
            agents: BTreeMap::new(),
            sub_agents: Vec::new(),
            inputs: None,
            tool_choice: None,
            temperature: None,
            max_tokens: None,
            top_p: None,
            seed: None,
            stop: Vec::new(),
            phases: Vec::new(),
        }
    }

    /// Parses and checks a manifest from YAML text.
    /// Sub-agents it names are read relative to the working directory.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        let mut spec = Self::parse(text, None)?;
        if !spec.agents.is_empty() {
            spec.read_sub_agents(Path::new("."), &mut Vec::new(), None)?;
        }
        Ok(spec)
    }

    /// Reads, parses and checks a manifest file, and the sub-agents'
    /// manifests it names (relative to it).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SpecError> {
        let path = path.as_ref();
        let mut stack = Vec::new();
        if let Ok(c) = std::fs::canonicalize(path) {
            stack.push(c);
        }
        Self::from_file_in(path, &mut stack)
    }

    fn read_file(path: &Path) -> Result<Self, SpecError> {
        let read_err = |e: std::io::Error| SpecError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        // Never read more than the cap (plus one byte to know it is over).
        let mut bytes = Vec::new();
        let file = std::fs::File::open(path).map_err(read_err)?;
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_MANIFEST_BYTES as u64 + 1),
            &mut bytes,
        )
        .map_err(read_err)?;
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(SpecError::Invalid {
                path: Some(path.display().to_string()),
                message: too_large(),
            });
        }
        let text = String::from_utf8(bytes)
            .map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        Self::parse(&text, Some(path.display().to_string()))
    }

    fn parse(text: &str, path: Option<String>) -> Result<Self, SpecError> {
        check_manifest_shape(text).map_err(|message| SpecError::Invalid {
            path: path.clone(),
            message,
        })?;
        let mut spec: AgentSpec = serde_norway::from_str(text).map_err(|e| SpecError::Parse {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if spec.model.trim().is_empty()
            && (!spec.script.is_empty() || spec.phases.iter().any(|p| !p.script.is_empty()))
        {
            spec.model = "scripted".to_string();
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
        self.check_call_options(source)?;
        self.check_approval(source)?;
        self.check_phases(source)?;
        if self.model == "scripted" && self.script.is_empty() && self.phases.is_empty() {
            return Err("`model: scripted` needs a `script`".into());
        }
        self.limits.check().map_err(|e| {
            // The line of `limits:`'s key, searched from the `limits` line.
            let from = source
                .lines()
                .position(|l| l.trim_start().starts_with("limits"))
                .unwrap_or(0);
            let line = source
                .lines()
                .skip(from)
                .position(|l| l.split('#').next().unwrap_or("").contains(e.key))
                .map(|i| format!(" at line {}", from + i + 1))
                .unwrap_or_default();
            format!("{e}{line}")
        })?;
        if self.limits.first_token_timeout == Some(Duration::ZERO) {
            return Err(format!(
                "`limits.first_token_timeout` must be more than 0{}",
                line_of(source, "first_token_timeout")
            ));
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
    /// Named inputs: they fill the manifest's `{{inputs.NAME}}`
    /// placeholders (see [`fill_inputs`]); with neither a prompt here nor
    /// one in the manifest, the inputs as a JSON object are the prompt.
    pub inputs: BTreeMap<String, Value>,
    /// The prompt text.
    pub prompt: String,
    /// Files and images that come with the prompt (see [`Attachment`]):
    /// they reach models that accept them with the first user message.
    pub attachments: Vec<Attachment>,
    /// Limit overrides for this run only.
    pub limits: LimitsSpec,
    /// Earlier turns the run starts from, between the system prompt and
    /// the prompt (a chat session's history: see `crate::session`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<crate::ports::model::Message>,
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

/// An input a manifest's template names that the invocation does not bring.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the manifest's `{field}` uses `{{{{inputs.{name}}}}}`, but the invocation has no input `{name}`")]
pub struct MissingInput {
    /// The manifest field (`prompt` or `system`).
    pub field: &'static str,
    /// The input's name.
    pub name: String,
}

/// The opening of a placeholder.
const PLACEHOLDER: &str = "{{";

/// Fills a manifest text's `{{inputs.NAME}}` placeholders (spaces inside
/// the braces allowed: `{{ inputs.NAME }}`) with the invocation's inputs: a
/// string as is, any other JSON value as compact JSON. Other `{{…}}` text
/// is left alone. A text without placeholders is returned borrowed.
pub fn fill_inputs<'a>(
    field: &'static str,
    text: &'a str,
    inputs: &BTreeMap<String, Value>,
) -> Result<std::borrow::Cow<'a, str>, MissingInput> {
    if !text.contains(PLACEHOLDER) {
        return Ok(std::borrow::Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(PLACEHOLDER) {
        out.push_str(&rest[..at]);
        let after = &rest[at + PLACEHOLDER.len()..];
        let parsed = after.find("}}").and_then(|end| {
            let name = after[..end].trim().strip_prefix("inputs.")?;
            let valid = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            valid.then_some((name, end))
        });
        match parsed {
            Some((name, end)) => {
                match inputs.get(name) {
                    Some(Value::String(v)) => out.push_str(v),
                    Some(v) => out.push_str(&v.to_string()),
                    None => {
                        return Err(MissingInput {
                            field,
                            name: name.to_string(),
                        })
                    }
                }
                rest = &after[end + 2..];
            }
            None => {
                out.push_str(PLACEHOLDER);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(std::borrow::Cow::Owned(out))
}

impl AgentSpec {
    /// Whether the manifest's `prompt` or `system` has a `{{` placeholder
    /// (runs of it then start from their own transcript).
    pub fn uses_inputs(&self) -> bool {
        self.system.contains(PLACEHOLDER)
            || self
                .prompt
                .as_deref()
                .is_some_and(|p| p.contains(PLACEHOLDER))
    }

    /// Checks that `inputs` fill every placeholder of the manifest's
    /// `prompt` and `system` (see [`fill_inputs`]).
    pub fn check_inputs(&self, inputs: &BTreeMap<String, Value>) -> Result<(), MissingInput> {
        if !self.uses_inputs() {
            return Ok(());
        }
        fill_inputs("system", &self.system, inputs)?;
        if let Some(p) = &self.prompt {
            fill_inputs("prompt", p, inputs)?;
        }
        Ok(())
    }
}
