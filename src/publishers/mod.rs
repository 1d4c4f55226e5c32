//! Publisher batteries: implementations of the [`Publisher`] port that
//! deliver a scheduled skill's publish intents to their destinations —
//! `stdout`, `file`, and (the `publishers` feature) `webhook`, `slack`,
//! `discord`, `github-issue` over HTTP and `email` over SMTP.
//!
//! One call is one try: retries, backoff and the timeout are the
//! publisher actor's. An error says whether another try could help
//! ([`PublishError::Transient`]) and is redacted here: it names the
//! target as [`PublishIntent::shown`] does, never a URL's path or query
//! (where tokens live), a header's value or a secret.
//!
//! Secrets: an intent's target holds `{ secret: NAME }` references, read
//! at delivery from `AGENTVISOR_SECRET_<NAME>` (through the lookup the
//! battery is built with) and registered for redaction; a missing one
//! fails the delivery for good, naming the variable.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::ports::outbox::{Delivered, PublishError, PublishIntent, Publisher};

#[cfg(feature = "publishers")]
mod email;
#[cfg(feature = "publishers")]
mod http;

/// Reads a variable (`std::env::var` outside tests).
pub type Lookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Where text of the `stdout` destination goes.
pub type StdoutSink = Arc<dyn Fn(&str) + Send + Sync>;

/// The built-in destinations, by kind.
pub struct Destinations {
    lookup: Lookup,
    stdout: StdoutSink,
    #[cfg(feature = "publishers")]
    http: reqwest::Client,
}

impl Destinations {
    /// Reads secrets from the process's environment; `stdout` prints to
    /// the process's standard output.
    pub fn from_env() -> Self {
        Self::new(
            Arc::new(|k: &str| std::env::var(k).ok()),
            Arc::new(|text: &str| {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{text}");
            }),
        )
    }

    /// Reads secrets through `lookup`; `stdout` text goes to `stdout`.
    pub fn new(lookup: Lookup, stdout: StdoutSink) -> Self {
        Destinations {
            lookup,
            stdout,
            #[cfg(feature = "publishers")]
            http: http::client(),
        }
    }

    /// A key of the target: text as written, or a secret's value.
    pub(crate) fn value(
        &self,
        intent: &PublishIntent,
        key: &str,
    ) -> Result<Option<String>, PublishError> {
        resolve(&self.lookup, intent.target.get(key), key)
    }

    /// A key the destination needs.
    pub(crate) fn needed(&self, intent: &PublishIntent, key: &str) -> Result<String, PublishError> {
        self.value(intent, key)?.ok_or_else(|| {
            PublishError::Permanent(format!("the `{}` destination has no `{key}`", intent.kind))
        })
    }
}

/// Reads a target value: a string, or `{ "secret": NAME }` from
/// `AGENTVISOR_SECRET_<NAME>` (registered for redaction).
pub(crate) fn resolve(
    lookup: &Lookup,
    v: Option<&Value>,
    key: &str,
) -> Result<Option<String>, PublishError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("secret").and_then(Value::as_str) {
            Some(name) => {
                // As `crate::skills::secret_variable` names it.
                let var = format!("AGENTVISOR_SECRET_{}", name.to_ascii_uppercase());
                match lookup(&var) {
                    Some(v) => {
                        crate::secrets::register_from(&var, &v);
                        Ok(Some(v))
                    }
                    None => Err(PublishError::Permanent(format!(
                        "`{key}`: secret `{name}` is not set: set the variable {var}"
                    ))),
                }
            }
            None => Err(PublishError::Permanent(format!(
                "`{key}` is neither text nor a secret reference"
            ))),
        },
        Some(other) => Ok(Some(other.to_string())),
    }
}

/// A URL as people may see it: its scheme and host, the rest (where
/// tokens live) left out: `https://hooks.slack.com/…`.
pub fn shown_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (s, r),
        None => return "[url]".into(),
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    // Credentials in the authority (`user:pass@host`) stay out too.
    let host = host.rsplit('@').next().unwrap_or(host);
    let more = rest.len() > host.len();
    format!("{scheme}://{host}{}", if more { "/…" } else { "" })
}

#[async_trait]
impl Publisher for Destinations {
    async fn deliver(&self, intent: &PublishIntent) -> Result<Delivered, PublishError> {
        match intent.kind.as_str() {
            "stdout" => {
                (self.stdout)(&intent.body);
                Ok(Delivered::default())
            }
            "file" => self.file(intent).await,
            #[cfg(feature = "publishers")]
            "webhook" | "slack" | "discord" => self.post(intent).await,
            #[cfg(feature = "publishers")]
            "github-issue" => self.github_issue(intent).await,
            #[cfg(feature = "publishers")]
            "email" => self.email(intent).await,
            other => Err(PublishError::Permanent(format!(
                "this build cannot deliver to a `{other}` destination (it needs the `publishers` feature)"
            ))),
        }
    }
}

impl Destinations {
    /// Writes the body to the file (replacing it; folders made as
    /// needed). The path was made absolute when the intent was.
    async fn file(&self, intent: &PublishIntent) -> Result<Delivered, PublishError> {
        let path = PathBuf::from(self.needed(intent, "path")?);
        let body = intent.body.clone();
        let shown = path.display().to_string();
        let written = tokio::task::spawn_blocking(move || {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            // Whole or not at all: a reader never sees half a body.
            let tmp = path.with_extension("agentvisor-tmp");
            std::fs::write(&tmp, body.as_bytes())?;
            std::fs::rename(&tmp, &path)
        })
        .await
        .map_err(|e| PublishError::Transient(format!("writing {shown}: {e}")))?;
        match written {
            Ok(()) => Ok(Delivered {
                detail: Some(shown),
            }),
            Err(e) => Err(PublishError::Transient(format!("writing {shown}: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_path_or_credentials() {
        assert_eq!(
            shown_url("https://hooks.slack.com/services/T0/B0/secret"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            shown_url("http://u:p@127.0.0.1:80?t=1"),
            "http://127.0.0.1:80/…"
        );
        assert_eq!(shown_url("http://example.com"), "http://example.com");
        assert_eq!(shown_url("not a url"), "[url]");
    }
}
