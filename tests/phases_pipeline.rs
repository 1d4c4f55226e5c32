//! Pipelines (`phases:`): outputs fed forward, stop at the first failure,
//! optional phases, usage summed, durable pipelines resumed without
//! running their finished phases again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::pipeline::phase_run_id;
use agentvisor::ports::audit::AuditEntry;
use agentvisor::stores::{MemoryAuditStore, MemoryCheckpointer};
use agentvisor::{Invocation, RunId, RunStatus};
use support::{builder, host, records, spec};

const ESSAY: &str = r#"
name: essay
system: You write.
phases:
  - name: outline
    prompt: "Outline an essay on {{prompt}} for {{inputs.reader}}."
    script:
      - { text: "1. Moon 2. Water", usage: { input: 10, output: 5 } }
  - name: draft
    prompt: "Write from: {{phases.outline.output}}"
    limits: { max_iterations: 2 }
    script:
      - { text: "The moon pulls the water.", usage: { input: 20, output: 7 } }
  - name: title
    prompt: "Title for: {{ phases.draft.output }} (outline {{phases.outline.output}})"
    script:
      - { text: "Tides", usage: { input: 30, output: 1 } }
"#;

/// The prompt a run was started with, as its first record says.
async fn prompt_of(store: &MemoryAuditStore, run: RunId) -> String {
    let recs = records(store, run).await;
    match &recs[0].entry {
        AuditEntry::RunStarted(info) => info.prompt.to_string(),
        other => panic!("first record is {other:?}"),
    }
}

/// How many runs of `agent` started (their start records).
fn started(store: &MemoryAuditStore, agent: &str) -> usize {
    store
        .records()
        .iter()
        .filter(|r| matches!(&r.entry, AuditEntry::RunStarted(i) if &*i.agent == agent))
        .count()
}

fn essay_invocation() -> Invocation {
    let mut inv = Invocation::prompt("tides").caller("writer");
    inv.inputs
        .insert("reader".into(), serde_json::json!("children"));
    inv
}

