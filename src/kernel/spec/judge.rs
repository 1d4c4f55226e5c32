//! The model judges a manifest can ask for: the critic's judge (the
//! `critic:` section's judge keys, [`JudgeSpec`]) and the approval judge
//! (`approval: { tools, judge }`, [`ApprovalSpec`]). What they do is in
//! `crate::judge` (the questions and the answers' schema), the critic
//! shard and the run's approval module.
//!
//! ```yaml
//! critic:
//!   policy: judge
//!   model: smart               # any model spec or tier
//!   confirm_model: openai:gpt-4o
//!   after_steps: 30            # first asked after this many steps
//!   every_steps: 10            # then every 5..15 steps, by its confidence
//!   threshold: 0.9             # a kill below it is a steer
//!   budget_tokens: 4000        # the judge's tokens for the whole run
//!   timeout: 20s               # per question; then the rules decide
//!   script: [...]              # `model: scripted`: the judge's answers
//!   confirm_script: [...]      # `confirm_model: scripted`: the second opinion's
//!
//! approval: [shell__run]       # shorthand: an operator decides every call
//! approval:
//!   tools: [shell__run]
//!   judge: fast                # approves, or escalates to an operator
//!   script: [...]              # `judge: scripted`
//! ```
//!
//! The `critic:` section holds the judge's keys in one struct of their
//! own, so that other critic settings can sit next to them.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::ports::duration::duration_serde;
use crate::providers::scripted::ScriptEntry;

/// Which policy the critic applies to a run's runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyName {
    /// The host's policy (the rules by default).
    #[default]
    Rules,
    /// A model judge, asked off the shard (the rules when it fails).
    Judge,
}

/// The critic's judge (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeSpec {
    /// `judge` asks the model; `rules` (the default) leaves the host's
    /// policy in charge (the other keys then do nothing).
    #[serde(default)]
    pub policy: PolicyName,
    /// The judge's model (a model spec or a tier).
    #[serde(default)]
    pub model: String,
    /// A second model asked before a kill is carried out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_model: Option<String>,
    /// Steps before the judge is first asked.
    #[serde(default = "default_after_steps")]
    pub after_steps: u32,
    /// Steps between two questions (it moves between 5 and 15 with the
    /// judge's confidence).
    #[serde(default = "default_every_steps")]
    pub every_steps: u32,
    /// The confidence a kill needs to be more than a steer (0 to 1).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// The tokens the judge may spend on one run, its questions together;
    /// past it the rules decide.
    #[serde(default = "default_budget_tokens")]
    pub budget_tokens: u64,
    /// How long one question may take; then the rules decide.
    #[serde(default = "default_timeout", with = "duration_serde")]
    pub timeout: Duration,
    /// The judge's answers when its model is `scripted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script: Vec<ScriptEntry>,
    /// The second opinion's answers when `confirm_model` is `scripted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirm_script: Vec<ScriptEntry>,
}

fn default_after_steps() -> u32 {
    30
}
fn default_every_steps() -> u32 {
    10
}
fn default_threshold() -> f64 {
    0.9
}
fn default_budget_tokens() -> u64 {
    4000
}
fn default_timeout() -> Duration {
    Duration::from_secs(20)
}

impl JudgeSpec {
    /// Whether a judge is asked at all.
    pub fn enabled(&self) -> bool {
        self.policy == PolicyName::Judge
    }

    /// Checks the keys serde cannot; `Err` names the key.
    pub(super) fn check(&self) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        if self.model.trim().is_empty() {
            return Err("`critic.policy: judge` needs `critic.model`".into());
        }
        if !(0.0..=1.0).contains(&self.threshold) {
            return Err(format!(
                "`critic.threshold` must be between 0 and 1, not {}",
                self.threshold
            ));
        }
        if self.every_steps == 0 {
            return Err("`critic.every_steps` must be at least 1".into());
        }
        if self.budget_tokens == 0 {
            return Err("`critic.budget_tokens` must be at least 1".into());
        }
        if self.timeout.is_zero() {
            return Err("`critic.timeout` must be more than 0".into());
        }
        check_script("critic.model", &self.model, &self.script)?;
        if let Some(m) = &self.confirm_model {
            check_script("critic.confirm_model", m, &self.confirm_script)?;
        }
        Ok(())
    }
}

/// A judge on the scripted model needs its script.
fn check_script(key: &str, model: &str, script: &[ScriptEntry]) -> Result<(), String> {
    if model.trim() == "scripted" && script.is_empty() {
        return Err(format!(
            "`{key}: scripted` needs its script (`critic.script` / `critic.confirm_script` / `approval.script`)"
        ));
    }
    Ok(())
}

