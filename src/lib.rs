//! agentvisor: a runtime that runs LLM agent runs as supervised actors.
#![allow(missing_docs)]

pub mod ports;
pub mod providers;
pub mod spec;
pub mod stores;
pub mod tools;
