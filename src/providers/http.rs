//! What the HTTP providers share: the API key wrapper ([`Secret`]), the
//! client, the mapping from an HTTP answer to a typed [`ModelError`], and
//! the scrubbing that keeps secrets out of every error text.
//!
//! # Status → error
//!
//! | answer | error |
//! |---|---|
//! | 429, or 400/403 whose body speaks of quota, billing or credit | `Quota` when the body says so, else `RateLimited` (with `retry-after-ms` or `retry-after`) |
//! | 400/413/500, or an error in a stream, that says the request exceeds the model's context | `BadRequest` with the server's message |
//! | 408, 409, 5xx, 529 | `Server` |
//! | 401, 403 | `Auth` (no message: servers echo keys there) |
//! | other 4xx (400, 404, 413, 422 …) | `BadRequest` (a 404 names the URL called) |
//! | a body we cannot parse | `Malformed` |
//! | connect failure, reset, a body cut off | `Transport` |
//! | a 200 whose body is empty or ends before the answer is whole | `Incomplete` |
//!
//! # Secrets
//!
//! The key lives in a [`Secret`], whose `Debug` prints `[redacted]` and
//! which has no `Display`; it reaches the wire only as a header value
//! marked sensitive. No request header is ever formatted. Every text that
//! goes into an error — a server's message, a transport error's chain — is
//! capped and passed through [`scrub`], which replaces every known secret
//! (case-insensitively, see [`crate::secrets`]) with `[REDACTED]` and
//! anything shaped like an API key (`sk-…`, `Bearer …`) with `[redacted]`.
//! A URL in an error is an [`endpoint`]: no user info, no query.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::ports::model::ModelError;

/// Error texts are capped to this many bytes.
const MESSAGE_BYTES: usize = 300;

/// A non-streamed response body larger than this is refused as malformed.
pub(crate) const MAX_BODY: usize = 16 * 1024 * 1024;

/// The longest wait a `retry-after` header may ask for (a larger one is
/// taken as this).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// An API key. Never printed: `Debug` shows `[redacted]`, there is no
/// `Display`, and it is compared only to scrub it out of texts.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a key. An empty or blank key is no key (`None`). The key is
    /// registered as a secret ([`crate::secrets::register`]): wherever it
    /// comes back — in an answer, a tool result, an error — it is redacted
    /// (unless it is shorter than [`crate::secrets::MIN_SECRET_LEN`], a
    /// dummy key: then it is sent, never printed, and not redacted).
    pub fn new(key: impl Into<String>) -> Option<Secret> {
        let key = key.into();
        let trimmed = key.trim();
        if trimmed.is_empty() {
            None
        } else {
            crate::secrets::register(trimmed);
            Some(Secret(trimmed.to_string()))
        }
    }

    /// The key, for the one header that carries it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// When to ask for a streamed response (both HTTP providers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamMode {
    /// Stream when the request has a delta sink (someone listens).
    #[default]
    WhenListened,
    /// Always stream.
    Always,
    /// Never stream.
    Never,
}

/// A header value carrying a secret: marked sensitive, so HTTP layers that
/// print headers leave it out.
pub(crate) fn secret_header(value: &str) -> Result<reqwest::header::HeaderValue, ModelError> {
    let mut v = reqwest::header::HeaderValue::from_str(value)
        .map_err(|_| ModelError::BadRequest("the API key is not a valid header value".into()))?;
    v.set_sensitive(true);
    Ok(v)
}

/// The client both providers use: rustls, a connect timeout, no overall
/// timeout (the run's deadline and the critic bound a call).
pub(crate) fn client() -> reqwest::Client {
    let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
    let builder = match crate::base::tls::client_config() {
        Some(tls) => builder.tls_backend_preconfigured(tls),
        None => builder,
    };
    builder.build().unwrap_or_default()
}

/// Replaces the key and anything shaped like an API key with `[redacted]`,
/// then caps the text.
///
/// The call's key needs no handling of its own: it was registered when it
/// was wrapped ([`Secret::new`]), and a key too short to register is no
/// secret to redact (replacing every `o` of a dummy key `o` would turn
/// "Not Found" into "N[REDACTED]t F[REDACTED]und").
pub(crate) fn scrub(text: &str, _secret: Option<&Secret>) -> String {
    let s = crate::secrets::redact(text).into_owned();
    let mut out = String::with_capacity(s.len().min(MESSAGE_BYTES + 16));
    let mut redact_next = false;
    for (i, word) in s.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let bare = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_');
        let keyish = (bare.starts_with("sk-") || bare.starts_with("sk_")) && bare.len() > 8;
        if redact_next || keyish {
            out.push_str(&word.replace(bare, "[redacted]"));
        } else {
            out.push_str(word);
        }
        redact_next = word.eq_ignore_ascii_case("bearer");
        if out.len() > MESSAGE_BYTES * 4 {
            break;
        }
    }
    crate::ports::run::cap_text(out.trim(), MESSAGE_BYTES)
}

