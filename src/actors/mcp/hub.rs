//! A host's MCP servers: one actor per server definition (`scope: host`),
//! started when an agent that names it is first prepared, shared by every
//! run after, stopped with the host.
//!
//! The server actors are children of the host's root actor (its
//! supervisor), beside the critic shards: a server actor that fails is
//! seen there, and the next agent prepared with its definition gets a
//! fresh one. `list_mcp_tools` (no host) spawns them unsupervised.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ractor::{ActorCell, ActorRef, ActorStatus};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

use super::per_run::{self, RunScopedTool, RunServers};
use super::{McpMsg, McpServer};
use crate::dispatch::CompiledTool;
use crate::mcp::client::{Avail, Link};
use crate::mcp::tool::event_sink;
use crate::mcp::{McpConfig, McpError, ServedTool};
use crate::ports::run::RunId;
use crate::record::RunShared;
use crate::spec::mcp::{McpScope, McpServerSpec};

/// The MCP servers of one host.
pub(crate) struct McpHub {
    config: McpConfig,
    servers: Mutex<HashMap<McpServerSpec, ActorRef<McpMsg>>>,
    /// The tools of each `scope: run` server, as discovered once.
    templates: Mutex<HashMap<McpServerSpec, Vec<ServedTool>>>,
    runs: Arc<RunServers>,
    /// The host's root actor, which supervises the server actors (`None`:
    /// unsupervised, for a listing without a host).
    supervisor: Option<ActorCell>,
}

impl McpHub {
    pub(crate) fn new(config: McpConfig, supervisor: Option<ActorCell>) -> Self {
        McpHub {
            runs: RunServers::new(config.clone(), supervisor.clone()),
            supervisor,
            config,
            servers: Mutex::new(HashMap::new()),
            templates: Mutex::new(HashMap::new()),
        }
    }

    /// Stops run `run_id`'s own servers once it has ended.
    pub(crate) fn watch_run(&self, shared: Arc<RunShared>, run_id: RunId) {
        let runs = self.runs.clone();
        tokio::spawn(async move {
            shared.result().await;
            runs.end_run(run_id).await;
        });
    }

    /// The tools of `scope: run` server `spec`: discovered by starting it
    /// once (then stopping it), each routing a run's calls to its own server.
    async fn run_scoped(&self, spec: &McpServerSpec) -> Result<Vec<ServedTool>, McpError> {
        if let Some(t) = lock(&self.templates).get(spec) {
            return Ok(t.clone());
        }
        let (actor, listed) = per_run::start(spec, &self.config, self.supervisor.as_ref()).await?;
        per_run::stop_all(vec![actor], &self.config).await;
        let server = Arc::new(spec.clone());
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let mut tools = Vec::with_capacity(listed.len());
        for t in listed.iter() {
            let tool = RunScopedTool {
                runs: self.runs.clone(),
                server: server.clone(),
                remote: t.remote.clone(),
                spec: t.tool.spec().clone(),
            };
            let compiled =
                CompiledTool::new(Arc::new(tool)).map_err(|e| McpError::InvalidName {
                    server: spec.name.clone(),
                    message: e.to_string(),
                })?;
            tools.push(ServedTool {
                server: name.clone(),
                remote: t.remote.clone(),
                tool: compiled,
            });
        }
        lock(&self.templates).insert(spec.clone(), tools.clone());
        Ok(tools)
    }

    /// The tools of `servers`, in order, each server started if it is not
    /// up (every caller waits for the same start).
    pub(crate) async fn tools_for(
        &self,
        servers: &[McpServerSpec],
    ) -> Result<Vec<ServedTool>, McpError> {
        let mut out = Vec::new();
        for spec in servers {
            if spec.scope == McpScope::Run {
                out.extend(self.run_scoped(spec).await?);
                continue;
            }
            let actor = self.server(spec).await?;
            let tools = per_run::ensure(&actor, spec, &self.config).await?;
            let name: Arc<str> = Arc::from(spec.name.as_str());
            out.extend(tools.iter().map(|t| ServedTool {
                server: name.clone(),
                remote: t.remote.clone(),
                tool: t.tool.clone(),
            }));
        }
        Ok(out)
    }

    /// The actor of `spec`, spawned if there is none.
    async fn server(&self, spec: &McpServerSpec) -> Result<ActorRef<McpMsg>, McpError> {
        if let Some(a) = self.lock().get(spec) {
            // A server actor that failed (its supervisor saw it) is replaced.
            if !matches!(a.get_status(), ActorStatus::Stopping | ActorStatus::Stopped) {
                return Ok(a.clone());
            }
        }
        let link = Link::new();
        let (avail, _) = watch::channel(Avail::Starting);
        let actor = McpServer {
            spec: Arc::new(spec.clone()),
            config: self.config.clone(),
            events: event_sink(link.clone()),
            link,
            avail,
        };
        let actor = per_run::spawn(actor, self.supervisor.as_ref()).await?;
        let mut map = self.lock();
        if let Some(existing) = map
            .get(spec)
            .filter(|a| !matches!(a.get_status(), ActorStatus::Stopping | ActorStatus::Stopped))
        {
            // Another caller won the race: use its server.
            actor.stop(None);
            return Ok(existing.clone());
        }
        map.insert(spec.clone(), actor.clone());
        Ok(actor)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<McpServerSpec, ActorRef<McpMsg>>> {
        lock(&self.servers)
    }

    /// Stops every server (each its stop sequence, all at once) and waits.
    pub(crate) async fn shutdown(&self) {
        let mut actors: Vec<ActorRef<McpMsg>> = self.lock().drain().map(|(_, a)| a).collect();
        actors.extend(self.runs.take_all());
        per_run::stop_all(actors, &self.config).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Drop for McpHub {
    /// A host dropped without `shutdown`: its servers' actors stop, which
    /// kills their process groups.
    fn drop(&mut self) {
        for (_, a) in self.lock().drain() {
            a.stop(None);
        }
        for a in self.runs.take_all() {
            a.stop(None);
        }
    }
}

/// One tool as `agentvisor mcp tools` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ListedTool {
    /// The server's manifest name.
    pub server: String,
    /// The name the model sees (`<server>__<tool>`).
    pub name: String,
    /// Its description.
    pub description: String,
    /// Its argument schema.
    pub parameters: Value,
    /// Its effect class, from the server's annotations (`read`, `write`,
    /// `egress`, `unknown`; a manifest's `tools_effects` is applied by
    /// whoever lists them for it).
    pub effects: crate::ports::tool::ToolEffect,
}

/// Starts `servers`, lists their tools as a model would see them, and
/// stops them.
pub async fn list_mcp_tools(
    servers: &[McpServerSpec],
    config: McpConfig,
) -> Result<Vec<ListedTool>, McpError> {
    let hub = McpHub::new(config, None);
    let mut out = Vec::new();
    let mut result = Ok(());
    for spec in servers {
        match hub.tools_for(std::slice::from_ref(spec)).await {
            Ok(tools) => out.extend(tools.iter().map(|t| ListedTool {
                server: spec.name.clone(),
                name: t.tool.spec().name.clone(),
                description: t.tool.spec().description.clone(),
                parameters: t.tool.spec().parameters.clone(),
                effects: t.tool.tool().effect(),
            })),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    hub.shutdown().await;
    result.map(|()| out)
}
