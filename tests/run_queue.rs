#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! One semantics suite for every `RunQueue` battery — in memory, on
//! PostgreSQL (the `postgres` feature: the server on 127.0.0.1:5432, or
//! `AGENTVISOR_TEST_POSTGRES`; each test its own database) and on NATS
//! JetStream (the `nats` feature: 127.0.0.1:4222, or
//! `AGENTVISOR_TEST_NATS`; each test its own streams, deleted after) — so
//! they behave the same: jobs come back in submission order and a repeated
//! submit adds nothing; two claimers never hold one job at once; an
//! expired lease is delivered again under a higher fencing token and its
//! old holder's renew, complete and release are refused; a renewed lease
//! is not delivered again; a released job is delivered again; a job
//! delivered `max_deliver` times is dead-lettered and never delivered
//! again; at most `max_in_flight` leases are live.
//!
//! Time: the in-memory queue runs on tokio's paused clock, the PostgreSQL
//! queue on a clock of the test's (`PostgresQueue::with_clock`). On NATS
//! the server's clock drives `ack_wait`, and no client setting moves it:
//! those tests use leases of one second and wait them out.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::queue::{
    Claimed, DeadReason, Job, JobLease, LostReason, QueueError, QueueLimits, ReleaseReason,
    RunQueue, Submitted,
};
use agentvisor::stores::MemoryQueue;
use agentvisor::RunId;
use serde_json::json;

/// The lease of tests that do not wait for one to expire.
const LONG: Duration = Duration::from_secs(60);
/// The lease of tests that let one expire (on NATS, a real second).
const SHORT: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Memory,
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "nats")]
    Nats,
}

/// One queue under test, and how to move its clock.
struct Bench {
    kind: Kind,
    queue: Arc<dyn RunQueue>,
    ttl: Duration,
    /// The database, its clock and the queue's bounds.
    #[cfg(feature = "postgres")]
    pg: Option<(String, Arc<std::sync::atomic::AtomicU64>, QueueLimits)>,
    #[cfg(feature = "nats")]
    nats: Option<agentvisor::stores::NatsQueueConfig>,
}

impl Bench {
    async fn new(kind: Kind, limits: QueueLimits, ttl: Duration) -> Bench {
        match kind {
            Kind::Memory => Bench {
                kind,
                queue: Arc::new(MemoryQueue::new(limits)),
                ttl,
                #[cfg(feature = "postgres")]
                pg: None,
                #[cfg(feature = "nats")]
                nats: None,
            },
            #[cfg(feature = "postgres")]
            Kind::Postgres => {
                let url = support::postgres::fresh_database().await;
                let clock = Arc::new(std::sync::atomic::AtomicU64::new(
                    agentvisor::ports::run::unix_ms(),
                ));
                let mut bench = Bench {
                    kind,
                    queue: Arc::new(MemoryQueue::default()),
                    ttl,
                    pg: Some((url, clock, limits)),
                    #[cfg(feature = "nats")]
                    nats: None,
                };
                bench.queue = bench.another().await;
                bench
            }
            #[cfg(feature = "nats")]
            Kind::Nats => {
                let stream = support::nats::fresh_stream().await;
                let mut config =
                    agentvisor::stores::NatsQueueConfig::new(support::nats::server_url(), stream);
                config.lease_ttl = ttl;
                config.limits = limits;
                let mut bench = Bench {
                    kind,
                    queue: Arc::new(MemoryQueue::default()),
                    ttl,
                    #[cfg(feature = "postgres")]
                    pg: None,
                    nats: Some(config),
                };
                bench.queue = bench.another().await;
                bench
            }
        }
    }

    /// Another handle on the same queue, as another worker process would
    /// open it (the in-memory queue has only one).
    async fn another(&self) -> Arc<dyn RunQueue> {
        match self.kind {
            Kind::Memory => self.queue.clone(),
            #[cfg(feature = "postgres")]
            Kind::Postgres => {
                let (url, clock, limits) = self.pg.clone().unwrap();
                let store = agentvisor::stores::PostgresStore::connect(&url)
                    .await
                    .unwrap();
                Arc::new(store.run_queue(limits).await.unwrap().with_clock(clock))
            }
            #[cfg(feature = "nats")]
            Kind::Nats => {
                let config = self.nats.clone().unwrap();
                Arc::new(
                    agentvisor::stores::NatsQueue::connect(config)
                        .await
                        .unwrap(),
                )
            }
        }
    }

