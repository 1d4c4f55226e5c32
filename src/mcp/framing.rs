//! A stdio server's stdout as the protocol reads it: newline-delimited
//! JSON-RPC messages, each at most [`McpConfig::max_message_bytes`]
//! (16 MiB by default).
//!
//! # Guarantees
//! - **Bounded memory.** The server's bytes are read 64 KiB at a time and
//!   counted as they are read. A line within the cap is handed on; a line
//!   over it is cut at the cap (the protocol reads the cut line as
//!   unparsable and drops it) and the rest of it is read and dropped as it
//!   arrives, never buffered: a 100 MB line costs the host its 16 MiB of
//!   cap, not 100 MB.
//! - **The call fails at once.** In place of an oversized answer the
//!   reader hands the protocol a JSON-RPC error answer to the same request
//!   (its `id` read from the line as it streams past), marked
//!   `mcp_result_too_large`: the call fails with that kind as soon as the
//!   cap is passed and the `id` is known, instead of waiting out its
//!   `tool_timeout`. An oversized line that is not an answer (a request or
//!   a notification of the server's), or whose `id` cannot be read, is
//!   dropped with a warning.
//!
//! [`McpConfig::max_message_bytes`]: super::McpConfig::max_message_bytes

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// How much is read from the server at a time.
const CHUNK: usize = 64 * 1024;

/// The JSON-RPC error code of the answer put in place of an oversized one
/// (in the range JSON-RPC leaves to implementations).
pub(crate) const TOO_LARGE_CODE: i32 = -32_001;

/// The `kind` in that answer's `data`, which the tool reads back.
pub(crate) const TOO_LARGE_KIND: &str = "mcp_result_too_large";

/// A server's stdout with every line bounded (see the module docs).
pub(crate) struct CappedLines<R> {
    inner: R,
    cap: u64,
    server: String,
    scratch: Box<[u8]>,
    /// Bytes for the reader, from `ready_at` on.
    ready: Vec<u8>,
    ready_at: usize,
    /// Bytes of the current line read so far (its newline not counted).
    line_len: u64,
    /// The current line passed the cap.
    over: bool,
    /// The error answer for the current line was handed on.
    answered: bool,
    scan: IdScan,
}

impl<R> CappedLines<R> {
    /// `inner` with lines of at most `cap` bytes; `server` names the
    /// server in warnings.
    pub(crate) fn new(inner: R, cap: usize, server: &str) -> Self {
        CappedLines {
            inner,
            cap: cap as u64,
            server: server.to_string(),
            scratch: vec![0u8; CHUNK].into_boxed_slice(),
            ready: Vec::new(),
            ready_at: 0,
            line_len: 0,
            over: false,
            answered: false,
            scan: IdScan::default(),
        }
    }