/// A transport error: the error's kind and its cause chain, never its URL
/// (which could carry credentials), scrubbed.
pub(crate) fn transport(e: reqwest::Error, secret: Option<&Secret>) -> ModelError {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    ModelError::Transport(scrub(&text, secret))
}

/// A URL as errors may show it: without user info and query (either may
/// carry credentials).
pub(crate) fn endpoint(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Err(_) => "the configured endpoint".to_string(),
    }
}

/// A request that could not be sent: a transport error that names the
/// endpoint (a DNS failure then says which host it could not find).
pub(crate) fn send_error(e: reqwest::Error, secret: Option<&Secret>, endpoint: &str) -> ModelError {
    match transport(e, secret) {
        ModelError::Transport(text) => ModelError::Transport(format!("POST {endpoint}: {text}")),
        other => other,
    }
}

/// The server's retry hint: `retry-after-ms` (milliseconds), else
/// `retry-after` (seconds); an HTTP date is ignored.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let v = headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()?;
        (v.is_finite() && v >= 0.0).then_some(v)
    };
    let d = if let Some(ms) = number("retry-after-ms") {
        Duration::from_secs_f64(ms.min(MAX_RETRY_AFTER.as_secs_f64() * 1000.0) / 1000.0)
    } else {
        Duration::from_secs_f64(number("retry-after")?.min(MAX_RETRY_AFTER.as_secs_f64()))
    };
    Some(d)
}

/// The message and type a JSON error body carries, in either provider's
/// shape (`{"error": {"message", "type", "code"}}` or `{"type": "error",
/// "error": {...}}`), else the raw text.
fn error_text(body: &[u8]) -> (String, String) {
    let raw = || String::from_utf8_lossy(body).into_owned();
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return (raw(), String::new());
    };
    let err = v.get("error").unwrap_or(&v);
    let message = match err {
        Value::String(s) => s.clone(),
        _ => err
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(raw),
    };
    let mut kind = String::new();
    for key in ["type", "code"] {
        if let Some(s) = err.get(key).and_then(Value::as_str) {
            kind.push_str(s);
            kind.push(' ');
        }
    }
    (message, kind)
}

/// Whether an error body says the account is out of quota or credit.
fn says_quota(message: &str, kind: &str) -> bool {
    let t = format!("{kind} {message}").to_ascii_lowercase();
    [
        "insufficient_quota",
        "quota",
        "billing",
        "credit balance",
        "exceeded your current",
    ]
    .iter()
    .any(|m| t.contains(m))
}

/// Whether an error says the request does not fit the model's context
/// (OpenAI's `context_length_exceeded`, llama.cpp's
/// `exceed_context_size_error`, llama-cpp-python's "exceed context
/// window"): the request's fault, never retried.
fn says_context_overflow(message: &str, kind: &str) -> bool {
    let t = format!("{kind} {message}").to_ascii_lowercase();
    [
        "context_length_exceeded",
        "exceed_context",
        "context size",
        "context length",
        "context window",
    ]
    .iter()
    .any(|m| t.contains(m))
}

/// How a context overflow's error begins.
const CONTEXT_OVERFLOW: &str = "the request does not fit the model's context";

/// The error for a request that does not fit the model's context: the
/// server's own message.
fn context_overflow(message: String) -> ModelError {
    ModelError::BadRequest(format!("{CONTEXT_OVERFLOW}; the server said: {message}"))
}

/// Whether `e` says the request does not fit the model's context (then
/// it refuses the request's size, not any of its options).
pub(crate) fn is_context_overflow(e: &ModelError) -> bool {
    matches!(e, ModelError::BadRequest(m) if m.starts_with(CONTEXT_OVERFLOW))
}

