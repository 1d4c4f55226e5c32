//! JSON bodies: read whole (within the body limit and read timeout), then
//! parsed; every failure is the API's error shape, with the field named.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body (`422 invalid_body` naming the field when it does not fit,
/// `413` past the size limit).
pub(crate) struct JsonBody<T>(pub(crate) T);

/// A JSON body that may be left out (an empty body is `None`).
pub(crate) struct OptionalJson<T>(pub(crate) Option<T>);

async fn bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the body is larger than the server takes (1 MiB)",
            )
        } else {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_unreadable",
                "the body could not be read in time",
            )
        }
    })
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

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let b = bytes(req, state).await?;
        if b.is_empty() {
            return Err(ApiError::invalid(
                "the body is empty; a JSON object is expected",
            ));
        }
        Ok(JsonBody(parse(&b)?))
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let b = bytes(req, state).await?;
        if b.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        Ok(OptionalJson(Some(parse(&b)?)))
    }
}
