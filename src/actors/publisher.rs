//! The publisher actor: delivers what the outbox owes, over the
//! [`Publisher`] port, and records each delivery's outcome in the
//! [`OutboxStore`].
//!
//! A run's intents reach the outbox with its terminal record (see
//! [`crate::ports::outbox`]); this actor is told to deliver them — a
//! run's (`DeliverRun`, answered once each is settled, for callers that
//! wait for their publishes) or everything still owed (`Scan`: at the
//! host's start, so what a crashed host owed is delivered by the next one,
//! and every `scan_every` after).
//!
//! Each intent is delivered by a task of its own (intents go out in
//! parallel), which first claims it in the store (another publisher on
//! the same store leaves it alone until the claim runs out), then tries at
//! most [`MAX_TRIES`] times with backoff within the intent's timeout, then
//! records the outcome. Nothing is awaited inside `handle`: store reads
//! and deliveries are tasks, which report back by message.
//!
//! # Guarantees
//! - Never zero: an intent stays owed until an outcome is recorded; a
//!   host that ends (or crashes) mid-delivery leaves it claimed until the
//!   claim runs out, and the next scan delivers it again. So a delivery
//!   may repeat after a crash (at least once); the webhook's
//!   `Idempotency-Key` header (the intent's key) lets a receiver keep
//!   exactly one.
//! - Within one host an intent is delivered by one task at a time (the
//!   actor's in-flight set), and across hosts by one claim holder.
//! - Rate: a message per intent and per settled delivery; the set of
//!   deliveries in flight is bounded by what the outbox holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::ports::outbox::{
    DeliveryReport, DeliveryState, OutboxStore, PublishError, PublishIntent, Publisher,
};
use crate::ports::run::{unix_ms, RunId};

/// Tries per intent, at most.
pub const MAX_TRIES: u32 = 3;

/// The first wait between tries; it doubles.
const BACKOFF: Duration = Duration::from_millis(500);

/// Intents a scan takes at most (the next scan takes the rest).
const SCAN_LIMIT: usize = 1000;

/// How much longer than its timeout a claim runs.
const CLAIM_SLACK: Duration = Duration::from_secs(10);

/// Messages to the publisher.
pub enum PublisherMsg {
    /// Deliver what run `run_id` owes; `reply` gets each destination's
    /// report once none is owed any more (or still owed by another
    /// publisher's claim).
    DeliverRun {
        /// The run.
        run_id: RunId,
        /// Where the reports go.
        reply: oneshot::Sender<Vec<DeliveryReport>>,
    },
    /// Deliver everything the outbox owes.
    Scan,
    /// Intents read from the store, to deliver (sent by the actor's read
    /// tasks).
    Loaded {
        /// Owed intents.
        intents: Vec<PublishIntent>,
    },
    /// A delivery task ended.
    Settled {
        /// The intent's key.
        key: String,
        /// Its run.
        run_id: RunId,
    },
}

/// The publisher actor.
pub struct PublisherActor {
    pub(crate) outbox: Arc<dyn OutboxStore>,
    pub(crate) publisher: Arc<dyn Publisher>,
    /// This host's id: the owner of its claims.
    pub(crate) owner: Arc<str>,
    /// How often everything owed is looked for (`None`: at start only).
    pub(crate) scan_every: Option<Duration>,
}

/// Its state.
pub struct PublisherState {
    /// Deliveries in flight, by key: their run and their task.
    in_flight: HashMap<String, (RunId, AbortHandle)>,
    /// Callers waiting for a run's deliveries.
    waiters: HashMap<RunId, Vec<oneshot::Sender<Vec<DeliveryReport>>>>,
}

