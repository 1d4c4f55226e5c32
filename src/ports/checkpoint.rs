//! The `Checkpointer` port: where a durable run's state is saved after every
//! step, so a process that dies mid-run can resume it (`Host::recover`).
//!
#![doc = include_str!("../../docs/checkpoints.md")]

use std::sync::Arc;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::model::Message;
use super::run::{CriticDecision, RunId, StepRecord, Usage};

/// A JSON value encoded once and kept as its text: cloned by a reference
/// count, written as it is (no re-encoding) wherever the value holding it
/// is serialized, decoded only by whoever knows its type.
#[derive(Clone)]
pub struct EncodedJson(Arc<RawValue>);

impl EncodedJson {
    /// Encodes `value`.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(|raw| EncodedJson(Arc::from(raw)))
    }

    /// Takes JSON text as it is (checked to be one JSON value).
    pub fn from_text(json: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(json).map(|raw| EncodedJson(Arc::from(raw)))
    }

    /// The JSON text.
    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// Decodes it as a `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

impl PartialEq for EncodedJson {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl std::fmt::Debug for EncodedJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

impl Serialize for EncodedJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for EncodedJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(|raw| EncodedJson(Arc::from(raw)))
    }
}

/// A durable run's saved state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The run.
    pub run_id: RunId,
    /// Its agent's name (empty in checkpoints written before it was kept
    /// here: the manifest says it too).
    #[serde(default)]
    pub agent: Arc<str>,
    /// The manifest it runs, encoded once per run (shared by its saves).
    pub spec: EncodedJson,
    /// How it was invoked (caller, session, limits override, …), encoded
    /// once per run.
    pub invocation: EncodedJson,
    /// The transcript up to the last completed step (shared with the run
    /// until its next message).
    pub transcript: Arc<Vec<Message>>,
    /// Model iterations completed.
    pub iteration: u32,
    /// Tool calls so far.
    pub steps: Vec<StepRecord>,
    /// Usage so far.
    pub usage: Usage,
    /// Cost so far in micro-dollars, as the run priced it (`None` in
    /// checkpoints written before it was kept: the usage is priced again
    /// on resume). A resumed run starts from it, so its earlier calls are
    /// not charged again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
    /// Critic decisions so far.
    pub critic: Vec<CriticDecision>,
    /// How many times the run was resumed.
    pub resumes: u32,
    /// Unix ms when the run first started.
    pub started_at: u64,
    /// Unix ms of this save.
    #[serde(default)]
    pub saved_at: u64,
    /// Set when the run was parked for approval at this save: its
    /// transcript then ends with the turn whose calls wait (see
    /// [`ParkedCalls`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<ParkedCalls>,
    /// What of this checkpoint the run's previous save holds already, so
    /// a store may write only what is new (see [`Unchanged`]). Nothing
    /// (the default, and what [`Checkpointer::load_all`] answers): the
    /// checkpoint is written whole. Not part of the saved state.
    #[serde(skip)]
    pub unchanged: Unchanged,
}

/// The part of a checkpoint that its run's previous save holds already:
/// the first `messages` messages of the transcript, the first `steps`
/// step records and the first `critic` decisions are as that save had
/// them, and so are the manifest and invocation (a run's are the same at
/// every save). A run appends to these lists as it goes, so a save after
/// a step leaves all but its last few entries unchanged; a transcript
/// rewritten by compaction keeps only its unchanged head.
///
/// A store that keeps a run's checkpoint in parts writes only what
/// follows these counts, and drops what it holds past them; one that
/// keeps checkpoints whole ignores it. Either way it then holds exactly
/// the checkpoint saved: a store that holds less of the run than these
/// counts say (a row written by an older build, say) writes it whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unchanged {
    /// Transcript messages unchanged since the previous save.
    pub messages: usize,
    /// Step records unchanged since the previous save.
    pub steps: usize,
    /// Critic decisions unchanged since the previous save.
    pub critic: usize,
}

