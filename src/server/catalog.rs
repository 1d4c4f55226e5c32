//! The agents a server runs: every manifest in `--agents DIR`, by `name`,
//! prepared once on the host (model resolved, tools selected). Reloaded
//! whole on SIGHUP: a directory with a manifest that does not load or
//! prepare is refused and the previous catalog stays.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Agent, AgentSpec, Host};

/// The agents by name.
#[derive(Clone, Default)]
pub struct Catalog {
    agents: BTreeMap<String, Agent>,
}

/// Why an agents directory was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// The directory could not be read.
    #[error("cannot read the agents directory {path}: {reason}")]
    Read {
        /// The directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// A manifest did not load or prepare.
    #[error("agent manifest {path}: {reason}")]
    Manifest {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Two manifests share a name.
    #[error("two manifests are named `{name}`: {first} and {second}")]
    Duplicate {
        /// The name.
        name: String,
        /// One file.
        first: String,
        /// The other.
        second: String,
    },
}

impl Catalog {
    /// Loads every `*.yaml` / `*.yml` file of `dir` and prepares it on `host`.
    pub fn load(dir: &Path, host: &Host) -> Result<Self, CatalogError> {
        let read = |e: std::io::Error| CatalogError::Read {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(read)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
            })
            .collect();
        files.sort();
        let mut agents = BTreeMap::new();
        let mut origin: BTreeMap<String, String> = BTreeMap::new();
        for file in files {
            let fail = |reason: String| CatalogError::Manifest {
                path: file.display().to_string(),
                reason,
            };
            let spec = AgentSpec::from_file(&file).map_err(|e| fail(e.to_string()))?;
            let name = spec.name.clone();
            if let Some(first) = origin.get(&name) {
                return Err(CatalogError::Duplicate {
                    name,
                    first: first.clone(),
                    second: file.display().to_string(),
                });
            }
            let agent = host.agent(spec).map_err(|e| fail(e.to_string()))?;
            origin.insert(name.clone(), file.display().to_string());
            agents.insert(name, agent);
        }
        Ok(Catalog { agents })
    }

    /// A catalog of prepared agents (tests, embedding).
    pub fn from_agents(agents: impl IntoIterator<Item = Agent>) -> Self {
        Catalog {
            agents: agents
                .into_iter()
                .map(|a| (a.name().to_string(), a))
                .collect(),
        }
    }

    /// An agent by name.
    pub fn get(&self, name: &str) -> Option<&Agent> {
        self.agents.get(name)
    }

    /// Every agent, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Agent> {
        self.agents.values()
    }

    /// How many agents.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}
