//! A stdio server's environment and an HTTP server's headers, resolved
//! when the server starts.
//!
//! A child gets an allowlisted environment: [`INHERITED`] from the host
//! when set there, then what its manifest entry names — never the host's
//! whole environment, so no credential of the host's leaks into a server
//! by accident. A secret comes only by explicit reference (`{ secret: NAME }`
//! reads `AGENTVISOR_SECRET_NAME`); its value is registered with
//! [`crate::secrets`] (redacted everywhere from then on) and returned in
//! the resolved secrets list so the caller can scrub it from whatever the server
//! writes back (its stderr tail), and no error names more than its name.

use super::McpError;
use crate::spec::mcp::{McpServerSpec, McpValue};

/// The host variables every stdio server gets (when the host has them).
pub const INHERITED: &[&str] = &["PATH", "HOME", "LANG", "TZ"];

/// The prefix of the variable that holds secret `NAME`.
pub const SECRET_PREFIX: &str = "AGENTVISOR_SECRET_";

/// Resolved name/value pairs, and the secret values among them.
#[derive(Default)]
pub(crate) struct Resolved {
    pub(crate) pairs: Vec<(String, String)>,
    pub(crate) secrets: Vec<String>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.pairs.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Resolved").field("names", &names).finish()
    }
}

/// The environment of stdio server `spec`, read from `host` (a lookup of
/// the host's variables: `std::env::var` outside tests).
pub(crate) fn child_env(
    spec: &McpServerSpec,
    host: impl Fn(&str) -> Option<String>,
) -> Result<Resolved, McpError> {
    let mut out = Resolved::default();
    for key in INHERITED {
        if spec.env.contains_key(*key) {
            continue;
        }
        if let Some(v) = host(key) {
            out.pairs.push(((*key).to_string(), v));
        }
    }
    resolve_into(spec, &spec.env, &host, &mut out)?;
    Ok(out)
}

/// The extra headers of HTTP server `spec`.
pub(crate) fn headers(
    spec: &McpServerSpec,
    host: impl Fn(&str) -> Option<String>,
) -> Result<Resolved, McpError> {
    let mut out = Resolved::default();
    resolve_into(spec, &spec.headers, &host, &mut out)?;
    Ok(out)
}

fn resolve_into(
    spec: &McpServerSpec,
    values: &std::collections::BTreeMap<String, McpValue>,
    host: &impl Fn(&str) -> Option<String>,
    out: &mut Resolved,
) -> Result<(), McpError> {
    for (key, value) in values {
        let v = match value {
            McpValue::Text(t) => t.clone(),
            McpValue::Secret { secret } => {
                let var = format!("{SECRET_PREFIX}{secret}");
                match host(&var) {
                    Some(v) => {
                        if !v.is_empty() {
                            // Redacted process-wide from here on: tool
                            // results, errors, events, log lines.
                            crate::secrets::register(&v);
                            out.secrets.push(v.clone());
                        }
                        v
                    }
                    None => {
                        return Err(McpError::EnvResolve {
                            server: spec.name.clone(),
                            key: key.clone(),
                            secret: secret.clone(),
                            variable: var,
                        })
                    }
                }
            }
        };
        out.pairs.push((key.clone(), v));
    }
    Ok(())
}

/// `text` with every secret value replaced by `[redacted]` (those given,
/// whatever their length, and every secret the process knows).
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = crate::secrets::redact(text).into_owned();
    for s in secrets {
        if !s.is_empty() && out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "[redacted]");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(yaml: &str) -> McpServerSpec {
        match serde_norway::from_str(yaml) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    fn host(key: &str) -> Option<String> {
        match key {
            "PATH" => Some("/bin".into()),
            "HOME" => Some("/home/x".into()),
            "AWS_SECRET_ACCESS_KEY" => Some("leak".into()),
            "AGENTVISOR_SECRET_TOKEN" => Some("s3cret".into()),
            _ => None,
        }
    }

    #[test]
    fn only_the_allowlist_and_the_manifest_reach_the_child() {
        let s = server("{name: a, command: [x], env: {TZ: UTC, KEY: {secret: TOKEN}}}");
        let Ok(r) = child_env(&s, host) else {
            panic!("resolve failed")
        };
        let mut pairs = r.pairs.clone();
        pairs.sort();
        let want = [
            ("HOME", "/home/x"),
            ("KEY", "s3cret"),
            ("PATH", "/bin"),
            ("TZ", "UTC"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(pairs, want);
        assert_eq!(r.secrets, ["s3cret"]);
        assert!(!format!("{r:?}").contains("s3cret"));
    }

    #[test]
    fn a_missing_secret_is_a_clear_error_without_values() {
        let s = server("{name: web, url: 'http://x', headers: {Authorization: {secret: NOPE}}}");
        let err = headers(&s, host).map(|_| ());
        let Err(e) = err else { panic!("resolved") };
        assert_eq!(e.kind(), "mcp_env_resolve");
        let text = e.to_string();
        assert!(
            text.contains("AGENTVISOR_SECRET_NOPE") && text.contains("web"),
            "{text}"
        );
    }

    #[test]
    fn scrub_hides_secret_values() {
        assert_eq!(
            scrub("token=s3cret ok", &["s3cret".into()]),
            "token=[redacted] ok"
        );
    }
}
