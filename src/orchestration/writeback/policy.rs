//! How a write is committed and pushed: the bot's identity, the retry
//! policy of pushes, and the push token read from a secret.

use std::time::Duration;

use crate::skills::secret_variable;

/// The secret a push token is read from by default
/// (`AGENTVISOR_SECRET_GIT_TOKEN`).
pub const DEFAULT_TOKEN_SECRET: &str = "git_token";

/// The remote writes are pushed to.
pub const REMOTE: &str = "origin";

/// The identity writeback commits are made as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The name (`agentvisor`).
    pub name: String,
    /// The e-mail address (`agentvisor@localhost`).
    pub email: String,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            name: "agentvisor".into(),
            email: "agentvisor@localhost".into(),
        }
    }
}

/// How a push that does not land is tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Pushes tried in all, the first included (at least 1; default 5).
    pub tries: u32,
    /// The wait before the second try; it doubles at each try after
    /// (default 200 ms), plus up to half again at random.
    pub backoff: Duration,
    /// The longest wait (default 5 s).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            tries: 5,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The wait before try `n` (2, 3, …), with its jitter.
    pub(super) fn wait_before(&self, n: u32) -> Duration {
        let doubled = self
            .backoff
            .saturating_mul(1u32 << n.saturating_sub(2).min(16))
            .min(self.max_backoff);
        // Up to half again, so writers that collided do not collide again.
        let spread = doubled.as_nanos() as u64 / 2;
        let jitter = if spread == 0 {
            0
        } else {
            random_u64() % spread
        };
        doubled + Duration::from_nanos(jitter)
    }
}

/// A push token, read from a secret. Its value never shows in `Debug`.
#[derive(Clone)]
pub struct GitToken {
    pub(super) secret: String,
    pub(super) value: String,
}

impl std::fmt::Debug for GitToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GitToken({})", secret_variable(&self.secret))
    }
}

impl GitToken {
    /// The token `value` of secret `secret` (its name: `git_token`), which
    /// is registered for redaction.
    pub fn new(secret: &str, value: &str) -> GitToken {
        crate::secrets::register_from(&secret_variable(secret), value);
        GitToken {
            secret: secret.to_string(),
            value: value.to_string(),
        }
    }

    /// The secret's name.
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

/// Whether and how a write is pushed.
#[derive(Clone, Debug)]
pub struct PushPolicy {
    /// Commit only (`skill run --skip-push`).
    pub skip_push: bool,
    /// The secret the token comes from (named in the warning when it is
    /// not set).
    pub secret: String,
    /// The token; without one the commit stays local.
    pub token: Option<GitToken>,
}

impl PushPolicy {
    /// Reads the token of secret `secret` (`AGENTVISOR_SECRET_<SECRET>`)
    /// through `lookup` (`std::env::var` outside tests).
    pub fn from_secret(
        secret: &str,
        skip_push: bool,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> PushPolicy {
        let token = lookup(&secret_variable(secret))
            .filter(|v| !v.is_empty())
            .map(|v| GitToken::new(secret, &v));
        PushPolicy {
            skip_push,
            secret: secret.to_string(),
            token,
        }
    }

    /// Commit only, never push.
    pub fn local() -> PushPolicy {
        PushPolicy {
            skip_push: true,
            secret: DEFAULT_TOKEN_SECRET.into(),
            token: None,
        }
    }
}

/// A random number for jitter (the standard library's per-process hash
/// keys, advanced by a counter).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_at_most_half_again() {
        let p = RetryPolicy {
            tries: 9,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
        };
        for (n, base) in [(2, 100), (3, 200), (4, 350), (9, 350)] {
            let w = p.wait_before(n);
            let base = Duration::from_millis(base);
            assert!(w >= base && w <= base + base / 2, "try {n}: {w:?}");
        }
    }

    #[test]
    fn no_token_no_push_and_the_token_hides_in_debug() {
        let p = PushPolicy::from_secret("git_token", false, |v| {
            (v == "AGENTVISOR_SECRET_GIT_TOKEN").then(|| "ghp_secretvalue123".to_string())
        });
        let shown = format!("{p:?}");
        assert!(
            !shown.contains("ghp_secretvalue123") && shown.contains("AGENTVISOR_SECRET_GIT_TOKEN"),
            "{shown}"
        );
        assert!(PushPolicy::from_secret("git_token", false, |_| None)
            .token
            .is_none());
    }
}
