//! The one retry layer: a [`ChatModel`] wrapper that retries what may
//! succeed on a second try (M4).
//!
//! # Rules
//!
//! - **What is retried**: [`ModelError::is_retryable`] — a 429, a
//!   408/409/5xx/529, a connection that failed before any content. Never a
//!   quota error, a 400/401/403/413, an unreadable response, an open circuit
//!   or a stream that already delivered text (`Interrupted`).
//! - **How long it waits**: the server's `retry-after-ms` / `retry-after`
//!   when it sent one (plus up to 10 % jitter, at most 1 s), else jittered
//!   exponential backoff: attempt `n` waits a uniform time in
//!   `[b/2, b]` with `b = min(max_delay, base_delay × 2ⁿ)`.
//! - **Never past the deadline**: when the request carries the run's
//!   deadline and the wait would end at or after it, the error is returned
//!   at once instead.
//! - **The endpoint's error wins**: when the circuit breaker inside opens
//!   under these retries, the call fails with the last endpoint error
//!   (`server_error`, …), not `circuit_open`; later runs are refused with
//!   `circuit_open` at admission.
//! - **Seen by the critic**: before each sleep, the request's `on_retry`
//!   hook is called with the error and the wait (the run makes it a
//!   heartbeat and a `model.retry` event).
//!
//! Sleeps are `tokio::time` sleeps (paused-time tests drive them), and the
//! wrapper is cancel-safe: dropping the call drops the sleep or the attempt.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, ModelWrapper};

/// How the retry layer retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 3).
    pub max_retries: u32,
    /// The first backoff's upper bound (default 500 ms).
    pub base_delay: Duration,
    /// The largest backoff (default 30 s); a server's `retry-after` is
    /// honoured even when larger.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `attempt` (0-based) after `error`.
    pub fn delay(&self, attempt: u32, error: &ModelError) -> Duration {
        if let Some(hint) = error.retry_after() {
            let spread = (hint / 10).min(Duration::from_secs(1));
            return hint + spread.mul_f64(unit_random());
        }
        let factor = 2u32.saturating_pow(attempt.min(20));
        let ceiling = self.base_delay.saturating_mul(factor).min(self.max_delay);
        let half = ceiling / 2;
        half + half.mul_f64(unit_random())
    }
}

/// A uniform number in `[0, 1)`, from std's per-instance random hash keys
/// (jitter needs spread, not cryptographic quality).
fn unit_random() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x9e37_79b9_7f4a_7c15);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// A [`ChatModel`] that retries its inner model's retryable errors.
pub struct Retrying {
    inner: Arc<dyn ChatModel>,
    policy: RetryPolicy,
}

impl Retrying {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ChatModel>, policy: RetryPolicy) -> Self {
        Retrying { inner, policy }
    }
}

/// Forwards every capability but one: it reports the retries it makes.
#[async_trait]
impl ModelWrapper for Retrying {
    fn inner(&self) -> &dyn ChatModel {
        &*self.inner
    }

    fn reports_retries(&self) -> bool {
        true
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let mut attempt = 0;
        let mut last: Option<ModelError> = None;
        loop {
            let error = match self.inner.complete(request.clone()).await {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            // A circuit that opened under our own retries: the run ends
            // with the endpoint's error, which says more.
            if let (ModelError::CircuitOpen(_), Some(previous)) = (&error, last.take()) {
                return Err(previous);
            }
            if !error.is_retryable() || attempt >= self.policy.max_retries {
                return Err(error);
            }
            let delay = self.policy.delay(attempt, &error);
            if let Some(deadline) = request.deadline {
                if tokio::time::Instant::now() + delay >= deadline {
                    return Err(error);
                }
            }
            // An event on the call's span (`chat {model}`, with the `otel`
            // feature), named like the run's event.
            tracing::info!(
                kind = error.kind(),
                delay_ms = delay.as_millis() as i64,
                attempt = i64::from(attempt),
                "model.retry"
            );
            crate::telemetry::retried(self.inner.name(), error.kind());
            if let Some(hook) = &request.on_retry {
                hook(&error, delay);
            }
            tokio::time::sleep(delay).await;
            last = Some(error);
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_honours_hints() {
        let p = RetryPolicy::default();
        let server = ModelError::Server {
            status: 503,
            message: String::new(),
        };
        for attempt in 0..8 {
            let ceiling = (p.base_delay * 2u32.pow(attempt)).min(p.max_delay);
            for _ in 0..50 {
                let d = p.delay(attempt, &server);
                assert!(d >= ceiling / 2 && d <= ceiling, "{attempt}: {d:?}");
            }
        }
        let limited = ModelError::RateLimited {
            retry_after: Some(Duration::from_secs(4)),
        };
        for _ in 0..50 {
            let d = p.delay(0, &limited);
            assert!(
                d >= Duration::from_secs(4) && d <= Duration::from_millis(4400),
                "{d:?}"
            );
        }
        let spread: std::collections::HashSet<Duration> =
            (0..20).map(|_| p.delay(3, &server)).collect();
        assert!(spread.len() > 10, "jitter spreads the waits");
    }
}
