//! The run queue: how a run accepted on one host reaches the worker that
//! runs it, when runs are spread over many hosts (capability X4).
//!
//! A host that accepts a run ([`RunQueue::submit`]) records it durably and
//! answers only once it is recorded; workers take runs
//! ([`RunQueue::claim`]) under a **lease**: a hold that lasts
//! `lease_ttl` unless renewed ([`RunQueue::renew`]), and that ends with the
//! run done ([`RunQueue::complete`]) or given back
//! ([`RunQueue::release`]). A lease that is not renewed in time expires:
//! its run is delivered again, to whichever worker claims next, under a
//! new lease.
//!
//! # Guarantees every battery gives
//!
//! - **Nothing accepted is lost**: `submit` returns only once the job is
//!   on the battery's disk (what "on disk" means is each battery's to say:
//!   see its module docs), and a job leaves the queue only by `complete`
//!   or by being dead-lettered.
//! - **One holder at a time**: a job is held by at most one live lease;
//!   two claimers never hold the same job at once.
//! - **Fencing**: every lease carries a **fencing token**
//!   ([`JobLease::fence`]) that grows with every delivery: a job delivered
//!   again is delivered under a higher token than any before it. The
//!   worker writes the token with every durable write of the run
//!   (checkpoints, its terminal record), so that a store refuses a write
//!   under a token older than the newest it has seen: a paused or cut-off
//!   worker can never write over a run another worker took.
//! - **A lost lease is seen**: `renew`, `complete` and `release` of a
//!   lease that expired or was superseded fail with
//!   [`QueueError::LeaseLost`] and change nothing a newer holder relies
//!   on. A battery that cannot reach its server says so with
//!   [`QueueError::Unreachable`]: the caller does not know whether its
//!   lease still holds and must stop writing once its
//!   [`JobLease::deadline`] passes.
//! - **Bounded redelivery**: a job delivered `max_deliver` times
//!   ([`QueueLimits::max_deliver`]) without being completed is
//!   dead-lettered ([`DeadLetter`], with a typed [`DeadReason`]) instead of
//!   being delivered again.
//! - **An in-flight cap**: at most [`QueueLimits::max_in_flight`] leases
//!   are live at once, over every worker: a claim beyond it gets fewer
//!   jobs (none when the cap is reached).
//!
//! An expired lease counts as lost even while no other worker has taken
//! its job yet: every battery refuses it the same way.
//!
//! # What is not guaranteed
//!
//! Delivery is at least once: a worker that dies after its run's side
//! effects and before `complete` leaves a job that is delivered again.
//! Fencing makes the second delivery's writes win, not the first's
//! effects disappear. Order is by submission as far as a battery keeps
//! it, and never a promise across workers.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::run::RunId;

/// An accepted run, as the queue keeps it until a worker completes it.
/// The queue reads only its run id; the rest is the worker's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The run's id: one job per run (a second submit of the same id is
    /// [`Submitted::AlreadyQueued`]).
    pub run_id: RunId,
    /// The agent to run: a reference to its manifest (a name, a path, or
    /// the manifest itself), as JSON.
    pub agent: serde_json::Value,
    /// The run's input (its invocation), as JSON.
    pub input: serde_json::Value,
    /// Who asked (budgets and caps are per caller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// Whether the run is durable: checkpointed, and resumed from its
    /// checkpoint when it is delivered again. A non-durable run delivered
    /// again after its lease was lost is ended (`error`/`host_lost`), not
    /// run again.
    pub durable: bool,
    /// Unix ms when it was accepted.
    pub submitted_at_ms: u64,
}

/// What [`RunQueue::submit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// The job is recorded now.
    Queued,
    /// A job of this run id was recorded already (a submit retried after
    /// a lost answer): nothing was added.
    AlreadyQueued,
}

/// A worker's hold on one job. Held by the worker, given back to the
/// queue with every call about the job; it is not shared between workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobLease {
    /// The job's run.
    pub run_id: RunId,
    /// The worker that holds it (as it named itself to `claim`).
    pub worker: String,
    /// The fencing token: higher for every delivery of the job than for
    /// any earlier one (see the module docs). Every durable write of the
    /// run carries it.
    pub fence: u64,
    /// Which delivery of the job this is (1 for the first).
    pub deliveries: u32,
    /// How long the lease holds without a renewal.
    pub ttl: Duration,
    /// The instant by which, at the latest, the holder must treat the
    /// lease as lost unless a renewal succeeded: measured on this
    /// process's clock from before the claim (or renewal) was sent, so it
    /// never falls after the battery's own expiry (clocks running at the
    /// same rate).
    pub deadline: tokio::time::Instant,
    /// The battery's own handle on this delivery (NATS: the message's
    /// acknowledgement subject); empty where a battery needs none.
    pub receipt: String,
}

/// A job and the lease it was claimed under.
#[derive(Clone, Debug, PartialEq)]
pub struct Claimed {
    /// The job.
    pub job: Job,
    /// Its lease.
    pub lease: JobLease,
}

/// Why a worker gives a job back ([`RunQueue::release`]). The job is
/// delivered again (and the delivery counted toward `max_deliver`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ReleaseReason {
    /// The worker is shutting down before it started the run.
    Shutdown,
    /// The worker cannot take the run now (its own limits are full).
    Busy,
    /// Starting the run failed on this worker (its manifest did not
    /// resolve here, a store was unavailable).
    Failed {
        /// Why (no secret in it).
        error: String,
    },
}

