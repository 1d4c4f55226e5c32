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
    /// How long a streaming model call may wait for its first token (a
    /// queueing server) before the run is killed `stalled` with
    /// `error_kind` `first_token_timeout`; `None`: `stall_timeout`. While
    /// a call waits for its first token, this bound replaces the stall
    /// timeout.
    #[serde(with = "opt_duration_serde", skip_serializing_if = "Option::is_none")]
    pub first_token_timeout: Option<Duration>,
}

impl Limits {
    /// The first-token bound in force: `first_token_timeout`, else `stall_timeout`.
    pub fn first_token(&self) -> Duration {
        self.first_token_timeout.unwrap_or(self.stall_timeout)
    }

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
            first_token_timeout: self.first_token_timeout,
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
            context_window,
            first_token_timeout
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
    /// See [`Limits::first_token_timeout`] (default: `stall_timeout`).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub first_token_timeout: Option<Duration>,
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
            first_token_timeout: self.first_token_timeout.or(lower.first_token_timeout),
        }
    }

    /// Resolves this layer over `lower`, then fills what is still unset with
    /// the built-in defaults and the derived ones.
    pub fn resolve(&self, lower: &LimitsSpec) -> Limits {
        // Clamped to the documented ranges (see [`LimitsSpec::check`]), so
        // limits built in code rather than parsed never overflow a
        // deadline either.
        let m = self.over(lower);
        let d = |d: Option<Duration>, default: Duration| d.unwrap_or(default).min(MAX_DURATION);
        let max_runtime = d(m.max_runtime, Duration::from_secs(60));
        let hard = d(m.hard_timeout, max_runtime.saturating_mul(2));
        Limits {
            max_iterations: m.max_iterations.unwrap_or(12).min(MAX_ITERATIONS),
            max_runtime,
            soft_timeout: d(m.soft_timeout, max_runtime),
            hard_timeout: hard.min(ABSOLUTE_DEADLINE),
            stall_timeout: d(m.stall_timeout, Duration::from_secs(60)),
            extension: d(m.extension, max_runtime),
            max_extensions: m.max_extensions.unwrap_or(2).min(MAX_EXTENSIONS),
            repeat_limit: m.repeat_limit.unwrap_or(3).clamp(1, MAX_COUNT),
            tool_timeout: d(m.tool_timeout, Duration::from_secs(60)),
            max_tool_errors: m.max_tool_errors.unwrap_or(3).clamp(1, MAX_COUNT),
            max_tool_result_bytes: m
                .max_tool_result_bytes
                .unwrap_or(16 * 1024)
                .clamp(MIN_TOOL_RESULT_BYTES, MAX_TOOL_RESULT_BYTES),
            kill_grace: d(m.kill_grace, Duration::from_secs(5)),
            context_window: m.context_window.map(|w| w.min(MAX_CONTEXT_WINDOW)),
            first_token_timeout: m.first_token_timeout.map(|t| t.min(MAX_DURATION)),
        }
    }

    /// Checks every key set here against its documented range (the README's
    /// manifest section): `Err` names the key (`limits.KEY`) and says the
    /// range. Durations over 24 h are refused when parsed already.
    ///
    /// | key | range |
    /// |---|---|
    /// | `max_iterations` | 1 – 100000 |
    /// | `max_runtime`, `hard_timeout`, `stall_timeout`, `tool_timeout` | more than 0, at most 24h |
    /// | `soft_timeout`, `extension`, `kill_grace` | 0 – 24h |
    /// | `max_extensions` | 0 – 1000 |
    /// | `repeat_limit`, `max_tool_errors` | 1 – 10000 |
    /// | `max_tool_result_bytes` | 256 – 16777216 |
    /// | `context_window` | 0 – 100000000 |
    pub fn check(&self) -> Result<(), LimitError> {
        fn range<T: PartialOrd + std::fmt::Display + Copy>(
            key: &'static str,
            v: Option<T>,
            lo: T,
            hi: T,
        ) -> Result<(), LimitError> {
            match v {
                Some(v) if v < lo || v > hi => Err(LimitError {
                    key,
                    message: format!("`limits.{key}` is {v}; use {lo} to {hi}"),
                }),
                _ => Ok(()),
            }
        }
        range("max_iterations", self.max_iterations, 1, MAX_ITERATIONS)?;
        range("max_extensions", self.max_extensions, 0, MAX_EXTENSIONS)?;
        range("repeat_limit", self.repeat_limit, 1, MAX_COUNT)?;
        range("max_tool_errors", self.max_tool_errors, 1, MAX_COUNT)?;
        range(
            "max_tool_result_bytes",
            self.max_tool_result_bytes,
            MIN_TOOL_RESULT_BYTES,
            MAX_TOOL_RESULT_BYTES,
        )?;
        range("context_window", self.context_window, 0, MAX_CONTEXT_WINDOW)?;
        for (key, d, positive) in [
            ("max_runtime", self.max_runtime, true),
            ("hard_timeout", self.hard_timeout, true),
            ("stall_timeout", self.stall_timeout, true),
            ("tool_timeout", self.tool_timeout, true),
            ("soft_timeout", self.soft_timeout, false),
            ("extension", self.extension, false),
            ("kill_grace", self.kill_grace, false),
        ] {
            let Some(d) = d else { continue };
            if positive && d.is_zero() {
                return Err(LimitError {
                    key,
                    message: format!("`limits.{key}` must be more than 0"),
                });
            }
            if d > MAX_DURATION {
                return Err(LimitError {
                    key,
                    message: format!("`limits.{key}` is {}; use at most 24h", format_duration(d)),
                });
            }
        }
        Ok(())
    }
}

