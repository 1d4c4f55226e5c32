//! The JSON primitives of the stored form: strings, integers and usage
//! objects appended as serde_json writes them (a test holds them equal),
//! without serde's per-key escape scan, and the usage counters that are 0
//! left out.

use crate::ports::run::{RunUsage, Usage};

/// Usage fields that read as 0 when absent (`#[serde(default)]`), left out
/// of stored JSON when they are 0 (most providers report none of them).
pub(super) const ZERO_DEFAULTS: [&[u8]; 3] = [
    b",\"cache_read_tokens\":0",
    b",\"cache_write_tokens\":0",
    b",\"reasoning_tokens\":0",
];

/// Removes the [`ZERO_DEFAULTS`] from the `"usage"` objects of
/// `json[start..]`. A usage object is flat (numbers only) but for its
/// `critic` object, which comes last and holds none of these keys; a match is a
/// field: inside a string a quote is escaped, so `"usage":{` or
/// `,"reasoning_tokens":0` cannot match there.
pub(super) fn strip_zero_defaults(json: &mut Vec<u8>, start: usize) {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    // Built once: a finder's setup costs more than a short search.
    static USAGE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"usage\":{"));
    static ZEROS: LazyLock<[Finder<'static>; 3]> = LazyLock::new(|| ZERO_DEFAULTS.map(Finder::new));
    let mut at = start;
    while let Some(i) = USAGE.find(&json[at..]) {
        let open = at + i + 9;
        let Some(len) = memchr::memchr(b'}', &json[open..]) else {
            return;
        };
        let mut end = open + len;
        for (p, finder) in ZERO_DEFAULTS.iter().zip(ZEROS.iter()) {
            if let Some(j) = finder.find(&json[open..end]) {
                let s = open + j;
                if matches!(json.get(s + p.len()), Some(b',' | b'}')) {
                    json.drain(s..s + p.len());
                    end -= p.len();
                }
            }
        }
        at = end;
    }
}

/// Appends a usage object without its counters that are 0 (the
/// [`ZERO_DEFAULTS`]).
pub(super) fn push_usage(out: &mut Vec<u8>, usage: &Usage) {
    out.extend_from_slice(b"{\"input_tokens\":");
    push_int(out, usage.input_tokens);
    out.extend_from_slice(b",\"output_tokens\":");
    push_int(out, usage.output_tokens);
    for (key, n) in [
        (ZERO_DEFAULTS[0], usage.cache_read_tokens),
        (ZERO_DEFAULTS[1], usage.cache_write_tokens),
        (ZERO_DEFAULTS[2], usage.reasoning_tokens),
    ] {
        if n != 0 {
            // The key without its `0`.
            out.extend_from_slice(&key[..key.len() - 1]);
            push_int(out, n);
        }
    }
    if usage.estimated {
        out.extend_from_slice(b",\"estimated\":true");
    }
    out.push(b'}');
}

/// Appends a run's usage object ([`push_usage`]'s, with the judges'
/// `critic` object last when there is one, as serde writes it; its keys
/// are none of the [`ZERO_DEFAULTS`]).
pub(super) fn push_run_usage(out: &mut Vec<u8>, usage: &RunUsage) {
    push_usage(out, &usage.own);
    if let Some(c) = &usage.critic {
        out.pop();
        out.extend_from_slice(b",\"critic\":{\"input_tokens\":");
        push_int(out, c.input_tokens);
        out.extend_from_slice(b",\"output_tokens\":");
        push_int(out, c.output_tokens);
        out.extend_from_slice(b",\"cost_micros\":");
        push_int(out, c.cost_micros);
        out.extend_from_slice(b",\"calls\":");
        push_int(out, c.calls as u64);
        out.extend_from_slice(b"}}");
    }
}

/// Appends `s` as a JSON string, as serde_json writes it: as it is when
/// nothing in it needs escaping (the common case, checked in one pass),
/// through serde_json otherwise.
pub(super) fn push_str(out: &mut Vec<u8>, s: &str) {
    if needs_no_escape(s.as_bytes()) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// Whether no byte of `s` is one JSON escapes (a control character, `"`
/// or `\`), eight bytes at a time.
pub(super) fn needs_no_escape(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte of `v` is 0 ⇔ its high bit is set here (no false positives
    // once any byte is found: what matters is whether there is one).
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let chunks = s.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        let v = u64::from_le_bytes(word);
        // Bytes below 0x20: v - 0x20 per byte borrows into the high bit
        // of a byte that was below it (and had its high bit clear).
        let control = v.wrapping_sub(ONES * 0x20) & !v & HIGHS;
        if control
            | zero_byte(v ^ (ONES * u64::from(b'"')))
            | zero_byte(v ^ (ONES * u64::from(b'\\')))
            != 0
        {
            return false;
        }
    }
    rest.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
}

/// Appends `n` in decimal.
pub(super) fn push_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}
