//! What the critic keeps of a text: a 32-bit hash, taken as it is or
//! normalised, in one pass and without allocating.
//!
//! Normalising masks what changes between two answers that say the same
//! thing: every word (a run of letters, digits, `_` and `-`) that holds a
//! digit becomes `#` — numbers, counters, timestamps, hex and UUIDs — and,
//! for errors, quoted spans (`'…'`, `"…"`, `` `…` ``) and paths (a
//! whitespace-free token with a `/` or `\`) are masked too, and runs of
//! whitespace count as one space. So `job 41 running (3s)` and `job 41
//! running (9s)` are the same result, and `no such file: '/tmp/a1.txt'`
//! and `no such file: '/tmp/b7.txt'` the same error.

/// FNV-1a, 64-bit: small, fast on short texts, and stable across builds.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    const START: Fnv = Fnv(0xcbf2_9ce4_8422_2325);

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(self) -> u32 {
        fold(self.0)
    }
}

/// Folds a 64-bit hash to the 32 bits the trace keeps; never 0 (0 is the
/// trace's "nothing").
pub(crate) fn fold(h: u64) -> u32 {
    let h = (h ^ (h >> 32)) as u32;
    h.max(1)
}

/// The hash of a text as it is.
pub(crate) fn hash(text: &str) -> u32 {
    let mut h = Fnv::START;
    h.bytes(text.as_bytes());
    h.finish()
}

/// The hash of a text normalised (see the module doc); `error`: also mask
/// quoted spans and paths. A text that normalising leaves as it is hashes
/// as [`hash`] hashes it.
pub(crate) fn normalised(text: &str, error: bool) -> u32 {
    if error {
        normalised_error(text)
    } else {
        normalised_result(text)
    }
}

/// A result normalised: words with a digit masked, whitespace runs as one
/// space; one pass, no lookahead.
fn normalised_result(text: &str) -> u32 {
    let b = text.as_bytes();
    let mut h = Fnv::START;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            h.bytes(b" ");
        } else if is_word(c) {
            let start = i;
            let mut digit = false;
            while i < b.len() && is_word(b[i]) {
                digit |= b[i].is_ascii_digit();
                i += 1;
            }
            h.bytes(if digit { b"#" } else { &b[start..i] });
        } else {
            h.bytes(&b[i..=i]);
            i += 1;
        }
    }
    h.finish()
}

/// An error normalised: as a result, and quoted spans and paths masked.
fn normalised_error(text: &str) -> u32 {
    let b = text.as_bytes();
    let mut h = Fnv::START;
    let mut i = 0;
    // A quote opens a span only where a word does not go on (not the
    // apostrophe of "don't").
    let opens = |i: usize| i == 0 || !b[i - 1].is_ascii_alphanumeric();
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            h.bytes(b" ");
            continue;
        }
        if is_quote(c) && opens(i) {
            if let Some(len) = b[i + 1..].iter().position(|&x| x == c) {
                h.bytes(b"'Q'");
                i += len + 2;
                continue;
            }
        }
        // A token: up to whitespace or a quote that opens a span.
        let start = i;
        i += 1;
        while i < b.len() && !b[i].is_ascii_whitespace() && !(is_quote(b[i]) && opens(i)) {
            i += 1;
        }
        let token = &b[start..i];
        if token.len() > 1 && token.iter().any(|&x| x == b'/' || x == b'\\') {
            h.bytes(b"P");
            continue;
        }
        words(token, &mut h);
    }
    h.finish()
}

fn is_quote(c: u8) -> bool {
    matches!(c, b'\'' | b'"' | b'`')
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c >= 0x80
}

/// Feeds a token's words (a word with a digit as `#`) and the bytes
/// between them.
fn words(token: &[u8], h: &mut Fnv) {
    let mut i = 0;
    while i < token.len() {
        if !is_word(token[i]) {
            h.bytes(&token[i..=i]);
            i += 1;
            continue;
        }
        let start = i;
        while i < token.len() && is_word(token[i]) {
            i += 1;
        }
        let word = &token[start..i];
        if word.iter().any(u8::is_ascii_digit) {
            h.bytes(b"#");
        } else {
            h.bytes(word);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_hex_and_ids_are_masked() {
        assert_eq!(
            normalised("job 41 running (3s), 2026-01-02T10:00:01Z", false),
            normalised("job 41 running (19s), 2026-01-02T10:05:44Z", false)
        );
        assert_eq!(
            normalised("run 550e8400-e29b-41d4-a716-446655440000 queued", false),
            normalised("run 6ba7b810-9dad-11d1-80b4-00c04fd430c8 queued", false)
        );
        assert_eq!(
            normalised("sha 3f2a9c1", false),
            normalised("sha 77be01d", false)
        );
        assert_ne!(
            normalised("job running", false),
            normalised("job done", false)
        );
        assert_eq!(normalised("a  b\n\tc", false), normalised("a b c", false));
    }

    #[test]
    fn errors_also_mask_quotes_and_paths() {
        assert_eq!(
            normalised("no such file: '/tmp/a.txt'", true),
            normalised("no such file: '/var/b/c.txt'", true)
        );
        assert_eq!(
            normalised("cannot open /home/x/notes.md: denied", true),
            normalised("cannot open ./other.md: denied", true)
        );
        assert_eq!(
            normalised(r#"unexpected token "}" in `echo "a"'`"#, true),
            normalised(r#"unexpected token ")" in `ls -l`"#, true)
        );
        // An apostrophe is no quote.
        assert_ne!(
            normalised("don't retry: 'a'", true),
            normalised("do retry: 'a'", true)
        );
        assert_ne!(
            normalised("timeout calling api", true),
            normalised("refused calling api", true)
        );
        // Results keep their quotes: JSON with other values differs.
        assert_ne!(
            normalised(r#"{"state":"running"}"#, false),
            normalised(r#"{"state":"done"}"#, false)
        );
    }

    #[test]
    fn a_text_with_nothing_to_mask_hashes_as_it_is() {
        for t in ["DONE", "a b.c", "{\"ok\":true}", ""] {
            assert_eq!(normalised(t, false), hash(t), "{t}");
        }
        assert_ne!(normalised("a1", false), hash("a1"));
    }

    #[test]
    fn hashes_are_never_zero() {
        assert_ne!(hash(""), 0);
        assert_eq!(fold(0), 1);
        assert_ne!(hash("a"), hash("b"));
    }
}
