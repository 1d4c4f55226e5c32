//! The `wait` tool: it calls a tool of the run on a timer, without the
//! model, until the result meets a condition or time is up, or waits for
//! another run to end; the run beats meanwhile (no stall) and its deadline
//! holds; the tool it calls passes the checks of a direct call (the run's
//! tools, arguments, guards, approval). Time is tokio's paused clock.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::model::ToolSpec;
use agentvisor::ports::tool::{Tool, ToolContext, ToolError};
use agentvisor::{CriticAction, Invocation, KillReason, RunEvent, RunId, RunResult, RunStatus};
use async_trait::async_trait;
use serde_json::{json, Value};
use support::RecordingModel;

/// `status` {}: `{"state": "running", "n": N}` until its `done_at`-th
/// call, `{"state": "done", …}` from then on.
struct StatusTool {
    spec: ToolSpec,
    calls: AtomicUsize,
    done_at: usize,
}

impl StatusTool {
    fn new(done_at: usize) -> Arc<Self> {
        Arc::new(StatusTool {
            spec: ToolSpec {
                name: "status".into(),
                description: "A job's status.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {"job": {"type": "string"}},
                    "additionalProperties": false,
                }),
            },
            calls: AtomicUsize::new(0),
            done_at,
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Tool for StatusTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let state = if n >= self.done_at { "done" } else { "running" };
        Ok(json!({"state": state, "n": n}).to_string())
    }
}

struct Started {
    host: agentvisor::Host,
    model: Arc<RecordingModel>,
    status: Arc<StatusTool>,
    handle: agentvisor::RunHandle,
    events: agentvisor::RunEvents,
}

async fn start(yaml: &str, done_at: usize) -> Started {
    let spec = support::spec(yaml);
    let model = RecordingModel::new(&spec);
    let status = StatusTool::new(done_at);
    let (host, _store) = support::host_from(
        support::builder()
            .model("recorded", model.clone())
            .tool(status.clone()),
    )
    .await;
    let (handle, events) = host
        .submit_streaming(spec, Invocation::prompt("go"))
        .await
        .unwrap();
    Started {
        host,
        model,
        status,
        handle,
        events,
    }
}

