//! What a run's model calls report while they are in flight: the run's
//! [`CallObserver`], made once per run for a model that streams
//! (`ChatModel::streams`). It lives in the call's task, not in the run's
//! handler, so everything it does is a message or a field behind a lock:
//!
//! - **Signs of life.** Every streamed chunk (text, tool-call arguments,
//!   reasoning) is a heartbeat for the run's critic (`Beat::Streaming`): the
//!   first of each call at once (it ends the call's first-token wait), the
//!   rest at most one per [`RunObserver::throttle`], so a fast stream costs
//!   the shard a few messages a second, not one per token.
//! - **Partial output.** Streamed text accumulates in the run's shared
//!   record as its last text, so a run that is killed, cancelled, timed out
//!   or cut off mid-stream keeps what it received as its output.
//! - **What a cut call used.** The call's streamed text is counted, and a
//!   usage the server reported mid-stream is kept, so a call cut before
//!   its end (a kill, a cancel, a stall, a deadline, a signal) is charged
//!   what arrived: the server's usage if it came, else an estimate (about
//!   four characters a token over the request and the text received),
//!   marked `estimated`. A call that received nothing is charged nothing.
//! - **Warnings.** A provider's fallback (`response_format_unsupported`) or
//!   estimate (`usage_estimated`) becomes one `warning` event per run and
//!   kind: a `Warned` message the run records in its own handler (so the
//!   record takes its `seq` in order).
//!
//! It holds no lock across a call and never blocks: a heartbeat and a
//! warning are messages through the run's shard.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{RunAddr, RunMsg};
use crate::actors::watch::Beat;
use crate::ports::model::{CallObserver, Message};
use crate::ports::run::Usage;
use crate::record::RunShared;

/// No heartbeat sent yet in the current call.
const NONE_YET: u64 = u64::MAX;

/// A run's observer of its model calls (see the module doc).
pub(crate) struct RunObserver {
    addr: RunAddr,
    shared: Arc<RunShared>,
    /// When the run started: heartbeat times are milliseconds since.
    base: Instant,
    throttle_ms: u64,
    /// When the last heartbeat of the current call was sent.
    last_beat_ms: AtomicU64,
    /// The current call has streamed no text yet.
    fresh: AtomicBool,
    /// Something arrived in the current call.
    arrived: AtomicBool,
    /// Characters of text the current call streamed.
    chars: AtomicU64,
    /// The usage the server reported in the current call, if it did.
    reported: Mutex<Option<Usage>>,
    /// The warning kinds this run has had.
    warned: Mutex<Vec<String>>,
}

impl RunObserver {
    /// An observer for the run at `addr`; heartbeats go out at most every
    /// `throttle` after a call's first.
    pub(crate) fn new(addr: RunAddr, shared: Arc<RunShared>, throttle: Duration) -> Self {
        RunObserver {
            addr,
            shared,
            base: Instant::now(),
            throttle_ms: throttle.as_millis().max(1) as u64,
            last_beat_ms: AtomicU64::new(NONE_YET),
            fresh: AtomicBool::new(true),
            arrived: AtomicBool::new(false),
            chars: AtomicU64::new(0),
            reported: Mutex::new(None),
            warned: Mutex::new(Vec::new()),
        }
    }

    /// The heartbeat interval for a run whose stall bounds are `stall` and
    /// `first_token`: an eighth of the shorter, at most a second.
    pub(crate) fn throttle(stall: Duration, first_token: Duration) -> Duration {
        (stall.min(first_token) / 8).min(Duration::from_secs(1))
    }

    /// A new model call starts: its first sign of life is sent at once,
    /// its first text replaces the run's last text.
    pub(crate) fn call_started(&self) {
        self.last_beat_ms.store(NONE_YET, Ordering::Relaxed);
        self.fresh.store(true, Ordering::Relaxed);
        self.arrived.store(false, Ordering::Relaxed);
        self.chars.store(0, Ordering::Relaxed);
        *self.reported.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The current call ended (answered or failed): nothing of it is left
    /// to charge as a cut call.
    pub(crate) fn call_ended(&self) {
        self.arrived.store(false, Ordering::Relaxed);
    }

    /// What the current call used, for a call cut before its end that was
    /// sent `messages`: the server's usage if it reported one (its output
    /// at least the text received), else an estimate, marked `estimated`.
    /// `None` when nothing arrived (the server may not have started).
    pub(crate) fn cut_usage(&self, messages: &[Message]) -> Option<Usage> {
        if !self.arrived.load(Ordering::Relaxed) {
            return None;
        }
        let received = self.chars.load(Ordering::Relaxed).div_ceil(4).max(1);
        let reported = *self.reported.lock().unwrap_or_else(|p| p.into_inner());
        Some(match reported {
            Some(mut u) => {
                if u.output_tokens < received {
                    u.output_tokens = received;
                    u.estimated = true;
                }
                if u.input_tokens == 0 {
                    u.input_tokens = crate::compaction::estimate_tokens(messages);
                    u.estimated = true;
                }
                u
            }
            None => Usage {
                input_tokens: crate::compaction::estimate_tokens(messages),
                output_tokens: received,
                estimated: true,
                ..Default::default()
            },
        })
    }
}

impl CallObserver for RunObserver {
    fn alive(&self) {
        self.arrived.store(true, Ordering::Relaxed);
        let now = self.base.elapsed().as_millis() as u64;
        let last = self.last_beat_ms.load(Ordering::Relaxed);
        let due = last == NONE_YET || now.saturating_sub(last) >= self.throttle_ms;
        if due
            && self
                .last_beat_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.addr.beat(Beat::Streaming);
        }
    }

    fn text(&self, piece: &str) {
        self.arrived.store(true, Ordering::Relaxed);
        self.chars
            .fetch_add(piece.chars().count() as u64, Ordering::Relaxed);
        let mut p = self.shared.partial();
        if self.fresh.swap(false, Ordering::Relaxed) {
            p.last_text = Some(piece.to_string());
        } else {
            p.last_text.get_or_insert_with(String::new).push_str(piece);
        }
    }

    fn usage(&self, usage: &Usage) {
        self.arrived.store(true, Ordering::Relaxed);
        let mut r = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        // A server reports in parts (Anthropic: input at the start, output
        // at the end): the larger of each count so far.
        let u = r.get_or_insert_with(Usage::default);
        u.input_tokens = u.input_tokens.max(usage.input_tokens);
        u.output_tokens = u.output_tokens.max(usage.output_tokens);
        u.cache_read_tokens = u.cache_read_tokens.max(usage.cache_read_tokens);
        u.cache_write_tokens = u.cache_write_tokens.max(usage.cache_write_tokens);
        u.reasoning_tokens = u.reasoning_tokens.max(usage.reasoning_tokens);
    }

    fn warning(&self, kind: &str, message: &str) {
        {
            let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
            if warned.iter().any(|k| k == kind) {
                return;
            }
            warned.push(kind.to_string());
        }
        tracing::warn!(run_id = %self.shared.run_id, kind, "{message}");
        self.addr.send(RunMsg::Warned {
            kind: kind.to_string(),
            message: message.to_string(),
        });
    }
}
