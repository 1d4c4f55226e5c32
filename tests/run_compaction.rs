//! Context compaction (M6): past 0.7 × the context window the run has the
//! model summarize the middle of its transcript, and its next call sees the
//! system prompt, the first user turn, the summary and the recent tail; a
//! tool call is never separated from its results; a failed summary keeps
//! the transcript whole (a warning, and the run goes on); a summary longer
//! than what it replaces is not kept: the oldest turns are trimmed instead
//! (a warning), and the prompt shrinks; below the threshold, or without a
//! known window, nothing changes.
//!
//! The scripted model plays one entry per model call, and a summary call is
//! a model call: the script holds the summary as an entry of its own.
//! Reported `usage.input` drives the estimate (the last call's input tokens
//! plus chars/4 of what was appended since).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::compaction::{estimate_tokens, SUMMARY_HEADER, TRIMMED_HEADER};
use agentvisor::ports::model::{Message, Role};
use agentvisor::stores::MemoryAuditStore;
use agentvisor::{AgentSpec, Host, Invocation, KillReason, RunEvent, RunResult, RunStatus};
use support::RecordingModel;

/// A host with a recording model playing `yaml`, and its audit store.
async fn recorded(yaml: &str) -> (Host, AgentSpec, Arc<RecordingModel>, Arc<MemoryAuditStore>) {
    let spec = support::spec(yaml);
    let model = RecordingModel::new(&spec);
    let (host, store) =
        support::host_from(support::builder().model("recorded", model.clone())).await;
    (host, spec, model, store)
}

/// Runs `spec` with the prompt `go`: its result, its events, its audited events.
async fn run(
    host: &Host,
    store: &MemoryAuditStore,
    spec: AgentSpec,
) -> (RunResult, Vec<RunEvent>, Vec<RunEvent>) {
    let (r, events) = support::run_to_end(host, spec, Invocation::prompt("go")).await;
    let run_id = r.run_id;
    let audited = support::audited_events(&support::records(store, run_id).await);
    (r, events, audited)
}

/// An `upper` call whose text is `word` padded to 500 characters or more.
fn shout(word: &str, usage_input: u64) -> String {
    format!(
        "  - {{ tool: upper, args: {{ text: \"{word}{}\" }}, usage: {{ input: {usage_input}, output: 110 }} }}\n",
        "x".repeat(500)
    )
}

/// Three turns of one big `upper` call each, reporting `inputs` as their
/// prompts, then `rest` (the script's remaining entries).
fn manifest(limits: &str, inputs: [u64; 3], rest: &str) -> String {
    format!(
        "name: compacting\nmodel: recorded\nsystem: You shout.\ntools: [upper]\nlimits: {limits}\nscript:\n{}{}{}{rest}",
        shout("one", inputs[0]),
        shout("two", inputs[1]),
        shout("three", inputs[2]),
    )
}

fn compactions(events: &[RunEvent]) -> Vec<&RunEvent> {
    events
        .iter()
        .filter(|e| matches!(e, RunEvent::TranscriptCompacted { .. }))
        .collect()
}

fn warnings(events: &[RunEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Warning { kind, message } => Some((kind.clone(), message.clone())),
            _ => None,
        })
        .collect()
}

fn roles(messages: &[Message]) -> Vec<Role> {
    messages.iter().map(|m| m.role).collect()
}

