//! `wait`: the built-in tool that waits in place of the model, so an agent
//! never polls through model calls.
//!
//! ```text
//! wait { tool, args, until: { pointer, equals | changes | matches }, every: 5s, timeout: 10m }
//! wait { run_id, timeout: 10m }
//! ```
//!
//! The first form calls `tool` with `args` itself, every `every` (default
//! 5 s, at least 100 ms), without asking the model, and returns one
//! result: the first whose value at `pointer` (a JSON pointer into the
//! result parsed as JSON; a result that is not JSON is a string; default
//! `""`, the whole result) equals `equals`, differs from the first call's
//! (`changes: true`) or matches the regular expression `matches` (a string
//! as it is, any other value as its JSON text) — or, at `timeout` (default
//! 10 m, at most 1 h), the last one with `timed_out: true`. A call that
//! fails does not meet the condition and the wait goes on; a call that is
//! refused (a tool the run does not have, bad arguments, a guard's
//! denial) ends the wait with that error.
//!
//! The second form waits for a run to end — a child of the run, or any
//! run of the same caller — and returns its status, output and error.
//!
//! `wait` works through its run ([`Tool::uses_run`]): the tool it calls
//! is called as a direct call of the model's would be (the run's tool
//! list, argument validation, guards, `max_calls`; see
//! [`RunAccess::call_tool`]), and the run checks that call when it
//! dispatches the `wait` (an operator's approval, if the tool needs one,
//! covers the whole wait). While it waits it beats, so the run is not
//! stalled; the run's hard deadline still ends it (a wait never outlives
//! its run). The result is JSON:
//! `{"tool", "calls", "waited_ms", "timed_out", "result" | "error"}` or
//! `{"run_id", "status", "output", "error_kind", "error", "kill_reason",
//! "timed_out", "waited_ms"}`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use regex::{Regex, RegexBuilder};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::ports::duration::{format_duration, parse_duration};
use crate::ports::model::ToolSpec;
use crate::ports::run::RunId;
use crate::ports::tool::{RunAccess, Tool, ToolContext, ToolEffect, ToolError};

/// The tool's name.
pub const WAIT_TOOL: &str = "wait";

/// Time between calls when `every` is not given.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(5);

/// The shortest `every`.
pub const MIN_EVERY: Duration = Duration::from_millis(100);

/// How long a wait lasts when `timeout` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest `timeout` (the run's deadline may end a wait sooner).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The largest compiled size of a `matches` pattern.
const MAX_PATTERN_BYTES: usize = 1 << 20;

/// The `wait` tool (see the module doc).
#[derive(Debug, Clone)]
pub struct WaitTool {
    spec: ToolSpec,
}

impl WaitTool {
    /// The tool.
    pub fn new() -> Self {
        let duration = json!({"type": ["string", "number"]});
        WaitTool {
            spec: ToolSpec {
                name: WAIT_TOOL.to_string(),
                description: "Waits without spending model calls. Either calls `tool` with `args` every `every` (default 5s) until its result meets `until` ({pointer, equals | changes: true | matches}: the value at the JSON pointer in the result equals a value, changes from the first call's, or matches a regular expression), and returns that result, or the last one with timed_out: true after `timeout` (default 10m, at most 1h); or waits for the run `run_id` (a sub-agent's or another of your runs) to end and returns its result. Use it instead of calling a status tool again and again.".to_string(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "tool": {"type": "string", "description": "The tool to call on a timer (one of your tools)."},
                        "args": {"type": "object", "description": "Its arguments."},
                        "until": {
                            "type": "object",
                            "description": "When to stop: give `equals`, `changes` or `matches`.",
                            "properties": {
                                "pointer": {"type": "string", "description": "JSON pointer into the result (default: the whole result)."},
                                "equals": {"description": "Stop when the value equals this."},
                                "changes": {"type": "boolean", "description": "true: stop when the value differs from the first call's."},
                                "matches": {"type": "string", "description": "Stop when the value matches this regular expression."}
                            },
                            "additionalProperties": false
                        },
                        "every": {"description": "Time between calls: 5s (default), 500ms, 1m.", "type": duration["type"]},
                        "timeout": {"description": "Give up after this long: 10m (default), at most 1h.", "type": duration["type"]},
                        "run_id": {"type": "string", "description": "Instead of `tool`: the id of a run to wait for."}
                    },
                    "required": [],
                    "additionalProperties": false
                }),
            },
        }
    }
}

impl Default for WaitTool {
    fn default() -> Self {
        Self::new()
    }
}

