//! Orchestration over the facade: chat sessions (`session`), multi-phase
//! pipelines (`pipeline`) and replays of recorded runs (`replay`). Each
//! drives runs through the host like any caller.

pub mod pipeline;
pub mod replay;
pub mod session;
