//! Scheduled skills: a skills repository, read and checked, and the time
//! model of its schedules.
//!
//! A skills repository is a folder (usually a git repository) with an
//! `agentvisor.yaml` at its root — `skills:` (name → folder), `schedules:`,
//! `defaults:` — and a `SKILL.md` in each skill's folder: front matter,
//! then the prompt. This module reads and checks both
//! ([`SkillsRepo::open`]), turns a schedule into the agent run it fires
//! ([`SkillsRepo::plan`]: a manifest and an invocation, which the host
//! runs like any other, admission and all), reads a skill's answer
//! ([`parse_answer`]: memory and named outputs) and says when each
//! schedule fires next ([`ScheduleClock::next_fire`], with daylight
//! saving defined).
//!
//! What it must not do: run anything, read a clock, or touch the network.
//! Running a schedule's run is `crate::skill_run`'s (orchestration);
//! writing its memory back into git is `crate::writeback`'s (the `git`
//! feature); what a run owes its destinations is rendered here ([`SkillPublishPlan`],
//! `publish`) and delivered by the host's publisher;
//! the scheduler that fires schedules is `crate::schedules`'s.
//!
//! Errors name the file, the key and, where it can be found, the line.
//! Files: `manifest` (the keys of `agentvisor.yaml`), `repo` (reading and
//! checking a repository, planning a run), `skill` (`SKILL.md` and its
//! includes), `env` (the `<env>` message and secrets), `answer` (memory
//! and outputs), `cron` (expressions) and `clock` (time zones, daylight
//! saving, jitter).
//!
#![doc = include_str!("../../../docs/skills.md")]

use std::path::Path;

mod answer;
mod clock;
mod cron;
mod env;
mod manifest;
mod publish;
mod repo;
mod skill;

pub use answer::{parse_answer, SkillAnswer};
pub use clock::{jitter_offset, time_zone, ScheduleClock, UnknownTimeZone};
pub use cron::{Cron, CronError};
pub use env::{
    resolve_env, secret_variable, EnvValue, MissingSecret, ResolvedEnv, SECRET_PREFIX, SECRET_SHOWN,
};
pub use manifest::{
    BudgetCap, Destination, DestinationKind, Missed, Overlap, RepoManifest, ScheduleBudget,
    ScheduleSpec, When, Writeback, WritebackMode,
};
pub use publish::{
    destination_name, kind_name, render, scrub, SkillPublishPlan, DEFAULT_PUBLISH_TIMEOUT,
    SKILL_PUBLISH_RECIPE,
};
pub use repo::{
    schedule_caller, PlanError, Schedule, SkillRun, SkillsRepo, DEFAULT_MAX_TURNS, MANIFEST_FILE,
};
pub use skill::{FrontMatter, Skill, SkillWriteback};

/// The time types schedules speak (`jiff`'s).
pub use jiff::{tz::TimeZone, Timestamp};

/// A skills repository that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SkillError {
    /// A file could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A file is malformed, has an unknown key or a bad value.
    #[error("invalid {path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong (names the key, and the line when known).
        message: String,
    },
}

/// Reads a file of at most [`crate::spec::MAX_MANIFEST_BYTES`] as UTF-8.
pub(crate) fn read_capped(path: &Path) -> Result<String, SkillError> {
    let read_err = |e: std::io::Error| SkillError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let cap = crate::spec::MAX_MANIFEST_BYTES;
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, cap as u64 + 1), &mut bytes)
        .map_err(read_err)?;
    if bytes.len() > cap {
        return Err(SkillError::Invalid {
            path: path.display().to_string(),
            message: format!("the file is larger than {cap} bytes (1 MiB), the limit"),
        });
    }
    String::from_utf8(bytes)
        .map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// A YAML error's text, its line moved down by `shift` lines (front
/// matter starts below its file's first line).
pub(crate) fn shift_yaml_error(e: &serde_norway::Error, shift: usize) -> String {
    let text = e.to_string();
    match e.location() {
        Some(loc) if shift > 0 => text.replace(
            &format!("line {} column {}", loc.line(), loc.column()),
            &format!("line {} column {}", loc.line() + shift, loc.column()),
        ),
        _ => text,
    }
}

/// " at line N" for the first line at or after line index `from` (0-based)
/// whose text before any `#` holds `needle`; "" when none does.
pub(crate) fn line_in(source: &str, from: usize, needle: &str) -> String {
    line_index(source, from, needle)
        .map(|i| format!(" at line {}", i + 1))
        .unwrap_or_default()
}

/// The 0-based index of the line [`line_in`] finds.
pub(crate) fn line_index(source: &str, from: usize, needle: &str) -> Option<usize> {
    source
        .lines()
        .enumerate()
        .skip(from)
        .find(|(_, l)| l.split(" #").next().unwrap_or("").contains(needle))
        .map(|(i, _)| i)
}
