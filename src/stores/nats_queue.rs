//! `RunQueue` on NATS JetStream (the `nats` feature): a work-queue stream
//! and one durable pull consumer that every worker pulls from.
//!
//! # The shape on the server
//!
//! - Stream `NAME` (retention `WorkQueue`, storage `File`, subject
//!   `agentvisor.queue.NAME`, no limits): one message per accepted run,
//!   removed when a worker acknowledges it.
//! - Its consumer `workers` (durable, pull, explicit ack): `ack_wait` is
//!   the lease duration, `max_ack_pending` the in-flight cap, and
//!   `max_deliver` the queue's `max_deliver` plus [`DEAD_LETTER_SPARE`].
//! - Stream `NAME_DEAD` (retention `Limits`, storage `File`, subject
//!   `agentvisor.dead.NAME`): the dead letters, one JSON [`DeadLetter`]
//!   each.
//!
//! [`NatsQueue::connect`] creates what is missing and **refuses** a stream
//! or consumer that exists with other settings
//! ([`QueueError::Misconfigured`]): a stream with limits, a `max_age` or
//! another retention could drop accepted runs, a consumer with another
//! `ack_wait` or a back-off would break the leases' timing, and this
//! queue would no longer give what its docs promise.
//!
//! # The port on JetStream
//!
//! - **Submit** publishes the job with `Nats-Msg-Id` = its run id and
//!   waits for the server's acknowledgement (a repeat within the stream's
//!   `duplicate_window` is dropped by the server:
//!   [`Submitted::AlreadyQueued`]).
//! - **Claim** is a no-wait fetch of up to `max` messages from the
//!   consumer, no more than the in-flight cap leaves room for (read from
//!   the consumer's info first). The server hands a message to one pull
//!   request at a time and counts its delivery; it never hands out more
//!   than `max_ack_pending` unacknowledged messages. A pull request it
//!   cannot fill at once (claimers racing for the last room; the cap
//!   reached) is held open for up to [`FETCH_WAIT`]: a claim there takes
//!   that long, and returns what was delivered in it.
//! - **Renew** sends a progress acknowledgement (`+WPI`), **complete** an
//!   `+ACK`, **release** a `-NAK` (redelivered at once), each as a request
//!   whose reply says the server processed it ("double ack"): a renewal
//!   that gets no reply is an error the caller sees.
//! - **The fencing token** is the message's consumer sequence: the
//!   consumer numbers every delivery, redeliveries included, so a message
//!   delivered again carries a higher one than any earlier delivery of it
//!   (of any message). [`JobLease::deliveries`] is the message's delivery
//!   count. Both are read from the message's acknowledgement subject. A
//!   consumer deleted and created again numbers from 1 again: the stores
//!   that check tokens must then be told (not done here).
//! - **Dead letters**: the consumer allows a few deliveries more than the
//!   queue's `max_deliver`; a claim that receives a message delivered
//!   more than `max_deliver` times does not return it but publishes it to
//!   the dead-letter stream (with its run id as `Nats-Msg-Id`, awaiting
//!   the acknowledgement) and then acknowledges it. The spare deliveries
//!   are for a claimer that dies between the two.
//!
//! # What JetStream does not give, and what this battery does about it
//!
//! - **No fencing of acknowledgements on the server.** The server applies
//!   an acknowledgement by stream sequence, whichever delivery of the
//!   message it came from, and replies to a double ack of a progress
//!   update whether or not the message was still pending for that
//!   delivery. So the battery fences on the client: a lease's
//!   [`JobLease::deadline`] is reckoned from before the fetch was sent
//!   (the server starts `ack_wait` when it delivers, later), a renewal
//!   moves it only when the server's reply came back before the old
//!   deadline, and an acknowledgement is not sent once the deadline has
//!   passed ([`LostReason::Expired`]). What remains is a reply that comes
//!   back after the deadline: the server may have applied the
//!   acknowledgement after it redelivered the message; the call fails
//!   with [`LostReason::Expired`], but a `+ACK` applied that late removes
//!   the message under its new holder. Stores that check fencing tokens
//!   keep that holder's writes safe; the queue cannot. A lease completed
//!   or released through a handle is refused by that handle afterwards
//!   ([`LostReason::Finished`], [`LostReason::Released`]); any other lost
//!   lease is reported as expired: the server does not say superseded.
//! - **Whether an acknowledged publish is on disk is the server's
//!   setting, not the stream's.** JetStream acknowledges a publish once
//!   its file store has written it, and syncs files to disk every
//!   `sync_interval` (two minutes by default): a power cut can lose
//!   what it acknowledged since. `sync_interval: always` (nats-server
//!   2.10 and later, in the server's `jetstream {}` block) syncs every
//!   write before the acknowledgement. It is a server option: no stream
//!   or consumer setting asks for it, and the client protocol does not
//!   show it (the server's monitoring endpoint, `/varz` or `/jsz`, does,
//!   on another port and with other credentials). So this battery cannot
//!   verify it: run the servers with `sync_interval: always`, or several
//!   replicas ([`NatsQueueConfig::replicas`]) on machines that do not
//!   lose power together. What it can check it does: storage `File`, and
//!   a stream's `persist_mode` (newer servers: `async` acknowledges
//!   before the write) left at its default.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream, AckKind};
use async_trait::async_trait;
use futures_util::StreamExt;
use tokio::time::Instant;

