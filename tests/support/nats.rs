//! A fresh JetStream stream name a test, on the server of
//! `AGENTVISOR_TEST_NATS` (default `nats://127.0.0.1:4222`, the server this
//! machine runs): named for the process, a counter and the time. A test
//! deletes its streams when it ends ([`delete_streams`]); a test process
//! deletes, once, the streams that processes no longer running left (a
//! test that panicked).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures_util::StreamExt;

/// The server's URL.
pub(crate) fn server_url() -> String {
    std::env::var("AGENTVISOR_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

async fn jetstream() -> async_nats::jetstream::Context {
    let url = server_url();
    let client = async_nats::connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("NATS at {url} does not answer: {e}"));
    async_nats::jetstream::new(client)
}

/// A stream name no other test uses (`AVQT_PID_N_NANOS`).
pub(crate) async fn fresh_stream() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if !SWEPT.swap(true, Ordering::Relaxed) {
        let js = jetstream().await;
        let mut names = js.stream_names();
        let mut left = Vec::new();
        while let Some(Ok(name)) = names.next().await {
            if let Some(rest) = name.strip_prefix("AVQT_") {
                let pid = rest.split('_').next().unwrap_or_default();
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    left.push(name);
                }
            }
        }
        for name in left {
            // Another process may be sweeping it too: best effort.
            let _ = js.delete_stream(&name).await;
        }
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "AVQT_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Deletes these streams (those missing are ignored).
pub(crate) async fn delete_streams(names: &[String]) {
    let js = jetstream().await;
    for name in names {
        let _ = js.delete_stream(name).await;
    }
}

/// Creates stream `name` on `subject` with `config`'s other settings, as
/// another program would (to see the queue refuse it).
pub(crate) async fn create_stream(config: async_nats::jetstream::stream::Config) {
    jetstream().await.create_stream(config).await.unwrap();
}
