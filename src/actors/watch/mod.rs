//! The critic's record of one run ([`Watched`]) and the heartbeats that
//! update it ([`Beat`]). It lives inside the run's state on its critic
//! shard, so a heartbeat is a field update, not a message; the shard reads
//! it to arm the run's timer and to decide (see `crate::actors::critic`).
//! It owns no timing of its own and sends nothing.
//!
//! The record holds the run's trace and its loop detectors (`loops`, on
//! hashes made by `digest`): bounded memory a run, and a heartbeat costs a
//! fixed amount of work whatever the run has done before (a call's result
//! and a reply's text are each hashed once, in one pass).

use std::time::Duration;

use tokio::time::Instant;

use crate::ports::critic::Loops;
use crate::spec::{Limits, ABSOLUTE_DEADLINE};

mod digest;
pub(crate) mod loops;

pub(crate) use loops::{Detectors, Observation};

/// A handler (or a call polled in place) that takes longer is reported.
pub const SLOW_HANDLER: Duration = Duration::from_millis(50);

/// A heartbeat from a run.
#[derive(Debug, Clone, Copy)]
pub enum Beat {
    /// A model call started (1-based iteration).
    StepStarted,
    /// A model call finished.
    StepFinished {
        /// Tokens this call used.
        tokens: u64,
    },
    /// A tool call started (hash of tool name and arguments).
    ToolStarted {
        /// Hash of the tool name and its canonical arguments.
        hash: u64,
    },
    /// A tool call finished.
    ToolFinished,
    /// Still alive (a retry, a caller's heartbeat).
    Alive,
    /// A model call streamed something (text, tool-call arguments,
    /// reasoning): alive, and past its wait for the first token.
    Streaming,
}

/// The critic's record of one run (C8: small; it lives in the run's state).
pub struct Watched {
    /// The run's own hard deadline (its limits and extensions, within the
    /// 24 h cap); the one in force is [`Watched::deadline`].
    pub(crate) hard_deadline: Instant,
    /// For a sub-agent's run, its parent's hard deadline as the run last
    /// heard of it: the deadline in force never passes it. It follows the
    /// parent (a parent whose deadline moves tells its children), and
    /// reaching it ends the run only once the parent has ended (see
    /// `crate::actors::run::parent`).
    pub(crate) parent_deadline: Option<Instant>,
    pub(crate) next_soft: Instant,
    pub(crate) last_beat: Instant,
    pub(crate) armed: Option<Instant>,
    pub(crate) steps: u32,
    /// Model calls that came back: a call that hangs is no progress.
    pub(crate) steps_done: u32,
    pub(crate) tool_calls: u32,
    pub(crate) tokens: u64,
    pub(crate) progress_at_decision: u32,
    pub(crate) extensions: u32,
    pub(crate) steers: u32,
    pub(crate) last_call: u64,
    pub(crate) repeats: u32,
    /// The trace and the loop detectors.
    pub(crate) loops: Detectors,
    /// When the run last made progress (a new observation or new text),
    /// and its tokens then.
    pub(crate) progress_at: Instant,
    pub(crate) tokens_at_progress: u64,
    pub(crate) runaway_steered: bool,
    /// A repeat reached the limit: decide before the next step.
    pub(crate) repeat_due: bool,
    /// A question is pending with a policy that answers later.
    pub(crate) pending: bool,
    /// A streaming model call waits for its first token: the stall bound
    /// is `first_token_timeout` until it comes (a queueing server is not a
    /// stalled one), and a kill then says `first_token_timeout`.
    pub(crate) awaiting_first: bool,
    /// Parked on tool calls that wait for an operator's approval: since
    /// when, and when they are denied if nobody decides. While parked the
    /// run's only timer is that one: no stall, soft or hard deadline.
    pub(crate) parked: Option<(Instant, Instant)>,
}

impl Watched {
    /// The record of a run that starts at `started`, watched for `loops`.
    pub fn new(limits: &Limits, loops: Loops, started: Instant) -> Self {
        let cap = started + ABSOLUTE_DEADLINE;
        Watched {
            hard_deadline: (started + limits.hard_timeout).min(cap),
            parent_deadline: None,
            next_soft: started + limits.soft_timeout,
            last_beat: started,
            armed: None,
            steps: 0,
            steps_done: 0,
            tool_calls: 0,
            tokens: 0,
            progress_at_decision: 0,
            extensions: 0,
            steers: 0,
            last_call: 0,
            repeats: 0,
            loops: Detectors::new(loops),
            progress_at: started,
            tokens_at_progress: 0,
            runaway_steered: false,
            repeat_due: false,
            pending: false,
            awaiting_first: false,
            parked: None,
        }
    }

    /// The model call just started streams: it waits for its first token.
    pub(crate) fn await_first_token(&mut self) {
        self.awaiting_first = true;
    }

