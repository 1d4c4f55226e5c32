//! The `CriticPolicy` port: what the critic should do when a run hits one of
//! its triggers. The critic actor owns timing and state; the policy only
//! decides. A rules policy answers at once; a policy that consults a model
//! (an LLM judge) returns a future the critic runs as a task, so a slow judge
//! never holds up the critic's mailbox.
//!
//! What a policy sees of a run ([`RunView`]) includes its [`Trace`]: the
//! last [`TRACE_LEN`] tool calls as hashes (at most 768 bytes a run, no text),
//! which the loop detectors read and a model-backed policy may summarise.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::run::{KillReason, LoopKind};

/// Tool calls the critic's trace of a run remembers.
pub const TRACE_LEN: usize = 32;

/// Chunks of model text the `chant` detector remembers (chunks are at
/// most [`CHANT_CHUNK_CHARS`] long, so at most 5 000 characters).
pub const CHANT_WINDOW_CHUNKS: usize = 100;

/// The longest chunk of model text the `chant` detector compares.
pub const CHANT_CHUNK_CHARS: usize = 50;

/// The highest threshold of the detectors that count without a window.
pub const MAX_LOOP_COUNT: u32 = 10_000;

/// The loop detectors' thresholds, resolved (`0`: off). See
/// `docs/critic.md` for what each counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loops {
    /// Identical consecutive calls.
    pub repeat: u16,
    /// The same call with the same result, anywhere in the trace.
    pub same_observation: u16,
    /// The same tool ending in the same normalised error.
    pub same_error: u16,
    /// A cycle of period 2 to 4 repeated this many times.
    pub cycle: u16,
    /// The same call answering the same normalised result.
    pub poll: u16,
    /// Steps with no new result and no new text.
    pub no_progress: u16,
    /// The same chunk of text in the recent replies.
    pub chant: u16,
}

/// The detectors' defaults.
pub const LOOPS_DEFAULT: Loops = Loops {
    repeat: 3,
    same_observation: 4,
    same_error: 3,
    cycle: 3,
    poll: 5,
    no_progress: 8,
    chant: 10,
};

impl Default for Loops {
    fn default() -> Self {
        LOOPS_DEFAULT
    }
}

impl Loops {
    /// Every detector off.
    pub const OFF: Loops = Loops {
        repeat: 0,
        same_observation: 0,
        same_error: 0,
        cycle: 0,
        poll: 0,
        no_progress: 0,
        chant: 0,
    };

    /// The threshold of one detector (`0`: off).
    pub fn get(&self, kind: LoopKind) -> u16 {
        match kind {
            LoopKind::Repeat => self.repeat,
            LoopKind::SameObservation => self.same_observation,
            LoopKind::SameError => self.same_error,
            LoopKind::Cycle => self.cycle,
            LoopKind::Poll => self.poll,
            LoopKind::NoProgress => self.no_progress,
            LoopKind::Chant => self.chant,
        }
    }
}

/// A set of loop kinds (which were steered already).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopKinds(u8);

impl LoopKinds {
    fn bit(kind: LoopKind) -> u8 {
        1 << LoopKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
    }

    /// Whether `kind` is in the set.
    pub fn contains(self, kind: LoopKind) -> bool {
        self.0 & Self::bit(kind) != 0
    }

    /// Adds `kind`.
    pub fn insert(&mut self, kind: LoopKind) {
        self.0 |= Self::bit(kind);
    }
}

/// One tool call as the critic remembers it: 32-bit hashes (two calls in
/// a trace of 32 collide by chance about once in ten million traces).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceStep {
    /// The tool's name.
    pub tool: u32,
    /// The tool and its arguments in canonical JSON (key order and
    /// spacing do not count).
    pub call: u32,
    /// The result as it came back (an error's message for an error).
    pub result: u32,
    /// The result with digits, hex and ids masked; for an error, also
    /// quoted spans and paths (the normalised error).
    pub normalised: u32,
    /// The text of the model reply that asked for the call (0: none).
    pub text: u32,
    /// Whether the call succeeded.
    pub ok: bool,
}

impl TraceStep {
    /// The call and its result together (what `same_observation` and
    /// `cycle` compare, and what counts as progress when new).
    pub fn observation(&self) -> u64 {
        (u64::from(self.call) << 32) | u64::from(self.result)
    }
}

/// The last [`TRACE_LEN`] tool calls of a run, newest last: a ring of
/// bounded size. Its buffer grows with the run's first calls (4, 8, 16,
/// then 32 calls: at most three reallocations a run, none once full), so
/// a run of a few calls holds room for a few, and none holds more than
/// `TRACE_LEN` × 24 bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    steps: Vec<TraceStep>,
    /// Where the next step goes once the ring is full.
    next: u8,
}

impl Trace {
    /// Remembers a call, forgetting the oldest when full.
    pub fn push(&mut self, step: TraceStep) {
        if self.steps.len() < TRACE_LEN {
            self.steps.push(step);
        } else if let Some(slot) = self.steps.get_mut(usize::from(self.next)) {
            *slot = step;
        }
        self.next = ((usize::from(self.next) + 1) % TRACE_LEN) as u8;
    }

    /// Calls remembered.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether no call is remembered.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The call `back` calls before the newest (0: the newest).
    pub fn back(&self, back: usize) -> Option<&TraceStep> {
        let len = self.len();
        if back >= len {
            return None;
        }
        // Not full: `next` is `len`; full: it is the oldest's slot.
        let i = (usize::from(self.next) + len - 1 - back) % len;
        self.steps.get(i)
    }

    /// The calls remembered, newest first.
    pub fn iter(&self) -> impl Iterator<Item = &TraceStep> + '_ {
        (0..self.len()).filter_map(|b| self.back(b))
    }
}

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
    /// A loop detector other than `repeat` (which reports as
    /// [`Trigger::Repeat`]) saw its pattern `count` times.
    Loop {
        /// Which detector.
        kind: LoopKind,
        /// How many times (calls, steps or chunks, by detector).
        count: u32,
    },
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
    /// The last tool calls (see [`Trace`]).
    pub trace: Trace,
    /// Time since the run last made progress (a call with a new result,
    /// or new model text).
    pub since_progress: Duration,
    /// Tokens used since then.
    pub tokens_since_progress: u64,
    /// The loop detectors' thresholds.
    pub loops: Loops,
    /// The loops steered already (the next of the same kind is killed).
    pub loops_steered: LoopKinds,
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
