//! The HTTP destinations: `webhook` (a JSON POST with the intent's
//! idempotency key as `Idempotency-Key`), `slack` and `discord` (their
//! incoming-webhook shapes, `{"text"}` and `{"content"}`), and
//! `github-issue` (the REST API: an issue per run, `close_older` closes
//! the schedule's earlier open ones).
//!
//! Status: 2xx delivered; 408, 429 and 5xx worth another try; any other
//! answer a failure for good. Errors name the target as shown (scheme and
//! host), never its path, query or headers.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use super::{shown_url, Destinations};
use crate::ports::outbox::{Delivered, PublishError, PublishIntent};

/// Discord refuses a message longer than this many characters.
const DISCORD_MAX: usize = 2000;

/// The default GitHub API.
const GITHUB_API: &str = "https://api.github.com";

/// The client: rustls on ring with the webpki roots (as the providers'),
/// a connect timeout; the publisher actor bounds each try.
pub(super) fn client() -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("agentvisor/", env!("CARGO_PKG_VERSION")));
    let builder = match crate::base::tls::client_config() {
        Some(tls) => builder.tls_backend_preconfigured(tls),
        None => builder,
    };
    builder.build().unwrap_or_default()
}

/// A transport error, without its URL.
fn transport(shown: &str, e: reqwest::Error) -> PublishError {
    let e = e.without_url();
    PublishError::Transient(crate::secrets::redact_string(format!("{shown}: {e}")))
}

/// A header value that may hold a secret: marked sensitive.
fn header_value(v: &str, key: &str) -> Result<HeaderValue, PublishError> {
    let mut h = HeaderValue::from_str(v).map_err(|_| {
        PublishError::Permanent(format!("header `{key}`: not a valid header value"))
    })?;
    h.set_sensitive(true);
    Ok(h)
}

/// The error of an answer that is not 2xx: its status, and the
/// `message` an API such as GitHub's gives (capped, redacted). Not the
/// body as such: a receiver may echo the request, token and all.
fn status_error(shown: &str, status: reqwest::StatusCode, body: &str) -> PublishError {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .map(|m| {
            let m: String = m.chars().take(160).collect();
            crate::secrets::redact_string(m)
        });
    let text = match message {
        Some(m) if !m.trim().is_empty() => format!("{shown} answered {status}: {}", m.trim()),
        _ => format!("{shown} answered {status}"),
    };
    if status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error() {
        PublishError::Transient(text)
    } else {
        PublishError::Permanent(text)
    }
}

