//! Server-Sent Events: one run's events (`GET /v1/runs/{id}/events`) and
//! the host-wide feed (`GET /v1/events`).
//!
//! A run's stream: every event is one `data:` line of the event's JSON
//! (`{"type": …, "run_id": …, "seq": N, …}`) with `id: N`, its record's
//! `seq`. A client that drops and comes back with `Last-Event-ID: N` gets
//! every record after `N`, exactly once. Events that are not records carry
//! no `id:` (so they never move a resume point): streamed `text.delta`s,
//! a `lagged` notice, and a failed run's `error`, which shares its `seq`
//! with the `run.end` after it (a client that drops between the two gets
//! the `error` again, never loses the `run.end`). Keep-alive comments
//! (`: keep-alive`) go out while nothing happens; the stream ends after
//! `run.end`.
//!
//! The host-wide feed is lossy (a dashboard's feed): a slow client gets a
//! `lagged` event saying how many events it missed. It carries no ids.
//!
//! Every stream ends when the token it was opened with is revoked (a
//! reload of the tokens file without it, see [`super::Revoked`]).

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::{stream, Stream, StreamExt};

use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::runs::{find, parse_id};
use super::{AppState, Revoked};
use crate::{Event, HostEvent, RunEvent};

/// The SSE frame of one run event.
pub(crate) fn frame(ev: &Event) -> SseEvent {
    let data = serde_json::to_string(ev).unwrap_or_default();
    let f = SseEvent::default().data(data);
    match ev.event {
        RunEvent::TextDelta { .. } | RunEvent::Lagged { .. } | RunEvent::Error { .. } => f,
        _ => f.id(ev.seq.to_string()),
    }
}

/// A run's events, live or recorded.
#[utoipa::path(
    get, path = "/v1/runs/{id}/events", tag = "runs",
    params(
        ("id" = String, Path, description = "The run's id"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event's `seq`"),
    ),
    responses(
        (status = 200, description = "Server-Sent Events; `id:` is the event's `seq`", content_type = "text/event-stream", body = String),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, description = "Too many subscribers to this run", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn run_events(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Extension(Revoked(revoked)): Extension<Revoked>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    find(&st, &caller, &id).await?;
    let run_id = parse_id(&id)?;
    let from = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => 0,
        Some(Ok(s)) if s.trim().is_empty() => 0,
        Some(Ok(s)) => s
            .trim()
            .parse::<u32>()
            .map(|n| n.saturating_add(1))
            .map_err(|_| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_header",
                    "`Last-Event-ID` must be an event's `id` (a number)",
                )
            })?,
        Some(Err(_)) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_header",
                "`Last-Event-ID` must be an event's `id` (a number)",
            ))
        }
    };
    let slot = st.streams.join(run_id).ok_or_else(|| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_subscribers",
            format!("run `{id}` has as many event subscribers as the server allows"),
        )
        .retry_after(5)
    })?;
    let events = st
        .host
        .events(&run_id, from)
        .await
        .map_err(ApiError::store)?
        .ok_or_else(|| ApiError::run_not_found(&id))?;
    let s = events.map(move |ev| {
        // The slot is held as long as the stream is.
        let _ = &slot;
        Ok::<_, Infallible>(frame(&ev))
    });
    Ok(sse(until_revoked(s, revoked), st.config.keep_alive))
}

/// `s`, ending when `revoked` is cancelled.
pub(crate) fn until_revoked<S>(
    s: S,
    revoked: tokio_util::sync::CancellationToken,
) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream + Send + 'static,
{
    s.take_until(revoked.cancelled_owned())
}

pub(crate) fn sse<S>(s: S, every: std::time::Duration) -> Response
where
    S: Stream<Item = Result<SseEvent, Infallible>> + Send + 'static,
{
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(every).text("keep-alive"))
        .into_response()
}

/// The host-wide feed: runs started and ended, critic decisions.
#[utoipa::path(
    get, path = "/v1/events", tag = "runs",
    responses(
        (status = 200, description = "Server-Sent Events: `run.started`, `run.ended`, `critic.decision`, `lagged`", content_type = "text/event-stream", body = String),
        (status = 401, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn host_events(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Extension(Revoked(revoked)): Extension<Revoked>,
) -> Response {
    let feed = st.host.watch();
    let closed = st.closing.clone();
    let s = stream::unfold(
        (feed, closed, caller),
        |(mut feed, closed, caller)| async move {
            loop {
                let ev = tokio::select! {
                    ev = feed.next() => ev?,
                    _ = closed.cancelled() => return None,
                };
                let visible =
                    matches!(ev, HostEvent::Lagged { .. }) || caller.may_see(ev.caller_id());
                if visible {
                    let data = serde_json::to_string(&ev).unwrap_or_default();
                    return Some((
                        Ok::<_, Infallible>(SseEvent::default().data(data)),
                        (feed, closed, caller),
                    ));
                }
            }
        },
    );
    sse(until_revoked(s, revoked), st.config.keep_alive)
}
