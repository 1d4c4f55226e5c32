//! Tools: the built-ins, a battery of the [`Tool`](crate::ports::tool::Tool)
//! port, and (re-exported from the kernel, where the run's dispatch lives)
//! the registry, the per-agent [`ToolSet`] and argument validation.
//!
//! - [`builtin`]: `add`, `upper`, `echo`, `sleep` and [`wait`]'s tool;
//!   `fail` and `panic`, which fail on purpose, for tests that ask for
//!   them ([`ToolRegistry::with_test_tools`]).
//! - [`wait`]: `wait`, which calls another of the run's tools on a timer
//!   (or waits for a run) in place of the model.
//! - [`registry`], [`validate`]: the kernel's dispatch (see
//!   `agentvisor::tools::registry`), kept at this path.

pub mod builtin;
pub mod wait;

pub use crate::kernel::dispatch::{registry, validate};
pub use registry::{CompiledTool, PreparedCall, RegistryError, ToolRegistry, ToolSet};
