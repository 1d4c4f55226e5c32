//! The loop detectors: what the critic reads from a run's trace, each in
//! fixed memory and at a fixed cost a call, a step or a chunk of text.
//!
//! - `same_observation`: the same call (tool and canonical arguments) with
//!   the same result, counted over the trace ([`TRACE_LEN`] calls).
//! - `same_error`: the same tool ending in the same normalised error, its
//!   earlier calls walked back until one ended otherwise (a success, or
//!   another error), other tools' calls in between skipped.
//! - `cycle`: the calls and their results repeat with a period of 2 to 4
//!   (A B A B …); counted in periods, a run of one call repeated is not a
//!   cycle (that is `repeat`'s and `same_observation`'s).
//! - `poll`: the same call answering the same normalised result (digits,
//!   hex and ids masked), its earlier calls walked back until one answered
//!   otherwise, other calls in between skipped (a `sleep` between two
//!   polls does not hide them). A batch calls with other arguments each
//!   time and is never a poll.
//! - `no_progress`: steps in a row in which no call came back with an
//!   observation the trace did not hold and the model wrote no new text.
//! - `chant`: the same chunk of model text repeated in the last
//!   [`CHANT_WINDOW_CHUNKS`] chunks (see [`Chant`]).
//!
//! (`repeat`, identical consecutive calls, is counted as calls start; see
//! `Watched`.) A detector that sees its pattern flags it (`Detectors::due`:
//! the first of a step, unless a later one was steered already); the shard
//! asks the policy before the run's next model call. Memory: a few
//! counters inline; the trace's buffer (24 bytes a call, grown with the
//! run's first calls to 32 calls at most); the chant window (400 bytes),
//! allocated once, for a run whose replies hold a chunk of text long
//! enough to compare.

use crate::ports::critic::{
    LoopKinds, Loops, Trace, TraceStep, CHANT_CHUNK_CHARS, CHANT_WINDOW_CHUNKS, TRACE_LEN,
};
use crate::ports::run::LoopKind;

use super::digest;

/// A chunk of text shorter than this (without its ends' whitespace) is
/// not compared: a short line ("Done.") may recur in healthy text.
pub const CHANT_MIN_CHARS: usize = 20;

/// A tool call's outcome, as hashes (what the run reports to its critic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// See [`TraceStep::tool`].
    pub tool: u32,
    /// See [`TraceStep::call`].
    pub call: u32,
    /// See [`TraceStep::result`].
    pub result: u32,
    /// See [`TraceStep::normalised`].
    pub normalised: u32,
    /// Whether the call succeeded.
    pub ok: bool,
}

impl Observation {
    /// The outcome of a call of `tool` whose canonical hash is `call`:
    /// `text` is its result (or its error's message when not `ok`).
    pub fn of(tool: &str, call: u64, ok: bool, text: &str) -> Self {
        Observation {
            tool: digest::hash(tool),
            call: digest::fold(call),
            result: digest::hash(text),
            normalised: digest::normalised(text, !ok),
            ok,
        }
    }
}

/// The detectors' state of one run.
#[derive(Debug)]
pub struct Detectors {
    /// Thresholds (`0`: off).
    pub(crate) limits: Loops,
    /// The last calls.
    pub(crate) trace: Trace,
    /// For each period 2, 3, 4: calls in a row equal to the one a period
    /// before.
    cycle_runs: [u16; 3],
    /// Steps in a row without progress.
    stale_steps: u16,
    /// The current step made progress.
    step_new: bool,
    /// The current reply's text hash (0: no text).
    text: u32,
    /// The last non-empty reply's text hash.
    last_text: u32,
    chant: Option<Box<Chant>>,
    /// A loop seen and not yet decided on: its kind and count.
    pub(crate) due: Option<(LoopKind, u32)>,
    /// Loops steered already.
    pub(crate) steered: LoopKinds,
}

impl Detectors {
    /// Detectors with these thresholds and nothing seen.
    pub fn new(limits: Loops) -> Self {
        Detectors {
            limits,
            trace: Trace::default(),
            cycle_runs: [0; 3],
            stale_steps: 0,
            step_new: false,
            text: 0,
            last_text: 0,
            chant: None,
            due: None,
            steered: LoopKinds::default(),
        }
    }