impl Unchanged {
    /// All of `checkpoint`: what the save after it leaves unchanged, as
    /// far as it only appends.
    pub fn all_of(checkpoint: &Checkpoint) -> Self {
        Unchanged {
            messages: checkpoint.transcript.len(),
            steps: checkpoint.steps.len(),
            critic: checkpoint.critic.len(),
        }
    }

    /// Whether nothing is unchanged: the checkpoint is written whole.
    pub fn is_nothing(&self) -> bool {
        *self == Unchanged::default()
    }

    /// What a save leaves unchanged when the save before it (which left
    /// `self` unchanged) was never written: the least of both, list by
    /// list. Saves coalesced before a write merge this way.
    pub fn then(self, later: Unchanged) -> Self {
        Unchanged {
            messages: self.messages.min(later.messages),
            steps: self.steps.min(later.steps),
            critic: self.critic.min(later.critic),
        }
    }

    /// No more than `checkpoint` holds.
    pub fn within(self, checkpoint: &Checkpoint) -> Self {
        self.then(Unchanged::all_of(checkpoint))
    }
}

/// A durable run parked for approval when it was saved: the model's turn
/// that asked for gated tool calls is the last message of the checkpoint's
/// transcript, and none of its calls has run.
///
/// A resumed run does not call the model again: it dispatches that turn
/// anew (the same call ids), applies [`decisions`](Self::decisions) in
/// order without asking again, and parks for what is still undecided.
/// While no host runs it, a decision is recorded here
/// (`agentvisor runs approve|deny ID` against the database): the call
/// leaves [`waiting`](Self::waiting) and its decision joins the list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ParkedCalls {
    /// The calls waiting for a decision.
    pub waiting: Vec<WaitingCall>,
    /// The decisions taken on the turn's calls so far, in order.
    #[serde(default)]
    pub decisions: Vec<CallDecision>,
}

impl ParkedCalls {
    /// Whether a call still waits (a resumed run parks again).
    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }
}

/// A tool call of a parked turn, waiting for an operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaitingCall {
    /// The model's call id.
    pub call_id: Arc<str>,
    /// The tool.
    pub tool: Arc<str>,
    /// Its arguments as an operator is shown them (secrets redacted,
    /// capped).
    #[serde(default)]
    pub arguments: String,
    /// Unix ms when it began to wait.
    #[serde(default)]
    pub since_ms: u64,
}

/// A decision on one call of a parked turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallDecision {
    /// The call.
    pub call_id: Arc<str>,
    /// Approved (it runs), or denied (the model reads why).
    pub approve: bool,
    /// Why, as the operator gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who decided (`operator`).
    pub by: String,
    /// Unix ms of the decision.
    pub at_ms: u64,
}

impl Checkpoint {
    /// Whether this is the run's first checkpoint (saved when it is
    /// accepted: no step taken, never resumed), the one save that may
    /// create the run's row (see [`Checkpointer::save`]).
    pub fn is_first(&self) -> bool {
        self.iteration == 0 && self.resumes == 0
    }
}

/// A checkpointer failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The store could not read or write.
    #[error("checkpoint store unavailable: {0}")]
    Unavailable(String),
}

/// A host's hold on the durable runs it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Who holds it: unique per host and process.
    pub owner: String,
    /// How long it holds without a renewal.
    pub ttl: std::time::Duration,
}

impl Lease {
    /// The Unix ms a lease taken at `now_ms` expires.
    pub fn until(&self, now_ms: u64) -> u64 {
        now_ms.saturating_add(self.ttl.as_millis() as u64)
    }
}

/// What [`Checkpointer::claim`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The run is the caller's now.
    Claimed,
    /// Another owner's lease on it is live.
    HeldBy {
        /// The owner.
        owner: String,
        /// Unix ms its lease expires (unless renewed).
        until_ms: u64,
    },
    /// No checkpoint of the run (it finished meanwhile).
    Missing,
}

