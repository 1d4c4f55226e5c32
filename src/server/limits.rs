//! What keeps one client from taking the server: a per-caller request rate
//! (a token bucket), a cap on event-stream subscribers per run, and the
//! bounded memory of idempotency keys.
//!
//! Times are `tokio::time` instants, so paused-time tests drive them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::RunId;

/// The longest wait a refusal names (however low the rate: `1e-300` per
/// second would be a wait no `Duration` holds).
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// A per-caller token bucket: `rate` requests per second on average,
/// `burst` at once.
pub(crate) struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: DashMap<Arc<str>, (f64, Instant)>,
}

impl RateLimiter {
    /// `rate` per second (0 or less: no limit; NaN is taken as the lowest
    /// rate, not as none), `burst` at once. `agentvisor serve` refuses a
    /// `--rate-limit` outside 0 and 0.001 to 1000000 before it gets here.
    pub(crate) fn new(rate: f64, burst: f64) -> Self {
        RateLimiter {
            rate: if rate.is_nan() {
                f64::MIN_POSITIVE
            } else {
                rate
            },
            burst: burst.max(1.0),
            buckets: DashMap::new(),
        }
    }

    /// Takes one request from `caller`'s bucket, or says how long until
    /// one is there.
    pub(crate) fn take(&self, caller: &Arc<str>) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut entry = self
            .buckets
            .entry(caller.clone())
            .or_insert((self.burst, now));
        let (tokens, at) = &mut *entry;
        let refill = now.saturating_duration_since(*at).as_secs_f64() * self.rate;
        *tokens = (*tokens + refill).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            let wait = Duration::try_from_secs_f64((1.0 - *tokens) / self.rate);
            Err(wait.map_or(MAX_WAIT, |w| w.min(MAX_WAIT)))
        }
    }
}

/// How many event-stream subscribers each run has, capped.
pub(crate) struct StreamCaps {
    cap: usize,
    counts: Arc<DashMap<RunId, usize>>,
}

/// One subscriber's place; dropping it frees the place.
pub(crate) struct StreamSlot {
    run_id: RunId,
    counts: Arc<DashMap<RunId, usize>>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.counts.remove_if_mut(&self.run_id, |_, n| {
            *n -= 1;
            *n == 0
        });
    }
}

impl StreamCaps {
    pub(crate) fn new(cap: usize) -> Self {
        StreamCaps {
            cap,
            counts: Arc::default(),
        }
    }

    /// A place among `run_id`'s subscribers, `None` when they are `cap`.
    pub(crate) fn join(&self, run_id: RunId) -> Option<StreamSlot> {
        let mut n = self.counts.entry(run_id).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            run_id,
            counts: self.counts.clone(),
        })
    }
}

/// The runs started under idempotency keys, per caller: the same key from
/// the same caller gets the same run. Bounded: the oldest keys are
/// forgotten past `cap`.
pub(crate) struct IdempotencyKeys {
    cap: usize,
    map: DashMap<(Arc<str>, String), Arc<OnceCell<RunId>>>,
    order: Mutex<VecDeque<(Arc<str>, String)>>,
}

impl IdempotencyKeys {
    pub(crate) fn new(cap: usize) -> Self {
        IdempotencyKeys {
            cap: cap.max(1),
            map: DashMap::new(),
            order: Mutex::new(VecDeque::new()),
        }
    }

    /// The cell that holds (or will hold) the run of `key` for `caller`.
    pub(crate) fn cell(&self, caller: &Arc<str>, key: &str) -> Arc<OnceCell<RunId>> {
        let k = (caller.clone(), key.to_string());
        if let Some(c) = self.map.get(&k) {
            return c.clone();
        }
        let mut fresh = false;
        let cell = self
            .map
            .entry(k.clone())
            .or_insert_with(|| {
                fresh = true;
                Arc::new(OnceCell::new())
            })
            .clone();
        if fresh {
            let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
            order.push_back(k);
            while order.len() > self.cap {
                if let Some(old) = order.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
        cell
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_refills_at_its_rate() {
        let r = RateLimiter::new(2.0, 2.0);
        let a: Arc<str> = Arc::from("a");
        assert!(r.take(&a).is_ok());
        assert!(r.take(&a).is_ok());
        let wait = r.take(&a).unwrap_err();
        assert!(wait <= Duration::from_millis(500) && wait > Duration::ZERO);
        // Another caller has its own bucket.
        assert!(r.take(&Arc::from("b")).is_ok());
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(r.take(&a).is_ok());
        assert!(r.take(&a).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_too_low_for_a_duration_refuses_without_panicking() {
        for rate in [1e-300, f64::MIN_POSITIVE, f64::NAN] {
            let r = RateLimiter::new(rate, 1.0);
            let a: Arc<str> = Arc::from("a");
            assert!(r.take(&a).is_ok(), "{rate}");
            assert_eq!(r.take(&a), Err(MAX_WAIT), "{rate}");
        }
    }

    #[test]
    fn stream_slots_are_capped_and_freed() {
        let caps = StreamCaps::new(2);
        let id = RunId(7);
        let a = caps.join(id).unwrap();
        let _b = caps.join(id).unwrap();
        assert!(caps.join(id).is_none());
        drop(a);
        assert!(caps.join(id).is_some());
    }

    #[test]
    fn idempotency_keys_are_per_caller_and_bounded() {
        let keys = IdempotencyKeys::new(2);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let c1 = keys.cell(&a, "k");
        assert!(Arc::ptr_eq(&c1, &keys.cell(&a, "k")));
        assert!(!Arc::ptr_eq(&c1, &keys.cell(&b, "k")));
        keys.cell(&a, "k2");
        // "a/k" was the oldest: forgotten.
        assert!(!Arc::ptr_eq(&c1, &keys.cell(&a, "k")));
    }
}
