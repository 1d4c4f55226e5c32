//! `/v1/schedules`: the schedules of the skills repository the server runs
//! (`agentvisor serve --skills REPO`).
//!
//! | route | what |
//! |---|---|
//! | `GET /v1/schedules` | every schedule: skill, cron, time zone, next fire (in its zone and UTC), last outcome, streak, pause and why, today's spend |
//! | `POST /v1/schedules/{name}/run` | fire it now (its `overlap` applies; a paused schedule runs too) |
//! | `POST /v1/schedules/{name}/pause` | pause it (`{"reason": "…"}`, optional) |
//! | `POST /v1/schedules/{name}/resume` | clear its pause and its failure streak |
//! | `POST /v1/schedules/reload` | read the repository again (a repository that is refused changes nothing: 422 with the error) |
//!
//! Schedules are the host's configuration, and their runs are submitted
//! as callers of their own (`schedule:NAME`): they are an admin's. As
//! `GET /v1/runs` lists a caller's own runs only, `GET /v1/schedules`
//! lists none to a token that is not an admin's (`repo: null`, no
//! schedules); the commands answer it 403. A server without `--skills`
//! lists no schedules and answers 404 to the commands.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Caller;
use super::body::OptionalJson;
use super::error::{ApiError, ErrorBody};
use super::AppState;
use crate::schedules::{FireAnswer, ReloadSummary, ScheduleView, Scheduler, SchedulerError};

/// One schedule.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScheduleItem {
    /// Its name.
    pub name: String,
    /// The skill it runs.
    pub skill: String,
    /// Its cron expression.
    pub cron: String,
    /// The IANA time zone the cron is read in.
    pub timezone: String,
    /// Its jitter offset, in seconds.
    pub jitter_secs: u64,
    /// `skip`, `queue_one`, `cancel_previous` or `allow`.
    pub overlap: String,
    /// `skip`, `run_once` or `backfill`.
    pub missed: String,
    /// Consecutive failures of one reason that pause it.
    pub pause_after: Option<u32>,
    /// Its next fire in its time zone (RFC 9557:
    /// `2026-03-08T03:00:00-04:00[America/New_York]`).
    pub next_fire: Option<String>,
    /// The same instant in UTC (RFC 3339).
    pub next_fire_utc: Option<String>,
    /// When it last fired (Unix ms).
    pub last_fire_at: Option<u64>,
    /// `succeeded`, `partial_failure`, `failed`, `cancelled`,
    /// `over_budget` or `skipped`.
    pub last_outcome: Option<String>,
    /// Why (a failure's typed reason, a skip's reason).
    pub last_reason: Option<String>,
    /// The run of its last fire.
    pub last_run_id: Option<String>,
    /// Consecutive failures of `streak_reason`.
    pub streak: u32,
    /// Their typed reason.
    pub streak_reason: Option<String>,
    /// Whether it is paused.
    pub paused: bool,
    /// Why.
    pub paused_why: Option<String>,
    /// When (Unix ms).
    pub paused_at: Option<u64>,
    /// Whether `pause_after` paused it (rather than an operator).
    pub paused_auto: bool,
    /// Its runs in flight.
    pub running: u32,
    /// Whether a fire waits for the run in flight (`queue_one`).
    pub queued: bool,
    /// Missed fires still to catch up.
    pub backlog: u64,
    /// The day `spent_tokens` and `spent_cost_micros` count, in its time
    /// zone.
    pub spent_day: Option<String>,
    /// Tokens its runs used that day.
    pub spent_tokens: u64,
    /// Their cost in micro-dollars.
    pub spent_cost_micros: u64,
}

impl ScheduleItem {
    fn of(v: &ScheduleView) -> Self {
        let s = &v.schedule;
        let st = &v.state;
        let name = |x: serde_json::Value| x.as_str().unwrap_or_default().to_string();
        let next = st.next_fire_ms.map(crate::schedules::from_ms);
        ScheduleItem {
            name: s.name.clone(),
            skill: s.skill.clone(),
            cron: s.clock.cron().to_string(),
            timezone: s.timezone.clone(),
            jitter_secs: s.clock.offset().as_secs(),
            overlap: name(
                serde_json::to_value(s.settings.overlap.unwrap_or_default()).unwrap_or_default(),
            ),
            missed: name(
                serde_json::to_value(s.settings.missed.unwrap_or_default()).unwrap_or_default(),
            ),
            pause_after: s.settings.pause_after,
            next_fire: next.map(|t| t.to_zoned_datetime(s.clock.time_zone().clone()).to_string()),
            next_fire_utc: next.map(|t| t.to_string()),
            last_fire_at: st.last_fire_ms,
            last_outcome: st.last_outcome.clone(),
            last_reason: st.last_reason.clone(),
            last_run_id: st.last_run_id.clone(),
            streak: st.streak,
            streak_reason: st.streak_reason.clone(),
            paused: st.paused.is_some(),
            paused_why: st.paused.as_ref().map(|p| p.why.clone()),
            paused_at: st.paused.as_ref().map(|p| p.at_ms),
            paused_auto: st.paused.as_ref().is_some_and(|p| p.auto),
            running: v.running,
            queued: v.queued,
            backlog: v.backlog as u64,
            spent_day: st.spent_day.clone(),
            spent_tokens: st.spent_tokens,
            spent_cost_micros: st.spent_cost_micros,
        }
    }
}

