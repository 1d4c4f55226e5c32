//! The scripted model: plays a manifest's `script`, one entry per model call,
//! so every behaviour a real provider can show (tool loops, parallel calls,
//! hangs, 429s, 5xx, malformed arguments, token usage, streaming) can be
//! provoked deterministically, without a network.
//!
//! # Guarantees
//!
//! - **Stateless per run.** A call plays the entry for `request.call_index`,
//!   after expanding `repeat: N` (the entry occupies N consecutive call
//!   indices) and `forever: true` (the entry answers every call from its
//!   position on; entries after it are never played). One model is built per
//!   agent spec and shared by all its runs through `Arc<dyn ChatModel>`; runs
//!   never see each other's progress.
//! - **Summary calls are entries too.** A run that compacts its transcript
//!   (see `crate::compaction`) makes the summary call with the next call
//!   index, so the script plays the summary as an entry of its own, placed
//!   right after the step that pushed the prompt past the threshold, and
//!   every later step plays one entry further on. A failing entry there
//!   (`fail: …`, `hang: true`) provokes a failed compaction.
//! - **Deterministic.** The same script and request give the same response:
//!   tool call ids are `call_{call_index}_{j}`, and usage a script leaves out
//!   is estimated from character counts (about four characters a token).
//! - **Cheap.** Everything that does not depend on the request (argument JSON,
//!   usage estimates, delta boundaries, the call-index map) is computed once
//!   in [`ScriptedModel::new`]. A call takes no lock, finds its entry in
//!   O(1) (a script without `repeat`/`forever`) or O(log n), and allocates
//!   only the response it returns.
//! - **Cancel-safe.** `latency` is a tokio sleep and `hang` a pending future:
//!   dropping the call abandons it, and paused-time tests drive both.
//!
//! This module knows nothing about actors, retries or budgets.
//!
//! The file stays whole: it is one model (the player and what it computes
//! up front), and half of its length is the tests that pin each key's
//! behaviour.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::ports::model::{
    ChatModel, ChatRequest, ChatResponse, Message, ModelError, ToolCallRequest,
};
use crate::ports::run::Usage;

mod script;
pub use script::{ScriptEntry, ScriptFailure, ScriptToolCall, ScriptUsage};

/// The argument text of a `fail: malformed` tool call: cut off mid-object,
/// so it is never valid JSON.
const MALFORMED_ARGUMENTS: &str = r#"{"a": 2, "b":"#;

/// Streamed text is split into at most this many deltas.
const DELTA_CHUNKS: usize = 4;

/// A [`ChatModel`] that plays a fixed script (see the module doc).
///
/// Cloning is cheap: the prepared script is shared.
#[derive(Clone, Debug)]
pub struct ScriptedModel {
    plan: Arc<Plan>,
}

/// The script, prepared for lookup by call index.
#[derive(Debug)]
struct Plan {
    /// The playable entries, in script order (nothing after a `forever`).
    steps: Box<[Step]>,
    /// `ends[k]`: the first call index past step `k` (`u64::MAX` for a
    /// `forever` step). Non-decreasing.
    ends: Box<[u64]>,
    /// Every step occupies exactly one call index: step `k` answers call `k`.
    dense: bool,
}

/// One script entry with everything request-independent precomputed.
#[derive(Debug)]
struct Step {
    latency: Option<Duration>,
    outcome: Outcome,
    text: String,
    /// Byte offsets where the text's deltas start (the first delta, at 0,
    /// is implied).
    delta_cuts: Box<[usize]>,
    /// `(tool name, argument JSON)` of each tool call.
    calls: Box<[(Arc<str>, Arc<str>)]>,
    /// Usage the script gave, if any.
    usage: Option<Usage>,
    /// Output tokens estimated from the response's text and arguments.
    output_estimate: u64,
    /// The text holds [`TOOL_RESULT`]: filled in per request.
    echoes: bool,
}

/// In a script entry's text, replaced by the last tool result the model
/// was shown (so a scripted agent can answer with what a tool said).
pub const TOOL_RESULT: &str = "{{tool_result}}";

