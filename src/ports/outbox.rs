//! The outbox: what a run owes to the outside world once it has ended
//! (publish intents), and the ports that record and deliver it.
//!
//! A run does not publish as a side effect. When it ends, a
//! [`PublishPlan`] given with its invocation turns its result into
//! [`PublishIntent`]s, and they ride to the audit store with the run's
//! terminal record, as an [`AuditEntry::Publish`](super::audit::AuditEntry::Publish)
//! record in the same batch: a store that keeps an outbox writes them in
//! the batch's transaction, so a crash keeps both or neither. A publisher
//! (the host's publisher actor, over a [`Publisher`] battery) then
//! delivers what is owed and records each outcome here ([`OutboxStore`]).
//!
//! An intent never holds a secret's value: its target is the destination
//! as declared (a `{ secret: NAME }` stays a reference, read when it is
//! delivered), and what people see of it is [`PublishIntent::shown`],
//! redacted.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::run::{RunId, RunResult};

/// One publish a run owes: a destination and the body rendered for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublishIntent {
    /// Its idempotency key: the run's id, the destination's index and
    /// name (`RUN-0-digest-hook`). Unique in an outbox; sent as the
    /// webhook's `Idempotency-Key` header.
    pub key: String,
    /// The run that owes it.
    pub run_id: RunId,
    /// The destination's index in its schedule's list.
    pub index: u32,
    /// The destination's name (its `name`, else its kind).
    pub name: String,
    /// The destination's kind (`webhook`, `file`, `slack`, …).
    pub kind: String,
    /// The destination's keys as declared, `{ secret: NAME }` references
    /// unresolved (a file's `path` made absolute). Never a secret's value.
    pub target: serde_json::Value,
    /// The target for people: redacted (`https://hooks.example.com/…`).
    pub shown: String,
    /// The rendered body.
    pub body: String,
    /// Set when the destination's `when` does not hold for the run: it is
    /// recorded `skipped` and never delivered (skipped is not failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The schedule whose run owes it.
    pub schedule: String,
    /// The skill it ran.
    pub skill: String,
    /// How long its delivery may take, all tries together (ms).
    pub timeout_ms: u64,
    /// Unix ms when it was made (the run's end).
    pub at_ms: u64,
}

impl PublishIntent {
    /// The idempotency key of destination `index` (`name`) of run `run_id`.
    pub fn key_of(run_id: RunId, index: u32, name: &str) -> String {
        format!("{run_id}-{index}-{name}")
    }
}

/// Where an intent stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not delivered yet.
    Owed,
    /// Delivered.
    Delivered,
    /// Every try failed (or a try failed for good).
    Failed,
    /// Not due: its `when` did not hold.
    Skipped,
}

impl DeliveryState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Owed => "owed",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
            DeliveryState::Skipped => "skipped",
        }
    }

    /// Reads a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "owed" => DeliveryState::Owed,
            "delivered" => DeliveryState::Delivered,
            "failed" => DeliveryState::Failed,
            "skipped" => DeliveryState::Skipped,
            _ => return None,
        })
    }
}

/// What became of one intent: what results and `runs` show of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryReport {
    /// The intent's key.
    pub key: String,
    /// The destination's name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// Its target, redacted.
    pub target: String,
    /// Where it stands.
    pub state: DeliveryState,
    /// Tries made.
    pub attempts: u32,
    /// The last try's error (redacted), when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the destination answered (`issue #12`, the file written, …)
    /// or why it was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Unix ms of the outcome (0 while owed).
    pub at_ms: u64,
}

impl DeliveryReport {
    /// The report of an intent before any try: `owed`, or `skipped`.
    pub fn of(intent: &PublishIntent) -> Self {
        DeliveryReport {
            key: intent.key.clone(),
            name: intent.name.clone(),
            kind: intent.kind.clone(),
            target: intent.shown.clone(),
            state: if intent.skipped.is_some() {
                DeliveryState::Skipped
            } else {
                DeliveryState::Owed
            },
            attempts: 0,
            error: None,
            detail: intent.skipped.clone(),
            at_ms: if intent.skipped.is_some() {
                intent.at_ms
            } else {
                0
            },
        }
    }
}

/// An outbox failure (no secret reaches it: the outbox holds none).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The store could not read or write.
    #[error("outbox unavailable: {0}")]
    Unavailable(String),
}

/// Where intents are kept until delivered, with their outcomes.
/// Object-safe; used as `Arc<dyn OutboxStore>`. Intents are written by
/// the audit store that holds this outbox (with their run's terminal
/// record); this port reads them and records what became of them.
#[async_trait]
pub trait OutboxStore: Send + Sync + 'static {
    /// Intents still owed, oldest first, at most `limit`, leaving out
    /// those another publisher claimed until after `now_ms`.
    async fn owed(&self, now_ms: u64, limit: usize) -> Result<Vec<PublishIntent>, OutboxError>;

    /// A run's intents and what became of each, in destination order.
    async fn run_intents(
        &self,
        run_id: RunId,
    ) -> Result<Vec<(PublishIntent, DeliveryReport)>, OutboxError>;

    /// Claims an owed intent for `owner` until `until_ms` (a publisher
    /// delivers only what it claimed): `false` when it is not owed, or
    /// another owner's claim runs past `now_ms`.
    async fn claim(
        &self,
        key: &str,
        owner: &str,
        until_ms: u64,
        now_ms: u64,
    ) -> Result<bool, OutboxError>;

    /// Records an intent's outcome (its state, tries, error, detail) and
    /// lets its claim go.
    async fn record_outcome(&self, report: &DeliveryReport) -> Result<(), OutboxError>;
}

