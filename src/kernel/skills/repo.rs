//! A skills repository, read and checked ([`SkillsRepo::open`]), and the
//! run a schedule fires ([`SkillsRepo::plan`]).
//!
//! Checks, each refused with the file, the key and its line: unknown keys
//! (the YAML parser's), a schedule without `name`, `skill` or `cron`, two
//! schedules of one name, a skill `skills:` does not list, a bad cron, an
//! unknown time zone, `name`/`skill`/`cron` under `defaults:`, a skill
//! folder or writeback path outside the repository, a destination without
//! the keys its type needs (or with another type's), a skill that needs an
//! MCP server its schedule does not start, and every check of an agent
//! manifest on the run the schedule builds (`model: scripted` needs a
//! `script`, limits in range, …).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::clock::{jitter_offset, time_zone, ScheduleClock};
use super::cron::Cron;
use super::env::{is_secret_name, resolve_env, EnvValue, MissingSecret, ResolvedEnv};
use super::manifest::{Destination, RepoManifest, ScheduleSpec};
use super::skill::Skill;
use super::{line_in, line_index, read_capped, SkillError};
use crate::ports::model::{Message, Role};
use crate::spec::mcp::McpSpec;
use crate::spec::{AgentSpec, BudgetSpec, Invocation};

/// The caller a schedule's runs are submitted as (`schedule:NAME`): its
/// budget is the schedule's (`budget.per_day`).
pub fn schedule_caller(name: &str) -> String {
    format!("schedule:{name}")
}

/// The manifest's file name at the repository's root.
pub const MANIFEST_FILE: &str = "agentvisor.yaml";

/// Model turns a run takes at most when neither its schedule nor its
/// skill says.
pub const DEFAULT_MAX_TURNS: u32 = 20;

/// The longest `publish_timeout` (an hour).
const MAX_PUBLISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// The longest `jitter` (a day).
const MAX_JITTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// A repository, read and checked.
#[derive(Debug, Clone)]
pub struct SkillsRepo {
    /// Its root (canonical).
    pub root: PathBuf,
    /// Its skills, by name.
    pub skills: BTreeMap<String, Skill>,
    /// Its schedules, in the manifest's order.
    pub schedules: Vec<Schedule>,
}

/// One schedule, its `defaults:` applied.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Its name.
    pub name: String,
    /// The skill it runs.
    pub skill: String,
    /// Its time zone's name.
    pub timezone: String,
    /// When it fires.
    pub clock: ScheduleClock,
    /// Every key, the defaults' included.
    pub settings: ScheduleSpec,
    /// The agent manifest of its runs (the prompt is the invocation's).
    pub spec: Arc<AgentSpec>,
}

impl Schedule {
    /// The first fire strictly after `after` (see [`ScheduleClock`]).
    pub fn next_fire(&self, after: jiff::Timestamp) -> Option<jiff::Timestamp> {
        self.clock.next_fire(after)
    }
}

/// The run a schedule fires, ready to submit.
#[derive(Debug, Clone)]
pub struct SkillRun {
    /// The schedule.
    pub schedule: String,
    /// The skill.
    pub skill: String,
    /// The agent manifest.
    pub spec: Arc<AgentSpec>,
    /// The request: the skill's prompt, the `<env>` system message.
    pub invocation: Invocation,
    /// The resolved environment (its secret values kept out of `Debug`).
    pub env: ResolvedEnv,
}

/// Why a schedule's run could not be built.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// No schedule of that name.
    #[error("no schedule `{name}` in the repository (known: {known})")]
    UnknownSchedule {
        /// The name asked for.
        name: String,
        /// The schedules there are.
        known: String,
    },
    /// A secret its `env` names is not set.
    #[error("schedule `{schedule}`: {source}")]
    MissingSecret {
        /// The schedule.
        schedule: String,
        /// Which secret.
        #[source]
        source: MissingSecret,
    },
}

impl PlanError {
    /// A short, stable kind (`unknown_schedule`, `missing_secret`).
    pub fn kind(&self) -> &'static str {
        match self {
            PlanError::UnknownSchedule { .. } => "unknown_schedule",
            PlanError::MissingSecret { .. } => "missing_secret",
        }
    }
}

/// What a check says about `agentvisor.yaml`.
struct Checker<'a> {
    source: &'a str,
    path: String,
}

impl Checker<'_> {
    fn err(&self, message: String) -> SkillError {
        SkillError::Invalid {
            path: self.path.clone(),
            message,
        }
    }

    /// " at line N" of `needle` at or after line index `from`.
    fn at(&self, from: usize, needle: &str) -> String {
        line_in(self.source, from, needle)
    }
}

