//! `POST /v1/runs/{id}/fork` and `GET /v1/diff?a=&b=`: `agentvisor fork`
//! and `agentvisor diff` over HTTP (see `crate::fork`, `crate::diff`).
//!
//! A caller forks and diffs its own runs only: another caller's run
//! answers 404, as an unknown id does (the lookup is `runs::find`'s).
//! The fork is charged to the caller that asks, goes on with an agent of
//! the server's catalog (by default the recorded run's, by name) and is
//! submitted through the host like any run; the answer is the fork's view,
//! as `POST /v1/runs` gives it (`?wait=` for its result). Its replayed
//! steps are not checked here: `GET /v1/diff?a=RECORDED&b=FORK` shows
//! them.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::api::{DiffQuery, ForkBody, RunView, WaitQuery};
use super::auth::Caller;
use super::body::{JsonAnswer, JsonBody};
use super::error::{ApiError, ErrorBody};
use super::runs::{catalog_agent, find, refusal, view, wait_of, Found};
use super::AppState;
use crate::fork::{fork, ForkError, ForkOptions, Recording};
use crate::ports::tool::ToolEffect;
use crate::{AgentSpec, RunId};

/// The run id of a run found.
fn id_of(found: &Found) -> RunId {
    match found {
        Found::Live(r) => r.run_id(),
        Found::Ended(r) => r.run_id,
    }
}

/// The manifest a fork goes on with: the catalog agent's, the body's
/// overrides applied and checked.
async fn fork_spec(
    st: &AppState,
    body: &ForkBody,
    recording: &Recording,
) -> Result<AgentSpec, ApiError> {
    let name = body
        .agent
        .clone()
        .unwrap_or_else(|| recording.info().agent.to_string());
    let mut spec = catalog_agent(st, &name).await?.spec().clone();
    if let Some(m) = &body.model {
        spec.model = m.clone();
        // A model named here replaces the manifest's; its script stays
        // only for `scripted`.
        if m != "scripted" {
            spec.script.clear();
        }
    }
    if let Some(s) = &body.system {
        spec.system = s.clone();
    }
    if let Some(p) = &body.critic_policy {
        spec.critic = match p {
            serde_json::Value::String(s) if s.trim() == "rules" => Default::default(),
            serde_json::Value::String(yaml) => serde_norway::from_str(yaml)
                .map_err(|e| ApiError::invalid(format!("critic_policy: {e}")))?,
            other => serde_norway::to_value(other)
                .and_then(serde_norway::from_value)
                .map_err(|e| ApiError::invalid(format!("critic_policy: {e}")))?,
        };
    }
    spec.check_changed()
        .map_err(|e| ApiError::invalid(format!("the fork's manifest: {e}")))?;
    Ok(spec)
}

/// Fork one of the caller's runs from a step.
#[utoipa::path(
    post, path = "/v1/runs/{id}/fork", tag = "runs",
    params(("id" = String, Path, description = "The recorded run's id"), WaitQuery),
    request_body = ForkBody,
    responses(
        (status = 201, description = "The fork (its result if it ended within `wait`)", body = RunView),
        (status = 401, body = ErrorBody),
        (status = 404, description = "No such run of the caller, or unknown agent", body = ErrorBody),
        (status = 422, description = "A step past the recording, or a refused option", body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn fork_run(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
    JsonBody(body): JsonBody<ForkBody>,
) -> Result<Response, ApiError> {
    let wait = wait_of(&q)?;
    if st.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let run_id = id_of(&find(&st, &caller, &id).await?);
    let records = st
        .host
        .audit_store()
        .run_records(run_id)
        .await
        .map_err(ApiError::store)?;
    let recording =
        Recording::from_records(run_id, &records).map_err(|e| ApiError::invalid(e.to_string()))?;
    let live = body
        .live_tools
        .iter()
        .map(|t| t.parse::<ToolEffect>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::invalid(format!("live_tools: {e}")))?;
    let spec = fork_spec(&st, &body, &recording).await?;
    let options = ForkOptions {
        at_step: body.at_step,
        live,
        prompt: body.prompt.clone(),
        caller_id: Some(caller.id.to_string()),
        budget_tokens: body.budget_tokens,
    };
    let run = match fork(&st.host, spec, &recording, options).await {
        Ok(r) => r.detach(),
        Err(e @ ForkError::Submit(_)) | Err(e @ ForkError::StepOutOfRange { .. }) => {
            return Err(ApiError::invalid(e.to_string()))
        }
        Err(e) => return Err(ApiError::invalid(e.to_string())),
    };
    if run.is_finished() {
        if let Ok(r) =
            tokio::time::timeout(std::time::Duration::from_secs(5), run.shared_result()).await
        {
            if let Some(e) = refusal(&r) {
                return Err(e);
            }
        }
    }
    let fork_id = run.run_id();
    let v = view(Found::Live(run), wait).await;
    let mut resp = (StatusCode::CREATED, JsonAnswer(v)).into_response();
    if let Ok(loc) = HeaderValue::try_from(format!("/v1/runs/{fork_id}")) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(resp)
}

/// Two of the caller's runs aligned step by step (`agentvisor diff`).
#[utoipa::path(
    get, path = "/v1/diff", tag = "runs",
    params(DiffQuery),
    responses(
        (status = 200, description = "The diff (its JSON form is in docs/fork.md)", body = Object),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn diff_runs(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<DiffQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let a = id_of(&find(&st, &caller, &q.a).await?);
    let b = id_of(&find(&st, &caller, &q.b).await?);
    let store = st.host.audit_store();
    let ra = store.run_records(a).await.map_err(ApiError::store)?;
    let rb = store.run_records(b).await.map_err(ApiError::store)?;
    let d = crate::diff::diff(a, &ra, b, &rb).map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(Json(serde_json::to_value(&d).map_err(ApiError::store)?))
}
