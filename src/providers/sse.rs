//! Server-sent events framing, as both streaming providers receive it: an
//! incremental parser fed with body chunks as they arrive, yielding one
//! [`SseEvent`] per blank-line-terminated block.
//!
//! Hand-written rather than a crate: the two wire protocols use only
//! `event:` and `data:` fields, and this parser is a few dozen lines over
//! `reqwest::Response::chunk`, where a stream adapter would pull in the
//! `stream` feature and its dependencies.
//!
//! Lines end with `\n`, `\r\n` or `\r`; `:` lines are comments; several
//! `data:` lines join with `\n`; an `error:` line (llama.cpp's server
//! sends its errors so, a context overflow among them) is an `error` event
//! with that line as its data; `id:` and `retry:` are ignored. A block
//! still open when the body ends is dropped, as the specification says (the
//! providers then see a stream that ended early).

use super::http::{self, Secret};
use crate::ports::model::{ChatRequest, ChatResponse, ModelError};

/// A model's answer folded from its stream's events, one provider's wire
/// format; [`read_stream`] drives it.
pub(crate) trait StreamFold: Default {
    /// Folds one event in and says whether it carried content (text, a
    /// tool-call part, reasoning, usage, the reason the answer stopped):
    /// only such an event is progress. `Err` for an error the server sent
    /// in the stream or an event that does not parse.
    fn apply(
        &mut self,
        ev: &SseEvent,
        request: &ChatRequest,
        secret: Option<&Secret>,
    ) -> Result<bool, ModelError>;
    /// The stream has said its last word (`[DONE]`, `message_stop`).
    fn is_over(&self) -> bool;
    /// Whether a body that ends here, without that last word, still holds
    /// a whole answer.
    fn whole_at_end(&self) -> bool;
    /// Whether text already reached the request's listener.
    fn delivered(&self) -> bool;
    /// The answer.
    fn into_response(self, request: &ChatRequest) -> ChatResponse;
}

/// What a streamed response brought before it ended (for error messages,
/// and for the provider that falls back from a stream with no event).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamStats {
    /// Body bytes received.
    pub(crate) bytes: usize,
    /// Events parsed.
    pub(crate) events: usize,
    /// The body's first bytes, while no event has come (to show what a
    /// server sent instead of events).
    head: Vec<u8>,
}

/// How many of a body's first bytes an error shows when no event came.
const HEAD_BYTES: usize = 200;

impl StreamStats {
    /// `12 bytes and 1 event`.
    fn counts(&self) -> String {
        let n = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        format!("{} and {}", n(self.bytes, "byte"), n(self.events, "event"))
    }

    /// `, the body starts: …` (scrubbed) for a body with bytes but no event.
    fn head_note(&self, secret: Option<&Secret>) -> String {
        if self.events > 0 || self.head.is_empty() {
            return String::new();
        }
        let head = String::from_utf8_lossy(&self.head);
        format!("; the body starts: {}", http::scrub(head.trim(), secret))
    }
}

