//! Pipeline manifests: `phases:` ([`PhaseSpec`]), their templates and
//! their checks (the orchestration is `crate::pipeline`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{line_of, AgentSpec, ScriptEntry};
use crate::ports::limits::LimitsSpec;

/// One phase of a pipeline manifest (`phases:`): a run of its own, made
/// from the manifest with this phase's keys over it (see
/// [`AgentSpec::phase_manifest`]).
///
/// ```yaml
/// phases:
///   - name: outline
///     prompt: "Outline an essay on {{prompt}}"
///     model: fast            # a tier or model spec (default: the manifest's)
///     tools: [search]        # default: the manifest's tools
///     limits: { max_runtime: 30s }
///   - name: draft
///     prompt: "Write the essay from this outline: {{phases.outline.output}}"
///     optional: true         # a failure here does not stop the pipeline
/// ```
///
/// Templates: `{{prompt}}` is the invocation's prompt, `{{inputs.NAME}}` one
/// of its inputs, `{{phases.NAME.output}}` an earlier phase's output (empty
/// for an optional phase that failed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSpec {
    /// The phase's name (letters, digits, `-`, `_`; unique in the manifest).
    pub name: String,
    /// The phase's prompt template.
    pub prompt: String,
    /// Its system prompt (default: the manifest's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Its model: a tier (`fast`, `smart`) or a model spec. Default: the
    /// manifest's, or `scripted` for a phase with a `script` of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The tools it may call (default: the manifest's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Its limits, over the manifest's.
    #[serde(default)]
    pub limits: LimitsSpec,
    /// A failure of this phase does not stop the pipeline.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// The scripted model's responses for this phase (default: the
    /// manifest's script).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script: Vec<ScriptEntry>,
    /// A JSON Schema this phase's answer must follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
}

/// The `{{phases.NAME.output}}` placeholders a template names, in order.
pub fn phase_references(template: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        let inner = after[..end].trim();
        if let Some(name) = inner
            .strip_prefix("phases.")
            .and_then(|r| r.strip_suffix(".output"))
        {
            out.push(name);
        }
        rest = &after[end + 2..];
    }
    out
}

impl AgentSpec {
    /// The manifest a phase runs: this one with the phase's keys over it,
    /// named `MANIFEST.PHASE`, without phases or a prompt of its own.
    pub fn phase_manifest(&self, phase: &PhaseSpec) -> AgentSpec {
        let mut s = self.clone();
        s.name = format!("{}.{}", self.name, phase.name);
        s.phases = Vec::new();
        s.prompt = None;
        s.description = None;
        if let Some(system) = &phase.system {
            s.system = system.clone();
        }
        if let Some(tools) = &phase.tools {
            s.tools = tools.clone();
        }
        s.limits = phase.limits.over(&self.limits);
        if !phase.script.is_empty() {
            s.script = phase.script.clone();
        }
        s.model = match &phase.model {
            Some(m) => m.clone(),
            None if !phase.script.is_empty() => "scripted".into(),
            None => self.model.clone(),
        };
        s.output_schema = phase.output_schema.clone();
        s
    }

    /// Checks the `phases:` block: names, templates that name earlier
    /// phases only, and each phase's own manifest.
    pub(super) fn check_phases(&self, source: &str) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for p in &self.phases {
            let at = line_of(source, &format!("name: {}", p.name));
            let valid = !p.name.is_empty()
                && p.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !valid {
                return Err(format!(
                    "phase name `{}`{at} must be letters, digits, `-` or `_`",
                    p.name
                ));
            }
            if p.prompt.trim().is_empty() {
                return Err(format!(
                    "phase `{}`{at}: `prompt` must not be empty",
                    p.name
                ));
            }
            for r in phase_references(&p.prompt) {
                if !seen.contains(r) {
                    return Err(format!(
                        "phase `{}`{}: the prompt uses `{{{{phases.{r}.output}}}}`, but no earlier phase is named `{r}`",
                        p.name,
                        line_of(source, &format!("phases.{r}.output"))
                    ));
                }
            }
            if !seen.insert(p.name.as_str()) {
                return Err(format!("phase `{}`{at} is named twice", p.name));
            }
            self.phase_manifest(p)
                .check(source)
                .map_err(|e| format!("phase `{}`: {e}", p.name))?;
        }
        Ok(())
    }
}