/// `GET /v1/schedules`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScheduleList {
    /// The skills repository's root, when the server runs one.
    pub repo: Option<String>,
    /// The schedules, by name.
    pub schedules: Vec<ScheduleItem>,
}

/// `POST /v1/schedules/{name}/pause`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    /// Why (default: `paused by CALLER`).
    pub reason: Option<String>,
}

/// What `POST /v1/schedules/{name}/run` did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScheduleFired {
    /// The schedule.
    pub schedule: String,
    /// `started`, `queued` or `skipped`.
    pub fired: String,
    /// Why it was skipped.
    pub reason: Option<String>,
}

/// What `POST /v1/schedules/reload` changed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReloadView {
    /// Schedules new in the repository.
    pub added: Vec<String>,
    /// Schedules no longer in it.
    pub removed: Vec<String>,
    /// Schedules whose configuration changed (streak reset).
    pub changed: Vec<String>,
    /// Schedules as they were.
    pub unchanged: Vec<String>,
}

impl From<ReloadSummary> for ReloadView {
    fn from(s: ReloadSummary) -> Self {
        ReloadView {
            added: s.added,
            removed: s.removed,
            changed: s.changed,
            unchanged: s.unchanged,
        }
    }
}

fn admin_only(caller: &Caller) -> Result<(), ApiError> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "schedules are for admin tokens only",
        ))
    }
}

fn scheduler(st: &AppState) -> Result<Scheduler, ApiError> {
    st.scheduler().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_schedules",
            "this server runs no skills repository (agentvisor serve --skills REPO)",
        )
    })
}

fn failed(e: SchedulerError) -> ApiError {
    match e {
        SchedulerError::Unknown(u) => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", u.to_string())
        }
        SchedulerError::Repo(r) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_repo",
            r.to_string(),
        ),
        other => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "scheduler_unavailable",
            other.to_string(),
        ),
    }
}

/// The schedules and their state.
#[utoipa::path(
    get, path = "/v1/schedules", tag = "schedules",
    responses((status = 200, description = "The schedules (none to a token that is not an admin's)", body = ScheduleList), (status = 401, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<ScheduleList>, ApiError> {
    let scheduler = st.scheduler().filter(|_| caller.is_admin());
    let Some(s) = scheduler else {
        return Ok(Json(ScheduleList {
            repo: None,
            schedules: Vec::new(),
        }));
    };
    let views = s.list().await.map_err(failed)?;
    Ok(Json(ScheduleList {
        repo: Some(s.root().display().to_string()),
        schedules: views.iter().map(ScheduleItem::of).collect(),
    }))
}

/// Fire a schedule now.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/run", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")),
    responses((status = 202, body = ScheduleFired), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn run(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<ScheduleFired>), ApiError> {
    admin_only(&caller)?;
    if st.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let answer = scheduler(&st)?.run_now(&name).await.map_err(failed)?;
    let (fired, reason) = match answer {
        FireAnswer::Started => ("started", None),
        FireAnswer::Queued => ("queued", None),
        FireAnswer::Skipped(why) => ("skipped", Some(why)),
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(ScheduleFired {
            schedule: name,
            fired: fired.into(),
            reason,
        }),
    ))
}

async fn view_of(s: &Scheduler, name: &str) -> Result<ScheduleItem, ApiError> {
    let views = s.list().await.map_err(failed)?;
    views
        .iter()
        .find(|v| v.schedule.name == name)
        .map(ScheduleItem::of)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no schedule `{name}`"),
            )
        })
}

/// Pause a schedule.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/pause", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")), request_body(content = Option<PauseBody>),
    responses((status = 200, body = ScheduleItem), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn pause(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: OptionalJson<PauseBody>,
) -> Result<Json<ScheduleItem>, ApiError> {
    admin_only(&caller)?;
    let why = match body.0.and_then(|b| b.reason) {
        Some(r) if r.trim().is_empty() => return Err(ApiError::invalid("`reason` is empty")),
        Some(r) if r.len() > 1000 => {
            return Err(ApiError::invalid("`reason` is longer than 1000 bytes"))
        }
        Some(r) => r,
        None => format!("paused by {}", caller.id),
    };
    let s = scheduler(&st)?;
    s.pause(&name, &why).await.map_err(failed)?;
    Ok(Json(view_of(&s, &name).await?))
}

/// Resume a schedule (clears its pause and its failure streak).
#[utoipa::path(
    post, path = "/v1/schedules/{name}/resume", tag = "schedules",
    params(("name" = String, Path, description = "The schedule's name")),
    responses((status = 200, body = ScheduleItem), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn resume(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<ScheduleItem>, ApiError> {
    admin_only(&caller)?;
    let s = scheduler(&st)?;
    s.resume(&name).await.map_err(failed)?;
    Ok(Json(view_of(&s, &name).await?))
}

/// Read the skills repository again (as SIGHUP does).
#[utoipa::path(
    post, path = "/v1/schedules/reload", tag = "schedules",
    responses((status = 200, body = ReloadView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, description = "The repository is refused; the schedules running go on", body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn reload(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<ReloadView>, ApiError> {
    admin_only(&caller)?;
    let s = scheduler(&st)?;
    let summary = s.reload_from_disk().await.map_err(failed)?;
    Ok(Json(summary.into()))
}
