//! The tool registry and the per-agent tool set.
//!
//! A [`ToolRegistry`] is built once per host: every tool is registered with
//! its schema compiled there, so a bad schema fails at startup, not mid-run.
//! [`ToolRegistry::select`] cuts out the [`ToolSet`] an agent may use; the
//! set is immutable and shared (by `Arc`) by every run of that agent.
//!
//! A call goes through two stages. [`ToolSet::prepare`] is synchronous and
//! cheap: it resolves the name and validates the arguments (see
//! [`super::validate`]), so a refused call never reaches a tool.
//! [`PreparedCall::execute`] runs the tool under a timeout, turns a panic
//! into [`ToolError::Panicked`] and caps what comes back, so whatever a tool
//! does, the caller gets a bounded `Result<String, ToolError>`.
//!
//! Registering, selecting and calling stay in one module: they share the
//! one compiled entry (tool and validator) the registry makes. Its tests
//! are in `tests.rs` beside it.

use std::collections::HashMap;

/// The tool tables' hasher: a few names, looked up on every call.
type Names = foldhash::fast::RandomState;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use jsonschema::Validator;
use serde_json::Value;

use super::validate::{
    check_schema, compile_schema, require_object, validate_arguments, MAX_ERROR_BYTES,
};
use crate::ports::model::{ToolCallRequest, ToolSpec};
use crate::ports::run::cap_text;
use crate::ports::tool::{Tool, ToolContext, ToolError};

/// The longest tool name accepted, as providers allow.
const MAX_NAME_BYTES: usize = 64;

/// A registration or selection failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A tool of that name is already registered.
    #[error("tool `{0}` is already registered")]
    DuplicateTool(String),
    /// The name is not 1-64 characters of `[A-Za-z0-9_-]`, which model
    /// providers require of function names.
    #[error("invalid tool name `{0}`: use 1-64 characters of A-Z, a-z, 0-9, `_`, `-`")]
    InvalidName(String),
    /// The tool's argument schema does not compile.
    #[error("tool `{tool}` has an invalid argument schema: {message}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// The schema compiler's message.
        message: String,
    },
    /// An agent asked for a tool that is not registered.
    #[error("unknown tool `{name}` (available: {})", available.join(", "))]
    UnknownTool {
        /// The name asked for.
        name: String,
        /// Every registered name, sorted.
        available: Vec<String>,
    },
}

/// A registered tool with its compiled argument validator.
#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    validator: Arc<Validator>,
    /// One of the [built-in tools](crate::tools::builtin) (a host's own tool of
    /// the same name replaces it).
    builtin: bool,
}

/// Every tool a host offers, by name, each with its schema compiled once.
#[derive(Default)]
pub struct ToolRegistry {
    entries: HashMap<String, Entry, Names>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers one of the [built-in tools](crate::tools::builtin): a
    /// host's own tool of the same name replaces it (see
    /// [`register_own`](Self::register_own)).
    pub(crate) fn register_builtin(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.spec().name.clone();
        self.register(tool)?;
        if let Some(entry) = self.entries.get_mut(&name) {
            entry.builtin = true;
        }
        Ok(())
    }

    /// Registers a tool under its spec's name, compiling its schema.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        self.add(tool, false)
    }

    /// Registers a host's own tool: as [`register`](Self::register), but
    /// it replaces a [built-in tool](crate::tools::builtin) of the same name (a
    /// host that brings a tool called `wait` keeps its own). Any other
    /// name taken is [`RegistryError::DuplicateTool`].
    pub fn register_own(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        self.add(tool, true)
    }

    fn add(&mut self, tool: Arc<dyn Tool>, over_builtin: bool) -> Result<(), RegistryError> {
        let spec = tool.spec();
        let name = spec.name.clone();
        if !is_valid_name(&name) {
            return Err(RegistryError::InvalidName(cap_text(&name, 128)));
        }
        if let Some(taken) = self.entries.get(&name) {
            if !(over_builtin && taken.builtin) {
                return Err(RegistryError::DuplicateTool(name));
            }
        }
        let validator =
            compile_schema(&spec.parameters).map_err(|message| RegistryError::InvalidSchema {
                tool: name.clone(),
                message,
            })?;
        self.entries.insert(
            name,
            Entry {
                tool,
                validator: Arc::new(validator),
                builtin: false,
            },
        );
        Ok(())
    }

    /// Every registered name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.entries.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// The tools an agent may use, in the order given (a repeated name is
    /// kept once). An unknown name is an error that lists what is available.
    pub fn select(&self, names: &[String]) -> Result<ToolSet, RegistryError> {
        let mut entries = HashMap::with_capacity_and_hasher(names.len(), Names::default());
        let mut specs = Vec::with_capacity(names.len());
        for name in names {
            if entries.contains_key(name) {
                continue;
            }
            let entry = self
                .entries
                .get(name)
                .ok_or_else(|| RegistryError::UnknownTool {
                    name: name.clone(),
                    available: self.names(),
                })?;
            specs.push(entry.tool.spec().clone());
            entries.insert(name.clone(), entry.clone());
        }
        Ok(ToolSet {
            inner: Arc::new(ToolSetInner {
                entries,
                specs: specs.into(),
            }),
        })
    }
}