/// The `wait` call's result as the model read it, parsed.
fn waited(model: &RecordingModel, call: usize) -> Value {
    let text = model.tool_messages(call).pop().expect("a tool message");
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

const POLL: &str = r#"
name: poller
model: recorded
tools: [status, wait]
limits: { stall_timeout: 2s, max_runtime: 10m, tool_timeout: 30s }
script:
  - { tool: wait, args: { tool: status, args: { job: ci }, until: { pointer: /state, equals: done }, every: 5s, timeout: 10m } }
  - { text: "the job is done" }
"#;

#[tokio::test(start_paused = true)]
async fn wait_calls_the_tool_until_its_result_changes_without_the_model() {
    let t0 = tokio::time::Instant::now();
    let s = start(POLL, 4).await;
    drop(s.events);
    let r = s.handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(s.status.calls(), 4, "the 4th call meets the condition");
    assert_eq!(s.model.calls(), 2, "the model is not asked meanwhile");
    let w = waited(&s.model, 1);
    assert_eq!(w["timed_out"], false, "{w}");
    assert_eq!(w["calls"], 4, "{w}");
    assert_eq!(w["result"], json!({"state": "done", "n": 4}), "{w}");
    assert_eq!(w["waited_ms"], 15_000, "{w}");
    // 15 s of waiting with a 2 s stall timeout: the wait beat meanwhile.
    assert!(t0.elapsed() >= Duration::from_secs(15));
    assert!(r.critic.is_empty(), "{:?}", r.critic);
    assert_eq!(r.steps.len(), 1, "one step: the wait");
    s.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn changes_compares_with_the_first_result() {
    let yaml = POLL.replace("equals: done", "changes: true");
    let s = start(&yaml, 4).await;
    drop(s.events);
    let r = s.handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let w = waited(&s.model, 1);
    assert_eq!(
        (w["calls"].clone(), w["timed_out"].clone()),
        (json!(4), json!(false)),
        "{w}"
    );
    s.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_times_out_returns_the_last_result() {
    let yaml = POLL.replace("timeout: 10m", "timeout: 12s");
    let s = start(&yaml, 1000).await;
    drop(s.events);
    let r = s.handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let w = waited(&s.model, 1);
    assert_eq!(w["timed_out"], true, "{w}");
    // Calls at 0, 5, 10 and 12 s: the last at the timeout.
    assert_eq!(w["calls"], 4, "{w}");
    assert_eq!(w["waited_ms"], 12_000, "{w}");
    assert_eq!(w["result"]["state"], "running", "{w}");
    s.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_keeps_the_run_alive_past_its_stall_timeout_but_not_past_its_deadline() {
    let yaml = POLL
        .replace(
            "max_runtime: 10m,",
            "max_runtime: 30s, hard_timeout: 30s, max_extensions: 0,",
        )
        .replace("every: 5s", "every: 7s");
    let t0 = tokio::time::Instant::now();
    let s = start(&yaml, 1000).await;
    drop(s.events);
    let r = s.handle.await;
    let lived = t0.elapsed();
    assert_eq!(r.status, RunStatus::Timeout, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    assert!(
        lived >= Duration::from_secs(30) && lived < Duration::from_secs(31),
        "{lived:?}"
    );
    // Calls at 0, 7, 14, 21 and 28 s, and none after the run ended.
    let calls = s.status.calls();
    assert_eq!(calls, 5);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(s.status.calls(), calls, "the wait ended with its run");
    s.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn wait_cannot_call_a_tool_the_agent_does_not_have() {
    // `status` is registered on the host, but this agent does not list it.
    let yaml = POLL.replace("tools: [status, wait]", "tools: [wait, echo]");
    let s = start(&yaml, 1).await;
    drop(s.events);
    let r = s.handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(s.status.calls(), 0);
    assert_eq!(
        s.model.tool_messages(1),
        ["error: unknown_tool: unknown tool `status`"]
    );
}

#[tokio::test(start_paused = true)]
async fn the_tool_a_wait_calls_passes_its_guards() {
    // max_calls counts every call the wait makes: the third is denied,
    // and the wait ends with the denial, a critic decision.
    let yaml = POLL.replace(
        "script:",
        "guard:\n  - { tool: status, max_calls: 2 }\nscript:",
    );
    let s = start(&yaml, 1000).await;
    drop(s.events);
    let r = s.handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(s.status.calls(), 2);
    let message = s.model.tool_messages(1).pop().unwrap();
    assert!(
        message.starts_with("error: guard_denied: `status` may be called at most 2 times"),
        "{message}"
    );
    let d: Vec<_> = r
        .critic
        .iter()
        .map(|d| (d.action, d.detail.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        d,
        [(
            CriticAction::Deny,
            "status: max_calls 2 reached (through wait)".to_string()
        )]
    );
    s.host.shutdown().await;

    // A deny rule refuses the wait when it is dispatched: nothing is called.
    let yaml = POLL.replace(
        "script:",
        "guard:\n  - { tool: status, args: { pointer: /job, matches: ci }, action: deny, reason: no CI }\nscript:",
    );
    let s = start(&yaml, 1).await;
    drop(s.events);
    let r = s.handle.await;
    assert_eq!(s.status.calls(), 0);
    assert_eq!(s.model.tool_messages(1), ["error: guard_denied: no CI"]);
    assert_eq!(
        r.critic[0].detail.as_deref(),
        Some("status: no CI (through wait)")
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_on_a_gated_tool_is_approved_once_for_all_its_calls() {
    let yaml = POLL.replace("script:", "approval: [status]\nscript:");
    let mut s = start(&yaml, 3).await;
    let run = s.handle.run_ref();
    while let Some(ev) = s.events.next().await {
        if let RunEvent::ApprovalRequested { tool, .. } = ev.event {
            assert_eq!(&*tool, "wait", "the wait is what parks");
            break;
        }
    }
    assert_eq!(s.status.calls(), 0, "nothing is called before the approval");
    run.approve(None).unwrap();
    let r = s.handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(s.status.calls(), 3);
    assert_eq!(run.pending_approvals().len(), 0);
    s.host.shutdown().await;
}

/// A manifest that sleeps `ms`, then answers.
fn sleeper(name: &str, ms: u64) -> String {
    format!(
        "name: {name}\ntools: [sleep]\nlimits: {{ stall_timeout: 1h, max_runtime: 1h, tool_timeout: 1h }}\nscript:\n  - {{ tool: sleep, args: {{ ms: {ms} }} }}\n  - {{ text: \"{name} done\" }}\n"
    )
}

/// A manifest that waits for run `id`, then answers with what it got.
fn waiter(id: RunId) -> String {
    format!(
        "name: waiter\ntools: [wait, sleep]\nlimits: {{ stall_timeout: 2s, max_runtime: 10m }}\nscript:\n  - {{ tool: sleep, args: {{ ms: 1000 }} }}\n  - {{ tool: wait, args: {{ run_id: \"{id}\", timeout: 5m }} }}\n  - {{ text: \"{{{{tool_result}}}}\" }}\n"
    )
}

fn waited_for(r: &RunResult) -> Value {
    serde_json::from_str(r.output.as_deref().unwrap_or("")).unwrap_or(Value::Null)
}

#[tokio::test(start_paused = true)]
async fn wait_for_a_child_run_returns_its_result() {
    let (host, _store) = support::host().await;
    let parent_id = RunId::new();
    let child_id = RunId::new();
    let parent = host
        .submit(
            support::spec(&waiter(child_id)),
            Invocation {
                run_id: Some(parent_id),
                ..Invocation::prompt("wait for the child")
            },
        )
        .await
        .unwrap();
    let child = host
        .submit(
            support::spec(&sleeper("child", 20_000)),
            Invocation {
                run_id: Some(child_id),
                parent_run_id: Some(parent_id),
                ..Invocation::prompt("work")
            },
        )
        .await
        .unwrap();
    let r = parent.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let w = waited_for(&r);
    assert_eq!(w["run_id"], child_id.to_string(), "{w}");
    assert_eq!(w["status"], "ok", "{w}");
    assert_eq!(w["output"], "child done", "{w}");
    assert_eq!(w["timed_out"], false, "{w}");
    // It waited the 19 s the child had left, beating (stall timeout 2 s).
    assert_eq!(w["waited_ms"], 19_000, "{w}");
    assert_eq!(child.await.status, RunStatus::Ok);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn wait_for_a_run_of_the_same_caller_but_not_of_another() {
    let (host, _store) = support::host().await;
    let as_caller = |caller: &str, prompt: &str| Invocation {
        caller_id: Some(caller.to_string()),
        ..Invocation::prompt(prompt)
    };
    let job = host
        .submit(
            support::spec(&sleeper("job", 5_000)),
            as_caller("ada", "work"),
        )
        .await
        .unwrap();
    let job_id = job.run_id();
    let mine = host
        .submit(support::spec(&waiter(job_id)), as_caller("ada", "wait"))
        .await
        .unwrap();
    let theirs = host
        .submit(support::spec(&waiter(job_id)), as_caller("bob", "wait"))
        .await
        .unwrap();
    let r = mine.await;
    let w = waited_for(&r);
    assert_eq!(
        (w["status"].clone(), w["output"].clone()),
        (json!("ok"), json!("job done")),
        "{r:?}"
    );
    let r = theirs.await;
    let out = r.output.clone().unwrap_or_default();
    assert!(
        out.contains(&format!("no run `{job_id}` of this caller")),
        "another caller's run is unknown to it: {out}"
    );
    assert_eq!(job.await.status, RunStatus::Ok);

    // A run that ended is read from the record.
    let late = host
        .submit(support::spec(&waiter(job_id)), as_caller("ada", "wait"))
        .await
        .unwrap();
    let r = late.await;
    assert_eq!(waited_for(&r)["output"], "job done", "{r:?}");
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_a_run_times_out() {
    let (host, _store) = support::host().await;
    let job = host
        .submit(
            support::spec(&sleeper("job", 600_000)),
            Invocation::prompt("work"),
        )
        .await
        .unwrap();
    let yaml = waiter(job.run_id()).replace("timeout: 5m", "timeout: 1m");
    let r = host
        .submit(support::spec(&yaml), Invocation::prompt("wait"))
        .await
        .unwrap()
        .await;
    let w = waited_for(&r);
    assert_eq!(w["timed_out"], true, "{r:?}");
    assert_eq!(w["status"], "running");
    assert_eq!(w["waited_ms"], 60_000);
    job.cancel();
    host.shutdown().await;
}
