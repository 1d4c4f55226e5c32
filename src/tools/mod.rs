//! Tools: the registry of every [`Tool`](crate::ports::tool::Tool) a host
//! offers, the per-agent [`ToolSet`], argument validation and the built-ins.
//!
//! This module owns the path from a model's raw tool call to a bounded
//! result: resolve the name, validate the argument text against the tool's
//! JSON Schema (compiled once, at registration), then run the tool under a
//! timeout with panics caught and output capped. A call that fails
//! validation never reaches a tool, and is never retried with defaults.
//!
//! It must not know about actors, runs' lifecycles, budgets or the critic:
//! it speaks only the port types of [`crate::ports`]. Scheduling tool calls,
//! aborting them when a run is killed, and recording steps belong to the
//! run actor, which holds the future [`PreparedCall::execute`] returns.
//!
//! - [`registry`]: [`ToolRegistry`], [`ToolSet`], [`PreparedCall`],
//!   [`RegistryError`].
//! - [`validate`]: the validation steps, as pure functions.
//! - [`builtin`]: `add`, `upper`, `echo`, `sleep` and [`wait`]'s tool;
//!   `fail` and `panic`, which fail on purpose, for tests that ask for
//!   them ([`ToolRegistry::with_test_tools`]).
//! - [`wait`]: `wait`, which calls another of the run's tools on a timer
//!   (or waits for a run) in place of the model.

pub mod builtin;
pub mod registry;
pub mod validate;
pub mod wait;

pub use registry::{CompiledTool, PreparedCall, RegistryError, ToolRegistry, ToolSet};
