//! The circuit breaker (R7): one per provider endpoint + model, shared by
//! every agent and run of a host that calls it.
//!
//! # States
//!
//! - **Closed**: calls go through; consecutive endpoint failures
//!   ([`ModelError::is_endpoint_failure`]: 429, quota, 5xx, transport,
//!   unreadable responses) are counted, and any answer that shows the
//!   endpoint alive (a success, a 400, a 401) resets the count. At
//!   `failures` in a row the circuit opens.
//! - **Open** for `cool_down`: calls fail at once with `CircuitOpen`, and
//!   [`ChatModel::admit`] refuses new runs, which the host ends `rejected`
//!   with `error_kind` `circuit_open` before any actor exists.
//! - **Half-open** once the cool-down has passed: exactly one call goes
//!   through as a trial (others are refused meanwhile). Its success closes
//!   the circuit; its failure opens it for another cool-down; a trial that
//!   is dropped (its run was killed) lets the next call try.
//!
//! # A request's fault is not the endpoint's
//!
//! A 500 that answers the same request shape (the roles and kinds of its
//! messages, its tools, whether it asks for a schema) with the same message
//! again, from an endpoint that has just answered other calls, is the
//! request's fault (a server that chokes on something it was sent), not a
//! sign the endpoint is down: the repeat is not counted. The first such 500
//! counts; a 500 for another shape counts and stops the endpoint from
//! passing as healthy, so a server that fails every request still opens.
//!
//! The state is one small mutex held for a few instructions; time is
//! `tokio::time`, so paused-time tests drive the cool-down. Retries sit
//! outside the breaker (`Retrying(CircuitBreaking(provider))`): each attempt
//! counts, and once the circuit opens the retry layer stops, as
//! `CircuitOpen` is not retryable.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError, ModelWrapper};

/// When a breaker opens and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Consecutive endpoint failures that open the circuit (default 5).
    pub failures: u32,
    /// How long it stays open before a trial (default 30 s).
    pub cool_down: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            failures: 5,
            cool_down: Duration::from_secs(30),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// The trial call is in flight.
    HalfOpen,
}

/// The observable state of a breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitState {
    /// Calls go through.
    Closed,
    /// Calls are refused.
    Open,
    /// One trial call is in flight.
    HalfOpen,
}

/// One endpoint + model's breaker.
#[derive(Debug)]
pub struct Breaker {
    label: String,
    policy: BreakerPolicy,
    state: Mutex<State>,
    suspects: Mutex<Suspects>,
}

/// What tells a request's fault from the endpoint's (see the module doc).
#[derive(Debug, Default)]
struct Suspects {
    /// The shape and message of the last 500.
    last: Option<u64>,
    /// A call succeeded since a 500 of another shape.
    healthy: bool,
}

impl Breaker {
    /// A closed breaker; `label` names the circuit in errors (never a URL
    /// with credentials: the model's name).
    pub fn new(label: impl Into<String>, policy: BreakerPolicy) -> Self {
        Breaker {
            label: label.into(),
            policy,
            state: Mutex::new(State::Closed { failures: 0 }),
            suspects: Mutex::new(Suspects::default()),
        }
    }

    fn suspects(&self) -> MutexGuard<'_, Suspects> {
        self.suspects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a 500 with this shape-and-message `key` is a repeat of the
    /// last one from an endpoint that answers other calls (then it is not
    /// counted); remembers it either way.
    fn request_fault(&self, key: u64) -> bool {
        let mut s = self.suspects();
        let repeat = s.last == Some(key) && s.healthy;
        if s.last != Some(key) && s.last.is_some() {
            s.healthy = false;
        }
        s.last = Some(key);
        repeat
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open_error(&self) -> ModelError {
        ModelError::CircuitOpen(self.label.clone())
    }

    /// The current state (an open circuit past its cool-down reads as
    /// half-open: the next call is its trial).
    pub fn state(&self) -> CircuitState {
        match *self.lock() {
            State::Closed { .. } => CircuitState::Closed,
            State::Open { until } if Instant::now() < until => CircuitState::Open,
            State::Open { .. } | State::HalfOpen => CircuitState::HalfOpen,
        }
    }

    /// Whether a new run may start (no state change).
    pub fn admit(&self) -> Result<(), ModelError> {
        match *self.lock() {
            State::Closed { .. } => Ok(()),
            State::Open { until } if Instant::now() >= until => Ok(()),
            State::Open { .. } | State::HalfOpen => Err(self.open_error()),
        }
    }

    /// Lets a call through, or refuses it; the permit records the outcome.
    fn enter(self: &Arc<Self>) -> Result<Permit, ModelError> {
        let mut s = self.lock();
        let trial = match *s {
            State::Closed { .. } => false,
            State::Open { until } if Instant::now() >= until => {
                *s = State::HalfOpen;
                true
            }
            State::Open { .. } | State::HalfOpen => return Err(self.open_error()),
        };
        Ok(Permit {
            breaker: self.clone(),
            trial,
            settled: false,
        })
    }

    fn settle(&self, trial: bool, healthy: bool) {
        let mut s = self.lock();
        let open = State::Open {
            until: Instant::now() + self.policy.cool_down,
        };
        *s = match (*s, healthy) {
            (_, true) if trial => State::Closed { failures: 0 },
            (State::Closed { .. }, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) => {
                let failures = failures + 1;
                if failures >= self.policy.failures.max(1) {
                    tracing::warn!(circuit = %self.label, failures, "circuit opened");
                    open
                } else {
                    State::Closed { failures }
                }
            }
            (State::HalfOpen, false) if trial => {
                tracing::warn!(circuit = %self.label, "trial failed; circuit open again");
                open
            }
            // A call that started before the circuit opened says nothing new.
            (other, _) => other,
        };
        let state = match *s {
            State::Closed { .. } => 0,
            State::HalfOpen => 1,
            State::Open { .. } => 2,
        };
        crate::telemetry::breaker(&self.label, state);
    }
}

/// A call let through; records its outcome once, or on drop (a cancelled
/// trial hands the trial to the next call).
struct Permit {
    breaker: Arc<Breaker>,
    trial: bool,
    settled: bool,
}

impl Permit {
    fn settle(mut self, healthy: bool) {
        self.settled = true;
        self.breaker.settle(self.trial, healthy);
    }

