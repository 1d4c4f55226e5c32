//! Sub-agents: palette tools that run child runs under the same critic,
//! their results, failures, caps, deadlines and cascades.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::path::Path;
use std::time::Duration;

use agentvisor::ports::audit::AuditStore;
use agentvisor::{AgentSpec, HostConfig, Invocation, KillReason, RunStatus};
use support::scratch::Scratch;

fn parent_yaml(child: &Path, limits: &str) -> String {
    format!(
        "name: parent\ntools: [add]\nagents:\n  helper: {{ file: {}, description: Adds for you }}\nlimits: {limits}\nscript:\n  - {{ tool: agent__helper, args: {{ prompt: \"add 2 and 3\" }} }}\n  - {{ text: \"the helper said so\" }}\n",
        child.display()
    )
}

/// Writes `child` as `helper.yaml` to `d`, and a parent that delegates to
/// it once (with `limits`) as `parent.yaml`; reads the parent's manifest.
fn parent_of(d: &Scratch, child: &str, limits: &str) -> AgentSpec {
    let child = d.file("helper.yaml", child);
    let parent = d.file("parent.yaml", &parent_yaml(&child, limits));
    AgentSpec::from_file(&parent).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_parent_delegates_and_reads_its_childs_answer() {
    let d = Scratch::new("delegation-roundtrip");
    let spec = parent_of(
        &d,
        "name: helper\ntools: [add, upper]\nscript:\n  - { tool: add, args: { a: 2, b: 3 } }\n  - { text: \"5\" }\n",
        "{}",
    );
    assert_eq!(spec.sub_agents.len(), 1);
    let (host, store) = support::host().await;
    let agent = host.agent(spec).unwrap();
    let r = host
        .execute(&agent, Invocation::prompt("go"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.steps.len(), 1);
    assert_eq!(&*r.steps[0].tool, "agent__helper");
    assert!(r.steps[0].ok);
    assert_eq!(r.steps[0].result, "5");
    host.shutdown().await;
    // The child is a run of its own, on record with its parent.
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.terminal_records, 2);
}

#[tokio::test(start_paused = true)]
async fn a_child_may_use_only_tools_its_parent_may_use() {
    let d = Scratch::new("delegation-tools");
    // The child asks for `upper`, which the parent does not have.
    let parent = parent_of(
        &d,
        "name: helper\ntools: [add, upper]\nscript:\n  - { tool: upper, args: { text: x } }\n  - { text: done }\n",
        "{}",
    );
    let (host, _store) = support::host().await;
    let r = host
        .execute(parent, Invocation::prompt("go"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok);
    // The child's call of `upper` was refused (unknown to it), the child
    // went on and answered.
    assert_eq!(r.steps[0].result, "done");
}

#[tokio::test(start_paused = true)]
async fn killing_a_parent_ends_its_children_killed_parent_first() {
    let d = Scratch::new("delegation-cascade");
    let grandchild = d.file(
        "gc.yaml",
        "name: gc\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { hang: true }\n",
    );
    let child = d.file(
        "helper.yaml",
        &format!("name: helper\nagents: {{ deeper: {} }}\nlimits: {{ stall_timeout: 1h, max_runtime: 1h }}\nscript:\n  - {{ tool: agent__deeper, args: {{ prompt: go }} }}\n  - {{ text: never }}\n", grandchild.display()),
    );
    let parent = d.file(
        "parent.yaml",
        &parent_yaml(&child, "{ stall_timeout: 1h, max_runtime: 1h }"),
    );
    let (host, store) = support::host().await;
    let handle = host
        .submit(
            AgentSpec::from_file(&parent).unwrap(),
            Invocation::prompt("go"),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let live = host.runs();
    assert_eq!(live.len(), 3, "parent, child and grandchild run");
    let ids: Vec<_> = live.iter().map(|r| r.run_id).collect();
    handle.kill();
    let r = handle.await;
    assert_eq!(r.kill_reason, Some(KillReason::Operator));
    host.shutdown().await;
    let mut ended = Vec::new();
    for id in ids {
        let records = support::records(&store, id).await;
        assert_eq!(support::terminal_count(&records), 1);
        if let Some(agentvisor::ports::audit::AuditEntry::Terminal(t)) =
            records.last().map(|r| &r.entry)
        {
            ended.push((t.agent.clone(), t.kill_reason, t.finished_at));
        }
    }
    ended.sort_by_key(|e| e.2);
    for (agent, reason, _) in &ended {
        match agent.as_str() {
            "parent" => assert_eq!(*reason, Some(KillReason::Operator)),
            _ => assert_eq!(*reason, Some(KillReason::Parent), "{agent}"),
        }
    }
    // Deepest first: the grandchild, then the child, then the parent.
    let order: Vec<&str> = ended.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(order.last(), Some(&"parent"), "{order:?}");
}

#[tokio::test(start_paused = true)]
async fn a_child_ends_killed_parent_at_its_parents_deadline() {
    let d = Scratch::new("delegation-deadline");
    let parent = parent_of(
        &d,
        "name: helper\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nscript:\n  - { hang: true }\n",
        "{ stall_timeout: 1h, max_runtime: 5s, hard_timeout: 10s, max_extensions: 0 }",
    );
    let (host, store) = support::host().await;
    let t0 = tokio::time::Instant::now();
    let handle = host.submit(parent, Invocation::prompt("go")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let child_id = host
        .runs()
        .into_iter()
        .find(|r| r.agent == "helper")
        .expect("the child runs")
        .run_id;
    let r = handle.await;
    assert!(
        t0.elapsed() <= Duration::from_secs(11),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.status, RunStatus::Timeout);
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    host.shutdown().await;
    // The child's own limits were an hour: the cause of its end is the
    // parent, not a timeout of its own.
    let records = support::records(&store, child_id).await;
    match records.last().map(|r| &r.entry) {
        Some(agentvisor::ports::audit::AuditEntry::Terminal(t)) => {
            assert_eq!(t.status, RunStatus::Killed, "{t:?}");
            assert_eq!(t.kill_reason, Some(KillReason::Parent));
            assert_eq!(t.parent_run_id, Some(r.run_id));
        }
        other => panic!("no terminal record for the child: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_past_the_depth_cap_is_an_error_result() {
    let d = Scratch::new("delegation-caps");
    let parent = parent_of(&d, "name: helper\nscript:\n  - { text: hi }\n", "{}");
    let (host, _store) = support::host_from(support::builder().config(HostConfig {
        critic_shards: 2,
        max_depth: 0,
        ..HostConfig::default()
    }))
    .await;
    let r = host
        .execute(parent, Invocation::prompt("go"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "the parent goes on");
    assert!(!r.steps[0].ok);
    assert!(
        r.steps[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("max_depth"),
        "{:?}",
        r.steps[0]
    );
}

#[test]
fn a_manifest_that_delegates_to_itself_or_to_a_missing_file_is_refused() {
    let d = Scratch::new("delegation-bad");
    let me = d.path("me.yaml");
    std::fs::write(
        &me,
        format!(
            "name: me\nagents: {{ again: {} }}\nscript:\n  - {{ text: x }}\n",
            me.display()
        ),
    )
    .unwrap();
    let e = AgentSpec::from_file(&me).unwrap_err().to_string();
    assert!(e.contains("agents.again") && e.contains("itself"), "{e}");
    let lost = d.file(
        "lost.yaml",
        "name: lost\nagents: { gone: nowhere.yaml }\nscript:\n  - { text: x }\n",
    );
    let e = AgentSpec::from_file(&lost).unwrap_err().to_string();
    assert!(
        e.contains("agents.gone") && e.contains("nowhere.yaml"),
        "{e}"
    );
}
