//! Sub-agent palettes as manifests write them (`agents:`) and as they are
//! read ([`SubAgent`]); `AgentSpec::from_file` reads them.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{AgentSpec, SpecError};

/// A palette entry as a manifest writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SubAgentRef {
    /// The manifest's path.
    File(String),
    /// The path, and what the tool tells the model.
    Described {
        /// The manifest's path.
        file: String,
        /// The tool's description (default: the child manifest's).
        #[serde(default)]
        description: Option<String>,
    },
}

impl SubAgentRef {
    pub(super) fn file(&self) -> &str {
        match self {
            SubAgentRef::File(f) | SubAgentRef::Described { file: f, .. } => f,
        }
    }

    pub(super) fn description(&self) -> Option<&str> {
        match self {
            SubAgentRef::File(_) => None,
            SubAgentRef::Described { description, .. } => description.as_deref(),
        }
    }
}

/// A sub-agent, read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubAgent {
    /// Its name in the palette (the tool is `agent__NAME`).
    pub name: String,
    /// What the tool tells the model.
    pub description: String,
    /// Its manifest.
    pub spec: Arc<AgentSpec>,
}

/// How deep manifests may name sub-agents' manifests when they are read.
const MAX_PALETTE_NESTING: usize = 8;

impl AgentSpec {
    /// Reads the manifests this one names under `agents:`, relative to
    /// `dir`; `stack` holds the files being read (a manifest that names
    /// itself, directly or not, is refused).
    pub(super) fn read_sub_agents(
        &mut self,
        dir: &Path,
        stack: &mut Vec<std::path::PathBuf>,
        path: Option<&str>,
    ) -> Result<(), SpecError> {
        let invalid = |message: String| SpecError::Invalid {
            path: path.map(str::to_string),
            message,
        };
        let mut read = Vec::with_capacity(self.agents.len());
        for (name, entry) in &self.agents {
            if name.is_empty()
                || name.len() > 57
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(invalid(format!(
                    "agents: `{name}` is not a usable sub-agent name (1-57 of A-Z a-z 0-9 _ -)"
                )));
            }
            let file = dir.join(entry.file());
            let canonical = std::fs::canonicalize(&file).map_err(|e| {
                invalid(format!(
                    "agents.{name}: cannot read sub-agent manifest {}: {e}",
                    file.display()
                ))
            })?;
            if stack.contains(&canonical) {
                return Err(invalid(format!(
                    "agents.{name}: {} names a manifest that is already being read (an agent cannot delegate to itself)",
                    file.display()
                )));
            }
            if stack.len() >= MAX_PALETTE_NESTING {
                return Err(invalid(format!(
                    "agents.{name}: sub-agent manifests nest more than {MAX_PALETTE_NESTING} deep"
                )));
            }
            stack.push(canonical);
            let child = Self::from_file_in(&file, stack);
            stack.pop();
            let child = child.map_err(|e| {
                invalid(format!(
                    "agents.{name}: the sub-agent's manifest is not usable: {e}"
                ))
            })?;
            let description = entry
                .description()
                .map(str::to_string)
                .or_else(|| child.description.clone())
                .unwrap_or_else(|| {
                    format!(
                        "Delegates a task to the `{}` agent and returns its answer.",
                        child.name
                    )
                });
            read.push(SubAgent {
                name: name.clone(),
                description,
                spec: Arc::new(child),
            });
        }
        self.sub_agents = read;
        Ok(())
    }

    pub(super) fn from_file_in(
        path: &Path,
        stack: &mut Vec<std::path::PathBuf>,
    ) -> Result<Self, SpecError> {
        let mut spec = Self::read_file(path)?;
        if !spec.agents.is_empty() {
            let dir = path.parent().unwrap_or(Path::new("."));
            let shown = path.display().to_string();
            spec.read_sub_agents(dir, stack, Some(&shown))?;
        }
        Ok(spec)
    }
}
