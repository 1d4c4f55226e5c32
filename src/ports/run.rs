//! The plain data every port and actor speaks about a run: its id, its
//! terminal [`RunResult`], the typed [`RunStatus`] and [`KillReason`], its
//! [`Usage`], steps and critic decisions. The events a caller streams are in
//! [`super::event`].
//!
//! Everything here is serde data with stable snake_case names: these names are
//! the CLI's JSON contract and the audit log's schema, so a rename is a
//! breaking change.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A run's identity: 128 bits, time-ordered (the high 48 bits are the Unix
/// millisecond it was minted), printed as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(pub u128);

impl RunId {
    /// Mints a new id: millisecond timestamp, a process-wide counter and a
    /// per-process random salt, so ids sort by creation and never collide
    /// within a process.
    pub fn new() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        static SALT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let salt = *SALT.get_or_init(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(unix_ms() as u128);
            h.write_u32(std::process::id());
            h.finish() & 0xFFFF_FFFF
        });
        let ms = (unix_ms() as u128) & 0xFFFF_FFFF_FFFF;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) as u128;
        RunId((ms << 80) | ((salt as u128) << 48) | (n & 0xFFFF_FFFF_FFFF))
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl RunId {
    /// The 32 lowercase hex digits, without the formatting machinery (ids
    /// are printed once per run on hot paths: audit rows, logs).
    pub fn to_hex(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = DIGITS[((self.0 >> (124 - 4 * i)) & 0xF) as usize];
        }
        out
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex();
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({self})")
    }
}

impl std::str::FromStr for RunId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u128::from_str_radix(s, 16).map(RunId)
    }
}

impl Serialize for RunId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Milliseconds since the Unix epoch, by the wall clock.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How a run ended. `rejected` and `dry_run` never reached a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunStatus {
    /// The model gave a final answer.
    Ok,
    /// The run failed: a provider error, tool errors, max iterations, a panic.
    Error,
    /// The hard deadline expired (kill reason `deadline`).
    Timeout,
    /// The critic or an operator killed the run (see the kill reason).
    Killed,
    /// The caller's budget ran out, before or during the run.
    BudgetExceeded,
    /// The caller cancelled the run or dropped its handle.
    Cancelled,
    /// Admission refused the run (concurrency cap, open circuit).
    Rejected,
    /// A dry run: validated, never executed.
    DryRun,
}

impl RunStatus {
    /// Every status, in a fixed order.
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Ok,
        RunStatus::Error,
        RunStatus::Timeout,
        RunStatus::Killed,
        RunStatus::BudgetExceeded,
        RunStatus::Cancelled,
        RunStatus::Rejected,
        RunStatus::DryRun,
    ];

    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Error => "error",
            RunStatus::Timeout => "timeout",
            RunStatus::Killed => "killed",
            RunStatus::BudgetExceeded => "budget_exceeded",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Rejected => "rejected",
            RunStatus::DryRun => "dry_run",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RunStatus {
    type Err = UnknownStatus;

    /// The status whose [`as_str`](RunStatus::as_str) is `s`.
    fn from_str(s: &str) -> Result<Self, UnknownStatus> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_string()))
    }
}

/// A name that is no [`RunStatus`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown status `{0}` (ok, error, timeout, killed, budget_exceeded, cancelled, rejected, dry_run)")]
pub struct UnknownStatus(pub String);

/// Why a run was killed. Recorded with the status, in the result and in the
/// audit log; the first kill wins (kills are sticky).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KillReason {
    /// No heartbeat within the stall timeout while a call was in flight.
    Stalled,
    /// The hard deadline expired.
    Deadline,
    /// The same tool call repeated past the repeat limit.
    Runaway,
    /// The caller's budget ran out mid-flight.
    Budget,
    /// A critic policy decided to kill.
    Policy,
    /// An operator (the run's handle, the CLI, the API) killed it.
    Operator,
    /// The parent run ended, so its children were killed.
    Parent,
}

impl KillReason {
    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::Stalled => "stalled",
            KillReason::Deadline => "deadline",
            KillReason::Runaway => "runaway",
            KillReason::Budget => "budget",
            KillReason::Policy => "policy",
            KillReason::Operator => "operator",
            KillReason::Parent => "parent",
        }
    }

    /// The terminal status a kill with this reason ends in.
    pub fn status(self) -> RunStatus {
        match self {
            KillReason::Deadline => RunStatus::Timeout,
            KillReason::Budget => RunStatus::BudgetExceeded,
            _ => RunStatus::Killed,
        }
    }
}

