//! The built-in tools: small, deterministic, and enough to drive every path
//! a run can take through a tool call — a result (`add`, `upper`, `echo`),
//! a slow call (`sleep`, on tokio's clock so paused-time tests control it)
//! — and `wait` (see [`super::wait`]), which works through the run that
//! calls it. Two more fail on purpose, an error (`fail`) and a panic
//! (`panic`): they are [`test_tools`], which a host offers only when asked
//! ([`ToolRegistry::with_test_tools`](super::ToolRegistry::with_test_tools),
//! `HostBuilder::test_tools`).
//!
//! Each schema is strict (`additionalProperties: false`), so the registry
//! refuses a malformed call before the tool runs. The tools still decode
//! their arguments without panicking, as any tool called directly must.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Number, Value};

use crate::ports::model::ToolSpec;
use crate::ports::tool::{Tool, ToolContext, ToolEffect, ToolError};

/// Every built-in tool, ready to register.
pub fn builtins() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(AddTool::new()),
        Arc::new(UpperTool::new()),
        Arc::new(EchoTool::new()),
        Arc::new(SleepTool::new()),
        Arc::new(super::wait::WaitTool::new()),
    ]
}

/// The tools that fail on purpose, `fail` and `panic`: for tests of the
/// paths a failing tool takes, registered only where a test asks for them.
pub fn test_tools() -> Vec<Arc<dyn Tool>> {
    vec![Arc::new(FailTool::new()), Arc::new(PanicTool::new())]
}

/// A spec with a strict object schema.
fn spec(name: &str, description: &str, properties: Value, required: &[&str]) -> ToolSpec {
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        parameters: json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        }),
    }
}

/// Decodes validated arguments into a tool's argument struct.
fn decode<T: DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError::InvalidArguments(e.to_string()))
}

/// Whole numbers of `f64` up to this magnitude are exact (2^53).
const MAX_EXACT_F64: f64 = 9_007_199_254_740_992.0;

/// `add` {a: number, b: number}: the sum as text. Integers print without a
/// decimal point (`5`, not `5.0`) and add exactly when both fit in `i64`.
#[derive(Debug, Clone)]
pub struct AddTool {
    spec: ToolSpec,
}

#[derive(Deserialize)]
struct AddArgs {
    a: Number,
    b: Number,
}

impl AddTool {
    /// The tool.
    pub fn new() -> Self {
        let number = json!({"type": "number"});
        AddTool {
            spec: spec(
                "add",
                "Adds two numbers and returns the sum.",
                json!({"a": number, "b": number}),
                &["a", "b"],
            ),
        }
    }
}

impl Default for AddTool {
    fn default() -> Self {
        Self::new()
    }
}

/// The text of `a + b`, exact for integers, `None` when not finite.
fn sum_text(a: &Number, b: &Number) -> Option<String> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        if let Some(sum) = x.checked_add(y) {
            return Some(sum.to_string());
        }
    }
    let sum = a.as_f64()? + b.as_f64()?;
    if !sum.is_finite() {
        return None;
    }
    if sum.fract() == 0.0 && sum.abs() <= MAX_EXACT_F64 {
        // Exact: the magnitude fits in 53 bits, so the cast is lossless.
        return Some((sum as i64).to_string());
    }
    // serde_json prints the shortest round-tripping form (`1.5`, `1e+300`).
    Number::from_f64(sum).map(|n| n.to_string())
}

#[async_trait]
impl Tool for AddTool {
    /// Pure (or a timer): its first poll answers at once.
    /// Computes (or sleeps, or fails) and touches nothing: `read`.
    fn effect(&self) -> ToolEffect {
        ToolEffect::Read
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let AddArgs { a, b } = decode(args)?;
        sum_text(&a, &b).ok_or_else(|| ToolError::Failed("the sum is not a finite number".into()))
    }
}

#[derive(Deserialize)]
struct TextArgs {
    text: String,
}

fn text_properties() -> Value {
    json!({"text": {"type": "string"}})
}

/// `upper` {text: string}: the text in upper case.
#[derive(Debug, Clone)]
pub struct UpperTool {
    spec: ToolSpec,
}

impl UpperTool {
    /// The tool.
    pub fn new() -> Self {
        UpperTool {
            spec: spec(
                "upper",
                "Returns the text converted to upper case.",
                text_properties(),
                &["text"],
            ),
        }
    }
}

impl Default for UpperTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Tool for UpperTool {
    /// Pure (or a timer): its first poll answers at once.
    /// Computes (or sleeps, or fails) and touches nothing: `read`.
    fn effect(&self) -> ToolEffect {
        ToolEffect::Read
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let TextArgs { text } = decode(args)?;
        Ok(text.to_uppercase())
    }
}

/// `echo` {text: string}: the text, unchanged.
#[derive(Debug, Clone)]
pub struct EchoTool {
    spec: ToolSpec,
}

impl EchoTool {
    /// The tool.
    pub fn new() -> Self {
        EchoTool {
            spec: spec(
                "echo",
                "Returns the text unchanged.",
                text_properties(),
                &["text"],
            ),
        }
    }
}

impl Default for EchoTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Tool for EchoTool {
    /// Pure (or a timer): its first poll answers at once.
    /// Computes (or sleeps, or fails) and touches nothing: `read`.
    fn effect(&self) -> ToolEffect {
        ToolEffect::Read
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let TextArgs { text } = decode(args)?;
        Ok(text)
    }
}

/// `sleep` {ms: integer >= 0}: waits on tokio's clock, then says so. The
/// tool timeout bounds it, however large `ms` is.
#[derive(Debug, Clone)]
pub struct SleepTool {
    spec: ToolSpec,
}

