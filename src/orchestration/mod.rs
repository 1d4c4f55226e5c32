//! Orchestration over the facade: chat sessions (`session`), multi-phase
//! pipelines (`pipeline`), replays of recorded runs (`replay`), forks of
//! recorded runs (`fork`) and diffs of two recorded runs (`diff`, which
//! drives nothing). Each drives runs through the host like any caller.

pub mod diff;
pub mod fork;
pub mod pipeline;
pub mod replay;
pub mod session;