/// What a step does once its latency has passed.
#[derive(Debug)]
enum Outcome {
    /// Answer with the text and tool calls.
    Answer,
    /// Answer with the text and one tool call whose arguments are not JSON,
    /// named after this tool (or the request's first tool when `None`).
    Malformed { tool: Option<String> },
    /// Never answer.
    Hang,
    /// Fail with a provider error.
    Fail(ModelError),
}

impl ScriptedModel {
    /// Prepares a script. Entries are taken as written, without the
    /// manifest's checks: a `repeat: 0` entry is never played, `forever`
    /// wins over `repeat`, and entries after a `forever` one are dropped
    /// (they could never be reached).
    pub fn new(script: Vec<ScriptEntry>) -> Self {
        let mut steps = Vec::with_capacity(script.len());
        let mut ends = Vec::with_capacity(script.len());
        let mut dense = true;
        let mut end: u64 = 0;
        for entry in script {
            let forever = entry.forever;
            let count = u64::from(entry.repeat.unwrap_or(1));
            dense &= !forever && count == 1;
            end = if forever {
                u64::MAX
            } else {
                end.saturating_add(count)
            };
            steps.push(Step::prepare(entry));
            ends.push(end);
            if forever {
                break;
            }
        }
        ScriptedModel {
            plan: Arc::new(Plan {
                steps: steps.into_boxed_slice(),
                ends: ends.into_boxed_slice(),
                dense,
            }),
        }
    }

    /// The step that answers call `index` (0-based), if the script reaches it.
    fn step(&self, index: u32) -> Option<&Step> {
        let plan = &*self.plan;
        if plan.dense {
            return plan.steps.get(index as usize);
        }
        let at = u64::from(index);
        let k = plan.ends.partition_point(|&end| end <= at);
        plan.steps.get(k)
    }
}

impl Step {
    fn prepare(entry: ScriptEntry) -> Step {
        let ScriptEntry {
            text,
            tool,
            args,
            tools,
            latency,
            hang,
            fail,
            usage,
            ..
        } = entry;
        let text = text.unwrap_or_default();
        let outcome = if hang {
            Outcome::Hang
        } else {
            match fail {
                None => Outcome::Answer,
                Some(ScriptFailure::RateLimited) => {
                    Outcome::Fail(ModelError::RateLimited { retry_after: None })
                }
                Some(ScriptFailure::Server) => Outcome::Fail(ModelError::Server {
                    status: 500,
                    message: "scripted server error".to_string(),
                }),
                Some(ScriptFailure::BadRequest) => {
                    Outcome::Fail(ModelError::BadRequest("scripted bad request".to_string()))
                }
                Some(ScriptFailure::Malformed) => Outcome::Malformed {
                    tool: tool.clone().or_else(|| {
                        tools
                            .as_ref()
                            .and_then(|t| t.first())
                            .map(|c| c.tool.clone())
                    }),
                },
            }
        };
        let mut calls: Vec<(Arc<str>, Arc<str>)> = Vec::new();
        if matches!(outcome, Outcome::Answer) {
            if let Some(name) = tool {
                calls.push((name.into(), arguments_text(args.as_ref()).into()));
            }
            for call in tools.into_iter().flatten() {
                calls.push((call.tool.into(), arguments_text(Some(&call.args)).into()));
            }
        }
        let argument_chars: usize = match outcome {
            Outcome::Malformed { .. } => MALFORMED_ARGUMENTS.chars().count(),
            _ => calls.iter().map(|(_, a)| a.chars().count()).sum(),
        };
        Step {
            echoes: text.contains(TOOL_RESULT),
            latency: latency.filter(|d| !d.is_zero()),
            outcome,
            delta_cuts: delta_cuts(&text),
            output_estimate: tokens_for(text.chars().count() + argument_chars),
            text,
            calls: calls.into_boxed_slice(),
            usage: usage.map(|u| Usage {
                input_tokens: u.input,
                output_tokens: u.output,
                ..Usage::default()
            }),
        }
    }

    /// Streams the text to the request's delta sink, if it has one.
    fn stream(&self, request: &ChatRequest) {
        let Some(sink) = request.on_delta.as_ref() else {
            return;
        };
        if self.text.is_empty() {
            return;
        }
        let mut start = 0;
        for &cut in self
            .delta_cuts
            .iter()
            .chain(std::iter::once(&self.text.len()))
        {
            if let Some(piece) = self.text.get(start..cut) {
                sink(piece);
            }
            start = cut;
        }
    }

