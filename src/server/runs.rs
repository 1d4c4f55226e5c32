//! `/v1/runs`: submit, read, list, and steer / extend / kill / cancel.
//!
//! A caller sees and controls only its own runs: another caller's run
//! answers 404, as an unknown id does. Admins see every run.
//!
//! The routes of one resource share its lookups (`find`, the caller's
//! ownership check) and stay in one file; listing and the control commands
//! are the parts to give files of their own when they grow.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::api::{
    Accepted, AgentList, AgentView, ApprovalBody, ApprovalDecision, ExtendBody, KillBody,
    ListQuery, PendingView, RunItem, RunList, RunView, SteerBody, SubmitRun, WaitQuery,
};
use super::auth::Caller;
use super::body::JsonBody;
use super::error::{ApiError, ErrorBody};
use super::AppState;
use crate::host::LiveStatus;
use crate::ports::audit::{AuditEntry, RunCursor, RunFilter, RunSummary};
use crate::{
    Agent, AgentSpec, ApprovalError, Invocation, KillReason, PendingApproval, RunEvent, RunId,
    RunRef, RunResult, RunStatus,
};

/// The longest `?wait=` honoured.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// Default and largest page.
const PAGE: u32 = 50;
const MAX_PAGE: u32 = 500;

/// A run, live or ended.
pub(crate) enum Found {
    Live(RunRef),
    Ended(Box<RunResult>),
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
            return Ok(Some(Found::Ended(Box::new(r))));
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
            return Ok(Some(Found::Ended(Box::new(r))));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(None)
}

/// The view of `found`, waiting up to `wait` for a live run to end.
async fn view(found: Found, wait: Duration) -> RunView {
    match found {
        Found::Ended(r) => RunView::ended(&r),
        Found::Live(run) => {
            if !wait.is_zero() {
                if let Ok(r) = tokio::time::timeout(wait, run.shared_result()).await {
                    return RunView::ended(&r);
                }
            }
            RunView::live(&run)
        }
    }
}

fn wait_of(q: &WaitQuery) -> Result<Duration, ApiError> {
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
    let agent = agent_of(&st, &caller, &body)?;
    let (run_id, replayed) = match &key {
        Some(k) => {
            let cell = st.idempotency.cell(&caller.id, k);
            let mut fresh = false;
            let id = cell
                .get_or_try_init(|| {
                    fresh = true;
                    start(&st, &caller, agent, body)
                })
                .await?;
            (*id, !fresh)
        }
        None => (start(&st, &caller, agent, body).await?, false),
    };
    let found = lookup(&st, run_id)
        .await?
        .ok_or_else(|| ApiError::run_not_found(&run_id.to_string()))?;
    let v = view(found, wait).await;
    let mut resp = (StatusCode::CREATED, Json(v)).into_response();
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/runs/{run_id}")) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    if replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(resp)
}

/// The agent a submission names, or its inline manifest prepared.
fn agent_of(st: &AppState, caller: &Caller, body: &SubmitRun) -> Result<Agent, ApiError> {
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
        return st
            .host
            .agent(spec)
            .map_err(|e| ApiError::invalid(format!("manifest: {e}")));
    }
    let name = body
        .agent
        .as_deref()
        .ok_or_else(|| ApiError::invalid("missing field `agent`"))?;
    st.catalog().get(name).cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_agent",
            format!("no agent named `{name}` (see GET /v1/agents)"),
        )
    })
}

/// Starts a run; a run refused at admission answers 429 / 503.
async fn start(
    st: &AppState,
    caller: &Caller,
    agent: Agent,
    body: SubmitRun,
) -> Result<RunId, ApiError> {
    let inv = Invocation {
        caller_id: Some(caller.id.to_string()),
        prompt: body.input.unwrap_or_default(),
        inputs: body.inputs,
        ..Default::default()
    };
    let handle = st
        .host
        .submit(&agent, inv)
        .await
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let run = handle.run_ref();
    handle.detach();
    let run_id = run.run_id();
    if run.is_finished() {
        // Refused at admission (or ended at once): a refusal is an error
        // answer, with the run's id (it has a terminal record).
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(5), run.shared_result()).await {
            if let Some(e) = refusal(&r) {
                return Err(e);
            }
        }
    } else if let Some(limit) = body.budget_tokens {
        tokio::spawn(cap_tokens(run, limit));
    }
    Ok(run_id)
}

