//! The critic's loop detectors on scripted runs: each shape is caught with
//! two strikes — a steer naming the pattern, then a kill `killed`/`runaway`
//! whose `loop` says which — in the result, the events and the audit log;
//! healthy runs (a 200-call batch, a call that fails twice and then
//! succeeds) are never flagged; `critic.loops` knobs turn detectors off and
//! are checked like the rest of the manifest.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use agentvisor::ports::model::ToolSpec;
use agentvisor::ports::tool::{Tool, ToolContext, ToolError};
use agentvisor::spec::AgentSpec;
use agentvisor::{
    CriticAction, Host, Invocation, KillReason, LoopKind, RunEvent, RunResult, RunStatus,
};
use async_trait::async_trait;
use serde_json::{json, Value};

/// `status` {job: string}: a slow job's status, its elapsed seconds
/// going up on every call (each reply slightly different).
struct StatusTool {
    spec: ToolSpec,
    calls: AtomicU32,
}

impl StatusTool {
    fn new() -> Arc<Self> {
        Arc::new(StatusTool {
            spec: ToolSpec {
                name: "status".into(),
                description: "A job's status.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {"job": {"type": "string"}},
                    "required": ["job"],
                    "additionalProperties": false,
                }),
            },
            calls: AtomicU32::new(0),
        })
    }
}

#[async_trait]
impl Tool for StatusTool {
    fn answers_at_once(&self) -> bool {
        true
    }

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!(
            "{{\"job\":{},\"state\":\"running\",\"elapsed_s\":{},\"checked_at\":\"2026-11-27T10:{:02}:00Z\"}}",
            args["job"],
            n * 30,
            n % 60
        ))
    }
}

async fn run(yaml: &str) -> (RunResult, Vec<RunEvent>, Vec<String>) {
    let (host, store) = support::host_from(support::builder().tool(StatusTool::new())).await;
    let spec = support::spec(yaml);
    let (r, events) = support::run_to_end(&host, spec, Invocation::prompt("go")).await;
    host.shutdown().await;
    let audited = support::kinds(&support::audited_events(
        &support::records(&store, r.run_id).await,
    ));
    (r, events, audited)
}

/// The run was steered for `kind` once, then killed for it; everywhere.
fn steered_then_killed(r: &RunResult, events: &[RunEvent], audited: &[String], kind: LoopKind) {
    assert_eq!(r.status, RunStatus::Killed, "{r:#?}");
    assert_eq!(r.kill_reason, Some(KillReason::Runaway));
    assert_eq!(r.error_kind.as_deref(), Some("runaway"));
    assert_eq!(r.loop_kind, Some(kind), "{:#?}", r.critic);
    let decisions: Vec<(CriticAction, &str, Option<LoopKind>)> = r
        .critic
        .iter()
        .map(|d| (d.action, d.reason.as_str(), d.loop_kind))
        .collect();
    assert_eq!(
        decisions,
        [
            (CriticAction::Steer, "runaway", Some(kind)),
            (CriticAction::Kill, "runaway", Some(kind))
        ]
    );
    let steer = r.critic[0].detail.clone().unwrap();
    assert!(
        steer.starts_with(&format!("Loop detected ({kind}).")),
        "{steer}"
    );
    // The model read the steer before its next call.
    assert!(events.iter().any(
        |e| matches!(e, RunEvent::MessageCreate { role, text } if role == "user" && *text == steer)
    ));
    // Machine-readable in JSON: the result and the kill event.
    let json = serde_json::to_value(r).unwrap();
    assert_eq!(json["loop"], kind.as_str());
    let kill = events
        .iter()
        .find(|e| matches!(e, RunEvent::CriticKill(_)))
        .unwrap();
    assert_eq!(serde_json::to_value(kill).unwrap()["loop"], kind.as_str());
    let critic: Vec<&String> = audited
        .iter()
        .filter(|k| k.starts_with("critic."))
        .collect();
    assert_eq!(critic, ["critic.steer", "critic.kill"]);
}