/// What [`Checkpointer::renew`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Renewal {
    /// Run leases the owner holds (all renewed).
    pub runs: u64,
    /// The owner's host lease had been taken over since it last renewed it
    /// ([`Checkpointer::take_over_host`]: it had expired, the host was
    /// paused or cut off): runs it had in flight may have been ended
    /// elsewhere. It holds its host lease again from now.
    pub taken_over: bool,
}

/// What [`Checkpointer::take_over_host`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostClaim {
    /// The host's lease is live: it runs its runs.
    Live {
        /// Unix ms its lease expires (unless renewed).
        until_ms: u64,
    },
    /// The host is gone (its lease expired, it was released, it never held
    /// one, or the caller knows it is gone): its unfinished runs are the
    /// caller's to end.
    TakenOver,
}

/// Saves and loads checkpoints. Object-safe; `Arc<dyn Checkpointer>`.
#[async_trait]
pub trait Checkpointer: Send + Sync + 'static {
    /// Saves (replaces) checkpoints, one transaction for the batch, under
    /// `lease`. A run's first checkpoint ([`Checkpoint::is_first`]) creates
    /// its row (or takes one without a live lease of another owner); any
    /// other save is written only if `lease.owner` holds the run's row.
    /// Answers the runs that were not written: another owner claimed them,
    /// or their row is gone (finished and cleared elsewhere) — the caller
    /// lost them and must not go on with them (fencing). A save refused
    /// writes nothing of its run.
    ///
    /// A checkpoint says what of it the run's previous save holds already
    /// ([`Checkpoint::unchanged`]): a store may write only the rest, and
    /// must then hold exactly the checkpoint saved.
    async fn save(
        &self,
        checkpoints: &[Checkpoint],
        lease: &Lease,
    ) -> Result<Vec<RunId>, CheckpointError>;

    /// Removes the checkpoints of these runs.
    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError>;

    /// Every saved checkpoint (the runs to resume).
    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError>;

    /// Takes the lease on a run, atomically: when nobody holds it, its
    /// lease expired, or `lease.owner` holds it already.
    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError>;

    /// Extends `lease.owner`'s host lease (taking it when it holds none)
    /// and every run lease it holds by `lease.ttl` from now, in one
    /// transaction. The answer counts the run leases it holds: fewer than
    /// the owner thinks it holds means some were claimed elsewhere (see
    /// [`Checkpointer::held_by`]).
    async fn renew(&self, lease: &Lease) -> Result<Renewal, CheckpointError>;

    /// The runs whose lease `owner` holds.
    async fn held_by(&self, owner: &str) -> Result<Vec<RunId>, CheckpointError>;

    /// Takes over the host `owner`, atomically, before ending its unfinished
    /// runs: when its host lease expired, it holds none, or `gone` (the
    /// caller knows the owner is gone, e.g. a process of its machine that
    /// no longer runs). A host whose lease is live is left alone.
    async fn take_over_host(&self, owner: &str, gone: bool) -> Result<HostClaim, CheckpointError>;

    /// Gives up every lease `owner` holds, its host lease included (its
    /// runs can be claimed at once).
    async fn release(&self, owner: &str) -> Result<(), CheckpointError>;
}

#[cfg(test)]
mod tests {
    use super::Unchanged;

    #[test]
    fn saves_coalesced_keep_the_least_each_kept() {
        let after_step = Unchanged {
            messages: 8,
            steps: 3,
            critic: 1,
        };
        // The next save follows a compaction that kept two messages.
        let compacted = Unchanged {
            messages: 2,
            steps: 4,
            critic: 1,
        };
        let merged = after_step.then(compacted);
        assert_eq!(
            merged,
            Unchanged {
                messages: 2,
                steps: 3,
                critic: 1
            }
        );
        assert!(!merged.is_nothing());
        assert!(merged.then(Unchanged::default()).is_nothing());
    }
}
