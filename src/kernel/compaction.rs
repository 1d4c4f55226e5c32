//! Context compaction (M6): when a run's prompt grows past 0.7 × the model's
//! context window, the middle of its transcript is summarized by the model
//! and replaced by the summary; the system prompt, the first user turn and
//! the recent tail stay as they were.
//!
#![doc = include_str!("../../docs/compaction.md")]

use crate::ports::model::{Message, Role};

/// Compaction starts when the estimated prompt passes this share of the
/// window (per cent).
pub const THRESHOLD_PERCENT: u64 = 70;

/// The kept tail aims at no more than this share of the window (per cent);
/// it always keeps the latest model turn, however long.
pub const TAIL_PERCENT: u64 = 30;

/// Summary calls per run at most.
pub const MAX_ATTEMPTS: u32 = 8;

/// After a failed summary call, this many steps are made before another try.
pub const FAILURE_PAUSE: u32 = 2;

/// What the summary message that replaces the middle starts with.
pub const SUMMARY_HEADER: &str = "[Summary of the earlier part of this conversation]";

/// What the marker message that stands for a trimmed middle starts with.
pub const TRIMMED_HEADER: &str = "[Earlier messages were dropped to fit the context window";

/// The room kept for the reply when the manifest gives no `max_tokens`: an
/// eighth of the window.
pub const REPLY_SHARE: u64 = 8;

/// The summary call's instructions.
const INSTRUCTIONS: &str = "You compress the working transcript of an AI agent so it fits its \
context window. Summarize the excerpt you are given so the agent can carry on its task without \
it: keep the facts it learned, the tool results that still matter (numbers, names, identifiers \
exactly), the decisions it made and what is still to do. Be brief. Answer with the summary \
only, as plain text.";

/// The window a run compacts against: `limit` (the run's
/// `limits.context_window`) when set, with `0` meaning never; else the
/// price table's window `table`.
pub fn window(limit: Option<u64>, table: Option<u64>) -> Option<u64> {
    match limit {
        Some(0) => None,
        Some(w) => Some(w),
        None => table.filter(|&w| w > 0),
    }
}

/// About four characters a token, rounded up.
pub fn estimate_tokens(messages: &[Message]) -> u64 {
    let chars: usize = messages.iter().map(message_chars).sum();
    chars.div_ceil(4) as u64
}

fn message_chars(m: &Message) -> usize {
    m.content.chars().count()
        + m.tool_calls
            .iter()
            .map(|c| c.name.chars().count() + c.arguments.chars().count())
            .sum::<usize>()
        + m.attachments
            .iter()
            .map(|a| {
                if a.is_image() {
                    1024
                } else {
                    a.content.chars().count()
                }
            })
            .sum::<usize>()
}

/// Where a transcript is cut: `[..head]` (the system prompt and the first
/// user turn) and `[tail..]` are kept, `[head..tail]` (never empty) is
/// summarized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The first message after the head.
    pub head: usize,
    /// The first message of the kept tail.
    pub tail: usize,
}

/// Plans the cut: the head runs through the first user message; the tail
/// starts at the latest assistant message (or, without one, the latest turn
/// boundary) and grows back over whole turns while it stays within
/// `tail_budget` estimated tokens. `None` when nothing lies between them.
pub fn plan(transcript: &[Message], tail_budget: u64) -> Option<Cut> {
    let head = transcript.iter().position(|m| m.role == Role::User)? + 1;
    let boundary = |i: usize| transcript[i].role != Role::Tool;
    let after_head = head + 1..transcript.len();
    let latest = after_head
        .clone()
        .rev()
        .find(|&i| transcript[i].role == Role::Assistant)
        .or_else(|| after_head.rev().find(|&i| boundary(i)))?;
    let mut tail = latest;
    let mut tokens: usize = transcript[latest..].iter().map(message_chars).sum();
    for i in (head + 1..latest).rev() {
        tokens += message_chars(&transcript[i]);
        if tokens.div_ceil(4) as u64 > tail_budget {
            break;
        }
        if boundary(i) {
            tail = i;
        }
    }
    Some(Cut { head, tail })
}