impl Destinations {
    /// `webhook`, `slack`, `discord`: one JSON POST.
    pub(super) async fn post(&self, intent: &PublishIntent) -> Result<Delivered, PublishError> {
        let url = self.needed(intent, "url")?;
        let shown = shown_url(&url);
        let body = match intent.kind.as_str() {
            "slack" => json!({ "text": intent.body }),
            "discord" => json!({ "content": cut(&intent.body, DISCORD_MAX) }),
            _ => json!({
                "run_id": intent.run_id.to_string(),
                "schedule": intent.schedule,
                "skill": intent.skill,
                "destination": intent.name,
                "text": intent.body,
            }),
        };
        let mut req = self.http.post(&url).json(&body);
        if intent.kind == "webhook" {
            req = req.header("Idempotency-Key", intent.key.as_str());
            if let Some(Value::Object(headers)) = intent.target.get("headers") {
                for (k, v) in headers {
                    let value = super::resolve(&self.lookup, Some(v), &format!("headers.{k}"))?
                        .unwrap_or_default();
                    let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                        PublishError::Permanent(format!("header `{k}`: not a valid header name"))
                    })?;
                    req = req.header(name, header_value(&value, k)?);
                }
            }
        }
        let resp = req.send().await.map_err(|e| transport(&shown, e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(Delivered::default());
        }
        let text = resp.text().await.unwrap_or_default();
        Err(status_error(&shown, status, &text))
    }

    /// `github-issue`: opens an issue (unless one with this intent's key is
    /// open already: a delivery tried again after a crash), then with
    /// `close_older` closes the schedule's earlier open issues.
    pub(super) async fn github_issue(
        &self,
        intent: &PublishIntent,
    ) -> Result<Delivered, PublishError> {
        let repo = self.needed(intent, "repo")?;
        let token = self.needed(intent, "token")?;
        let base = self
            .value(intent, "base_url")?
            .unwrap_or_else(|| GITHUB_API.to_string());
        let base = base.trim_end_matches('/').to_string();
        let shown = format!("{} {repo}", shown_url(&base));
        let title = self
            .value(intent, "title")?
            .unwrap_or_else(|| format!("{}: {}", intent.schedule, intent.skill));
        let labels: Vec<String> = intent
            .target
            .get("labels")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let close_older = intent
            .target
            .get("close_older")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mark = format!("<!-- agentvisor schedule={} -->", intent.schedule);
        let key_mark = format!("<!-- agentvisor key={} -->", intent.key);
        let auth = header_value(&format!("Bearer {token}"), "Authorization")?;
        let get = |url: String| {
            self.http
                .get(url)
                .header("Authorization", auth.clone())
                .header("Accept", "application/vnd.github+json")
        };
        // The schedule's open issues (the first 100).
        let list_url = format!("{base}/repos/{repo}/issues?state=open&per_page=100");
        let resp = get(list_url)
            .send()
            .await
            .map_err(|e| transport(&shown, e))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(status_error(&shown, status, &text));
        }
        let open: Vec<Value> = serde_json::from_str(&text).unwrap_or_default();
        let body_of = |i: &Value| {
            i.get("body")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let number_of = |i: &Value| i.get("number").and_then(Value::as_u64);
        let mine: Vec<&Value> = open.iter().filter(|i| body_of(i).contains(&mark)).collect();
        let number = match mine.iter().find(|i| body_of(i).contains(&key_mark)) {
            Some(existing) => number_of(existing),
            None => {
                let body = format!("{}\n\n{mark}\n{key_mark}", intent.body);
                let resp = self
                    .http
                    .post(format!("{base}/repos/{repo}/issues"))
                    .header("Authorization", auth.clone())
                    .header("Accept", "application/vnd.github+json")
                    .json(&json!({ "title": title, "body": body, "labels": labels }))
                    .send()
                    .await
                    .map_err(|e| transport(&shown, e))?;
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                if !status.is_success() {
                    return Err(status_error(&shown, status, &text));
                }
                serde_json::from_str::<Value>(&text)
                    .ok()
                    .as_ref()
                    .and_then(number_of)
            }
        };
        let mut closed = Vec::new();
        if close_older {
            for older in mine.iter().filter_map(|i| number_of(i)) {
                if Some(older) == number {
                    continue;
                }
                let resp = self
                    .http
                    .patch(format!("{base}/repos/{repo}/issues/{older}"))
                    .header("Authorization", auth.clone())
                    .header("Accept", "application/vnd.github+json")
                    .json(&json!({ "state": "closed" }))
                    .send()
                    .await
                    .map_err(|e| transport(&shown, e))?;
                let status = resp.status();
                if !status.is_success() {
                    let text = resp.text().await.unwrap_or_default();
                    return Err(status_error(&shown, status, &text));
                }
                closed.push(format!("#{older}"));
            }
        }
        let mut detail = match number {
            Some(n) => format!("issue #{n}"),
            None => "issue opened".to_string(),
        };
        if !closed.is_empty() {
            detail.push_str(&format!(" (closed {})", closed.join(", ")));
        }
        Ok(Delivered {
            detail: Some(detail),
        })
    }
}

/// At most `max` characters of `text`.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => text[..at].to_string(),
        None => text.to_string(),
    }
}
