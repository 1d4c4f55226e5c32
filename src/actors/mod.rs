//! The actors: `host` (root), `critic` (sharded supervisors and hosts of
//! runs), `run` (one per run, hosted on a critic shard), `budget` and
//! `audit` (asynchronous bookkeeping). Actors
//! depend on ports, never on a concrete provider or store.

pub mod audit;
pub mod budget;
pub mod critic;
pub mod host;
pub mod run;
pub mod run_observer;