/// The summary call's transcript: the instructions, then one user message
/// with the task (the first user turn) and the excerpt as plain text. Plain
/// text rather than the original messages: the call offers no tools, and
/// some providers refuse tool calls in a request without tools.
pub fn summary_request(transcript: &[Message], cut: Cut) -> Vec<Message> {
    let task = transcript[..cut.head]
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .unwrap_or_default();
    let mut excerpt = String::new();
    for m in &transcript[cut.head..cut.tail] {
        let who = match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool result",
        };
        if let Some(id) = &m.tool_call_id {
            excerpt.push_str(&format!("[{who} for {id}]\n"));
        } else {
            excerpt.push_str(&format!("[{who}]\n"));
        }
        if !m.content.is_empty() {
            excerpt.push_str(&m.content);
            excerpt.push('\n');
        }
        for c in &m.tool_calls {
            excerpt.push_str(&format!("(called {} {}: {})\n", c.name, c.id, c.arguments));
        }
        excerpt.push('\n');
    }
    vec![
        Message::text(Role::System, INSTRUCTIONS),
        Message::text(
            Role::User,
            format!("The agent's task:\n{task}\n\nThe excerpt to summarize:\n\n{excerpt}"),
        ),
    ]
}

/// The compacted transcript: the head, one user message holding the
/// summary, the tail.
pub fn compacted(transcript: &[Message], cut: Cut, summary: &str) -> Vec<Message> {
    let mut out = Vec::with_capacity(cut.head + 1 + transcript.len() - cut.tail);
    out.extend_from_slice(&transcript[..cut.head]);
    out.push(Message::text(
        Role::User,
        format!("{SUMMARY_HEADER}\n{}", summary.trim()),
    ));
    out.extend_from_slice(&transcript[cut.tail..]);
    out
}

/// The transcript with its middle trimmed: `[head..end)` dropped (whole
/// turns, `end` at a turn boundary no later than `cut.tail`) and a marker
/// message in its place.
pub fn trimmed(transcript: &[Message], cut: Cut, end: usize) -> Vec<Message> {
    let dropped = end - cut.head;
    let mut out = Vec::with_capacity(cut.head + 1 + transcript.len() - end);
    out.extend_from_slice(&transcript[..cut.head]);
    out.push(Message::text(
        Role::User,
        format!("{TRIMMED_HEADER}: {dropped}.]"),
    ));
    out.extend_from_slice(&transcript[end..]);
    out
}

/// What a compaction came to ([`Compaction::settle`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Settled {
    /// The summary replaced the middle.
    Summarized {
        /// The new transcript.
        transcript: Vec<Message>,
        /// Its estimated prompt, in tokens.
        tokens_after: u64,
    },
    /// The middle was trimmed instead (the summary was not kept, or the
    /// summary call failed and the transcript did not fit).
    Trimmed {
        /// The new transcript.
        transcript: Vec<Message>,
        /// Messages dropped.
        dropped: usize,
        /// Its estimated prompt, in tokens.
        tokens_after: u64,
        /// Why the summary was not kept.
        why: String,
    },
    /// The summary call failed and the transcript still fits: it is kept
    /// whole.
    Kept {
        /// Why there is no summary.
        why: String,
    },
}

/// A compaction that is due: where to cut and the prompt's estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    /// Where to cut.
    pub cut: Cut,
    /// The estimated prompt, in tokens.
    pub tokens: u64,
}

/// One run's compaction state: its window, the prompt gauge, the attempt
/// bounds and the summary calls made (they take call indices).
#[derive(Debug)]
pub struct Compaction {
    window: Option<u64>,
    /// How many messages the last model call saw and the input tokens it
    /// reported.
    basis: Option<(usize, u64)>,
    attempts: u32,
    /// No attempt while fewer steps than this are done.
    not_before: u32,
    summary_calls: u32,
    pending: Option<Due>,
    /// Tokens kept free for the reply.
    reply_room: u64,
    /// The transcript's length right after the last compaction (none
    /// again before it grows).
    compacted_len: Option<usize>,
}

impl Compaction {
    /// The state of a run compacting against `window` (`None`: never).
    pub fn new(window: Option<u64>) -> Self {
        Compaction {
            window,
            basis: None,
            attempts: 0,
            not_before: 0,
            summary_calls: 0,
            pending: None,
            reply_room: window.map_or(0, |w| w / REPLY_SHARE),
            compacted_len: None,
        }
    }

    /// Keeps `max_tokens` (the manifest's cap on a reply) free for the
    /// reply instead of an eighth of the window (never more than half).
    pub fn reply_room(mut self, max_tokens: Option<u32>) -> Self {
        if let (Some(w), Some(m)) = (self.window, max_tokens) {
            self.reply_room = u64::from(m).min(w / 2);
        }
        self
    }

    /// Whether a prompt of `tokens` leaves room for the reply.
    fn fits(&self, tokens: u64) -> bool {
        self.window
            .is_none_or(|w| tokens.saturating_add(self.reply_room) <= w)
    }

