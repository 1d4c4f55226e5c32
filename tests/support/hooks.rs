//! Loopback HTTP servers that stand in for the destinations of scheduled
//! skills (a webhook, Slack, Discord, the GitHub API): each request is
//! recorded (method, path, headers, body) and answered by the test's
//! function.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;

/// One request a server saw.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) method: String,
    /// The path and query.
    pub(crate) path: String,
    /// Header names lower-cased.
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: String,
}

impl Seen {
    /// The body as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// How a server answers: status and body, given the request and how many
/// came before it.
pub(crate) type Answer = Arc<dyn Fn(&Seen, usize) -> (u16, String) + Send + Sync>;

/// A server on a loopback port, until dropped.
pub(crate) struct Hook {
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Hook {
    /// What it saw so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Starts a server that answers with `answer`.
pub(crate) async fn serve(answer: Answer) -> Hook {
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    let log = seen.clone();
    let handler = move |method: Method, uri: Uri, headers: HeaderMap, body: String| {
        let log = log.clone();
        let answer = answer.clone();
        async move {
            let s = Seen {
                method: method.to_string(),
                path: uri
                    .path_and_query()
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                headers: headers
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_ascii_lowercase(),
                            v.to_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect(),
                body,
            };
            let n = {
                let mut g = log.lock().unwrap();
                g.push(s.clone());
                g.len() - 1
            };
            let (status, text) = answer(&s, n);
            Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json")
                .body(Body::from(text))
                .unwrap()
        }
    };
    let app = Router::new().fallback(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await;
    });
    Hook {
        base,
        seen,
        _stop: stop,
    }
}

/// A server that answers every request `status` with `{}`.
pub(crate) async fn answering(status: u16) -> Hook {
    serve(Arc::new(move |_, _| (status, "{}".to_string()))).await
}
