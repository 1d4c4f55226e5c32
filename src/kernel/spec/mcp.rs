//! The manifest's `mcp:` key: which MCP servers an agent's runs get tools
//! from, how each is reached (a command run over stdio, or a streamable
//! HTTP URL), with what environment and headers, shared how (`scope`), and
//! which of its tools the model sees (`allow`).
//!
//! These are plain data, parsed with the rest of the manifest whatever the
//! build's features; only a build with the `mcp` feature can start servers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The longest server name: room is left for `__` and the tool's own name
/// within the 64 characters providers allow.
pub const MAX_SERVER_NAME: usize = 32;

/// `mcp:` in a manifest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSpec {
    /// The servers, in the order their tools are shown to the model.
    #[serde(default)]
    pub servers: Vec<McpServerSpec>,
}

/// One MCP server.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// The prefix of its tools' names (`<name>__<tool>`): 1-32 characters
    /// of `[A-Za-z0-9-]` (no `_`, so the `__` separator stays unambiguous).
    pub name: String,
    /// A stdio server: the program and its arguments (no shell).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// A streamable HTTP server: its endpoint (`http://127.0.0.1:3001/mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Extra environment of a stdio server (over the allowlisted `PATH`,
    /// `HOME`, `LANG`, `TZ`; nothing else of the host's is passed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, McpValue>,
    /// Extra headers of an HTTP server's requests.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, McpValue>,
    /// Shared by the host's runs (default), or one server per run.
    #[serde(default, skip_serializing_if = "McpScope::is_host")]
    pub scope: McpScope,
    /// Only these of the server's tools (by the server's own names); all
    /// when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
}

/// A value of `env:` or `headers:`: literal text, or a secret by reference.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum McpValue {
    /// Literal text (it is in the manifest: not a secret).
    Text(String),
    /// `{ secret: NAME }`: read from `AGENTVISOR_SECRET_NAME` when the
    /// server starts; a missing one is `mcp_env_resolve`.
    Secret {
        /// The secret's name.
        secret: String,
    },
}

impl std::fmt::Debug for McpValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpValue::Text(t) => write!(f, "{t:?}"),
            McpValue::Secret { secret } => write!(f, "{{secret: {secret}}}"),
        }
    }
}

/// How widely a server is shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpScope {
    /// One server per host and definition, shared by every run that uses it.
    #[default]
    Host,
    /// One server per run, started with it and stopped when it ends.
    Run,
}

impl McpScope {
    fn is_host(&self) -> bool {
        *self == McpScope::Host
    }
}

impl McpSpec {
    /// Checks what serde cannot: unique valid names, exactly one of
    /// `command` and `url`, headers only for URLs, secret names.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for s in &self.servers {
            s.check()?;
            if !seen.insert(s.name.as_str()) {
                return Err(format!("mcp server `{}` is listed twice", s.name));
            }
        }
        Ok(())
    }
}

