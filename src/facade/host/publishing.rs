//! The host's side of publishing: its outbox (the audit store's) and
//! waiting for a run's publishes (see `crate::actors::publisher`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::Host;
use crate::actors::publisher::PublisherMsg;
use crate::ports::outbox::{DeliveryReport, OutboxStore};
use crate::ports::run::RunId;

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