    /// Lets `d` pass on the queue's clock.
    async fn pass(&self, d: Duration) {
        match self.kind {
            Kind::Memory => tokio::time::advance(d).await,
            #[cfg(feature = "postgres")]
            Kind::Postgres => {
                let (_, clock, _) = self.pg.as_ref().unwrap();
                clock.fetch_add(d.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
            }
            // The server's clock: no client setting moves it.
            #[cfg(feature = "nats")]
            Kind::Nats => tokio::time::sleep(d).await,
        }
    }

    /// Whether the battery tells a superseded lease from an expired one
    /// (NATS reports every lost lease as expired).
    fn tells_superseded(&self) -> bool {
        match self.kind {
            #[cfg(feature = "nats")]
            Kind::Nats => false,
            _ => true,
        }
    }

    async fn claim(&self, worker: &str, max: usize) -> Vec<Claimed> {
        self.queue.claim(worker, max, self.ttl).await.unwrap()
    }

    /// Claims one job, waiting (on NATS, whose server redelivers an
    /// expired message on a timer of its own) up to ten seconds for it.
    async fn claim_one_eventually(&self, worker: &str) -> Claimed {
        for _ in 0..100 {
            let mut got = self.claim(worker, 1).await;
            if let Some(c) = got.pop() {
                return c;
            }
            assert_ne!(self.kind, Kind::Memory, "nothing to claim");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no job was delivered again within ten seconds");
    }

    async fn cleanup(self) {
        #[cfg(feature = "nats")]
        if let Some(config) = &self.nats {
            support::nats::delete_streams(&[config.stream.clone(), config.dead_stream()]).await;
        }
    }
}

fn job(n: u64) -> Job {
    Job {
        run_id: RunId::new(),
        agent: json!({ "name": "hello" }),
        input: json!({ "prompt": format!("job {n}") }),
        caller: Some(format!("caller-{}", n % 2)),
        durable: n.is_multiple_of(2),
        submitted_at_ms: 1_700_000_000_000 + n,
    }
}

fn assert_lost(r: Result<(), QueueError>, lease: &JobLease, reasons: &[LostReason]) {
    match r {
        Err(QueueError::LeaseLost {
            run_id,
            fence,
            reason,
        }) => {
            assert_eq!((run_id, fence), (lease.run_id, lease.fence));
            assert!(
                reasons.contains(&reason),
                "{reason:?} is not one of {reasons:?}"
            );
        }
        other => panic!("a lost lease was not refused: {other:?}"),
    }
}

/// Runs `$case` on every battery built: `$limits` and the lease `$ttl`.
macro_rules! on_every_queue {
    ($case:ident, $limits:expr, $ttl:expr) => {
        mod $case {
            use super::*;

            #[tokio::test(start_paused = true)]
            async fn memory() {
                let bench = Bench::new(Kind::Memory, $limits, $ttl).await;
                super::$case(&bench).await;
                bench.cleanup().await;
            }

            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let bench = Bench::new(Kind::Postgres, $limits, $ttl).await;
                super::$case(&bench).await;
                bench.cleanup().await;
            }

            #[cfg(feature = "nats")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nats() {
                let bench = Bench::new(Kind::Nats, $limits, $ttl).await;
                super::$case(&bench).await;
                bench.cleanup().await;
            }
        }
    };
}

const ROOMY: QueueLimits = QueueLimits {
    max_deliver: 5,
    max_in_flight: 100,
};

on_every_queue!(submit_claim_complete, ROOMY, LONG);
async fn submit_claim_complete(b: &Bench) {
    let jobs: Vec<Job> = (0..3).map(job).collect();
    for j in &jobs {
        assert_eq!(b.queue.submit(j).await.unwrap(), Submitted::Queued);
    }
    // A submit retried (its answer lost) adds nothing.
    assert_eq!(
        b.queue.submit(&jobs[1]).await.unwrap(),
        Submitted::AlreadyQueued
    );

    let got = b.claim("w1", 10).await;
    let claimed: Vec<&Job> = got.iter().map(|c| &c.job).collect();
    assert_eq!(
        claimed,
        jobs.iter().collect::<Vec<_>>(),
        "in submission order"
    );
    for c in &got {
        assert_eq!(c.lease.run_id, c.job.run_id);
        assert_eq!(c.lease.worker, "w1");
        assert_eq!(c.lease.deliveries, 1);
        assert_eq!(c.lease.ttl, b.ttl);
    }
    let fences: HashSet<u64> = got.iter().map(|c| c.lease.fence).collect();
    assert_eq!(fences.len(), 3, "one fencing token per delivery");
    assert!(b.claim("w2", 10).await.is_empty(), "all three are held");

    for c in &got {
        b.queue.complete(&c.lease).await.unwrap();
    }
    assert!(
        b.claim("w2", 10).await.is_empty(),
        "completed jobs are gone"
    );
    assert!(b.queue.dead_letters(10).await.unwrap().is_empty());
}

