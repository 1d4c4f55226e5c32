//! `/v1/sessions`: chat sessions (see `crate::session`) over HTTP — create
//! one with an agent, send it messages (each answered as a Server-Sent
//! Events stream of its run), read its state and history, close it.
//!
//! A session belongs to the caller who created it, and its id is that
//! caller's: two callers may each have a session `chat-1`, and neither
//! learns of the other's (no answer differs for an id another caller
//! uses). The store keeps a caller's session under its id prefixed with
//! the caller's own tag, `c` and 16 hex digits of the SHA-256 of its
//! caller id, then `:` ([`store_id`]); so a caller's ids are at most
//! 110 characters. Admins name sessions by their stored ids, as they
//! are (every session, a caller's by its prefixed id): an admin's own
//! sessions, and every session with no token table, keep their ids
//! unprefixed, as `agentvisor chat --session ID` does.
//! Its message's run is submitted as the session's owner, so it is listed,
//! streamed and controlled under `/v1/runs` like any other run.
//!
//! One message at a time: a message sent while another runs is refused
//! with 409 `session_busy`, unless the session was created with
//! `on_busy: wait` (then it waits for the other to end). That choice is
//! kept with the session in the host's session store
//! ([`SessionMeta::on_busy`]), as its history is: on a database file
//! (`agentvisor serve --db`) a restarted server serves the session on,
//! history, state and `on_busy` included.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream;

use super::api::{BusyMode, CreateSession, MessageBody, SessionMessageView, SessionView};
use super::auth::Caller;
use super::body::JsonBody;
use super::error::{ApiError, ErrorBody};
use super::streams::{frame, sse, until_revoked};
use super::{AppState, Revoked};
use crate::ports::model::Role;
use crate::ports::session::SessionMeta;
use crate::session::{check_session_id, OnBusy, Session, SessionError, SessionOptions};
use crate::RunId;

/// How many characters a caller's tag adds to its session ids (`c`, 16
/// hex digits, `:`).
const TAG_LEN: usize = 18;

/// The tag a caller's session ids are kept under.
fn tag(caller: &Caller) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(caller.id.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("c{hex}:")
}

/// Where the session `caller` calls `id` is kept: an admin's ids are the
/// stored ids; any other caller's are prefixed with its tag.
pub(crate) fn store_id(caller: &Caller, id: &str) -> String {
    if caller.is_admin() {
        id.to_string()
    } else {
        format!("{}{id}", tag(caller))
    }
}

/// The id `caller` knows the stored session `stored` by: its own without
/// the tag.
fn shown_id(caller: &Caller, stored: &str) -> String {
    if caller.is_admin() {
        return stored.to_string();
    }
    stored
        .strip_prefix(tag(caller).as_str())
        .unwrap_or(stored)
        .to_string()
}

/// Checks an id a caller names for a new session: a session id, short
/// enough for its tag.
fn check_new_id(caller: &Caller, id: &str) -> Result<(), ApiError> {
    check_session_id(id).map_err(|e| ApiError::invalid(format!("`id`: {e}")))?;
    if check_session_id(&store_id(caller, id)).is_err() {
        return Err(ApiError::invalid(format!(
            "`id`: it is longer than {} characters",
            crate::session::MAX_SESSION_ID_LEN - TAG_LEN
        )));
    }
    Ok(())
}

/// The server's busy mode of a session's rule (none kept: refuse).
fn busy_mode(meta: &SessionMeta) -> BusyMode {
    match meta.on_busy {
        Some(OnBusy::Wait) => BusyMode::Wait,
        Some(OnBusy::Refuse) | None => BusyMode::Refuse,
    }
}

/// The answer for a session error.
fn session_error(e: SessionError) -> ApiError {
    let kind = e.kind();
    let message = e.to_string();
    let status = match &e {
        SessionError::Busy(_) => StatusCode::CONFLICT,
        SessionError::Closed(_) => StatusCode::CONFLICT,
        SessionError::AgentMismatch { .. } => StatusCode::CONFLICT,
        SessionError::Manifest { .. } => StatusCode::CONFLICT,
        SessionError::NotFound(_) => return not_found_message(message),
        SessionError::InvalidId { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        SessionError::Submit(crate::host::SubmitError::NoInput { .. }) => StatusCode::BAD_REQUEST,
        SessionError::Submit(_) => StatusCode::UNPROCESSABLE_ENTITY,
        SessionError::Store(_) => return ApiError::store(message),
    };
    ApiError::new(status, kind, message)
}

fn not_found_message(message: String) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
}