#[tokio::test(start_paused = true)]
async fn outputs_feed_forward_and_usage_is_summed() {
    let (host, store) = host().await;
    let r = host
        .run_pipeline(spec(ESSAY), essay_invocation())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("Tides"));
    assert_eq!(r.usage.input_tokens, 60);
    assert_eq!(r.usage.output_tokens, 13);
    let names: Vec<&str> = r.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["outline", "draft", "title"]);
    assert!(r
        .phases
        .iter()
        .all(|p| p.status == Some(RunStatus::Ok) && !p.resumed));

    let ids: Vec<RunId> = r.phases.iter().map(|p| p.run_id.unwrap()).collect();
    assert_eq!(
        prompt_of(&store, ids[0]).await,
        "Outline an essay on tides for children."
    );
    assert_eq!(
        prompt_of(&store, ids[1]).await,
        "Write from: 1. Moon 2. Water"
    );
    assert_eq!(
        prompt_of(&store, ids[2]).await,
        "Title for: The moon pulls the water. (outline 1. Moon 2. Water)"
    );
    // Each phase is a run of its own manifest, charged to the caller.
    let result = host.audit_store().run_records(ids[1]).await.unwrap();
    let AuditEntry::RunStarted(info) = &result[0].entry else {
        panic!("no start record")
    };
    assert_eq!(&*info.agent, "essay.draft");
    assert_eq!(info.caller_id.as_deref(), Some("writer"));
    assert_eq!(info.limits.map(|l| l.max_iterations), Some(2));
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_phase_stops_the_pipeline() {
    let (host, _) = host().await;
    let yaml = ESSAY.replace(
        r#"- { text: "The moon pulls the water.", usage: { input: 20, output: 7 } }"#,
        "- { fail: bad_request }",
    );
    let r = host
        .run_pipeline(spec(&yaml), essay_invocation())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Error);
    assert_eq!(r.failed_phase.as_deref(), Some("draft"));
    assert_eq!(r.error_kind.as_deref(), Some("bad_request"));
    assert_eq!(r.output.as_deref(), Some("1. Moon 2. Water"));
    assert_eq!(r.phases[1].status, Some(RunStatus::Error));
    // The title phase never ran.
    assert_eq!(r.phases[2].status, None);
    assert_eq!(r.phases[2].run_id, None);
    assert_eq!(r.usage.input_tokens, 10);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_optional_failing_phase_does_not_stop_it() {
    let (host, store) = host().await;
    let yaml = ESSAY
        .replace(
            r#"- { text: "The moon pulls the water.", usage: { input: 20, output: 7 } }"#,
            "- { fail: bad_request }",
        )
        .replace(
            "    limits: { max_iterations: 2 }\n",
            "    limits: { max_iterations: 2 }\n    optional: true\n",
        );
    let r = host
        .run_pipeline(spec(&yaml), essay_invocation())
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.failed_phase, None);
    assert_eq!(r.phases[1].status, Some(RunStatus::Error));
    assert!(r.phases[1].optional);
    assert_eq!(r.output.as_deref(), Some("Tides"));
    // The failed phase's output reads as empty.
    assert_eq!(
        prompt_of(&store, r.phases[2].run_id.unwrap()).await,
        "Title for:  (outline 1. Moon 2. Water)"
    );
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_durable_pipeline_skips_its_finished_phases_when_run_again() {
    let (host, store) = host().await;
    let broken = format!("durable: true\n{}", ESSAY).replace(
        r#"- { text: "The moon pulls the water.", usage: { input: 20, output: 7 } }"#,
        "- { fail: bad_request }",
    );
    let pipeline = RunId::new();
    let mut inv = essay_invocation();
    inv.run_id = Some(pipeline);
    let first = host.run_pipeline(spec(&broken), inv.clone()).await.unwrap();
    assert_eq!(first.failed_phase.as_deref(), Some("draft"));
    assert_eq!(first.phases[0].run_id, Some(phase_run_id(pipeline, 0, 0)));

    // The manifest is mended and the pipeline run again with its id: the
    // outline is read back from its record, the draft gets a new attempt.
    let mended = format!("durable: true\n{}", ESSAY);
    let second = host.run_pipeline(spec(&mended), inv).await.unwrap();
    assert_eq!(second.status, RunStatus::Ok, "{second:?}");
    assert!(second.phases[0].resumed);
    assert_eq!(second.phases[0].run_id, first.phases[0].run_id);
    assert_eq!(second.phases[0].output.as_deref(), Some("1. Moon 2. Water"));
    assert!(!second.phases[1].resumed);
    assert_eq!(second.phases[1].run_id, Some(phase_run_id(pipeline, 1, 1)));
    assert_eq!(second.output.as_deref(), Some("Tides"));
    // Usage counts the outline as recorded, plus what ran now.
    assert_eq!(second.usage.input_tokens, 60);
    // The outline ran once in all.
    assert_eq!(started(&store, "essay.outline"), 1);
    assert_eq!(started(&store, "essay.draft"), 2);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_durable_pipeline_resumes_on_another_host_after_recover() {
    let audit = Arc::new(MemoryAuditStore::new());
    let checkpoints = Arc::new(MemoryCheckpointer::new());
    let yaml = format!("durable: true\n{}", ESSAY).replace(
        r#"- { text: "The moon pulls the water.", usage: { input: 20, output: 7 } }"#,
        r#"- { text: "The moon pulls the water.", latency: 30s, usage: { input: 20, output: 7 } }"#,
    );
    let pipeline = RunId::new();
    let mut inv = essay_invocation();
    inv.run_id = Some(pipeline);

    // The first host shuts down while the draft phase waits on its model.
    let host1 = builder()
        .audit_store(audit.clone())
        .checkpointer(checkpoints.clone())
        .build()
        .await
        .unwrap();
    let running = tokio::spawn({
        let host = host1.clone();
        let spec = spec(&yaml);
        let inv = inv.clone();
        async move { host.run_pipeline(spec, inv).await }
    });
    let draft = phase_run_id(pipeline, 1, 0);
    while host1.run(&draft).is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    host1.shutdown().await;
    let interrupted = running.await.unwrap().unwrap();
    assert_eq!(interrupted.status, RunStatus::Cancelled);
    assert_eq!(interrupted.failed_phase.as_deref(), Some("draft"));

    // The second host recovers the draft's run from its checkpoint, and the
    // pipeline run again with its id picks it up where it is.
    let host2 = builder()
        .audit_store(audit.clone())
        .checkpointer(checkpoints.clone())
        .build()
        .await
        .unwrap();
    let recovery = host2.recover().await.unwrap();
    assert_eq!(recovery.resumed.len(), 1);
    assert_eq!(recovery.resumed[0].run_id(), draft);
    let resumed = host2.run_pipeline(spec(&yaml), inv).await.unwrap();
    drop(recovery);
    assert_eq!(resumed.status, RunStatus::Ok, "{resumed:?}");
    assert!(resumed.phases[0].resumed);
    assert!(resumed.phases[1].resumed);
    assert_eq!(resumed.phases[1].run_id, Some(draft));
    assert!(!resumed.phases[2].resumed);
    assert_eq!(resumed.output.as_deref(), Some("Tides"));
    host2.shutdown().await;
}

#[test]
fn bad_phase_manifests_are_refused_naming_the_phase() {
    let refused = |yaml: &str| {
        agentvisor::AgentSpec::from_yaml(yaml)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let later = ESSAY.replace(
        "Write from: {{phases.outline.output}}",
        "Write from: {{phases.title.output}}",
    );
    let e = refused(&later);
    assert!(
        e.contains("no earlier phase is named `title`") && e.contains("line"),
        "{e}"
    );
    let twice = ESSAY.replace("name: title", "name: draft");
    assert!(
        refused(&twice).contains("phase `draft`"),
        "{}",
        refused(&twice)
    );
    let badname = ESSAY.replace("name: title", "name: the title");
    assert!(
        refused(&badname).contains("phase name"),
        "{}",
        refused(&badname)
    );
    let unknown = ESSAY
        .replace("    optional", "    optionl")
        .replace("  - name: title\n", "  - name: title\n    optionl: true\n");
    assert!(
        refused(&unknown).contains("optionl"),
        "{}",
        refused(&unknown)
    );
    let zero = ESSAY.replace("max_iterations: 2", "max_iterations: 0");
    let e = refused(&zero);
    assert!(
        e.contains("phase `draft`") && e.contains("max_iterations"),
        "{e}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pipeline_that_cannot_start_runs_nothing() {
    let (host, store) = host().await;
    let no_input = host
        .run_pipeline(spec(ESSAY), Invocation::prompt("x"))
        .await;
    assert!(
        matches!(&no_input, Err(agentvisor::PipelineError::MissingInput { input, .. }) if input == "reader"),
        "{no_input:?}"
    );
    let bad_tool = ESSAY.replace(
        "    limits: { max_iterations: 2 }\n",
        "    tools: [no_such_tool]\n",
    );
    let e = host
        .run_pipeline(spec(&bad_tool), essay_invocation())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("phase `draft`"), "{e}");
    assert!(store.records().is_empty());
    let plain = spec("name: a\nscript: [{text: hi}]\n");
    assert!(host
        .run_pipeline(plain, Invocation::prompt("x"))
        .await
        .is_err());
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_started_pipeline_streams_its_phases_and_records_them_under_its_id() {
    let (host, store) = host().await;
    let mut run = host.start_pipeline(spec(ESSAY), essay_invocation());
    let pipeline_id = run.pipeline_id();
    let mut events = Vec::new();
    while let Some(ev) = run.next_event().await {
        events.push(ev);
    }
    let r = run.result().await.unwrap();
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.pipeline_id, pipeline_id);
    // Every phase's events, phase after phase, each run's ending last.
    let ids: Vec<RunId> = r.phases.iter().map(|p| p.run_id.unwrap()).collect();
    let mut order: Vec<RunId> = events.iter().map(|e| e.run_id).collect();
    order.dedup();
    assert_eq!(order, ids);
    let ends = events
        .iter()
        .filter(|e| matches!(e.event, agentvisor::RunEvent::RunEnd { .. }))
        .count();
    assert_eq!(ends, 3);
    host.shutdown().await;
    // The run index lists the phases under the pipeline's id.
    let listed = agentvisor::ports::audit::RunIndex::list_runs(
        &*store,
        &agentvisor::ports::audit::RunFilter {
            root: Some(pipeline_id),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|s| s.root_run_id == Some(pipeline_id)));
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_started_pipeline_cancels_its_phase_and_runs_no_more() {
    let (host, _store) = host().await;
    let yaml = r#"
name: slow
phases:
  - name: first
    prompt: "go"
    script: [{ text: "one" }]
  - name: second
    prompt: "{{phases.first.output}}"
    optional: true
    limits: { stall_timeout: 1h, max_runtime: 1h }
    script: [{ hang: true }]
  - name: third
    prompt: "three"
    script: [{ text: "three" }]
"#;
    let mut run = host.start_pipeline(spec(yaml), Invocation::prompt("x"));
    // Until the second phase has started its model call.
    let mut second = None;
    while let Some(ev) = run.next_event().await {
        if matches!(ev.event, agentvisor::RunEvent::StepStart { .. }) && second.is_some() {
            break;
        }
        if matches!(ev.event, agentvisor::RunEvent::RunEnd { .. }) {
            second = Some(());
        }
    }
    run.cancel();
    let r = run.result().await.unwrap();
    assert_eq!(r.status, RunStatus::Cancelled, "{r:?}");
    assert_eq!(r.failed_phase.as_deref(), Some("second"));
    assert_eq!(r.phases[1].status, Some(RunStatus::Cancelled));
    // An optional phase that was cancelled still stops the pipeline.
    assert_eq!(r.phases[2].status, None, "the third did not run");
    host.shutdown().await;
}