#[derive(Deserialize)]
struct SleepArgs {
    ms: Number,
}

impl SleepTool {
    /// The tool.
    pub fn new() -> Self {
        SleepTool {
            spec: spec(
                "sleep",
                "Waits the given number of milliseconds, then returns.",
                json!({"ms": {"type": "integer", "minimum": 0}}),
                &["ms"],
            ),
        }
    }
}

impl Default for SleepTool {
    fn default() -> Self {
        Self::new()
    }
}

/// A non-negative whole number of milliseconds (JSON Schema's `integer`
/// also admits `5.0`).
fn whole_ms(n: &Number) -> Option<u64> {
    if let Some(ms) = n.as_u64() {
        return Some(ms);
    }
    let f = n.as_f64()?;
    // Saturating cast; `f` is whole, non-negative and finite here.
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0).then_some(f as u64)
}

#[async_trait]
impl Tool for SleepTool {
    /// Pure (or a timer): its first poll answers at once.
    /// Computes (or sleeps, or fails) and touches nothing: `read`.
    fn effect(&self) -> ToolEffect {
        ToolEffect::Read
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let SleepArgs { ms } = decode(args)?;
        let ms = whole_ms(&ms).ok_or_else(|| {
            ToolError::InvalidArguments(format!("`ms` must be a whole number >= 0, got {ms}"))
        })?;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(format!("slept {ms} ms"))
    }
}

/// `fail` {reason?: string}: always fails, with the reason as its message.
#[derive(Debug, Clone)]
pub struct FailTool {
    spec: ToolSpec,
}

#[derive(Deserialize)]
struct FailArgs {
    reason: Option<String>,
}

impl FailTool {
    /// The tool.
    pub fn new() -> Self {
        FailTool {
            spec: spec(
                "fail",
                "Always fails, with the given reason.",
                json!({"reason": {"type": "string"}}),
                &[],
            ),
        }
    }
}

impl Default for FailTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Tool for FailTool {
    /// Pure (or a timer): its first poll answers at once.
    /// Computes (or sleeps, or fails) and touches nothing: `read`.
    fn effect(&self) -> ToolEffect {
        ToolEffect::Read
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let FailArgs { reason } = decode(args)?;
        Err(ToolError::Failed(
            reason.unwrap_or_else(|| "failed on purpose".to_string()),
        ))
    }
}

/// `panic` {message?: string}: panics, on purpose, to prove that a panicking
/// tool ends as an error result and not as a dead run.
#[derive(Debug, Clone)]
pub struct PanicTool {
    spec: ToolSpec,
}

#[derive(Deserialize)]
struct PanicArgs {
    message: Option<String>,
}

impl PanicTool {
    /// The tool.
    pub fn new() -> Self {
        PanicTool {
            spec: spec(
                "panic",
                "Panics with the given message (for testing failure handling).",
                json!({"message": {"type": "string"}}),
                &[],
            ),
        }
    }
}

impl Default for PanicTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Tool for PanicTool {
    /// Pure (or a timer): its first poll answers at once.
    /// Computes (or sleeps, or fails) and touches nothing: `read`.
    fn effect(&self) -> ToolEffect {
        ToolEffect::Read
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let PanicArgs { message } = decode(args)?;
        match message {
            Some(message) => panic!("{message}"),
            None => panic!("panic tool called"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::run::RunId;

    fn n(v: Value) -> Number {
        match v {
            Value::Number(n) => n,
            other => panic!("not a number: {other}"),
        }
    }

    fn sum(a: Value, b: Value) -> Option<String> {
        sum_text(&n(a), &n(b))
    }

    fn ctx() -> ToolContext {
        ToolContext::new(RunId::new(), "c".into())
    }

    #[test]
    fn sums_print_like_numbers() {
        assert_eq!(sum(json!(2), json!(3)).as_deref(), Some("5"));
        assert_eq!(sum(json!(0.5), json!(1)).as_deref(), Some("1.5"));
        assert_eq!(sum(json!(2.5), json!(2.5)).as_deref(), Some("5"));
        assert_eq!(sum(json!(-7), json!(2)).as_deref(), Some("-5"));
        assert_eq!(
            sum(json!(9_007_199_254_740_993_i64), json!(1)).as_deref(),
            Some("9007199254740994")
        );
        assert_eq!(sum(json!(1e300), json!(0)).as_deref(), Some("1e+300"));
        assert_eq!(sum(json!(1.7e308), json!(1.7e308)), None);
    }

    #[test]
    fn whole_ms_accepts_integers_and_whole_floats() {
        assert_eq!(whole_ms(&n(json!(5))), Some(5));
        assert_eq!(whole_ms(&n(json!(5.0))), Some(5));
        assert_eq!(whole_ms(&n(json!(5.5))), None);
        assert_eq!(whole_ms(&n(json!(-1))), None);
    }

    #[test]
    fn every_schema_is_a_strict_object() {
        for tool in builtins() {
            let p = &tool.spec().parameters;
            assert_eq!(p["type"], "object", "{}", tool.spec().name);
            assert_eq!(p["additionalProperties"], false);
            assert!(p["properties"].is_object() && p["required"].is_array());
            assert!(!tool.spec().description.is_empty());
        }
    }

    #[tokio::test]
    async fn tools_called_directly_refuse_bad_arguments() {
        let result = AddTool::new().call(json!({"a": "x"}), ctx()).await;
        assert!(matches!(result, Err(ToolError::InvalidArguments(_))));
        let result = FailTool::new().call(json!({}), ctx()).await;
        assert_eq!(result, Err(ToolError::Failed("failed on purpose".into())));
    }
}
