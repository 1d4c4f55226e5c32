#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The retry layer and the circuit breaker in paused time (M4, R7): the
//! server's `retry-after` is honoured, no wait passes the run's deadline,
//! each retry is a heartbeat the critic sees (a run that retries for longer
//! than its stall timeout is not `stalled`) and a `model.retry` event, and
//! an open circuit rejects runs at admission until its cool-down passes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, RetrySink};
use agentvisor::providers::{Breaker, BreakerPolicy, CircuitBreaking, RetryPolicy, Retrying};
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, KillReason, RunEvent, RunStatus};
use async_trait::async_trait;
use tokio::time::Instant;

/// Fails with its queued errors (each after `latency`), then answers "ok".
struct Flaky {
    errors: Mutex<VecDeque<ModelError>>,
    latency: Duration,
    calls: AtomicUsize,
}

impl Flaky {
    fn new(errors: Vec<ModelError>) -> Arc<Self> {
        Arc::new(Flaky {
            errors: Mutex::new(errors.into()),
            latency: Duration::ZERO,
            calls: AtomicUsize::new(0),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ChatModel for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }

    async fn complete(&self, _request: ChatRequest) -> Result<ChatResponse, ModelError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let next = self.errors.lock().unwrap().pop_front();
        match next {
            Some(e) => Err(e),
            None => Ok(ChatResponse {
                text: "ok".into(),
                ..Default::default()
            }),
        }
    }
}

fn limited(after: Duration) -> ModelError {
    ModelError::RateLimited {
        retry_after: Some(after),
    }
}

fn server() -> ModelError {
    ModelError::Server {
        status: 503,
        message: "unavailable".into(),
    }
}

fn request() -> ChatRequest {
    ChatRequest::new(Arc::default(), Arc::from(Vec::new()), 0)
}

fn hook() -> (RetrySink, Arc<Mutex<Vec<Duration>>>) {
    let log: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let l = log.clone();
    (
        Arc::new(move |_: &ModelError, d: Duration| l.lock().unwrap().push(d)),
        log,
    )
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_between_attempts() {
    let flaky = Flaky::new(vec![
        limited(Duration::from_secs(7)),
        limited(Duration::from_secs(7)),
    ]);
    let retrying = Retrying::new(flaky.clone(), RetryPolicy::default());
    let (on_retry, log) = hook();
    let mut req = request();
    req.on_retry = Some(on_retry);
    let t0 = Instant::now();
    let r = retrying.complete(req).await.unwrap();
    assert_eq!(r.text, "ok");
    assert_eq!(flaky.calls(), 3);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_secs(14), "{waited:?}");
    assert!(waited <= Duration::from_millis(15_400), "{waited:?}");
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 2);
    assert!(log.iter().all(|d| *d >= Duration::from_secs(7)));
}

#[tokio::test(start_paused = true)]
async fn no_wait_passes_the_deadline_and_unretryable_errors_return_at_once() {
    let flaky = Flaky::new(vec![limited(Duration::from_secs(30))]);
    let retrying = Retrying::new(flaky.clone(), RetryPolicy::default());
    let (on_retry, log) = hook();
    let mut req = request();
    req.on_retry = Some(on_retry);
    req.deadline = Some(Instant::now() + Duration::from_secs(10));
    let t0 = Instant::now();
    let e = retrying.complete(req).await.unwrap_err();
    assert_eq!(e.kind(), "rate_limited");
    assert_eq!(t0.elapsed(), Duration::ZERO, "gave up without sleeping");
    assert!(log.lock().unwrap().is_empty());
    assert_eq!(flaky.calls(), 1);

    // Backoff (no hint) stops once the next wait would pass the deadline.
    let flaky = Flaky::new(vec![server(); 20]);
    let policy = RetryPolicy {
        max_retries: 20,
        base_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(8),
    };
    let retrying = Retrying::new(flaky.clone(), policy);
    let mut req = request();
    req.deadline = Some(Instant::now() + Duration::from_secs(12));
    let t0 = Instant::now();
    let e = retrying.complete(req).await.unwrap_err();
    assert_eq!(e.kind(), "server_error");
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    assert!(
        flaky.calls() >= 3 && flaky.calls() < 20,
        "{}",
        flaky.calls()
    );

    for e in [
        ModelError::Quota("out".into()),
        ModelError::Auth,
        ModelError::BadRequest("no".into()),
        ModelError::Malformed("?".into()),
        ModelError::Interrupted(Box::new(server())),
    ] {
        let flaky = Flaky::new(vec![e.clone()]);
        let retrying = Retrying::new(flaky.clone(), RetryPolicy::default());
        assert_eq!(retrying.complete(request()).await.unwrap_err(), e);
        assert_eq!(flaky.calls(), 1, "{e:?} is not retried");
    }
}

