//! A schedule's destinations as a [`PublishPlan`]: what a run of it owes
//! once it ends, one [`PublishIntent`] per destination, rendered from the
//! run's answer.
//!
//! - `when`: `always`, `on_success` (the default: the run ended `ok`) or
//!   `on_failure`; a destination whose `when` does not hold is recorded
//!   `skipped` (skipped is not failed), as is one whose `output: x` the
//!   answer does not hold.
//! - The text: the named output `output: x`, else the answer without its
//!   memory and output blocks; for a run that did not end `ok`, the
//!   answer it has, else `run STATUS: ERROR`.
//! - `template` (default `{{output}}`) fills `{{output}}`, `{{run_id}}`,
//!   `{{run_date}}` (the run's end, `YYYY-MM-DD` in the schedule's time
//!   zone), `{{schedule}}` and `{{skill}}`; so does a `github-issue`'s or
//!   an `email`'s `title`.
//! - The target is the destination's keys as declared: `{ secret: NAME }`
//!   stays a reference, read when it is delivered; a `file`'s `path` is
//!   made absolute (relative to the repository). People see it redacted
//!   ([`PublishIntent::shown`]).
//!
//! Called on the run's critic shard when the run ends: it reads the
//! answer once and renders a few strings, nothing more.
//!
//! A plan has a recipe ([`PublishPlan::recipe`], kind
//! [`SKILL_PUBLISH_RECIPE`]): the schedule and skill, the time zone's
//! name, the repository's root, the destinations as declared and the
//! timeout — and its secrets by name only. A durable run keeps it in its
//! checkpoint, and the host that resumes the run after a crash makes the
//! plan again ([`SkillPublishPlan::from_recipe`]), reading the secrets'
//! values from the environment there (only to keep them out of what is
//! published), so the run's terminal record carries its intents.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::answer::parse_answer;
use super::env::EnvValue;
use super::manifest::{Destination, DestinationKind, When};
use crate::ports::outbox::{PublishIntent, PublishPlan, PublishRecipe};
use crate::ports::run::{RunResult, RunStatus};

/// The default time a destination's delivery may take, all tries.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// A schedule's destinations, ready to render a run's intents.
#[derive(Clone)]
pub struct SkillPublishPlan {
    /// The schedule.
    pub schedule: String,
    /// The skill.
    pub skill: String,
    /// The schedule's time zone (for `{{run_date}}`).
    pub time_zone: jiff::tz::TimeZone,
    /// The repository's root (a relative `file` path is under it).
    pub root: PathBuf,
    /// The destinations, in order.
    pub destinations: Vec<Destination>,
    /// Each delivery's timeout, all tries together.
    pub timeout: Duration,
    /// This run's secret values, replaced in the answer before it is read.
    pub secrets: Vec<String>,
    /// The names of the secrets its schedule's `env` reads (its recipe
    /// keeps these, never the values).
    pub secret_names: Vec<String>,
}

/// The kind of a skill plan's [`PublishRecipe`].
pub const SKILL_PUBLISH_RECIPE: &str = "skill";

/// A skill plan's recipe: everything but the secrets' values.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Recipe {
    schedule: String,
    skill: String,
    time_zone: String,
    root: PathBuf,
    destinations: Vec<Destination>,
    timeout_ms: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    secrets: Vec<String>,
}

impl std::fmt::Debug for SkillPublishPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkillPublishPlan")
            .field("schedule", &self.schedule)
            .field("destinations", &self.destinations.len())
            .finish()
    }
}

/// A destination's kind as written (`github-issue`).
pub fn kind_name(kind: DestinationKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A destination's name in results: its `name`, else its kind.
pub fn destination_name(d: &Destination) -> String {
    d.name.clone().unwrap_or_else(|| kind_name(d.kind))
}

/// `text` with every secret the process knows, and `secrets` (whatever
/// their length), replaced by `[REDACTED]`.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = crate::secrets::redact(text).into_owned();
    for s in secrets {
        if !s.is_empty() && out.contains(s.as_str()) {
            out = out.replace(s.as_str(), crate::secrets::REDACTED);
        }
    }
    out
}

