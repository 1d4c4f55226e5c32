//! Sub-agents: palette tools that run child runs under the same critic,
//! their results, failures, caps, deadlines and cascades.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::path::Path;
use std::time::Duration;

use agentvisor::ports::audit::{AuditStore, RunIndex};
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
    // The child is a run of its own, on record with its parent and its
    // tree's root.
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.terminal_records, 2);
    let tree = store
        .list_runs(&agentvisor::ports::audit::RunFilter {
            root: Some(r.run_id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(tree.len(), 2);
    let child = tree.iter().find(|s| s.agent == "helper").unwrap();
    assert_eq!(child.parent_run_id, Some(r.run_id));
    assert_eq!(child.root_run_id, Some(r.run_id));
    assert_eq!(r.root_run_id, None, "the root is its own");
}

#[tokio::test(start_paused = true)]
async fn a_parents_subscribers_get_its_descendants_events_tagged_and_in_order() {
    let d = Scratch::new("delegation-events");
    let grandchild = d.file("gc.yaml",
        "name: gc\ntools: [add]\nscript:\n  - { tool: add, args: { a: 1, b: 1 } }\n  - { text: \"2\" }\n",
    );
    let child = d.file("helper.yaml",
        &format!("name: helper\ntools: [add]\nagents: {{ deeper: {} }}\nscript:\n  - {{ tool: agent__deeper, args: {{ prompt: go }} }}\n  - {{ tool: add, args: {{ a: 2, b: 3 }} }}\n  - {{ text: \"5\" }}\n", grandchild.display()),
    );
    let parent = d.file("parent.yaml", &parent_yaml(&child, "{}"));
    let (host, _store) = support::host().await;
    let (handle, mut events) = host
        .submit_streaming(
            agentvisor::AgentSpec::from_file(&parent).unwrap(),
            Invocation::prompt("go"),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = events.next().await {
        seen.push(ev);
    }
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    let mine: Vec<_> = seen.iter().filter(|e| e.run_id == r.run_id).collect();
    assert!(mine.iter().all(|e| e.parent_run_id.is_none()));
    assert!(matches!(
        mine.last().unwrap().event,
        agentvisor::RunEvent::RunEnd { .. }
    ));
    // Each descendant's events, tagged with its parent, in its own order,
    // ending with its run.end.
    let mut runs: Vec<agentvisor::RunId> = seen
        .iter()
        .map(|e| e.run_id)
        .filter(|id| *id != r.run_id)
        .collect();
    runs.dedup();
    runs.sort_unstable();
    runs.dedup();
    assert_eq!(runs.len(), 2, "the child and the grandchild");
    let mut parents = Vec::new();
    for id in runs {
        let theirs: Vec<_> = seen.iter().filter(|e| e.run_id == id).collect();
        let p = theirs[0].parent_run_id.expect("tagged with its parent");
        assert!(theirs.iter().all(|e| e.parent_run_id == Some(p)));
        parents.push(p);
        let seqs: Vec<u32> = theirs.iter().map(|e| e.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "{seqs:?}");
        assert!(
            matches!(
                theirs.last().unwrap().event,
                agentvisor::RunEvent::RunEnd { .. }
            ),
            "{theirs:?}"
        );
        assert!(theirs
            .iter()
            .any(|e| matches!(e.event, agentvisor::RunEvent::ToolCall { .. })));
    }
    // One is the parent's child, the other the child's.
    assert!(parents.contains(&r.run_id));
    // Every descendant's event came before the parent's run.end.
    let end = seen
        .iter()
        .position(|e| {
            e.run_id == r.run_id && matches!(e.event, agentvisor::RunEvent::RunEnd { .. })
        })
        .unwrap();
    assert_eq!(end, seen.len() - 1);
    host.shutdown().await;
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
async fn a_child_gets_no_mcp_server_its_parent_does_not_have() {
    let d = Scratch::new("delegation-mcp");
    // The child names an MCP server; the parent names none. The child is
    // prepared without it (its program is never started: it does not
    // exist), and its tools are not offered.
    let child = d.file(
        "helper.yaml",
        "name: helper
tools: [add]
mcp:
  servers:
    - { name: files, command: [/nonexistent/mcp-files] }
script:
  - { tool: files__read, args: { path: x } }
  - { text: done }
",
    );
    let parent = d.file("parent.yaml", &parent_yaml(&child, "{}"));
    let (host, store) = support::host().await;
    let agent = host
        .agent(agentvisor::AgentSpec::from_file(&parent).unwrap())
        .expect("a sub-agent's MCP servers do not stop its parent from preparing");
    let r = host
        .execute(&agent, Invocation::prompt("go"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.steps[0].result, "done");
    host.shutdown().await;
    let child_id = store
        .list_runs(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.agent == "helper")
        .unwrap()
        .run_id;
    let child = store.run_result(child_id).await.unwrap().unwrap();
    assert_eq!(&*child.steps[0].tool, "files__read");
    assert!(!child.steps[0].ok);
    assert!(
        child.steps[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("unknown"),
        "{:?}",
        child.steps[0]
    );
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

/// `examples/agents/tree.yaml`, as `agentvisor run … --events` shows it:
/// the parent times out while its two workers run, each worker ends
/// `killed`/`parent` and the parent's stream carries both endings, tagged
/// with their parent, before its own.
#[tokio::test(start_paused = true)]
async fn the_tree_example_times_out_and_ends_every_worker_killed_parent() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agents/tree.yaml");
    let (host, store) = support::host().await;
    let (handle, mut events) = host
        .submit_streaming(
            agentvisor::AgentSpec::from_file(&path).unwrap(),
            Invocation::default(),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = events.next().await {
        seen.push(ev);
    }
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Timeout, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Deadline));
    let ends: Vec<_> = seen
        .iter()
        .filter_map(|e| match &e.event {
            agentvisor::RunEvent::RunEnd {
                status,
                kill_reason,
                ..
            } => Some((e.run_id, e.parent_run_id, *status, *kill_reason)),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 3, "{ends:?}");
    for (id, parent, status, reason) in &ends[..2] {
        assert_ne!(*id, r.run_id);
        assert_eq!(*parent, Some(r.run_id));
        assert_eq!(*status, RunStatus::Killed);
        assert_eq!(*reason, Some(KillReason::Parent));
    }
    assert_eq!(ends[2].0, r.run_id, "the parent ends last");
    host.shutdown().await;
    for (id, ..) in &ends[..2] {
        let records = support::records(&store, *id).await;
        assert_eq!(support::terminal_count(&records), 1);
    }
}