/// The call a `wait` makes through its run, as its arguments name it
/// (`None` for a wait on a run, or arguments without a `tool`): what the
/// run checks when it dispatches the wait.
pub fn inner_call(args: &Value) -> Option<(&str, Option<&Value>)> {
    let tool = args.get("tool")?.as_str()?;
    Some((tool, args.get("args")))
}

/// When a wait on a tool stops.
#[derive(Debug)]
enum Condition {
    Equals(Value),
    Changes,
    Matches(Regex),
}

/// What a wait's arguments ask for.
#[derive(Debug)]
enum Plan {
    Tool {
        tool: String,
        args: Value,
        pointer: String,
        condition: Condition,
        every: Duration,
    },
    Run(RunId),
}

fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::InvalidArguments(message.into())
}

/// A duration argument: a string (`5s`, `500ms`) or a number of seconds.
fn duration_arg(args: &Value, key: &str, default: Duration) -> Result<Duration, ToolError> {
    let bad = |why: String| invalid(format!("`{key}`: {why}"));
    match args.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::String(s)) => parse_duration(s).map_err(bad),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(secs) if secs.is_finite() && (0.0..=1e9).contains(&secs) => {
                Ok(Duration::from_secs_f64(secs))
            }
            _ => Err(bad(format!("`{n}` is not a number of seconds"))),
        },
        Some(other) => Err(bad(format!("give a duration such as \"5s\", not {other}"))),
    }
}

impl Plan {
    fn parse(args: &Value) -> Result<(Plan, Duration), ToolError> {
        let timeout = duration_arg(args, "timeout", DEFAULT_TIMEOUT)?;
        if timeout.is_zero() || timeout > MAX_TIMEOUT {
            return Err(invalid(format!(
                "`timeout` must be more than 0 and at most {} (wait again for longer)",
                format_duration(MAX_TIMEOUT)
            )));
        }
        let tool = args.get("tool").and_then(Value::as_str);
        let run_id = args.get("run_id").and_then(Value::as_str);
        match (tool, run_id) {
            (Some(_), Some(_)) => Err(invalid("give `tool` or `run_id`, not both")),
            (None, None) => Err(invalid(
                "give `tool` (with `args` and `until`) to call a tool until its result meets a condition, or `run_id` to wait for a run",
            )),
            (None, Some(id)) => {
                for key in ["args", "until", "every"] {
                    if args.get(key).is_some() {
                        return Err(invalid(format!("`{key}` goes with `tool`, not `run_id`")));
                    }
                }
                let id = id
                    .trim()
                    .parse::<RunId>()
                    .map_err(|_| invalid(format!("`run_id` is not a run id: `{id}`")))?;
                Ok((Plan::Run(id), timeout))
            }
            (Some(tool), None) => {
                let until = args.get("until").ok_or_else(|| {
                    invalid("`until` is missing: say when to stop ({pointer, equals | changes: true | matches})")
                })?;
                let pointer = until
                    .get("pointer")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if !(pointer.is_empty() || pointer.starts_with('/')) {
                    return Err(invalid(format!(
                        "`until.pointer` must be a JSON pointer (`/status`, or \"\" for the whole result), not `{pointer}`"
                    )));
                }
                let equals = until.get("equals");
                let changes = until.get("changes").and_then(Value::as_bool);
                let matches = until.get("matches").and_then(Value::as_str);
                let condition = match (equals, changes, matches) {
                    (Some(v), None, None) => Condition::Equals(v.clone()),
                    (None, Some(true), None) => Condition::Changes,
                    (None, None, Some(p)) => Condition::Matches(
                        RegexBuilder::new(p)
                            .size_limit(MAX_PATTERN_BYTES)
                            .build()
                            .map_err(|e| invalid(format!("`until.matches`: {e}")))?,
                    ),
                    (None, Some(false), None) => {
                        return Err(invalid("`until.changes` must be true"));
                    }
                    _ => {
                        return Err(invalid(
                            "`until` needs exactly one of `equals`, `changes: true`, `matches`",
                        ));
                    }
                };
                let every = duration_arg(args, "every", DEFAULT_EVERY)?;
                if every < MIN_EVERY || every > MAX_TIMEOUT {
                    return Err(invalid(format!(
                        "`every` must be between {} and {}",
                        format_duration(MIN_EVERY),
                        format_duration(MAX_TIMEOUT)
                    )));
                }
                let args = args.get("args").cloned().unwrap_or_else(|| json!({}));
                Ok((
                    Plan::Tool {
                        tool: tool.to_string(),
                        args,
                        pointer,
                        condition,
                        every,
                    },
                    timeout,
                ))
            }
        }
    }
}

