//! JSON bodies: read whole (within the body limit and `body_timeout`),
//! then parsed; every failure is the API's error shape, with the field
//! named. And [`JsonAnswer`], the JSON answer of the busiest routes.
//!
//! The read timeout covers the whole body and is armed only when the body
//! is not all there at once: a small request's body arrives with its
//! headers, and a timer per request would cost more than the read.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::AppState;

/// A JSON answer serialized into one buffer sized for a run's view (axum's
/// `Json` writes through `BytesMut` in many small writes, which cost a
/// served W1 run about a tenth of its server time).
pub(crate) struct JsonAnswer<T>(pub(crate) T);

impl<T: serde::Serialize> axum::response::IntoResponse for JsonAnswer<T> {
    fn into_response(self) -> axum::response::Response {
        let mut buf = Vec::with_capacity(1024);
        match serde_json::to_writer(&mut buf, &self.0) {
            Ok(()) => (
                [(
                    axum::http::header::CONTENT_TYPE,
                    axum::http::HeaderValue::from_static("application/json"),
                )],
                buf,
            )
                .into_response(),
            Err(e) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("the answer could not be encoded: {e}"),
            )
            .into_response(),
        }
    }
}

/// A JSON body (`422 invalid_body` naming the field when it does not fit,
/// `413` past the size limit).
pub(crate) struct JsonBody<T>(pub(crate) T);

/// A JSON body that may be left out (an empty body is `None`).
pub(crate) struct OptionalJson<T>(pub(crate) Option<T>);

async fn bytes(req: Request, st: &Arc<AppState>) -> Result<Bytes, ApiError> {
    let read = Bytes::from_request(req, st);
    let mut read = std::pin::pin!(read);
    let first = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
    let got = match first {
        Poll::Ready(got) => got,
        Poll::Pending => match tokio::time::timeout(st.config.body_timeout, read).await {
            Ok(got) => got,
            Err(_) => return Err(unreadable()),
        },
    };
    got.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the body is larger than the server takes (1 MiB)",
            )
        } else {
            unreadable()
        }
    })
}

fn unreadable() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_unreadable",
        "the body could not be read in time",
    )
}

fn parse<T: DeserializeOwned>(b: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(b);
    serde_path_to_error_free(de)
}

/// Parses with serde_json's own messages, which name the field
/// (`missing field `agent``, `unknown field `x``, `invalid type … at line 1`).
fn serde_path_to_error_free<T: DeserializeOwned>(
    de: &mut serde_json::Deserializer<serde_json::de::SliceRead<'_>>,
) -> Result<T, ApiError> {
    let v = T::deserialize(&mut *de).map_err(|e| ApiError::invalid(e.to_string()))?;
    de.end().map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(v)
}

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let b = bytes(req, state).await?;
        if b.is_empty() {
            return Err(ApiError::invalid(
                "the body is empty; a JSON object is expected",
            ));
        }
        Ok(JsonBody(parse(&b)?))
    }
}

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let b = bytes(req, state).await?;
        if b.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        Ok(OptionalJson(Some(parse(&b)?)))
    }
}
