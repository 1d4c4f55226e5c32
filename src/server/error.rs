//! The API's one error shape, `{"error": {"kind", "message"}}`, and the
//! status code each kind answers with.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// What went wrong, as the client reads it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// A stable snake_case `kind` and a message for people.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable snake_case kind: `unauthorized`, `not_found`, `unknown_agent`,
    /// `invalid_body`, `payload_too_large`, `rate_limited`, `too_many_subscribers`,
    /// `caller_concurrency`, `budget_exceeded`, `forbidden`, `run_finished`,
    /// `not_awaiting_approval`, `unknown_call`, `session_busy`,
    /// `session_closed`, `session_exists`, `shutting_down`,
    /// `store_unavailable`, …
    pub kind: String,
    /// What happened (never a secret).
    pub message: String,
    /// The run the error is about, when one was made (a refused submission).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// An error answer: status, kind, message, and for 429/503 how long to
/// wait before trying again.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable kind.
    pub kind: &'static str,
    /// The message.
    pub message: String,
    /// `retry-after`, in seconds.
    pub retry_after: Option<u64>,
    /// The run, for a refused submission.
    pub run_id: Option<String>,
}

impl ApiError {
    /// An error with `status` and `kind`.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after: None,
            run_id: None,
        }
    }

    /// 404: no such run, or not the caller's (the same answer, so ids leak
    /// nothing).
    pub fn run_not_found(id: &str) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no run `{id}`"))
    }

    /// 401.
    pub fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required (Authorization: Bearer TOKEN)",
        )
    }

    /// 422 naming what is wrong with the body.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", message)
    }

    /// 503 while the server drains.
    pub fn shutting_down() -> Self {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        );
        e.retry_after = Some(5);
        e
    }

    /// 500 when the run store cannot be read.
    pub fn store(e: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("the run store cannot be read: {e}"),
        )
    }

    /// Sets `retry-after`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs.max(1));
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind.to_string(),
                message: self.message,
                run_id: self.run_id,
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