#[tokio::test(start_paused = true)]
async fn the_same_call_with_the_same_result_is_caught_across_other_calls() {
    // Identical calls, never two in a row (so not `repeat`).
    let (r, events, audited) = run(r#"
name: observe
tools: [add, echo]
limits: { max_iterations: 30 }
script:
  - { tool: add, args: { a: 1, b: 2 } }
  - { tool: echo, args: { text: one } }
  - { tool: add, args: { a: 1, b: 2 } }
  - { tool: echo, args: { text: two } }
  - { tool: add, args: { a: 1, b: 2 } }
  - { tool: echo, args: { text: three } }
  - { tool: add, args: { a: 1, b: 2 } }
  - { tool: echo, args: { text: four } }
  - { tool: add, args: { a: 1, b: 2 } }
  - { text: never }
"#)
    .await;
    steered_then_killed(&r, &events, &audited, LoopKind::SameObservation);
    assert_eq!(r.steps.len(), 9, "steer at the 4th add, kill at the 5th");
    let steer = r.critic[0].detail.clone().unwrap();
    assert!(steer.contains("4 times"), "{steer}");
}

#[tokio::test(start_paused = true)]
async fn the_same_error_is_caught_whatever_detail_changes() {
    // The model changes one detail each time; other work in between keeps
    // `max_tool_errors` from ending the run first.
    let (r, events, audited) = run(r#"
name: quoting
tools: [fail, echo]
limits: { max_iterations: 30 }
script:
  - { tool: fail, args: { reason: "syntax error at line 3: unexpected '\"' in \"/tmp/a.sh\"" } }
  - { tool: echo, args: { text: look } }
  - { tool: fail, args: { reason: "syntax error at line 9: unexpected '`' in \"/tmp/b.sh\"" } }
  - { tool: echo, args: { text: think } }
  - { tool: fail, args: { reason: "syntax error at line 14: unexpected '$' in \"/home/x/c.sh\"" } }
  - { tool: echo, args: { text: again } }
  - { tool: fail, args: { reason: "syntax error at line 2: unexpected ')' in \"/tmp/d.sh\"" } }
  - { text: never }
"#)
    .await;
    steered_then_killed(&r, &events, &audited, LoopKind::SameError);
    assert_eq!(
        r.steps.len(),
        7,
        "steer at the 3rd failure, kill at the 4th"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cycle_is_caught_at_its_third_period() {
    // Read the file, write the file, read the file, write the file …
    let (r, events, audited) = run(r#"
name: cycle
tools: [upper, echo]
limits: { max_iterations: 30 }
script:
  - { tool: upper, args: { text: draft } }
  - { tool: echo, args: { text: draft } }
  - { tool: upper, args: { text: draft } }
  - { tool: echo, args: { text: draft } }
  - { tool: upper, args: { text: draft } }
  - { tool: echo, args: { text: draft } }
  - { tool: upper, args: { text: draft } }
  - { tool: echo, args: { text: draft } }
  - { text: never }
"#)
    .await;
    steered_then_killed(&r, &events, &audited, LoopKind::Cycle);
    assert_eq!(r.steps.len(), 7, "steer at the 6th call, kill at the 7th");
}

#[tokio::test(start_paused = true)]
async fn polling_is_caught_and_the_steer_points_at_wait() {
    // A parent polls a slow job between other calls: every reply differs
    // (its clock and counter), none twice in a row.
    let mut yaml = String::from(
        "name: poller\ntools: [status, echo]\nlimits: { max_iterations: 40 }\nscript:\n",
    );
    for i in 0..8 {
        yaml += "  - { tool: status, args: { job: ci-481 } }\n";
        yaml += &format!("  - {{ tool: echo, args: {{ text: \"waiting {i}\" }} }}\n");
    }
    yaml += "  - { text: never }\n";
    let (r, events, audited) = run(&yaml).await;
    steered_then_killed(&r, &events, &audited, LoopKind::Poll);
    let status_calls = r.steps.iter().filter(|s| &*s.tool == "status").count();
    assert_eq!(status_calls, 6, "steer at the 5th poll, kill at the 6th");
    let steer = r.critic[0].detail.clone().unwrap();
    assert!(steer.contains("`wait` tool"), "{steer}");
}

#[tokio::test(start_paused = true)]
async fn steps_that_bring_nothing_new_are_caught() {
    // Three calls revisited in no fixed order: each seen before, so no
    // step is progress; `same_observation` is off to let this one show.
    let order = [
        "a", "b", "c", "b", "a", "c", "a", "b", "c", "b", "c", "a", "c",
    ];
    let mut yaml = String::from(
        "name: stale\ntools: [echo]\nlimits: { max_iterations: 40 }\ncritic: { loops: { same_observation: 0 } }\nscript:\n",
    );
    for x in order {
        yaml += &format!("  - {{ tool: echo, args: {{ text: {x} }} }}\n");
    }
    yaml += "  - { text: never }\n";
    let (r, events, audited) = run(&yaml).await;
    steered_then_killed(&r, &events, &audited, LoopKind::NoProgress);
    assert_eq!(
        r.steps.len(),
        12,
        "3 new steps, steer after 8 stale, kill at the 9th"
    );
}

#[tokio::test(start_paused = true)]
async fn chanting_text_is_caught() {
    let chant = "Let me check the status of the job once more. ".repeat(12);
    let yaml = format!(
        "name: chant\ntools: [echo]\nlimits: {{ max_iterations: 20 }}\nscript:\n  - {{ text: \"{chant}\", tool: echo, args: {{ text: a }} }}\n  - {{ text: \"{chant}\", tool: echo, args: {{ text: b }} }}\n  - {{ text: never }}\n"
    );
    let (r, events, audited) = run(&yaml).await;
    steered_then_killed(&r, &events, &audited, LoopKind::Chant);
    assert_eq!(r.iterations, 2);
}

#[tokio::test(start_paused = true)]
async fn a_batch_of_200_distinct_calls_is_never_flagged() {
    // 200 chunks, each call and each result different, no text.
    let mut yaml = String::from(
        "name: batch\ntools: [upper]\nlimits: { max_iterations: 300, max_runtime: 1h }\nscript:\n",
    );
    for i in 0..200 {
        yaml += &format!("  - {{ tool: upper, args: {{ text: \"chunk {i} of the corpus\" }} }}\n");
    }
    yaml += "  - { text: \"all 200 chunks done\" }\n";
    let (r, _, _) = run(&yaml).await;
    assert_eq!(r.status, RunStatus::Ok, "{:?}", r.critic);
    assert!(r.critic.is_empty(), "{:?}", r.critic);
    assert_eq!(r.steps.len(), 200);
    assert_eq!(r.loop_kind, None);

    // The same batch as parallel calls in a few steps.
    let mut yaml = String::from("name: fan\ntools: [upper]\nscript:\n");
    for step in 0..4 {
        let calls: Vec<String> = (0..50)
            .map(|i| format!("{{ tool: upper, args: {{ text: \"part {step}-{i}\" }} }}"))
            .collect();
        yaml += &format!("  - {{ tools: [{}] }}\n", calls.join(", "));
    }
    yaml += "  - { text: done }\n";
    let (r, _, _) = run(&yaml).await;
    assert_eq!(r.status, RunStatus::Ok, "{:?}", r.critic);
    assert!(r.critic.is_empty(), "{:?}", r.critic);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_fails_twice_then_succeeds_is_never_flagged() {
    let (r, _, _) = run(r#"
name: retry
tools: [fail, add]
script:
  - { tool: fail, args: { reason: "connection reset by 10.0.0.7:443" } }
  - { tool: fail, args: { reason: "connection reset by 10.0.0.9:443" } }
  - { tool: add, args: { a: 2, b: 3 } }
  - { text: "5" }
"#)
    .await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert!(r.critic.is_empty(), "{:?}", r.critic);
}

#[tokio::test(start_paused = true)]
async fn a_detector_at_zero_is_off_and_repeat_limit_still_spells_repeat() {
    let (r, _, _) = run(r#"
name: off
tools: [upper, echo]
limits: { max_iterations: 9 }
critic: { loops: { cycle: 0, same_observation: 0, no_progress: 0 } }
script:
  - { tool: upper, args: { text: draft } }
  - { tool: echo, args: { text: draft } }
  - { tool: upper, args: { text: draft } }
  - { tool: echo, args: { text: draft } }
  - { tool: upper, args: { text: draft } }
  - { tool: echo, args: { text: draft } }
  - { tool: upper, args: { text: draft } }
  - { tool: echo, args: { text: draft } }
  - { text: done }
"#)
    .await;
    assert_eq!(r.status, RunStatus::Ok, "{:?}", r.critic);

    // The legacy spelling sets `repeat`; `critic.loops.repeat` wins over
    // an invocation's `repeat_limit`.
    for (yaml, iterations) in [
        ("limits: { repeat_limit: 2 }", 3),
        ("critic: { loops: { repeat: 2 } }", 3),
    ] {
        let (r, _, _) = run(&format!(
            "name: legacy\ntools: [echo]\n{yaml}\nscript:\n  - {{ tool: echo, args: {{ text: again }}, forever: true }}\n"
        ))
        .await;
        assert_eq!(r.loop_kind, Some(LoopKind::Repeat), "{yaml}");
        assert_eq!(r.iterations, iterations, "{yaml}");
    }
    let (host, _) = support::host().await;
    let spec = support::spec(
        "name: legacy\ntools: [echo]\ncritic: { loops: { repeat: 2 } }\nscript:\n  - { tool: echo, args: { text: again }, forever: true }\n",
    );
    let mut inv = Invocation::prompt("x");
    inv.limits = agentvisor::spec::LimitsSpec {
        repeat_limit: Some(50),
        ..Default::default()
    };
    let r = host.execute(spec, inv).await.unwrap();
    assert_eq!(r.loop_kind, Some(LoopKind::Repeat));
    assert_eq!(r.iterations, 3);
    host.shutdown().await;
}

#[test]
fn the_critic_section_is_checked_like_the_rest_of_the_manifest() {
    let base = "name: m\ntools: [echo]\nscript:\n  - { text: hi }\n";
    let refused = |extra: &str| match AgentSpec::from_yaml(&format!("{base}{extra}")) {
        Ok(_) => panic!("accepted: {extra}"),
        Err(e) => e.to_string(),
    };
    let e = refused("critic: { loops: { repaet: 3 } }\n");
    assert!(e.contains("repaet"), "{e}");
    let e = refused("critic: { lopos: {} }\n");
    assert!(e.contains("lopos"), "{e}");
    let e = refused("critic: { loops: { same_observation: 1 } }\n");
    assert!(
        e.contains("critic.loops.same_observation") && e.contains("2 to 32"),
        "{e}"
    );
    assert!(e.contains("line 5"), "{e}");
    let e = refused("critic: { loops: { chant: 101 } }\n");
    assert!(e.contains("critic.loops.chant"), "{e}");
    let e = refused("critic: { loops: { poll: -1 } }\n");
    assert!(e.contains("poll") || e.contains("invalid"), "{e}");
    let e = refused("critic: { loops: sometimes }\n");
    assert!(e.contains("`off` or a map"), "{e}");
    for off in ["off", "\"off\""] {
        let spec = AgentSpec::from_yaml(&format!("{base}critic: {{ loops: {off} }}\n")).unwrap();
        assert_eq!(spec.critic.loops, agentvisor::spec::LoopsSpec::off());
    }
    let e = refused("limits: { repeat_limit: 4 }\ncritic: { loops: { repeat: 4 } }\n");
    assert!(e.contains("older spelling"), "{e}");
    let e = match AgentSpec::from_yaml(
        "name: p\ncritic: { loops: { repeat: 2 } }\nphases:\n  - { name: a, prompt: go, limits: { repeat_limit: 3 }, script: [{ text: hi }] }\n",
    ) {
        Ok(_) => panic!("a phase's repeat_limit with critic.loops.repeat was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("older spelling"), "{e}");

    let ok = AgentSpec::from_yaml(&format!(
        "{base}critic:\n  loops: {{ repeat: 0, same_observation: 32, same_error: 2, cycle: 10000, poll: 0, no_progress: 2, chant: 100 }}\n"
    ))
    .unwrap();
    assert_eq!(ok.critic.loops.same_observation, Some(32));
    // It survives a round trip (checkpoints keep the manifest).
    let back: AgentSpec = serde_json::from_value(serde_json::to_value(&ok).unwrap()).unwrap();
    assert_eq!(back.critic, ok.critic);
}

#[tokio::test(start_paused = true)]
async fn the_critic_sees_the_trace_and_the_time_since_progress() {
    use agentvisor::ports::critic::{CriticPolicy, Decision, RunView, Trigger, Verdict};
    use std::sync::Mutex;
    /// Continues on everything, and keeps what it was shown.
    #[derive(Default)]
    struct Watching(Mutex<Vec<(Trigger, RunView)>>);
    impl CriticPolicy for Watching {
        fn decide(&self, trigger: Trigger, view: &RunView) -> Verdict {
            self.0.lock().unwrap().push((trigger, view.clone()));
            Verdict::Now(Decision::Continue)
        }
    }
    let policy = Arc::new(Watching::default());
    let host = Host::builder()
        .critic_policy(policy.clone())
        .build()
        .await
        .unwrap();
    let spec = support::spec(
        "name: seen\ntools: [add, echo]\nlimits: { max_iterations: 12 }\nscript:\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { tool: echo, args: { text: x } }\n  - { tool: add, args: { a: 1, b: 2 }, latency: 3s }\n  - { tool: echo, args: { text: x } }\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { tool: echo, args: { text: x } }\n  - { text: done }\n",
    );
    let r = host.execute(spec, Invocation::prompt("x")).await.unwrap();
    assert_eq!(r.status, RunStatus::Ok);
    host.shutdown().await;
    let seen = policy.0.lock().unwrap();
    let (trigger, view) = seen.first().expect("the policy was asked");
    assert_eq!(
        *trigger,
        Trigger::Loop {
            kind: LoopKind::Cycle,
            count: 3
        }
    );
    assert_eq!(view.trace.len(), 6);
    let newest = view.trace.back(0).unwrap();
    let oldest = view.trace.back(5).unwrap();
    assert!(newest.ok && oldest.ok);
    assert_eq!(view.trace.back(1).unwrap().call, oldest.call);
    assert_ne!(newest.call, oldest.call);
    assert!(
        view.since_progress.as_secs() >= 3,
        "{:?}",
        view.since_progress
    );
}

#[test]
fn the_loops_example_exits_non_zero_with_its_loop_in_json_and_on_record() {
    use support::cli::agentvisor;
    let dir = support::scratch::Scratch::new("loops");
    let db = dir.path("a.db").display().to_string();
    let run = agentvisor(&["run", "examples/agents/loops.yaml", "--db", &db, "--json"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    let result: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(result["status"], "killed");
    assert_eq!(result["kill_reason"], "runaway");
    assert_eq!(result["loop"], "cycle");
    assert_eq!(result["critic"][0]["action"], "steer");
    assert_eq!(result["critic"][0]["loop"], "cycle");
    assert_eq!(result["critic"][1]["loop"], "cycle");

    // The database keeps it: the result and the kill's record.
    let id = result["run_id"].as_str().unwrap();
    let show = agentvisor(&["runs", "show", id, "--db", &db, "--json"]);
    let shown = support::cli::ok_json(&show);
    assert_eq!(
        shown["result"], result,
        "the recorded result is the printed one"
    );
    let kill = shown["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r.to_string().contains("critic.kill"))
        .cloned()
        .unwrap_or_default();
    assert!(kill.to_string().contains("\"loop\":\"cycle\""), "{kill}");
}
