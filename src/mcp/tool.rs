//! An MCP server's tools as [`Tool`]s: what a run's tool set holds.
//!
//! A call reads the server's availability (no actor round trip), sends
//! `tools/call` with a progress token, and waits for the answer, the run's
//! cancellation signal, or its own drop (the registry's `tool_timeout`).
//! Every way out but an answer sends the server `notifications/cancelled`
//! for the request. Progress the server reports is a heartbeat of the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CancelledNotification, CancelledNotificationParam, ClientRequest,
    ProgressToken, Request, RequestId, ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use rmcp::RoleClient;
use serde_json::Value;
use tokio::sync::watch;

use super::client::{Avail, Link};
use super::names::{is_callable, model_names};
use super::{result, McpConfig, McpError};
use crate::dispatch::CompiledTool;
use crate::ports::event::RunEvent;
use crate::ports::model::ToolSpec;
use crate::ports::tool::{Tool, ToolContext, ToolEffect, ToolError};
use crate::spec::mcp::McpServerSpec;

/// One tool of a server: its own name there, and the tool a run calls.
#[derive(Clone)]
pub(crate) struct ServerTool {
    pub(crate) remote: Arc<str>,
    pub(crate) tool: CompiledTool,
}

/// A server's tools, compiled, in the server's order (after `allow`).
pub(crate) type ServerTools = Arc<[ServerTool]>;

/// How a tool asks its server's actor to start the server again (a
/// cooled-down or failed server, once its `retry_at` has come).
pub(crate) type AskStart = Arc<dyn Fn() + Send + Sync>;

/// Server events waiting for a run to carry them, at most.
const PENDING_EVENTS: usize = 16;

/// What the tools of one server share.
pub(crate) struct ServerShared {
    pub(crate) name: String,
    link: Arc<Link>,
    avail: watch::Receiver<Avail>,
    ask_start: AskStart,
    next_call: AtomicU64,
}

/// Where a server's events go: the runs with calls in flight, else the
/// next call's run.
pub(crate) fn event_sink(link: Arc<Link>) -> Arc<dyn Fn(RunEvent) + Send + Sync> {
    Arc::new(move |ev: RunEvent| {
        let mut told = false;
        for call in link.calls.iter() {
            call.value().event(ev.clone());
            told = true;
        }
        if !told {
            if let Ok(mut p) = link.pending.lock() {
                if p.len() < PENDING_EVENTS {
                    p.push(ev);
                }
            }
        }
    })
}

/// The tools of server `spec` from its `tools/list` answer: model names
/// given, `allow` applied (an allowed name the server lacks is
/// `mcp_tool_invalid_name`), schemas compiled.
pub(crate) fn build_tools(
    spec: &McpServerSpec,
    link: &Arc<Link>,
    ask_start: &AskStart,
    avail: &watch::Sender<Avail>,
    _config: &McpConfig,
    listed: &[rmcp::model::Tool],
) -> Result<ServerTools, McpError> {
    let invalid = |message: String| McpError::InvalidName {
        server: spec.name.clone(),
        message,
    };
    if let Some(allow) = &spec.allow {
        for a in allow {
            if !listed.iter().any(|t| t.name == a.as_str()) {
                return Err(invalid(format!(
                    "`allow` names `{a}`, which the server does not list"
                )));
            }
        }
    }
    let chosen: Vec<&rmcp::model::Tool> = listed
        .iter()
        .filter(|t| {
            if !is_callable(&t.name) {
                tracing::warn!(server = %spec.name, "mcp tool with an uncallable name left out");
                return false;
            }
            spec.allow
                .as_ref()
                .is_none_or(|a| a.iter().any(|n| n == t.name.as_ref()))
        })
        .collect();
    let own: Vec<&str> = chosen.iter().map(|t| t.name.as_ref()).collect();
    let names = model_names(&spec.name, &own);
    let shared = Arc::new(ServerShared {
        name: spec.name.clone(),
        link: link.clone(),
        avail: avail.subscribe(),
        ask_start: ask_start.clone(),
        next_call: AtomicU64::new(0),
    });
    let mut out = Vec::with_capacity(chosen.len());
    for (t, model_name) in chosen.into_iter().zip(names) {
        let mut schema = Value::Object((*t.input_schema).clone());
        if let Value::Object(m) = &mut schema {
            // Providers want an object schema; some servers leave the type out.
            m.entry("type")
                .or_insert_with(|| Value::String("object".into()));
        }
        let tool = McpTool {
            server: shared.clone(),
            effect: effect_of(t.annotations.as_ref()),
            remote: Arc::from(t.name.as_ref()),
            spec: ToolSpec {
                name: model_name,
                description: t
                    .description
                    .as_deref()
                    .map(|d| crate::ports::run::cap_text(d, 4096))
                    .unwrap_or_default(),
                parameters: schema,
            },
        };
        let remote = tool.remote.clone();
        let compiled = CompiledTool::new(Arc::new(tool)).map_err(|e| invalid(e.to_string()))?;
        out.push(ServerTool {
            remote,
            tool: compiled,
        });
    }
    Ok(out.into())
}

