//! A run's limits: the resolved [`Limits`], the manifest's layer
//! ([`LimitsSpec`]), how layers resolve, and the ranges every key must stay
//! within (a value out of range is a [`LimitError`] naming the key).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::{duration_serde, format_duration, opt_duration_serde, MAX_DURATION};

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
    /// How long a tool call that needs approval (`approval:`) waits for an
    /// operator's decision before it is denied. The run's deadlines and
    /// stall timer are paused while it waits.
    #[serde(with = "duration_serde")]
    pub approval_timeout: Duration,
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
            approval_timeout: Some(self.approval_timeout),
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
            first_token_timeout,
            approval_timeout
        );
        spec
    }
}

/// Resolved [`Limits`] kept in a record as the manifest writes them
/// (every key set: [`Limits::to_spec`]), read back by resolving that layer
/// over no other: for `#[serde(with = "limits_as_spec")]` on an
/// `Option<Limits>`, so a record carries the one resolved form.
pub mod limits_as_spec {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Limits, LimitsSpec};

    /// Writes `Some` limits in manifest form.
    pub fn serialize<S: Serializer>(limits: &Option<Limits>, s: S) -> Result<S::Ok, S::Error> {
        limits.map(|l| l.to_spec()).serialize(s)
    }

    /// Reads limits written in manifest form (any keys set; the others
    /// take their defaults).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Limits>, D::Error> {
        let spec = Option::<LimitsSpec>::deserialize(d)?;
        Ok(spec.map(|s| s.resolve(&LimitsSpec::default())))
    }
}

/// How long a call that needs approval waits for a decision by default.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(3600);

/// The absolute failsafe: no run lives longer than this, extensions included.
pub const ABSOLUTE_DEADLINE: Duration = MAX_DURATION;

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
    /// See [`Limits::approval_timeout`] (default 1h).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub approval_timeout: Option<Duration>,
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
            approval_timeout: self.approval_timeout.or(lower.approval_timeout),
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
            approval_timeout: d(m.approval_timeout, DEFAULT_APPROVAL_TIMEOUT),
        }
    }

    /// Checks every key set here against its documented range (`docs/manifest.md`): `Err` names the key (`limits.KEY`) and says the
    /// range. Durations over 24 h are refused when parsed already.
    ///
    /// | key | range |
    /// |---|---|
    /// | `max_iterations` | 1 – 100000 |
    /// | `max_runtime`, `hard_timeout`, `stall_timeout`, `tool_timeout`, `approval_timeout` | more than 0, at most 24h |
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
            ("approval_timeout", self.approval_timeout, true),
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
