//! A host's MCP servers: one actor per server definition (`scope: host`),
//! started when an agent that names it is first prepared, shared by every
//! run after, stopped with the host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

use super::client::Link;
use super::spec::McpServerSpec;
use super::tool::event_sink;
use super::{McpConfig, McpError};
use crate::actors::mcp::{Avail, McpMsg, McpServer};
use crate::tools::CompiledTool;

/// The MCP servers of one host.
pub(crate) struct McpHub {
    config: McpConfig,
    servers: Mutex<HashMap<McpServerSpec, ActorRef<McpMsg>>>,
}

impl McpHub {
    pub(crate) fn new(config: McpConfig) -> Self {
        McpHub {
            config,
            servers: Mutex::new(HashMap::new()),
        }
    }

    /// The tools of `servers`, in order, each server started if it is not
    /// up (every caller waits for the same start).
    pub(crate) async fn tools_for(
        &self,
        servers: &[McpServerSpec],
    ) -> Result<Vec<CompiledTool>, McpError> {
        let mut out = Vec::new();
        for spec in servers {
            let actor = self.server(spec).await?;
            let wait = self.config.start_timeout + Duration::from_secs(5);
            let tools = match actor.call(|r| McpMsg::Ensure(Some(r)), Some(wait)).await {
                Ok(CallResult::Success(r)) => r?,
                Ok(CallResult::Timeout) => {
                    return Err(McpError::StartFailed {
                        server: spec.name.clone(),
                        reason: "no answer from its supervisor in time".into(),
                        stderr_tail: String::new(),
                    })
                }
                Ok(CallResult::SenderError) | Err(_) => {
                    return Err(McpError::Unavailable(format!(
                        "mcp server `{}` is stopped",
                        spec.name
                    )))
                }
            };
            out.extend(tools.iter().cloned());
        }
        Ok(out)
    }

    /// The actor of `spec`, spawned if there is none.
    async fn server(&self, spec: &McpServerSpec) -> Result<ActorRef<McpMsg>, McpError> {
        if let Some(a) = self.lock().get(spec) {
            return Ok(a.clone());
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
        let (actor, _) = Actor::spawn(None, actor, ())
            .await
            .map_err(|e| McpError::Unavailable(format!("cannot spawn the server actor: {e}")))?;
        let mut map = self.lock();
        if let Some(existing) = map.get(spec) {
            // Another caller won the race: use its server.
            actor.stop(None);
            return Ok(existing.clone());
        }
        map.insert(spec.clone(), actor.clone());
        Ok(actor)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<McpServerSpec, ActorRef<McpMsg>>> {
        match self.servers.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Stops every server (each its stop sequence, all at once) and waits.
    pub(crate) async fn shutdown(&self) {
        let actors: Vec<ActorRef<McpMsg>> = self.lock().drain().map(|(_, a)| a).collect();
        let wait = self.config.stdin_grace + self.config.term_grace + Duration::from_secs(2);
        let stops = actors.iter().map(|a| a.call(McpMsg::Stop, Some(wait)));
        futures_util::future::join_all(stops).await;
        for a in actors {
            a.stop(None);
        }
    }
}

impl Drop for McpHub {
    /// A host dropped without `shutdown`: its servers' actors stop, which
    /// kills their process groups.
    fn drop(&mut self) {
        for (_, a) in self.lock().drain() {
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
}

/// Starts `servers`, lists their tools as a model would see them, and
/// stops them.
pub async fn list_tools(
    servers: &[McpServerSpec],
    config: McpConfig,
) -> Result<Vec<ListedTool>, McpError> {
    let hub = McpHub::new(config);
    let mut out = Vec::new();
    let mut result = Ok(());
    for spec in servers {
        match hub.tools_for(std::slice::from_ref(spec)).await {
            Ok(tools) => out.extend(tools.iter().map(|t| ListedTool {
                server: spec.name.clone(),
                name: t.spec().name.clone(),
                description: t.spec().description.clone(),
                parameters: t.spec().parameters.clone(),
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
