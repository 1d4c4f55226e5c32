//! A sub-agent's deadline follows its parent's: a child is capped at its
//! parent's hard deadline as it is now, not as it was when the child
//! started. When the critic extends the parent (at its soft timeout, or at
//! its hard deadline itself), its child lives on past the old deadline;
//! `killed`/`parent` means the parent ended.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::policy::rules;
use agentvisor::ports::audit::AuditEntry;
use agentvisor::ports::critic::{CriticPolicy, Decision, RunView, Trigger, Verdict};
use agentvisor::ports::model::ToolSpec;
use agentvisor::ports::tool::{Tool, ToolContext, ToolError};
use agentvisor::{AgentSpec, CriticAction, Host, Invocation, KillReason, RunStatus};
use async_trait::async_trait;
use serde_json::{json, Value};
use support::scratch::Scratch;

/// A parent that delegates once to `child` (it may use `tools`), with
/// `limits`, then answers.
fn parent_of(d: &Scratch, child: &str, limits: &str, tools: &str) -> AgentSpec {
    let child = d.file("helper.yaml", child);
    let parent = d.file(
        "parent.yaml",
        &format!(
            "name: parent\ntools: [{tools}]\nagents:\n  helper: {{ file: {}, description: Helps }}\nlimits: {limits}\nscript:\n  - {{ tool: agent__helper, args: {{ prompt: go }} }}\n  - {{ text: \"the helper said so\" }}\n",
            child.display()
        ),
    );
    AgentSpec::from_file(&parent).unwrap()
}

/// A child that takes 8 s over its answer (its own limits are an hour).
const SLOW_CHILD: &str = "name: helper\ntools: [sleep]\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { tool: sleep, args: { ms: 8000 } }\n  - { text: \"5\" }\n";

/// A child that never answers (its own limits are an hour).
const HANGING_CHILD: &str =
    "name: helper\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { hang: true }\n";

/// How the child run ended, from its terminal record.
async fn child_ending(
    store: &agentvisor::stores::MemoryAuditStore,
    child: agentvisor::RunId,
) -> (RunStatus, Option<KillReason>) {
    match support::records(store, child)
        .await
        .last()
        .map(|r| &r.entry)
    {
        Some(AuditEntry::Terminal(t)) => (t.status, t.kill_reason),
        other => panic!("no terminal record for the child: {other:?}"),
    }
}