impl Actor for PublisherActor {
    type Msg = PublisherMsg;
    type State = PublisherState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<PublisherMsg>,
        _: (),
    ) -> Result<PublisherState, ActorProcessingErr> {
        // What a host before this one left owed: read here, before the host
        // takes a run, so this scan is of what was owed at the start (a run
        // that ends on this host is delivered when asked, or by the next
        // periodic scan) and never races this host's own runs.
        match self.outbox.owed(unix_ms(), SCAN_LIMIT).await {
            Ok(intents) if !intents.is_empty() => {
                tracing::info!(
                    intents = intents.len(),
                    "delivering publishes an earlier host left owed"
                );
                let _ = myself.cast(PublisherMsg::Loaded { intents });
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the outbox"),
        }
        if let Some(every) = self.scan_every {
            myself.send_interval(every, || PublisherMsg::Scan);
        }
        Ok(PublisherState {
            in_flight: HashMap::new(),
            waiters: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<PublisherMsg>,
        msg: PublisherMsg,
        st: &mut PublisherState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            PublisherMsg::DeliverRun { run_id, reply } => {
                st.waiters.entry(run_id).or_default().push(reply);
                let outbox = self.outbox.clone();
                let me = myself.clone();
                tokio::spawn(async move {
                    let intents = match outbox.run_intents(run_id).await {
                        Ok(all) => all
                            .into_iter()
                            .filter(|(_, r)| r.state == DeliveryState::Owed)
                            .map(|(i, _)| i)
                            .collect(),
                        Err(e) => {
                            tracing::warn!(%run_id, error = %e, "cannot read a run's publish intents");
                            Vec::new()
                        }
                    };
                    let _ = me.cast(PublisherMsg::Loaded { intents });
                    // Answers the waiters if nothing of the run is (still) in flight.
                    let _ = me.cast(PublisherMsg::Settled {
                        key: String::new(),
                        run_id,
                    });
                });
            }
            PublisherMsg::Scan => {
                let outbox = self.outbox.clone();
                let me = myself.clone();
                tokio::spawn(async move {
                    match outbox.owed(unix_ms(), SCAN_LIMIT).await {
                        Ok(intents) if !intents.is_empty() => {
                            tracing::info!(
                                intents = intents.len(),
                                "delivering publishes the outbox owes"
                            );
                            let _ = me.cast(PublisherMsg::Loaded { intents });
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "cannot read the outbox"),
                    }
                });
            }
            PublisherMsg::Loaded { intents } => {
                for intent in intents {
                    if st.in_flight.contains_key(&intent.key) {
                        continue;
                    }
                    let key = intent.key.clone();
                    let run_id = intent.run_id;
                    let task = tokio::spawn(deliver(
                        intent,
                        self.outbox.clone(),
                        self.publisher.clone(),
                        self.owner.clone(),
                        myself.clone(),
                    ));
                    st.in_flight.insert(key, (run_id, task.abort_handle()));
                }
            }
            PublisherMsg::Settled { key, run_id } => {
                st.in_flight.remove(&key);
                let busy = st.in_flight.values().any(|(r, _)| *r == run_id);
                if !busy {
                    if let Some(waiters) = st.waiters.remove(&run_id) {
                        let outbox = self.outbox.clone();
                        tokio::spawn(async move {
                            let reports: Vec<DeliveryReport> = match outbox
                                .run_intents(run_id)
                                .await
                            {
                                Ok(all) => all.into_iter().map(|(_, r)| r).collect(),
                                Err(e) => {
                                    tracing::warn!(%run_id, error = %e, "cannot read a run's publish outcomes");
                                    Vec::new()
                                }
                            };
                            for w in waiters {
                                let _ = w.send(reports.clone());
                            }
                        });
                    }
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<PublisherMsg>,
        st: &mut PublisherState,
    ) -> Result<(), ActorProcessingErr> {
        // What is cut short stays owed (claimed until its claim runs out):
        // the next host delivers it.
        for (_, (_, task)) in st.in_flight.drain() {
            task.abort();
        }
        Ok(())
    }
}

/// Delivers one intent: claim, at most [`MAX_TRIES`] tries with backoff
/// within its timeout, outcome recorded; then tells the actor.
async fn deliver(
    intent: PublishIntent,
    outbox: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    owner: Arc<str>,
    actor: ActorRef<PublisherMsg>,
) {
    let key = intent.key.clone();
    let run_id = intent.run_id;
    if let Some(report) = attempt(&intent, &*outbox, &*publisher, &owner).await {
        if let Err(e) = outbox.record_outcome(&report).await {
            // Left owed: delivered again by a later scan (at least once).
            tracing::warn!(key = %key, error = %e, "cannot record a publish's outcome");
        }
    }
    let _ = actor.cast(PublisherMsg::Settled { key, run_id });
}

/// The tries; `None` when the intent could not be claimed (delivered,
/// or another publisher holds it).
async fn attempt(
    intent: &PublishIntent,
    outbox: &dyn OutboxStore,
    publisher: &dyn Publisher,
    owner: &str,
) -> Option<DeliveryReport> {
    let timeout = Duration::from_millis(intent.timeout_ms.max(1));
    let now = unix_ms();
    let until = now + (timeout + CLAIM_SLACK).as_millis() as u64;
    match outbox.claim(&intent.key, owner, until, now).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => {
            tracing::warn!(key = %intent.key, error = %e, "cannot claim a publish");
            return None;
        }
    }
    let mut report = DeliveryReport::of(intent);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut backoff = BACKOFF;
    let mut last_error = String::new();
    for n in 1..=MAX_TRIES {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        report.attempts = n;
        match tokio::time::timeout(left, publisher.deliver(intent)).await {
            Ok(Ok(done)) => {
                report.state = DeliveryState::Delivered;
                report.detail = done.detail;
                report.error = None;
                report.at_ms = unix_ms();
                return Some(report);
            }
            Ok(Err(PublishError::Permanent(e))) => {
                last_error = e;
                break;
            }
            Ok(Err(e)) => last_error = e.to_string(),
            Err(_) => {
                last_error = format!("no answer within {} ms", timeout.as_millis());
                break;
            }
        }
        if n < MAX_TRIES {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(backoff.min(left)).await;
            backoff *= 2;
        }
    }
    tracing::warn!(key = %intent.key, destination = %intent.name, error = %crate::secrets::redact(&last_error), "a publish failed");
    report.state = DeliveryState::Failed;
    report.error = Some(crate::secrets::redact_string(last_error));
    report.at_ms = unix_ms();
    Some(report)
}
