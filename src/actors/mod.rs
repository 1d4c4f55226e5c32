//! The actors: `host` (root), `critic` (sharded supervisors of runs), `run`
//! (one per run), `budget` and `audit` (asynchronous bookkeeping). Actors
//! depend on ports, never on a concrete provider or store.

pub mod audit;
pub mod budget;
pub mod critic;
pub mod host;
pub mod run;
