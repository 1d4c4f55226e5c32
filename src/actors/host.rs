//! The host actor: the root of the supervision tree. Critic shards, the
//! budget actor and the audit actor are its children; runs are hosted and
//! supervised by the critic shards. It decides explicitly on every child event: a child
//! that fails is logged as an error (its runs are finalized by the Host
//! handle's shutdown path); a child that stops is expected during shutdown.

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

/// The root actor (no messages of its own).
pub struct HostActor;

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
        _: ActorRef<HostMsg>,
        evt: SupervisionEvent,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorFailed(cell, err) => {
                tracing::error!(actor = ?cell.get_id(), error = %err, "a host actor failed");
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                tracing::debug!(actor = ?cell.get_id(), ?reason, "a host actor stopped");
            }
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => {}
        }
        Ok(())
    }
}
