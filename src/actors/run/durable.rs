//! A durable run's checkpoints: its progress saved after each step (the
//! next step waits until it is written) and when it parks for approval.

use std::sync::Arc;

use super::{Inflight, RunAddr, RunMsg, RunState};
use crate::actors::audit::{AuditMsg, SaveWaiter};
use crate::actors::watch::Beat;
use crate::ports::checkpoint::{Checkpoint, EncodedJson, Unchanged};
use crate::ports::run::{unix_ms, RunStatus};
use crate::record::{Ending, STORE_UNAVAILABLE};

/// What a durable run's checkpoints carry besides its progress: its
/// manifest and invocation encoded once (a save copies neither).
pub(crate) struct DurableRun {
    pub(crate) agent: Arc<str>,
    pub(crate) spec: EncodedJson,
    /// The invocation, with its run id and resolved prompt.
    pub(crate) invocation: EncodedJson,
    pub(crate) resumes: u32,
    pub(crate) started_at: u64,
}

/// A durable run's checkpointing, as its state holds it.
pub(super) struct Durable {
    pub(super) run: Arc<DurableRun>,
    /// How much of the transcript, the steps and the critic decisions the
    /// run's last checkpoint holds: the next one carries only what was
    /// appended since. A transcript rewritten (compaction) lowers it to
    /// the head it kept (see `RunState::replace_transcript`).
    pub(super) saved: Unchanged,
}

impl Durable {
    /// A run's, starting from `first` (its first checkpoint, or the one it
    /// resumes from: either is saved whole before it takes a step).
    pub(super) fn new(run: Arc<DurableRun>, first: Unchanged) -> Box<Self> {
        Box::new(Durable { run, saved: first })
    }
}

/// A durable run waiting for its step's checkpoint: told through its
/// shard (see `checkpoint_then_step`).
struct StepSaved {
    addr: RunAddr,
    epoch: u32,
}

impl SaveWaiter for StepSaved {
    fn saved(self: Box<Self>) {
        self.addr
            .send(RunMsg::CheckpointSaved { epoch: self.epoch });
    }

    fn still_waiting(&self) {
        // Waiting for the store is no stall.
        self.addr.beat(Beat::Alive);
    }
}

impl RunState {
    /// A durable run's progress as a checkpoint (`None` for a run that is
    /// not durable), saying what the last one holds already: from here on
    /// that is this one.
    pub(super) fn progress(&mut self) -> Option<Checkpoint> {
        self.durable.as_ref()?;
        let parked = self.parked_calls();
        let durable = self.durable.as_mut()?;
        let (steps, usage, cost, critic) = {
            let p = self.shared.partial();
            (p.steps.clone(), p.usage, p.cost_micros, p.critic.clone())
        };
        let d = &durable.run;
        let mut checkpoint = Checkpoint {
            run_id: self.shared.run_id,
            agent: d.agent.clone(),
            spec: d.spec.clone(),
            invocation: d.invocation.clone(),
            transcript: self.transcript.clone(),
            iteration: self.iteration,
            steps,
            usage,
            cost_micros: Some(cost),
            critic,
            // A run parked for approval is at rest, not crashing: its
            // resumes no longer count toward a crash loop.
            resumes: if self.parked.is_some() { 0 } else { d.resumes },
            started_at: d.started_at,
            saved_at: unix_ms(),
            parked,
            unchanged: Unchanged::default(),
        };
        checkpoint.unchanged = durable.saved.within(&checkpoint);
        durable.saved = Unchanged::all_of(&checkpoint);
        Some(checkpoint)
    }

    /// Saves a parked durable run's state (its turn and the calls that
    /// wait) without waiting: the run takes no step until a decision, and
    /// the next step's checkpoint is waited for as usual.
    pub(crate) fn checkpoint(&mut self) {
        if let Some(checkpoint) = self.progress() {
            let _ = self.audit.cast(AuditMsg::Checkpoint {
                checkpoint: Box::new(checkpoint),
                saved: None,
            });
        }
    }

    /// A step is done: the next is due — for a durable run, once its
    /// progress is saved. The checkpoint goes to the audit actor's
    /// checkpoint task, and the run waits (`Inflight::Checkpoint`) until
    /// it is written: a run that goes on has its steps on record, so
    /// `recover` never runs them again. While the store refuses it, the
    /// wait is retried, beats, and ends at the run's deadline
    /// (`error`/`store_unavailable`, see `finish`). A run that is not
    /// durable goes on at once.
    pub(super) fn checkpoint_then_step(&mut self) {
        let Some(checkpoint) = self.progress() else {
            self.step_due = true;
            return;
        };
        self.epoch += 1;
        let waiter = StepSaved {
            addr: self.addr.clone(),
            epoch: self.epoch,
        };
        let sent = self.audit.cast(AuditMsg::SaveStep {
            checkpoint: Box::new(checkpoint),
            waiter: Box::new(waiter),
        });
        if sent.is_err() {
            let e = Ending::failed(
                RunStatus::Error,
                STORE_UNAVAILABLE,
                "the run's checkpoint could not be saved: the audit actor is gone",
            );
            return self.finish(e);
        }
        self.inflight = Some(Inflight::Checkpoint);
    }
}
