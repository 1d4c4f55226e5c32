//! The agents a server runs: every manifest in `--agents DIR`, by `name`,
//! prepared on the host (model resolved, tools selected).
//!
//! - **A manifest that cannot be prepared is skipped, not fatal.** It does
//!   not parse, names an unknown model or tool, or shares its `name` with
//!   an earlier file: it is left out, the others are served, and
//!   [`failed`](Catalog::failed) (and `GET /v1/agents`) says which file and
//!   why. Only a directory that cannot be read is refused.
//! - **MCP servers start on first use.** A manifest that names MCP servers
//!   is checked when loaded (its model and built-in tools) and prepared on
//!   its first run or session, when its servers start (`scope: host`: one
//!   per definition, shared by every run after). A server that does not
//!   start fails that run with its `mcp_*` error kind and is tried again
//!   on the next use.
//!
//! Reloaded whole on SIGHUP: the new catalog replaces the old one, with its
//! own skipped manifests.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::host::SubmitError;
use crate::{Agent, AgentSpec, Host};

/// The agents by name.
#[derive(Clone, Default)]
pub struct Catalog {
    agents: BTreeMap<String, Entry>,
    failed: Vec<FailedManifest>,
}

/// One agent of the catalog.
#[derive(Clone)]
enum Entry {
    /// Prepared.
    Ready(Agent),
    /// Names MCP servers: prepared on first use.
    OnFirstUse(Arc<OnFirstUse>),
}

/// A manifest with MCP servers, prepared when it is first used.
struct OnFirstUse {
    spec: Arc<AgentSpec>,
    host: Host,
    /// The agent without its MCP tools (what `GET /v1/agents` shows), when
    /// it could be prepared without them.
    view: Option<Agent>,
    /// The agent once prepared with its servers up.
    prepared: tokio::sync::Mutex<Option<Agent>>,
}

/// One agent of the catalog as a listing shows it.
pub(crate) struct Listed<'a> {
    /// Its name.
    pub(crate) name: &'a str,
    /// Its manifest.
    pub(crate) spec: &'a AgentSpec,
    /// The model it runs on.
    pub(crate) model: String,
    /// The agent, once prepared (or its view, for one prepared on first
    /// use): what tells its tools' effect classes.
    pub(crate) prepared: Option<&'a Agent>,
}

/// A manifest the catalog left out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FailedManifest {
    /// The file.
    pub file: String,
    /// Why it was left out.
    pub reason: String,
}

impl std::fmt::Display for FailedManifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "agent manifest {} skipped: {}", self.file, self.reason)
    }
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
}

impl Catalog {
    /// Loads every `*.yaml` / `*.yml` file of `dir` and prepares it on
    /// `host` (a manifest with MCP servers on its first use); a manifest
    /// that cannot be prepared is skipped (see the module docs).
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
        let mut catalog = Catalog::default();
        let mut origin: BTreeMap<String, String> = BTreeMap::new();
        for file in files {
            let shown = file.display().to_string();
            match Self::entry(&file, host) {
                Ok((name, entry)) => {
                    if let Some(first) = origin.get(&name) {
                        catalog.failed.push(FailedManifest {
                            file: shown,
                            reason: format!("another manifest, {first}, is named `{name}`"),
                        });
                        continue;
                    }
                    origin.insert(name.clone(), shown);
                    catalog.agents.insert(name, entry);
                }
                Err(reason) => catalog.failed.push(FailedManifest {
                    file: shown,
                    reason,
                }),
            }
        }
        Ok(catalog)
    }

    /// The agent of manifest `file`, by name, or why it cannot be served.
    fn entry(file: &Path, host: &Host) -> Result<(String, Entry), String> {
        let spec = AgentSpec::from_file(file).map_err(|e| e.to_string())?;
        let name = spec.name.clone();
        if spec.mcp.as_ref().is_none_or(|m| m.servers.is_empty()) {
            let agent = host.agent(spec).map_err(|e| e.to_string())?;
            return Ok((name, Entry::Ready(agent)));
        }
        // Checked without its MCP servers: a wrong model or judge is told
        // now; a tool name may be one of the servers' (told on first use).
        let mut bare = spec.clone();
        bare.mcp = None;
        let view = match host.agent(bare) {
            Ok(a) => Some(a),
            Err(SubmitError::Tool(_)) => None,
            Err(e) => return Err(e.to_string()),
        };
        let entry = OnFirstUse {
            spec: Arc::new(spec),
            host: host.clone(),
            view,
            prepared: tokio::sync::Mutex::new(None),
        };
        Ok((name, Entry::OnFirstUse(Arc::new(entry))))
    }

    /// A catalog of prepared agents (tests, embedding).
    pub fn from_agents(agents: impl IntoIterator<Item = Agent>) -> Self {
        Catalog {
            agents: agents
                .into_iter()
                .map(|a| (a.name().to_string(), Entry::Ready(a)))
                .collect(),
            failed: Vec::new(),
        }
    }

    /// An agent by name, ready to run: a manifest with MCP servers is
    /// prepared (its servers started) on its first use; `Err` when that
    /// fails. `None`: no such agent.
    pub async fn agent(&self, name: &str) -> Option<Result<Agent, SubmitError>> {
        match self.agents.get(name)? {
            Entry::Ready(a) => Some(Ok(a.clone())),
            Entry::OnFirstUse(lazy) => Some(lazy.prepare().await),
        }
    }

    /// A prepared agent by name (`None` for one whose MCP servers have not
    /// started yet: see [`agent`](Self::agent)).
    pub fn get(&self, name: &str) -> Option<&Agent> {
        match self.agents.get(name)? {
            Entry::Ready(a) => Some(a),
            Entry::OnFirstUse(_) => None,
        }
    }

    /// Every agent, by name, with what `GET /v1/agents` shows of it.
    pub(crate) fn listed(&self) -> impl Iterator<Item = Listed<'_>> {
        self.agents.iter().map(|(name, entry)| match entry {
            Entry::Ready(a) => Listed {
                name,
                spec: a.spec(),
                model: a.model().name().to_string(),
                prepared: Some(a),
            },
            Entry::OnFirstUse(lazy) => Listed {
                name,
                spec: &lazy.spec,
                model: lazy.view.as_ref().map_or_else(
                    || crate::providers::effective_model(&lazy.spec).to_string(),
                    |a| a.model().name().to_string(),
                ),
                prepared: lazy.view.as_ref(),
            },
        })
    }

    /// The manifests left out, and why.
    pub fn failed(&self) -> &[FailedManifest] {
        &self.failed
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

impl OnFirstUse {
    /// The agent with its MCP servers up; prepared once (every caller
    /// waits for the same preparation). One whose servers did not start is
    /// handed out (its runs end with the servers' error) but not kept: the
    /// next use starts them again.
    async fn prepare(&self) -> Result<Agent, SubmitError> {
        let mut prepared = self.prepared.lock().await;
        if let Some(a) = prepared.as_ref() {
            return Ok(a.clone());
        }
        let agent = self.host.prepare(self.spec.clone()).await?;
        if agent.unusable_reason().is_none() {
            *prepared = Some(agent.clone());
        }
        Ok(agent)
    }
}