use crate::ports::queue::{
    Claimed, DeadLetter, DeadReason, Job, JobLease, LostReason, QueueError, QueueLimits,
    ReleaseReason, RunQueue, Submitted,
};
use crate::ports::run::unix_ms;

/// Deliveries the consumer allows beyond the queue's `max_deliver`: the
/// delivery that dead-letters a message, and two more for a claimer that
/// dies while dead-lettering it.
pub const DEAD_LETTER_SPARE: u32 = 3;

/// The longest a claim's pull request stays open on the server when it
/// cannot be filled at once (other claimers took the in-flight cap's
/// room first; the cap is reached and nothing waits for redelivery).
pub const FETCH_WAIT: Duration = Duration::from_millis(250);

/// The durable consumer every worker pulls from.
const CONSUMER: &str = "workers";

/// How to reach and shape a queue on NATS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsQueueConfig {
    /// The server, or several separated by commas
    /// (`nats://127.0.0.1:4222`).
    pub url: String,
    /// The stream's name: letters, digits, `-` and `_`.
    pub stream: String,
    /// How long a lease holds without a renewal: the consumer's
    /// `ack_wait`. Every claim must ask for this duration.
    pub lease_ttl: Duration,
    /// The queue's bounds.
    pub limits: QueueLimits,
    /// How long the server remembers a run id to drop a repeated submit.
    pub duplicate_window: Duration,
    /// Copies of each stream in a cluster (1 on a single server).
    pub replicas: usize,
    /// How long one request to the server may take.
    pub timeout: Duration,
}

impl NatsQueueConfig {
    /// A queue on `url` named `stream`: leases of 30 s, the default
    /// [`QueueLimits`], a duplicate window of 2 minutes (the server's
    /// default), one replica, requests of at most 5 s.
    pub fn new(url: impl Into<String>, stream: impl Into<String>) -> Self {
        NatsQueueConfig {
            url: url.into(),
            stream: stream.into(),
            lease_ttl: Duration::from_secs(30),
            limits: QueueLimits::default(),
            duplicate_window: Duration::from_secs(120),
            replicas: 1,
            timeout: Duration::from_secs(5),
        }
    }

    /// The subject jobs are published on.
    pub fn subject(&self) -> String {
        format!("agentvisor.queue.{}", self.stream)
    }

    /// The dead-letter stream's name.
    pub fn dead_stream(&self) -> String {
        format!("{}_DEAD", self.stream)
    }

    /// The subject dead letters are published on.
    pub fn dead_subject(&self) -> String {
        format!("agentvisor.dead.{}", self.stream)
    }

