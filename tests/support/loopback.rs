//! An agentvisor server on a loopback socket, the manifests its catalog
//! offers, and an HTTP client for it.

use std::time::Duration;

use agentvisor::server::Server;

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