/// A result as the condition sees it: parsed as JSON (else a string), at
/// the pointer (`None`: the pointer finds nothing).
fn observe(text: &str, pointer: &str) -> Option<Value> {
    let value =
        serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.to_string()));
    value.pointer(pointer).cloned()
}

/// Whether what a call returned (`seen`) meets the condition; `first` is
/// what the first call that answered returned (for `changes`).
fn meets(condition: &Condition, seen: &Option<Value>, first: &Option<Value>) -> bool {
    match (condition, seen) {
        (Condition::Changes, _) => seen != first,
        (_, None) => false,
        (Condition::Equals(want), Some(v)) => v == want,
        (Condition::Matches(re), Some(Value::String(s))) => re.is_match(s),
        (Condition::Matches(re), Some(v)) => re.is_match(&v.to_string()),
    }
}

/// Sleeps `d`, beating every `beat_every` meanwhile; `false` when the
/// run was stopped first (the wait ends at once: it has nothing to clean
/// up).
async fn pause(ctx: &ToolContext, d: Duration, beat_every: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        let now = Instant::now();
        if now >= end {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(end.min(now + beat_every)) => ctx.beat(),
            _ = ctx.cancelled() => return false,
        }
    }
}

/// The error of a wait whose run was stopped.
fn stopped() -> ToolError {
    ToolError::Failed("the run was stopped while it waited".into())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Calls `tool` until its result meets the condition or time is up.
async fn poll(
    run: &Arc<dyn RunAccess>,
    ctx: &ToolContext,
    plan: Plan,
    timeout: Duration,
) -> Result<String, ToolError> {
    let Plan::Tool {
        tool,
        args,
        pointer,
        condition,
        every,
    } = plan
    else {
        return Err(invalid("`wait` on a run has no tool to call"));
    };
    let t0 = Instant::now();
    let end = t0 + timeout;
    let beat_every = run.beat_every().max(Duration::from_millis(10));
    let mut first: Option<Option<Value>> = None;
    let mut calls: u64 = 0;
    loop {
        let result = run.call_tool(&tool, args.clone()).await;
        calls += 1;
        ctx.beat();
        if let Err(e) = &result {
            if e.is_refusal() {
                return Err(e.clone());
            }
        }
        // A call that failed meets nothing; the first that answered is
        // what `changes` compares with.
        let met = match &result {
            Err(_) => false,
            Ok(text) => {
                let seen = observe(text, &pointer);
                match &first {
                    Some(base) => meets(&condition, &seen, base),
                    None => {
                        let met = !matches!(condition, Condition::Changes)
                            && meets(&condition, &seen, &None);
                        first = Some(seen);
                        met
                    }
                }
            }
        };
        let now = Instant::now();
        if met || now >= end {
            let mut report = json!({
                "tool": tool,
                "calls": calls,
                "waited_ms": millis(now.saturating_duration_since(t0)),
                "timed_out": !met,
            });
            match result {
                Ok(text) => {
                    report["result"] =
                        serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
                }
                Err(e) => report["error"] = Value::String(format!("{}: {e}", e.kind())),
            }
            return Ok(report.to_string());
        }
        if !pause(ctx, every.min(end - now), beat_every).await {
            return Err(stopped());
        }
    }
}

/// Waits for run `id` to end, or time to be up.
async fn wait_run(
    run: &Arc<dyn RunAccess>,
    ctx: &ToolContext,
    id: RunId,
    timeout: Duration,
) -> Result<String, ToolError> {
    let t0 = Instant::now();
    let beat_every = run.beat_every().max(Duration::from_millis(10));
    let ended = tokio::select! {
        r = run.run_result(id) => Some(r?),
        going_on = pause(ctx, timeout, beat_every) => match going_on {
            true => None,
            false => return Err(stopped()),
        },
    };
    let waited_ms = millis(t0.elapsed());
    let report = match ended {
        Some(r) => json!({
            "run_id": r.run_id,
            "status": r.status,
            "output": r.output,
            "error_kind": r.error_kind,
            "error": r.error,
            "kill_reason": r.kill_reason,
            "timed_out": false,
            "waited_ms": waited_ms,
        }),
        None => json!({
            "run_id": id,
            "status": "running",
            "timed_out": true,
            "waited_ms": waited_ms,
        }),
    };
    Ok(report.to_string())
}

#[async_trait]
impl Tool for WaitTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn uses_run(&self) -> bool {
        true
    }

    /// `read`: waiting touches nothing, and the call it makes goes through
    /// the run's own tools, where that tool's class applies.
    fn effect(&self) -> ToolEffect {
        ToolEffect::Read
    }

    fn call_through_run<'a>(&self, args: &'a Value) -> Option<(&'a str, Option<&'a Value>)> {
        inner_call(args)
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<String, ToolError> {
        let (plan, timeout) = Plan::parse(&args)?;
        let Some(run) = ctx.run().cloned() else {
            return Err(ToolError::Failed(
                "`wait` works only inside a run (it calls the run's tools)".into(),
            ));
        };
        match plan {
            Plan::Run(id) => wait_run(&run, &ctx, id, timeout).await,
            plan => poll(&run, &ctx, plan, timeout).await,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn plan(args: Value) -> Result<(Plan, Duration), String> {
        Plan::parse(&args).map_err(|e| e.to_string())
    }

    #[test]
    fn arguments_are_checked_before_anything_is_called() {
        let ok = plan(json!({"tool": "status", "until": {"pointer": "/state", "equals": "done"}}));
        let (p, timeout) = ok.unwrap();
        assert_eq!(timeout, DEFAULT_TIMEOUT);
        assert!(matches!(p, Plan::Tool { every, .. } if every == DEFAULT_EVERY));
        let (p, timeout) =
            plan(json!({"run_id": "0000000000000000000000000000002a", "timeout": 30})).unwrap();
        assert!(matches!(p, Plan::Run(RunId(42))));
        assert_eq!(timeout, Duration::from_secs(30));
        for (args, says) in [
            (json!({}), "give `tool`"),
            (json!({"tool": "a", "run_id": "1"}), "not both"),
            (json!({"tool": "a"}), "`until` is missing"),
            (json!({"tool": "a", "until": {}}), "exactly one"),
            (
                json!({"tool": "a", "until": {"equals": 1, "matches": "x"}}),
                "exactly one",
            ),
            (
                json!({"tool": "a", "until": {"changes": false}}),
                "must be true",
            ),
            (
                json!({"tool": "a", "until": {"matches": "("}}),
                "until.matches",
            ),
            (
                json!({"tool": "a", "until": {"pointer": "x", "equals": 1}}),
                "JSON pointer",
            ),
            (
                json!({"tool": "a", "until": {"changes": true}, "every": "10ms"}),
                "`every` must be",
            ),
            (
                json!({"tool": "a", "until": {"changes": true}, "timeout": "2h"}),
                "at most 60m",
            ),
            (
                json!({"tool": "a", "until": {"changes": true}, "timeout": "soon"}),
                "bad duration",
            ),
            (json!({"run_id": "xyz"}), "not a run id"),
            (
                json!({"run_id": "1", "until": {"changes": true}}),
                "goes with `tool`",
            ),
        ] {
            let e = plan(args.clone())
                .err()
                .unwrap_or_else(|| panic!("accepted {args}"));
            assert!(e.contains(says), "{args}: {e}");
        }
    }

    #[test]
    fn conditions_read_the_result_at_the_pointer() {
        let seen = observe(r#"{"state": "done", "n": 3}"#, "/state");
        assert_eq!(seen, Some(json!("done")));
        assert!(meets(&Condition::Equals(json!("done")), &seen, &None));
        assert!(!meets(&Condition::Equals(json!("run")), &seen, &None));
        let n = observe(r#"{"n": 42}"#, "/n");
        let re = Regex::new("^4").unwrap();
        assert!(meets(&Condition::Matches(re), &n, &None));
        // Not JSON: the whole text is a string.
        assert_eq!(observe("ready", ""), Some(json!("ready")));
        // A missing pointer sees nothing: no value equals or matches it.
        assert_eq!(observe("{}", "/state"), None);
        assert!(!meets(&Condition::Equals(Value::Null), &None, &None));
        let first = Some(json!(1));
        assert!(!meets(&Condition::Changes, &Some(json!(1)), &first));
        assert!(meets(&Condition::Changes, &Some(json!(2)), &first));
        assert!(meets(&Condition::Changes, &None, &first));
        assert!(!meets(&Condition::Changes, &None, &None));
    }

    #[tokio::test]
    async fn outside_a_run_it_says_so() {
        let e = WaitTool::new()
            .call(
                json!({"tool": "a", "until": {"changes": true}}),
                ToolContext::new(RunId(1), "c".into()),
            )
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("only inside a run"), "{e}");
    }
}