/// Runs `parent` on `host` and returns its result, the child's id and how
/// long the parent took.
async fn run_tree(
    host: &Host,
    parent: AgentSpec,
) -> (agentvisor::RunResult, agentvisor::RunId, Duration) {
    let t0 = tokio::time::Instant::now();
    let handle = host.submit(parent, Invocation::prompt("go")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let child = host
        .runs()
        .into_iter()
        .find(|r| r.agent == "helper")
        .expect("the child runs")
        .run_id;
    let r = handle.await;
    (r, child, t0.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_child_runs_past_its_parents_first_deadline_once_the_parent_is_extended() {
    let d = Scratch::new("parent-extended-soft");
    // The parent's deadline is 5 s; at its soft timeout (2 s) the rules
    // extend it by 20 s (it made progress). Its child takes 8 s.
    let parent = parent_of(
        &d,
        SLOW_CHILD,
        "{ stall_timeout: 1h, max_runtime: 5s, soft_timeout: 2s, hard_timeout: 5s, extension: 20s, max_extensions: 1 }",
        "sleep",
    );
    let (host, store) = support::host().await;
    let (r, child, took) = run_tree(&host, parent).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(
        r.critic.iter().any(|c| c.action == CriticAction::Extend),
        "{:?}",
        r.critic
    );
    assert_eq!(r.steps[0].result, "5", "the child answered: {r:?}");
    assert!(took >= Duration::from_secs(8), "{took:?}");
    host.shutdown().await;
    assert_eq!(
        child_ending(&store, child).await,
        (RunStatus::Ok, None),
        "the child ends ok, not killed/parent at the parent's first deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_child_is_killed_parent_when_its_parent_ends_at_its_extended_deadline() {
    let d = Scratch::new("parent-extended-ends");
    // Extended at 2 s to 25 s; the child hangs: both end at 25 s, the
    // parent `timeout`, the child `killed`/`parent`.
    let parent = parent_of(
        &d,
        HANGING_CHILD,
        "{ stall_timeout: 1h, max_runtime: 5s, soft_timeout: 2s, hard_timeout: 5s, extension: 20s, max_extensions: 1 }",
        "sleep",
    );
    let (host, store) = support::host().await;
    let (r, child, took) = run_tree(&host, parent).await;
    assert_eq!(r.status, RunStatus::Timeout, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    assert!(
        took >= Duration::from_secs(25) && took <= Duration::from_secs(26),
        "{took:?}"
    );
    host.shutdown().await;
    assert_eq!(
        child_ending(&store, child).await,
        (RunStatus::Killed, Some(KillReason::Parent))
    );
}

/// Extends the parent at its hard deadline (once, within its limits); the
/// rules decide everything else.
struct ExtendParentAtDeadline;

impl CriticPolicy for ExtendParentAtDeadline {
    fn decide(&self, trigger: Trigger, view: &RunView) -> Verdict {
        if trigger == Trigger::HardDeadline && view.agent == "parent" {
            return Verdict::Now(Decision::Extend(Duration::from_secs(20)));
        }
        Verdict::Now(rules(trigger, view))
    }
}

#[tokio::test(start_paused = true)]
async fn a_child_lives_on_when_its_parent_is_extended_at_the_very_deadline() {
    // The parent's and the child's timers fire at the same instant (5 s),
    // on whichever shards: the parent's extension must reach the child
    // before the child counts its parent as ended.
    for _ in 0..4 {
        let d = Scratch::new("parent-extended-hard");
        let parent = parent_of(
            &d,
            SLOW_CHILD,
            "{ stall_timeout: 1h, max_runtime: 5s, soft_timeout: 1h, hard_timeout: 5s, max_extensions: 1 }",
            "sleep",
        );
        let (host, store) =
            support::host_from(support::builder().critic_policy(Arc::new(ExtendParentAtDeadline)))
                .await;
        let (r, child, took) = run_tree(&host, parent).await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        assert_eq!(r.steps[0].result, "5", "the child answered: {r:?}");
        assert!(took >= Duration::from_secs(8), "{took:?}");
        host.shutdown().await;
        assert_eq!(child_ending(&store, child).await, (RunStatus::Ok, None));
    }
}

/// `probe`: keeps the deadline its call was given.
struct DeadlineProbe {
    spec: ToolSpec,
    seen: std::sync::Mutex<Option<tokio::time::Instant>>,
}

#[async_trait]
impl Tool for DeadlineProbe {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _: Value, ctx: ToolContext) -> Result<String, ToolError> {
        *self.seen.lock().unwrap() = ctx.deadline();
        Ok("probed".into())
    }
}

#[tokio::test(start_paused = true)]
async fn a_childs_calls_see_its_parents_deadline_as_it_is_now() {
    // The parent is extended at 2 s (to 25 s); at 3 s its child calls a
    // tool: the deadline that call is given is the parent's new one.
    let d = Scratch::new("parent-extended-told");
    let parent = parent_of(
        &d,
        "name: helper\ntools: [sleep, probe]\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { tool: sleep, args: { ms: 3000 } }\n  - { tool: probe, args: {} }\n  - { text: \"5\" }\n",
        "{ stall_timeout: 1h, max_runtime: 5s, soft_timeout: 2s, hard_timeout: 5s, extension: 20s, max_extensions: 1 }",
        "sleep, probe",
    );
    let probe = Arc::new(DeadlineProbe {
        spec: ToolSpec {
            name: "probe".into(),
            description: "Keeps its deadline.".into(),
            parameters: json!({"type": "object"}),
        },
        seen: std::sync::Mutex::new(None),
    });
    let (host, _) = support::host_from(support::builder().tool(probe.clone())).await;
    let t0 = tokio::time::Instant::now();
    let (r, _, _) = run_tree(&host, parent).await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let seen = probe.seen.lock().unwrap().expect("the probe ran");
    assert!(
        seen >= t0 + Duration::from_secs(25),
        "the call was given {:?} from the start",
        seen - t0
    );
    host.shutdown().await;
}