/// Human approval gates (`approval:`): a list of tool patterns (an
/// operator decides every gated call), or `{ tools, judge }` (a model
/// approves or escalates each gated call first).
/// Written back as it is read: a list when it has no judge.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApprovalSpec {
    /// The gated tools (`*`: all; `SERVER__*`: an MCP server's).
    pub tools: Vec<String>,
    /// The approval judge's model, if any.
    pub judge: Option<String>,
    /// The approval judge's answers when its model is `scripted`.
    pub script: Vec<ScriptEntry>,
}

impl Serialize for ApprovalSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.judge.is_none() && self.script.is_empty() {
            return self.tools.serialize(s);
        }
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("tools", &self.tools)?;
        if let Some(j) = &self.judge {
            m.serialize_entry("judge", j)?;
        }
        if !self.script.is_empty() {
            m.serialize_entry("script", &self.script)?;
        }
        m.end()
    }
}

impl ApprovalSpec {
    /// Whether no tool is gated.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Checks the judge's keys; `Err` names the key.
    pub(super) fn check_judge(&self) -> Result<(), String> {
        match &self.judge {
            Some(m) if m.trim().is_empty() => Err("`approval.judge` must name a model".into()),
            Some(m) => check_script("approval.judge", m, &self.script),
            None if !self.script.is_empty() => {
                Err("`approval.script` is given without `approval.judge`".into())
            }
            None => Ok(()),
        }
    }
}

impl From<Vec<String>> for ApprovalSpec {
    fn from(tools: Vec<String>) -> Self {
        ApprovalSpec {
            tools,
            ..Default::default()
        }
    }
}

impl<'de> Deserialize<'de> for ApprovalSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            tools: Vec<String>,
            #[serde(default)]
            judge: Option<String>,
            #[serde(default)]
            script: Vec<ScriptEntry>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            List(Vec<String>),
            Full(Full),
        }
        Ok(
            match Raw::deserialize(d).map_err(|_| {
                serde::de::Error::custom(
                "`approval` is a list of tools, or `{ tools: [...], judge: MODEL, script: [...] }`",
            )
            })? {
                Raw::List(tools) => tools.into(),
                Raw::Full(f) => ApprovalSpec {
                    tools: f.tools,
                    judge: f.judge,
                    script: f.script,
                },
            },
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::AgentSpec;

    #[test]
    fn approval_takes_a_list_or_a_map_with_a_judge() {
        let list = AgentSpec::from_yaml(
            "name: a\nmodel: scripted\ntools: [add]\napproval: [add]\nscript: [{text: x}]\n",
        )
        .unwrap();
        assert_eq!(list.approval.tools, ["add"]);
        assert!(list.approval.judge.is_none());
        let map = AgentSpec::from_yaml(
            "name: a\nmodel: scripted\ntools: [add]\napproval: { tools: [add], judge: scripted, script: [{text: x}] }\nscript: [{text: x}]\n",
        )
        .unwrap();
        assert_eq!(map.approval.judge.as_deref(), Some("scripted"));
        assert!(map.needs_approval("add"));
        let bad = AgentSpec::from_yaml(
            "name: a\nmodel: scripted\ntools: [add]\napproval: { tools: [add], judge: scripted }\nscript: [{text: x}]\n",
        );
        assert!(bad.unwrap_err().to_string().contains("approval.judge"));
    }

    #[test]
    fn the_critic_judge_is_checked() {
        let ok = AgentSpec::from_yaml(
            "name: a\nmodel: scripted\nscript: [{text: x}]\ncritic: { policy: judge, model: scripted, script: [{text: x}] }\n",
        )
        .unwrap();
        let j = ok.critic.judge.unwrap();
        assert!(j.enabled());
        assert_eq!(
            (j.after_steps, j.every_steps, j.budget_tokens),
            (30, 10, 4000)
        );
        for (yaml, says) in [
            ("{ policy: judge }", "critic.model"),
            (
                "{ policy: judge, model: x, threshold: 2 }",
                "critic.threshold",
            ),
            (
                "{ policy: judge, model: scripted }",
                "critic.model: scripted",
            ),
            ("{ policy: judge, model: x, timeout: 0s }", "critic.timeout"),
            ("{ policy: judge, model: x, bogus: 1 }", "bogus"),
        ] {
            let text = format!("name: a\nmodel: scripted\nscript: [{{text: x}}]\ncritic: {yaml}\n");
            let e = AgentSpec::from_yaml(&text).unwrap_err().to_string();
            assert!(e.contains(says), "{yaml}: {e}");
        }
    }
}
