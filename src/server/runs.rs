//! `/v1/runs`: submit a run, read one, read its records; and the lookup
//! every run route shares.
//!
//! A caller sees and controls only its own runs: another caller's run
//! answers 404, as an unknown id does ([`find`]). Admins see every run.
//! Listing is in `listing.rs`, the control commands in `control.rs`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::api::{AgentList, RunView, SubmitRun, WaitQuery};
use super::auth::Caller;
use super::body::{JsonAnswer, JsonBody};
use super::error::{ApiError, ErrorBody};
use super::AppState;
use crate::host::SubmitError;
use crate::ports::audit::AuditEntry;
use crate::{Agent, AgentSpec, Invocation, RunId, RunRef, RunResult, RunStatus};

/// The longest `?wait=` honoured.
const MAX_WAIT: Duration = Duration::from_secs(300);

/// A run, live or ended.
pub(crate) enum Found {
    Live(RunRef),
    Ended(Arc<RunResult>),
}

impl Found {
    fn owner(&self) -> Option<&str> {
        match self {
            Found::Live(r) => r.caller_id(),
            Found::Ended(r) => r.caller_id.as_deref(),
        }
    }
}

/// Parses a run id as the API prints it (32 hex digits).
pub(crate) fn parse_id(id: &str) -> Result<RunId, ApiError> {
    match id.parse::<RunId>() {
        Ok(r) if id.len() == 32 => Ok(r),
        _ => Err(ApiError::run_not_found(id)),
    }
}

/// The run `id` if `caller` may see it (else 404, as for no such run).
pub(crate) async fn find(st: &AppState, caller: &Caller, id: &str) -> Result<Found, ApiError> {
    let run_id = parse_id(id)?;
    let found = lookup(st, run_id)
        .await?
        .ok_or_else(|| ApiError::run_not_found(id))?;
    if !caller.may_see(found.owner()) {
        return Err(ApiError::run_not_found(id));
    }
    Ok(found)
}

/// The run, live or ended; `None` if this server has no record of it.
async fn lookup(st: &AppState, run_id: RunId) -> Result<Option<Found>, ApiError> {
    // A run leaves the live registry a moment before its terminal record
    // is written: look again for a while when the store has its records
    // but not its end yet.
    for _ in 0..50 {
        if let Some(run) = st.host.run(&run_id) {
            return Ok(Some(Found::Live(run)));
        }
        if let Some(r) = st.index.run_result(run_id).await.map_err(ApiError::store)? {
            return Ok(Some(Found::Ended(Arc::new(r))));
        }
        let records = st
            .host
            .audit_store()
            .run_records(run_id)
            .await
            .map_err(ApiError::store)?;
        if records.is_empty() {
            return Ok(None);
        }
        if let Some(r) = records.iter().rev().find_map(|r| match &r.entry {
            AuditEntry::Terminal(res) => Some(RunResult::clone(res)),
            _ => None,
        }) {
            return Ok(Some(Found::Ended(Arc::new(r))));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(None)
}

/// The view of `found`, waiting up to `wait` for a live run to end.
pub(crate) async fn view(found: Found, wait: Duration) -> RunView {
    match found {
        Found::Ended(r) => RunView::ended(r),
        Found::Live(run) => {
            if !wait.is_zero() {
                if let Ok(r) = tokio::time::timeout(wait, run.shared_result()).await {
                    return RunView::ended(r);
                }
            }
            RunView::live(&run)
        }
    }
}

pub(crate) fn wait_of(q: &WaitQuery) -> Result<Duration, ApiError> {
    match q.wait {
        None => Ok(Duration::ZERO),
        // Clamped before the conversion (a huge number would overflow it).
        Some(w) if w.is_finite() && w >= 0.0 => {
            Ok(Duration::from_secs_f64(w.min(MAX_WAIT.as_secs_f64())))
        }
        Some(_) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_query",
            "`wait` must be a number of seconds ≥ 0",
        )),
    }
}