on_every_queue!(two_claimers_never_hold_one_job, ROOMY, LONG);
async fn two_claimers_never_hold_one_job(b: &Bench) {
    const JOBS: u64 = 60;
    for n in 0..JOBS {
        b.queue.submit(&job(n)).await.unwrap();
    }
    // Four workers, each on its own handle (its own connection), claim
    // small batches at once until nothing is left, holding every lease.
    let mut workers = Vec::new();
    for w in 0..4 {
        let queue = b.another().await;
        let ttl = b.ttl;
        workers.push(tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let got = queue.claim(&format!("w{w}"), 3, ttl).await.unwrap();
                if got.is_empty() {
                    break;
                }
                held.extend(got);
                tokio::task::yield_now().await;
            }
            (queue, held)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.push(w.await.unwrap());
    }
    let held: Vec<&Claimed> = all.iter().flat_map(|(_, h)| h).collect();
    let ids: HashSet<RunId> = held.iter().map(|c| c.job.run_id).collect();
    assert_eq!(held.len() as u64, JOBS, "every job claimed once");
    assert_eq!(ids.len() as u64, JOBS, "no job held by two leases");
    let fences: HashSet<u64> = held.iter().map(|c| c.lease.fence).collect();
    assert_eq!(fences.len() as u64, JOBS);
    for (queue, leases) in &all {
        for c in leases {
            queue.complete(&c.lease).await.unwrap();
        }
    }
    assert!(b.claim("w0", 10).await.is_empty());
}

on_every_queue!(an_expired_lease_is_redelivered_and_fenced, ROOMY, SHORT);
async fn an_expired_lease_is_redelivered_and_fenced(b: &Bench) {
    let j = job(1);
    b.queue.submit(&j).await.unwrap();
    let mut old = b.claim("paused", 1).await.pop().unwrap().lease;
    // The holder stops (paused, cut off) past its lease.
    b.pass(b.ttl + Duration::from_millis(300)).await;
    // Expired, even before anyone took the job: refused.
    let r = b.queue.renew(&mut old).await;
    assert_lost(r, &old, &[LostReason::Expired]);

    let other = b.another().await;
    let new = b.claim_one_eventually("taker").await;
    assert_eq!(new.job, j);
    assert!(
        new.lease.fence > old.fence,
        "fence {} after {}",
        new.lease.fence,
        old.fence
    );
    assert_eq!(new.lease.deliveries, 2);

    // The old holder comes back: nothing it asks is done.
    let stale = if b.tells_superseded() {
        vec![LostReason::Superseded]
    } else {
        vec![LostReason::Expired]
    };
    let r = b.queue.renew(&mut old).await;
    assert_lost(r, &old, &stale);
    assert_lost(b.queue.complete(&old).await, &old, &stale);
    assert_lost(
        b.queue.release(&old, &ReleaseReason::Shutdown).await,
        &old,
        &stale,
    );

    // The new holder's lease stands.
    let mut lease = new.lease.clone();
    other.renew(&mut lease).await.unwrap();
    b.queue.complete(&lease).await.unwrap();
    assert!(b.claim("taker", 1).await.is_empty());
}

on_every_queue!(a_renewed_lease_holds_past_its_first_term, ROOMY, SHORT);
async fn a_renewed_lease_holds_past_its_first_term(b: &Bench) {
    b.queue.submit(&job(1)).await.unwrap();
    let mut lease = b.claim("w1", 1).await.pop().unwrap().lease;
    let first = lease.deadline;
    let two_thirds = b.ttl * 2 / 3;
    b.pass(two_thirds).await;
    b.queue.renew(&mut lease).await.unwrap();
    assert!(lease.deadline > first, "renewal moves the deadline");
    // Past the first term, inside the renewed one: nobody gets the job.
    b.pass(two_thirds).await;
    assert!(b.claim("w2", 1).await.is_empty(), "a renewed lease holds");
    b.queue.complete(&lease).await.unwrap();
}

on_every_queue!(a_released_job_is_delivered_again, ROOMY, LONG);
async fn a_released_job_is_delivered_again(b: &Bench) {
    let j = job(1);
    b.queue.submit(&j).await.unwrap();
    let mut first = b.claim("w1", 1).await.pop().unwrap().lease;
    b.queue
        .release(
            &first,
            &ReleaseReason::Failed {
                error: "its manifest does not resolve here".into(),
            },
        )
        .await
        .unwrap();
    let again = b.claim("w2", 1).await.pop().expect("delivered again");
    assert_eq!(again.job, j);
    assert_eq!(again.lease.deliveries, 2);
    assert!(again.lease.fence > first.fence);
    // The lease given back is the giver's no more.
    let r = b.queue.renew(&mut first).await;
    assert_lost(r, &first, &[LostReason::Released, LostReason::Superseded]);
    b.queue.complete(&again.lease).await.unwrap();
}

