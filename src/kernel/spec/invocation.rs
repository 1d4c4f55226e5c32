//! One request to run an agent ([`Invocation`]), and the inputs that fill
//! a manifest's `{{inputs.NAME}}` placeholders ([`fill_inputs`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{AgentSpec, LimitsSpec};
use crate::ports::model::Attachment;
use crate::ports::run::RunId;

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
    /// The tree a top-level run is recorded in
    /// ([`RunResult::root_run_id`](crate::RunResult::root_run_id)): a
    /// pipeline's phases name their pipeline. A sub-agent's is its
    /// parent's, whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<RunId>,
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
    /// This run's own token budget (its sub-agents' tokens count toward
    /// it): with the manifest's `budget.tokens`, the smaller applies, on
    /// top of the caller's limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u64>,
    /// Earlier turns the run starts from, between the system prompt and
    /// the prompt (a chat session's history: see `crate::session`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<crate::ports::model::Message>,
    /// A deadline the run may not outlive (a sub-agent's parent's, as it
    /// was when the child was started): its hard deadline is capped at it.
    /// For a sub-agent the cap then follows its parent's deadline as it
    /// moves, and the run ends `killed`/`parent` when its parent ends.
    /// In-process only (not serialized).
    #[serde(skip)]
    pub deadline: Option<tokio::time::Instant>,
    /// The recorded run and step this run is a fork of (set by
    /// `crate::fork`): recorded in its result as
    /// [`RunResult::forked_from`](crate::RunResult::forked_from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<crate::ports::run::ForkOrigin>,
    /// What the run owes once it ends (a scheduled skill's destinations):
    /// its intents are recorded with its terminal record (see
    /// [`crate::ports::outbox`]). Serialized as the plan's recipe only
    /// (a durable run's checkpoint), from which the host that resumes the
    /// run makes the plan again.
    #[serde(
        default,
        skip_serializing_if = "crate::ports::outbox::PublishHook::is_unrecorded"
    )]
    pub publish: crate::ports::outbox::PublishHook,
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
