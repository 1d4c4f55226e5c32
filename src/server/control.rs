//! `POST /v1/runs/{id}/steer|extend|kill|cancel|approve|deny`: a caller
//! stepping into one of its live runs.
//!
//! Every command names a live run the caller may see (another caller's run
//! answers 404, as an unknown id does); a run that has ended answers 409.
//! A command is handed to the run and answered 202 at once: its effect
//! shows in the run's events.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};

use super::api::{
    Accepted, ApprovalBody, ApprovalDecision, ExtendBody, KillBody, PendingView, SteerBody,
};
use super::auth::Caller;
use super::body::{JsonBody, OptionalJson};
use super::error::{ApiError, ErrorBody};
use super::runs::{find, Found};
use super::AppState;
use crate::{ApprovalError, KillReason, PendingApproval, RunRef};

/// The live run `id`, or 409 if it has ended.
async fn live_run(st: &AppState, caller: &Caller, id: &str) -> Result<RunRef, ApiError> {
    match find(st, caller, id).await? {
        Found::Live(r) if !r.is_finished() => Ok(r),
        _ => Err(ApiError::new(
            StatusCode::CONFLICT,
            "run_finished",
            format!("run `{id}` has ended"),
        )),
    }
}

fn accepted(run: &RunRef, action: &str) -> (StatusCode, Json<Accepted>) {
    (
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: run.run_id().to_string(),
            action: action.to_string(),
        }),
    )
}

/// Inject a message before the run's next model call.
#[utoipa::path(
    post, path = "/v1/runs/{id}/steer", tag = "control",
    params(("id" = String, Path, description = "The run's id")), request_body = SteerBody,
    responses((status = 202, body = Accepted), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, description = "The run has ended", body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn steer(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<SteerBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let run = live_run(&st, &caller, &id).await?;
    if body.text.trim().is_empty() {
        return Err(ApiError::invalid("`text` is empty"));
    }
    run.steer(body.text);
    Ok(accepted(&run, "steer"))
}

/// Push the run's hard deadline back.
#[utoipa::path(
    post, path = "/v1/runs/{id}/extend", tag = "control",
    params(("id" = String, Path, description = "The run's id")), request_body = ExtendBody,
    responses((status = 202, body = Accepted), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn extend(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ExtendBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    if !(body.seconds.is_finite() && body.seconds > 0.0 && body.seconds <= 86_400.0) {
        return Err(ApiError::invalid("`seconds` must be > 0 and ≤ 86400"));
    }
    let run = live_run(&st, &caller, &id).await?;
    run.extend(Duration::from_secs_f64(body.seconds));
    Ok(accepted(&run, "extend"))
}

/// Kill the run (status `killed`, reason `operator` unless given).
#[utoipa::path(
    post, path = "/v1/runs/{id}/kill", tag = "control",
    params(("id" = String, Path, description = "The run's id")), request_body(content = Option<KillBody>),
    responses((status = 202, body = Accepted), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn kill(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: OptionalJson<KillBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let body = body.0.unwrap_or_default();
    let reason = match body.reason.as_deref() {
        None | Some("operator") => KillReason::Operator,
        Some("policy") => KillReason::Policy,
        Some("budget") => KillReason::Budget,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`reason`: `{other}` is not one of operator, policy, budget"
            )))
        }
    };
    let run = live_run(&st, &caller, &id).await?;
    run.kill(reason);
    Ok(accepted(&run, "kill"))
}

/// Cancel the run (status `cancelled`).
#[utoipa::path(
    post, path = "/v1/runs/{id}/cancel", tag = "control",
    params(("id" = String, Path, description = "The run's id")),
    responses((status = 202, body = Accepted), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn cancel(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let run = live_run(&st, &caller, &id).await?;
    run.cancel();
    Ok(accepted(&run, "cancel"))
}

/// Why a decision did not reach the run.
fn approval_error(id: &str, e: ApprovalError) -> ApiError {
    let message = match &e {
        ApprovalError::NotAwaiting => format!("run `{id}` awaits no approval"),
        other => format!("run `{id}`: {other}"),
    };
    ApiError::new(StatusCode::CONFLICT, e.kind(), message)
}

/// What `approve` and `deny` share: finds the live run `id`, hands it the
/// decision (`hand`), answers 409 when the run refuses it, and otherwise
/// with the calls decided under `action`.
async fn decide(
    st: &AppState,
    caller: &Caller,
    id: &str,
    action: &str,
    hand: impl FnOnce(&RunRef) -> Result<Vec<PendingApproval>, ApprovalError>,
) -> Result<Json<ApprovalDecision>, ApiError> {
    let run = live_run(st, caller, id).await?;
    let calls = hand(&run).map_err(|e| approval_error(id, e))?;
    Ok(Json(ApprovalDecision {
        run_id: run.run_id().to_string(),
        action: action.to_string(),
        calls: calls.iter().map(PendingView::from).collect(),
    }))
}

/// Approve the tool calls the run waits for (or the one `call_id` names):
/// they run, and the run goes on once none waits.
#[utoipa::path(
    post, path = "/v1/runs/{id}/approve", tag = "control",
    params(("id" = String, Path, description = "The run's id")), request_body(content = Option<ApprovalBody>),
    responses(
        (status = 200, description = "The calls approved", body = ApprovalDecision),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The run has ended, awaits no approval (`not_awaiting_approval`), or not of that call (`unknown_call`)", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn approve(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: OptionalJson<ApprovalBody>,
) -> Result<Json<ApprovalDecision>, ApiError> {
    let body = body.0.unwrap_or_default();
    decide(&st, &caller, &id, "approve", |run| {
        run.approve(body.call_id.as_deref())
    })
    .await
}

/// Deny the tool calls the run waits for (or the one `call_id` names):
/// the model reads `denied by operator: NOTE` as their result.
#[utoipa::path(
    post, path = "/v1/runs/{id}/deny", tag = "control",
    params(("id" = String, Path, description = "The run's id")), request_body(content = Option<ApprovalBody>),
    responses(
        (status = 200, description = "The calls denied", body = ApprovalDecision),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The run has ended, awaits no approval (`not_awaiting_approval`), or not of that call (`unknown_call`)", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn deny(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: OptionalJson<ApprovalBody>,
) -> Result<Json<ApprovalDecision>, ApiError> {
    let body = body.0.unwrap_or_default();
    decide(&st, &caller, &id, "deny", |run| {
        run.deny(body.call_id.as_deref(), body.note.unwrap_or_default())
    })
    .await
}
