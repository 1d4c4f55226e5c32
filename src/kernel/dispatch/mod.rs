//! Tool dispatch: the path from a model's raw tool call to a bounded
//! result, over the [`Tool`](crate::ports::tool::Tool) port: resolve the
//! name, validate the argument text against the tool's JSON Schema
//! (compiled once, at registration), then run the tool under a timeout with
//! panics caught and output capped. A call that fails validation never
//! reaches a tool, and is never retried with defaults.
//!
//! It knows no tool of its own (the built-ins are a battery,
//! [`crate::tools`]) and no actor: scheduling tool calls, aborting them
//! when a run is killed, and recording steps belong to the run, which
//! holds the future [`PreparedCall::execute`] returns.
//!
//! - [`registry`]: [`ToolRegistry`], [`ToolSet`], [`PreparedCall`],
//!   [`CompiledTool`], [`RegistryError`].
//! - [`validate`]: the validation steps, as pure functions, and the
//!   canonical form of arguments the critic compares.

pub mod registry;
pub mod validate;

pub(crate) use registry::{CompiledTool, PreparedCall, RegistryError, ToolRegistry, ToolSet};