/// A tool with its argument schema compiled, made outside the registry
/// (the tools an MCP server lists when it starts) to join a [`ToolSet`]
/// through [`ToolRegistry::select_with`].
#[derive(Clone)]
pub struct CompiledTool(Entry);

impl CompiledTool {
    /// Checks the tool's name and compiles its schema, as
    /// [`ToolRegistry::register`] does.
    pub fn new(tool: Arc<dyn Tool>) -> Result<Self, RegistryError> {
        let name = &tool.spec().name;
        if !is_valid_name(name) {
            return Err(RegistryError::InvalidName(cap_text(name, 128)));
        }
        let validator = compile_schema(&tool.spec().parameters).map_err(|message| {
            RegistryError::InvalidSchema {
                tool: name.clone(),
                message,
            }
        })?;
        Ok(CompiledTool(Entry {
            tool,
            validator: Arc::new(validator),
            builtin: false,
        }))
    }

    /// The tool's spec.
    pub fn spec(&self) -> &ToolSpec {
        self.0.tool.spec()
    }

    /// The tool.
    pub fn tool(&self) -> &Arc<dyn Tool> {
        &self.0.tool
    }
}

impl fmt::Debug for CompiledTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CompiledTool")
            .field(&self.spec().name)
            .finish()
    }
}

impl ToolRegistry {
    /// Like [`select`](Self::select), then `extra` after the selected tools
    /// (a name the manifest lists that is one of `extra`'s is taken from
    /// there; a repeated name is kept once, the first).
    pub fn select_with(
        &self,
        names: &[String],
        extra: &[CompiledTool],
    ) -> Result<ToolSet, RegistryError> {
        let own: Vec<String> = names
            .iter()
            .filter(|n| !extra.iter().any(|e| &e.spec().name == *n))
            .cloned()
            .collect();
        let base = self.select(&own)?;
        if extra.is_empty() {
            return Ok(base);
        }
        let mut entries = base.inner.entries.clone();
        let mut specs = base.inner.specs.to_vec();
        for e in extra {
            let name = &e.spec().name;
            if entries.contains_key(name) {
                continue;
            }
            specs.push(e.spec().clone());
            entries.insert(name.clone(), e.0.clone());
        }
        Ok(ToolSet {
            inner: Arc::new(ToolSetInner {
                entries,
                specs: specs.into(),
            }),
        })
    }
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.names())
            .finish()
    }
}

/// Providers accept function names of 1-64 characters of `[A-Za-z0-9_-]`.
fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The tools one agent may use: immutable, cheap to clone, shared by every
/// run of the agent. The default is the empty set.
#[derive(Clone, Default)]
pub struct ToolSet {
    inner: Arc<ToolSetInner>,
}

#[derive(Default)]
struct ToolSetInner {
    entries: HashMap<String, Entry, Names>,
    specs: Arc<[ToolSpec]>,
}

impl ToolSet {
    /// This set with `extra` tools after its own (an agent's sub-agents),
    /// each schema compiled; a name already in the set is an error.
    pub fn with_tools(&self, extra: Vec<Arc<dyn Tool>>) -> Result<ToolSet, RegistryError> {
        if extra.is_empty() {
            return Ok(self.clone());
        }
        let mut reg = ToolRegistry {
            entries: self.inner.entries.clone(),
        };
        let mut specs: Vec<ToolSpec> = self.inner.specs.to_vec();
        for tool in extra {
            specs.push(tool.spec().clone());
            reg.register(tool)?;
        }
        Ok(ToolSet {
            inner: Arc::new(ToolSetInner {
                entries: reg.entries,
                specs: specs.into(),
            }),
        })
    }

