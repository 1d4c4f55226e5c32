//! The manifest's `critic:` section: how the critic watches the agent's
//! runs. One type ([`CriticSpec`]) for the whole section, so every key the
//! critic reads is parsed and checked here: the loop detectors' thresholds
//! ([`LoopsSpec`]) and, beside them, the model judge's keys
//! ([`JudgeSpec`], see `spec::judge`).
//!
//! ```yaml
//! critic:
//!   loops: { repeat: 3, same_observation: 4, same_error: 3, cycle: 3, poll: 5, no_progress: 8, chant: 10 }
//!   policy: judge          # and the judge's other keys: model, confirm_model, after_steps, …
//!   model: smart
//! ```
//!
//! Every key is optional (the defaults above); `0` turns a detector off;
//! an unknown key or a value out of its range is refused, naming the key.
//! `limits.repeat_limit` is the older spelling of `critic.loops.repeat`:
//! a manifest sets one or the other (both is refused), and
//! `critic.loops.repeat`, when set, wins over a `repeat_limit` from an
//! invocation or the host's defaults (see [`LoopsSpec::resolve`]).

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::{line_of, AgentSpec, JudgeSpec};
use crate::ports::critic::{Loops, CHANT_WINDOW_CHUNKS, LOOPS_DEFAULT, MAX_LOOP_COUNT, TRACE_LEN};

/// The manifest's `critic:` section: `loops` and the judge's keys, side by
/// side in one map.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CriticSpec {
    /// The loop detectors' thresholds (see [`LoopsSpec`]).
    #[serde(skip_serializing_if = "LoopsSpec::is_empty")]
    pub loops: LoopsSpec,
    /// The model judge, when the section has any of its keys (see
    /// [`JudgeSpec`]).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeSpec>,
}

impl CriticSpec {
    /// Whether the section sets nothing (it is then left out of JSON).
    pub fn is_empty(&self) -> bool {
        self.loops.is_empty() && self.judge.is_none()
    }
}

impl<'de> Deserialize<'de> for CriticSpec {
    /// `loops` is taken out of the map; what is left, if anything, is the
    /// judge's (whose own check refuses unknown keys).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut map = serde_norway::Mapping::deserialize(d)?;
        let loops = match map.remove("loops") {
            Some(v) => loops_or_off(v).map_err(de::Error::custom)?,
            None => LoopsSpec::default(),
        };
        let judge = if map.is_empty() {
            None
        } else {
            Some(
                JudgeSpec::deserialize(serde_norway::Value::Mapping(map))
                    .map_err(|e| de::Error::custom(format!("critic: {e}")))?,
            )
        };
        Ok(CriticSpec { loops, judge })
    }
}

/// `critic.loops`: each detector's threshold (`0`: off; unset: its
/// default, see [`LOOPS_DEFAULT`]). `loops: off` sets every key to 0 (an
/// agent that repeats itself on purpose).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopsSpec {
    /// Identical consecutive calls (tool and canonical arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    /// The same call with the same result, anywhere in the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_observation: Option<u32>,
    /// The same tool ending in the same normalised error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_error: Option<u32>,
    /// A cycle of period 2 to 4, repeated this many times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycle: Option<u32>,
    /// The same call answering the same (normalised) result, in a row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll: Option<u32>,
    /// Steps in a row with no new result and no new text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_progress: Option<u32>,
    /// The same chunk of model text, repeated in the recent text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chant: Option<u32>,
}