/// Why a lease is no longer held ([`QueueError::LeaseLost`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReason {
    /// Its time passed without a renewal: the job is (or will be)
    /// delivered again.
    Expired,
    /// The job was delivered again, under a higher fencing token.
    Superseded,
    /// The holder gave it back ([`RunQueue::release`]).
    Released,
    /// The job is done (completed) or dead-lettered.
    Finished,
}

impl LostReason {
    /// The reason's name.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::Superseded => "superseded",
            LostReason::Released => "released",
            LostReason::Finished => "finished",
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a job was dead-lettered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeadReason {
    /// It was delivered `max_deliver` times and never completed: each
    /// delivery's lease expired or was released.
    MaxDeliveries {
        /// Deliveries made.
        deliveries: u32,
    },
}

/// A job the queue stopped delivering, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The job.
    pub job: Job,
    /// Why.
    pub reason: DeadReason,
    /// Unix ms when it was dead-lettered.
    pub at_ms: u64,
}

/// The bounds a queue enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Deliveries a job gets before it is dead-lettered (at least 1).
    pub max_deliver: u32,
    /// Leases live at once, over every worker (at least 1).
    pub max_in_flight: u32,
}

impl Default for QueueLimits {
    /// Five deliveries; 1 000 runs in flight.
    fn default() -> Self {
        QueueLimits {
            max_deliver: 5,
            max_in_flight: 1_000,
        }
    }
}

/// A run queue failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The lease is no longer held: the caller must stop working on the
    /// job and write nothing more of its run.
    #[error("run {run_id}: lease (fence {fence}) lost: {reason}")]
    LeaseLost {
        /// The job's run.
        run_id: RunId,
        /// The lost lease's fencing token.
        fence: u64,
        /// Why.
        reason: LostReason,
    },
    /// The queue's server did not answer (or failed): whether the call
    /// took effect is unknown. A lease whose renewal failed so holds at
    /// most until its [`JobLease::deadline`].
    #[error("run queue unreachable: {0}")]
    Unreachable(String),
    /// The queue's server holds a queue configured otherwise than this
    /// battery creates it (a stream changed by hand, another program's
    /// stream of the same name): the battery refuses to use it rather
    /// than give weaker guarantees than it promises.
    #[error(
        "run queue {resource}: {field} is {found}, not the {expected} this queue creates it with; \
         delete it or set it back"
    )]
    Misconfigured {
        /// What was found (`stream AGENTVISOR_RUNS`, `consumer workers`).
        resource: String,
        /// The setting.
        field: &'static str,
        /// Its value there.
        found: String,
        /// The value this battery needs.
        expected: String,
    },
    /// The call asked for something this battery does not do (a lease
    /// duration other than the one its server enforces).
    #[error("run queue: {0}")]
    Unsupported(String),
    /// A stored job does not decode (written by another program or a
    /// newer agentvisor).
    #[error("run queue: a stored job does not decode: {0}")]
    Corrupt(String),
}

impl QueueError {
    /// Whether the error says the lease is lost (as opposed to unknown).
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, QueueError::LeaseLost { .. })
    }
}

/// Dispatches accepted runs to workers under fenced leases. Object-safe;
/// `Arc<dyn RunQueue>`. See the module docs for what every battery
/// guarantees.
#[async_trait]
pub trait RunQueue: Send + Sync + 'static {
    /// Records an accepted run; returns once it is on disk. Submitting a
    /// run id again adds nothing ([`Submitted::AlreadyQueued`]; how long a
    /// battery remembers ids is its to say).
    async fn submit(&self, job: &Job) -> Result<Submitted, QueueError>;

    /// Takes up to `max` jobs for `worker`, each under a new lease of
    /// `lease_ttl` with a fencing token higher than any earlier delivery
    /// of that job. Fewer (or none) when fewer are waiting or the
    /// in-flight cap is reached; never waits for jobs to arrive. Jobs
    /// delivered `max_deliver` times are dead-lettered here, not returned.
    async fn claim(
        &self,
        worker: &str,
        max: usize,
        lease_ttl: Duration,
    ) -> Result<Vec<Claimed>, QueueError>;

    /// Extends the lease by its `ttl` from now, moving its
    /// [`JobLease::deadline`]. Fails with [`QueueError::LeaseLost`] when
    /// the lease expired or was superseded (nothing is extended), with
    /// [`QueueError::Unreachable`] when the server could not be asked.
    async fn renew(&self, lease: &mut JobLease) -> Result<(), QueueError>;

    /// Acknowledges the job: it is done and never delivered again. Fenced
    /// like [`RunQueue::renew`]: a lost lease completes nothing.
    async fn complete(&self, lease: &JobLease) -> Result<(), QueueError>;

    /// Gives the job back, to be delivered again (a negative
    /// acknowledgement). Fenced like [`RunQueue::renew`].
    async fn release(&self, lease: &JobLease, reason: &ReleaseReason) -> Result<(), QueueError>;

    /// Up to `limit` dead-lettered jobs, oldest first.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reasons_have_one_stored_shape() {
        let r = ReleaseReason::Failed {
            error: "no manifest".into(),
        };
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, r#"{"reason":"failed","error":"no manifest"}"#);
        assert_eq!(serde_json::from_str::<ReleaseReason>(&json).unwrap(), r);
        let d = DeadReason::MaxDeliveries { deliveries: 3 };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"reason":"max_deliveries","deliveries":3}"#
        );
        assert_eq!(LostReason::Superseded.to_string(), "superseded");
    }
}