impl SkillsRepo {
    /// Reads and checks the repository at `root` (see the module doc).
    pub fn open(root: impl AsRef<Path>) -> Result<SkillsRepo, SkillError> {
        let given = root.as_ref();
        let root = std::fs::canonicalize(given).map_err(|e| SkillError::Read {
            path: given.display().to_string(),
            reason: e.to_string(),
        })?;
        let file = root.join(MANIFEST_FILE);
        let shown = given.join(MANIFEST_FILE).display().to_string();
        let source = read_capped(&file).map_err(|e| match e {
            SkillError::Read { reason, .. } => SkillError::Read {
                path: shown.clone(),
                reason,
            },
            other => other,
        })?;
        let c = Checker {
            source: &source,
            path: shown,
        };
        crate::spec::check_manifest_shape(&source).map_err(|m| c.err(m))?;
        let manifest: RepoManifest = if source.trim().is_empty() {
            RepoManifest::default()
        } else {
            serde_norway::from_str(&source).map_err(|e| c.err(e.to_string()))?
        };
        let skills = read_skills(&manifest, &root, given, &c)?;
        let mut schedules = Vec::with_capacity(manifest.schedules.len());
        let defaults_at = line_index(&source, 0, "defaults:").unwrap_or(0);
        for key in ["name", "skill", "cron"] {
            let set = match key {
                "name" => manifest.defaults.name.is_some(),
                "skill" => manifest.defaults.skill.is_some(),
                _ => manifest.defaults.cron.is_some(),
            };
            if set {
                return Err(c.err(format!(
                    "`defaults.{key}`: each schedule names its own `{key}`{}",
                    c.at(defaults_at, &format!("{key}:"))
                )));
            }
        }
        check_settings(&manifest.defaults, "defaults", defaults_at, &root, &c)?;
        let mut names = BTreeSet::new();
        let schedules_at = line_index(&source, 0, "schedules:").unwrap_or(0);
        for (i, s) in manifest.schedules.iter().enumerate() {
            let schedule =
                check_schedule(s, i, schedules_at, &manifest.defaults, &skills, &root, &c)?;
            if !names.insert(schedule.name.clone()) {
                return Err(c.err(format!(
                    "two schedules are named `{}`{}",
                    schedule.name,
                    line_in(
                        &source,
                        schedule_line(&source, schedules_at, &schedule.name, i) + 1,
                        &schedule.name
                    )
                )));
            }
            schedules.push(schedule);
        }
        Ok(SkillsRepo {
            root,
            skills,
            schedules,
        })
    }

    /// The schedule named `name`.
    pub fn schedule(&self, name: &str) -> Option<&Schedule> {
        self.schedules.iter().find(|s| s.name == name)
    }

