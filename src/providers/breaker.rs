//! The circuit breaker (R7): one per provider endpoint + model, shared by
//! every agent and run of a host that calls it.
//!
//! # States
//!
//! - **Closed**: calls go through; consecutive failures of the endpoint
//!   (see below) are counted, and any answer that shows the endpoint alive
//!   (a success, a 400, a 401) resets the count. At `failures` in a row the
//!   circuit opens.
//! - **Open** for `cool_down`: calls fail at once with `CircuitOpen`, and
//!   [`ChatModel::admit`] refuses new runs, which the host ends `rejected`
//!   with `error_kind` `circuit_open` before any actor exists.
//! - **Half-open** once the cool-down has passed: exactly one call goes
//!   through as a trial (others are refused meanwhile). Its success closes
//!   the circuit; its failure opens it for another cool-down; a trial that
//!   is dropped (its run was killed) lets the next call try.
//!
//! # The endpoint's fault, not a request's
//!
//! The circuit is the endpoint's: it opens only for failures that say the
//! endpoint itself is down, never for a request the endpoint answers badly
//! (one agent's request must not get every other agent on the server
//! refused). Each failure is weighed by [`ModelError::blame`]:
//!
//! - **The endpoint's** — the connection refused, reset or timed out, a
//!   408, 502, 503, 504 or 529, a rate limit, an exhausted quota: counted.
//! - **Maybe the request's** — any other 5xx (a 500 that chokes on
//!   something it was sent), a 200 whose body was empty or ended early,
//!   an answer that could not be read: remembered by the request's
//!   *shape* (below), and counted only once failures of two shapes or more
//!   have come with no healthy answer in between — the endpoint fails
//!   whatever it is asked, as a server that answers 500 to everything does.
//!   Then every failure of that streak counts at once. One shape that
//!   keeps failing never opens the circuit: requests of other shapes still
//!   go through (the retry layer bounds how often the failing one is
//!   tried).
//! - **No one's** — a refused request or key: the endpoint is alive.
//!
//! A request's **shape** is what a server may choke on whatever the words
//! say: its tools (their names) and its `tool_choice`, whether it would
//! stream (it has a listener or an observer), whether it asks for a
//! schema, and for each message its role, whether its text is empty, its
//! tool calls, whether it answers one, its attachments. Two runs of one
//! agent at the same step share a shape; a plain question and a turn that
//! carries a tool result do not, nor do a request with tools and
//! `tool_choice: auto` and one without tools.
//!
//! The state is two small mutexes held for a few instructions; time is
//! `tokio::time`, so paused-time tests drive the cool-down. Retries sit
//! outside the breaker (`Retrying(CircuitBreaking(provider))`): each attempt
//! counts, and once the circuit opens the retry layer stops, as
//! `CircuitOpen` is not retryable.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::ports::model::{
    Blame, ChatModel, ChatRequest, ChatResponse, ModelError, ModelWrapper, ToolChoice,
};

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

/// The failures that may be requests' faults, since the last healthy
/// answer (see the module doc).
#[derive(Debug, Default)]
struct Suspects {
    /// The distinct shapes that failed (a few are enough to tell).
    shapes: Vec<u64>,
    /// How many such failures.
    failures: u32,
}

/// How a call ended, as the breaker counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The endpoint answered (a success, a refusal).
    Healthy,
    /// The endpoint failed.
    EndpointFailure,
    /// A failure that may be this shape's fault.
    RequestFailure(u64),
}

