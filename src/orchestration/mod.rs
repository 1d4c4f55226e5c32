//! Orchestration over the facade: chat sessions (`session`), multi-phase
//! pipelines (`pipeline`), replays of recorded runs (`replay`), forks of
//! recorded runs (`fork`), sweeps of forks over a cohort (`eval`), diffs
//! of two recorded runs (`diff`, which drives nothing) and runs of
//! scheduled skills (`skill_run`). Each drives runs through the host like
//! any caller. Beside them, `writeback` (the `git` feature) writes a
//! skill run's memory into its git repository: an adapter of an outside
//! system that drives no run, here because its caller is the skill run.

pub mod diff;
pub mod eval;
pub mod fork;
pub mod pipeline;
pub mod replay;
pub mod schedules;
pub mod session;
pub mod skill_run;
#[cfg(feature = "git")]
pub mod writeback;
