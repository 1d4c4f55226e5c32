//! The host's side of publishing: its outbox (the audit store's) and
//! waiting for a run's publishes (see `crate::actors::publisher`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::Host;
use crate::actors::publisher::PublisherMsg;
use crate::handle::RunRef;
use crate::ports::outbox::{DeliveryReport, OutboxStore, PublishPlan, PublishRecipe};
use crate::ports::run::RunId;
use crate::spec::Invocation;

/// Why a run's publishes could not be waited for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublishWaitError {
    /// The host's audit store keeps no outbox: nothing is published.
    #[error("this host's audit store keeps no outbox: nothing can be published")]
    NoOutbox,
    /// The publisher stopped (the host shut down) before it answered.
    #[error("the host's publisher stopped before the publishes were settled")]
    Stopped,
    /// They were not settled in time.
    #[error("the publishes were not settled within {0:?}")]
    TimedOut(Duration),
}

impl Host {
    /// The outbox publish intents are recorded in (the audit store's);
    /// `None` when the store keeps none.
    pub fn outbox(&self) -> Option<&Arc<dyn OutboxStore>> {
        self.inner.outbox.as_ref()
    }

    /// Delivers what run `run_id` owes (the intents recorded with its
    /// terminal record: call this once its result is in) and answers each
    /// destination's report once none is owed any more, waiting at most
    /// `wait`. Each destination is tried at most 3 times within its
    /// timeout; one another host is delivering comes back `owed`.
    pub async fn publish(
        &self,
        run_id: RunId,
        wait: Duration,
    ) -> Result<Vec<DeliveryReport>, PublishWaitError> {
        let publisher = self
            .inner
            .publisher
            .as_ref()
            .ok_or(PublishWaitError::NoOutbox)?;
        let (reply, rx) = oneshot::channel();
        publisher
            .cast(PublisherMsg::DeliverRun { run_id, reply })
            .map_err(|_| PublishWaitError::Stopped)?;
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(reports)) => Ok(reports),
            Ok(Err(_)) => Err(PublishWaitError::Stopped),
            Err(_) => Err(PublishWaitError::TimedOut(wait)),
        }
    }
}

impl Host {
    /// The invocation of a run being resumed, its publish plan made again
    /// from the recipe it kept (see [`plan_from_recipe`]). A recipe that
    /// does not make a plan here is logged, and the run resumes without
    /// one: its work is not given up for its publishes.
    pub(super) fn remake_publish_plan(&self, mut inv: Invocation) -> Invocation {
        if inv.publish.plan().is_some() {
            return inv;
        }
        let Some(recipe) = inv.publish.recipe() else {
            return inv;
        };
        match plan_from_recipe(recipe) {
            Ok(plan) => inv.publish = std::mem::take(&mut inv.publish).with_plan(plan),
            Err(e) => tracing::error!(
                run_id = ?inv.run_id,
                kind = %recipe.kind,
                error = %e,
                "a resumed run's publish plan cannot be made again: it ends owing nothing"
            ),
        }
        inv
    }

    /// Asks the publisher to deliver what `run` owes once it has ended
    /// (its terminal record, and its intents with it, written), without
    /// waiting for the outcomes: for a run this host resumed, whose
    /// submitter is gone.
    pub(super) fn deliver_when_ended(&self, run: RunRef) {
        let Some(publisher) = self.inner.publisher.clone() else {
            return;
        };
        tokio::spawn(async move {
            let run_id = run.shared_result().await.run_id;
            // Nobody waits for the reports.
            let (reply, _) = oneshot::channel();
            let _ = publisher.cast(PublisherMsg::DeliverRun { run_id, reply });
        });
    }
}

/// Makes a publish plan from its recipe: the kinds this build knows
/// (`skill`: [`SkillPublishPlan::from_recipe`], its secrets read from the
/// environment).
///
/// [`SkillPublishPlan::from_recipe`]: crate::skills::SkillPublishPlan::from_recipe
fn plan_from_recipe(recipe: &PublishRecipe) -> Result<Arc<dyn PublishPlan>, String> {
    match recipe.kind.as_str() {
        crate::skills::SKILL_PUBLISH_RECIPE => {
            crate::skills::SkillPublishPlan::from_recipe(recipe, |k| std::env::var(k).ok())
                .map(|p| Arc::new(p) as Arc<dyn PublishPlan>)
        }
        other => Err(format!("no publish plan of kind `{other}` in this build")),
    }
}