async fn host_with(name: &str, model: Arc<dyn ChatModel>) -> Host {
    Host::builder()
        .config(HostConfig {
            critic_shards: 1,
            ..HostConfig::default()
        })
        .model(name, model)
        .build()
        .await
        .unwrap()
}

fn spec(model: &str, limits: &str) -> AgentSpec {
    AgentSpec::from_yaml(&format!(
        "name: r\nmodel: {model}\nlimits: {{ {limits} }}\n"
    ))
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn each_retry_is_a_heartbeat_so_a_retrying_run_is_not_stalled() {
    // Three 1.5 s waits: 4.5 s in the model call, with a 2 s stall timeout.
    let flaky = Flaky::new(vec![limited(Duration::from_millis(1500)); 3]);
    let host = host_with(
        "flaky",
        Arc::new(Retrying::new(flaky.clone(), RetryPolicy::default())),
    )
    .await;
    let (handle, mut events) = host
        .submit_streaming(
            spec("flaky", "stall_timeout: 2s, max_runtime: 60s"),
            Invocation::prompt("hi"),
        )
        .await
        .unwrap();
    let mut retries = Vec::new();
    while let Some(e) = events.next().await.map(|e| e.event) {
        if let RunEvent::ModelRetry {
            iteration,
            kind,
            delay_ms,
            ..
        } = e
        {
            retries.push((iteration, kind, delay_ms));
        }
    }
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{:?} {:?}", r.kill_reason, r.error);
    assert_eq!(flaky.calls(), 4);
    assert_eq!(retries.len(), 3);
    assert!(retries
        .iter()
        .all(|(i, k, d)| *i == 1 && k == "rate_limited" && *d >= 1500));
    let audited = host.audit_store().run_records(r.run_id).await.unwrap();
    let recorded = audited
        .iter()
        .filter(|rec| format!("{:?}", rec.entry).contains("ModelRetry"))
        .count();
    assert_eq!(recorded, 3, "retries are on record");

    // The same 4.5 s spent silently in one call is a stall.
    let silent = Arc::new(Flaky {
        errors: Mutex::new(VecDeque::new()),
        latency: Duration::from_millis(4500),
        calls: AtomicUsize::new(0),
    });
    let host2 = host_with("silent", silent).await;
    let r = host2
        .execute(
            spec("silent", "stall_timeout: 2s, max_runtime: 60s"),
            Invocation::prompt("hi"),
        )
        .await
        .unwrap();
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    host.shutdown().await;
    host2.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_hint_past_the_runs_deadline_ends_the_run_with_the_error_not_a_timeout() {
    let flaky = Flaky::new(vec![limited(Duration::from_secs(300))]);
    let host = host_with(
        "flaky",
        Arc::new(Retrying::new(flaky.clone(), RetryPolicy::default())),
    )
    .await;
    let t0 = Instant::now();
    let r = host
        .execute(spec("flaky", "max_runtime: 5s"), Invocation::prompt("hi"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.error_kind.as_deref(), Some("rate_limited"));
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_rejects_runs_until_a_trial_succeeds() {
    let flaky = Flaky::new(vec![server(), server()]);
    let breaker = Arc::new(Breaker::new(
        "flaky",
        BreakerPolicy {
            failures: 2,
            cool_down: Duration::from_secs(30),
        },
    ));
    let guarded = Arc::new(CircuitBreaking::new(flaky.clone(), breaker));
    let host = host_with("flaky", guarded).await;
    let s = spec("flaky", "max_runtime: 60s");
    for _ in 0..2 {
        let r = host
            .execute(s.clone(), Invocation::prompt("hi"))
            .await
            .unwrap();
        assert_eq!(r.error_kind.as_deref(), Some("server_error"));
    }
    let r = host
        .execute(s.clone(), Invocation::prompt("hi"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Rejected);
    assert_eq!(r.error_kind.as_deref(), Some("circuit_open"));
    assert_eq!(flaky.calls(), 2, "rejected before any model call");
    tokio::time::advance(Duration::from_secs(30)).await;
    let r = host
        .execute(s.clone(), Invocation::prompt("hi"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "the half-open trial goes through");
    let r = host.execute(s, Invocation::prompt("hi")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "and closes the circuit");
    assert_eq!(flaky.calls(), 4);
    host.shutdown().await;
}