on_every_queue!(
    max_deliver_dead_letters,
    QueueLimits {
        max_deliver: 2,
        max_in_flight: 100,
    },
    LONG
);
async fn max_deliver_dead_letters(b: &Bench) {
    let poison = job(1);
    let fine = job(2);
    b.queue.submit(&poison).await.unwrap();
    b.queue.submit(&fine).await.unwrap();
    let mut fine_lease = None;
    for delivery in 1..=2 {
        for c in b.claim("w1", 2).await {
            if c.job == poison {
                assert_eq!(c.lease.deliveries, delivery);
                b.queue
                    .release(&c.lease, &ReleaseReason::Busy)
                    .await
                    .unwrap();
            } else {
                fine_lease = Some(c.lease);
            }
        }
    }
    // The third delivery would exceed max_deliver: dead-lettered instead.
    assert!(b.claim("w1", 10).await.is_empty());
    let dead = b.queue.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].job, poison);
    assert_eq!(dead[0].reason, DeadReason::MaxDeliveries { deliveries: 2 });
    assert!(b.claim("w2", 10).await.is_empty(), "never delivered again");
    // The other job was untouched by it.
    b.queue.complete(&fine_lease.unwrap()).await.unwrap();
}

on_every_queue!(
    the_in_flight_cap_holds_over_workers,
    QueueLimits {
        max_deliver: 5,
        max_in_flight: 2,
    },
    LONG
);
async fn the_in_flight_cap_holds_over_workers(b: &Bench) {
    for n in 0..5 {
        b.queue.submit(&job(n)).await.unwrap();
    }
    let other = b.another().await;
    let first = b.claim("w1", 10).await;
    assert_eq!(first.len(), 2, "capped at two in flight");
    assert!(other.claim("w2", 10, b.ttl).await.unwrap().is_empty());
    b.queue.complete(&first[0].lease).await.unwrap();
    let second = other.claim("w2", 10, b.ttl).await.unwrap();
    assert_eq!(second.len(), 1, "one slot freed");
    b.queue
        .release(&first[1].lease, &ReleaseReason::Shutdown)
        .await
        .unwrap();
    let third = b.claim("w1", 10).await;
    assert_eq!(third.len(), 1, "a released lease frees its slot");
    let mut done = 1;
    for c in second.iter().chain(&third) {
        b.queue.complete(&c.lease).await.unwrap();
        done += 1;
    }
    // The rest, two at a time.
    while done < 5 {
        let got = b.claim("w1", 10).await;
        assert!(!got.is_empty() && got.len() <= 2);
        for c in got {
            b.queue.complete(&c.lease).await.unwrap();
            done += 1;
        }
    }
    assert!(b.claim("w1", 10).await.is_empty());
}

/// NATS: a stream or consumer set up otherwise than the queue creates it
/// is refused by name, not used.
#[cfg(feature = "nats")]
mod nats_settings {
    use agentvisor::stores::{NatsQueue, NatsQueueConfig};
    use async_nats::jetstream::stream;

    use super::*;

    #[tokio::test]
    async fn a_stream_that_could_drop_runs_is_refused() {
        let name = support::nats::fresh_stream().await;
        let config = NatsQueueConfig::new(support::nats::server_url(), name.clone());
        // Another program's stream of that name: limits retention, an age.
        support::nats::create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![config.subject()],
            max_age: Duration::from_secs(3600),
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await;
        let e = NatsQueue::connect(config.clone()).await.unwrap_err();
        support::nats::delete_streams(&[name, config.dead_stream()]).await;
        match e {
            QueueError::Misconfigured { field, .. } => assert_eq!(field, "retention"),
            other => panic!("not refused: {other}"),
        }
    }

    #[tokio::test]
    async fn a_consumer_with_another_lease_is_refused() {
        let name = support::nats::fresh_stream().await;
        let config = NatsQueueConfig::new(support::nats::server_url(), name.clone());
        let queue = NatsQueue::connect(config.clone()).await.unwrap();
        // A second worker, started with another lease duration.
        let mut other = config.clone();
        other.lease_ttl = Duration::from_secs(90);
        let e = NatsQueue::connect(other).await.unwrap_err();
        // And a claim that asks for another lease than the consumer's.
        let asked = queue.claim("w1", 1, Duration::from_secs(5)).await;
        support::nats::delete_streams(&[name, config.dead_stream()]).await;
        let text = e.to_string();
        assert!(
            matches!(
                e,
                QueueError::Misconfigured {
                    field: "ack_wait",
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("ack_wait is 30s"), "{text}");
        assert!(matches!(asked, Err(QueueError::Unsupported(_))));
    }
}