    /// The work-queue stream as this queue creates it.
    fn stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.stream.clone(),
            subjects: vec![self.subject()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            max_messages: -1,
            max_bytes: -1,
            max_messages_per_subject: -1,
            description: Some("agentvisor: accepted runs, one message each".into()),
            ..Default::default()
        }
    }

    /// The dead-letter stream as this queue creates it.
    fn dead_stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.dead_stream(),
            subjects: vec![self.dead_subject()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            max_messages: -1,
            max_bytes: -1,
            max_messages_per_subject: -1,
            description: Some("agentvisor: dead-lettered runs".into()),
            ..Default::default()
        }
    }

    /// The consumer as this queue creates it.
    fn consumer_config(&self) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(CONSUMER.into()),
            description: Some("agentvisor workers".into()),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.lease_ttl,
            max_deliver: i64::from(self.limits.max_deliver.saturating_add(DEAD_LETTER_SPARE)),
            filter_subject: self.subject(),
            max_ack_pending: i64::from(self.limits.max_in_flight),
            ..Default::default()
        }
    }
}

/// The run queue on NATS JetStream (see the module docs).
pub struct NatsQueue {
    config: NatsQueueConfig,
    js: jetstream::Context,
    consumer: consumer::PullConsumer,
    dead: stream::Stream,
    /// Leases this handle completed or released, by receipt, until their
    /// deadline (after it they are refused as expired anyway): the server
    /// would answer a renewal of them as if they held.
    ended: Mutex<HashMap<String, (LostReason, Instant)>>,
}

impl std::fmt::Debug for NatsQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsQueue")
            .field("stream", &self.config.stream)
            .finish_non_exhaustive()
    }
}

fn unreachable(e: impl std::fmt::Display) -> QueueError {
    QueueError::Unreachable(crate::secrets::redact_string(e.to_string()))
}

/// Refuses `found` unless it is what `wanted` creates (the settings that
/// bear on what the queue guarantees).
fn check_stream(found: &stream::Config, wanted: &stream::Config) -> Result<(), QueueError> {
    let resource = format!("stream {}", wanted.name);
    let refuse = |field, found: String, expected: String| QueueError::Misconfigured {
        resource: resource.clone(),
        field,
        found,
        expected,
    };
    let unlimited = |v: i64| v <= 0;
    if found.retention != wanted.retention {
        return Err(refuse(
            "retention",
            format!("{:?}", found.retention),
            format!("{:?}", wanted.retention),
        ));
    }
    if found.storage != wanted.storage {
        return Err(refuse(
            "storage",
            format!("{:?}", found.storage),
            format!("{:?}", wanted.storage),
        ));
    }
    if found.subjects != wanted.subjects {
        return Err(refuse(
            "subjects",
            found.subjects.join(","),
            wanted.subjects.join(","),
        ));
    }
    if found.num_replicas != wanted.num_replicas.max(1) {
        return Err(refuse(
            "num_replicas",
            found.num_replicas.to_string(),
            wanted.num_replicas.to_string(),
        ));
    }
    if found.duplicate_window != wanted.duplicate_window {
        return Err(refuse(
            "duplicate_window",
            format!("{:?}", found.duplicate_window),
            format!("{:?}", wanted.duplicate_window),
        ));
    }
    if !found.max_age.is_zero() {
        return Err(refuse(
            "max_age",
            format!("{:?}", found.max_age),
            "none".into(),
        ));
    }
    for (field, v) in [
        ("max_msgs", found.max_messages),
        ("max_bytes", found.max_bytes),
        ("max_msgs_per_subject", found.max_messages_per_subject),
    ] {
        if !unlimited(v) {
            return Err(refuse(field, v.to_string(), "unlimited".into()));
        }
    }
    if found.no_ack {
        return Err(refuse("no_ack", "true".into(), "false".into()));
    }
    if found.sealed {
        return Err(refuse("sealed", "true".into(), "false".into()));
    }
    if found.mirror.is_some() {
        return Err(refuse("mirror", "set".into(), "none".into()));
    }
    if let Some(mode @ stream::PersistenceMode::Async) = found.persist_mode {
        return Err(refuse(
            "persist_mode",
            format!("{mode:?}"),
            "default (acknowledged once written)".into(),
        ));
    }
    Ok(())
}