impl fmt::Display for KillReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The loop a run was caught in (the critic's loop detectors, see
/// `docs/critic.md`): carried by the critic's steer and kill
/// decisions and by the result of a run killed `runaway`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LoopKind {
    /// Identical consecutive calls (tool and canonical arguments).
    Repeat,
    /// The same call with the same result, again and again.
    SameObservation,
    /// The same tool ending in the same (normalised) error.
    SameError,
    /// A cycle of calls (A B A B …) with the same results.
    Cycle,
    /// The same call answering the same (normalised) result: polling.
    Poll,
    /// Steps with no new result and no new text.
    NoProgress,
    /// The same text repeated in the model's replies.
    Chant,
}

impl LoopKind {
    /// Every kind, in the order the critic checks them.
    pub const ALL: [LoopKind; 7] = [
        LoopKind::Repeat,
        LoopKind::SameObservation,
        LoopKind::SameError,
        LoopKind::Cycle,
        LoopKind::Poll,
        LoopKind::NoProgress,
        LoopKind::Chant,
    ];

    /// The stable snake_case name (the manifest's `critic.loops` key).
    pub fn as_str(self) -> &'static str {
        match self {
            LoopKind::Repeat => "repeat",
            LoopKind::SameObservation => "same_observation",
            LoopKind::SameError => "same_error",
            LoopKind::Cycle => "cycle",
            LoopKind::Poll => "poll",
            LoopKind::NoProgress => "no_progress",
            LoopKind::Chant => "chant",
        }
    }
}

impl fmt::Display for LoopKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Token usage, summed over a run's model calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, cache reads and writes included (providers normalize
    /// to this; Anthropic reports them apart).
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Of the prompt tokens, those read from a provider cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Of the prompt tokens, those written to a provider cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Reasoning tokens (part of the output on most providers).
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// Some of these counts are estimates (about four characters a token
    /// over the request and the reply): the server reported no usage for
    /// at least one call. Left out of JSON when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub estimated: bool,
}

/// A run's usage as its result reports it: its own model calls' (the
/// fields of [`Usage`], flattened, which it derefs to) and, apart, what
/// its model judges spent (`critic`: the critic's judge and the approval
/// judge), charged to the run's caller and budgets like its own calls but
/// not in [`Usage::total`]. Kept out of [`Usage`] itself, which every
/// step's event carries: those stay the size they were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunUsage {
    /// The run's own calls.
    #[serde(flatten)]
    pub own: Usage,
    /// The model judges' calls about the run; left out of JSON when no
    /// judge was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critic: Option<CriticUsage>,
}

impl RunUsage {
    /// The judges' cost in micro-dollars (0 when none was asked).
    pub fn critic_cost_micros(&self) -> u64 {
        self.critic.map_or(0, |c| c.cost_micros)
    }
}

impl From<Usage> for RunUsage {
    fn from(own: Usage) -> Self {
        RunUsage { own, critic: None }
    }
}

impl std::ops::Deref for RunUsage {
    type Target = Usage;
    fn deref(&self) -> &Usage {
        &self.own
    }
}

impl std::ops::DerefMut for RunUsage {
    fn deref_mut(&mut self) -> &mut Usage {
        &mut self.own
    }
}

/// The tokens and cost of the model judges asked about a run
/// ([`RunUsage::critic`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CriticUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Cost in integer micro-dollars (0 when the price is unknown).
    #[serde(default)]
    pub cost_micros: u64,
    /// Questions asked (a confirmation is one more).
    #[serde(default)]
    pub calls: u32,
}

impl CriticUsage {
    /// Adds another into this one (saturating).
    pub fn add(&mut self, other: &CriticUsage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cost_micros = self.cost_micros.saturating_add(other.cost_micros);
        self.calls = self.calls.saturating_add(other.calls);
    }

