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
//!
//! The manifest and its checks are here; its parts have files of their own:
//! `limits` (the layers and their ranges), `duration` (how durations are
//! written), `shape` (the guard before parsing), `script` (the scripted
//! model's entries, owned by `crate::providers::scripted`), `phases`
//! (pipelines), `palette` (sub-agents and offered skills), `guard` (tool and output guards),
//! `critic` (the `critic:` section: how the critic watches runs), `judge`
//! (the model judges' keys) and
//! `invocation` (a run's request and the inputs it fills in).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

pub use crate::ports::model::Attachment;
use crate::ports::model::{CallOptions, ToolChoice};

mod approval;
mod critic;
mod guard;
mod invocation;
mod judge;
pub mod mcp;
mod palette;
mod phases;
mod shape;
#[cfg(test)]
mod tests;

pub use crate::ports::duration::{
    duration_serde, format_duration, opt_duration_serde, parse_duration, MAX_DURATION,
};
pub use crate::ports::limits::*;
pub use crate::providers::scripted::{ScriptEntry, ScriptFailure, ScriptToolCall, ScriptUsage};
pub use approval::APPROVE_ALL;
pub use critic::{CriticSpec, LoopsSpec};
pub use guard::{
    glob_matches, ArgsPattern, GuardAction, GuardRule, GuardVerdict, Guards, OutputGuard,
    GUARDRAIL, GUARD_DENIED,
};
pub use invocation::{fill_inputs, Invocation, MissingInput};
pub use judge::{ApprovalSpec, JudgeSpec, PolicyName};
pub use palette::{
    OfferedSkill, PaletteKind, SkillPalette, SubAgent, SubAgentRef, AGENT_TOOL_PREFIX,
    SKILL_TOOL_PREFIX,
};
pub use phases::*;
use shape::too_large;
pub use shape::{check_manifest_shape, MAX_MANIFEST_BYTES, MAX_MANIFEST_DEPTH};

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