/// How many distinct failing shapes a streak remembers.
const SHAPES_KEPT: usize = 4;

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

    /// How many endpoint failures `outcome` adds: 0 for a healthy answer or
    /// a failure of one shape only; for a request failure that makes the
    /// streak span two shapes, the whole streak.
    fn weigh(&self, outcome: Outcome) -> u32 {
        let mut s = self.suspects();
        match outcome {
            Outcome::Healthy => {
                *s = Suspects::default();
                0
            }
            Outcome::EndpointFailure => 1,
            Outcome::RequestFailure(shape) => {
                let before = s.shapes.len();
                if !s.shapes.contains(&shape) && s.shapes.len() < SHAPES_KEPT {
                    s.shapes.push(shape);
                }
                s.failures = s.failures.saturating_add(1);
                match (before, s.shapes.len()) {
                    (_, 0 | 1) => 0,
                    (1, 2) => s.failures,
                    _ => 1,
                }
            }
        }
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

    /// Records how a call ended: `failures` endpoint failures (see
    /// [`weigh`](Self::weigh)); 0 is a healthy answer.
    fn settle(&self, trial: bool, failures: u32) {
        let mut s = self.lock();
        let open = State::Open {
            until: Instant::now() + self.policy.cool_down,
        };
        *s = match (*s, failures) {
            (_, 0) if trial => State::Closed { failures: 0 },
            (State::Closed { .. }, 0) => State::Closed { failures: 0 },
            (State::Closed { failures: before }, more) => {
                let failures = before.saturating_add(more);
                if failures >= self.policy.failures.max(1) {
                    tracing::warn!(circuit = %self.label, failures, "circuit opened");
                    open
                } else {
                    State::Closed { failures }
                }
            }
            (State::HalfOpen, _) if trial => {
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
    /// Records the call's outcome.
    fn settle(mut self, outcome: Outcome) {
        self.settled = true;
        let failures = self.breaker.weigh(outcome);
        match outcome {
            // A failure of one shape only: no failure is counted, and a
            // trial's endpoint answered, so the circuit closes.
            Outcome::RequestFailure(_) if failures == 0 => {
                if self.trial {
                    self.breaker.settle(true, 0);
                }
            }
            Outcome::Healthy => self.breaker.settle(self.trial, 0),
            _ => self.breaker.settle(self.trial, failures.max(1)),
        }
    }
}

/// A hash of what a request is made of, not what it says (its shape, see
/// the module doc).
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
    if !request.tools.is_empty() {
        match request.tool_choice() {
            ToolChoice::Auto => 0u8.hash(&mut h),
            ToolChoice::Required => 1u8.hash(&mut h),
            ToolChoice::None => 2u8.hash(&mut h),
            ToolChoice::Tool(name) => name.hash(&mut h),
        }
    }
    (request.on_delta.is_some() || request.observer.is_some()).hash(&mut h);
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
        let outcome = match &result {
            Ok(_) => Outcome::Healthy,
            Err(e) => match e.blame() {
                Blame::Endpoint => Outcome::EndpointFailure,
                Blame::Request => Outcome::RequestFailure(shape),
                _ => Outcome::Healthy,
            },
        };
        if let Outcome::RequestFailure(_) = outcome {
            tracing::debug!(circuit = %self.breaker.label, "a failure that may be the request's: counted against the endpoint only once other shapes fail too");
        }
        permit.settle(outcome);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(b: &Arc<Breaker>) {
        if let Ok(p) = b.enter() {
            p.settle(Outcome::EndpointFailure);
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
        b.enter().map(|p| p.settle(Outcome::Healthy)).ok();
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
            t.settle(Outcome::EndpointFailure);
        }
        assert_eq!(b.state(), CircuitState::Open);
        tokio::time::advance(Duration::from_secs(10)).await;
        if let Ok(t) = b.enter() {
            t.settle(Outcome::Healthy);
        }
        assert_eq!(b.state(), CircuitState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn one_failing_shape_never_opens_and_two_do() {
        let b = Arc::new(Breaker::new(
            "m",
            BreakerPolicy {
                failures: 3,
                cool_down: Duration::from_secs(10),
            },
        ));
        let settle = |o: Outcome| {
            if let Ok(p) = b.enter() {
                p.settle(o);
            }
        };
        for _ in 0..10 {
            settle(Outcome::RequestFailure(1));
        }
        assert_eq!(b.state(), CircuitState::Closed, "one shape: its own fault");
        // A second shape failing too: the streak (11 failures) is the
        // endpoint's.
        settle(Outcome::RequestFailure(2));
        assert_eq!(b.state(), CircuitState::Open);
        tokio::time::advance(Duration::from_secs(10)).await;
        // The trial fails on one of the streak's shapes: open again.
        settle(Outcome::RequestFailure(1));
        assert_eq!(b.state(), CircuitState::Open);
        tokio::time::advance(Duration::from_secs(10)).await;
        settle(Outcome::Healthy);
        assert_eq!(b.state(), CircuitState::Closed);
        // A healthy answer ends the streak: one shape again is its own.
        for _ in 0..5 {
            settle(Outcome::RequestFailure(2));
        }
        assert_eq!(b.state(), CircuitState::Closed);
        settle(Outcome::Healthy);
        settle(Outcome::RequestFailure(1));
        settle(Outcome::RequestFailure(2));
        assert_eq!(b.state(), CircuitState::Closed, "two failures, policy 3");
        settle(Outcome::RequestFailure(3));
        assert_eq!(b.state(), CircuitState::Open);
    }
}
