//! `agentvisor serve`: the HTTP API over a [`crate::Host`] (`--db`, `--agents`, `--tokens`).
//!
//! # Routes
//! | route | what |
//! |---|---|
//! | `POST /v1/runs[?wait=S]` | submit a run of an agent by name (201) |
//! | `GET /v1/runs/{id}[?wait=S]` | its live state, or its result |
//! | `GET /v1/runs?status=&agent=&schedule=&root=&limit=&cursor=` | runs, newest first, a page at a time |
//! | `GET /v1/runs/{id}/records` | its audit records (what `replay` re-runs) |
//! | `GET /v1/runs/{id}/events` | its events as Server-Sent Events (`id:` = `seq`, `Last-Event-ID` resumes) |
//! | `GET /v1/events` | the host-wide feed (runs started and ended, critic decisions) |
//! | `POST /v1/runs/{id}/steer\|extend\|kill\|cancel` | commands (202) |
//! | `POST /v1/runs/{id}/approve\|deny` | decide on the tool calls a run waits to have approved (200; 409 when it waits for none) |
//! | `POST /v1/sessions` | create (201) or reopen (200) a chat session with an agent |
//! | `GET /v1/sessions/{id}` | its state and history |
//! | `POST /v1/sessions/{id}/messages` | send a message; its run's events come back as SSE |
//! | `POST /v1/sessions/{id}/close`, `DELETE /v1/sessions/{id}` | close it (history kept); remove it |
//! | `GET /v1/agents` | the agents loaded from `--agents DIR` |
//! | `GET /v1/schedules`, `POST /v1/schedules/{name}/run\|pause\|resume`, `POST /v1/schedules/reload` | the schedules of `--skills REPO` ([`schedules`]; admin tokens) |
//! | `GET /healthz`, `GET /readyz` | liveness; readiness (503 while draining) |
//! | `GET /openapi.json` | the OpenAPI 3 document, derived from the handlers' types |
//! | `GET /metrics` | Prometheus text |
//! | `GET /` | the dashboard |
//!
//! # Guarantees and limits
//! - Errors are `{"error": {"kind", "message"}}` ([`error`]).
//! - Every `/v1` route needs a bearer token when a token table is set
//!   ([`auth`]); the token may also come as `?access_token=` (an
//!   `EventSource` cannot set headers). No token table: every request is
//!   the admin `anonymous` (for a server on loopback).
//! - Bodies are at most 1 MiB (413); headers must arrive within
//!   `header_timeout` and bodies within `body_timeout` (the connection is
//!   closed / 408); each caller has a request rate (a token bucket; 429 with
//!   `retry-after`); each run has at most `max_subscribers` event streams
//!   (429); per-caller concurrent runs come from the budget ledger (429).
//! - Draining ([`Server::start_draining`]): `/readyz` answers 503 and new
//!   runs are refused (503, with `retry-after`) while the runs in flight go
//!   on; reads and event streams are served as before. `agentvisor serve`
//!   keeps listening through its drain and closes the listener only once
//!   the runs have ended.
//! - A token taken out of the table ([`Server::set_tokens`], a reload)
//!   is revoked at once: its open event streams end, a request of it that
//!   is still waiting (`?wait=`) answers 401, and so does every later one.

pub mod api;
pub mod auth;
mod body;
pub mod catalog;
mod control;
mod dashboard;
pub mod error;
mod forks;
mod limits;
mod listing;
pub mod metrics;
mod openapi;
mod runs;
pub mod schedules;
mod sessions;
mod streams;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dashmap::DashMap;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use self::api::Health;
use self::auth::{Caller, Role, TokenTable};
use self::catalog::Catalog;
use self::error::ApiError;
use self::limits::{IdempotencyKeys, RateLimiter, StreamCaps};
use crate::ports::audit::RunIndex;
use crate::Host;

pub use self::openapi::openapi_json;

/// Server settings. Every field has a default.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Largest request body (default 1 MiB).
    pub max_body: usize,
    /// How long a client may take to send a request's headers (default 10 s).
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body (default 30 s).
    pub body_timeout: Duration,
    /// Requests per second per caller, on average (0: no limit; default 200).
    pub rate_per_sec: f64,
    /// Requests per caller at once (default 400).
    pub rate_burst: f64,
    /// Event-stream subscribers per run (default 64).
    pub max_subscribers: usize,
    /// Idempotency keys remembered (default 100 000; the oldest go first).
    pub idempotency_keys: usize,
    /// How often an idle event stream sends a keep-alive comment (default 15 s).
    pub keep_alive: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_body: 1 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            rate_per_sec: 200.0,
            rate_burst: 400.0,
            max_subscribers: 64,
            idempotency_keys: 100_000,
            keep_alive: Duration::from_secs(15),
        }
    }
}