    /// A detector saw its pattern `count` times: due if that reaches its
    /// threshold. The first of a step is decided on, except that a loop
    /// steered already goes before one that was not (it is the second
    /// strike: a run that goes on with it after the steer is killed).
    fn flag(&mut self, kind: LoopKind, count: u32) {
        let limit = u32::from(self.limits.get(kind));
        if limit == 0 || count < limit {
            return;
        }
        let replace = match self.due {
            None => true,
            Some((first, _)) => !self.steered.contains(first) && self.steered.contains(kind),
        };
        if replace {
            self.due = Some((kind, count));
        }
    }

    /// A model reply came back with `text`: its hash goes with the calls
    /// it asks for; new text is progress; its chunks go to `chant`.
    /// Returns whether it was new.
    pub fn reply(&mut self, text: &str) -> bool {
        // ASCII whitespace only: a byte scan, not a char decode.
        let trimmed = text.trim_ascii();
        self.text = if trimmed.is_empty() {
            0
        } else {
            digest::hash(trimmed)
        };
        let new = self.text != 0 && self.text != self.last_text;
        if self.text != 0 {
            self.last_text = self.text;
        }
        self.step_new |= new;
        if self.limits.chant > 0 && !trimmed.is_empty() {
            let most = Chant::read(&mut self.chant, text);
            self.flag(LoopKind::Chant, most);
        }
        new
    }

    /// A tool call came back. Returns whether its observation was new to
    /// the trace (progress).
    pub fn observe(&mut self, o: Observation) -> bool {
        let step = TraceStep {
            tool: o.tool,
            call: o.call,
            result: o.result,
            normalised: o.normalised,
            text: self.text,
            ok: o.ok,
        };
        let key = step.observation();
        // One pass back over the trace, newest first.
        let mut same_obs = 1u32;
        let (mut same_err, mut err_open) = (1u32, !o.ok);
        let (mut polls, mut poll_open) = (1u32, o.ok);
        for e in self.trace.iter() {
            if e.observation() == key {
                same_obs += 1;
            }
            if err_open && e.tool == o.tool {
                if !e.ok && e.normalised == o.normalised {
                    same_err += 1;
                } else {
                    err_open = false;
                }
            }
            if poll_open && e.call == o.call {
                if e.ok && e.normalised == o.normalised {
                    polls += 1;
                } else {
                    poll_open = false;
                }
            }
        }
        let new = same_obs == 1;
        // Cycles: is this call what it was a period ago?
        let mut cycle = None;
        for (i, p) in (2..=4usize).enumerate() {
            let again = self
                .trace
                .back(p - 1)
                .is_some_and(|e| e.observation() == key);
            if !again {
                self.cycle_runs[i] = 0;
                continue;
            }
            self.cycle_runs[i] = self.cycle_runs[i].saturating_add(1);
            let periods = u32::from(self.cycle_runs[i]) / p as u32 + 1;
            // Not one call repeated: the period holds another call.
            if cycle.is_none()
                && periods >= 2
                && (0..p - 1).any(|b| self.trace.back(b).is_some_and(|e| e.observation() != key))
            {
                cycle = Some(periods);
            }
        }
        self.trace.push(step);
        self.step_new |= new;
        self.flag(LoopKind::SameObservation, same_obs);
        if !o.ok {
            self.flag(LoopKind::SameError, same_err);
        }
        if let Some(periods) = cycle {
            self.flag(LoopKind::Cycle, periods);
        }
        if o.ok {
            self.flag(LoopKind::Poll, polls);
        }
        new
    }

    /// The step's calls have all come back: a step without progress
    /// counts toward `no_progress`.
    pub fn step_closed(&mut self) {
        if std::mem::take(&mut self.step_new) {
            self.stale_steps = 0;
        } else {
            self.stale_steps = self.stale_steps.saturating_add(1);
            self.flag(LoopKind::NoProgress, u32::from(self.stale_steps));
        }
    }
}

/// Memory and cost bounds the module doc promises.
const _: () = assert!(TRACE_LEN <= u8::MAX as usize);

