//! Retention: which finished runs a store keeps ([`Retention`], written
//! `max_age=7d,max_runs=N,max_bytes=SIZE`), what pruning removed
//! ([`PruneReport`]), and the counts of pruned runs a store keeps so its
//! totals stay true ([`PrunedCount`]).
//!
//! Never pruned, whatever the policy: a run in flight (it has no terminal
//! record yet), a run with a checkpoint (a durable run, or one waiting for
//! an operator's approval).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::run::RunStatus;

/// Which finished runs a store keeps: the oldest (by finish time) go first
/// once any bound is passed. All `None`: everything is kept (default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Runs that finished longer ago than this are pruned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    /// At most this many finished runs are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<u64>,
    /// The store's bytes (a database file's pages in use) are kept under
    /// this, the oldest runs pruned until they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// Why a retention setting was refused (the message names the key and
/// what it expects).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RetentionError(String);

impl Retention {
    /// Whether it bounds anything.
    pub fn is_set(&self) -> bool {
        self.max_age.is_some() || self.max_runs.is_some() || self.max_bytes.is_some()
    }
}

impl FromStr for Retention {
    type Err = RetentionError;

    /// `max_age=7d,max_runs=100000,max_bytes=2GiB`: any of the keys, once
    /// each, comma-separated.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut r = Retention::default();
        if s.trim().is_empty() {
            return Err(RetentionError(
                "empty retention (use e.g. max_age=7d,max_runs=100000,max_bytes=2GiB)".into(),
            ));
        }
        for part in s.split(',') {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                RetentionError(format!(
                    "`{}` is not KEY=VALUE (keys: max_age, max_runs, max_bytes)",
                    part.trim()
                ))
            })?;
            let (key, value) = (key.trim(), value.trim());
            let twice = || RetentionError(format!("`{key}` is given twice"));
            match key {
                "max_age" => {
                    if r.max_age.replace(parse_age(value)?).is_some() {
                        return Err(twice());
                    }
                }
                "max_runs" => {
                    let n = value.parse::<u64>().map_err(|_| {
                        RetentionError(format!("max_runs: `{value}` is not a whole number of runs"))
                    })?;
                    if r.max_runs.replace(n).is_some() {
                        return Err(twice());
                    }
                }
                "max_bytes" => {
                    if r.max_bytes.replace(parse_size(value)?).is_some() {
                        return Err(twice());
                    }
                }
                other => {
                    return Err(RetentionError(format!(
                        "unknown key `{other}` (keys: max_age, max_runs, max_bytes)"
                    )))
                }
            }
        }
        Ok(r)
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(a) = self.max_age {
            parts.push(format!("max_age={}s", a.as_secs()));
        }
        if let Some(n) = self.max_runs {
            parts.push(format!("max_runs={n}"));
        }
        if let Some(b) = self.max_bytes {
            parts.push(format!("max_bytes={b}"));
        }
        f.write_str(&parts.join(","))
    }
}

/// An age: `7d`, `12h`, `30m`, `90s`, or combinations (`1d12h`).
pub fn parse_age(s: &str) -> Result<Duration, RetentionError> {
    let bad = || {
        RetentionError(format!(
            "max_age: `{s}` is not an age (use e.g. 7d, 12h, 30m)"
        ))
    };
    let t = s.trim();
    let mut total = Duration::ZERO;
    let mut rest = t;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let secs = match &rest[..unit] {
            "d" => 86_400,
            "h" => 3_600,
            "m" => 60,
            "s" | "" => 1,
            _ => return Err(bad()),
        };
        rest = &rest[unit..];
        total = n
            .checked_mul(secs)
            .and_then(|v| total.as_secs().checked_add(v))
            .map(Duration::from_secs)
            .ok_or_else(bad)?;
    }
    Ok(total)
}