/// The typed error for a non-success HTTP answer (see the module doc).
/// `endpoint` (see [`endpoint`]) is named in a 404.
pub(crate) fn status_error(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    secret: Option<&Secret>,
    endpoint: &str,
) -> ModelError {
    let (message, kind) = error_text(body);
    let message = scrub(&message, secret);
    match status {
        404 => ModelError::BadRequest(format!(
            "404 Not Found from POST {endpoint}: {message} (is the base URL right? see `base_url`)"
        )),
        429 | 400 | 403 if says_quota(&message, &kind) => ModelError::Quota(message),
        400 | 413 | 500 if says_context_overflow(&message, &kind) => context_overflow(message),
        429 => ModelError::RateLimited {
            retry_after: retry_after(headers),
        },
        401 | 403 => ModelError::Auth,
        408 | 409 | 500..=599 => ModelError::Server { status, message },
        _ => ModelError::BadRequest(format!("{status}: {message}")),
    }
}

/// The typed error for an error object a server sent inside a stream (its
/// status is 200 by then): rate limits, overload and server errors by
/// their type, else a server error.
pub(crate) fn stream_error(data: &[u8], secret: Option<&Secret>) -> ModelError {
    let (message, kind) = error_text(data);
    let message = scrub(&message, secret);
    let k = kind.to_ascii_lowercase();
    if says_quota(&message, &kind) {
        ModelError::Quota(message)
    } else if says_context_overflow(&message, &kind) {
        context_overflow(message)
    } else if k.contains("rate_limit") {
        ModelError::RateLimited { retry_after: None }
    } else if k.contains("overloaded") {
        ModelError::Server {
            status: 529,
            message,
        }
    } else if k.contains("invalid_request") {
        ModelError::BadRequest(message)
    } else if k.contains("authentication") || k.contains("permission") {
        ModelError::Auth
    } else {
        ModelError::Server {
            status: 500,
            message,
        }
    }
}

