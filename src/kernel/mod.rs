//! The run-side kernel: what the actors call. Manifests and limits
//! (`spec`), a manifest resolved to run (`agent`), the run's shared record
//! (`record`), the default critic policy (`policy`), prices (`pricing`),
//! structured output (`output`), context compaction (`compaction`) and
//! the model judges' questions and answers (`judge`), and skills
//! repositories and their schedules' time (`skills`).
//! The kernel imports ports, batteries' configuration types and base
//! types; never the facade or orchestration.

pub mod agent;
pub mod compaction;
pub(crate) mod dispatch;
pub mod judge;
pub mod output;
pub mod policy;
pub mod pricing;
pub(crate) mod record;
pub mod skills;
pub mod spec;