    /// The response to call `index`.
    fn respond(&self, request: &ChatRequest, malformed_tool: Option<&str>) -> ChatResponse {
        let index = request.call_index;
        let mut tool_calls =
            Vec::with_capacity(self.calls.len() + usize::from(malformed_tool.is_some()));
        for (j, (name, arguments)) in self.calls.iter().enumerate() {
            // Fresh text for every response, as a provider parses it: no
            // count shared by every run on the model to bounce between
            // threads.
            tool_calls.push(ToolCallRequest {
                id: call_id(index, j),
                name: Arc::from(&**name),
                arguments: Arc::from(&**arguments),
            });
        }
        if let Some(name) = malformed_tool {
            tool_calls.push(ToolCallRequest {
                id: call_id(index, 0),
                name: name.into(),
                arguments: MALFORMED_ARGUMENTS.into(),
            });
        }
        let usage = self.usage.unwrap_or_else(|| Usage {
            input_tokens: estimate_input(&request.messages),
            output_tokens: self.output_estimate,
            ..Usage::default()
        });
        // A script says nothing of why it stopped.
        ChatResponse {
            text: self.text.clone(),
            tool_calls,
            usage,
            finish_reason: None,
        }
    }
}

#[async_trait]
impl ChatModel for ScriptedModel {
    /// A script entry answers at once (or after its latency, a timer).
    fn answers_at_once(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "scripted"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let Some(step) = self.step(request.call_index) else {
            return Err(ModelError::BadRequest(format!(
                "scripted model has no entry for call {}",
                u64::from(request.call_index) + 1
            )));
        };
        if let Some(latency) = step.latency {
            tokio::time::sleep(latency).await;
        }
        let malformed_tool = match &step.outcome {
            Outcome::Answer => None,
            Outcome::Hang => return std::future::pending().await,
            Outcome::Fail(e) => return Err(e.clone()),
            Outcome::Malformed { tool } => Some(
                tool.as_deref()
                    .or_else(|| request.tools.first().map(|t| t.name.as_str()))
                    .unwrap_or("unknown"),
            ),
        };
        if step.echoes {
            let last = request
                .messages
                .iter()
                .rev()
                .find(|m| m.role == crate::ports::model::Role::Tool)
                .map_or("", |m| m.content.as_str());
            let text = step.text.replace(TOOL_RESULT, last);
            if let (Some(sink), false) = (request.on_delta.as_ref(), text.is_empty()) {
                sink(&text);
            }
            let mut response = step.respond(&request, malformed_tool);
            response.text = text;
            return Ok(response);
        }
        step.stream(&request);
        Ok(step.respond(&request, malformed_tool))
    }
}

/// The argument JSON of a scripted call (`{}` when the script gave none).
fn arguments_text(args: Option<&serde_json::Value>) -> String {
    match args {
        None | Some(serde_json::Value::Null) => "{}".to_string(),
        Some(v) => serde_json::to_string(v).unwrap_or_else(|_| "{}".to_string()),
    }
}

/// About four characters a token, and never zero.
/// The id of call `j` in the response to call `index`: `call_{index}_{j}`,
/// written in place, so the shared text is the one allocation.
fn call_id(index: u32, j: usize) -> Arc<str> {
    use std::io::Write;
    let mut buf = [0u8; 48];
    let mut cursor = &mut buf[..];
    let len = match write!(cursor, "call_{index}_{j}") {
        Ok(()) => 48 - cursor.len(),
        Err(_) => return Arc::from(format!("call_{index}_{j}")),
    };
    Arc::from(std::str::from_utf8(&buf[..len]).unwrap_or("call"))
}

fn tokens_for(chars: usize) -> u64 {
    (chars / 4).max(1) as u64
}

/// Input tokens estimated from the transcript: its text and tool-call
/// arguments.
fn estimate_input(messages: &[Message]) -> u64 {
    let chars: usize = messages
        .iter()
        .map(|m| {
            m.content.chars().count()
                + m.tool_calls
                    .iter()
                    .map(|c| c.arguments.chars().count())
                    .sum::<usize>()
        })
        .sum();
    tokens_for(chars)
}

