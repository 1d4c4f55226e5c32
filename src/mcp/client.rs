//! One connection to an MCP server: spawn (stdio) or connect (HTTP), the
//! `initialize` handshake and the tool list, under the start timeout; and
//! the client side's handler, which turns a server's progress into the
//! calling run's heartbeats and its `tools/list_changed` into a refresh.
//! What a server's tools share with its connection ([`Link`]) and read of
//! it ([`Avail`], published by the server's actor) lives here too.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{NotificationContext, Peer, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};

use super::process::{self, ExitCode, ServerProcess};
use super::{env, McpConfig, McpError};
use crate::ports::tool::ToolContext;
use crate::spec::mcp::McpServerSpec;

/// What a server's connection shares with the tools that call it.
pub(crate) struct Link {
    /// The calls in flight that asked for progress, by their token.
    pub(crate) progress: DashMap<ProgressToken, ToolContext>,
    /// The calls in flight, by a key of the caller's: told when the server
    /// exits.
    pub(crate) calls: DashMap<u64, ToolContext>,
    /// Called on `notifications/tools/list_changed`.
    pub(crate) on_list_changed: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    /// Server events no call was in flight to carry: the next call's run
    /// records them (a few at most).
    pub(crate) pending: Mutex<Vec<crate::ports::event::RunEvent>>,
}

impl Link {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Link {
            progress: DashMap::new(),
            calls: DashMap::new(),
            on_list_changed: Mutex::new(None),
            pending: Mutex::new(Vec::new()),
        })
    }
}

/// Whether calls can reach the server now.
#[derive(Clone)]
pub(crate) enum Avail {
    /// Starting or restarting: wait.
    Starting,
    /// Up: call through this peer (of connection generation `.1`).
    Ready(Peer<RoleClient>, u64),
    /// Down: fail with this error; at `retry_at` a call may ask for a
    /// start again (`None`: never, the server was stopped).
    Down {
        /// What calls fail with.
        error: McpError,
        /// When a call may ask again.
        retry_at: Option<Instant>,
    },
}

/// The client side of a connection.
pub(crate) struct Handler {
    link: Arc<Link>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some(ctx) = self.link.progress.get(&params.progress_token) {
            ctx.beat();
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Ok(f) = self.link.on_list_changed.lock() {
            if let Some(f) = f.as_ref() {
                f();
            }
        }
    }
}

/// A started server.
pub(crate) struct Connection {
    pub(crate) service: RunningService<RoleClient, Handler>,
    pub(crate) process: Option<ServerProcess>,
    pub(crate) tools: Vec<rmcp::model::Tool>,
}

/// How long a server that failed to start is given to exit by itself and
/// finish its stderr, for the error to carry its reason.
const LAST_WORDS: Duration = Duration::from_secs(1);

/// Starts server `spec` and lists its tools within `config.start_timeout`.
pub(crate) async fn connect(
    spec: &McpServerSpec,
    link: Arc<Link>,
    config: &McpConfig,
) -> Result<Connection, McpError> {
    let handler = Handler { link };
    let failed = |reason: String, tail: String| McpError::StartFailed {
        server: spec.name.clone(),
        reason,
        stderr_tail: tail,
    };
    if spec.is_stdio() {
        let resolved = env::child_env(spec, |k| std::env::var(k).ok())?;
        let (proc, stdout, stdin) = process::spawn(
            &spec.command,
            resolved.pairs,
            config.stderr_tail,
            resolved.secrets,
        )
        .await
        .map_err(|e| {
            failed(
                format!("cannot run `{}`: {e}", spec.command[0]),
                String::new(),
            )
        })?;
        let cap = config.max_message_bytes.max(1);
        let stdout = super::framing::CappedLines::new(stdout, cap, &spec.name);
        // Every line the protocol sees is at most the cap and its newline.
        let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(stdout, stdin)
            .with_max_line_length(cap.saturating_add(1));
        let started = async {
            let service = handler.serve(transport).await.map_err(|e| e.to_string())?;
            let tools = service.list_all_tools().await.map_err(|e| e.to_string());
            Ok::<_, String>((service, tools))
        };
        let exited = proc.on_exit();
        let outcome = tokio::select! {
            r = tokio::time::timeout(config.start_timeout, started) => r,
            code = exited => {
                let tail = proc.stderr.last_words(LAST_WORDS).await;
                return Err(failed(format!("it exited ({}) before it was ready", describe(code)), tail));
            }
        };
        match outcome {
            Ok(Ok((service, Ok(tools)))) => Ok(Connection {
                service,
                process: Some(proc),
                tools,
            }),
            Ok(Ok((service, Err(e)))) => {
                let tail = proc.stderr.text();
                let _ = close(
                    Connection {
                        service,
                        process: Some(proc),
                        tools: Vec::new(),
                    },
                    config,
                )
                .await;
                Err(failed(format!("tools/list failed: {e}"), tail))
            }
            Ok(Err(e)) => {
                // A failed handshake is mostly a server on its way out (its
                // pipes closed, its reason not yet written): it gets a
                // moment to go by itself and say why.
                let stderr = proc.stderr.clone();
                proc.stop(LAST_WORDS, config.term_grace).await;
                let tail = stderr.last_words(LAST_WORDS).await;
                Err(failed(format!("initialize failed: {e}"), tail))
            }
            Err(_) => {
                let tail = proc.stderr.text();
                proc.stop(Duration::ZERO, config.term_grace).await;
                Err(failed(
                    format!(
                        "no tool list within {} ms",
                        config.start_timeout.as_millis()
                    ),
                    tail,
                ))
            }
        }
    } else {
        connect_http(spec, handler, config).await
    }
}

