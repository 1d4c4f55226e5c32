//! Durations as manifests write them (`500ms`, `2s`, `1m30s`, `1h`, or a
//! number of seconds): parsing, formatting, and the serde glue of every
//! `Duration` field, bounded by the 24 h a run may live.

use std::time::Duration;

use serde::Deserializer;

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
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

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
