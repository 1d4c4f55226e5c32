//! A schedule's `env`: the `<env>` system message its run is given, and
//! the secrets it names.
//!
//! Keys come sorted, one `K=V` line each. A `{ secret: NAME }` value is
//! read from `AGENTVISOR_SECRET_<NAME>` (NAME upper-cased), the family of
//! variables MCP servers' secrets come from; the message shows it as
//! `K=[secret]`: the value never reaches the model. It is registered with
//! [`crate::secrets`], so it is redacted from whatever a run stores,
//! streams or prints should it appear there anyway; no error names more
//! than the variable.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// The prefix of the variable that holds secret `NAME` (the MCP servers'
/// as well).
pub const SECRET_PREFIX: &str = "AGENTVISOR_SECRET_";

/// What the `<env>` message shows for a secret.
pub const SECRET_SHOWN: &str = "[secret]";

/// A value of `env:`: text (a YAML string, number or boolean, as written)
/// or a secret by reference.
#[derive(Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum EnvValue {
    /// Literal text: it is in the repository, so it is no secret.
    Text(String),
    /// `{ secret: NAME }`: read from `AGENTVISOR_SECRET_<NAME>` when the
    /// run starts.
    Secret {
        /// The secret's name.
        secret: String,
    },
}

impl std::fmt::Debug for EnvValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvValue::Text(t) => write!(f, "{t:?}"),
            EnvValue::Secret { secret } => write!(f, "{{secret: {secret}}}"),
        }
    }
}

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Secret {
            secret: String,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
            Float(f64),
            Bool(bool),
            Secret(Secret),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "an `env` value is text, a number, true/false, or `{ secret: NAME }`",
            )
        })? {
            Raw::Text(t) => Ok(EnvValue::Text(t)),
            Raw::Int(i) => Ok(EnvValue::Text(i.to_string())),
            Raw::Float(x) => Ok(EnvValue::Text(x.to_string())),
            Raw::Bool(b) => Ok(EnvValue::Text(b.to_string())),
            Raw::Secret(s) => Ok(EnvValue::Secret { secret: s.secret }),
        }
    }
}

/// A secret the environment does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("env `{key}`: secret `{secret}` is not set: set the variable {variable}")]
pub struct MissingSecret {
    /// The `env` key.
    pub key: String,
    /// The secret's name.
    pub secret: String,
    /// The variable that should hold it.
    pub variable: String,
}

/// A resolved `env`: the message the model sees and the secret values
/// (kept out of `Debug`).
#[derive(Clone, Default)]
pub struct ResolvedEnv {
    /// The `<env>` system message's text; empty when `env` is.
    pub message: String,
    /// The values of the secrets it named, by key.
    pub secrets: BTreeMap<String, String>,
}

impl std::fmt::Debug for ResolvedEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.secrets.keys().map(String::as_str).collect();
        f.debug_struct("ResolvedEnv")
            .field("message", &self.message)
            .field("secrets", &keys)
            .finish()
    }
}

/// The variable that holds secret `name`.
pub fn secret_variable(name: &str) -> String {
    format!("{SECRET_PREFIX}{}", name.to_ascii_uppercase())
}

/// Whether `name` can name a secret (A-Z, a-z, 0-9, `_`).
pub(super) fn is_secret_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Resolves `env`, reading secrets through `lookup` (`std::env::var`
/// outside tests); each secret found is registered for redaction.
pub fn resolve_env(
    env: &BTreeMap<String, EnvValue>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<ResolvedEnv, MissingSecret> {
    let mut out = ResolvedEnv::default();
    if env.is_empty() {
        return Ok(out);
    }
    let mut lines = String::from("<env>\n");
    for (key, value) in env {
        let shown = match value {
            EnvValue::Text(t) => t.as_str(),
            EnvValue::Secret { secret } => {
                let variable = secret_variable(secret);
                let Some(v) = lookup(&variable) else {
                    return Err(MissingSecret {
                        key: key.clone(),
                        secret: secret.clone(),
                        variable,
                    });
                };
                crate::secrets::register_from(&variable, &v);
                out.secrets.insert(key.clone(), v);
                SECRET_SHOWN
            }
        };
        lines.push_str(key);
        lines.push('=');
        // One line a key: a value's line breaks are shown escaped.
        lines.push_str(&shown.replace('\n', "\\n"));
        lines.push('\n');
    }
    lines.push_str("</env>");
    out.message = lines;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn env(yaml: &str) -> BTreeMap<String, EnvValue> {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn keys_are_sorted_and_secrets_shown_as_such() {
        let e = env("{ZED: last, API: {secret: api_token}, PORT: 8080, ON: true}");
        let r = resolve_env(&e, |v| {
            (v == "AGENTVISOR_SECRET_API_TOKEN").then(|| "tok-abcdefgh-1".to_string())
        })
        .unwrap();
        assert_eq!(
            r.message,
            "<env>\nAPI=[secret]\nON=true\nPORT=8080\nZED=last\n</env>"
        );
        assert_eq!(
            r.secrets.get("API").map(String::as_str),
            Some("tok-abcdefgh-1")
        );
        assert!(!format!("{r:?}").contains("tok-abcdefgh-1"));
    }

    #[test]
    fn a_missing_secret_names_its_variable() {
        let e = env("{API: {secret: nope}}");
        let err = resolve_env(&e, |_| None).unwrap_err().to_string();
        assert!(
            err.contains("AGENTVISOR_SECRET_NOPE") && err.contains("API"),
            "{err}"
        );
    }

    #[test]
    fn no_env_no_message() {
        let r = resolve_env(&BTreeMap::new(), |_| None).unwrap();
        assert!(r.message.is_empty());
    }

    #[test]
    fn odd_values_are_refused() {
        let bad: Result<BTreeMap<String, EnvValue>, _> =
            serde_norway::from_str("{A: {secrett: X}}");
        assert!(bad.is_err());
        let list: Result<BTreeMap<String, EnvValue>, _> = serde_norway::from_str("{A: [1]}");
        assert!(list.is_err());
    }
}