    /// Input plus output tokens (saturating).
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Usage {
    /// The most tokens one model call may claim, input and output each: a
    /// reply that reports more is malformed (no model reads or writes a
    /// billion tokens in one call), so one absurd report cannot lock a
    /// caller out of its budget.
    pub const MAX_CALL_TOKENS: u64 = 1_000_000_000;

    /// Input plus output tokens: what budgets count (saturating).
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds another usage into this one (saturating).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.estimated |= other.estimated;
    }

    /// Checks one call's usage as a provider reported it: no count past
    /// [`MAX_CALL_TOKENS`](Self::MAX_CALL_TOKENS). `Err` says which count
    /// and what it claimed.
    pub fn check_call(&self) -> Result<(), String> {
        let counts = [
            ("input", self.input_tokens),
            ("output", self.output_tokens),
            ("cache read", self.cache_read_tokens),
            ("cache write", self.cache_write_tokens),
            ("reasoning", self.reasoning_tokens),
        ];
        match counts.iter().find(|(_, n)| *n > Self::MAX_CALL_TOKENS) {
            Some((what, n)) => Err(format!(
                "the reply claims {n} {what} tokens, more than one call can use ({})",
                Self::MAX_CALL_TOKENS
            )),
            None => Ok(()),
        }
    }
}

/// One tool call the model asked for, refused ones included.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The model iteration (1-based) that asked for the call.
    pub iteration: u32,
    /// The tool's name as the model gave it.
    pub tool: Arc<str>,
    /// A short summary of the arguments (capped).
    pub args: String,
    /// Whether the tool ran and succeeded.
    pub ok: bool,
    /// The error, when not ok (`unknown_tool: …`, `invalid_arguments: …`, …).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// A short summary of the result (capped).
    #[serde(default)]
    pub result: String,
    /// Wall time of the call.
    pub duration_ms: u64,
}

/// What the critic (or an operator through it) decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CriticAction {
    /// A message was injected before the next model call.
    Steer,
    /// The hard deadline was pushed back.
    Extend,
    /// The iteration ceiling was raised.
    RaiseIterations,
    /// The run was killed.
    Kill,
    /// A tool call (or a final answer) was refused by a guard.
    Deny,
    /// A tool call was held for an operator's decision by a guard.
    Ask,
}

/// One critic decision, as it appears in the result, the event stream and
/// the audit log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CriticDecision {
    /// What was done.
    pub action: CriticAction,
    /// Why: `soft_timeout`, `stalled`, `runaway`, `deadline`, `operator`,
    /// `guard`, `output_guard`, …
    pub reason: String,
    /// Milliseconds since the run started.
    pub at_ms: u64,
    /// Extra detail: the steer text, the extension in ms, the new ceiling.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub detail: Option<String>,
    /// The loop that a steer or kill for `runaway` answers (`loop`).
    #[serde(rename = "loop", skip_serializing_if = "Option::is_none", default)]
    pub loop_kind: Option<LoopKind>,
}

/// Where a fork came from (`agentvisor fork`, `crate::fork`): the recorded
/// run and the step (model call) up to which its transcript was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    /// The recorded run.
    pub run_id: RunId,
    /// Steps 1 to `step` were taken from its recording; the fork went on
    /// live from step `step + 1`.
    pub step: u32,
}

/// The terminal record of a run. Partial output, steps and usage are kept
/// on every failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The run's id.
    pub run_id: RunId,
    /// The agent's name (from its manifest).
    pub agent: String,
    /// Who submitted it.
    #[serde(default)]
    pub caller_id: Option<String>,
    /// The parent run, for a sub-agent run.
    #[serde(default)]
    pub parent_run_id: Option<RunId>,
    /// The tree the run belongs to, when it is not its own root: the top
    /// run of a sub-agent's tree, or the pipeline of a phase (and of that
    /// phase's sub-agents). `None` for a run that is its own root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<RunId>,
    /// How it ended.
    pub status: RunStatus,
    /// Why it was killed, when it was.
    pub kill_reason: Option<KillReason>,
    /// The loop it was caught in, when it was killed `runaway` (`loop`:
    /// `repeat`, `same_observation`, `same_error`, `cycle`, `poll`,
    /// `no_progress`, `chant`).
    #[serde(rename = "loop", default, skip_serializing_if = "Option::is_none")]
    pub loop_kind: Option<LoopKind>,
    /// A stable snake_case error kind when not ok (`tool_errors`,
    /// `max_iterations`, `rate_limited`, `panic`, …).
    pub error_kind: Option<String>,
    /// A human-readable error message (never a secret).
    #[serde(default)]
    pub error: Option<String>,
    /// The final answer, or the last substantive assistant text on failure.
    pub output: Option<String>,
    /// Every tool call the model made, refused ones included.
    pub steps: Vec<StepRecord>,
    /// Model iterations performed.
    pub iterations: u32,
    /// Token usage: the run's own calls', and its model judges' apart
    /// (`usage.critic`).
    pub usage: RunUsage,
    /// Cost in integer micro-dollars (0 when the price is unknown), its
    /// model judges' included.
    pub cost_micros: u64,
    /// Every critic decision, in order.
    pub critic: Vec<CriticDecision>,
    /// Unix milliseconds when the run started executing.
    pub started_at: u64,
    /// Unix milliseconds when it ended.
    pub finished_at: u64,
    /// The recorded run and step this run was forked from; left out of
    /// JSON for a run that is no fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkOrigin>,
}

