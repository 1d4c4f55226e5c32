//! Secret redaction: the set of secret values this process knows (the API
//! keys the providers read, from the environment or a host's environment
//! map; values a caller registers), and the one function that replaces
//! them with [`REDACTED`] wherever text leaves a model, a tool or a server.
//!
//! # Where it is applied
//!
//! Before text reaches a result, an event, the audit log or a log line:
//! model answers, streamed deltas and tool-call arguments (in the
//! providers, as they parse a response), tool results and tool errors (in
//! the tool registry, as a call ends) and provider error bodies (in the
//! providers' error mapping). A model that echoes its key, a tool that
//! prints the environment, a server that puts the key in an error message:
//! each comes out as `[REDACTED]`.
//!
//! # Matching
//!
//! Case-insensitively (ASCII): a key upper-cased by a server or a tool is
//! still found. Only whole occurrences of a registered value are replaced,
//! never a part of one. Values shorter than [`MIN_SECRET_LEN`] are not
//! registered (one warning a process says so): redacting every `1234`, or
//! every `o` of a dummy key, would mangle answers and protect nothing.
//! A value split across two streamed deltas is still caught: a
//! [`StreamRedactor`] holds back the last few characters of a stream until
//! it knows they do not begin a secret.
//!
//! # Why process-wide
//!
//! Secrets are facts about the process (its environment), and the places
//! that must redact — providers, tools, log lines — are many and share no
//! host handle. A registered value stays registered for the life of the
//! process; registering is idempotent.
//!
//! # Cost
//!
//! With no secret known, [`redact`] is one relaxed atomic load and returns
//! its input borrowed: nothing on the hot path (the scripted model and the
//! built-in tools of a benchmark) pays more. With secrets, a redaction is a
//! scan of the text per secret.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Values shorter than this (in bytes, after trimming) are not registered.
pub const MIN_SECRET_LEN: usize = 8;

/// Whether any secret is registered (the fast path's one load).
static ANY: AtomicBool = AtomicBool::new(false);

/// The registered secrets, lower-cased (ASCII).
static SECRETS: RwLock<Vec<Box<[u8]>>> = RwLock::new(Vec::new());

/// Whether the "too short to redact" warning was given (it is given once
/// a process).
static WARNED_SHORT: AtomicBool = AtomicBool::new(false);

/// Registers a secret value (trimmed); already known: nothing happens.
/// Returns whether it is now known. A value shorter than
/// [`MIN_SECRET_LEN`] is not a secret to redact (a dummy key such as `o`
/// for a local server would turn every `o` of every message into
/// `[REDACTED]`): it is not registered, and the first such value of the
/// process is reported in one warning.
pub fn register(value: &str) -> bool {
    register_from("a secret value", value)
}

/// [`register`], naming where the value comes from (`OPENAI_API_KEY`) in
/// the warning about a value too short to redact.
pub fn register_from(source: &str, value: &str) -> bool {
    let value = value.trim();
    if value.len() < MIN_SECRET_LEN {
        if !value.is_empty() && !WARNED_SHORT.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "{source} is shorter than {MIN_SECRET_LEN} characters: it is not treated as a secret and not redacted from answers, events or errors (a dummy key for a local server is fine; a real key is longer)"
            );
        }
        return false;
    }
    let lower: Box<[u8]> = value.to_ascii_lowercase().into_bytes().into_boxed_slice();
    let mut set = SECRETS.write().unwrap_or_else(|p| p.into_inner());
    if !set.contains(&lower) {
        set.push(lower);
    }
    ANY.store(true, Ordering::Release);
    true
}

/// Whether any secret is registered.
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// Where the longest tail of `text` that is the start of a registered
/// secret (case-insensitively) begins; `text.len()` when there is none.
fn unfinished_from(text: &str) -> usize {
    let set = SECRETS.read().unwrap_or_else(|p| p.into_inner());
    let bytes = text.as_bytes();
    let longest = set.iter().map(|s| s.len()).max().unwrap_or(0);
    let from = bytes.len().saturating_sub(longest.saturating_sub(1));
    for i in from..bytes.len() {
        let tail = &bytes[i..];
        if set
            .iter()
            .any(|s| s.len() > tail.len() && s[..tail.len()].eq_ignore_ascii_case(tail))
        {
            let mut at = i;
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            return at;
        }
    }
    bytes.len()
}

/// `text` with every registered secret replaced by [`REDACTED`]; borrowed
/// when nothing was found (or nothing is registered).
pub fn redact(text: &str) -> Cow<'_, str> {
    if !any() || text.len() < MIN_SECRET_LEN {
        return Cow::Borrowed(text);
    }
    let set = SECRETS.read().unwrap_or_else(|p| p.into_inner());
    let mut out: Option<String> = None;
    for secret in set.iter() {
        let current = out.as_deref().unwrap_or(text);
        if let Some(replaced) = replace_one(current, secret) {
            out = Some(replaced);
        }
    }
    match out {
        Some(s) => Cow::Owned(s),
        None => Cow::Borrowed(text),
    }
}

