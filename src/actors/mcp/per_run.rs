//! `scope: run` servers: one process per run that calls the server, started
//! at its first call and stopped when the run ends.
//!
//! The model sees the tools the server listed when the agent was prepared
//! (a discovery start, stopped at once); a run's calls go to its own
//! server, started on the first of them (every call of the run waits for the
//! same start). `tools/list_changed` of a run's server does not change the
//! tools its run sees.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorCell, ActorRef};
use serde_json::Value;
use tokio::sync::{watch, OnceCell};

use super::{McpMsg, McpServer};
use crate::mcp::client::{Avail, Link};
use crate::mcp::tool::{event_sink, ServerTools};
use crate::mcp::{McpConfig, McpError};
use crate::ports::model::ToolSpec;
use crate::ports::run::RunId;
use crate::ports::tool::{Tool, ToolContext, ToolError};
use crate::spec::mcp::McpServerSpec;

type Started = Result<(ActorRef<McpMsg>, ServerTools), McpError>;

/// The run-scoped servers of a host, by run and server name.
pub(crate) struct RunServers {
    config: McpConfig,
    by_run: DashMap<(RunId, String), Arc<OnceCell<Started>>>,
    /// The host's root actor, which supervises the server actors.
    supervisor: Option<ActorCell>,
}

impl RunServers {
    pub(crate) fn new(config: McpConfig, supervisor: Option<ActorCell>) -> Arc<Self> {
        Arc::new(RunServers {
            config,
            supervisor,
            by_run: DashMap::new(),
        })
    }

    /// Run `run`'s server `spec`, started on first use.
    async fn server_of(&self, run: RunId, spec: &McpServerSpec) -> Started {
        let cell = self
            .by_run
            .entry((run, spec.name.clone()))
            .or_default()
            .clone();
        cell.get_or_init(|| start(spec, &self.config, self.supervisor.as_ref()))
            .await
            .clone()
    }

    /// Stops the servers of run `run` (when it has ended).
    pub(crate) async fn end_run(&self, run: RunId) {
        let keys: Vec<(RunId, String)> = self
            .by_run
            .iter()
            .filter(|e| e.key().0 == run)
            .map(|e| e.key().clone())
            .collect();
        let mut actors = Vec::new();
        for k in keys {
            if let Some((_, cell)) = self.by_run.remove(&k) {
                if let Some(Ok((a, _))) = cell.get() {
                    actors.push(a.clone());
                }
            }
        }
        stop_all(actors, &self.config).await;
    }

    /// Every run's server actors, forgotten here.
    pub(crate) fn take_all(&self) -> Vec<ActorRef<McpMsg>> {
        let keys: Vec<(RunId, String)> = self.by_run.iter().map(|e| e.key().clone()).collect();
        keys.into_iter()
            .filter_map(|k| self.by_run.remove(&k))
            .filter_map(|(_, cell)| match cell.get() {
                Some(Ok((a, _))) => Some(a.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Stops server actors, each through its stop sequence, all at once.
pub(crate) async fn stop_all(actors: Vec<ActorRef<McpMsg>>, config: &McpConfig) {
    let wait = config.stdin_grace + config.term_grace + Duration::from_secs(2);
    let stops = actors.iter().map(|a| a.call(McpMsg::Stop, Some(wait)));
    futures_util::future::join_all(stops).await;
    for a in actors {
        a.stop(None);
    }
}

/// Spawns a server actor, a child of `supervisor` when there is one.
pub(crate) async fn spawn(
    actor: McpServer,
    supervisor: Option<&ActorCell>,
) -> Result<ActorRef<McpMsg>, McpError> {
    let spawned = match supervisor {
        Some(s) => Actor::spawn_linked(None, actor, (), s.clone()).await,
        None => Actor::spawn(None, actor, ()).await,
    };
    spawned
        .map(|(actor, _)| actor)
        .map_err(|e| McpError::Unavailable(format!("cannot spawn the server actor: {e}")))
}

/// Spawns a server actor for `spec` (supervised by `supervisor`) and waits
/// for its tools.
pub(crate) async fn start(
    spec: &McpServerSpec,
    config: &McpConfig,
    supervisor: Option<&ActorCell>,
) -> Started {
    let link = Link::new();
    let (avail, _) = watch::channel(Avail::Starting);
    let actor = McpServer {
        spec: Arc::new(spec.clone()),
        config: config.clone(),
        events: event_sink(link.clone()),
        link,
        avail,
    };
    let actor = spawn(actor, supervisor).await?;
    let tools = ensure(&actor, spec, config).await;
    match tools {
        Ok(t) => Ok((actor, t)),
        Err(e) => {
            actor.stop(None);
            Err(e)
        }
    }
}

/// Asks `actor` for its server's tools (starting it if need be).
pub(crate) async fn ensure(
    actor: &ActorRef<McpMsg>,
    spec: &McpServerSpec,
    config: &McpConfig,
) -> Result<ServerTools, McpError> {
    let wait = config.start_timeout + Duration::from_secs(5);
    match actor.call(|r| McpMsg::Ensure(Some(r)), Some(wait)).await {
        Ok(CallResult::Success(r)) => r,
        Ok(CallResult::Timeout) => Err(McpError::StartFailed {
            server: spec.name.clone(),
            reason: "no answer from its supervisor in time".into(),
            stderr_tail: String::new(),
        }),
        Ok(CallResult::SenderError) | Err(_) => Err(McpError::Unavailable(format!(
            "mcp server `{}` is stopped",
            spec.name
        ))),
    }
}

/// A tool of a `scope: run` server: each run calls its own server.
pub(crate) struct RunScopedTool {
    pub(crate) runs: Arc<RunServers>,
    pub(crate) server: Arc<McpServerSpec>,
    pub(crate) remote: Arc<str>,
    pub(crate) spec: ToolSpec,
}

#[async_trait]
impl Tool for RunScopedTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<String, ToolError> {
        let started = tokio::select! {
            s = self.runs.server_of(ctx.run_id, &self.server) => s,
            _ = ctx.cancelled() => {
                return Err(McpError::Cancelled { tool: self.spec.name.clone() }.into_tool_error())
            }
        };
        let (_, tools) = started.map_err(McpError::into_tool_error)?;
        let Some(t) = tools.iter().find(|t| t.remote == self.remote) else {
            return Err(McpError::InvalidName {
                server: self.server.name.clone(),
                message: format!("this run's server does not list `{}`", self.remote),
            }
            .into_tool_error());
        };
        t.tool.tool().call(args, ctx).await
    }

    fn timeout_error(&self, timeout_ms: u64) -> ToolError {
        McpError::ToolTimeout {
            tool: self.spec.name.clone(),
            ms: timeout_ms,
        }
        .into_tool_error()
    }
}
