//! The `CriticPolicy` port: what the critic should do when a run hits one of
//! its triggers. The critic actor owns timing and state; the policy only
//! decides. A rules policy answers at once; a policy that consults a model
//! (an LLM judge) returns a future the critic runs as a task, so a slow judge
//! never holds up the critic's mailbox.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::run::KillReason;

/// Why the critic is asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The soft timeout of an idle period expired.
    SoftTimeout,
    /// No heartbeat within the stall timeout while a call was in flight.
    Stall,
    /// The same tool call with the same arguments was seen `count` times in a row.
    Repeat {
        /// Consecutive identical calls.
        count: u32,
    },
    /// The hard deadline expired.
    HardDeadline,
}

/// What the critic knows of a run when it asks.
#[derive(Clone, Debug)]
pub struct RunView {
    /// Agent name.
    pub agent: String,
    /// Time since the run started.
    pub elapsed: Duration,
    /// Model iterations started.
    pub steps: u32,
    /// Progress since the previous decision: model calls that came back
    /// plus tool calls that finished (a call still in flight is none).
    pub steps_since_decision: u32,
    /// Tool calls finished.
    pub tool_calls: u32,
    /// Tokens used.
    pub tokens: u64,
    /// Extensions granted so far.
    pub extensions: u32,
    /// Steers sent so far.
    pub steers: u32,
    /// Whether a runaway steer was already sent.
    pub runaway_steered: bool,
    /// The run's limits.
    pub limits: super::limits::Limits,
}

/// A decision.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Do nothing now.
    Continue,
    /// Inject a message before the next model call.
    Steer(String),
    /// Push the hard deadline back.
    Extend(Duration),
    /// Raise the iteration ceiling by this many.
    RaiseIterations(u32),
    /// Kill the run.
    Kill(KillReason),
}

/// A policy's answer: now, or later (the critic runs the future as a task).
pub enum Verdict {
    /// Decided at once.
    Now(Decision),
    /// Decided by a future (e.g. a model call).
    Later(BoxFuture<'static, Decision>),
}

/// Decides what to do at a trigger. Object-safe; `Arc<dyn CriticPolicy>`.
pub trait CriticPolicy: Send + Sync + 'static {
    /// Decides for one run at one trigger.
    fn decide(&self, trigger: Trigger, view: &RunView) -> Verdict;
}
