//! The keys of `agentvisor.yaml`: `skills:`, `schedules:`, `defaults:`,
//! and the parts of a schedule (destinations, writeback, budget, the
//! policies of the scheduler). Plain data, parsed strictly (an unknown
//! key is refused with its line by the YAML parser); the checks serde
//! cannot make are in `super::repo`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::env::EnvValue;
use crate::spec::mcp::McpServerSpec;
use crate::spec::{opt_duration_serde, LimitsSpec, ScriptEntry};

/// `agentvisor.yaml`, as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoManifest {
    /// Skill name → the path of its folder (relative to the repository).
    #[serde(default)]
    pub skills: BTreeMap<String, String>,
    /// The schedules.
    #[serde(default)]
    pub schedules: Vec<ScheduleSpec>,
    /// What every schedule has unless it says otherwise (every key of a
    /// schedule but `name`, `skill` and `cron`).
    #[serde(default)]
    pub defaults: ScheduleSpec,
}

/// One schedule (and `defaults:`, whose `name`, `skill` and `cron` are
/// refused).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Its name (unique in the repository).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The skill it runs (a key of `skills:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// When: five cron fields or a name such as `@hourly`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone the cron is read in (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The model: a model spec (`openai:MODEL`, `scripted`, …) or a tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The scripted model's responses (with `model: scripted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<Vec<ScriptEntry>>,
    /// The run's environment, given to the model as an `<env>` system
    /// message (secrets shown as `[secret]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, EnvValue>>,
    /// MCP servers whose tools the run gets (as an agent manifest's
    /// `mcp.servers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Vec<McpServerSpec>>,
    /// Where the output is published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destinations: Option<Vec<Destination>>,
    /// Where the memory is written back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writeback: Option<Writeback>,
    /// Model turns a run may take (over the skill's `max_turns`; default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Run limits, as an agent manifest's `limits` (its `max_iterations`
    /// is `max_turns` here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsSpec>,
    /// Spend caps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<ScheduleBudget>,
    /// A fire while the previous run is still going: `skip` (default),
    /// `queue_one`, `cancel_previous` or `allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    /// Fires missed while no host ran: `skip`, `run_once` or `backfill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<Missed>,
    /// How far back missed fires are caught up.
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub catch_up_window: Option<Duration>,
    /// The most missed fires caught up (`backfill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_catch_up: Option<u32>,
    /// A fixed spread after each cron instant, from 0 up to this long,
    /// chosen by the schedule's name.
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub jitter: Option<Duration>,
    /// Consecutive failures of one kind that pause the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_after: Option<u32>,
    /// How long each destination's delivery may take, its tries together
    /// (default 30 s).
    #[serde(
        default,
        with = "opt_duration_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub publish_timeout: Option<Duration>,
    /// The runs are durable (checkpointed at every step and resumed by
    /// the next host after a crash, as an agent manifest's `durable`);
    /// default `false`, or the host's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
}

/// `overlap:`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// The new fire is skipped.
    #[default]
    Skip,
    /// One fire waits for the previous run.
    QueueOne,
    /// The previous run is cancelled.
    CancelPrevious,
    /// Both run.
    Allow,
}

/// `missed:`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Missed fires do not run.
    #[default]
    Skip,
    /// One run for all the missed fires.
    RunOnce,
    /// A run for each missed fire (at most `max_catch_up`).
    Backfill,
}

/// `budget:`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleBudget {
    /// Each run's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_run: Option<BudgetCap>,
    /// The cap of a day's runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_day: Option<BudgetCap>,
}

/// A cap in tokens and in cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetCap {
    /// Tokens (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Cost in US dollars (more than 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// `writeback:` of a schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Writeback {
    /// Whether the memory is written back (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The file, relative to the repository's root and inside it.
    pub path: String,
    /// `append` (default) or `replace`.
    #[serde(default)]
    pub mode: WritebackMode,
}

fn yes() -> bool {
    true
}

/// How a memory is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WritebackMode {
    /// Added at the end of the file.
    #[default]
    Append,
    /// The file becomes the memory.
    Replace,
}

/// When a destination is published to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// Whatever the outcome.
    Always,
    /// When the run succeeded (default).
    #[default]
    OnSuccess,
    /// When it failed.
    OnFailure,
}

/// The kinds of destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DestinationKind {
    /// The command's standard output.
    Stdout,
    /// A file (`path`).
    File,
    /// A JSON POST to `url`.
    Webhook,
    /// A Slack incoming webhook (`url`).
    Slack,
    /// A Discord webhook (`url`).
    Discord,
    /// A GitHub issue (`repo`, `token`).
    GithubIssue,
    /// Mail over SMTP (`host`, `from`, `to`).
    Email,
}

/// One destination of a schedule's output (declared and checked here;
/// delivered by the host's publisher, see `crate::publishers`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// The kind.
    #[serde(rename = "type")]
    pub kind: DestinationKind,
    /// Its name in results (default: the kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The named output it publishes (`<output name="…">`); else the
    /// remaining text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// When it is published.
    #[serde(default)]
    pub when: When,
    /// The body: `{{output}}`, `{{run_id}}`, `{{run_date}}`,
    /// `{{schedule}}`, `{{skill}}` are filled in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// `file`: the file (absolute, or relative to the repository).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `webhook`, `slack`, `discord`: the address (often holds a token:
    /// a secret reference fits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<EnvValue>,
    /// `webhook`: extra headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, EnvValue>>,
    /// `github-issue`: `OWNER/NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// `github-issue`: the API token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<EnvValue>,
    /// `github-issue`: the API's base URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// `github-issue`, `email`: the title or subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `github-issue`: labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    /// `github-issue`: close the skill's previous issue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_older: Option<bool>,
    /// `email`: the SMTP server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// `email`: its port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `email`: the login.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// `email`: the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<EnvValue>,
    /// `email`: the sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// `email`: the recipients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<String>>,
}

impl Destination {
    /// The keys its kind needs and the keys it may have (beyond the
    /// common `type`, `name`, `output`, `when`, `template`).
    pub(super) fn keys(&self) -> (&'static [&'static str], &'static [&'static str]) {
        match self.kind {
            DestinationKind::Stdout => (&[], &[]),
            DestinationKind::File => (&["path"], &["path"]),
            DestinationKind::Webhook => (&["url"], &["url", "headers"]),
            DestinationKind::Slack | DestinationKind::Discord => (&["url"], &["url"]),
            DestinationKind::GithubIssue => (
                &["repo", "token"],
                &[
                    "repo",
                    "token",
                    "base_url",
                    "title",
                    "labels",
                    "close_older",
                ],
            ),
            DestinationKind::Email => (
                &["host", "from", "to"],
                &[
                    "host", "port", "username", "password", "from", "to", "title",
                ],
            ),
        }
    }

    /// The kind-specific keys it sets.
    pub(super) fn set_keys(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut set = |on: bool, key: &'static str| {
            if on {
                out.push(key)
            }
        };
        set(self.path.is_some(), "path");
        set(self.url.is_some(), "url");
        set(self.headers.is_some(), "headers");
        set(self.repo.is_some(), "repo");
        set(self.token.is_some(), "token");
        set(self.base_url.is_some(), "base_url");
        set(self.title.is_some(), "title");
        set(self.labels.is_some(), "labels");
        set(self.close_older.is_some(), "close_older");
        set(self.host.is_some(), "host");
        set(self.port.is_some(), "port");
        set(self.username.is_some(), "username");
        set(self.password.is_some(), "password");
        set(self.from.is_some(), "from");
        set(self.to.is_some(), "to");
        out
    }
}
