//! Model batteries: the [`ChatModel`](crate::ports::model::ChatModel)
//! implementations a host can plug in.
//!
//! - [`scripted`]: plays a manifest's `script`, one entry per model call, so
//!   tests, benches and demos provoke every behaviour (tool loops, hangs,
//!   provider errors, usage) deterministically and without a network.
//! - `openai` and `anthropic` HTTP providers come later.
//!
//! A provider answers one call and nothing more: it must not know about
//! actors, runs' state, retries or budgets. Those live in `crate::actors`,
//! which see providers only through the port.

pub mod scripted;

pub use scripted::ScriptedModel;