impl McpServerSpec {
    /// Checks one server's definition.
    pub fn check(&self) -> Result<(), String> {
        let n = &self.name;
        let valid = !n.is_empty()
            && n.len() <= MAX_SERVER_NAME
            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid {
            return Err(format!(
                "mcp server name `{}`: use 1-{MAX_SERVER_NAME} characters of A-Z, a-z, 0-9, `-`",
                crate::ports::run::cap_text(n, 64)
            ));
        }
        match (&self.command.is_empty(), &self.url) {
            (false, Some(_)) => {
                return Err(format!("mcp server `{n}` has both `command` and `url`"))
            }
            (true, None) => return Err(format!("mcp server `{n}` needs a `command` or a `url`")),
            (false, None) => {
                if self.command[0].trim().is_empty() {
                    return Err(format!(
                        "mcp server `{n}`: `command` starts with an empty program"
                    ));
                }
                if !self.headers.is_empty() {
                    return Err(format!("mcp server `{n}`: `headers` are for `url` servers"));
                }
            }
            (true, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!(
                        "mcp server `{n}`: `url` must be http:// or https://"
                    ));
                }
                if !self.env.is_empty() {
                    return Err(format!("mcp server `{n}`: `env` is for `command` servers"));
                }
            }
        }
        for (key, value) in self.env.iter().chain(self.headers.iter()) {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(format!(
                    "mcp server `{n}`: invalid name `{key}` in `env`/`headers`"
                ));
            }
            if let McpValue::Secret { secret } = value {
                if !is_secret_name(secret) {
                    return Err(format!(
                        "mcp server `{n}`: secret name `{secret}`: use A-Z, a-z, 0-9, `_`"
                    ));
                }
            }
        }
        if let Some(allow) = &self.allow {
            if allow.iter().any(|t| t.is_empty()) {
                return Err(format!("mcp server `{n}`: `allow` names an empty tool"));
            }
        }
        Ok(())
    }

    /// Whether this is a stdio server (else HTTP).
    pub fn is_stdio(&self) -> bool {
        !self.command.is_empty()
    }

    /// Whether `other` is the same server: the same name, reached the same
    /// way (command or URL, environment, headers) and shared the same way
    /// (`scope`). Only `allow` may differ: it chooses among the server's
    /// tools, it does not make another server.
    pub fn same_server(&self, other: &McpServerSpec) -> bool {
        // Destructured whole: a field added here must be placed on one side.
        let McpServerSpec {
            name,
            command,
            url,
            env,
            headers,
            scope,
            allow: _,
        } = self;
        *name == other.name
            && *command == other.command
            && *url == other.url
            && *env == other.env
            && *headers == other.headers
            && *scope == other.scope
    }

    /// Whether `allow` lets the model see the server's tool `remote`.
    pub fn allows(&self, remote: &str) -> bool {
        self.allow
            .as_ref()
            .is_none_or(|a| a.iter().any(|n| n == remote))
    }
}

fn is_secret_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<McpSpec, String> {
        let spec: McpSpec = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
        spec.check()?;
        Ok(spec)
    }

    #[test]
    fn the_three_kinds_of_server_parse() {
        let spec = parse(
            r#"
servers:
  - { name: time, command: [mcp-server-time, --local-timezone=UTC], env: { TZ: UTC } }
  - { name: web, url: "http://127.0.0.1:3001/mcp", headers: { Authorization: { secret: WEB_TOKEN } } }
  - { name: browser, command: [npx, some-server], scope: run, allow: [navigate, screenshot] }
"#,
        );
        let Ok(spec) = spec else { panic!("{spec:?}") };
        assert_eq!(spec.servers.len(), 3);
        assert!(spec.servers[0].is_stdio());
        assert_eq!(
            spec.servers[1].headers.get("Authorization"),
            Some(&McpValue::Secret {
                secret: "WEB_TOKEN".into()
            })
        );
        assert_eq!(spec.servers[2].scope, McpScope::Run);
        assert_eq!(spec.servers[0].scope, McpScope::Host);
    }

    #[test]
    fn bad_definitions_are_refused_with_the_reason() {
        let cases = [
            ("servers: [{ name: a_b, command: [x] }]", "name `a_b`"),
            ("servers: [{ name: a }]", "needs a `command` or a `url`"),
            (
                "servers: [{ name: a, command: [x], url: 'http://x' }]",
                "both",
            ),
            ("servers: [{ name: a, url: 'ftp://x' }]", "http://"),
            (
                "servers: [{ name: a, command: [x] }, { name: a, url: 'http://x' }]",
                "twice",
            ),
            (
                "servers: [{ name: a, command: [x], env: { K: { secret: 'a-b' } } }]",
                "secret name",
            ),
            (
                "servers: [{ name: a, command: [x], headers: { K: v } }]",
                "`headers` are for",
            ),
            (
                "servers: [{ name: a, command: [x], scope: process }]",
                "unknown variant",
            ),
        ];
        for (yaml, want) in cases {
            match parse(yaml) {
                Err(e) => assert!(e.contains(want), "{yaml}: {e}"),
                Ok(_) => panic!("{yaml} parsed"),
            }
        }
    }

    #[test]
    fn a_secret_reference_prints_its_name_only() {
        let v = McpValue::Secret {
            secret: "TOKEN".into(),
        };
        assert_eq!(format!("{v:?}"), "{secret: TOKEN}");
    }
}
