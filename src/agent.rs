//! [`Agent`]: a manifest made ready to run on one host — its model resolved,
//! its tool set selected and validated, its limits resolved over the host's
//! defaults. Prepare once, submit many times: every run of an agent shares
//! these, so a run costs only its own state.

use std::sync::Arc;

use crate::ports::model::ChatModel;
use crate::spec::{AgentSpec, Limits};
use crate::tools::ToolSet;

/// A prepared agent. Cheap to clone.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<AgentInner>,
}

struct AgentInner {
    spec: Arc<AgentSpec>,
    name: Arc<str>,
    tool_names: Arc<[String]>,
    model: Arc<dyn ChatModel>,
    tools: ToolSet,
    limits: Limits,
}

impl Agent {
    pub(crate) fn new(
        spec: Arc<AgentSpec>,
        model: Arc<dyn ChatModel>,
        tools: ToolSet,
        limits: Limits,
    ) -> Self {
        Agent {
            inner: Arc::new(AgentInner {
                name: Arc::from(spec.name.as_str()),
                tool_names: Arc::from(spec.tools.clone()),
                spec,
                model,
                tools,
                limits,
            }),
        }
    }

    /// The manifest.
    pub fn spec(&self) -> &AgentSpec {
        &self.inner.spec
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The tool names the manifest asks for, shared by every run's record.
    pub(crate) fn tool_names(&self) -> Arc<[String]> {
        self.inner.tool_names.clone()
    }

    pub(crate) fn name_arc(&self) -> Arc<str> {
        self.inner.name.clone()
    }

    /// The model its runs call.
    pub fn model(&self) -> &Arc<dyn ChatModel> {
        &self.inner.model
    }

    /// The tools its runs may call.
    pub fn tools(&self) -> &ToolSet {
        &self.inner.tools
    }

    /// Its limits (manifest over host defaults).
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.name())
            .field("model", &self.model().name())
            .finish()
    }
}
