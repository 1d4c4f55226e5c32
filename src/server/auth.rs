//! Who may do what: bearer tokens mapped to callers and roles.
//!
//! The tokens file holds one YAML line per token,
//! `- { caller: alice, role: caller, sha256: <hex digest of the token> }`:
//! the server never sees a token at rest, only its SHA-256 digest. A
//! presented token is hashed and compared with every digest in constant
//! time (the comparison takes the same time whichever digest matches, or
//! none). Tokens are never logged, recorded or echoed in errors.
//!
//! A `caller` sees and controls only its own runs; an `admin` sees and
//! controls every run and may submit inline manifests.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Its own runs only.
    Caller,
    /// Every run, and inline manifests.
    Admin,
}

/// The caller a request was authenticated as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The caller id (runs are submitted under it).
    pub id: Arc<str>,
    /// Its role.
    pub role: Role,
}

impl Caller {
    /// Whether this caller may see and control a run of `owner`.
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        self.role == Role::Admin || owner == Some(&*self.id)
    }

    /// Whether this caller is an admin.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

/// One line of the tokens file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenLine {
    caller: String,
    role: Role,
    sha256: String,
}

/// Why a tokens file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// The file could not be read.
    #[error("cannot read the tokens file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not a YAML list of `{caller, role, sha256}`.
    #[error("tokens file {path}: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// Why (a line and column when YAML says so).
        reason: String,
    },
}

/// The tokens the server accepts.
#[derive(Clone, Debug, Default)]
pub struct TokenTable {
    entries: Vec<([u8; 32], Caller)>,
}

impl TokenTable {
    /// Reads a tokens file.
    pub fn load(path: &Path) -> Result<Self, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|e| TokensError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::parse(&text).map_err(|reason| TokensError::Parse {
            path: path.display().to_string(),
            reason,
        })
    }

    /// Parses the text of a tokens file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let lines: Option<Vec<TokenLine>> =
            serde_norway::from_str(text).map_err(|e| e.to_string())?;
        let mut entries = Vec::new();
        for (i, l) in lines.unwrap_or_default().into_iter().enumerate() {
            let digest = decode_digest(&l.sha256).ok_or_else(|| {
                format!(
                    "entry {} (caller `{}`): `sha256` must be 64 hex digits",
                    i + 1,
                    l.caller
                )
            })?;
            if l.caller.trim().is_empty() {
                return Err(format!("entry {}: `caller` is empty", i + 1));
            }
            entries.push((
                digest,
                Caller {
                    id: Arc::from(l.caller.as_str()),
                    role: l.role,
                },
            ));
        }
        Ok(TokenTable { entries })
    }

    /// A table of `(token, caller)` pairs (tests, embedding).
    pub fn from_tokens<'a>(tokens: impl IntoIterator<Item = (&'a str, Caller)>) -> Self {
        TokenTable {
            entries: tokens
                .into_iter()
                .map(|(t, c)| (Sha256::digest(t.as_bytes()).into(), c))
                .collect(),
        }
    }

    /// How many tokens.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller `token` belongs to. Every digest is compared, in
    /// constant time, whichever matches.
    pub fn authenticate(&self, token: &str) -> Option<Caller> {
        self.find(token).map(|(_, caller)| caller)
    }

    /// The caller `token` belongs to, with the token's digest (what the
    /// server knows a token by, to end its streams once it is revoked).
    pub(crate) fn find(&self, token: &str) -> Option<([u8; 32], Caller)> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found: Option<&Caller> = None;
        for (d, caller) in &self.entries {
            let hit: bool = d.ct_eq(&digest).into();
            if hit && found.is_none() {
                found = Some(caller);
            }
        }
        found.map(|c| (digest, c.clone()))
    }

    /// Whether the token of `digest` still acts as `caller` (same id, same
    /// role): after a reload, a token that does not is revoked.
    pub(crate) fn holds(&self, digest: &[u8; 32], caller: &Caller) -> bool {
        self.entries
            .iter()
            .any(|(d, c)| bool::from(d.ct_eq(digest)) && c == caller)
    }
}

fn decode_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// The lowercase hex SHA-256 of `token` (what the tokens file stores).
pub fn digest_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh random token (`av_` and 64 hex digits: 256 bits from the OS).
pub fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness from the OS: {e}"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("av_{hex}"))
}

/// The tokens-file line for `token`.
pub fn token_line(caller: &str, role: Role, token: &str) -> String {
    let role = match role {
        Role::Admin => "admin",
        Role::Caller => "caller",
    };
    format!(
        "- {{ caller: {caller}, role: {role}, sha256: {} }}",
        digest_hex(token)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_token_line_authenticates_its_token_only() {
        let token = new_token().unwrap();
        let line = token_line("alice", Role::Caller, &token);
        let table = TokenTable::parse(&line).unwrap();
        let c = table.authenticate(&token).unwrap();
        assert_eq!(&*c.id, "alice");
        assert_eq!(c.role, Role::Caller);
        assert!(table.authenticate("av_nope").is_none());
        assert!(table.authenticate("").is_none());
    }

    #[test]
    fn bad_lines_are_refused_with_the_entry() {
        let e = TokenTable::parse("- { caller: a, role: caller, sha256: abc }").unwrap_err();
        assert!(e.contains("entry 1"), "{e}");
        let e = TokenTable::parse("- { caller: a, role: boss, sha256: abc }").unwrap_err();
        assert!(e.contains("boss") || e.contains("variant"), "{e}");
        assert!(TokenTable::parse("").unwrap().is_empty());
    }
}