    /// The specs to show the model, in selection order. The same `Arc` on
    /// every call: cloning it allocates nothing.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(&self.inner.specs)
    }

    /// Whether the set holds no tool.
    pub fn is_empty(&self) -> bool {
        self.inner.specs.is_empty()
    }

    /// How many tools the set holds.
    pub fn len(&self) -> usize {
        self.inner.specs.len()
    }

    /// Whether a tool of that name is in the set.
    pub fn contains(&self, name: &str) -> bool {
        self.inner.entries.contains_key(name)
    }

    /// The effect class tool `name` declares ([`Tool::effect`]); `None`
    /// for a tool not in the set. A manifest's `tools_effects` is applied
    /// by the agent ([`Agent::tool_effect`](crate::Agent::tool_effect)).
    pub fn effect(&self, name: &str) -> Option<crate::ports::tool::ToolEffect> {
        self.inner.entries.get(name).map(|e| e.tool.effect())
    }

    /// The same tools, each replaced by what `wrap` makes of it (a
    /// decorator that keeps its spec): the compiled validators are kept,
    /// so arguments are checked as before and the wrapper sees only calls
    /// that passed.
    pub(crate) fn wrapped(&self, wrap: impl Fn(&Arc<dyn Tool>) -> Arc<dyn Tool>) -> ToolSet {
        let entries = self
            .inner
            .entries
            .iter()
            .map(|(name, e)| {
                (
                    name.clone(),
                    Entry {
                        tool: wrap(&e.tool),
                        validator: e.validator.clone(),
                        builtin: e.builtin,
                    },
                )
            })
            .collect();
        ToolSet {
            inner: Arc::new(ToolSetInner {
                entries,
                specs: self.inner.specs.clone(),
            }),
        }
    }

    /// Resolves and validates a model's tool call, in order: the name is in
    /// the set ([`ToolError::UnknownTool`]), then the argument text's size,
    /// strict JSON, an object, and the tool's schema
    /// ([`ToolError::InvalidArguments`]). On success the call is ready to
    /// [`execute`](PreparedCall::execute); on failure no tool runs.
    pub fn prepare(&self, call: &ToolCallRequest) -> Result<PreparedCall, ToolError> {
        let entry = self
            .inner
            .entries
            .get(&*call.name)
            .ok_or_else(|| ToolError::UnknownTool(cap_text(&call.name, 256)))?;
        let args = validate_arguments(&entry.validator, &call.arguments)?;
        Ok(PreparedCall {
            tool: Arc::clone(&entry.tool),
            args,
        })
    }

    /// Resolves and validates a call whose arguments are a JSON value
    /// already (a call a tool makes through its run, see
    /// [`RunAccess`](crate::ports::tool::RunAccess)): the name is in the
    /// set, the arguments are an object that satisfies the tool's schema.
    pub fn prepare_value(&self, name: &str, args: Value) -> Result<PreparedCall, ToolError> {
        let entry = self
            .inner
            .entries
            .get(name)
            .ok_or_else(|| ToolError::UnknownTool(cap_text(name, 256)))?;
        let args = require_object(args)?;
        check_schema(&entry.validator, &args)?;
        Ok(PreparedCall {
            tool: Arc::clone(&entry.tool),
            args,
        })
    }
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.inner.specs.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct("ToolSet").field("tools", &names).finish()
    }
}

/// A tool call that passed validation: the tool and its arguments object.
pub struct PreparedCall {
    /// The tool to run.
    pub tool: Arc<dyn Tool>,
    /// The validated arguments (always a JSON object).
    pub args: Value,
}

impl PreparedCall {
    /// Runs the tool. It gets `timeout` to finish ([`ToolError::Timeout`]);
    /// a panic becomes [`ToolError::Panicked`] with the panic's text; an `Ok`
    /// result is capped to `max_result_bytes` (head and tail kept) and an
    /// error's message to a few KiB. Cancel-safe: dropping the future drops
    /// the tool's.
    pub async fn execute(
        self,
        ctx: ToolContext,
        timeout: Duration,
        max_result_bytes: usize,
    ) -> Result<String, ToolError> {
        let PreparedCall { tool, args } = self;
        let run_id = ctx.run_id;
        let called = &tool;
        // `call` runs inside the async block, so even a tool whose `call`
        // panics before returning its future is caught (and marked as
        // caught, so a quiet panic hook stays silent: one warn line below).
        // It borrows `tool`, which names the error of a timeout.
        let guarded = AssertUnwindSafe(crate::panics::quietly(async move {
            called.call(args, ctx).await
        }))
        .catch_unwind();
        let outcome = match tokio::time::timeout(timeout, guarded).await {
            Err(_elapsed) => {
                Err(tool.timeout_error(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)))
            }
            Ok(Err(payload)) => {
                let text = panic_text(payload.as_ref());
                let tool = &tool.spec().name;
                tracing::warn!(run_id = %run_id, tool = %tool, "tool panicked: {text}");
                Err(ToolError::Panicked(text))
            }
            Ok(Ok(result)) => result,
        };
        // Known secrets (API keys) never leave a tool: a tool that prints
        // its environment or echoes its arguments is redacted here, before
        // its result reaches the model, an event or the audit log.
        match outcome {
            Ok(text) => Ok(cap_text(&crate::secrets::redact(&text), max_result_bytes)),
            Err(error) => Err(cap_error(error)),
        }
    }
}

impl fmt::Debug for PreparedCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedCall")
            .field("tool", &self.tool.spec().name)
            .field("args", &self.args)
            .finish()
    }
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    cap_text(crate::panics::payload_text(payload), MAX_ERROR_BYTES)
}

/// Caps the message an error carries, so a tool cannot flood the transcript
/// through its errors.
fn cap_error(error: ToolError) -> ToolError {
    let cap = |s: String| cap_text(&crate::secrets::redact(&s), MAX_ERROR_BYTES);
    match error {
        ToolError::UnknownTool(s) => ToolError::UnknownTool(cap(s)),
        ToolError::InvalidArguments(s) => ToolError::InvalidArguments(cap(s)),
        ToolError::Failed(s) => ToolError::Failed(cap(s)),
        ToolError::Panicked(s) => ToolError::Panicked(cap(s)),
        ToolError::Timeout(ms) => ToolError::Timeout(ms),
        ToolError::Typed { kind, message } => ToolError::Typed {
            kind,
            message: cap(message),
        },
    }
}

#[cfg(test)]
mod tests;