async fn connect_http(
    spec: &McpServerSpec,
    handler: Handler,
    config: &McpConfig,
) -> Result<Connection, McpError> {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    let url = spec.url.clone().unwrap_or_default();
    let failed = |reason: String| McpError::StartFailed {
        server: spec.name.clone(),
        reason,
        stderr_tail: String::new(),
    };
    let resolved = env::headers(spec, |k| std::env::var(k).ok())?;
    let mut headers = std::collections::HashMap::new();
    for (k, v) in &resolved.pairs {
        let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| failed(format!("invalid header name `{k}`")))?;
        let mut value = reqwest::header::HeaderValue::from_str(v)
            .map_err(|_| failed(format!("header `{k}` has an invalid value")))?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    let transport = StreamableHttpClientTransport::with_client(
        http_client(),
        StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers),
    );
    let started = async {
        let service = handler
            .serve(transport)
            .await
            .map_err(|e| env::scrub(&e.to_string(), &resolved.secrets))?;
        let tools = service
            .list_all_tools()
            .await
            .map_err(|e| env::scrub(&e.to_string(), &resolved.secrets));
        Ok::<_, String>((service, tools))
    };
    match tokio::time::timeout(config.start_timeout, started).await {
        Ok(Ok((service, Ok(tools)))) => Ok(Connection {
            service,
            process: None,
            tools,
        }),
        Ok(Ok((mut service, Err(e)))) => {
            let _ = service.close_with_timeout(config.stdin_grace).await;
            Err(failed(format!("tools/list failed: {e}")))
        }
        Ok(Err(e)) => Err(failed(format!("initialize failed: {e}"))),
        Err(_) => Err(failed(format!(
            "no tool list within {} ms",
            config.start_timeout.as_millis()
        ))),
    }
}

/// Stops a connection: the protocol ends (a stdio server's stdin closes),
/// then the process's stop sequence. Returns its exit code.
pub(crate) async fn close(conn: Connection, config: &McpConfig) -> ExitCode {
    let Connection {
        mut service,
        process,
        ..
    } = conn;
    // Cancelling the service drops its transport: the server's stdin.
    let _ = service.close_with_timeout(config.stdin_grace).await;
    drop(service);
    match process {
        Some(p) => p.stop(config.stdin_grace, config.term_grace).await,
        None => Some(0),
    }
}

/// `exit code N` or `a signal`.
pub(crate) fn describe(code: ExitCode) -> String {
    match code {
        Some(c) => format!("exit code {c}"),
        None => "killed by a signal".into(),
    }
}

/// The HTTP client of streamable HTTP servers: rustls on `ring` with the
/// webpki roots (no system TLS), a connect timeout, no overall timeout
/// (the run's `tool_timeout` bounds a call).
fn http_client() -> reqwest::Client {
    let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth());
    let builder = match tls {
        Some(tls) => builder.tls_backend_preconfigured(tls),
        None => builder,
    };
    builder.build().unwrap_or_default()
}
