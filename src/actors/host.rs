//! The host actor: the root of the supervision tree. Critic shards, the
//! budget actor, the audit actor and the MCP server actors (see
//! `crate::actors::mcp`) are its children; runs are hosted and supervised
//! by the critic shards.
//!
//! It decides explicitly on every child event. A critic shard that fails
//! outside a run's handler (a run's own panic is caught by its shard) is
//! replaced: every run it hosted ends `error`/`shard_failed` with one
//! terminal record each (their handles resolve), and a fresh shard takes
//! its place for new runs. An MCP server actor that fails is replaced by
//! the next use of its definition. Any other child that fails is logged (the
//! `Host` handle's shutdown finalizes what is left); a child that stops is
//! expected during shutdown.

use std::sync::{Arc, OnceLock, RwLock};

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::actors::audit::{send_finished, AuditMsg};
use crate::actors::critic::{Critic, CriticMsg};
use crate::ports::critic::CriticPolicy;
use crate::ports::run::RunStatus;
use crate::record::{Ending, HostRuns, Mailbox};

/// One critic shard as the host routes to it.
#[derive(Clone)]
pub(crate) struct ShardSlot {
    pub(crate) actor: ActorRef<CriticMsg>,
    /// The shard as its runs' records reach it.
    pub(crate) mailbox: Arc<dyn Mailbox>,
}

/// The host's critic shards: run `key` lives on shard `key % len`. A failed
/// shard's slot is refilled in place.
pub(crate) struct ShardSet {
    slots: RwLock<Vec<ShardSlot>>,
    pub(crate) runs: Arc<HostRuns>,
    pub(crate) policy: Arc<dyn CriticPolicy>,
    pub(crate) audit: OnceLock<ActorRef<AuditMsg>>,
}

impl ShardSet {
    pub(crate) fn new(runs: Arc<HostRuns>, policy: Arc<dyn CriticPolicy>) -> Self {
        ShardSet {
            slots: RwLock::new(Vec::new()),
            runs,
            policy,
            audit: OnceLock::new(),
        }
    }

    /// The shard of run `key`.
    pub(crate) fn route(&self, key: u64) -> ShardSlot {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots[(key % slots.len() as u64) as usize].clone()
    }

    /// How many shards.
    pub(crate) fn len(&self) -> usize {
        self.slots.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Every shard's actor.
    pub(crate) fn actors(&self) -> Vec<ActorRef<CriticMsg>> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.iter().map(|s| s.actor.clone()).collect()
    }

    /// Spawns a shard under `root` into slot `index` (appended when
    /// `index` is the number of shards).
    pub(crate) async fn spawn(
        &self,
        root: &ractor::ActorCell,
        index: usize,
    ) -> Result<(), ractor::SpawnErr> {
        let Some(audit) = self.audit.get() else {
            return Err(ractor::SpawnErr::StartupFailed(
                "the audit actor is not started".into(),
            ));
        };
        let critic = Critic::new(self.policy.clone(), audit.clone());
        let (actor, _) = Actor::spawn_linked(None, critic, (), root.clone()).await?;
        let slot = ShardSlot {
            mailbox: Arc::new(actor.clone()),
            actor,
        };
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        if index < slots.len() {
            slots[index] = slot;
        } else {
            slots.push(slot);
        }
        Ok(())
    }

    /// The slot a shard actor fills, if it is one of ours.
    fn index_of(&self, id: ractor::ActorId) -> Option<usize> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.iter().position(|s| s.actor.get_id() == id)
    }
}

/// The root actor (no messages of its own).
pub struct HostActor {
    pub(crate) shards: Arc<ShardSet>,
}

/// The root's messages: none but supervision.
pub enum HostMsg {}

impl Actor for HostActor {
    type Msg = HostMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<HostMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<HostMsg>,
        evt: SupervisionEvent,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorFailed(cell, err) => match self.shards.index_of(cell.get_id()) {
                Some(index) => {
                    tracing::error!(shard = index, error = %err, "a critic shard failed: its runs end shard_failed and the shard is replaced");
                    self.shard_failed(&myself, index).await;
                }
                None => {
                    tracing::error!(actor = ?cell.get_id(), error = %err, "a host actor failed");
                }
            },
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                tracing::debug!(actor = ?cell.get_id(), ?reason, "a host actor stopped");
            }
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => {}
        }
        Ok(())
    }
}

impl HostActor {
    /// Ends every run of the failed shard `index` and puts a fresh shard in
    /// its slot.
    async fn shard_failed(&self, myself: &ActorRef<HostMsg>, index: usize) {
        let n = self.shards.len() as u64;
        if let Some(audit) = self.shards.audit.get() {
            for run in self.shards.runs.all() {
                if run.key % n != index as u64 {
                    continue;
                }
                let ending = Ending::failed(
                    RunStatus::Error,
                    "shard_failed",
                    "the critic shard that hosted the run failed",
                );
                send_finished(audit, run.finish_after(ending, Vec::new()));
            }
        }
        if let Err(e) = self.shards.spawn(&myself.get_cell(), index).await {
            tracing::error!(shard = index, error = %e, "the failed critic shard could not be replaced");
        }
    }
}