/// Refuses a consumer set up otherwise than `wanted`.
fn check_consumer(
    found: &consumer::Config,
    wanted: &consumer::pull::Config,
) -> Result<(), QueueError> {
    let refuse = |field, found: String, expected: String| QueueError::Misconfigured {
        resource: format!("consumer {CONSUMER}"),
        field,
        found,
        expected,
    };
    if found.durable_name != wanted.durable_name {
        return Err(refuse(
            "durable_name",
            format!("{:?}", found.durable_name),
            format!("{:?}", wanted.durable_name),
        ));
    }
    if found.deliver_subject.is_some() {
        return Err(refuse(
            "deliver_subject",
            "set (push)".into(),
            "none (pull)".into(),
        ));
    }
    if found.ack_policy != wanted.ack_policy {
        return Err(refuse(
            "ack_policy",
            format!("{:?}", found.ack_policy),
            format!("{:?}", wanted.ack_policy),
        ));
    }
    if found.ack_wait != wanted.ack_wait {
        return Err(refuse(
            "ack_wait",
            format!("{:?}", found.ack_wait),
            format!("{:?} (the lease duration)", wanted.ack_wait),
        ));
    }
    if found.max_deliver != wanted.max_deliver {
        return Err(refuse(
            "max_deliver",
            found.max_deliver.to_string(),
            wanted.max_deliver.to_string(),
        ));
    }
    if found.max_ack_pending != wanted.max_ack_pending {
        return Err(refuse(
            "max_ack_pending",
            found.max_ack_pending.to_string(),
            format!("{} (the in-flight cap)", wanted.max_ack_pending),
        ));
    }
    if found.filter_subject != wanted.filter_subject {
        return Err(refuse(
            "filter_subject",
            found.filter_subject.clone(),
            wanted.filter_subject.clone(),
        ));
    }
    if !found.backoff.is_empty() {
        return Err(refuse(
            "backoff",
            format!("{:?}", found.backoff),
            "none (redeliveries wait ack_wait)".into(),
        ));
    }
    Ok(())
}