/// `loops:` as a map of keys, or the word `off`.
fn loops_or_off<'de, D: Deserializer<'de>>(d: D) -> Result<LoopsSpec, D::Error> {
    struct Either;
    impl<'de> Visitor<'de> for Either {
        type Value = LoopsSpec;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("`off` or a map of detector thresholds")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<LoopsSpec, E> {
            match v {
                "off" => Ok(LoopsSpec::off()),
                other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
            }
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<LoopsSpec, E> {
            // YAML 1.1 reads a bare `off` as false.
            match v {
                false => Ok(LoopsSpec::off()),
                true => Err(E::invalid_value(de::Unexpected::Bool(v), &self)),
            }
        }

        fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<LoopsSpec, A::Error> {
            LoopsSpec::deserialize(de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_any(Either)
}

impl LoopsSpec {
    /// Every detector off (`0` for every key): a replay, a workload that
    /// repeats itself on purpose.
    pub fn off() -> Self {
        LoopsSpec {
            repeat: Some(0),
            same_observation: Some(0),
            same_error: Some(0),
            cycle: Some(0),
            poll: Some(0),
            no_progress: Some(0),
            chant: Some(0),
        }
    }

    /// Whether no key is set.
    pub fn is_empty(&self) -> bool {
        *self == LoopsSpec::default()
    }

    /// The thresholds in force: the keys set here, the defaults for the
    /// others. `repeat_limit` (the run's resolved `limits.repeat_limit`)
    /// is the `repeat` threshold unless `repeat` is set here.
    pub fn resolve(&self, repeat_limit: u32) -> Loops {
        let d = LOOPS_DEFAULT;
        let v = |k: Option<u32>, default: u16| k.map_or(default, |n| n.min(MAX_LOOP_COUNT) as u16);
        Loops {
            repeat: v(Some(self.repeat.unwrap_or(repeat_limit)), d.repeat),
            same_observation: v(self.same_observation, d.same_observation),
            same_error: v(self.same_error, d.same_error),
            cycle: v(self.cycle, d.cycle),
            poll: v(self.poll, d.poll),
            no_progress: v(self.no_progress, d.no_progress),
            chant: v(self.chant, d.chant),
        }
    }

    /// Checks every key set against its range: `0` (off), or from its
    /// least meaningful count to the most the critic can see. `Err` names
    /// the key (`critic.loops.KEY`) and the range.
    ///
    /// | key | range |
    /// |---|---|
    /// | `repeat` | 0 – 10000 |
    /// | `same_observation`, `same_error` | 0, 2 – 32 (the trace's length) |
    /// | `cycle`, `poll`, `no_progress` | 0, 2 – 10000 |
    /// | `chant` | 0, 2 – 100 (the chunks of text it remembers) |
    pub fn check(&self) -> Result<(), String> {
        let window = TRACE_LEN as u32;
        let chunks = CHANT_WINDOW_CHUNKS as u32;
        for (key, v, lo, hi) in [
            ("repeat", self.repeat, 1, MAX_LOOP_COUNT),
            ("same_observation", self.same_observation, 2, window),
            ("same_error", self.same_error, 2, window),
            ("cycle", self.cycle, 2, MAX_LOOP_COUNT),
            ("poll", self.poll, 2, MAX_LOOP_COUNT),
            ("no_progress", self.no_progress, 2, MAX_LOOP_COUNT),
            ("chant", self.chant, 2, chunks),
        ] {
            match v {
                Some(n) if n != 0 && (n < lo || n > hi) => {
                    return Err(format!(
                        "`critic.loops.{key}` is {n}; use 0 (off) or {lo} to {hi}"
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl AgentSpec {
    /// Checks `critic:` (part of [`check`](Self::check)).
    pub(super) fn check_critic(&self, source: &str) -> Result<(), String> {
        let legacy = self.limits.repeat_limit.is_some()
            || self.phases.iter().any(|p| p.limits.repeat_limit.is_some());
        if self.critic.loops.repeat.is_some() && legacy {
            return Err(format!(
                "both `critic.loops.repeat` and `limits.repeat_limit` are set{}: `limits.repeat_limit` is the older spelling of `critic.loops.repeat`; keep one",
                line_of(source, "repeat_limit")
            ));
        }
        self.critic.loops.check().map_err(|e| {
            let key = e
                .split('`')
                .nth(1)
                .and_then(|k| k.rsplit('.').next())
                .unwrap_or("loops");
            // The line of the key, searched from the `critic` line.
            let from = source
                .lines()
                .position(|l| l.trim_start().starts_with("critic"))
                .unwrap_or(0);
            let line = source
                .lines()
                .skip(from)
                .position(|l| l.split('#').next().unwrap_or("").contains(key))
                .map(|i| format!(" at line {}", from + i + 1))
                .unwrap_or_default();
            format!("{e}{line}")
        })
    }
}