    /// The run schedule `name` fires: its manifest, and an invocation with
    /// the skill's prompt and the `<env>` system message; secrets read
    /// through `lookup` (`std::env::var` outside tests).
    pub fn plan(
        &self,
        name: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<SkillRun, PlanError> {
        let schedule = self
            .schedule(name)
            .ok_or_else(|| PlanError::UnknownSchedule {
                name: name.to_string(),
                known: self
                    .schedules
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let empty = BTreeMap::new();
        let env = resolve_env(schedule.settings.env.as_ref().unwrap_or(&empty), lookup).map_err(
            |source| PlanError::MissingSecret {
                schedule: name.to_string(),
                source,
            },
        )?;
        let prompt = self
            .skills
            .get(&schedule.skill)
            .map(|s| s.prompt.clone())
            .unwrap_or_default();
        let mut invocation = Invocation::prompt(prompt).caller(schedule_caller(name));
        if !env.message.is_empty() {
            invocation.history = vec![Message::text(Role::System, env.message.clone())];
        }
        Ok(SkillRun {
            schedule: name.to_string(),
            skill: schedule.skill.clone(),
            spec: schedule.spec.clone(),
            invocation,
            env,
        })
    }
}

/// The skills `skills:` lists, each read from its folder (inside `root`).
fn read_skills(
    manifest: &RepoManifest,
    root: &Path,
    given: &Path,
    c: &Checker<'_>,
) -> Result<BTreeMap<String, Skill>, SkillError> {
    let skills_at = line_index(c.source, 0, "skills:").unwrap_or(0);
    let mut out = BTreeMap::new();
    for (name, folder) in &manifest.skills {
        let at = || c.at(skills_at, &format!("{name}:"));
        if !is_name(name) {
            return Err(c.err(format!(
                "skill `{name}`: a name is 1-64 of A-Z, a-z, 0-9, `_`, `-`{}",
                at()
            )));
        }
        let rel = Path::new(folder);
        if rel.is_absolute() {
            return Err(c.err(format!(
                "skill `{name}`: `{folder}` is an absolute path; name a folder of the repository{}",
                at()
            )));
        }
        let dir = std::fs::canonicalize(root.join(rel)).map_err(|e| {
            c.err(format!(
                "skill `{name}`: cannot read its folder `{folder}`: {e}{}",
                at()
            ))
        })?;
        if !dir.starts_with(root) {
            return Err(c.err(format!(
                "skill `{name}`: `{folder}` is outside the repository{}",
                at()
            )));
        }
        let skill = Skill::read(name, &dir, root).map_err(|e| match e {
            // Name the file as the caller wrote the repository's path.
            SkillError::Invalid { message, .. } => SkillError::Invalid {
                path: given.join(folder).join("SKILL.md").display().to_string(),
                message,
            },
            other => other,
        })?;
        out.insert(name.clone(), skill);
    }
    Ok(out)
}

/// A schedule or skill name: 1-64 of A-Z, a-z, 0-9, `_`, `-`.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The line index where schedule `name` (the `index`th) is written.
fn schedule_line(source: &str, from: usize, name: &str, index: usize) -> usize {
    let quoted = [
        format!("name: {name}"),
        format!("name: \"{name}\""),
        format!("name: '{name}'"),
    ];
    let found = source.lines().enumerate().skip(from).find(|(_, l)| {
        let l = l.split(" #").next().unwrap_or("");
        quoted.iter().any(|q| {
            l.find(q.as_str()).is_some_and(|at| {
                let after = &l[at + q.len()..];
                !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            })
        })
    });
    match found {
        Some((i, _)) => i,
        // Unnamed: the `index`th list item after `schedules:`.
        None => source
            .lines()
            .enumerate()
            .skip(from)
            .filter(|(_, l)| l.trim_start().starts_with("- "))
            .nth(index)
            .map_or(from, |(i, _)| i),
    }
}

/// Checks one schedule and builds it over the defaults.
fn check_schedule(
    s: &ScheduleSpec,
    index: usize,
    schedules_at: usize,
    defaults: &ScheduleSpec,
    skills: &BTreeMap<String, Skill>,
    root: &Path,
    c: &Checker<'_>,
) -> Result<Schedule, SkillError> {
    let line = schedule_line(
        c.source,
        schedules_at,
        s.name.as_deref().unwrap_or(""),
        index,
    );
    let n = index + 1;
    let name = match &s.name {
        Some(name) if is_name(name) => name.clone(),
        Some(name) => {
            return Err(c.err(format!(
                "schedule `{name}`: a name is 1-64 of A-Z, a-z, 0-9, `_`, `-`{}",
                c.at(line, "name:")
            )))
        }
        None => {
            return Err(c.err(format!(
                "schedule {n} has no `name`{}",
                line_in(c.source, line, "")
            )))
        }
    };
    let who = format!("schedule `{name}`");
    let skill = match &s.skill {
        Some(k) if skills.contains_key(k) => k.clone(),
        Some(k) => {
            let known: Vec<&str> = skills.keys().map(String::as_str).collect();
            return Err(c.err(format!(
                "{who}: `skill` names `{k}`, which `skills:` does not list (known: {}){}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                },
                c.at(line, "skill:")
            )));
        }
        None => return Err(c.err(format!("{who} has no `skill`{}", c.at(line, "name:")))),
    };
    let cron_text = s
        .cron
        .as_deref()
        .ok_or_else(|| c.err(format!("{who} has no `cron`{}", c.at(line, "name:"))))?;
    let cron = Cron::parse(cron_text)
        .map_err(|e| c.err(format!("{who}: `cron`: {e}{}", c.at(line, "cron:"))))?;
    check_settings(s, &who, line, root, c)?;
    let settings = over(s, defaults);
    let timezone = settings.timezone.clone().unwrap_or_else(|| "UTC".into());
    let tz = time_zone(&timezone).map_err(|e| {
        let at = if s.timezone.is_some() {
            c.at(line, "timezone:")
        } else {
            c.at(
                line_index(c.source, 0, "defaults:").unwrap_or(0),
                "timezone:",
            )
        };
        c.err(format!("{who}: `timezone`: {e}{at}"))
    })?;
    let offset = jitter_offset(&name, settings.jitter.unwrap_or_default());
    let clock = ScheduleClock::new(cron, tz, offset);
    let skill_ref = &skills[&skill];
    let servers = settings.mcp_servers.clone().unwrap_or_default();
    for needed in &skill_ref.front.mcp_servers {
        if !servers.iter().any(|s| &s.name == needed) {
            return Err(c.err(format!(
                "{who}: skill `{skill}` needs the MCP server `{needed}`, which the schedule's `mcp_servers` does not start{}",
                c.at(line, "skill:")
            )));
        }
    }
    let spec = build_spec(&settings, skill_ref, servers);
    spec.check(c.source)
        .map_err(|m| c.err(format!("{who}: {m}")))?;
    Ok(Schedule {
        name,
        skill,
        timezone,
        clock,
        settings,
        spec: Arc::new(spec),
    })
}

/// The agent manifest of a schedule's runs.
fn build_spec(
    settings: &ScheduleSpec,
    skill: &Skill,
    servers: Vec<crate::spec::mcp::McpServerSpec>,
) -> AgentSpec {
    let script = settings.script.clone().unwrap_or_default();
    let model = settings
        .model
        .clone()
        .or_else(|| skill.front.model_hint.clone())
        .unwrap_or_else(|| {
            if script.is_empty() {
                String::new()
            } else {
                "scripted".into()
            }
        });
    let mut spec = AgentSpec::new(skill.name.clone(), model);
    spec.description = skill.front.description.clone();
    spec.script = script;
    spec.max_tokens = skill.front.max_tokens;
    spec.durable = settings.durable.unwrap_or(false);
    let mut limits = settings.limits.unwrap_or_default();
    limits.max_iterations = Some(
        settings
            .max_turns
            .or(skill.front.max_turns)
            .unwrap_or(DEFAULT_MAX_TURNS),
    );
    spec.limits = limits;
    spec.budget = settings
        .budget
        .and_then(|b| b.per_run)
        .and_then(|p| p.tokens)
        .map(|tokens| BudgetSpec {
            tokens: Some(tokens),
        });
    // A skill that names its servers gets only those.
    let servers: Vec<_> = if skill.front.mcp_servers.is_empty() {
        servers
    } else {
        servers
            .into_iter()
            .filter(|s| skill.front.mcp_servers.contains(&s.name))
            .collect()
    };
    if !servers.is_empty() {
        spec.mcp = Some(McpSpec { servers });
    }
    spec
}

/// `schedule` over `defaults`: keys set in the schedule win; `env` and
/// `limits` merge key by key.
fn over(schedule: &ScheduleSpec, defaults: &ScheduleSpec) -> ScheduleSpec {
    let s = schedule.clone();
    let d = defaults.clone();
    let env = match (s.env, d.env) {
        (Some(mine), Some(mut base)) => {
            base.extend(mine);
            Some(base)
        }
        (mine, base) => mine.or(base),
    };
    let limits = match (s.limits, d.limits) {
        (Some(mine), Some(base)) => Some(mine.over(&base)),
        (mine, base) => mine.or(base),
    };
    ScheduleSpec {
        name: s.name,
        skill: s.skill,
        cron: s.cron,
        timezone: s.timezone.or(d.timezone),
        model: s.model.or(d.model),
        script: s.script.or(d.script),
        env,
        mcp_servers: s.mcp_servers.or(d.mcp_servers),
        destinations: s.destinations.or(d.destinations),
        writeback: s.writeback.or(d.writeback),
        max_turns: s.max_turns.or(d.max_turns),
        limits,
        budget: s.budget.or(d.budget),
        overlap: s.overlap.or(d.overlap),
        missed: s.missed.or(d.missed),
        catch_up_window: s.catch_up_window.or(d.catch_up_window),
        max_catch_up: s.max_catch_up.or(d.max_catch_up),
        jitter: s.jitter.or(d.jitter),
        pause_after: s.pause_after.or(d.pause_after),
        publish_timeout: s.publish_timeout.or(d.publish_timeout),
        durable: s.durable.or(d.durable),
    }
}

/// The checks of the keys a schedule and the defaults share.
fn check_settings(
    s: &ScheduleSpec,
    who: &str,
    line: usize,
    root: &Path,
    c: &Checker<'_>,
) -> Result<(), SkillError> {
    let at = |key: &str| c.at(line, &format!("{key}:"));
    if let Some(tz) = &s.timezone {
        time_zone(tz).map_err(|e| c.err(format!("{who}: `timezone`: {e}{}", at("timezone"))))?;
    }
    let positive = [
        ("max_turns", s.max_turns),
        ("pause_after", s.pause_after),
        ("max_catch_up", s.max_catch_up),
    ];
    for (key, v) in positive {
        if v == Some(0) {
            return Err(c.err(format!("{who}: `{key}` must be at least 1{}", at(key))));
        }
    }
    if s.max_turns.is_some_and(|t| t > crate::spec::MAX_ITERATIONS) {
        return Err(c.err(format!(
            "{who}: `max_turns` must be at most {}{}",
            crate::spec::MAX_ITERATIONS,
            at("max_turns")
        )));
    }
    if s.publish_timeout
        .is_some_and(|t| t.is_zero() || t > MAX_PUBLISH_TIMEOUT)
    {
        return Err(c.err(format!(
            "{who}: `publish_timeout` must be more than 0 and at most 1h{}",
            at("publish_timeout")
        )));
    }
    if s.jitter.is_some_and(|j| j > MAX_JITTER) {
        return Err(c.err(format!(
            "{who}: `jitter` must be at most 24h{}",
            at("jitter")
        )));
    }
    if let Some(limits) = &s.limits {
        if limits.max_iterations.is_some() {
            return Err(c.err(format!(
                "{who}: `limits.max_iterations`: a schedule counts turns with `max_turns`{}",
                at("max_iterations")
            )));
        }
    }
    if let Some(b) = &s.budget {
        for (key, cap) in [("per_run", b.per_run), ("per_day", b.per_day)] {
            let Some(cap) = cap else { continue };
            if cap.tokens == Some(0) {
                return Err(c.err(format!(
                    "{who}: `budget.{key}.tokens` must be at least 1{}",
                    at(key)
                )));
            }
            if cap.cost.is_some_and(|x| !(x.is_finite() && x > 0.0)) {
                return Err(c.err(format!(
                    "{who}: `budget.{key}.cost` must be a number of dollars above 0{}",
                    at(key)
                )));
            }
        }
    }
    if let Some(env) = &s.env {
        for (key, value) in env {
            let valid = key
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(c.err(format!(
                    "{who}: `env` key `{key}`: use A-Z, a-z, 0-9, `_` (not starting with a digit){}",
                    c.at(line, key)
                )));
            }
            if let EnvValue::Secret { secret } = value {
                if !is_secret_name(secret) {
                    return Err(c.err(format!(
                        "{who}: `env.{key}`: secret name `{secret}`: use A-Z, a-z, 0-9, `_`{}",
                        c.at(line, key)
                    )));
                }
            }
        }
    }
    if let Some(servers) = &s.mcp_servers {
        McpSpec {
            servers: servers.clone(),
        }
        .check()
        .map_err(|m| c.err(format!("{who}: `mcp_servers`: {m}{}", at("mcp_servers"))))?;
    }
    if let Some(w) = &s.writeback {
        let why = confined_path(&w.path, root);
        if let Some(why) = why {
            return Err(c.err(format!(
                "{who}: `writeback.path` `{}`: {why}{}",
                w.path,
                at("path")
            )));
        }
    }
    for d in s.destinations.iter().flatten() {
        check_destination(d, who, line, c)?;
    }
    Ok(())
}

/// Why `path` (relative to the repository) is not a path inside it, or
/// `None` when it is. Checked on the text: the file may not exist yet.
fn confined_path(path: &str, _root: &Path) -> Option<&'static str> {
    let p = Path::new(path);
    if path.trim().is_empty() {
        return Some("empty");
    }
    if p.is_absolute() {
        return Some("an absolute path is refused: name a file relative to the repository");
    }
    let mut depth = 0i32;
    for part in p.components() {
        match part {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            _ => return Some("not a relative path"),
        }
        if depth < 0 {
            return Some("`..` climbs out of the repository");
        }
    }
    (depth == 0).then_some("names the repository itself, not a file")
}

fn check_destination(
    d: &Destination,
    who: &str,
    line: usize,
    c: &Checker<'_>,
) -> Result<(), SkillError> {
    let kind = serde_json::to_value(d.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let at = c.at(line, &format!("type: {kind}"));
    let (needs, may) = d.keys();
    let set = d.set_keys();
    for key in needs {
        if !set.contains(key) {
            return Err(c.err(format!("{who}: a `{kind}` destination needs `{key}`{at}")));
        }
    }
    for key in &set {
        if !may.contains(key) {
            return Err(c.err(format!(
                "{who}: a `{kind}` destination has no `{key}` (it takes: {}){}",
                if may.is_empty() {
                    "no key of its own".to_string()
                } else {
                    may.join(", ")
                },
                c.at(line, &format!("{key}:"))
            )));
        }
    }
    if let Some(name) = &d.output {
        if !is_name(name) {
            return Err(c.err(format!(
                "{who}: a destination's `output` `{name}`: use A-Z, a-z, 0-9, `_`, `-`{}",
                c.at(line, "output:")
            )));
        }
    }
    Ok(())
}