/// The `chant` detector's window: the hashes of the last
/// [`CHANT_WINDOW_CHUNKS`] chunks of model text.
///
/// Text is cut into chunks at a line's end or a sentence's end (`.`, `!`
/// or `?` before whitespace) once a chunk holds [`CHANT_MIN_CHARS`], and
/// at [`CHANT_CHUNK_CHARS`] at most; runs of whitespace count as one
/// space. Cutting where the text says so, not at fixed offsets, lines up
/// the chunks of a repeated passage whatever its length. A code fence
/// (```` ``` ````), a table row (`|`), a list item (`-`, `*`, `+`, `1.`)
/// or a heading (`#`) empties the window, and code is not read: those
/// repeat by nature. Each reply ends its last chunk.
#[derive(Debug)]
pub struct Chant {
    ring: [u32; CHANT_WINDOW_CHUNKS],
    next: u8,
    len: u8,
}

impl Chant {
    /// Reads a reply's text into the window (made at its first chunk).
    /// Returns the most times one of its chunks was seen in the window.
    fn read(window: &mut Option<Box<Chant>>, text: &str) -> u32 {
        let mut most = 0;
        let mut in_code = false;
        let mut cut = Cutter::default();
        for line in text.split_inclusive('\n') {
            let head = line.trim_start();
            if head.starts_with("```") || head.starts_with("~~~") {
                in_code = !in_code;
                cut = Cutter::default();
                Self::reset(window);
                continue;
            }
            if in_code {
                continue;
            }
            if structured(head) {
                cut = Cutter::default();
                Self::reset(window);
                continue;
            }
            for c in line.chars() {
                if let Some(h) = cut.push(c) {
                    most = most.max(Self::count(window, h));
                }
            }
        }
        if let Some(h) = cut.end() {
            most = most.max(Self::count(window, h));
        }
        most
    }

    fn reset(window: &mut Option<Box<Chant>>) {
        if let Some(w) = window {
            w.len = 0;
        }
    }

    /// Counts a chunk (this one included) and remembers it.
    fn count(window: &mut Option<Box<Chant>>, h: u32) -> u32 {
        let w = window.get_or_insert_with(|| {
            Box::new(Chant {
                ring: [0; CHANT_WINDOW_CHUNKS],
                next: 0,
                len: 0,
            })
        });
        let seen = w.ring[..usize::from(w.len)]
            .iter()
            .filter(|&&x| x == h)
            .count() as u32;
        w.ring[usize::from(w.next)] = h;
        w.next = ((usize::from(w.next) + 1) % CHANT_WINDOW_CHUNKS) as u8;
        w.len = (usize::from(w.len) + 1).min(CHANT_WINDOW_CHUNKS) as u8;
        seen + 1
    }
}

const _: () = assert!(CHANT_WINDOW_CHUNKS <= u8::MAX as usize);

/// A line that is markup which repeats by nature: a table row, a list
/// item, a heading.
fn structured(head: &str) -> bool {
    let b = head.as_bytes();
    match b.first() {
        Some(b'|' | b'#') => true,
        Some(b'-' | b'*' | b'+') => b.get(1).is_some_and(|c| c.is_ascii_whitespace()),
        Some(c) if c.is_ascii_digit() => {
            let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
            matches!(b.get(digits), Some(b'.' | b')'))
                && b.get(digits + 1).is_some_and(|c| c.is_ascii_whitespace())
        }
        _ => false,
    }
}

/// Cuts text into chunks and hashes them as they fill (see [`Chant`]).
#[derive(Default)]
struct Cutter {
    h: u64,
    chars: usize,
    space: bool,
    sentence_end: bool,
}

impl Cutter {
    const START: u64 = 0xcbf2_9ce4_8422_2325;

    fn feed(&mut self, c: char) {
        if self.chars == 0 {
            self.h = Self::START;
        }
        let mut buf = [0u8; 4];
        for &b in c.encode_utf8(&mut buf).as_bytes() {
            self.h ^= u64::from(b);
            self.h = self.h.wrapping_mul(0x0100_0000_01b3);
        }
        self.chars += 1;
    }

