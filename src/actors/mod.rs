//! The actors: `host` (root), `critic` (sharded supervisors and hosts of
//! runs), `run` (one per run, hosted on a critic shard), `budget` and
//! `audit` (asynchronous bookkeeping), `publisher` (the outbox's
//! deliveries). Actors depend on ports and on the run record
//! (`crate::record`), never on a concrete provider or store, nor on the
//! public facade (`crate::host`, `crate::handle`).
//!
//! The module is private to the crate: the public API is the host, its
//! handles and references, the ports and the batteries. Items keep `pub`
//! as their API within the crate.
#![allow(unreachable_pub)]

pub mod audit;
pub mod budget;
pub mod critic;
pub mod host;
pub mod judging;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod publisher;
pub mod run;
pub mod scheduler;
pub mod watch;