    /// Takes in `chunk` as read from the server.
    fn take_in(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while !rest.is_empty() {
            let newline = rest.iter().position(|b| *b == b'\n');
            let (content, ends) = match newline {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            rest = &rest[content.len() + usize::from(ends)..];
            self.scan.feed(content);
            let len = content.len() as u64;
            if !self.over {
                let room = self.cap.saturating_sub(self.line_len);
                if len <= room {
                    self.ready.extend_from_slice(content);
                    if ends {
                        self.ready.push(b'\n');
                    }
                } else {
                    // Cut at the cap: the protocol drops the cut line.
                    self.ready.extend_from_slice(&content[..room as usize]);
                    self.ready.push(b'\n');
                    self.over = true;
                }
            }
            self.line_len += len;
            if self.over && !self.answered {
                if let Some(id) = self.scan.answer_id() {
                    self.answer_too_large(&id);
                }
            }
            if ends {
                if self.over {
                    self.line_ended_over();
                }
                self.line_len = 0;
                self.over = false;
                self.answered = false;
                self.scan = IdScan::default();
            }
        }
    }

    /// Hands on an error answer to request `id`.
    fn answer_too_large(&mut self, id: &serde_json::Value) {
        self.answered = true;
        let answer = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": TOO_LARGE_CODE,
                "message": format!("the server's answer is over the {} byte limit", self.cap),
                "data": { "kind": TOO_LARGE_KIND, "limit_bytes": self.cap },
            },
        });
        if let Ok(mut line) = serde_json::to_vec(&answer) {
            line.push(b'\n');
            self.ready.extend_from_slice(&line);
        }
    }

    fn line_ended_over(&self) {
        if self.answered {
            tracing::warn!(
                server = %self.server,
                bytes = self.line_len,
                limit = self.cap,
                "mcp server answered with {} bytes, over the {} byte limit: the call failed",
                self.line_len,
                self.cap
            );
        } else {
            tracing::warn!(
                server = %self.server,
                bytes = self.line_len,
                limit = self.cap,
                "mcp server sent a message of {} bytes, over the {} byte limit, that answers no call: dropped",
                self.line_len,
                self.cap
            );
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CappedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.ready_at < me.ready.len() {
                let n = buf.remaining().min(me.ready.len() - me.ready_at);
                buf.put_slice(&me.ready[me.ready_at..me.ready_at + n]);
                me.ready_at += n;
                if me.ready_at == me.ready.len() {
                    me.ready.clear();
                    me.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut scratch = std::mem::take(&mut me.scratch);
            let mut rb = ReadBuf::new(&mut scratch);
            let polled = Pin::new(&mut me.inner).poll_read(cx, &mut rb);
            let n = rb.filled().len();
            if let Poll::Ready(Ok(())) = polled {
                me.take_in(&scratch[..n]);
            }
            me.scratch = scratch;
            ready!(polled)?;
            if n == 0 {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// Reads a JSON-RPC message's top-level `id` and whether it is an answer
/// (`result` or `error`) or a request (`method`), byte by byte, keeping
/// nothing but a few bytes of the key and the `id` at hand.
#[derive(Default)]
struct IdScan {
    depth: u32,
    in_str: bool,
    escaped: bool,
    expect_key: bool,
    in_key: bool,
    after_key: bool,
    key: Vec<u8>,
    capturing: bool,
    value: Vec<u8>,
    id: Option<serde_json::Value>,
    answer: bool,
    request: bool,
    closed: bool,
}

/// The longest `id` kept (a longer one is not an id this client sent).
const MAX_ID: usize = 256;

impl IdScan {
    /// Everything needed is known, or the object has ended.
    fn done(&self) -> bool {
        self.closed || (self.id.is_some() && (self.answer || self.request))
    }

    /// The `id`, once the message is known to be an answer.
    fn answer_id(&self) -> Option<serde_json::Value> {
        if self.answer && !self.request {
            self.id.clone()
        } else {
            None
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.done() {
                return;
            }
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if self.capturing {
            if !self.in_str && self.depth == 1 && (b == b',' || b == b'}') {
                self.capturing = false;
                let id = serde_json::from_slice::<serde_json::Value>(&self.value)
                    .ok()
                    .filter(|v| v.is_number() || v.is_string());
                self.id = id;
            } else if self.value.len() < MAX_ID {
                self.value.push(b);
            }
        }
        if self.in_str {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_str = false;
                if self.in_key {
                    self.in_key = false;
                    self.after_key = true;
                }
                return;
            }
            if self.in_key && self.key.len() < 16 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_str = true;
                if self.depth == 1 && self.expect_key {
                    self.in_key = true;
                    self.expect_key = false;
                    self.key.clear();
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = b == b'{';
                }
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.closed = true;
                }
            }
            b',' if self.depth == 1 => self.expect_key = true,
            b':' if self.depth == 1 && self.after_key => {
                self.after_key = false;
                match self.key.as_slice() {
                    b"id" => {
                        self.capturing = true;
                        self.value.clear();
                    }
                    b"result" | b"error" => self.answer = true,
                    b"method" => self.request = true,
                    _ => {}
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A reader that hands out `data` in pieces of at most `piece` bytes.
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        piece: usize,
    }

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let n = self
                .piece
                .min(buf.remaining())
                .min(self.data.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    async fn through(data: &[u8], cap: usize, piece: usize) -> (String, usize) {
        let mut r = CappedLines::new(
            Pieces {
                data: data.to_vec(),
                at: 0,
                piece,
            },
            cap,
            "t",
        );
        let mut out = Vec::new();
        let mut most = 0;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = r.read(&mut buf).await.unwrap();
            most = most.max(r.ready.capacity());
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        (String::from_utf8(out).unwrap(), most)
    }

    #[tokio::test]
    async fn lines_within_the_cap_pass_unchanged() {
        let data = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n{\"a\":1}\n";
        for piece in [1, 3, 1000] {
            let (out, _) = through(data, 64, piece).await;
            assert_eq!(out.as_bytes(), data);
        }
    }

    #[tokio::test]
    async fn an_oversized_answer_becomes_an_error_answer_to_its_id() {
        let big = "x".repeat(5000);
        for (line, id) in [
            (
                format!("{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{{\"t\":\"{big}\"}}}}\n"),
                serde_json::json!(7),
            ),
            // The id after the result, as a string, with escapes before it.
            (
                format!("{{\"result\":{{\"t\":\"\\\"{big}\",\"id\":1}},\"id\":\"a-1\",\"jsonrpc\":\"2.0\"}}\n"),
                serde_json::json!("a-1"),
            ),
        ] {
            let data = format!("{line}{{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{{}}}}\n");
            let (out, _) = through(data.as_bytes(), 100, 333).await;
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.len(), 3, "{out}");
            assert_eq!(lines[0].len(), 100, "cut at the cap");
            let answer: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
            assert_eq!(answer["id"], id);
            assert_eq!(answer["error"]["code"], TOO_LARGE_CODE);
            assert_eq!(answer["error"]["data"]["kind"], TOO_LARGE_KIND);
            assert_eq!(lines[2], "{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{}}");
        }
    }

    #[tokio::test]
    async fn an_oversized_request_of_the_servers_is_only_dropped() {
        let big = "x".repeat(5000);
        let data =
            format!("{{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"m\",\"params\":\"{big}\"}}\nok\n");
        let (out, _) = through(data.as_bytes(), 100, 4096).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[1], "ok");
    }

    #[tokio::test]
    async fn what_is_held_is_bounded_by_the_chunk_not_the_line() {
        // 8 MiB in one line over a 1 KiB cap: nothing near the line's size
        // is ever held.
        let mut data = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"".to_vec();
        data.resize(8 << 20, b'y');
        data.extend_from_slice(b"\"}\n");
        let (out, most) = through(&data, 1024, 1 << 20).await;
        assert!(most <= CHUNK + 1024, "held {most} bytes");
        assert!(out.contains(TOO_LARGE_KIND));
    }
}
