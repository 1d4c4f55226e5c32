//! The MCP server actor: one per server and scope (a host's shared server,
//! or one run's), supervising the server's connection.
//!
//! It starts the server on the first [`McpMsg::Ensure`] (every asker
//! waits for the same start), watches it for a crash, restarts it with
//! exponential backoff (after `max_restarts` within `restart_window` it
//! cools down: calls fail `mcp_server_crashed` until `cool_down` ends and a
//! call asks again), refreshes its tool list on
//! `notifications/tools/list_changed`, and stops it on [`McpMsg::Stop`] (or,
//! when it is stopped without that, kills its process group).
//!
//! Calls do not go through this mailbox: the actor publishes the server's
//! availability ([`Avail`]) on a watch channel that every tool reads, so a
//! call costs the request alone. The mailbox sees starts, exits, list
//! changes and stops: a few messages per server lifetime.
//!
//! Slow work (connecting, listing, stopping) runs in tasks whose outcome
//! comes back as a message tagged with the connection's generation, so a
//! late answer about an older connection is ignored.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;

use crate::mcp::client::{self, Avail, Connection, Link};
use crate::mcp::process::ExitCode;
use crate::mcp::tool::{build_tools, AskStart, ServerTools};
use crate::mcp::{McpConfig, McpError};
use crate::ports::event::RunEvent;
use crate::spec::mcp::McpServerSpec;

pub(crate) mod hub;
pub(crate) mod per_run;

pub use hub::{list_mcp_tools, ListedTool};

/// What the actor tells those who asked for the server.
pub(crate) type EnsureReply = RpcReplyPort<Result<ServerTools, McpError>>;

/// Messages to a server actor.
pub enum McpMsg {
    /// Start the server unless it is up; answer with its tools when it is
    /// (or at once with the error of a server that cannot start now).
    Ensure(Option<EnsureReply>),
    /// A start ended.
    Connected {
        /// The connection's generation.
        generation: u64,
        /// The connection, or why not.
        result: Box<Result<Connection, McpError>>,
        /// How long it took.
        ms: u64,
    },
    /// The server's process exited (or its HTTP connection broke).
    Exited {
        /// The connection's generation.
        generation: u64,
        /// How.
        code: ExitCode,
    },
    /// The backoff before a restart ended.
    Restart {
        /// The generation that crashed.
        generation: u64,
    },
    /// The server said its tool list changed.
    ListChanged,
    /// A refreshed tool list.
    Listed {
        /// The connection's generation.
        generation: u64,
        /// The tools, or why not.
        result: Result<Vec<rmcp::model::Tool>, String>,
    },
    /// Stop the server (its stop sequence), then answer.
    Stop(RpcReplyPort<()>),
}

/// What a server's tools call to ask for a start (a cooled-down or failed
/// server's): an `Ensure` that wants no answer.
fn ask_start(myself: &ActorRef<McpMsg>) -> AskStart {
    let me = myself.clone();
    Arc::new(move || {
        let _ = me.cast(McpMsg::Ensure(None));
    })
}

/// The actor: a server's definition and where it publishes.
pub struct McpServer {
    /// The server's definition.
    pub spec: Arc<McpServerSpec>,
    /// Timeouts and restart policy.
    pub config: McpConfig,
    /// What calls share with the connection.
    pub link: Arc<Link>,
    /// The availability calls read.
    pub avail: watch::Sender<Avail>,
    /// Called with each server event (for the runs that use the server).
    pub events: Arc<dyn Fn(RunEvent) + Send + Sync>,
}

enum Phase {
    Idle,
    Starting,
    Ready,
    Backoff,
    Stopped,
}

/// Its state.
pub struct McpServerState {
    phase: Phase,
    generation: u64,
    conn: Option<Connection>,
    tools: Option<ServerTools>,
    waiters: Vec<EnsureReply>,
    restarts: VecDeque<Instant>,
    /// Set once the server is up once: later starts are restarts.
    started_once: bool,
    /// The last crash's stderr tail (for the error of later calls).
    last_tail: String,
}