/// 404: no such session, or not the caller's (the same answer).
fn not_found(id: &str) -> ApiError {
    let shown: String = id.chars().take(128).collect();
    not_found_message(format!("no session `{shown}`"))
}

/// The session `id` if `caller` may use it (else 404), and its metadata.
async fn owned(
    st: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(Session, SessionMeta), ApiError> {
    let stored = store_id(caller, id);
    if check_session_id(id).is_err() || check_session_id(&stored).is_err() {
        return Err(not_found(id));
    }
    // Ownership first, from the store: another caller's session is never
    // touched (reopening it could fail in a way that tells it exists).
    let store = st.host.session_store();
    let mut found = store.get(&stored).await.map_err(ApiError::store)?;
    let mut stored = stored;
    if found.is_none() && !caller.is_admin() {
        // A session this caller created before ids were per caller is
        // kept under its bare id: still its own, found by its owner.
        if let Some(meta) = store.get(id).await.map_err(ApiError::store)? {
            if meta.caller_id.as_deref() == Some(&*caller.id) {
                found = Some(meta);
                stored = id.to_string();
            }
        }
    }
    let meta = found.ok_or_else(|| not_found(id))?;
    if !caller.may_see(meta.caller_id.as_deref()) {
        return Err(not_found(id));
    }
    let session = st.host.session(&stored).await.map_err(session_error)?;
    Ok((session, meta))
}

/// The view of a session, as `caller` names it.
async fn view(caller: &Caller, session: &Session) -> Result<SessionView, ApiError> {
    let meta: SessionMeta = session.meta().await.map_err(session_error)?;
    let history = session.history().await.map_err(session_error)?;
    let messages = history
        .into_iter()
        .map(|m| SessionMessageView {
            seq: m.seq,
            role: match m.message.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            }
            .to_string(),
            content: m.message.content,
            run_id: m.run_id.map(|r| r.to_string()),
            at_ms: m.at_ms,
        })
        .collect();
    let on_busy = busy_mode(&meta);
    Ok(SessionView {
        session_id: shown_id(caller, &meta.id),
        agent: meta.agent,
        caller_id: meta.caller_id,
        state: session.state().into(),
        on_busy,
        created_at: meta.created_at,
        updated_at: meta.updated_at,
        prompts: meta.prompts,
        tokens: meta.usage.total(),
        last_run_id: meta.last_run_id.map(|r| r.to_string()),
        current_run_id: session.current_run().map(|r| r.run_id().to_string()),
        messages,
    })
}

