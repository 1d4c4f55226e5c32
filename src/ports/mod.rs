//! Ports: the traits actors depend on, and the plain data they speak. Only
//! traits and data live here; the batteries that implement them are in
//! `crate::providers`, `crate::stores` and `crate::tools`.

pub mod audit;
pub mod budget;
pub mod checkpoint;
pub mod critic;
pub mod duration;
pub mod event;
pub mod limits;
pub mod model;
pub mod outbox;
pub mod queue;
pub mod retention;
pub mod run;
pub mod schedule;
pub mod session;
pub mod tool;
pub mod writeback;