/// A tool's effect class from the annotations its server lists: only
/// what a hint says outright counts (the protocol's defaults assume the
/// worst, which `unknown` already is). `readOnlyHint: true` is `read`;
/// else `openWorldHint: true` is `egress` (it reaches outside: the
/// stricter of the two when a tool is both); else `destructiveHint: true`,
/// or `readOnlyHint: false` (it changes its environment), is `write`;
/// nothing said is `unknown`.
pub(crate) fn effect_of(annotations: Option<&rmcp::model::ToolAnnotations>) -> ToolEffect {
    let Some(a) = annotations else {
        return ToolEffect::Unknown;
    };
    if a.read_only_hint == Some(true) {
        ToolEffect::Read
    } else if a.open_world_hint == Some(true) {
        ToolEffect::Egress
    } else if a.destructive_hint == Some(true) || a.read_only_hint == Some(false) {
        ToolEffect::Write
    } else {
        ToolEffect::Unknown
    }
}

/// One tool of an MCP server.
pub(crate) struct McpTool {
    server: Arc<ServerShared>,
    /// Its effect class, from its annotations ([`effect_of`]).
    effect: ToolEffect,
    /// The server's own name for it.
    remote: Arc<str>,
    spec: ToolSpec,
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn effect(&self) -> ToolEffect {
        self.effect
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<String, ToolError> {
        let t0 = Instant::now();
        let outcome = self.call_inner(args, &ctx, t0).await;
        // Server events of the call's time (an exit seen after the call
        // failed, a restart it waited for) go to its run.
        self.deliver_pending(&ctx);
        let duration_ms = t0.elapsed().as_millis() as u64;
        let tool = self.spec.name.clone();
        match &outcome {
            Ok(_) => ctx.event(RunEvent::McpToolCallOk { tool, duration_ms }),
            Err(e) => ctx.event(RunEvent::McpToolCallFail {
                tool,
                duration_ms,
                error_kind: e.kind().to_string(),
            }),
        }
        outcome
    }

    fn timeout_error(&self, timeout_ms: u64) -> ToolError {
        McpError::ToolTimeout {
            tool: self.spec.name.clone(),
            ms: timeout_ms,
        }
        .into_tool_error()
    }
}

impl McpTool {
    async fn call_inner(
        &self,
        args: Value,
        ctx: &ToolContext,
        t0: Instant,
    ) -> Result<String, ToolError> {
        let server = &self.server;
        self.deliver_pending(ctx);
        let mut params = CallToolRequestParams::new(self.remote.to_string());
        params.arguments = match args {
            Value::Object(m) => Some(m),
            _ => None,
        };
        let request = ClientRequest::CallToolRequest(Request::new(params));
        // A request that could not be sent (the connection closed before
        // the server's exit was seen) goes once more, on the next one.
        let mut stale = None;
        let (peer, handle) = loop {
            let (peer, generation) = tokio::select! {
                p = self.peer(stale) => p.map_err(McpError::into_tool_error)?,
                _ = ctx.cancelled() => return Err(self.cancelled()),
            };
            match peer
                .send_cancellable_request(request.clone(), PeerRequestOptions::no_options())
                .await
            {
                Ok(handle) => break (peer, handle),
                Err(ServiceError::TransportClosed) if stale.is_none() => stale = Some(generation),
                Err(e) => return Err(self.service_error(e)),
            }
        };
        let key = server.next_call.fetch_add(1, Ordering::Relaxed);
        let mut guard = CallGuard {
            peer: peer.clone(),
            id: handle.id.clone(),
            token: None,
            key,
            link: server.link.clone(),
            ctx: ctx.clone(),
            tool: self.spec.name.clone(),
            t0,
            armed: true,
        };
        if ctx.listens() {
            server
                .link
                .progress
                .insert(handle.progress_token.clone(), ctx.clone());
            guard.token = Some(handle.progress_token.clone());
            server.link.calls.insert(key, ctx.clone());
        }
        let answer = tokio::select! {
            a = handle.await_response() => a,
            _ = ctx.cancelled() => {
                guard.cancel("the run was stopped");
                return Err(self.cancelled());
            }
        };
        guard.armed = false;
        match answer {
            Ok(ServerResult::CallToolResult(r)) => {
                let value = serde_json::to_value(&r)
                    .map_err(|e| ToolError::Failed(format!("unreadable tool result: {e}")))?;
                result::to_model_text(&value)
            }
            Ok(_) => Err(ToolError::Failed(
                "the server answered tools/call with something other than a tool result".into(),
            )),
            Err(e) => Err(self.service_error(e)),
        }
    }