/// Reads a streamed response to its end, folding its events into `S`.
/// A chunk is a sign of life for the request's observer (a heartbeat, and
/// the end of the wait for the first token) only when an event in it
/// carried content ([`StreamFold::apply`]): keep-alives — `:` comments, an
/// empty delta, Anthropic's `ping` — are not, so a server that holds a
/// request open with them and says nothing stalls the run as silence
/// would. A body that ends before the answer is whole (`last_word` names
/// what was missing) fails with `Incomplete`; a connection that fails
/// mid-body, with `Transport`; both name `endpoint`, the status, and the
/// bytes and events that arrived (and, when no event did, the start of
/// the body: a server's error in a format we do not read). Any failure
/// after text reached the listener is `Interrupted` (the listener has seen
/// a part that will not be kept). `stats` holds what arrived.
pub(crate) async fn read_stream<S: StreamFold>(
    resp: &mut reqwest::Response,
    request: &ChatRequest,
    secret: Option<&Secret>,
    endpoint: &str,
    last_word: &str,
    stats: &mut StreamStats,
) -> Result<ChatResponse, ModelError> {
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut st = S::default();
    let status = resp.status();
    let fail = |st: &S, e: ModelError| {
        if st.delivered() {
            ModelError::Interrupted(Box::new(e))
        } else {
            e
        }
    };
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                let cause = match http::transport(e, secret) {
                    ModelError::Transport(t) => t,
                    other => other.to_string(),
                };
                let e = ModelError::Transport(format!(
                    "POST {endpoint} answered {status}, then the connection failed after {}{}: {cause}",
                    stats.counts(),
                    stats.head_note(secret),
                ));
                return Err(fail(&st, e));
            }
        };
        stats.bytes += chunk.len();
        if stats.events == 0 && stats.head.len() < HEAD_BYTES {
            let room = HEAD_BYTES - stats.head.len();
            stats
                .head
                .extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
        parser.feed(&chunk, &mut events);
        stats.events += events.len();
        let mut content = false;
        for ev in events.drain(..) {
            match st.apply(&ev, request, secret) {
                Ok(c) => content |= c,
                Err(e) => return Err(fail(&st, e)),
            }
            if st.is_over() {
                return Ok(st.into_response(request));
            }
        }
        if content {
            request.alive();
        }
    }
    if st.whole_at_end() {
        return Ok(st.into_response(request));
    }
    let e = ModelError::Incomplete(format!(
        "POST {endpoint} answered {status}, but the stream ended before {last_word}, after {}{}",
        stats.counts(),
        stats.head_note(secret),
    ));
    Err(fail(&st, e))
}

/// One event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` field (empty when the block had none).
    pub(crate) event: String,
    /// The `data:` lines, joined with `\n`.
    pub(crate) data: String,
}

/// The incremental parser.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes of a line not yet ended.
    line: Vec<u8>,
    /// The last byte seen was `\r` (a `\n` right after it ends nothing).
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
}

/// Lines longer than this are cut (a hostile server cannot grow memory
/// without bound through one line).
const MAX_LINE: usize = 8 * 1024 * 1024;

impl SseParser {
    /// Feeds a chunk; pushes every event it completes onto `out`.
    pub(crate) fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) {
        for &b in chunk {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    self.end_line(out);
                }
                _ => {
                    self.after_cr = false;
                    if self.line.len() < MAX_LINE {
                        self.line.push(b);
                    }
                }
            }
        }
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        if self.line.is_empty() {
            if self.has_data {
                out.push(SseEvent {
                    event: std::mem::take(&mut self.event),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.event.clear();
            self.has_data = false;
            return;
        }
        let line = String::from_utf8_lossy(&self.line).into_owned();
        self.line.clear();
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        match field {
            "event" => self.event = value.to_string(),
            // Not in the specification: llama.cpp's server writes an error
            // in a stream as `error: {json}`.
            "error" => {
                self.event = "error".to_string();
                self.data = value.to_string();
                self.has_data = true;
            }
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        out
    }

    #[test]
    fn events_split_anywhere_reassemble() {
        let text = b"event: message_start\ndata: {\"a\":1}\n\n: ping\n\ndata: x\r\ndata: y\r\n\r\ndata:[DONE]\n\n";
        let whole = parse(&[text]);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].event, "message_start");
        assert_eq!(whole[0].data, "{\"a\":1}");
        assert_eq!(whole[1].data, "x\ny");
        assert_eq!(whole[2].data, "[DONE]");
        for cut in 1..text.len() {
            let (a, b) = text.split_at(cut);
            assert_eq!(parse(&[a, b]), whole, "cut at {cut}");
        }
        let bytewise: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(parse(&bytewise), whole);
    }

    #[test]
    fn an_error_line_is_an_error_event() {
        let text = b"error: {\"code\":400,\"message\":\"too long\"}\n\n";
        let events = parse(&[text]);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event, "error");
        assert_eq!(events[0].data, "{\"code\":400,\"message\":\"too long\"}");
    }

    #[test]
    fn an_unterminated_block_is_dropped_and_utf8_survives_splits() {
        assert!(parse(&[b"data: {\"half\":"]).is_empty());
        let text = "data: héllo\n\n".as_bytes();
        let (a, b) = text.split_at(8);
        assert_eq!(parse(&[a, b])[0].data, "héllo");
    }
}