    /// Decides what the compaction `due` of `transcript` comes to, given
    /// the summary (or why there is none): see the module doc. The caller
    /// applies it; the state notes the new transcript's length.
    pub fn settle(
        &mut self,
        transcript: &[Message],
        due: Due,
        summary: Result<&str, String>,
    ) -> Settled {
        let cut = due.cut;
        let why = match summary {
            Ok(text) => {
                let replaced = estimate_tokens(&transcript[cut.head..cut.tail]);
                let after = compacted(transcript, cut, text);
                let summary_tokens = estimate_tokens(&after[cut.head..cut.head + 1]);
                let tokens_after = estimate_tokens(&after);
                if summary_tokens < replaced && self.fits(tokens_after) {
                    self.compacted_len = Some(after.len());
                    self.replaced();
                    return Settled::Summarized {
                        transcript: after,
                        tokens_after,
                    };
                }
                if summary_tokens >= replaced {
                    format!(
                        "the summary ({summary_tokens} tokens) is not shorter than what it replaces ({replaced} tokens)"
                    )
                } else {
                    format!(
                        "with the summary the prompt ({tokens_after} tokens) leaves no room for the reply"
                    )
                }
            }
            Err(why) => {
                if self.fits(self.estimate(transcript)) {
                    return Settled::Kept { why };
                }
                format!("{why}, and the transcript does not fit the window")
            }
        };
        // Drop whole turns from the front of the middle until the prompt
        // is under the threshold (or the middle is gone).
        let target = self
            .window
            .map_or(0, |w| w.saturating_mul(THRESHOLD_PERCENT) / 100)
            .min(self.window.unwrap_or(0).saturating_sub(self.reply_room));
        let mut end = cut.head;
        let mut out = trimmed(transcript, cut, end);
        while end < cut.tail && estimate_tokens(&out) > target {
            end += 1;
            while end < cut.tail && transcript[end].role == Role::Tool {
                end += 1;
            }
            out = trimmed(transcript, cut, end);
        }
        self.compacted_len = Some(out.len());
        self.replaced();
        Settled::Trimmed {
            tokens_after: estimate_tokens(&out),
            dropped: end - cut.head,
            transcript: out,
            why,
        }
    }

    /// The call index of the next model call, after `steps_done` steps and
    /// the summary calls made so far.
    pub fn call_index(&self, steps_done: u32) -> u32 {
        steps_done.saturating_add(self.summary_calls)
    }

    /// Records what a model call saw (`sent` messages) and the input tokens
    /// it reported (0: none reported).
    pub fn observe(&mut self, sent: usize, input_tokens: u64) {
        self.basis = (input_tokens > 0).then_some((sent, input_tokens));
    }

    /// The estimated prompt of `transcript`, in tokens (see the module doc).
    pub fn estimate(&self, transcript: &[Message]) -> u64 {
        match self.basis {
            Some((sent, tokens)) if sent <= transcript.len() => {
                tokens + estimate_tokens(&transcript[sent..])
            }
            _ => estimate_tokens(transcript),
        }
    }

    /// Whether to compact before the step after `steps_done` steps.
    pub fn due(&self, steps_done: u32, transcript: &[Message]) -> Option<Due> {
        let window = self.window?;
        if self.attempts >= MAX_ATTEMPTS || steps_done < self.not_before || self.pending.is_some() {
            return None;
        }
        if self
            .compacted_len
            .is_some_and(|len| transcript.len() <= len)
        {
            return None;
        }
        let tokens = self.estimate(transcript);
        if tokens.saturating_mul(100) <= window.saturating_mul(THRESHOLD_PERCENT) {
            return None;
        }
        let cut = plan(transcript, window.saturating_mul(TAIL_PERCENT) / 100)?;
        Some(Due { cut, tokens })
    }

    /// A summary call for `due` starts after `steps_done` steps.
    pub fn started(&mut self, steps_done: u32, due: Due) {
        self.attempts += 1;
        self.summary_calls += 1;
        self.not_before = steps_done + 1;
        self.pending = Some(due);
    }

    /// The compaction in flight, taken when its call ends.
    pub fn take_pending(&mut self) -> Option<Due> {
        self.pending.take()
    }

    /// The summary call made after `steps_done` steps failed.
    pub fn failed(&mut self, steps_done: u32) {
        self.not_before = steps_done + 1 + FAILURE_PAUSE;
    }