/// The budget of each run of a manifest: with the caller's limits, the
/// invocation's `budget_tokens` and a command's `--budget-tokens`, the
/// tightest applies (see `actors::budget`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// Tokens each run may spend, its sub-agents' included (1 or more).
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
    /// Effect classes that override what tools declare, by tool name
    /// (`tools_effects: { send_mail: egress, lookup: read }`; see
    /// [`ToolEffect`](crate::ports::tool::ToolEffect)): what a fork's
    /// effect policy reads. Each name must be a tool the agent can call.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools_effects: BTreeMap<String, crate::ports::tool::ToolEffect>,
    /// Tools whose calls wait for an operator's approval (`*`: all; see
    /// `approval_timeout` in `limits`): a list, or `{ tools, judge }` with
    /// a model that approves or escalates each call first.
    #[serde(default, skip_serializing_if = "ApprovalSpec::is_empty")]
    pub approval: ApprovalSpec,
    /// Tool guards: rules checked before a call runs, the first that
    /// matches deciding (deny, ask, allow, `max_calls`; see [`GuardRule`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guard: Vec<GuardRule>,
    /// Patterns the final answer must not match (one repair turn, then
    /// `error`/`guardrail`; see [`OutputGuard`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_guard: Option<OutputGuard>,
    /// Limits (unset keys fall back to the host's defaults).
    #[serde(default)]
    pub limits: LimitsSpec,
    /// How the critic watches the runs (`critic:`; see [`CriticSpec`]).
    #[serde(default, skip_serializing_if = "CriticSpec::is_empty")]
    pub critic: CriticSpec,
    /// The scripted model's responses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script: Vec<ScriptEntry>,
    /// Each run's budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
    /// Checkpoint after every step and resume after a crash (`Host::recover`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub durable: bool,
    /// How much of each run the audit log keeps (`full` or `summary`; see
    /// [`AuditDetail`](crate::ports::audit::AuditDetail)); unset: the
    /// host's setting (`HostConfig::audit`, `--audit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<crate::ports::audit::AuditDetail>,
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
    pub mcp: Option<mcp::McpSpec>,
    /// Sub-agents this agent may delegate to, by name: each is a tool
    /// `agent__NAME` that runs the named manifest as a child run
    /// (`researcher: researcher.yaml`, or `{ file: …, description: … }`;
    /// paths relative to this manifest).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, SubAgentRef>,
    /// Skills of a skills repository offered as tools: each a tool
    /// `skill__NAME` that runs the skill as a child run
    /// (`{ repo: PATH, offer: [NAME, …] }`, the path relative to this
    /// manifest; see [`SkillPalette`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<SkillPalette>,
    /// The palette, read when this manifest was loaded: the sub-agents'
    /// manifests, then the offered skills' (kept in checkpoints, so a
    /// resumed run has its palette).
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
        // Every tool the model sees can be named: its `tools`, a
        // sub-agent's `agent__NAME`, an offered skill's `skill__NAME`, an
        // MCP server's `SERVER__TOOL` (whose tools are known only once the
        // server starts: the host checks the name again then). `required`
        // counts them all.
        let sees_tools = !self.tools.is_empty()
            || self.has_palette()
            || self.mcp.as_ref().is_some_and(|m| !m.servers.is_empty());
        match &self.tool_choice {
            Some(ToolChoice::Tool(name)) if !self.can_call(name) => {
                return Err(format!(
                    "`tool_choice` names `{name}`, which this agent cannot call{} (use auto, required, none, or one of its `tools`, an `agent__NAME` of its `agents`, a `skill__NAME` of its `skills` or an MCP server's `SERVER__TOOL`)",
                    at("tool_choice")
                ));
            }
            Some(ToolChoice::Required) if !sees_tools => {
                return Err(format!(
                    "`tool_choice` asks for a tool call but the agent has no tools (no `tools`, `agents`, `skills` or MCP servers){}",
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
            tools_effects: BTreeMap::new(),
            approval: ApprovalSpec::default(),
            guard: Vec::new(),
            output_guard: None,
            limits: LimitsSpec::default(),
            critic: CriticSpec::default(),
            script: Vec::new(),
            budget: None,
            durable: false,
            audit: None,
            base_url: None,
            api_key_env: None,
            output_schema: None,
            mcp: None,
            agents: BTreeMap::new(),
            skills: None,
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
    /// Sub-agents and skills repositories it names are read relative to
    /// the working directory.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        let mut spec = Self::parse(text, None)?;
        if spec.has_palette() {
            spec.read_palette(Path::new("."), &mut Vec::new(), None)?;
        }
        Ok(spec)
    }

    /// Reads, parses and checks a manifest file, and the palette it names
    /// (sub-agents' manifests and skills repositories, relative to it).
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
    pub(crate) fn check(&self, source: &str) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("`name` must not be empty".into());
        }
        if let Some(mcp) = &self.mcp {
            mcp.check()?;
        }
        if self.budget.and_then(|b| b.tokens) == Some(0) {
            return Err(format!(
                "`budget.tokens` must be at least 1{}",
                line_of(source, "tokens")
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &self.tools {
            if !seen.insert(t.as_str()) {
                return Err(format!("tool `{t}` is listed twice{}", line_of(source, t)));
            }
        }
        for name in self.tools_effects.keys() {
            if !self.can_call(name) {
                return Err(format!(
                    "`tools_effects` names `{name}`, which this agent cannot call{} (name one of its `tools`, an `agent__NAME` of its `agents`, a `skill__NAME` of its `skills` or an MCP server's `SERVER__TOOL`)",
                    line_of(source, "tools_effects")
                ));
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
            crate::dispatch::validate::compile_schema(schema).map_err(|e| {
                format!(
                    "`output_schema` is not a usable JSON Schema{}: {e}",
                    line_of(source, "output_schema")
                )
            })?;
        }
        self.check_call_options(source)?;
        self.check_approval(source)?;
        self.check_guards(source)?;
        if let Some(critic) = &self.critic.judge {
            critic
                .check()
                .map_err(|e| format!("{e}{}", line_of(source, "critic")))?;
        }
        self.check_critic(source)?;
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

impl AgentSpec {
    /// Checks a manifest changed after it was parsed (a fork's overrides:
    /// another system prompt, critic section or model) as parsing checks
    /// one; the message names the key, without a line.
    pub fn check_changed(&self) -> Result<(), SpecError> {
        self.check("").map_err(|message| SpecError::Invalid {
            path: None,
            message,
        })
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