/// Reads a whole body, refusing one larger than [`MAX_BODY`].
pub(crate) async fn read_body(
    resp: &mut reqwest::Response,
    secret: Option<&Secret>,
) -> Result<Vec<u8>, ModelError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(e, secret))? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(ModelError::Malformed(format!(
                "response body larger than {MAX_BODY} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A `Malformed` error for a body that did not parse: the parser's message
/// and the start of the body, scrubbed.
pub(crate) fn malformed(
    what: &str,
    err: &serde_json::Error,
    body: &[u8],
    secret: Option<&Secret>,
) -> ModelError {
    let head = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
    ModelError::Malformed(scrub(
        &format!("{what}: {err}; body starts: {head}"),
        secret,
    ))
}

/// The instruction that asks for structured output in the system prompt,
/// where the server takes no `response_format` (Anthropic; an
/// OpenAI-compatible server that refused it). The run validates the answer
/// either way.
pub(crate) fn schema_note(schema: &Value) -> String {
    format!(
        "Your final answer must be only a JSON value that follows this JSON Schema, with no other text:\n{schema}"
    )
}

/// A usage estimate for a call whose server reported none: about four
/// characters a token over the request (messages, attachments given as
/// text, tool schemas) and the reply (text and tool calls), marked
/// `estimated`. Tokenizer-free on purpose: it has to work for any model.
pub(crate) fn estimate_usage(
    request: &crate::ports::model::ChatRequest,
    response: &crate::ports::model::ChatResponse,
) -> crate::ports::run::Usage {
    let mut input_chars: usize = 0;
    for m in request.messages.iter() {
        input_chars += m.content.chars().count() + 4;
        for c in &m.tool_calls {
            input_chars += c.name.chars().count() + c.arguments.chars().count();
        }
        for a in &m.attachments {
            // An image costs what its pixels cost; its base64 length is a
            // poor guess either way, so it counts as a small text.
            input_chars += if a.is_image() {
                1024
            } else {
                a.content.chars().count()
            };
        }
    }
    for t in request.tools.iter() {
        input_chars += t.name.len() + t.description.len() + t.parameters.to_string().len();
    }
    let mut output_chars = response.text.chars().count();
    for c in &response.tool_calls {
        output_chars += c.name.chars().count() + c.arguments.chars().count();
    }
    crate::ports::run::Usage {
        input_tokens: input_chars.div_ceil(4) as u64,
        output_tokens: output_chars.div_ceil(4).max(1) as u64,
        estimated: true,
        ..Default::default()
    }
}

/// The last touches every HTTP provider gives a response: known secrets
/// redacted from the text and the tool-call arguments, and a usage
/// estimate (with a `usage_estimated` warning to the observer) when the
/// server reported none.
pub(crate) fn finish_response(
    request: &crate::ports::model::ChatRequest,
    mut response: crate::ports::model::ChatResponse,
) -> crate::ports::model::ChatResponse {
    if crate::secrets::any() {
        response.text = crate::secrets::redact_string(std::mem::take(&mut response.text));
        for call in &mut response.tool_calls {
            if let std::borrow::Cow::Owned(clean) = crate::secrets::redact(&call.arguments) {
                call.arguments = clean.into();
            }
        }
    }
    if response.usage.total() == 0 {
        response.usage = estimate_usage(request, &response);
        if let Some(o) = &request.observer {
            o.warning(
                "usage_estimated",
                "the server reported no token usage: usage is estimated (about four characters a token over the request and the reply) and counts toward budgets and cost",
            );
        }
    }
    response
}

/// Hands streamed (or whole) answer text to the request's listener and
/// observer; whether anyone got it.
pub(crate) fn deliver(request: &crate::ports::model::ChatRequest, text: &str) -> bool {
    if text.is_empty() {
        return false;
    }
    let mut delivered = false;
    if let Some(sink) = &request.on_delta {
        sink(text);
        delivered = true;
    }
    if let Some(o) = &request.observer {
        o.text(text);
        delivered = true;
    }
    delivered
}

/// Base URL without a trailing slash.
pub(crate) fn trim_base(url: &str) -> String {
    url.trim().trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tls_is_rustls_on_ring_with_the_webpki_roots() {
        let tls = crate::base::tls::client_config().unwrap();
        assert_eq!(tls.alpn_protocols, [b"http/1.1".to_vec()]);
        // The client builds on it (no process-wide provider installed).
        assert!(rustls::crypto::CryptoProvider::get_default().is_none());
        let _ = client();
    }

    #[test]
    fn statuses_map_to_typed_errors() {
        let h = HeaderMap::new();
        let e = |s: u16, b: &str| status_error(s, &h, b.as_bytes(), None, "http://h/v1/x");
        assert_eq!(e(429, "{}").kind(), "rate_limited");
        assert_eq!(
            e(429, r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}"#).kind(),
            "quota"
        );
        assert_eq!(e(400, r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low"}}"#).kind(), "quota");
        for s in [408, 409, 500, 502, 503, 529] {
            assert_eq!(e(s, "oops").kind(), "server_error", "{s}");
        }
        for s in [400, 404, 413, 422] {
            assert_eq!(e(s, "no").kind(), "bad_request", "{s}");
        }
        assert_eq!(e(401, "key sk-abc").kind(), "auth");
        assert_eq!(e(403, "forbidden").kind(), "auth");
    }

    #[test]
    fn retry_after_reads_both_headers() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert("retry-after-ms", "1500".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
        let mut d = HeaderMap::new();
        d.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&d), None);
        d.insert("retry-after", "99999".parse().unwrap());
        assert_eq!(retry_after(&d), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn scrub_removes_keys_and_key_shapes() {
        let key = Secret::new("canary-123456").unwrap();
        let s = scrub(
            "Incorrect API key provided: canary-123456, also sk-proj-abcdefghijkl and Bearer xyz.",
            Some(&key),
        );
        assert!(
            !s.contains("canary-123456") && !s.contains("sk-proj") && !s.contains("xyz"),
            "{s}"
        );
        assert!(s.contains("Incorrect API key"));
        assert_eq!(format!("{key:?}"), "Secret([redacted])");
        assert!(Secret::new("  ").is_none());
        assert!(scrub(&"x".repeat(5000), None).len() < 400);
    }

    #[test]
    fn a_dummy_key_shorter_than_8_characters_mangles_nothing() {
        for dummy in ["o", "N", "sk-1234"] {
            let key = Secret::new(dummy).unwrap();
            let h = HeaderMap::new();
            let e = status_error(
                404,
                &h,
                br#"{"error":"Not Found"}"#,
                Some(&key),
                "http://h/v1/x",
            );
            assert_eq!(
                e.to_string(),
                "bad request: 404 Not Found from POST http://h/v1/x: Not Found (is the base URL right? see `base_url`)",
                "{dummy}"
            );
            assert_eq!(
                scrub("Not Found, sk-1234 or o", Some(&key)),
                "Not Found, sk-1234 or o"
            );
        }
    }
}