    /// Gives the call's run the server events no call was in flight for.
    fn deliver_pending(&self, ctx: &ToolContext) {
        if !ctx.listens() {
            return;
        }
        let pending: Vec<RunEvent> = match self.server.link.pending.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => Vec::new(),
        };
        for ev in pending {
            ctx.event(ev);
        }
    }

    /// The server's peer once it is up (waits through a start or restart;
    /// asks a cooled-down or failed server to start again), not that of
    /// connection `stale`.
    async fn peer(&self, stale: Option<u64>) -> Result<(Peer<RoleClient>, u64), McpError> {
        let mut rx = self.server.avail.clone();
        let mut asked = false;
        loop {
            let state = rx.borrow_and_update().clone();
            match state {
                Avail::Ready(_, generation) if Some(generation) == stale => {}
                Avail::Ready(p, generation) => return Ok((p, generation)),
                Avail::Starting => {}
                Avail::Down { error, retry_at } => match retry_at {
                    Some(at) if Instant::now() >= at && !asked => {
                        asked = true;
                        (self.server.ask_start)();
                    }
                    _ => return Err(error),
                },
            }
            if rx.changed().await.is_err() {
                return Err(McpError::Unavailable(format!(
                    "mcp server `{}` is gone",
                    self.server.name
                )));
            }
        }
    }

    fn cancelled(&self) -> ToolError {
        McpError::Cancelled {
            tool: self.spec.name.clone(),
        }
        .into_tool_error()
    }

    fn service_error(&self, e: ServiceError) -> ToolError {
        match e {
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => McpError::Crashed {
                server: self.server.name.clone(),
                reason: "the connection closed during the call".into(),
                stderr_tail: String::new(),
            }
            .into_tool_error(),
            ServiceError::McpError(data)
                if data.code.0 == super::framing::TOO_LARGE_CODE
                    && data.data.as_ref().and_then(|d| d.get("kind"))
                        == Some(&Value::from(super::framing::TOO_LARGE_KIND)) =>
            {
                McpError::ResultTooLarge {
                    tool: self.spec.name.clone(),
                    limit_bytes: data
                        .data
                        .as_ref()
                        .and_then(|d| d.get("limit_bytes"))
                        .and_then(Value::as_u64)
                        .unwrap_or_default(),
                }
                .into_tool_error()
            }
            ServiceError::McpError(data) => ToolError::Failed(data.message.to_string()),
            other => ToolError::Failed(other.to_string()),
        }
    }
}

/// A call in flight: unregistered when it ends; sends the server
/// `notifications/cancelled` unless the call was answered.
struct CallGuard {
    peer: Peer<RoleClient>,
    id: RequestId,
    token: Option<ProgressToken>,
    key: u64,
    link: Arc<Link>,
    ctx: ToolContext,
    tool: String,
    t0: Instant,
    armed: bool,
}

impl CallGuard {
    fn cancel(&mut self, reason: &str) {
        if !self.armed {
            return;
        }
        self.armed = false;
        let peer = self.peer.clone();
        let notification = CancelledNotification::new(CancelledNotificationParam::new(
            Some(self.id.clone()),
            Some(reason.to_string()),
        ));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = peer.send_notification(notification.into()).await;
            });
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(t) = &self.token {
            self.link.progress.remove(t);
            self.link.calls.remove(&self.key);
        }
        if self.armed {
            // Dropped unanswered and not by the run's stop: the registry's
            // timeout.
            let by_run = self.ctx.is_cancelled();
            self.cancel(if by_run {
                "the run was stopped"
            } else {
                "timeout"
            });
            if !by_run {
                self.ctx.event(RunEvent::McpToolCallTimeout {
                    tool: std::mem::take(&mut self.tool),
                    duration_ms: self.t0.elapsed().as_millis() as u64,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ToolAnnotations;

    #[test]
    fn annotations_give_the_effect_class_and_silence_is_unknown() {
        let a = |r: Option<bool>, d: Option<bool>, o: Option<bool>| {
            effect_of(Some(&ToolAnnotations::from_raw(None, r, d, None, o)))
        };
        assert_eq!(effect_of(None), ToolEffect::Unknown);
        assert_eq!(a(None, None, None), ToolEffect::Unknown);
        assert_eq!(a(Some(true), None, None), ToolEffect::Read);
        // Read-only wins over the other hints (they mean nothing then).
        assert_eq!(a(Some(true), Some(true), Some(true)), ToolEffect::Read);
        assert_eq!(a(None, Some(true), None), ToolEffect::Write);
        assert_eq!(a(Some(false), None, None), ToolEffect::Write);
        assert_eq!(a(None, None, Some(true)), ToolEffect::Egress);
        assert_eq!(a(Some(false), Some(true), Some(true)), ToolEffect::Egress);
        assert_eq!(a(None, Some(false), Some(false)), ToolEffect::Unknown);
    }
}