    /// The stall bound in force (see `awaiting_first`).
    pub(crate) fn stall_bound(&self, limits: &Limits) -> Duration {
        if self.awaiting_first {
            limits.first_token()
        } else {
            limits.stall_timeout
        }
    }

    /// Counts a heartbeat (O(1)).
    pub fn beat(&mut self, now: Instant, beat: Beat) {
        self.last_beat = now;
        match beat {
            Beat::StepStarted => self.steps += 1,
            Beat::StepFinished { tokens } => {
                self.steps_done += 1;
                self.tokens += tokens;
                self.awaiting_first = false;
            }
            Beat::Streaming => self.awaiting_first = false,
            Beat::ToolFinished => self.tool_calls += 1,
            Beat::Alive => {}
            Beat::ToolStarted { hash } => {
                if hash == self.last_call {
                    self.repeats += 1;
                } else {
                    self.last_call = hash;
                    self.repeats = 1;
                }
                let limit = u32::from(self.loops.limits.repeat);
                if limit > 0 && self.repeats >= limit {
                    self.repeat_due = true;
                }
            }
        }
    }

    /// A tool call's outcome, taken into the transcript (see `loops`): a
    /// new observation is progress. Kept out of [`beat`](Self::beat), which
    /// stays small for the heartbeats every step makes.
    pub(crate) fn observe(&mut self, now: Instant, o: Observation) {
        if self.loops.observe(o) {
            self.progressed(now);
        }
    }

    /// A step's calls have all come back (see `loops`).
    pub(crate) fn step_closed(&mut self) {
        self.loops.step_closed();
    }

    /// A model reply's text (see `loops`): new text is progress.
    pub(crate) fn reply(&mut self, now: Instant, text: &str) {
        if self.loops.reply(text) {
            self.progressed(now);
        }
    }

    fn progressed(&mut self, now: Instant) {
        self.progress_at = now;
        self.tokens_at_progress = self.tokens;
    }

    pub(crate) fn progress(&self) -> u32 {
        self.steps_done + self.tool_calls
    }

    pub(crate) fn next_due(&self, limits: &Limits) -> Instant {
        if let Some((_, until)) = self.parked {
            return until;
        }
        let stall = self.last_beat + self.stall_bound(limits);
        self.deadline().min(stall).min(self.next_soft)
    }

    /// The hard deadline in force: the run's own, capped at its parent's.
    pub(crate) fn deadline(&self) -> Instant {
        match self.parent_deadline {
            Some(p) => self.hard_deadline.min(p),
            None => self.hard_deadline,
        }
    }

    /// The run waits for an operator until `until`: its clocks stop.
    pub(crate) fn park(&mut self, now: Instant, until: Instant) {
        self.parked = Some((now, until));
    }

    /// The run goes on: its own hard deadline (within its 24 h cap; its
    /// parent's still caps it) and its next soft decision move by the time
    /// it waited, and a fresh stall window opens. Returns how long it waited.
    pub(crate) fn unpark(&mut self, started: Instant, now: Instant) -> Duration {
        let Some((since, _)) = self.parked.take() else {
            return Duration::ZERO;
        };
        let waited = now.saturating_duration_since(since);
        let cap = started + ABSOLUTE_DEADLINE;
        self.hard_deadline = (self.hard_deadline + waited).min(cap);
        self.next_soft = (self.next_soft + waited).min(cap);
        self.last_beat = now;
        waited
    }

    pub(crate) fn extend(&mut self, started: Instant, by: Duration) {
        let cap = started + ABSOLUTE_DEADLINE;
        // `by` is bounded by the manifest's ranges, but an operator's may
        // not be: never overflow the clock.
        let by = by.min(ABSOLUTE_DEADLINE);
        self.hard_deadline = (self.hard_deadline + by).min(cap);
    }

    /// Caps the run's deadline at its parent's, or moves the cap to where
    /// the parent's deadline is now (it only moves later). Returns whether
    /// the deadline in force moved.
    pub(crate) fn cap_at_parent(&mut self, parent: Instant) -> bool {
        let before = self.deadline();
        let parent = self.parent_deadline.map_or(parent, |p| p.max(parent));
        self.parent_deadline = Some(parent);
        self.deadline() != before
    }

    /// Whether the deadline in force is the parent's (not the run's own).
    pub(crate) fn at_parent_deadline(&self) -> bool {
        self.parent_deadline.is_some_and(|p| p < self.hard_deadline)
    }

    /// The process was paused for `gap`: the stall window moves by it (the
    /// run could not beat while nothing ran), never past `now`.
    pub(crate) fn shift(&mut self, gap: Duration, now: Instant) {
        self.last_beat = (self.last_beat + gap).min(now);
    }
}