/// Fills `{{output}}`, `{{run_id}}`, `{{run_date}}`, `{{schedule}}`,
/// `{{skill}}` (spaces inside the braces allowed); other text stays.
pub fn render(template: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        match after.find("}}") {
            Some(close) => {
                let name = after[..close].trim();
                match vars.iter().find(|(k, _)| *k == name) {
                    Some((_, v)) => out.push_str(v),
                    None => out.push_str(&rest[open..open + 2 + close + 2]),
                }
                rest = &after[close + 2..];
            }
            None => {
                out.push_str(&rest[open..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// How people see a destination's target.
fn shown(d: &Destination, path: Option<&Path>) -> String {
    let url = |v: &Option<EnvValue>| match v {
        Some(EnvValue::Text(u)) => crate::publishers::shown_url(u),
        Some(EnvValue::Secret { secret }) => format!("[secret {secret}]"),
        None => String::new(),
    };
    match d.kind {
        DestinationKind::Stdout => "stdout".into(),
        DestinationKind::File => path.map(|p| p.display().to_string()).unwrap_or_default(),
        DestinationKind::Webhook | DestinationKind::Slack | DestinationKind::Discord => url(&d.url),
        DestinationKind::GithubIssue => format!(
            "{} {}",
            d.base_url
                .as_deref()
                .map(crate::publishers::shown_url)
                .unwrap_or_else(|| "https://api.github.com".into()),
            d.repo.as_deref().unwrap_or("")
        ),
        DestinationKind::Email => format!(
            "smtp {} → {} recipient(s)",
            d.host.as_deref().unwrap_or(""),
            d.to.as_ref().map_or(0, Vec::len)
        ),
    }
}

impl SkillPublishPlan {
    /// The `{{run_date}}` of a run that ended at `ms`.
    fn run_date(&self, ms: u64) -> String {
        jiff::Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(i64::MAX))
            .map(|t| {
                t.to_zoned_datetime(self.time_zone.clone())
                    .date()
                    .to_string()
            })
            .unwrap_or_default()
    }

    /// One destination's intent.
    fn intent(
        &self,
        index: usize,
        d: &Destination,
        result: &RunResult,
        answer: &super::SkillAnswer,
        run_date: &str,
    ) -> PublishIntent {
        let ok = result.status == RunStatus::Ok;
        let name = destination_name(d);
        let mut skipped = match (d.when, ok) {
            (When::Always, _) | (When::OnSuccess, true) | (When::OnFailure, false) => None,
            (When::OnSuccess, false) => Some(format!(
                "`when: on_success`, and the run ended {}",
                result.status
            )),
            (When::OnFailure, true) => Some("`when: on_failure`, and the run ended ok".into()),
        };
        let text = match &d.output {
            Some(key) => match answer.outputs.get(key) {
                Some(t) => t.clone(),
                None => {
                    skipped.get_or_insert_with(|| format!("the answer has no output `{key}`"));
                    String::new()
                }
            },
            None if !answer.output.is_empty() || ok => answer.output.clone(),
            None => format!(
                "run {}: {}",
                result.status,
                scrub(result.error.as_deref().unwrap_or(""), &self.secrets)
            ),
        };
        let run_id = result.run_id.to_string();
        let vars = [
            ("output", text.as_str()),
            ("run_id", run_id.as_str()),
            ("run_date", run_date),
            ("schedule", self.schedule.as_str()),
            ("skill", self.skill.as_str()),
        ];
        let body = render(d.template.as_deref().unwrap_or("{{output}}"), &vars);
        let path = d.path.as_ref().map(|p| {
            let p = Path::new(p);
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                self.root.join(p)
            }
        });
        let mut target = match serde_json::to_value(d) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        for common in ["type", "name", "output", "when", "template"] {
            target.remove(common);
        }
        if let Some(p) = &path {
            target.insert("path".into(), Value::String(p.display().to_string()));
        }
        if let Some(title) = &d.title {
            target.insert("title".into(), Value::String(render(title, &vars)));
        }
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        PublishIntent {
            key: PublishIntent::key_of(result.run_id, index, &name),
            run_id: result.run_id,
            index,
            name,
            kind: kind_name(d.kind),
            target: Value::Object(target),
            shown: shown(d, path.as_deref()),
            body,
            skipped,
            schedule: self.schedule.clone(),
            skill: self.skill.clone(),
            timeout_ms: self.timeout.as_millis() as u64,
            at_ms: result.finished_at,
        }
    }
}

impl SkillPublishPlan {
    /// The plan a [`PublishPlan::recipe`] of [`SKILL_PUBLISH_RECIPE`]
    /// describes, its secrets' values read through `lookup`
    /// (`std::env::var` outside tests) and registered for redaction; a
    /// secret not set here is left out (it only keeps a value out of what
    /// is published, and the model never saw one). `Err` says why the
    /// recipe is not one.
    pub fn from_recipe(
        recipe: &PublishRecipe,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<SkillPublishPlan, String> {
        if recipe.kind != SKILL_PUBLISH_RECIPE {
            return Err(format!("a `{}` recipe is no skill's", recipe.kind));
        }
        let r: Recipe = serde_json::from_value(recipe.data.clone())
            .map_err(|e| format!("the skill's publish recipe does not read: {e}"))?;
        let time_zone = super::clock::time_zone(&r.time_zone).map_err(|e| e.to_string())?;
        let secrets = r
            .secrets
            .iter()
            .filter_map(|name| {
                let variable = super::env::secret_variable(name);
                let value = lookup(&variable)?;
                crate::secrets::register_from(&variable, &value);
                Some(value)
            })
            .collect();
        Ok(SkillPublishPlan {
            schedule: r.schedule,
            skill: r.skill,
            time_zone,
            root: r.root,
            destinations: r.destinations,
            timeout: Duration::from_millis(r.timeout_ms),
            secrets,
            secret_names: r.secrets,
        })
    }
}

impl PublishPlan for SkillPublishPlan {
    fn recipe(&self) -> Option<PublishRecipe> {
        let recipe = Recipe {
            schedule: self.schedule.clone(),
            skill: self.skill.clone(),
            time_zone: self.time_zone.iana_name().unwrap_or("UTC").to_string(),
            root: self.root.clone(),
            destinations: self.destinations.clone(),
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            secrets: self.secret_names.clone(),
        };
        Some(PublishRecipe {
            kind: SKILL_PUBLISH_RECIPE.to_string(),
            data: serde_json::to_value(recipe).ok()?,
        })
    }

    fn intents(&self, result: &RunResult) -> Vec<PublishIntent> {
        let answer = parse_answer(&scrub(
            result.output.as_deref().unwrap_or(""),
            &self.secrets,
        ));
        let run_date = self.run_date(result.finished_at);
        self.destinations
            .iter()
            .enumerate()
            .map(|(i, d)| self.intent(i, d, result, &answer, &run_date))
            .collect()
    }
}

impl super::SkillsRepo {
    /// The publish plan of `run` (a plan of this repository's): its
    /// schedule's destinations, `None` when it has none.
    pub fn publish_plan(&self, run: &super::SkillRun) -> Option<SkillPublishPlan> {
        self.schedule_publish_plan(&run.schedule, run.env.secrets.values().cloned().collect())
    }

    /// The publish plan of a run of schedule `schedule` whose secret
    /// values are `secrets` (none for a run that could not read them):
    /// `None` for an unknown schedule or one without destinations.
    pub fn schedule_publish_plan(
        &self,
        schedule: &str,
        secrets: Vec<String>,
    ) -> Option<SkillPublishPlan> {
        let found = self.schedule(schedule)?;
        let destinations = found.settings.destinations.clone().unwrap_or_default();
        if destinations.is_empty() {
            return None;
        }
        Some(SkillPublishPlan {
            schedule: found.name.clone(),
            skill: found.skill.clone(),
            time_zone: found.clock.time_zone().clone(),
            root: self.root.clone(),
            destinations,
            timeout: found
                .settings
                .publish_timeout
                .unwrap_or(DEFAULT_PUBLISH_TIMEOUT),
            secrets,
            secret_names: found
                .settings
                .env
                .iter()
                .flatten()
                .filter_map(|(_, v)| match v {
                    EnvValue::Secret { secret } => Some(secret.clone()),
                    EnvValue::Text(_) => None,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_recipe_names_secrets_and_makes_the_plan_again() {
        let plan = SkillPublishPlan {
            schedule: "daily".into(),
            skill: "digest".into(),
            time_zone: super::super::clock::time_zone("Europe/Oslo").unwrap(),
            root: PathBuf::from("/repo"),
            destinations: serde_norway::from_str(
                "[{ type: webhook, url: { secret: hook }, when: on_failure }]",
            )
            .unwrap(),
            timeout: Duration::from_secs(20),
            secrets: vec!["value-0a1b2c3d".into()],
            secret_names: vec!["tok".into()],
        };
        let recipe = plan.recipe().unwrap();
        let text = serde_json::to_string(&recipe).unwrap();
        assert!(!text.contains("value-0a1b2c3d"), "{text}");
        assert!(
            text.contains("\"tok\"") && text.contains("Europe/Oslo"),
            "{text}"
        );
        let lookup = |k: &str| (k == "AGENTVISOR_SECRET_TOK").then(|| "value-0a1b2c3d".to_string());
        let again = SkillPublishPlan::from_recipe(&recipe, lookup).unwrap();
        assert_eq!(again.secrets, plan.secrets);
        assert_eq!(again.destinations, plan.destinations);
        assert_eq!(again.time_zone.iana_name(), Some("Europe/Oslo"));
        assert_eq!(again.timeout, plan.timeout);
        let other = PublishRecipe {
            kind: "other".into(),
            data: Value::Null,
        };
        assert!(SkillPublishPlan::from_recipe(&other, |_| None).is_err());
    }

    #[test]
    fn templates_fill_known_names_and_leave_the_rest() {
        let vars = [("output", "hi"), ("skill", "digest")];
        assert_eq!(
            render("{{ skill }}: {{output}} {{other}} {{", &vars),
            "digest: hi {{other}} {{"
        );
    }
}