/// [`redact`] of an owned string, in place when nothing was found.
pub fn redact_string(text: String) -> String {
    match redact(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(s) => s,
    }
}

/// `text` with `secret` (lower-cased) replaced, or `None` when absent.
fn replace_one(text: &str, secret: &[u8]) -> Option<String> {
    let bytes = text.as_bytes();
    let first = *secret.first()?;
    let (lo, up) = (first.to_ascii_lowercase(), first.to_ascii_uppercase());
    let mut out: Option<String> = None;
    // Bytes of `text` copied to `out` so far.
    let mut copied = 0;
    let mut at = 0;
    while let Some(i) = bytes[at..].iter().position(|&b| b == lo || b == up) {
        let start = at + i;
        let end = start + secret.len();
        if end > bytes.len() {
            break;
        }
        if bytes[start..end].eq_ignore_ascii_case(secret) {
            // A secret that is valid UTF-8 matches on char boundaries.
            let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
            o.push_str(text.get(copied..start)?);
            o.push_str(REDACTED);
            copied = end;
            at = end;
        } else {
            at = start + 1;
        }
    }
    let mut o = out?;
    o.push_str(text.get(copied..)?);
    Some(o)
}

/// Redacts a stream of text pieces (streamed deltas): each piece comes out
/// redacted, less a tail that is the start of a secret the next piece may
/// complete (held back until it is known either way);
/// [`finish`](Self::finish) gives what is still held. A piece with no such
/// tail passes as it came, so the stream keeps its pieces; with no secret
/// registered, pieces pass through untouched.
#[derive(Debug, Default)]
pub struct StreamRedactor {
    held: String,
}

impl StreamRedactor {
    /// A redactor with nothing held.
    pub fn new() -> Self {
        StreamRedactor::default()
    }

    /// The redacted text to pass on for `piece` (may be empty while text
    /// is held back).
    pub fn push<'a>(&mut self, piece: &'a str) -> Cow<'a, str> {
        if !any() {
            return Cow::Borrowed(piece);
        }
        if self.held.is_empty() {
            let clean = redact(piece);
            let keep_from = unfinished_from(&clean);
            if keep_from == clean.len() {
                return clean;
            }
            self.held = clean[keep_from..].to_string();
            let mut out = clean.into_owned();
            out.truncate(keep_from);
            return Cow::Owned(out);
        }
        self.held.push_str(piece);
        let held = redact_string(std::mem::take(&mut self.held));
        let keep_from = unfinished_from(&held);
        self.held = held[keep_from..].to_string();
        let mut out = held;
        out.truncate(keep_from);
        Cow::Owned(out)
    }

    /// What is still held, redacted (at the end of the stream).
    pub fn finish(&mut self) -> String {
        redact_string(std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The registry is process-wide: every test registers its own values.

    #[test]
    fn secrets_are_found_in_any_case_and_short_values_are_not_registered() {
        assert!(register("  sk-unit-Case-0001  "));
        assert!(!register("short"));
        let t = "key SK-UNIT-CASE-0001 and sk-unit-case-0001, end";
        assert_eq!(redact(t), "key [REDACTED] and [REDACTED], end");
        assert!(matches!(redact("nothing here at all"), Cow::Borrowed(_)));
        assert_eq!(redact("sk-unit-case-000"), "sk-unit-case-000");
        let u = "ünïcödé sk-unit-case-0001ü";
        assert_eq!(redact(u), "ünïcödé [REDACTED]ü");
    }

    #[test]
    fn only_whole_occurrences_of_keys_of_8_characters_or_more_are_redacted() {
        // A dummy key for a local server: not a secret, nothing mangled.
        assert!(!register("o"));
        assert!(!register("  sk-1234 "));
        assert!(register("unit-whole-key-31"));
        assert_eq!(redact("Not Found: sk-1234"), "Not Found: sk-1234");
        // Parts of a key are not the key.
        let t = "unit-whole-key-3 and unit-whole-key-31.";
        assert_eq!(redact(t), "unit-whole-key-3 and [REDACTED].");
        assert!(
            WARNED_SHORT.load(Ordering::Relaxed),
            "the short key was reported"
        );
    }

    #[test]
    fn a_secret_split_across_pieces_never_passes() {
        register("sk-unit-split-7777");
        let text = "the key is sk-unit-split-7777 — done, and again SK-UNIT-SPLIT-7777!";
        for cut_a in 0..text.len() {
            for cut_b in cut_a..text.len() {
                if !text.is_char_boundary(cut_a) || !text.is_char_boundary(cut_b) {
                    continue;
                }
                let mut r = StreamRedactor::new();
                let mut out = String::new();
                for piece in [&text[..cut_a], &text[cut_a..cut_b], &text[cut_b..]] {
                    let passed = r.push(piece);
                    assert!(
                        !passed.to_ascii_lowercase().contains("split-7777"),
                        "{passed}"
                    );
                    out.push_str(&passed);
                }
                out.push_str(&r.finish());
                assert_eq!(
                    out, "the key is [REDACTED] — done, and again [REDACTED]!",
                    "cuts {cut_a} {cut_b}"
                );
            }
        }
    }
}