/// Create (or reopen) a session.
#[utoipa::path(
    post, path = "/v1/sessions", tag = "sessions",
    request_body = CreateSession,
    responses(
        (status = 201, description = "A new session", body = SessionView),
        (status = 200, description = "One of your sessions, reopened", body = SessionView),
        (status = 401, body = ErrorBody),
        (status = 404, description = "Unknown agent", body = ErrorBody),
        (status = 409, description = "The id is one of your sessions with another agent", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn create(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CreateSession>,
) -> Result<Response, ApiError> {
    if st.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let taken = |id: &str| {
        ApiError::new(
            StatusCode::CONFLICT,
            "session_exists",
            format!("session id `{id}` is taken"),
        )
    };
    // The id as the caller names it, and where it is kept.
    let id = match &body.id {
        Some(id) => {
            check_new_id(&caller, id)?;
            id.clone()
        }
        None => RunId::new().to_string(),
    };
    let stored = store_id(&caller, &id);
    let mut existed = false;
    if let Some(meta) = st
        .host
        .session_store()
        .get(&stored)
        .await
        .map_err(ApiError::store)?
    {
        // Only under an admin's id (a caller's ids are its own).
        if !caller.may_see(meta.caller_id.as_deref()) {
            return Err(taken(&id));
        }
        existed = true;
    }
    let agent = super::runs::catalog_agent(&st, &body.agent).await?;
    let options = SessionOptions {
        id: Some(stored),
        caller_id: Some(caller.id.to_string()),
        on_busy: OnBusy::Refuse,
    };
    let session = st
        .host
        .open_session(agent, options)
        .await
        .map_err(session_error)?;
    let meta = session.meta().await.map_err(session_error)?;
    if !caller.may_see(meta.caller_id.as_deref()) {
        // Created meanwhile by another admin.
        return Err(taken(&id));
    }
    if let Some(mode) = body.on_busy {
        let rule = match mode {
            BusyMode::Wait => OnBusy::Wait,
            BusyMode::Refuse => OnBusy::Refuse,
        };
        session
            .keep_on_busy(Some(rule))
            .await
            .map_err(session_error)?;
    }
    let v = view(&caller, &session).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut resp = (status, Json(v)).into_response();
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/sessions/{id}")) {
        resp.headers_mut().insert(axum::http::header::LOCATION, loc);
    }
    Ok(resp)
}

/// A session: its state and history.
#[utoipa::path(
    get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 200, body = SessionView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn get_session(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let (session, _) = owned(&st, &caller, &id).await?;
    Ok(Json(view(&caller, &session).await?))
}

/// Send a message; the answer comes as Server-Sent Events.
///
/// The events are those of the message's run (`id:` = the event's `seq`;
/// `text.delta`s as the answer is written, without `id:`), ending with its
/// `run.end`; the stream closes once the session has kept the turn (an
/// `ok` answer is in its history when the stream ends). The run's id is in
/// the `run-id` header; a client that drops resumes with
/// `GET /v1/runs/{run_id}/events` and `Last-Event-ID`. Dropping the stream
/// does not stop the run.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/messages", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    request_body = MessageBody,
    responses(
        (status = 200, description = "Server-Sent Events of the message's run, ending with `run.end`", content_type = "text/event-stream", body = String,
            headers(("run-id" = String, description = "The message's run"))),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`session_busy` (another message runs) or `session_closed`", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn send_message(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Extension(Revoked(revoked)): Extension<Revoked>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<MessageBody>,
) -> Result<Response, ApiError> {
    let (session, meta) = owned(&st, &caller, &id).await?;
    if body.text.trim().is_empty() {
        return Err(ApiError::invalid("`text` is empty"));
    }
    if st.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let on_busy = meta.on_busy.unwrap_or(OnBusy::Refuse);
    let turn = session
        .on_busy(on_busy)
        .prompt_streaming(body.text)
        .await
        .map_err(session_error)?;
    let run_id = turn.run_id().to_string();
    let s = stream::unfold(Some(turn), |turn| async move {
        let mut turn = turn?;
        match turn.events().next().await {
            Some(ev) => Some((Ok::<_, Infallible>(frame(&ev)), Some(turn))),
            None => {
                // The stream ends once the turn is kept (or not).
                let _ = turn.result().await;
                None
            }
        }
    });
    let mut resp = sse(until_revoked(s, revoked), st.config.keep_alive);
    if let Ok(v) = HeaderValue::from_str(&run_id) {
        resp.headers_mut().insert("run-id", v);
    }
    Ok(resp)
}

/// Close a session: a message in flight is cancelled; its history stays
/// readable; it takes no more messages.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/close", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The closed session", body = SessionView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn close(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let (session, _) = owned(&st, &caller, &id).await?;
    session.close().await.map_err(session_error)?;
    Ok(Json(view(&caller, &session).await?))
}

/// Remove a session: closed (a message in flight is cancelled), then its
/// history is deleted.
#[utoipa::path(
    delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 204, description = "Removed"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) async fn remove(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let (session, _) = owned(&st, &caller, &id).await?;
    session.close().await.map_err(session_error)?;
    st.host
        .session_store()
        .remove(session.id())
        .await
        .map_err(ApiError::store)?;
    Ok(StatusCode::NO_CONTENT)
}