impl RunResult {
    /// Wall time from start to finish, in ms.
    pub fn duration_ms(&self) -> u64 {
        self.finished_at.saturating_sub(self.started_at)
    }
}

/// The bytes a step's argument and result summaries (and a `tool.call`
/// event's arguments) are capped to ([`cap_text`]).
pub const SUMMARY_BYTES: usize = 200;

/// Caps a string to `max` bytes on a char boundary, keeping head and tail
/// around a marker that says how much was cut.
pub fn cap_text(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let keep = max.saturating_sub(48) / 2;
    let mut head = keep.min(s.len());
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len().saturating_sub(keep);
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}…[{} bytes cut]…{}", &s[..head], tail - head, &s[tail..])
}

/// Argument texts longer than this are not kept whole in a run's records
/// (64 KiB: the longest the dispatcher accepts, so an argument text a tool
/// ran with is always kept whole; a longer one was refused).
pub const RECORDED_ARGUMENT_LIMIT: usize = 64 * 1024;

/// What an argument text past [`RECORDED_ARGUMENT_LIMIT`] is capped to in
/// the records: its head and tail, about 2 KiB each, and a marker.
pub const RECORDED_ARGUMENT_BYTES: usize = 4096;

/// A tool call's raw arguments as a run's records keep them: whole up to
/// [`RECORDED_ARGUMENT_LIMIT`] (returned as they are, shared), else capped
/// to [`RECORDED_ARGUMENT_BYTES`] like a tool result — head and tail around
/// a marker, `…[CUT bytes cut of FULL]…`, that records the full size, so
/// [`uncap_arguments`] gives back a text of the same length (replay refuses
/// it as the run did).
pub fn cap_arguments(args: &Arc<str>) -> Arc<str> {
    if args.len() <= RECORDED_ARGUMENT_LIMIT {
        return args.clone();
    }
    let (head, tail) = argument_cuts(args, args.len());
    Arc::from(format!(
        "{}…[{} bytes cut of {}]…{}",
        &args[..head],
        tail - head,
        args.len(),
        &args[tail..]
    ))
}

/// Where [`cap_arguments`] cuts a text of `full` bytes: the head's end and
/// the tail's start (on char boundaries of `s`).
fn argument_cuts(s: &str, full: usize) -> (usize, usize) {
    let keep = (RECORDED_ARGUMENT_BYTES - 64) / 2;
    let mut head = keep.min(s.len());
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = full.saturating_sub(keep).min(s.len());
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    (head, tail)
}