/// Submit a run.
#[utoipa::path(
    post, path = "/v1/runs", tag = "runs",
    request_body = SubmitRun,
    params(WaitQuery, ("Idempotency-Key" = Option<String>, Header, description = "Same as `idempotency_key`.")),
    responses(
        (status = 201, description = "The run (its result if it ended within `wait`)", body = RunView),
        (status = 400, description = "Nothing to answer: no `input`, no `inputs` and no `prompt:` in the manifest, on a real model", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, description = "Inline manifest from a non-admin", body = ErrorBody),
        (status = 404, description = "Unknown agent", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, description = "Over a limit (see `retry-after`)", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn submit(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<WaitQuery>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<SubmitRun>,
) -> Result<Response, ApiError> {
    let wait = wait_of(&q)?;
    if st.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let key = body.idempotency_key.clone().or_else(|| {
        headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    if key
        .as_deref()
        .is_some_and(|k| k.is_empty() || k.len() > 256)
    {
        return Err(ApiError::invalid(
            "`idempotency_key` must be 1 to 256 characters",
        ));
    }
    let agent = agent_of(&st, &caller, &body).await?;
    // The run this request started, if it started one (a replayed key's
    // run is looked up: it may have ended long ago).
    let (run_id, started) = match &key {
        Some(k) => {
            let cell = st.idempotency.cell(&caller.id, k);
            let mut started = None;
            let id = cell
                .get_or_try_init(|| async {
                    let run = start(&st, &caller, agent, body).await?;
                    let run_id = run.run_id();
                    started = Some(run);
                    Ok::<_, ApiError>(run_id)
                })
                .await?;
            (*id, started)
        }
        None => {
            let run = start(&st, &caller, agent, body).await?;
            (run.run_id(), Some(run))
        }
    };
    let replayed = started.is_none();
    let found = match started {
        Some(run) if !run.is_finished() => Found::Live(run),
        _ => lookup(&st, run_id)
            .await?
            .ok_or_else(|| ApiError::run_not_found(&run_id.to_string()))?,
    };
    let v = view(found, wait).await;
    let mut resp = (StatusCode::CREATED, JsonAnswer(v)).into_response();
    if let Ok(loc) = HeaderValue::try_from(format!("/v1/runs/{run_id}")) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    if replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(resp)
}

/// The agent a submission names, or its inline manifest prepared.
async fn agent_of(st: &AppState, caller: &Caller, body: &SubmitRun) -> Result<Agent, ApiError> {
    if let Some(m) = &body.manifest {
        if !caller.is_admin() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "inline manifests are for admin tokens only (a manifest can start processes); submit by agent name",
            ));
        }
        let spec: AgentSpec = match m {
            serde_json::Value::String(yaml) => AgentSpec::from_yaml(yaml)
                .map_err(|e| ApiError::invalid(format!("manifest: {e}")))?,
            other => serde_json::from_value(other.clone())
                .map_err(|e| ApiError::invalid(format!("manifest: {e}")))?,
        };
        if spec.mcp.as_ref().is_some_and(|m| !m.servers.is_empty()) {
            return Err(ApiError::invalid(
                "manifest: an inline manifest may not name MCP servers (their commands would run on the server): put it in the server's agents directory and submit it by name",
            ));
        }
        return st
            .host
            .agent(spec)
            .map_err(|e| ApiError::invalid(format!("manifest: {e}")));
    }
    let name = body
        .agent
        .as_deref()
        .ok_or_else(|| ApiError::invalid("missing field `agent`"))?;
    catalog_agent(st, name).await
}

/// Agent `name` of the server's catalog, prepared (a manifest with MCP
/// servers starts them on its first use): 404 when there is none, 503 when
/// it cannot be prepared.
pub(crate) async fn catalog_agent(st: &AppState, name: &str) -> Result<Agent, ApiError> {
    match st.catalog().agent(name).await {
        Some(Ok(agent)) => Ok(agent),
        Some(Err(e)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "agent_unavailable",
            format!("agent `{name}` cannot be prepared: {e}"),
        )),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_agent",
            format!("no agent named `{name}` (see GET /v1/agents)"),
        )),
    }
}

/// Starts a run; a run refused at admission answers 429 / 503.
async fn start(
    st: &AppState,
    caller: &Caller,
    agent: Agent,
    body: SubmitRun,
) -> Result<RunRef, ApiError> {
    let inv = Invocation {
        caller_id: Some(caller.id.to_string()),
        prompt: body.input.unwrap_or_default(),
        inputs: body.inputs,
        budget_tokens: body.budget_tokens,
        ..Default::default()
    };
    let handle = st.host.submit(&agent, inv).await.map_err(|e| match e {
        SubmitError::NoInput { .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, "no_input", e.to_string())
        }
        e => ApiError::invalid(e.to_string()),
    })?;
    let run = handle.run_ref();
    handle.detach();
    if run.is_finished() {
        // Refused at admission (or ended at once): a refusal is an error
        // answer, with the run's id (it has a terminal record).
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(5), run.shared_result()).await {
            if let Some(e) = refusal(&r) {
                return Err(e);
            }
        }
    }
    Ok(run)
}

/// The error answer for a run refused at admission, if it was.
pub(crate) fn refusal(r: &RunResult) -> Option<ApiError> {
    let kind = r.error_kind.as_deref().unwrap_or("");
    let message = r.error.clone().unwrap_or_default();
    let mut e = match (r.status, kind) {
        (RunStatus::Rejected, "caller_concurrency") => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "caller_concurrency", message)
                .retry_after(1)
        }
        (RunStatus::Rejected, "concurrency") => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "concurrency", message).retry_after(1)
        }
        (RunStatus::Rejected, "shutting_down") => ApiError::shutting_down(),
        (RunStatus::Rejected, "circuit_open") => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "circuit_open", message).retry_after(5)
        }
        (RunStatus::Rejected, _) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "rejected", message).retry_after(1)
        }
        (RunStatus::BudgetExceeded, _) if r.iterations == 0 => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "budget_exceeded", message).retry_after(60)
        }
        _ => return None,
    };
    e.run_id = Some(r.run_id.to_string());
    Some(e)
}

/// A run: its live state, or its result.
#[utoipa::path(
    get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "The run's id"), WaitQuery),
    responses((status = 200, body = RunView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn get_run(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Result<JsonAnswer<RunView>, ApiError> {
    let wait = wait_of(&q)?;
    let found = find(&st, &caller, &id).await?;
    Ok(JsonAnswer(view(found, wait).await))
}

/// The agents this server runs.
#[utoipa::path(
    get, path = "/v1/agents", tag = "agents",
    responses((status = 200, body = AgentList), (status = 401, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn agents(State(st): State<Arc<AppState>>) -> Json<AgentList> {
    let catalog = st.catalog();
    Json(AgentList {
        agents: catalog.listed().map(super::api::AgentView::of).collect(),
        failed: catalog.failed().to_vec(),
    })
}

/// A run's audit records, in order (what `agentvisor replay` re-runs).
#[utoipa::path(
    get, path = "/v1/runs/{id}/records", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses((status = 200, description = "The run's audit records", body = Vec<Object>), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn records(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Vec<crate::ports::audit::AuditRecord>>, ApiError> {
    let found = find(&st, &caller, &id).await?;
    let run_id = match &found {
        Found::Live(r) => r.run_id(),
        Found::Ended(r) => r.run_id,
    };
    let records = st
        .host
        .audit_store()
        .run_records(run_id)
        .await
        .map_err(ApiError::store)?;
    Ok(Json(records))
}