/// The error answer for a run refused at admission, if it was.
fn refusal(r: &RunResult) -> Option<ApiError> {
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

/// Kills `run` (`budget`) once it has used more than `limit` tokens.
async fn cap_tokens(run: RunRef, limit: u64) {
    let mut events = run.subscribe_from(0);
    while let Some(ev) = events.next().await {
        if matches!(
            ev.event,
            RunEvent::StepFinish { .. } | RunEvent::TranscriptCompacted { .. }
        ) && run.live().tokens > limit
        {
            run.kill(KillReason::Budget);
            return;
        }
    }
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
) -> Result<Json<RunView>, ApiError> {
    let wait = wait_of(&q)?;
    let found = find(&st, &caller, &id).await?;
    Ok(Json(view(found, wait).await))
}

/// A cursor: where a page ended, and when the listing began.
///
/// A listing is live runs (newest first, by id), then ended runs (the most
/// recently ended first, a keyset page of the run index at a time). `since`
/// is the time the first page was read: in the ended section a run that
/// ended after it and sorts at or before `boundary` (the last live run
/// listed) was listed live already, or started after the listing began,
/// and is skipped. So a run that ends while a client pages is listed once,
/// and runs started meanwhile are not listed; as opaque hex text (`l…`,
/// `e…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    /// Unix ms when the listing began.
    since: u64,
    /// The last live run listed (`RunId(0)`: none).
    boundary: RunId,
    /// In the ended section: after this run.
    ended: Option<RunCursor>,
}

impl Cursor {
    fn encode(&self) -> String {
        match self.ended {
            None => format!("l{:016x}{}", self.since, self.boundary),
            Some(e) => format!("e{:016x}{}{}", self.since, self.boundary, e.encode()),
        }
    }

    fn parse(s: &str) -> Option<Cursor> {
        let hex = |t: &str| t.bytes().all(|b| b.is_ascii_hexdigit());
        let kind = s.get(..1)?;
        let since = s.get(1..17).filter(|t| hex(t))?;
        let since = u64::from_str_radix(since, 16).ok()?;
        let boundary = s.get(17..49).filter(|t| hex(t))?.parse().ok()?;
        let rest = s.get(49..)?;
        let ended = match (kind, rest.is_empty()) {
            ("l", true) => None,
            ("e", false) => Some(RunCursor::decode(rest)?),
            _ => return None,
        };
        Some(Cursor {
            since,
            boundary,
            ended,
        })
    }

    /// Whether an ended run belongs to a listing that began at `since`
    /// and listed live runs down to `boundary`.
    fn keeps_ended(&self, r: &RunSummary) -> bool {
        r.finished_at <= self.since || r.run_id < self.boundary
    }
}

/// Ended runs fetched from the index at a time, at least.
const FETCH: u32 = 64;

/// How long a listing waits for a run's terminal record being written.
const SETTLE: Duration = Duration::from_secs(2);