/// Turns a run's result into what it owes: given with the run's
/// invocation, called once when the run ends (on its critic shard: it
/// must be quick and must not block).
pub trait PublishPlan: Send + Sync + 'static {
    /// The run's intents (every destination: those whose `when` does not
    /// hold come `skipped`).
    fn intents(&self, result: &RunResult) -> Vec<PublishIntent>;

    /// How to make this plan again in another process, for a durable run
    /// that another host resumes (see [`PublishRecipe`]); `None` (the
    /// default): the plan lives only in the process that submitted the
    /// run, and a run resumed elsewhere ends owing nothing.
    fn recipe(&self) -> Option<PublishRecipe> {
        None
    }
}

/// How to make a [`PublishPlan`] again: kept with a durable run's
/// invocation in its checkpoint, so the host that resumes the run after
/// a crash (`Host::recover`) makes the plan again and the run's terminal
/// record carries its intents. Plain data that names its kind; it never
/// holds a secret's value (secrets are named, and read again where the
/// plan is made). It is trusted as the host's own record is: it says
/// where a run's output goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRecipe {
    /// The kind of plan (`skill`: a schedule's destinations).
    pub kind: String,
    /// What that kind needs to make the plan again.
    pub data: serde_json::Value,
}

/// What a destination answered to a delivery.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delivered {
    /// What to show of it (`issue #12`, a path), if anything.
    pub detail: Option<String>,
}

/// A delivery that did not land. Its text is redacted by the battery that
/// makes it: no target's token and no secret's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// Worth another try (a connection refused, a 5xx, a 429).
    #[error("{0}")]
    Transient(String),
    /// Another try would fail the same way (a 4xx, a missing secret, a
    /// kind this build cannot deliver).
    #[error("{0}")]
    Permanent(String),
}

/// Delivers intents to their destinations. Object-safe; used as
/// `Arc<dyn Publisher>`. One try: retries, backoff and the timeout are
/// the publisher actor's.
#[async_trait]
pub trait Publisher: Send + Sync + 'static {
    /// Delivers `intent` once.
    async fn deliver(&self, intent: &PublishIntent) -> Result<Delivered, PublishError>;
}

/// An invocation's [`PublishPlan`], if it has one, and its
/// [`PublishRecipe`]. In-process the plan is compared by identity;
/// serialized (a durable run's checkpoint) only the recipe is kept, and a
/// hook read back has the recipe and no plan until the host makes it
/// again ([`with_plan`](Self::with_plan)).
#[derive(Clone, Default)]
pub struct PublishHook {
    plan: Option<std::sync::Arc<dyn PublishPlan>>,
    recipe: Option<PublishRecipe>,
}

impl PublishHook {
    /// A hook on `plan` (with the plan's recipe, if it has one).
    pub fn new(plan: std::sync::Arc<dyn PublishPlan>) -> Self {
        PublishHook {
            recipe: plan.recipe(),
            plan: Some(plan),
        }
    }

    /// The plan, once there is one.
    pub fn plan(&self) -> Option<&std::sync::Arc<dyn PublishPlan>> {
        self.plan.as_ref()
    }

    /// How the plan is made again in another process.
    pub fn recipe(&self) -> Option<&PublishRecipe> {
        self.recipe.as_ref()
    }

    /// The hook with `plan`, made again from its recipe (the recipe kept).
    pub fn with_plan(self, plan: std::sync::Arc<dyn PublishPlan>) -> Self {
        PublishHook {
            plan: Some(plan),
            recipe: self.recipe,
        }
    }

    /// Whether there is neither a plan nor a recipe.
    pub fn is_none(&self) -> bool {
        self.plan.is_none() && self.recipe.is_none()
    }

    /// Whether nothing of it is kept when serialized (no recipe).
    pub fn is_unrecorded(&self) -> bool {
        self.recipe.is_none()
    }

    /// The record of what a run that ended with `result` owes, to ride
    /// with its terminal record (numbered `seq`, as the terminal record
    /// is): `None` without a plan, or when it owes nothing.
    pub fn record(&self, result: &RunResult, seq: u32) -> Option<super::audit::AuditRecord> {
        let intents = self.plan.as_ref()?.intents(result);
        (!intents.is_empty()).then(|| super::audit::AuditRecord {
            run_id: result.run_id,
            seq,
            at_ms: result.finished_at,
            entry: super::audit::AuditEntry::Publish(intents.into()),
        })
    }
}

impl PartialEq for PublishHook {
    fn eq(&self, other: &Self) -> bool {
        let same_plan = match (&self.plan, &other.plan) {
            (None, None) => true,
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        };
        same_plan && self.recipe == other.recipe
    }
}

impl std::fmt::Debug for PublishHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishHook")
            .field("plan", &self.plan.is_some())
            .field("recipe", &self.recipe.as_ref().map(|r| r.kind.as_str()))
            .finish()
    }
}

impl Serialize for PublishHook {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.recipe.serialize(s)
    }
}

impl<'de> Deserialize<'de> for PublishHook {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(PublishHook {
            plan: None,
            recipe: Option::<PublishRecipe>::deserialize(d)?,
        })
    }
}