    /// The transcript was replaced: the last call's count no longer applies.
    pub fn replaced(&mut self) {
        self.basis = None;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;
    use crate::ports::model::ToolCallRequest;

    fn text(role: Role, n: usize) -> Message {
        Message::text(role, "x".repeat(n))
    }

    fn calls(ids: &[&str], n: usize) -> Message {
        Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: ids
                .iter()
                .map(|id| ToolCallRequest {
                    id: (*id).into(),
                    name: "t".into(),
                    arguments: "a".repeat(n).into(),
                })
                .collect(),
            tool_call_id: None,
            attachments: Vec::new(),
        }
    }

    fn result(id: &str, n: usize) -> Message {
        Message {
            role: Role::Tool,
            content: "r".repeat(n),
            tool_calls: Vec::new(),
            tool_call_id: Some(id.into()),
            attachments: Vec::new(),
        }
    }

    /// Every tool result in `tail` answers a call made in `tail`.
    fn pairs_whole(tail: &[Message]) -> bool {
        tail.iter().enumerate().all(|(i, m)| {
            m.role != Role::Tool
                || tail[..i].iter().any(|a| {
                    a.tool_calls
                        .iter()
                        .any(|c| Some(&c.id) == m.tool_call_id.as_ref())
                })
        })
    }

    #[test]
    fn window_prefers_the_limit_and_zero_turns_it_off() {
        assert_eq!(window(None, Some(128_000)), Some(128_000));
        assert_eq!(window(Some(8_000), Some(128_000)), Some(8_000));
        assert_eq!(window(Some(0), Some(128_000)), None);
        assert_eq!(window(None, None), None);
        assert_eq!(window(None, Some(0)), None);
        assert_eq!(window(Some(500), None), Some(500));
    }

    #[test]
    fn the_estimate_adds_what_was_appended_to_the_reported_count() {
        let mut t = vec![text(Role::System, 40), text(Role::User, 40)];
        let mut c = Compaction::new(Some(1000));
        assert_eq!(c.estimate(&t), 20);
        c.observe(t.len(), 500);
        assert_eq!(c.estimate(&t), 500);
        t.push(text(Role::Assistant, 9));
        assert_eq!(c.estimate(&t), 503);
        c.observe(t.len(), 0);
        assert_eq!(c.estimate(&t), 23);
        c.observe(3, 600);
        c.replaced();
        assert_eq!(c.estimate(&t), 23);
    }

    #[test]
    fn the_tail_never_starts_at_a_tool_result() {
        // Turns of one, two and three parallel calls, of varied sizes: for
        // every budget the cut keeps calls and their results together.
        let mut t = vec![text(Role::System, 10), text(Role::User, 10)];
        let mut k = 0;
        for (turn, width) in [1usize, 3, 2, 1, 3].iter().enumerate() {
            let ids: Vec<String> = (0..*width).map(|j| format!("c{turn}_{j}")).collect();
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            t.push(calls(&refs, 40 + turn * 13));
            for id in &ids {
                k += 1;
                t.push(result(id, 30 + k * 7));
            }
            if turn == 2 {
                t.push(text(Role::User, 20));
            }
        }
        for budget in 0..400 {
            let cut = plan(&t, budget).expect("a middle");
            assert_eq!(cut.head, 2);
            assert!(cut.tail > cut.head && cut.tail < t.len());
            assert_ne!(t[cut.tail].role, Role::Tool, "budget {budget}");
            assert!(pairs_whole(&t[cut.tail..]), "budget {budget}");
            let out = compacted(&t, cut, "s");
            assert!(pairs_whole(&out), "budget {budget}");
            // The latest model turn is always kept.
            assert!(cut.tail <= t.len() - 4);
        }
        // A generous budget keeps more turns.
        assert!(plan(&t, 400).map(|c| c.tail) < plan(&t, 10).map(|c| c.tail));
    }

    #[test]
    fn nothing_to_cut_without_a_middle() {
        assert_eq!(plan(&[text(Role::System, 5)], 10), None);
        assert_eq!(
            plan(&[text(Role::System, 5), text(Role::User, 5)], 10),
            None
        );
        let one_turn = [
            text(Role::System, 5),
            text(Role::User, 5),
            calls(&["a"], 5),
            result("a", 5),
        ];
        assert_eq!(plan(&one_turn, 10), None);
    }