/// Where the text's deltas start after the first: up to `DELTA_CHUNKS - 1`
/// word starts, spread evenly, so each delta keeps its trailing whitespace
/// and the deltas concatenate to the text.
fn delta_cuts(text: &str) -> Box<[usize]> {
    let len = text.len();
    let mut cuts = Vec::new();
    let mut prev_whitespace = false;
    for (i, c) in text.char_indices() {
        let whitespace = c.is_whitespace();
        if prev_whitespace && !whitespace && i >= len * (cuts.len() + 1) / DELTA_CHUNKS {
            cuts.push(i);
            if cuts.len() == DELTA_CHUNKS - 1 {
                break;
            }
        }
        prev_whitespace = whitespace;
    }
    cuts.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use std::sync::{Mutex, PoisonError};

    use serde_json::json;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;
    use crate::ports::model::Role;
    use crate::ports::model::ToolSpec;

    fn request(call_index: u32) -> ChatRequest {
        ChatRequest {
            messages: Arc::new(vec![Message::text(Role::User, "hi")]),
            tools: Arc::from(Vec::<ToolSpec>::new()),
            call_index,
            response_schema: None,
            on_delta: None,
            deadline: None,
            on_retry: None,
            options: None,
            observer: None,
        }
    }

    fn text(t: &str) -> ScriptEntry {
        ScriptEntry {
            text: Some(t.to_string()),
            ..Default::default()
        }
    }

    fn failing(kind: ScriptFailure) -> ScriptEntry {
        ScriptEntry {
            fail: Some(kind),
            ..Default::default()
        }
    }

    async fn play(model: &ScriptedModel, call_index: u32) -> Result<ChatResponse, ModelError> {
        model.complete(request(call_index)).await
    }

    #[tokio::test]
    async fn the_tool_result_placeholder_is_filled_from_the_last_tool_message() -> TestResult {
        let model = ScriptedModel::new(vec![text("It is {{tool_result}}.")]);
        let mut req = request(0);
        let mut tool = Message::text(Role::Tool, "12:00");
        tool.tool_call_id = Some("c".into());
        req.messages = Arc::new(vec![Message::text(Role::User, "time?"), tool]);
        assert_eq!(model.complete(req).await?.text, "It is 12:00.");
        Ok(())
    }

    #[tokio::test]
    async fn text_entry_answers_text() -> TestResult {
        let model = ScriptedModel::new(vec![text("hello")]);
        assert_eq!(model.name(), "scripted");
        let r = play(&model, 0).await?;
        assert_eq!(r.text, "hello");
        assert!(r.tool_calls.is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn single_tool_call_serializes_args() -> TestResult {
        let model = ScriptedModel::new(vec![
            ScriptEntry {
                tool: Some("add".into()),
                args: Some(json!({"a": 2, "b": 3})),
                ..Default::default()
            },
            ScriptEntry {
                tool: Some("noop".into()),
                text: Some("thinking".into()),
                ..Default::default()
            },
        ]);
        let r = play(&model, 0).await?;
        assert_eq!(r.text, "");
        assert_eq!(r.tool_calls.len(), 1);
        let call = &r.tool_calls[0];
        assert_eq!((&*call.id, &*call.name), ("call_0_0", "add"));
        let args: serde_json::Value = serde_json::from_str(&call.arguments)?;
        assert_eq!(args, json!({"a": 2, "b": 3}));

        let r = play(&model, 1).await?;
        assert_eq!(r.text, "thinking");
        assert_eq!(&*r.tool_calls[0].arguments, "{}");
        assert_eq!(&*r.tool_calls[0].id, "call_1_0");
        Ok(())
    }

    #[tokio::test]
    async fn parallel_tool_calls_have_distinct_ids() -> TestResult {
        let model = ScriptedModel::new(vec![ScriptEntry {
            tools: Some(vec![
                ScriptToolCall {
                    tool: "add".into(),
                    args: json!({"a": 1, "b": 2}),
                },
                ScriptToolCall {
                    tool: "upper".into(),
                    args: json!({"text": "x"}),
                },
            ]),
            ..Default::default()
        }]);
        let r = play(&model, 0).await?;
        let got: Vec<_> = r
            .tool_calls
            .iter()
            .map(|c| (&*c.id, &*c.name, &*c.arguments))
            .collect();
        assert_eq!(
            got,
            vec![
                ("call_0_0", "add", r#"{"a":1,"b":2}"#),
                ("call_0_1", "upper", r#"{"text":"x"}"#)
            ]
        );
        Ok(())
    }

    #[tokio::test]
    async fn repeat_occupies_consecutive_calls() -> TestResult {
        let model = ScriptedModel::new(vec![
            ScriptEntry {
                repeat: Some(3),
                ..text("a")
            },
            text("b"),
            ScriptEntry {
                repeat: Some(2),
                ..text("c")
            },
        ]);
        let mut seen = String::new();
        for i in 0..6 {
            seen.push_str(&play(&model, i).await?.text);
        }
        assert_eq!(seen, "aaabcc");
        assert!(play(&model, 6).await.is_err());
        Ok(())
    }

    #[tokio::test]
    async fn forever_answers_every_later_call() -> TestResult {
        let model = ScriptedModel::new(vec![
            text("first"),
            ScriptEntry {
                forever: true,
                ..text("again")
            },
            text("never"),
        ]);
        assert_eq!(play(&model, 0).await?.text, "first");
        for i in [1, 2, 50, u32::MAX] {
            assert_eq!(play(&model, i).await?.text, "again");
        }
        Ok(())
    }

    #[tokio::test]
    async fn runs_sharing_a_model_do_not_interfere() -> TestResult {
        let model: Arc<dyn ChatModel> =
            Arc::new(ScriptedModel::new(vec![text("one"), text("two")]));
        assert_eq!(model.complete(request(0)).await?.text, "one");
        assert_eq!(model.complete(request(0)).await?.text, "one");
        assert_eq!(model.complete(request(1)).await?.text, "two");
        Ok(())
    }

    #[tokio::test]
    async fn every_fail_kind_maps_to_its_error() -> TestResult {
        let model = ScriptedModel::new(vec![
            failing(ScriptFailure::RateLimited),
            failing(ScriptFailure::Server),
            failing(ScriptFailure::BadRequest),
        ]);
        assert_eq!(
            play(&model, 0).await,
            Err(ModelError::RateLimited { retry_after: None })
        );
        assert!(matches!(
            play(&model, 1).await,
            Err(ModelError::Server { status: 500, .. })
        ));
        assert!(matches!(
            play(&model, 2).await,
            Err(ModelError::BadRequest(_))
        ));
        Ok(())
    }

    #[tokio::test]
    async fn malformed_is_a_tool_call_with_invalid_json() -> TestResult {
        let model = ScriptedModel::new(vec![
            ScriptEntry {
                tool: Some("add".into()),
                ..failing(ScriptFailure::Malformed)
            },
            failing(ScriptFailure::Malformed),
        ]);
        let r = play(&model, 0).await?;
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(&*r.tool_calls[0].name, "add");
        assert!(serde_json::from_str::<serde_json::Value>(&r.tool_calls[0].arguments).is_err());

        // No tool in the entry: the request's first tool, else "unknown".
        assert_eq!(&*play(&model, 1).await?.tool_calls[0].name, "unknown");
        let mut req = request(1);
        req.tools = Arc::from(vec![ToolSpec {
            name: "upper".into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        }]);
        let r = model.complete(req).await?;
        assert_eq!(&*r.tool_calls[0].name, "upper");
        assert!(serde_json::from_str::<serde_json::Value>(&r.tool_calls[0].arguments).is_err());
        Ok(())
    }

    #[tokio::test]
    async fn deltas_concatenate_to_the_text() -> TestResult {
        let texts = [
            "The quick brown fox jumps over the lazy dog, twice  and\tthen\nonce more.",
            "  leading and trailing  ",
            "word",
            "héllo wörld ünïcode ok",
        ];
        for t in texts {
            let model = ScriptedModel::new(vec![text(t)]);
            let seen = Arc::new(Mutex::new(Vec::<String>::new()));
            let sink = seen.clone();
            let mut req = request(0);
            req.on_delta = Some(Arc::new(move |d: &str| {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(d.to_string())
            }));
            let r = model.complete(req).await?;
            let deltas = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
            assert_eq!(deltas.concat(), r.text);
            assert!(
                !deltas.is_empty() && deltas.len() <= DELTA_CHUNKS,
                "{deltas:?}"
            );
            assert!(deltas.iter().all(|d| !d.is_empty()));
            if t.starts_with("The quick") {
                assert!(deltas.len() > 1, "{deltas:?}");
            }
        }
        Ok(())
    }

    #[tokio::test]
    async fn no_deltas_without_text() -> TestResult {
        let model = ScriptedModel::new(vec![ScriptEntry {
            tool: Some("add".into()),
            ..Default::default()
        }]);
        let count = Arc::new(Mutex::new(0));
        let sink = count.clone();
        let mut req = request(0);
        req.on_delta = Some(Arc::new(move |_: &str| {
            *sink.lock().unwrap_or_else(PoisonError::into_inner) += 1
        }));
        model.complete(req).await?;
        assert_eq!(*count.lock().unwrap_or_else(PoisonError::into_inner), 0);
        Ok(())
    }

    #[tokio::test]
    async fn usage_is_reported_as_given() -> TestResult {
        let model = ScriptedModel::new(vec![ScriptEntry {
            usage: Some(ScriptUsage {
                input: 120,
                output: 8,
            }),
            ..text("2+3=5")
        }]);
        let u = play(&model, 0).await?.usage;
        assert_eq!((u.input_tokens, u.output_tokens), (120, 8));
        Ok(())
    }

    #[tokio::test]
    async fn usage_is_estimated_when_absent() -> TestResult {
        let model = ScriptedModel::new(vec![
            text(&"x".repeat(40)),
            ScriptEntry {
                tool: Some("add".into()),
                args: Some(json!({"a": 2, "b": 3})), // {"a":2,"b":3}: 13 chars
                ..text("abc")
            },
        ]);
        let mut req = request(0);
        req.messages = Arc::new(vec![
            Message::text(Role::System, "s".repeat(20)),
            Message::text(Role::User, "u".repeat(20)),
        ]);
        let u = model.complete(req).await?.usage;
        assert_eq!((u.input_tokens, u.output_tokens), (10, 10));
        // "hi" is 2 chars: at least one token either way.
        let u = play(&model, 1).await?.usage;
        assert_eq!((u.input_tokens, u.output_tokens), (1, 4));
        Ok(())
    }

    #[tokio::test]
    async fn exhausted_script_is_a_bad_request() -> TestResult {
        let model = ScriptedModel::new(vec![text("only")]);
        assert_eq!(
            play(&model, 1).await,
            Err(ModelError::BadRequest(
                "scripted model has no entry for call 2".into()
            ))
        );
        let empty = ScriptedModel::new(Vec::new());
        assert!(matches!(
            play(&empty, 0).await,
            Err(ModelError::BadRequest(_))
        ));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn latency_delays_the_answer() -> TestResult {
        let model = ScriptedModel::new(vec![ScriptEntry {
            latency: Some(Duration::from_millis(500)),
            ..text("late")
        }]);
        let started = tokio::time::Instant::now();
        assert!(
            tokio::time::timeout(Duration::from_millis(499), play(&model, 0))
                .await
                .is_err()
        );
        let r = play(&model, 0).await?;
        assert_eq!(r.text, "late");
        assert!(started.elapsed() >= Duration::from_millis(999));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn hang_never_answers() -> TestResult {
        let model = ScriptedModel::new(vec![ScriptEntry {
            hang: true,
            latency: Some(Duration::from_millis(5)),
            ..Default::default()
        }]);
        let r = tokio::time::timeout(Duration::from_secs(3600), play(&model, 0)).await;
        assert!(r.is_err(), "a hanging call answered");
        Ok(())
    }

    #[test]
    fn delta_cuts_are_word_starts() {
        let t = "one two three four five six seven eight";
        let cuts = delta_cuts(t);
        assert!(!cuts.is_empty() && cuts.len() < DELTA_CHUNKS);
        for &c in cuts.iter() {
            assert!(t[..c].ends_with(' ') && !t[c..].starts_with(' '), "{c}");
        }
        assert!(delta_cuts("").is_empty());
    }
}