/// Every tool result answers a call made before it in the same request,
/// and every call made is answered.
fn assert_pairs_whole(messages: &[Message]) {
    for (i, m) in messages.iter().enumerate() {
        if m.role == Role::Tool {
            let id = m.tool_call_id.as_deref().unwrap();
            assert!(
                messages[..i]
                    .iter()
                    .any(|a| a.tool_calls.iter().any(|c| *c.id == *id)),
                "tool result {id} has no call before it: {messages:#?}"
            );
        }
        for c in &m.tool_calls {
            assert!(
                messages[i..]
                    .iter()
                    .any(|t| t.tool_call_id.as_deref() == Some(&*c.id)),
                "call {} has no result: {messages:#?}",
                c.id
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn past_the_threshold_the_middle_becomes_a_summary() {
    // Window 1000: the threshold is 700 and the tail aims at 300 tokens
    // (one turn here). Before step 4 the estimate is 600 + ~257 appended.
    let yaml = manifest(
        "{ context_window: 1000 }",
        [100, 300, 600],
        "  - { text: \"SUMMARY: shouted one and two\", usage: { input: 250, output: 12 }, latency: 50ms }\n  - { text: done, usage: { input: 400, output: 2 } }\n",
    );
    let (host, spec, model, store) = recorded(&yaml).await;
    let (r, events, audited) = run(&host, &store, spec).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("done"));
    assert_eq!(r.iterations, 4, "a summary call is not an iteration");
    assert_eq!(model.calls(), 5, "three steps, the summary, the answer");

    // The summary call: instructions, then the task and the middle as text.
    let ask = model.request(3);
    assert_eq!(roles(&ask), [Role::System, Role::User]);
    assert!(ask[1].content.contains("go"), "the task is given");
    assert!(ask[1].content.contains("onexxx") && ask[1].content.contains("TWOXXX"));
    assert!(
        !ask[1].content.contains("three"),
        "the tail is not summarized"
    );

    // The next step: system + first user + summary + the latest turn.
    let next = model.request(4);
    assert_eq!(
        roles(&next),
        [
            Role::System,
            Role::User,
            Role::User,
            Role::Assistant,
            Role::Tool
        ]
    );
    assert_eq!(next[0].content, "You shout.");
    assert_eq!(next[1].content, "go");
    assert_eq!(
        next[2].content,
        format!("{SUMMARY_HEADER}\nSUMMARY: shouted one and two")
    );
    assert!(next[3].tool_calls[0].arguments.contains("three"));
    assert!(next[4].content.starts_with("THREE"));
    assert_pairs_whole(&next);

    // The summary's usage counts like any call's.
    assert_eq!(r.usage.input_tokens, 100 + 300 + 600 + 250 + 400);
    assert_eq!(r.usage.output_tokens, 3 * 110 + 12 + 2);

    // One recorded event, between the third turn and the fourth step.
    let kinds = support::kinds_without_deltas(&events);
    let at = kinds
        .iter()
        .position(|k| k == "transcript.compacted")
        .unwrap();
    assert_eq!(kinds[at - 1], "tool.result");
    assert_eq!(kinds[at + 1], "step.start");
    let found = compactions(&events);
    assert_eq!(found.len(), 1, "{kinds:?}");
    let RunEvent::TranscriptCompacted {
        iteration,
        messages_before,
        messages_after,
        tokens_before,
        tokens_after,
        usage,
        summary,
    } = found[0]
    else {
        unreachable!()
    };
    assert_eq!((*iteration, *messages_before, *messages_after), (4, 8, 5));
    assert!(*tokens_before > 700, "{tokens_before}");
    assert!(*tokens_after < 400, "{tokens_after}");
    assert_eq!((usage.input_tokens, usage.output_tokens), (250, 12));
    assert_eq!(summary, "SUMMARY: shouted one and two");
    assert_eq!(compactions(&audited), found, "the audit log has it too");
    assert!(warnings(&events).is_empty());
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_is_never_separated_from_its_results() {
    // The earlier turn's three results fit in the tail budget (300 tokens)
    // but their call does not: the tail must start after the whole turn.
    let long = "p".repeat(250);
    let yaml = format!(
        r#"
name: parallel
model: recorded
system: You shout.
tools: [upper]
limits: {{ context_window: 1000 }}
script:
  - tools:
      - {{ tool: upper, args: {{ text: "a{long}" }} }}
      - {{ tool: upper, args: {{ text: "b{long}" }} }}
      - {{ tool: upper, args: {{ text: "c{long}" }} }}
    usage: {{ input: 100, output: 200 }}
  - tools:
      - {{ tool: upper, args: {{ text: d }} }}
      - {{ tool: upper, args: {{ text: e }} }}
      - {{ tool: upper, args: {{ text: f }} }}
    usage: {{ input: 700, output: 20 }}
  - {{ text: "they shouted a, b and c" }}
  - {{ text: done }}
"#
    );
    let (host, spec, model, store) = recorded(&yaml).await;
    let (r, events, _) = run(&host, &store, spec).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(compactions(&events).len(), 1);
    assert_eq!(model.calls(), 4);
    let next = model.request(3);
    assert_eq!(
        roles(&next),
        [
            Role::System,
            Role::User,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Tool
        ]
    );
    assert!(next[2].content.starts_with(SUMMARY_HEADER));
    let ids: Vec<&str> = next[3].tool_calls.iter().map(|c| &*c.id).collect();
    assert_eq!(ids, ["call_1_0", "call_1_1", "call_1_2"]);
    assert_pairs_whole(&next);
    for i in 0..model.calls() {
        if i != 2 {
            assert_pairs_whole(&model.request(i));
        }
    }
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_summary_keeps_the_transcript_and_the_run_goes_on() {
    // The summary call fails; the step after it still passes the threshold
    // but does not try again at once.
    let yaml = manifest(
        "{ context_window: 1000 }",
        [100, 300, 600],
        &format!(
            "  - {{ fail: bad_request }}\n{}  - {{ text: done }}\n",
            shout("four", 900)
        ),
    );
    let (host, spec, model, store) = recorded(&yaml).await;
    let (r, events, audited) = run(&host, &store, spec).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("done"));
    assert_eq!(r.iterations, 5);
    assert_eq!(
        model.calls(),
        6,
        "three steps, the failed summary, two steps"
    );
    assert_eq!(roles(&model.request(3)), [Role::System, Role::User]);

    // The step after the failure sees the whole transcript.
    let whole = model.request(4);
    assert_eq!(whole.len(), 8, "{:?}", roles(&whole));
    assert_eq!(whole[..6], model.request(2)[..]);
    assert!(whole[6].tool_calls[0].arguments.contains("three"));
    assert_eq!(model.request(5).len(), 10);
    for i in [4, 5] {
        let summarized = model
            .request(i)
            .iter()
            .any(|m| m.content.starts_with(SUMMARY_HEADER));
        assert!(!summarized, "call {i}");
    }

    assert!(compactions(&events).is_empty());
    let w = warnings(&events);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].0, "compaction_failed");
    assert!(w[0].1.contains("bad_request"), "{}", w[0].1);
    assert_eq!(warnings(&audited), w, "the audit log has the warning");
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_summary_longer_than_its_input_is_dropped_and_the_oldest_turns_trimmed() {
    // A small model "summarizes" two turns (~520 tokens) in 1000 tokens:
    // keeping it would make the prompt bigger (and, next step, too big).
    let long = "This is a very detailed summary. ".repeat(125);
    let yaml = manifest(
        "{ context_window: 1000 }",
        [100, 300, 600],
        &format!(
            "  - {{ text: \"{long}\", usage: {{ input: 250, output: 1000 }} }}\n  - {{ text: done, usage: {{ input: 400, output: 2 }} }}\n"
        ),
    );
    let (host, spec, model, store) = recorded(&yaml).await;
    let (r, events, audited) = run(&host, &store, spec).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(
        model.calls(),
        5,
        "three steps, one summary call, the answer"
    );
    assert!(compactions(&events).is_empty(), "the summary was not kept");
    let w = warnings(&events);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].0, "transcript_trimmed");
    assert!(w[0].1.contains("not shorter"), "{}", w[0].1);
    assert_eq!(warnings(&audited), w);

    // The next request: the oldest turn is gone, a marker says so, the
    // latest turns are whole, and the prompt shrank under the threshold
    // with room for the reply.
    let before = model.request(2);
    let next = model.request(4);
    assert_eq!(
        roles(&next),
        [
            Role::System,
            Role::User,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::Tool
        ]
    );
    assert!(
        next[2].content.starts_with(TRIMMED_HEADER),
        "{}",
        next[2].content
    );
    assert!(next[3].tool_calls[0].arguments.contains("two"));
    assert!(next[5].tool_calls[0].arguments.contains("three"));
    assert!(!next.iter().any(|m| m.content.contains("very detailed")));
    assert_pairs_whole(&next);
    let tokens = estimate_tokens(&next);
    assert!(tokens * 100 <= 1000 * 70, "{tokens}");
    assert!(tokens < estimate_tokens(&before) + 300, "{tokens}");
    // The summary call's usage still counts.
    assert_eq!(r.usage.output_tokens, 3 * 110 + 1000 + 2);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn below_the_threshold_or_without_a_window_nothing_is_compacted() {
    let answer = "  - { text: done }\n";
    let cases = [
        // 300 + ~257 appended stays under 700.
        manifest("{ context_window: 1000 }", [100, 200, 300], answer),
        // No window: the scripted model has no price and the limits give none.
        manifest("{}", [100_000, 200_000, 900_000], answer),
        // 0 turns compaction off.
        manifest("{ context_window: 0 }", [100_000, 200_000, 900_000], answer),
    ];
    for yaml in cases {
        let (host, spec, model, store) = recorded(&yaml).await;
        let (r, events, audited) = run(&host, &store, spec).await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        assert_eq!(model.calls(), 4, "no summary call: {yaml}");
        assert_eq!(model.request(3).len(), 8, "the transcript is whole");
        assert!(compactions(&events).is_empty() && compactions(&audited).is_empty());
        assert!(warnings(&events).is_empty());
        host.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_summary_call_that_hangs_is_a_stall_like_any_call() {
    let yaml = manifest(
        "{ context_window: 1000, stall_timeout: 2s, max_runtime: 1h }",
        [100, 300, 600],
        "  - { hang: true }\n  - { text: done }\n",
    );
    let (host, spec, model, store) = recorded(&yaml).await;
    let started = tokio::time::Instant::now();
    let (r, _, _) = run(&host, &store, spec).await;
    assert_eq!(r.status, RunStatus::Killed, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Stalled));
    assert_eq!(model.calls(), 4);
    assert!(started.elapsed() < Duration::from_secs(10));
    host.shutdown().await;
}