    /// The call failed for its own reasons: no failure is counted (a
    /// trial's endpoint answered, so the circuit closes).
    fn settle_neutral(mut self) {
        self.settled = true;
        if self.trial {
            self.breaker.settle(true, true);
        }
    }
}

/// A hash of what a request is made of, not what it says: each message's
/// role, whether its text is empty, its tool calls and attachments; the
/// tools offered; whether a schema is asked for.
fn shape_of(request: &ChatRequest) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in request.messages.iter() {
        (m.role as u8).hash(&mut h);
        m.content.is_empty().hash(&mut h);
        m.tool_calls.len().hash(&mut h);
        m.tool_call_id.is_some().hash(&mut h);
        m.attachments.len().hash(&mut h);
    }
    for t in request.tools.iter() {
        t.name.hash(&mut h);
    }
    request.response_schema.is_some().hash(&mut h);
    h.finish()
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.settled && self.trial {
            let mut s = self.breaker.lock();
            if *s == State::HalfOpen {
                *s = State::Open {
                    until: Instant::now(),
                };
            }
        }
    }
}

/// A [`ChatModel`] behind a [`Breaker`].
pub struct CircuitBreaking {
    inner: Arc<dyn ChatModel>,
    breaker: Arc<Breaker>,
}

impl CircuitBreaking {
    /// Puts `inner` behind `breaker` (which may be shared).
    pub fn new(inner: Arc<dyn ChatModel>, breaker: Arc<Breaker>) -> Self {
        CircuitBreaking { inner, breaker }
    }

    /// The breaker.
    pub fn breaker(&self) -> &Arc<Breaker> {
        &self.breaker
    }
}

/// Forwards every capability; admission asks the breaker first.
#[async_trait]
impl ModelWrapper for CircuitBreaking {
    fn inner(&self) -> &dyn ChatModel {
        &*self.inner
    }

    fn admit(&self) -> Result<(), ModelError> {
        self.breaker.admit()?;
        self.inner.admit()
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let permit = self.breaker.enter()?;
        let shape = shape_of(&request);
        let result = self.inner.complete(request).await;
        match &result {
            Ok(_) => {
                self.breaker.suspects().healthy = true;
                permit.settle(true);
            }
            Err(ModelError::Server {
                status: 500,
                message,
            }) => {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                shape.hash(&mut h);
                message.hash(&mut h);
                if self.breaker.request_fault(h.finish()) {
                    tracing::debug!(circuit = %self.breaker.label, "a repeated 500 for one request shape is not counted");
                    permit.settle_neutral();
                } else {
                    permit.settle(false);
                }
            }
            Err(e) => permit.settle(!e.is_endpoint_failure()),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(b: &Arc<Breaker>) {
        if let Ok(p) = b.enter() {
            p.settle(false);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_failures_then_half_opens_for_one_trial() {
        let b = Arc::new(Breaker::new(
            "m",
            BreakerPolicy {
                failures: 3,
                cool_down: Duration::from_secs(10),
            },
        ));
        fail(&b);
        fail(&b);
        b.enter().map(|p| p.settle(true)).ok();
        fail(&b);
        fail(&b);
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "a success resets the count"
        );
        fail(&b);
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.admit().map_err(|e| e.kind()), Err("circuit_open"));
        assert!(b.enter().is_err());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(b.admit().is_ok());
        let trial = b.enter().ok();
        assert!(trial.is_some());
        assert!(b.enter().is_err(), "one trial at a time");
        assert!(b.admit().is_err());
        drop(trial);
        let trial = b.enter().ok();
        assert!(trial.is_some(), "a dropped trial hands over");
        if let Some(t) = trial {
            t.settle(false);
        }
        assert_eq!(b.state(), CircuitState::Open);
        tokio::time::advance(Duration::from_secs(10)).await;
        if let Ok(t) = b.enter() {
            t.settle(true);
        }
        assert_eq!(b.state(), CircuitState::Closed);
    }
}
