//! An agentvisor server on a loopback socket, the manifests its catalog
//! offers, and an HTTP client for it: JSON requests, and event streams read
//! frame by frame.

use std::sync::Arc;
use std::time::Duration;

use agentvisor::server::auth::{Caller, Role, TokenTable};
use agentvisor::server::catalog::Catalog;
use agentvisor::server::{Server, ServerConfig};
use agentvisor::Host;
use serde_json::Value;

/// A run that calls `add` once and answers `five`.
pub(crate) const QUICK: &str = r#"
name: quick
model: scripted
prompt: add
tools: [add]
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { text: "five", usage: { input: 10, output: 2 } }
"#;

/// A run whose tool sleeps a minute (it is killed or cancelled first).
pub(crate) const SLOW: &str = r#"
name: slow
model: scripted
prompt: wait
tools: [sleep]
limits: { max_runtime: 120s, stall_timeout: 120s }
script:
  - { tool: sleep, args: { ms: 60000 } }
  - { text: "late" }
"#;

/// An HTTP client (rustls on ring handed over ready-made: reqwest is built
/// without a process-wide crypto provider).
pub(crate) fn http_client() -> reqwest::Client {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .unwrap()
}

/// Serves `server` on a fresh loopback port (one second to drain) until
/// the returned sender is sent to or dropped; returns its base URL too.
pub(crate) async fn serve(server: &Server) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let s = server.clone();
    tokio::spawn(async move {
        s.serve(
            listener,
            async {
                let _ = stopped.await;
            },
            Duration::from_secs(1),
        )
        .await
    });
    (base, stop)
}

/// Tokens of the token table [`start`] sets with `auth`.
pub(crate) const ALICE: &str = "av_alice";
pub(crate) const BOB: &str = "av_bob";
pub(crate) const ROOT: &str = "av_root";

/// A server serving on loopback until dropped.
pub(crate) struct Running {
    pub(crate) base: String,
    pub(crate) server: Server,
    pub(crate) host: Host,
    pub(crate) http: reqwest::Client,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn caller(id: &str, role: Role) -> Caller {
    Caller {
        id: Arc::from(id),
        role,
    }
}

/// Serves `host` with the agents of `manifests`; with `auth`, alice and bob
/// (callers) and root (admin) have tokens.
pub(crate) async fn start(
    host: Host,
    index: Arc<dyn agentvisor::ports::audit::RunIndex>,
    manifests: &[&str],
    auth: bool,
) -> Running {
    start_with(host, index, manifests, auth, ServerConfig::default()).await
}

/// [`start`] with a server configuration.
pub(crate) async fn start_with(
    host: Host,
    index: Arc<dyn agentvisor::ports::audit::RunIndex>,
    manifests: &[&str],
    auth: bool,
    config: ServerConfig,
) -> Running {
    let server = Server::new(host.clone(), index, config);
    let agents: Vec<_> = manifests
        .iter()
        .map(|y| host.agent(super::spec(y)).unwrap())
        .collect();
    server.set_catalog(Catalog::from_agents(agents));
    if auth {
        server.set_tokens(Some(TokenTable::from_tokens([
            (ALICE, caller("alice", Role::Caller)),
            (BOB, caller("bob", Role::Caller)),
            (ROOT, caller("root", Role::Admin)),
        ])));
    }
    let (base, tx) = serve(&server).await;
    Running {
        base,
        server,
        host,
        http: http_client(),
        _stop: tx,
    }
}

impl Running {
    /// The `/metrics` scrape as text (no token: the route is open).
    pub(crate) async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A request, not yet sent.
    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> reqwest::RequestBuilder {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = self.http.request(m, format!("{}{path}", self.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        r
    }

    /// `POST` of `{"agent": agent}` to `path` (`/v1/runs`, with its query).
    pub(crate) async fn submit(
        &self,
        path: &str,
        token: Option<&str>,
        agent: &str,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        self.req(
            "POST",
            path,
            token,
            Some(serde_json::json!({ "agent": agent })),
        )
        .await
    }

    /// Sends a request: its status, its body as JSON (or as a JSON string
    /// when it is not JSON), its headers.
    pub(crate) async fn req(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let resp = self
            .request(method, path, token, body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            headers,
        )
    }
}

/// One SSE frame.
#[derive(Debug, Default, Clone)]
pub(crate) struct Frame {
    pub(crate) id: Option<String>,
    pub(crate) data: String,
    pub(crate) comment: bool,
}

/// Reads an event stream until it ends (or `max` frames), keep-alives kept.
pub(crate) async fn read_sse(resp: reqwest::Response, max: usize) -> Vec<Frame> {
    let mut resp = resp;
    let mut buf = String::new();
    let mut out = Vec::new();
    while out.len() < max {
        let chunk = match tokio::time::timeout(Duration::from_secs(30), resp.chunk()).await {
            Ok(Ok(Some(c))) => c,
            _ => break,
        };
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut f = Frame::default();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    f.id = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    f.data.push_str(v.trim_start());
                } else if line.starts_with(':') {
                    f.comment = true;
                }
            }
            out.push(f);
        }
    }
    out
}

/// The events of a stream's frames (keep-alives left out).
pub(crate) fn events_of(frames: &[Frame]) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| !f.comment)
        .map(|f| serde_json::from_str(&f.data).unwrap())
        .collect()
}