/// Runs, newest first, a page at a time.
#[utoipa::path(
    get, path = "/v1/runs", tag = "runs",
    params(ListQuery),
    responses((status = 200, body = RunList), (status = 401, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn list_runs(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Json<RunList>, ApiError> {
    let bad = |field: &str, why: &str| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_query",
            format!("`{field}`: {why}"),
        )
    };
    let limit = q.limit.unwrap_or(PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(bad("limit", "must be 1 to 500"));
    }
    let (want_live, status) = match q.status.as_deref() {
        None | Some("") => (true, None),
        Some("running") => (true, Some(None)),
        Some(s) => (
            false,
            Some(Some(
                s.parse::<RunStatus>()
                    .map_err(|e| bad("status", &e.to_string()))?,
            )),
        ),
    };
    let want_ended = !matches!(status, Some(None));
    let status = status.flatten();
    let root = match q.root.as_deref() {
        None | Some("") => None,
        Some(r) => Some(parse_id(r).map_err(|_| bad("root", "not a run id"))?),
    };
    let given = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => {
            Some(Cursor::parse(c).ok_or_else(|| bad("cursor", "not a cursor this server gave"))?)
        }
    };
    let first_page = given.is_none();
    let mine = |owner: Option<&str>| caller.may_see(owner);
    let agent_ok = |a: &str| q.agent.as_deref().is_none_or(|want| want == a);
    let limit = limit as usize;
    let mut out: Vec<RunItem> = Vec::new();
    let mut more = false;

    // Parents of every run we know of, for `root`.
    let mut parents: HashMap<RunId, Option<RunId>> = HashMap::new();
    let live = st.host.runs();
    for r in &live {
        parents.insert(r.run_id, r.parent_run_id);
    }
    // Runs that have ended but whose terminal record is still being
    // written: waited for (briefly), so the ended section lists them.
    let mut settled = HashSet::new();
    if want_ended {
        let finishing = live
            .iter()
            .filter(|r| r.status == LiveStatus::Finishing)
            .filter_map(|r| st.host.run(&r.run_id))
            .map(|run| async move {
                tokio::time::timeout(SETTLE, run.shared_result())
                    .await
                    .ok()
                    .map(|r| r.run_id)
            });
        settled.extend(
            futures_util::future::join_all(finishing)
                .await
                .into_iter()
                .flatten(),
        );
    }
    let mut cursor = given.unwrap_or(Cursor {
        // Read after the live runs are: a run that had ended by then
        // (gone, or finishing and not listed live) ended before it.
        since: crate::ports::run::unix_ms(),
        boundary: RunId(0),
        ended: None,
    });
    let ended_filter = RunFilter {
        status,
        caller: (!caller.is_admin()).then(|| caller.id.to_string()),
        limit: None,
        root: None,
        after: None,
    };
    let all_ended = if root.is_some() && want_ended {
        let all = st
            .index
            .list_runs(&ended_filter)
            .await
            .map_err(ApiError::store)?;
        for r in &all {
            parents.insert(r.run_id, r.parent_run_id);
        }
        Some(all)
    } else {
        None
    };
    let in_tree = |id: RunId| -> bool {
        let Some(root) = root else { return true };
        let mut cur = Some(id);
        let mut seen = HashSet::new();
        while let Some(c) = cur {
            if c == root {
                return true;
            }
            if !seen.insert(c) {
                return false;
            }
            cur = parents.get(&c).copied().flatten();
        }
        false
    };

    let mut seen = HashSet::new();
    if want_live && cursor.ended.is_none() {
        for r in &live {
            // Later pages: after the last one listed, and none started
            // since the listing began (ids grow with time).
            if !first_page && r.run_id >= cursor.boundary {
                continue;
            }
            if settled.contains(&r.run_id) {
                // Ended and on record: listed as ended.
                continue;
            }
            if !mine(r.caller_id.as_deref()) || !agent_ok(&r.agent) || !in_tree(r.run_id) {
                continue;
            }
            if out.len() == limit {
                more = true;
                break;
            }
            seen.insert(r.run_id);
            cursor.boundary = r.run_id;
            out.push(RunItem::live(r));
        }
    }
    if !more && want_ended {
        let c = cursor;
        let keep = |r: &RunSummary| {
            mine(r.caller_id.as_deref())
                && agent_ok(&r.agent)
                && in_tree(r.run_id)
                && !seen.contains(&r.run_id)
                && c.keeps_ended(r)
        };
        let need = limit + 1 - out.len();
        let ended: Vec<RunSummary> = match &all_ended {
            Some(all) => all
                .iter()
                .filter(|r| c.ended.is_none_or(|e| e.precedes(r)) && keep(r))
                .take(need)
                .cloned()
                .collect(),
            None => {
                // Keyset pages of the index from the cursor on, until
                // this page is full or the index has no more; each
                // fetch starts where the last ended.
                let mut kept = Vec::with_capacity(need);
                let mut after = c.ended;
                loop {
                    let ask = (need as u32).max(FETCH);
                    let f = RunFilter {
                        limit: Some(ask),
                        after,
                        ..ended_filter.clone()
                    };
                    let got = st.index.list_runs(&f).await.map_err(ApiError::store)?;
                    let short = got.len() < ask as usize;
                    after = got.last().map(RunCursor::after).or(after);
                    kept.extend(got.into_iter().filter(|r| keep(r)));
                    if kept.len() >= need || short {
                        break;
                    }
                }
                kept.truncate(need);
                kept
            }
        };
        for r in ended {
            if out.len() == limit {
                more = true;
                break;
            }
            cursor.ended = Some(RunCursor::after(&r));
            out.push(RunItem::ended(&r));
        }
    }
    // A full page of live runs may be followed by ended ones.
    if !more && out.len() == limit && want_ended && cursor.ended.is_none() {
        more = true;
    }
    Ok(Json(RunList {
        runs: out,
        next_cursor: more.then(|| cursor.encode()),
    }))
}

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
    body: super::body::OptionalJson<KillBody>,
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

fn decided(run: &RunRef, action: &str, calls: Vec<PendingApproval>) -> Json<ApprovalDecision> {
    Json(ApprovalDecision {
        run_id: run.run_id().to_string(),
        action: action.to_string(),
        calls: calls.iter().map(PendingView::from).collect(),
    })
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
    body: super::body::OptionalJson<ApprovalBody>,
) -> Result<Json<ApprovalDecision>, ApiError> {
    let body = body.0.unwrap_or_default();
    let run = live_run(&st, &caller, &id).await?;
    let calls = run
        .approve(body.call_id.as_deref())
        .map_err(|e| approval_error(&id, e))?;
    Ok(decided(&run, "approve", calls))
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
    body: super::body::OptionalJson<ApprovalBody>,
) -> Result<Json<ApprovalDecision>, ApiError> {
    let body = body.0.unwrap_or_default();
    let run = live_run(&st, &caller, &id).await?;
    let calls = run
        .deny(body.call_id.as_deref(), body.note.unwrap_or_default())
        .map_err(|e| approval_error(&id, e))?;
    Ok(decided(&run, "deny", calls))
}

/// The agents this server runs.
#[utoipa::path(
    get, path = "/v1/agents", tag = "agents",
    responses((status = 200, body = AgentList), (status = 401, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn agents(State(st): State<Arc<AppState>>) -> Json<AgentList> {
    let agents = st
        .catalog()
        .iter()
        .map(|a| AgentView {
            name: a.name().to_string(),
            description: a.spec().description.clone(),
            model: a.model().name().to_string(),
            tools: a.spec().tools.clone(),
        })
        .collect();
    Json(AgentList { agents })
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