    #[test]
    fn compacted_keeps_head_summary_tail() {
        let t = vec![
            text(Role::System, 5),
            text(Role::User, 6),
            calls(&["a"], 5),
            result("a", 5),
            calls(&["b"], 5),
            result("b", 5),
        ];
        let cut = Cut { head: 2, tail: 4 };
        let out = compacted(&t, cut, " the gist \n");
        assert_eq!(out.len(), 5);
        assert_eq!(out[..2], t[..2]);
        assert_eq!(out[2].role, Role::User);
        assert_eq!(out[2].content, format!("{SUMMARY_HEADER}\nthe gist"));
        assert_eq!(out[3..], t[4..]);
        let ask = summary_request(&t, cut);
        assert_eq!(ask[0].role, Role::System);
        assert!(ask[1].content.contains(&"x".repeat(6)), "the task is given");
        assert!(ask[1].content.contains("[tool result for a]"));
        assert!(
            !ask[1].content.contains("for b]"),
            "the tail is not summarized"
        );
    }

    #[test]
    fn attempts_are_spaced_and_bounded() {
        let mut t = vec![text(Role::System, 4), text(Role::User, 4)];
        for i in 0..3 {
            t.push(calls(&[&format!("c{i}")], 400));
            t.push(result(&format!("c{i}"), 400));
        }
        let mut c = Compaction::new(Some(400));
        let due = c.due(3, &t).expect("over the threshold");
        assert_eq!(c.call_index(3), 3);
        c.started(3, due);
        assert_eq!(c.call_index(3), 4, "the step after takes the next index");
        assert_eq!(c.due(3, &t), None, "never twice before a step");
        assert_eq!(c.take_pending(), Some(due));
        c.failed(3);
        assert_eq!(c.due(4, &t), None);
        assert_eq!(c.due(5, &t), None);
        assert!(c.due(6, &t).is_some(), "retried after the pause");
        for steps in 6..6 + MAX_ATTEMPTS - 1 {
            let due = c.due(steps, &t).expect("due");
            c.started(steps, due);
            c.take_pending();
        }
        assert_eq!(c.due(100, &t), None, "bounded per run");
        assert_eq!(Compaction::new(None).due(3, &t), None);
    }

    #[test]
    fn a_summary_longer_than_its_input_is_not_kept_the_middle_is_trimmed() {
        let mut t = vec![text(Role::System, 40), text(Role::User, 40)];
        for i in 0..6 {
            t.push(calls(&[&format!("c{i}"), &format!("d{i}")], 300));
            t.push(result(&format!("c{i}"), 300));
            t.push(result(&format!("d{i}"), 300));
        }
        let window = 1400;
        let mut c = Compaction::new(Some(window));
        let due = c.due(6, &t).expect("over the threshold");
        c.started(6, due);
        c.take_pending();
        let long = "blah ".repeat(2000);
        let Settled::Trimmed {
            transcript,
            dropped,
            tokens_after,
            why,
        } = c.settle(&t, due, Ok(&long))
        else {
            panic!("a long summary is not kept")
        };
        assert!(why.contains("not shorter"), "{why}");
        assert!(dropped > 0 && dropped % 3 == 0, "whole turns: {dropped}");
        assert!(
            tokens_after * 100 <= window * THRESHOLD_PERCENT,
            "{tokens_after}"
        );
        assert!(tokens_after < estimate_tokens(&t));
        assert!(pairs_whole(&transcript));
        assert_eq!(transcript[..2], t[..2]);
        assert!(transcript[2].content.starts_with(TRIMMED_HEADER));
        assert_eq!(transcript.last(), t.last(), "the tail is kept");
        assert_eq!(
            c.due(6, &transcript),
            None,
            "never twice without new content"
        );
        let mut grown = transcript.clone();
        grown.push(text(Role::Assistant, 4000));
        assert!(c.due(7, &grown).is_some(), "new content may compact again");

        // A short summary is kept; a failed one keeps a transcript that fits.
        let mut c = Compaction::new(Some(window));
        let due = c.due(6, &t).expect("due");
        assert!(matches!(
            c.settle(&t, due, Ok("gist")),
            Settled::Summarized { .. }
        ));
        let mut c = Compaction::new(Some(100_000));
        assert!(matches!(
            c.settle(&t, due, Err("bad_request".into())),
            Settled::Kept { .. }
        ));
        let mut c = Compaction::new(Some(window));
        assert!(matches!(
            c.settle(&t, due, Err("bad_request".into())),
            Settled::Trimmed { .. }
        ));
    }

    #[test]
    fn below_the_threshold_is_not_due() {
        let t = vec![text(Role::System, 4), text(Role::User, 4)];
        let mut c = Compaction::new(Some(1000));
        c.observe(2, 700);
        assert_eq!(c.due(1, &t), None, "700 of 1000 does not pass 0.7");
        c.observe(2, 701);
        assert_eq!(c.due(1, &t), None, "passes, but there is no middle");
    }
}