/// A limit outside its documented range (see [`LimitsSpec::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LimitError {
    /// The key, without the `limits.` prefix.
    pub key: &'static str,
    /// What is wrong, naming the key and its range.
    pub message: String,
}

/// The most model calls a run may be given.
pub const MAX_ITERATIONS: u32 = 100_000;
/// The most extensions a run may be given.
pub const MAX_EXTENSIONS: u32 = 1000;
/// The highest `repeat_limit` and `max_tool_errors`.
pub const MAX_COUNT: u32 = 10_000;
/// The smallest tool-result cap.
pub const MIN_TOOL_RESULT_BYTES: u32 = 256;
/// The largest tool-result cap (16 MiB).
pub const MAX_TOOL_RESULT_BYTES: u32 = 16 * 1024 * 1024;
/// The largest context window a manifest may state, in tokens.
pub const MAX_CONTEXT_WINDOW: u64 = 100_000_000;
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

/// A palette entry as a manifest writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SubAgentRef {
    /// The manifest's path.
    File(String),
    /// The path, and what the tool tells the model.
    Described {
        /// The manifest's path.
        file: String,
        /// The tool's description (default: the child manifest's).
        #[serde(default)]
        description: Option<String>,
    },
}

impl SubAgentRef {
    fn file(&self) -> &str {
        match self {
            SubAgentRef::File(f) | SubAgentRef::Described { file: f, .. } => f,
        }
    }

    fn description(&self) -> Option<&str> {
        match self {
            SubAgentRef::File(_) => None,
            SubAgentRef::Described { description, .. } => description.as_deref(),
        }
    }
}

/// A sub-agent, read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubAgent {
    /// Its name in the palette (the tool is `agent__NAME`).
    pub name: String,
    /// What the tool tells the model.
    pub description: String,
    /// Its manifest.
    pub spec: Arc<AgentSpec>,
}

/// How deep manifests may name sub-agents' manifests when they are read.
const MAX_PALETTE_NESTING: usize = 8;

impl AgentSpec {
    /// Reads the manifests this one names under `agents:`, relative to
    /// `dir`; `stack` holds the files being read (a manifest that names
    /// itself, directly or not, is refused).
    fn read_sub_agents(
        &mut self,
        dir: &Path,
        stack: &mut Vec<std::path::PathBuf>,
        path: Option<&str>,
    ) -> Result<(), SpecError> {
        let invalid = |message: String| SpecError::Invalid {
            path: path.map(str::to_string),
            message,
        };
        let mut read = Vec::with_capacity(self.agents.len());
        for (name, entry) in &self.agents {
            if name.is_empty()
                || name.len() > 57
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(invalid(format!(
                    "agents: `{name}` is not a usable sub-agent name (1-57 of A-Z a-z 0-9 _ -)"
                )));
            }
            let file = dir.join(entry.file());
            let canonical = std::fs::canonicalize(&file).map_err(|e| {
                invalid(format!(
                    "agents.{name}: cannot read sub-agent manifest {}: {e}",
                    file.display()
                ))
            })?;
            if stack.contains(&canonical) {
                return Err(invalid(format!(
                    "agents.{name}: {} names a manifest that is already being read (an agent cannot delegate to itself)",
                    file.display()
                )));
            }
            if stack.len() >= MAX_PALETTE_NESTING {
                return Err(invalid(format!(
                    "agents.{name}: sub-agent manifests nest more than {MAX_PALETTE_NESTING} deep"
                )));
            }
            stack.push(canonical);
            let child = Self::from_file_in(&file, stack);
            stack.pop();
            let child = child.map_err(|e| {
                invalid(format!(
                    "agents.{name}: the sub-agent's manifest is not usable: {e}"
                ))
            })?;
            let description = entry
                .description()
                .map(str::to_string)
                .or_else(|| child.description.clone())
                .unwrap_or_else(|| {
                    format!(
                        "Delegates a task to the `{}` agent and returns its answer.",
                        child.name
                    )
                });
            read.push(SubAgent {
                name: name.clone(),
                description,
                spec: Arc::new(child),
            });
        }
        self.sub_agents = read;
        Ok(())
    }

    fn from_file_in(path: &Path, stack: &mut Vec<std::path::PathBuf>) -> Result<Self, SpecError> {
        let mut spec = Self::read_file(path)?;
        if !spec.agents.is_empty() {
            let dir = path.parent().unwrap_or(Path::new("."));
            let shown = path.display().to_string();
            spec.read_sub_agents(dir, stack, Some(&shown))?;
        }
        Ok(spec)
    }

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
    fn check_phases(&self, source: &str) -> Result<(), String> {
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
    fn inputs_fill_the_template() {
        let mut inputs = BTreeMap::new();
        inputs.insert("city".to_string(), Value::String("Oslo".into()));
        inputs.insert("days".to_string(), serde_json::json!(3));
        inputs.insert(
            "opts".to_string(),
            serde_json::json!({"b": [1, 2], "a": null}),
        );
        let filled = fill_inputs(
            "prompt",
            "{{inputs.city}} for {{ inputs.days }} days {{inputs.opts}}; {{other}} {{ and {{inputs.city}}",
            &inputs,
        );
        assert_eq!(
            filled.as_deref().ok(),
            Some(r#"Oslo for 3 days {"a":null,"b":[1,2]}; {{other}} {{ and Oslo"#)
        );
        let missing = fill_inputs("system", "x {{inputs.nope}}", &inputs);
        assert_eq!(
            missing.err().map(|e| e.to_string()).unwrap_or_default(),
            "the manifest's `system` uses `{{inputs.nope}}`, but the invocation has no input `nope`"
        );
        assert!(matches!(
            fill_inputs("prompt", "plain", &inputs),
            Ok(std::borrow::Cow::Borrowed("plain"))
        ));
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