    /// One more character; a chunk's hash when it completes one.
    fn push(&mut self, c: char) -> Option<u32> {
        if c.is_whitespace() {
            let at_end = c == '\n' || self.sentence_end;
            self.sentence_end = false;
            self.space = self.chars > 0;
            if at_end && self.chars >= CHANT_MIN_CHARS {
                return self.take();
            }
            return None;
        }
        if std::mem::take(&mut self.space) {
            self.feed(' ');
        }
        self.feed(c);
        self.sentence_end = matches!(c, '.' | '!' | '?');
        if self.chars >= CHANT_CHUNK_CHARS {
            return self.take();
        }
        None
    }

    /// The end of a reply: its last chunk, if long enough to compare.
    fn end(&mut self) -> Option<u32> {
        (self.chars >= CHANT_MIN_CHARS)
            .then(|| self.take())
            .flatten()
    }

    fn take(&mut self) -> Option<u32> {
        let h = digest::fold(self.h);
        *self = Cutter::default();
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::critic::LOOPS_DEFAULT;

    fn call(tool: &str, args: u64, ok: bool, text: &str) -> Observation {
        Observation::of(tool, args, ok, text)
    }

    fn step(d: &mut Detectors, text: &str, calls: &[Observation]) -> Option<(LoopKind, u32)> {
        d.reply(text);
        for c in calls {
            d.observe(*c);
        }
        d.step_closed();
        d.due.take()
    }

    #[test]
    fn a_batch_of_distinct_calls_is_never_flagged() {
        let mut d = Detectors::new(LOOPS_DEFAULT);
        for i in 0..200u64 {
            let r = format!("chunk {i}: {}", "x".repeat((i % 7) as usize));
            assert_eq!(
                step(&mut d, "", &[call("process", i, true, &r)]),
                None,
                "{i}"
            );
        }
    }

    #[test]
    fn two_failures_then_a_success_is_not_flagged() {
        let mut d = Detectors::new(LOOPS_DEFAULT);
        let e = "connection refused: 'api.example.com:443'";
        assert_eq!(step(&mut d, "", &[call("fetch", 1, false, e)]), None);
        assert_eq!(step(&mut d, "", &[call("fetch", 2, false, e)]), None);
        assert_eq!(step(&mut d, "", &[call("fetch", 3, true, "200 OK")]), None);
        // The success closed the streak: one more failure starts a new one.
        assert_eq!(step(&mut d, "", &[call("fetch", 4, false, e)]), None);
    }

    #[test]
    fn the_same_error_three_times_is_flagged() {
        let mut d = Detectors::new(crate::spec::LoopsSpec::default().resolve(3));
        let errs = [
            "parse error at line 3: unexpected '\"'",
            "parse error at line 7: unexpected '`'",
            "parse error at line 12: unexpected '$'",
        ];
        let mut due = None;
        for (i, e) in errs.iter().enumerate() {
            due = step(&mut d, "", &[call("shell", i as u64, false, e)]);
        }
        assert_eq!(due, Some((LoopKind::SameError, 3)));
    }

    #[test]
    fn polls_through_a_sleep_are_flagged() {
        let mut d = Detectors::new(LOOPS_DEFAULT);
        let mut due = None;
        for i in 0..5u64 {
            let status = format!("job 7 running, {} s elapsed", 30 * i);
            due = step(
                &mut d,
                "",
                &[
                    call("status", 7, true, &status),
                    call("sleep", 99, true, "slept"),
                ],
            );
            if due.is_some() {
                break;
            }
        }
        // `sleep` repeats exactly: same_observation sees it at its 4th.
        assert_eq!(due, Some((LoopKind::SameObservation, 4)));
        let mut d = Detectors::new(Loops {
            same_observation: 0,
            ..LOOPS_DEFAULT
        });
        let mut due = None;
        for i in 0..5u64 {
            let status = format!("job 7 running, {} s elapsed", 30 * i);
            due = step(
                &mut d,
                "",
                &[
                    call("status", 7, true, &status),
                    call("sleep", 99, true, "slept"),
                ],
            );
        }
        assert_eq!(due, Some((LoopKind::Poll, 5)));
    }

    #[test]
    fn a_cycle_of_two_is_flagged_at_its_third_period() {
        let mut d = Detectors::new(LOOPS_DEFAULT);
        let a = call("read", 1, true, "v1");
        let b = call("write", 2, true, "ok");
        let mut seen = Vec::new();
        for c in [a, b, a, b, a, b] {
            seen.push(step(&mut d, "", &[c]));
        }
        assert_eq!(seen[..5], [None, None, None, None, None]);
        assert_eq!(seen[5], Some((LoopKind::Cycle, 3)));
    }

    #[test]
    fn steps_without_anything_new_are_flagged() {
        let mut d = Detectors::new(Loops {
            same_observation: 0,
            cycle: 0,
            poll: 0,
            ..LOOPS_DEFAULT
        });
        let calls = [
            call("a", 1, true, "1"),
            call("b", 2, true, "2"),
            call("c", 3, true, "3"),
        ];
        // Three new observations, then the same ones in another order.
        let mut due = None;
        for i in 0..11 {
            due = step(&mut d, "", &[calls[(i * 2) % 3]]);
            if due.is_some() {
                assert_eq!(i, 10, "3 new steps, then 8 stale");
                break;
            }
        }
        assert_eq!(due, Some((LoopKind::NoProgress, 8)));
        // New text is progress.
        assert_eq!(step(&mut d, "something new", &[calls[0]]), None);
    }

    #[test]
    fn chanting_is_flagged_and_markup_is_not() {
        let mut d = Detectors::new(LOOPS_DEFAULT);
        let chant = "I will check the status again now. ".repeat(12);
        assert_eq!(step(&mut d, &chant, &[]), Some((LoopKind::Chant, 12)));

        let mut d = Detectors::new(LOOPS_DEFAULT);
        let table = "| name | value of the thing here |\n".repeat(30);
        let list = "- the same list item repeated here\n".repeat(30);
        let code = format!("```\n{}```\n", "println!(\"the same line\");\n".repeat(30));
        for text in [table, list, code] {
            assert_eq!(step(&mut d, &text, &[]), None);
        }
        // A unit of odd length with no punctuation lines up too.
        let mut d = Detectors::new(LOOPS_DEFAULT);
        let odd = "and so it goes on and on\n".repeat(11);
        assert_eq!(step(&mut d, &odd, &[]).map(|x| x.0), Some(LoopKind::Chant));
        // Healthy prose is not.
        let mut d = Detectors::new(LOOPS_DEFAULT);
        let prose: String = (0..100)
            .map(|i| format!("Sentence number {i} says something else. "))
            .collect();
        assert_eq!(step(&mut d, &prose, &[]), None);
        let words: String = (0..300).map(|i| format!("w{} ", i * 7919 % 1000)).collect();
        assert_eq!(step(&mut d, &words, &[]), None);
    }

    #[test]
    fn the_detectors_fit_in_a_fixed_size() {
        // Counters and two pointers inline; the trace's buffer bounded at
        // 32 calls of 24 bytes, whatever the run does.
        assert_eq!(std::mem::size_of::<TraceStep>(), 24);
        let size = std::mem::size_of::<Detectors>();
        assert!(size <= 96, "{size} bytes");
        let mut d = Detectors::new(LOOPS_DEFAULT);
        step(
            &mut d,
            "",
            &[call("t", 1, true, "r"), call("t", 2, true, "r")],
        );
        assert_eq!(d.trace.len(), 2);
        for i in 0..1000u64 {
            let text = "a reply long enough to be cut into chunks. ".repeat(3);
            step(&mut d, &text, &[call("t", i, true, "r")]);
        }
        assert_eq!(d.trace.len(), TRACE_LEN);
        assert_eq!(d.trace.back(0).map(|s| s.call), Some(digest::fold(999)));
        assert_eq!(d.trace.back(31).map(|s| s.call), Some(digest::fold(968)));
        assert_eq!(d.trace.back(32), None);
    }

    #[test]
    fn a_detector_at_zero_is_off() {
        let mut d = Detectors::new(Loops::OFF);
        for _ in 0..40 {
            assert_eq!(step(&mut d, "same", &[call("a", 1, false, "e")]), None);
        }
    }
}
