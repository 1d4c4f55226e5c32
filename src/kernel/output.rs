//! Structured output (M7): a manifest's `output_schema`, compiled once per
//! agent, and the check a final answer must pass.
//!
//! The schema goes to the model with every call (`response_format` on
//! OpenAI-compatible servers, an instruction on Anthropic). A final answer
//! must parse as JSON — a model's habit of wrapping it in a Markdown code
//! fence is forgiven — and validate against the schema. On a mismatch the
//! run asks once more with [`OutputSchema::repair_prompt`] (one repair
//! turn, recognised in the transcript by [`REPAIR_PREFIX`], so a resumed
//! run does not repair twice); a second mismatch ends the run
//! `error`/`invalid_output` with the answer kept as its output.
//!
//! This module owns the check, not the loop (that is the run actor's).

use std::sync::Arc;

use jsonschema::Validator;
use serde_json::Value;

use crate::dispatch::validate::{check_schema, compile_schema};
use crate::ports::model::{Message, Role};

/// How the repair turn's message starts.
pub const REPAIR_PREFIX: &str = "Your answer does not match the required JSON schema";

/// A compiled output schema.
pub struct OutputSchema {
    schema: Arc<Value>,
    validator: Result<Validator, String>,
}

impl std::fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputSchema")
            .field("schema", &self.schema)
            .finish()
    }
}

impl OutputSchema {
    /// Compiles `schema`. A schema that does not compile is kept, and every
    /// answer fails against it with the compiler's message (manifests are
    /// checked when parsed; this catches specs built in code).
    pub fn new(schema: Value) -> Self {
        let validator = compile_schema(&schema);
        OutputSchema {
            schema: Arc::new(schema),
            validator,
        }
    }

    /// The schema, as sent to the model.
    pub fn schema(&self) -> &Arc<Value> {
        &self.schema
    }

    /// Checks a final answer: `Err` says why it does not match.
    pub fn check(&self, answer: &str) -> Result<Value, String> {
        let validator = self
            .validator
            .as_ref()
            .map_err(|e| format!("the output schema does not compile: {e}"))?;
        let text = unfence(answer);
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("the answer is not JSON ({e})"))?;
        check_schema(validator, &value).map_err(|e| e.to_string())?;
        Ok(value)
    }

    /// The user message of the repair turn.
    pub fn repair_prompt(&self, why: &str) -> String {
        format!(
            "{REPAIR_PREFIX}: {why}. Answer again with only a JSON value that matches this schema:\n{}",
            self.schema
        )
    }

    /// Whether the transcript already holds the repair turn.
    pub fn repaired(transcript: &[Message]) -> bool {
        transcript
            .iter()
            .any(|m| m.role == Role::User && m.content.starts_with(REPAIR_PREFIX))
    }
}

/// The text inside a Markdown code fence (```json … ```), or the text.
fn unfence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return t;
    };
    match body.split_once('\n') {
        Some((lang, inner)) if !lang.contains('{') && !lang.contains('[') => inner.trim(),
        _ => body.trim(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_parse_unfence_and_validate() {
        let o = OutputSchema::new(json!({
            "type": "object",
            "properties": {"sum": {"type": "integer"}},
            "required": ["sum"]
        }));
        assert_eq!(o.check(r#"{"sum": 5}"#), Ok(json!({"sum": 5})));
        assert_eq!(o.check("```json\n{\"sum\": 5}\n```"), Ok(json!({"sum": 5})));
        let not_json = o.check("five").err().unwrap_or_default();
        assert!(not_json.contains("not JSON"), "{not_json}");
        let wrong = o.check(r#"{"sum": "5"}"#).err().unwrap_or_default();
        assert!(wrong.contains("sum"), "{wrong}");
        assert!(o.repair_prompt(&wrong).starts_with(REPAIR_PREFIX));
        let bad = OutputSchema::new(json!({"type": 12}));
        assert!(bad.check("{}").is_err());
    }
}
