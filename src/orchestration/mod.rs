//! Orchestration over the facade: chat sessions (`session`), multi-phase
//! pipelines (`pipeline`), replays of recorded runs (`replay`) and runs of
//! scheduled skills (`skill_run`). Each
//! drives runs through the host like any caller.

pub mod pipeline;
pub mod replay;
pub mod session;
pub mod skill_run;