/// A size in bytes: a number with a decimal (`kB`, `MB`, `GB`, `TB`) or
/// binary (`KiB`, `MiB`, `GiB`, `TiB`) unit, or none (bytes); `B` alone is
/// bytes. Units are case-insensitive but for the `i`.
pub fn parse_size(s: &str) -> Result<u64, RetentionError> {
    let bad = || {
        RetentionError(format!(
            "max_bytes: `{s}` is not a size (use e.g. 500MB, 2GiB, 1000000)"
        ))
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    if num.is_empty() {
        return Err(bad());
    }
    let value: f64 = num.parse().map_err(|_| bad())?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let bytes = (value * scale).round();
    if !bytes.is_finite() || !(1.0..=9.0e18).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Runs pruned from a store, one entry per agent and status: what the
/// store's totals add back, so counts of runs stay true after pruning.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedCount {
    /// The agent.
    pub agent: String,
    /// The status the runs ended with.
    pub status: RunStatus,
    /// How many runs.
    pub runs: u64,
    /// How many audit records they held.
    pub records: u64,
}

/// What one prune did (or, for a dry run, would do).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    /// Runs pruned.
    pub runs: u64,
    /// Their audit records.
    pub records: u64,
    /// By agent and status.
    pub by: Vec<PrunedCount>,
    /// The store's bytes before (a database file's pages in use; 0 when a
    /// store cannot tell).
    pub bytes_before: u64,
    /// The store's bytes after.
    pub bytes_after: u64,
    /// A dry run: nothing was removed.
    pub dry_run: bool,
    /// The policy still wants runs pruned (the pass stopped at its batch
    /// limit, or its bound cannot be reached: runs that are never pruned).
    pub more: bool,
}

impl PruneReport {
    /// Adds another report's counts (the bytes before stay this one's).
    pub fn merge(&mut self, other: &PruneReport) {
        self.runs += other.runs;
        self.records += other.records;
        for c in &other.by {
            match self
                .by
                .iter_mut()
                .find(|t| t.agent == c.agent && t.status == c.status)
            {
                Some(t) => {
                    t.runs += c.runs;
                    t.records += c.records;
                }
                None => self.by.push(c.clone()),
            }
        }
    }

    /// Adds one pruned run to the counts.
    pub fn add(&mut self, agent: &str, status: RunStatus, records: u64) {
        self.runs += 1;
        self.records += records;
        match self
            .by
            .iter_mut()
            .find(|c| c.agent == agent && c.status == status)
        {
            Some(c) => {
                c.runs += 1;
                c.records += records;
            }
            None => self.by.push(PrunedCount {
                agent: agent.to_string(),
                status,
                runs: 1,
                records,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_parses_every_key_and_refuses_what_is_not_one() {
        let r: Retention = "max_age=7d,max_runs=1000,max_bytes=2GiB"
            .parse()
            .unwrap_or_default();
        assert_eq!(r.max_age, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(r.max_runs, Some(1000));
        assert_eq!(r.max_bytes, Some(2 << 30));
        let r: Retention = " max_bytes = 500MB ".parse().unwrap_or_default();
        assert_eq!(r.max_bytes, Some(500_000_000));
        assert_eq!(
            parse_age("1d12h").ok(),
            Some(Duration::from_secs(36 * 3600))
        );
        assert_eq!(parse_size("1.5kB").ok(), Some(1500));
        assert_eq!(parse_size("3KiB").ok(), Some(3072));
        assert_eq!(parse_size("42").ok(), Some(42));
        for bad in [
            "",
            "max_age",
            "max_age=7x",
            "max_age=d",
            "max_runs=-1",
            "max_runs=ten",
            "max_bytes=2XB",
            "max_bytes=0",
            "max_bytes=GiB",
            "max_rows=3",
            "max_runs=1,max_runs=2",
        ] {
            assert!(bad.parse::<Retention>().is_err(), "{bad}");
        }
        let e = "max_bytes=lots"
            .parse::<Retention>()
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("max_bytes") && e.contains("lots")));
    }

    #[test]
    fn a_report_counts_by_agent_and_status() {
        let mut r = PruneReport::default();
        r.add("a", RunStatus::Ok, 5);
        r.add("a", RunStatus::Ok, 5);
        r.add("b", RunStatus::Error, 2);
        assert_eq!((r.runs, r.records, r.by.len()), (3, 12, 2));
        assert_eq!(r.by[0].runs, 2);
    }
}
