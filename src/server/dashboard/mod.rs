//! `GET /`: the dashboard, a page served from inside the binary (plain
//! HTML, JavaScript and CSS, embedded at compile time: no CDN, no build
//! step). It reads the API like any client: the runs table from
//! `GET /v1/runs` and the host-wide feed `GET /v1/events`, a run's timeline
//! from its event stream, the schedules panel from `GET /v1/schedules`
//! (`serve --skills`; admin tokens), and posts the buttons' commands.

use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::AppState;

const INDEX: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("style.css");

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/",
            get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX) }),
        )
        .route(
            "/app.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    SCRIPT,
                )
                    .into_response()
            }),
        )
        .route(
            "/style.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }),
        )
}