/// The inverse of [`cap_arguments`] as far as it goes: for a capped text,
/// one of the full length with the same head and tail (the cut part filled
/// in), which [`cap_arguments`] caps back to the same text; `None` for a
/// text that was not capped.
pub fn uncap_arguments(capped: &str) -> Option<String> {
    let keep = (RECORDED_ARGUMENT_BYTES - 64) / 2;
    for (at, _) in capped.match_indices("…[") {
        let rest = &capped[at + "…[".len()..];
        let Some((cut, rest)) = rest.split_once(" bytes cut of ") else {
            continue;
        };
        let Some((full, _)) = rest.split_once("]…") else {
            continue;
        };
        let (Ok(cut), Ok(full)) = (cut.parse::<usize>(), full.parse::<usize>()) else {
            continue;
        };
        let marker = format!("…[{cut} bytes cut of {full}]…");
        let head = &capped[..at];
        let Some(tail) = capped[at..].strip_prefix(marker.as_str()) else {
            continue;
        };
        if full <= RECORDED_ARGUMENT_LIMIT || head.len() + cut + tail.len() != full {
            continue;
        }
        // The cut is filled with ASCII but where a cut fell inside a
        // character: a 4-byte character there keeps the cut where it was.
        let mut filled = String::with_capacity(full);
        filled.push_str(head);
        let lead = keep.saturating_sub(head.len());
        let trail = (full - tail.len()).saturating_sub(full - keep);
        let mut middle = cut;
        if lead > 0 {
            filled.push('\u{10348}');
            middle -= 4;
        }
        let end = if trail > 0 { 4 } else { 0 };
        filled.extend(std::iter::repeat_n('x', middle.checked_sub(end)?));
        if trail > 0 {
            filled.push('\u{10348}');
        }
        filled.push_str(tail);
        return (filled.len() == full).then_some(filled);
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn arguments_past_the_limit_are_capped_with_their_size_and_uncap_to_the_same_length() {
        let small: Arc<str> = Arc::from("{\"a\":1}");
        assert!(Arc::ptr_eq(&cap_arguments(&small), &small));
        let edge: Arc<str> = Arc::from("y".repeat(RECORDED_ARGUMENT_LIMIT));
        assert_eq!(cap_arguments(&edge).len(), RECORDED_ARGUMENT_LIMIT);
        for text in [
            format!("{{\"a\":\"{}\"}}", "z".repeat(4 << 20)),
            // Cuts that fall inside characters.
            "é".repeat(40_000),
            format!("a{}", "€".repeat(30_000)),
        ] {
            let full: Arc<str> = Arc::from(text.as_str());
            let capped = cap_arguments(&full);
            assert!(capped.len() <= RECORDED_ARGUMENT_BYTES, "{}", capped.len());
            assert!(capped.contains(&format!("cut of {}]", text.len())));
            let head: String = text.chars().take(30).collect();
            let tail: String = text
                .chars()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            assert!(capped.starts_with(&head) && capped.ends_with(&tail));
            let back = uncap_arguments(&capped).unwrap_or_default();
            assert_eq!(back.len(), text.len());
            assert_eq!(cap_arguments(&Arc::from(back)), capped);
        }
        assert_eq!(uncap_arguments("{\"a\":\"…[3 bytes cut of 9]…\"}"), None);
    }

    use super::*;

    #[test]
    fn statuses_parse_from_their_names_and_serde_agrees() {
        for name in [
            "ok",
            "error",
            "timeout",
            "killed",
            "budget_exceeded",
            "cancelled",
            "rejected",
            "dry_run",
        ] {
            let status: RunStatus = name.parse().unwrap_or(RunStatus::Error);
            assert_eq!(status.as_str(), name);
            assert_eq!(
                serde_json::to_string(&status).unwrap_or_default(),
                format!("\"{name}\"")
            );
        }
        let e = "done".parse::<RunStatus>().err().map(|e| e.to_string());
        assert!(e
            .unwrap_or_default()
            .starts_with("unknown status `done` (ok, error"));
    }

    #[test]
    fn run_ids_are_unique_and_round_trip() {
        let a = RunId::new();
        let b = RunId::new();
        assert_ne!(a, b);
        assert_eq!(a.to_string().parse::<RunId>().ok(), Some(a));
        let json = serde_json::to_string(&a).unwrap_or_default();
        assert_eq!(json.len(), 34);
        for id in [
            RunId(0),
            RunId(u128::MAX),
            RunId(0x0123_4567_89ab_cdef << 60),
            a,
        ] {
            assert_eq!(id.to_string(), format!("{:032x}", id.0));
        }
    }

    #[test]
    fn cap_text_keeps_head_and_tail() {
        let s = "a".repeat(100) + &"b".repeat(100);
        let c = cap_text(&s, 100);
        assert!(c.len() < 120, "{}", c.len());
        assert!(c.starts_with("aaaa") && c.ends_with("bbbb") && c.contains("cut"));
        assert_eq!(cap_text("short", 100), "short");
        let u = "é".repeat(100);
        assert!(cap_text(&u, 61).contains("cut"));
    }
}