/// What every handler shares.
pub(crate) struct AppState {
    pub(crate) host: Host,
    pub(crate) index: Arc<dyn RunIndex>,
    pub(crate) config: ServerConfig,
    catalog: RwLock<Arc<Catalog>>,
    tokens: RwLock<Option<Arc<TokenTable>>>,
    /// Per token (by digest) that authenticated a request: the caller it
    /// acted as and what ends its streams when it is revoked.
    token_streams: DashMap<[u8; 32], (Caller, CancellationToken)>,
    pub(crate) rate: RateLimiter,
    pub(crate) streams: StreamCaps,
    pub(crate) idempotency: IdempotencyKeys,
    draining: AtomicBool,
    /// Who every request is when no token table is set (the host's default
    /// caller, as admin): built once, not per request.
    anonymous: Caller,
    /// Cancelled when the server closes: host-wide feeds end.
    pub(crate) closing: CancellationToken,
    /// The scheduler of `--skills`, when the server runs one.
    scheduler: RwLock<Option<crate::schedules::Scheduler>>,
}

impl AppState {
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        self.catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub(crate) fn scheduler(&self) -> Option<crate::schedules::Scheduler> {
        self.scheduler
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn tokens(&self) -> Option<Arc<TokenTable>> {
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The HTTP API over a host. Cheap to clone.
#[derive(Clone)]
pub struct Server {
    state: Arc<AppState>,
}

impl Server {
    /// A server for `host`, reading ended runs from `index` (the store the
    /// host writes its audit log to).
    pub fn new(host: Host, index: Arc<dyn RunIndex>, config: ServerConfig) -> Self {
        let anonymous = Caller {
            id: Arc::from(host.config().default_caller.as_str()),
            role: Role::Admin,
        };
        Server {
            state: Arc::new(AppState {
                host,
                index,
                rate: RateLimiter::new(config.rate_per_sec, config.rate_burst),
                streams: StreamCaps::new(config.max_subscribers),
                idempotency: IdempotencyKeys::new(config.idempotency_keys),
                anonymous,
                config,
                catalog: RwLock::new(Arc::new(Catalog::default())),
                tokens: RwLock::new(None),
                token_streams: DashMap::new(),
                draining: AtomicBool::new(false),
                closing: CancellationToken::new(),
                scheduler: RwLock::new(None),
            }),
        }
    }

    /// Replaces the agents the server runs.
    pub fn set_catalog(&self, catalog: Catalog) {
        *self
            .state
            .catalog
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(catalog);
    }

    /// Replaces the token table (`None`: no authentication, every request
    /// is the admin `anonymous`). A token the new table does not hold, or
    /// holds for another caller or role, is revoked: its event streams end
    /// and its waiting requests answer 401.
    pub fn set_tokens(&self, tokens: Option<TokenTable>) {
        let tokens = tokens.map(Arc::new);
        *self.state.tokens.write().unwrap_or_else(|p| p.into_inner()) = tokens.clone();
        self.state
            .token_streams
            .retain(|digest, (caller, revoked)| {
                let kept = tokens.as_ref().is_some_and(|t| t.holds(digest, caller));
                if !kept {
                    revoked.cancel();
                }
                kept
            });
    }

    /// Runs the schedules of `scheduler` (`serve --skills`): served under
    /// `/v1/schedules` and on the dashboard.
    pub fn set_scheduler(&self, scheduler: Option<crate::schedules::Scheduler>) {
        *self
            .state
            .scheduler
            .write()
            .unwrap_or_else(|p| p.into_inner()) = scheduler;
    }

    /// The scheduler, when the server runs one.
    pub fn scheduler(&self) -> Option<crate::schedules::Scheduler> {
        self.state.scheduler()
    }

    /// How many agents are loaded.
    pub fn catalog_len(&self) -> usize {
        self.state.catalog().len()
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.state.host
    }

    /// Refuses new runs (503) and answers `/readyz` with 503; runs in
    /// flight and reads go on.
    pub fn start_draining(&self) {
        self.state.draining.store(true, Ordering::Release);
    }

    /// Ends the host-wide event streams (the last step of a shutdown).
    pub fn close_streams(&self) {
        self.state.closing.cancel();
    }

    /// The routes.
    pub fn router(&self) -> Router {
        let st = self.state.clone();
        let v1 = Router::new()
            .route("/v1/runs", post(runs::submit).get(listing::list_runs))
            .route("/v1/runs/{id}", get(runs::get_run))
            .route("/v1/runs/{id}/events", get(streams::run_events))
            .route("/v1/runs/{id}/records", get(runs::records))
            .route("/v1/runs/{id}/steer", post(control::steer))
            .route("/v1/runs/{id}/extend", post(control::extend))
            .route("/v1/runs/{id}/kill", post(control::kill))
            .route("/v1/runs/{id}/cancel", post(control::cancel))
            .route("/v1/runs/{id}/approve", post(control::approve))
            .route("/v1/runs/{id}/deny", post(control::deny))
            .route("/v1/runs/{id}/fork", post(forks::fork_run))
            .route("/v1/diff", get(forks::diff_runs))
            .route("/v1/sessions", post(sessions::create))
            .route(
                "/v1/sessions/{id}",
                get(sessions::get_session).delete(sessions::remove),
            )
            .route("/v1/sessions/{id}/messages", post(sessions::send_message))
            .route("/v1/sessions/{id}/close", post(sessions::close))
            .route("/v1/events", get(streams::host_events))
            .route("/v1/agents", get(runs::agents))
            .route("/v1/schedules", get(schedules::list))
            .route("/v1/schedules/reload", post(schedules::reload))
            .route("/v1/schedules/{name}/run", post(schedules::run))
            .route("/v1/schedules/{name}/pause", post(schedules::pause))
            .route("/v1/schedules/{name}/resume", post(schedules::resume))
            .route_layer(middleware::from_fn_with_state(st.clone(), authenticate));
        Router::new()
            .merge(v1)
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/openapi.json", get(openapi::serve_openapi))
            .route("/metrics", get(metrics::serve_metrics))
            .merge(dashboard::routes())
            .fallback(not_found)
            .layer(axum::extract::DefaultBodyLimit::max(st.config.max_body))
            // A handler that panics answers 500 in the error shape; the
            // connection and the server go on.
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
            .with_state(st)
    }

    /// Serves on `listener` until `shutdown` resolves: then stops
    /// accepting, lets the requests in progress finish (streams end when
    /// their runs do, or at [`close_streams`](Self::close_streams)), and
    /// returns once every connection is closed or `grace` has passed.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
        grace: Duration,
    ) -> std::io::Result<()> {
        use hyper_util::rt::{TokioIo, TokioTimer};
        use hyper_util::server::graceful::GracefulShutdown;
        use tower::ServiceExt;

        let router = self.router();
        let graceful = GracefulShutdown::new();
        let header_timeout = self.state.config.header_timeout;
        tokio::pin!(shutdown);
        loop {
            let (stream, _peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of descriptors and the like: back off a little.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let svc = router
                .clone()
                .map_request(|req: Request<hyper::body::Incoming>| req.map(axum::body::Body::new));
            let svc = hyper_util::service::TowerToHyperService::new(svc);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
        drop(listener);
        let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
        Ok(())
    }
}

/// Cancelled when the token a request was authenticated with is revoked
/// (a request extension beside its [`Caller`]): its event streams end on
/// it. Never cancelled without a token table.
#[derive(Clone)]
pub(crate) struct Revoked(pub(crate) CancellationToken);

/// The token of `caller` known by `digest`: what revokes it.
fn revocation(st: &AppState, digest: [u8; 32], caller: &Caller) -> CancellationToken {
    let entry = st
        .token_streams
        .entry(digest)
        .or_insert_with(|| (caller.clone(), CancellationToken::new()));
    entry.1.clone()
}

/// Authenticates `/v1` requests and applies the caller's rate limit.
async fn authenticate(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (caller, revoked) = match st.tokens() {
        None => (st.anonymous.clone(), CancellationToken::new()),
        Some(table) => {
            let token = bearer(&req).ok_or_else(ApiError::unauthorized)?;
            let (digest, caller) = table.find(&token).ok_or_else(ApiError::unauthorized)?;
            let revoked = revocation(&st, digest, &caller);
            // A reload between the look-up and now: the table read above
            // may be the old one, and the token revoked by the new.
            let current = st.tokens();
            if revoked.is_cancelled() || !current.is_some_and(|t| t.holds(&digest, &caller)) {
                st.token_streams
                    .remove_if(&digest, |_, (c, _)| *c == caller);
                return Err(ApiError::unauthorized());
            }
            (caller, revoked)
        }
    };
    if let Err(wait) = st.rate.take(&caller.id) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("caller `{}` is over its request rate", caller.id),
        )
        .retry_after(wait.as_secs_f64().ceil() as u64));
    }
    req.extensions_mut().insert(caller);
    req.extensions_mut().insert(Revoked(revoked.clone()));
    // A request still waiting (a `?wait=` long poll) when its token is
    // revoked answers 401; a stream it returned ends on its own.
    tokio::select! {
        resp = next.run(req) => Ok(resp),
        _ = revoked.cancelled() => Err(ApiError::unauthorized()),
    }
}

/// The bearer token of a request: `Authorization: Bearer T`, else
/// `?access_token=T`.
fn bearer(req: &Request) -> Option<String> {
    if let Some(v) = req.headers().get(axum::http::header::AUTHORIZATION) {
        let v = v.to_str().ok()?;
        let (scheme, token) = v.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_string());
    }
    let q = req.uri().query()?;
    serde_urlencoded::from_str::<Vec<(String, String)>>(q)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == "access_token")
        .map(|(_, v)| v)
}

fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the request failed inside the server",
    )
    .into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

fn health(st: &AppState, status: &str) -> Health {
    Health {
        status: status.into(),
        active_runs: st.host.live_runs() as u64,
        agents: st.catalog().len() as u64,
    }
}

/// Liveness: the process serves.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, body = Health)))]
pub(crate) async fn healthz(State(st): State<Arc<AppState>>) -> Json<Health> {
    Json(health(&st, "ok"))
}

/// Readiness: 503 while draining.
#[utoipa::path(get, path = "/readyz", tag = "ops", responses((status = 200, body = Health), (status = 503, body = Health)))]
pub(crate) async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    if st.is_draining() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(health(&st, "draining")),
        )
            .into_response()
    } else {
        Json(health(&st, "ready")).into_response()
    }
}