impl Actor for McpServer {
    type Msg = McpMsg;
    type State = McpServerState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<McpMsg>,
        _: (),
    ) -> Result<McpServerState, ActorProcessingErr> {
        let me = myself.clone();
        if let Ok(mut f) = self.link.on_list_changed.lock() {
            *f = Some(Box::new(move || {
                let _ = me.cast(McpMsg::ListChanged);
            }));
        }
        Ok(McpServerState {
            phase: Phase::Idle,
            generation: 0,
            conn: None,
            tools: None,
            waiters: Vec::new(),
            restarts: VecDeque::new(),
            started_once: false,
            last_tail: String::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<McpMsg>,
        msg: McpMsg,
        st: &mut McpServerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            McpMsg::Ensure(reply) => self.ensure(&myself, st, reply),
            McpMsg::Connected {
                generation,
                result,
                ms,
            } => self.connected(&myself, st, generation, *result, ms),
            McpMsg::Exited { generation, code } => self.exited(&myself, st, generation, code),
            McpMsg::Restart { generation } => {
                if generation == st.generation && matches!(st.phase, Phase::Backoff) {
                    self.start(&myself, st);
                }
            }
            McpMsg::ListChanged => {
                if let (Phase::Ready, Some(conn)) = (&st.phase, &st.conn) {
                    let peer = conn.service.peer().clone();
                    let generation = st.generation;
                    let me = myself.clone();
                    tokio::spawn(async move {
                        let result = peer.list_all_tools().await.map_err(|e| e.to_string());
                        let _ = me.cast(McpMsg::Listed { generation, result });
                    });
                }
            }
            McpMsg::Listed { generation, result } => {
                if generation != st.generation || !matches!(st.phase, Phase::Ready) {
                    return Ok(());
                }
                match result.and_then(|tools| {
                    build_tools(
                        &self.spec,
                        &self.link,
                        &ask_start(&myself),
                        &self.avail,
                        &self.config,
                        &tools,
                    )
                    .map_err(|e| e.to_string())
                }) {
                    Ok(tools) => {
                        tracing::info!(server = %self.spec.name, tools = tools.len(), "mcp tool list changed");
                        st.tools = Some(tools);
                    }
                    Err(e) => {
                        tracing::warn!(server = %self.spec.name, error = %e, "mcp tool list refresh failed; the old list stays");
                    }
                }
            }
            McpMsg::Stop(reply) => {
                st.phase = Phase::Stopped;
                self.publish(Avail::Down {
                    error: McpError::Unavailable(format!(
                        "mcp server `{}` was stopped",
                        self.spec.name
                    )),
                    retry_at: None,
                });
                for w in st.waiters.drain(..) {
                    let _ = w.send(Err(McpError::Unavailable("the host is stopping".into())));
                }
                let conn = st.conn.take();
                let config = self.config.clone();
                tokio::spawn(async move {
                    if let Some(conn) = conn {
                        client::close(conn, &config).await;
                    }
                    let _ = reply.send(());
                });
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<McpMsg>,
        st: &mut McpServerState,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped without `Stop` (its host dropped): the process's drop
        // kills its group.
        st.conn.take();
        if let Ok(mut f) = self.link.on_list_changed.lock() {
            f.take();
        }
        Ok(())
    }
}

impl McpServer {
    fn publish(&self, avail: Avail) {
        self.avail.send_replace(avail);
    }

    fn ensure(
        &self,
        myself: &ActorRef<McpMsg>,
        st: &mut McpServerState,
        reply: Option<EnsureReply>,
    ) {
        match st.phase {
            Phase::Ready => {
                if let (Some(r), Some(tools)) = (reply, &st.tools) {
                    let _ = r.send(Ok(tools.clone()));
                }
            }
            Phase::Starting | Phase::Backoff => st.waiters.extend(reply),
            Phase::Stopped => {
                if let Some(r) = reply {
                    let _ = r.send(Err(McpError::Unavailable(format!(
                        "mcp server `{}` was stopped",
                        self.spec.name
                    ))));
                }
            }
            Phase::Idle => {
                // A crash-looping server cools down first.
                if let Avail::Down {
                    error,
                    retry_at: Some(at),
                } = &*self.avail.borrow()
                {
                    if Instant::now() < *at {
                        if let Some(r) = reply {
                            let _ = r.send(Err(error.clone()));
                        }
                        return;
                    }
                }
                st.waiters.extend(reply);
                self.start(myself, st);
            }
        }
    }

    fn start(&self, myself: &ActorRef<McpMsg>, st: &mut McpServerState) {
        st.generation += 1;
        st.phase = Phase::Starting;
        self.publish(Avail::Starting);
        let generation = st.generation;
        let spec = self.spec.clone();
        let link = self.link.clone();
        let config = self.config.clone();
        let me = myself.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let result = client::connect(&spec, link, &config).await;
            let ms = t0.elapsed().as_millis() as u64;
            if let Err(ractor::MessagingErr::SendErr(McpMsg::Connected { result, .. })) =
                me.cast(McpMsg::Connected {
                    generation,
                    result: Box::new(result),
                    ms,
                })
            {
                // The actor is gone: stop what was started.
                if let Ok(conn) = *result {
                    client::close(conn, &config).await;
                }
            }
        });
    }

    fn connected(
        &self,
        myself: &ActorRef<McpMsg>,
        st: &mut McpServerState,
        generation: u64,
        result: Result<Connection, McpError>,
        ms: u64,
    ) {
        if generation != st.generation || !matches!(st.phase, Phase::Starting) {
            if let Ok(conn) = result {
                let config = self.config.clone();
                tokio::spawn(async move { client::close(conn, &config).await });
            }
            return;
        }
        let built = result.and_then(|conn| {
            match build_tools(
                &self.spec,
                &self.link,
                &ask_start(myself),
                &self.avail,
                &self.config,
                &conn.tools,
            ) {
                Ok(tools) => Ok((conn, tools)),
                Err(e) => {
                    let config = self.config.clone();
                    tokio::spawn(async move { client::close(conn, &config).await });
                    Err(e)
                }
            }
        });
        match built {
            Ok((conn, tools)) => {
                let restart = st.started_once;
                st.started_once = true;
                if let Some(p) = &conn.process {
                    let exit = p.on_exit();
                    let me = myself.clone();
                    tokio::spawn(async move {
                        let code = exit.await;
                        let _ = me.cast(McpMsg::Exited { generation, code });
                    });
                } else {
                    // An HTTP server: its connection's end is its exit.
                    let peer = conn.service.peer().clone();
                    let me = myself.clone();
                    tokio::spawn(async move {
                        while !peer.is_transport_closed() {
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        let _ = me.cast(McpMsg::Exited {
                            generation,
                            code: None,
                        });
                    });
                }
                tracing::info!(
                    server = %self.spec.name,
                    tool_count = tools.len(),
                    ms,
                    restart,
                    "mcp.server.start.ok"
                );
                (self.events)(RunEvent::McpServerStartOk {
                    server: self.spec.name.clone(),
                    tool_count: tools.len() as u32,
                    ms,
                });
                self.publish(Avail::Ready(conn.service.peer().clone(), generation));
                st.conn = Some(conn);
                st.tools = Some(tools.clone());
                st.phase = Phase::Ready;
                for w in st.waiters.drain(..) {
                    let _ = w.send(Ok(tools.clone()));
                }
            }
            Err(e) => {
                tracing::warn!(server = %self.spec.name, error = %e, "mcp server start failed");
                if st.started_once && e.kind() == "mcp_server_start_failed" {
                    // A restart that failed is one more crash.
                    let tail = match &e {
                        McpError::StartFailed { stderr_tail, .. } => stderr_tail.clone(),
                        _ => String::new(),
                    };
                    st.last_tail = tail;
                    self.after_crash(myself, st);
                    return;
                }
                st.phase = Phase::Idle;
                // The next asker tries again.
                self.publish(Avail::Down {
                    error: e.clone(),
                    retry_at: Some(Instant::now()),
                });
                for w in st.waiters.drain(..) {
                    let _ = w.send(Err(e.clone()));
                }
            }
        }
    }

    fn exited(
        &self,
        myself: &ActorRef<McpMsg>,
        st: &mut McpServerState,
        generation: u64,
        code: ExitCode,
    ) {
        if generation != st.generation || !matches!(st.phase, Phase::Ready) {
            return;
        }
        let conn = st.conn.take();
        let tail = conn
            .as_ref()
            .and_then(|c| c.process.as_ref())
            .map(|p| p.stderr.text())
            .unwrap_or_default();
        tracing::warn!(
            server = %self.spec.name,
            code = ?code,
            stderr_tail = %tail,
            "mcp.server.exit"
        );
        (self.events)(RunEvent::McpServerExit {
            server: self.spec.name.clone(),
            code,
            stderr_tail: tail.clone(),
        });
        // Dropping the process kills what is left of its group.
        drop(conn);
        st.last_tail = tail;
        self.after_crash(myself, st);
    }

    /// Restart with backoff, or cool down after too many restarts.
    fn after_crash(&self, myself: &ActorRef<McpMsg>, st: &mut McpServerState) {
        let now = Instant::now();
        let window = self.config.restart_window;
        while st
            .restarts
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= window)
        {
            st.restarts.pop_front();
        }
        if st.restarts.len() as u32 >= self.config.max_restarts {
            st.phase = Phase::Idle;
            st.restarts.clear();
            let error = McpError::Crashed {
                server: self.spec.name.clone(),
                reason: format!(
                    "it crashed {} times within {} s; cooling down for {} s",
                    self.config.max_restarts + 1,
                    window.as_secs(),
                    self.config.cool_down.as_secs()
                ),
                stderr_tail: st.last_tail.clone(),
            };
            tracing::warn!(server = %self.spec.name, "mcp server crash loop: cooling down");
            self.publish(Avail::Down {
                error: error.clone(),
                retry_at: Some(now + self.config.cool_down),
            });
            for w in st.waiters.drain(..) {
                let _ = w.send(Err(error.clone()));
            }
            return;
        }
        st.restarts.push_back(now);
        let attempt = st.restarts.len() as u32;
        let factor = 1u32 << (attempt - 1).min(16);
        let delay = (self.config.backoff * factor).min(self.config.max_backoff);
        tracing::info!(server = %self.spec.name, attempt, delay_ms = delay.as_millis() as u64, "mcp.server.restart");
        (self.events)(RunEvent::McpServerRestart {
            server: self.spec.name.clone(),
            attempt,
            delay_ms: delay.as_millis() as u64,
        });
        st.phase = Phase::Backoff;
        // Calls wait for the restart (within their own timeout).
        self.publish(Avail::Starting);
        let generation = st.generation;
        myself.send_after(delay, move || McpMsg::Restart { generation });
    }
}