impl NatsQueue {
    /// Connects to `config.url`, creates the streams and the consumer
    /// where they are missing, and checks those that exist (see the module
    /// docs).
    pub async fn connect(config: NatsQueueConfig) -> Result<Self, QueueError> {
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if config.stream.is_empty() || !config.stream.chars().all(valid) {
            return Err(QueueError::Unsupported(format!(
                "stream name `{}`: use letters, digits, `-` and `_`",
                config.stream
            )));
        }
        if config.lease_ttl.is_zero() {
            return Err(QueueError::Unsupported("a lease of zero".into()));
        }
        let client = async_nats::ConnectOptions::new()
            .name("agentvisor")
            .connection_timeout(config.timeout)
            .request_timeout(Some(config.timeout))
            .connect(config.url.as_str())
            .await
            .map_err(unreachable)?;
        let js = jetstream::ContextBuilder::new()
            .timeout(config.timeout)
            .build(client);
        let stream = open_stream(&js, config.stream_config()).await?;
        let dead = open_stream(&js, config.dead_stream_config()).await?;
        let wanted = config.consumer_config();
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(CONSUMER, wanted.clone())
            .await
            .map_err(unreachable)?;
        check_consumer(&consumer.cached_info().config, &wanted)?;
        Ok(NatsQueue {
            config,
            js,
            consumer,
            dead,
            ended: Mutex::default(),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &NatsQueueConfig {
        &self.config
    }

    fn max_deliver(&self) -> u32 {
        self.config.limits.max_deliver.max(1)
    }

    /// Sends `kind` for `lease`'s delivery and waits for the server's
    /// reply, no later than the lease's deadline: a reply that does not
    /// come back before it means the lease is lost.
    async fn acknowledge(&self, lease: &JobLease, kind: AckKind) -> Result<(), QueueError> {
        let lost = |reason| QueueError::LeaseLost {
            run_id: lease.run_id,
            fence: lease.fence,
            reason,
        };
        let now = Instant::now();
        let left = lease.deadline.saturating_duration_since(now);
        if left.is_zero() {
            return Err(lost(LostReason::Expired));
        }
        if let Some((reason, _)) = self.lock_ended().get(&lease.receipt) {
            return Err(lost(*reason));
        }
        let acker = jetstream::message::Acker::new(
            self.js.clone(),
            Some(async_nats::Subject::from(lease.receipt.as_str())),
        );
        match tokio::time::timeout(left, acker.double_ack_with(kind)).await {
            Err(_) => Err(lost(LostReason::Expired)),
            Ok(_) if Instant::now() >= lease.deadline => Err(lost(LostReason::Expired)),
            Ok(Err(e)) => Err(unreachable(e)),
            Ok(Ok(())) => Ok(()),
        }
    }

    fn lock_ended(&self) -> std::sync::MutexGuard<'_, HashMap<String, (LostReason, Instant)>> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers that `lease` ended here (`reason`).
    fn ended(&self, lease: &JobLease, reason: LostReason) {
        let now = Instant::now();
        let mut ended = self.lock_ended();
        ended.retain(|_, (_, deadline)| *deadline > now);
        ended.insert(lease.receipt.clone(), (reason, lease.deadline));
    }

    /// Moves `message` (a job delivered `deliveries` times) to the
    /// dead-letter stream, then acknowledges it.
    async fn dead_letter(
        &self,
        message: &jetstream::Message,
        job: Job,
        deliveries: u32,
    ) -> Result<(), QueueError> {
        let letter = DeadLetter {
            reason: DeadReason::MaxDeliveries { deliveries },
            job,
            at_ms: unix_ms(),
        };
        let payload =
            serde_json::to_vec(&letter).map_err(|e| QueueError::Corrupt(e.to_string()))?;
        self.js
            .send_publish(
                self.config.dead_subject(),
                jetstream::message::PublishMessage::build()
                    .payload(payload.into())
                    .message_id(letter.job.run_id.to_string()),
            )
            .await
            .map_err(unreachable)?
            .await
            .map_err(unreachable)?;
        message.double_ack().await.map_err(unreachable)
    }
}

/// The stream `wanted` names: created when missing, refused when it
/// exists otherwise.
async fn open_stream(
    js: &jetstream::Context,
    wanted: stream::Config,
) -> Result<stream::Stream, QueueError> {
    let stream = js
        .get_or_create_stream(wanted.clone())
        .await
        .map_err(unreachable)?;
    check_stream(&stream.cached_info().config, &wanted)?;
    Ok(stream)
}

#[async_trait]
impl RunQueue for NatsQueue {
    async fn submit(&self, job: &Job) -> Result<Submitted, QueueError> {
        let payload = serde_json::to_vec(job).map_err(|e| QueueError::Corrupt(e.to_string()))?;
        let ack = self
            .js
            .send_publish(
                self.config.subject(),
                jetstream::message::PublishMessage::build()
                    .payload(payload.into())
                    .message_id(job.run_id.to_string()),
            )
            .await
            .map_err(unreachable)?
            .await
            .map_err(unreachable)?;
        Ok(if ack.duplicate {
            Submitted::AlreadyQueued
        } else {
            Submitted::Queued
        })
    }

    async fn claim(
        &self,
        worker: &str,
        max: usize,
        lease_ttl: Duration,
    ) -> Result<Vec<Claimed>, QueueError> {
        if lease_ttl != self.config.lease_ttl {
            return Err(QueueError::Unsupported(format!(
                "a lease of {lease_ttl:?}: leases on stream {} last its consumer's ack_wait, {:?}",
                self.config.stream, self.config.lease_ttl
            )));
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        // Ask for no more than the in-flight cap leaves: a pull request
        // the server cannot fill is held open until it expires, and with
        // it the claim. At the cap, ask anyway: messages whose lease
        // expired are redelivered within it.
        let pending = self
            .consumer
            .get_info()
            .await
            .map_err(unreachable)?
            .num_ack_pending;
        let room = (self.config.limits.max_in_flight.max(1) as usize).saturating_sub(pending);
        let asked = if room == 0 { max } else { max.min(room) };
        let sent = Instant::now();
        let deadline = sent + lease_ttl;
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(asked)
            .expires(FETCH_WAIT)
            .messages()
            .await
            .map_err(unreachable)?;
        let mut out = Vec::new();
        while let Some(next) = batch.next().await {
            let message = match next {
                Ok(message) => message,
                // The in-flight cap (the server answers 409 when the
                // consumer has `max_ack_pending` unacknowledged).
                Err(e) if e.to_string().contains("409") => break,
                Err(e) if out.is_empty() => return Err(unreachable(e)),
                Err(e) => {
                    tracing::warn!(error = %e, "run queue: a fetch ended early");
                    break;
                }
            };
            let (fence, delivered) = match message.info() {
                Ok(info) => (info.consumer_sequence, info.delivered),
                Err(e) => return Err(QueueError::Corrupt(e.to_string())),
            };
            let deliveries = u32::try_from(delivered).unwrap_or(u32::MAX);
            let job: Job = match serde_json::from_slice(&message.payload) {
                Ok(job) => job,
                Err(e) => {
                    // Not a job: no worker could run it. It is dropped
                    // (terminated), and said.
                    tracing::warn!(
                        stream = %self.config.stream,
                        error = %e,
                        "run queue: a message is not a job; terminated"
                    );
                    let _ = message.double_ack_with(AckKind::Term).await;
                    continue;
                }
            };
            if deliveries > self.max_deliver() {
                self.dead_letter(&message, job, deliveries - 1).await?;
                continue;
            }
            let receipt = message
                .reply
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default();
            out.push(Claimed {
                lease: JobLease {
                    run_id: job.run_id,
                    worker: worker.to_string(),
                    fence,
                    deliveries,
                    ttl: lease_ttl,
                    deadline,
                    receipt,
                },
                job,
            });
        }
        Ok(out)
    }

    async fn renew(&self, lease: &mut JobLease) -> Result<(), QueueError> {
        let sent = Instant::now();
        self.acknowledge(lease, AckKind::Progress).await?;
        lease.deadline = sent + lease.ttl;
        Ok(())
    }

    async fn complete(&self, lease: &JobLease) -> Result<(), QueueError> {
        self.acknowledge(lease, AckKind::Ack).await?;
        self.ended(lease, LostReason::Finished);
        Ok(())
    }

    async fn release(&self, lease: &JobLease, _reason: &ReleaseReason) -> Result<(), QueueError> {
        self.acknowledge(lease, AckKind::Nak(None)).await?;
        self.ended(lease, LostReason::Released);
        Ok(())
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let info = self.dead.get_info().await.map_err(unreachable)?;
        let mut out = Vec::new();
        if info.state.messages == 0 {
            return Ok(out);
        }
        for seq in info.state.first_sequence..=info.state.last_sequence {
            if out.len() >= limit {
                break;
            }
            let message = match self.dead.get_raw_message(seq).await {
                Ok(message) => message,
                // A gap (a message deleted by hand).
                Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => continue,
                Err(e) => return Err(unreachable(e)),
            };
            out.push(
                serde_json::from_slice(&message.payload)
                    .map_err(|e| QueueError::Corrupt(e.to_string()))?,
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_stream_changed_by_hand_is_refused_by_name() {
        let config = NatsQueueConfig::new("nats://127.0.0.1:4222", "RUNS");
        let wanted = config.stream_config();
        assert!(check_stream(&wanted, &wanted).is_ok());
        let mut limited = wanted.clone();
        limited.max_age = Duration::from_secs(3600);
        let e = check_stream(&limited, &wanted).unwrap_err().to_string();
        assert!(e.contains("stream RUNS: max_age is 3600s"), "{e}");
        let mut interest = wanted.clone();
        interest.retention = stream::RetentionPolicy::Interest;
        assert!(matches!(
            check_stream(&interest, &wanted),
            Err(QueueError::Misconfigured {
                field: "retention",
                ..
            })
        ));
        let consumer = config.consumer_config();
        let mut found = consumer::IntoConsumerConfig::into_consumer_config(consumer.clone());
        assert!(check_consumer(&found, &consumer).is_ok());
        found.ack_wait = Duration::from_secs(300);
        let e = check_consumer(&found, &consumer).unwrap_err().to_string();
        assert!(e.contains("consumer workers: ack_wait is 300s"), "{e}");
    }
}
