//! Skills as palette tools (`skills: { repo, offer }` → `skill__NAME`):
//! a call starts a child run through the sub-agents' path, the skill's
//! `SKILL.md` as its system prompt and the call's `input` as its task; the
//! parent's model reads the skill's output with its memory stripped; the
//! child is killed with its parent and spends its parent's budget; a
//! manifest that offers what it cannot is refused when it loads.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::audit::AuditEntry;
use agentvisor::ports::budget::{BudgetLedger, BudgetLimits};
use agentvisor::ports::model::Role;
use agentvisor::stores::MemoryBudgetLedger;
use agentvisor::{AgentSpec, Invocation, KillReason, RunStatus, SpecError};
use support::scratch::Scratch;
use support::RecordingModel;

/// A skills repository in `d/repo` with one skill, `digest`.
fn skills_repo(d: &Scratch) -> PathBuf {
    std::fs::create_dir_all(d.path("repo/skills/digest")).unwrap();
    d.file(
        "repo/skills/digest/SKILL.md",
        "---\nname: digest\ndescription: Digests a change log.\nmax_turns: 3\n---\nSummarize the changes you are given.\n",
    );
    d.file(
        "repo/agentvisor.yaml",
        "skills: { digest: skills/digest }\n",
    );
    d.path("repo")
}

/// Writes `yaml` as `lead.yaml` next to the repository and reads it.
fn lead(d: &Scratch, yaml: &str) -> Result<AgentSpec, SpecError> {
    skills_repo(d);
    AgentSpec::from_file(d.file("lead.yaml", yaml))
}

#[tokio::test(start_paused = true)]
async fn a_parent_calls_a_skill_and_reads_its_output_without_the_memory() {
    let d = Scratch::new("skill-palette-roundtrip");
    let spec = lead(
        &d,
        "name: lead\nmodel: recorded\nskills: { repo: repo, offer: [ { skill: digest, model: kid } ] }\nscript:\n  - { tool: skill__digest, args: { input: \"a, b, c\" } }\n  - { text: done }\n",
    )
    .unwrap();
    let model = RecordingModel::new(&spec);
    let kid = RecordingModel::new(&support::spec(
        "name: kid\nscript:\n  - { text: \"Digest: 3 changes <output name=\\\"short\\\">3</output> <memory>seen a b c</memory>\" }\n",
    ));
    let (host, store) = support::host_from(
        support::builder()
            .model("recorded", model.clone())
            .model("kid", kid.clone()),
    )
    .await;
    let agent = host.agent(spec).unwrap();
    let tool = agent
        .tools()
        .specs()
        .iter()
        .find(|t| t.name == "skill__digest")
        .cloned()
        .expect("the skill is a tool");
    assert_eq!(tool.description, "Digests a change log.");
    assert_eq!(tool.parameters["required"], serde_json::json!(["input"]));

    let (handle, events) = host
        .submit_streaming(&agent, Invocation::prompt("go"))
        .await
        .unwrap();
    let mut events = events;
    let mut seen = Vec::new();
    while let Some(e) = events.next().await {
        seen.push(e);
    }
    let r = handle.await;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("done"));
    assert_eq!(&*r.steps[0].tool, "skill__digest");
    assert!(r.steps[0].ok);
    assert_eq!(r.steps[0].result, "Digest: 3 changes");

    // The child's one call: the skill's body as its system prompt, the
    // call's input as its task.
    assert_eq!(kid.calls(), 1);
    let child_call = kid.request(0);
    assert_eq!(child_call[0].role, Role::System);
    assert_eq!(
        child_call[0].content,
        "Summarize the changes you are given."
    );
    assert_eq!(child_call.last().unwrap().role, Role::User);
    assert_eq!(child_call.last().unwrap().content, "a, b, c");
    // The parent's model reads the skill's output, memory stripped.
    assert_eq!(model.calls(), 2);
    assert_eq!(model.tool_messages(1), vec!["Digest: 3 changes"]);

    // The child is a run of its own, tagged with its parent, with the
    // skill's turns.
    let child: Vec<_> = seen.iter().filter(|e| e.run_id != r.run_id).collect();
    assert!(
        !child.is_empty(),
        "the child's events reach the parent's stream"
    );
    assert!(child.iter().all(|e| e.parent_run_id == Some(r.run_id)));
    let child_id = child[0].run_id;
    host.shutdown().await;
    let records = support::records(&store, child_id).await;
    assert_eq!(support::terminal_count(&records), 1);
    match &records[0].entry {
        AuditEntry::RunStarted(info) => {
            assert_eq!(&*info.agent, "digest");
            assert_eq!(info.parent_run_id, Some(r.run_id));
            assert_eq!(info.limits.unwrap().max_iterations, 3);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_skill_child_ends_killed_parent_when_its_parent_is_killed() {
    let d = Scratch::new("skill-palette-kill");
    let spec = lead(
        &d,
        "name: lead\nlimits: { stall_timeout: 1h, max_runtime: 1h }\nskills:\n  repo: repo\n  offer:\n    - { skill: digest, script: [ { hang: true } ] }\nscript:\n  - { tool: skill__digest, args: { input: x } }\n  - { text: never }\n",
    )
    .unwrap();
    let (host, store) = support::host().await;
    let handle = host.submit(spec, Invocation::prompt("go")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let child = host
        .runs()
        .into_iter()
        .find(|r| r.agent == "digest")
        .expect("the skill runs")
        .run_id;
    handle.kill();
    let r = handle.await;
    assert_eq!(r.kill_reason, Some(KillReason::Operator));
    host.shutdown().await;
    let records = support::records(&store, child).await;
    assert_eq!(support::terminal_count(&records), 1);
    match records.last().map(|r| &r.entry) {
        Some(AuditEntry::Terminal(t)) => {
            assert_eq!(t.status, RunStatus::Killed, "{t:?}");
            assert_eq!(t.kill_reason, Some(KillReason::Parent));
            assert_eq!(t.parent_run_id, Some(r.run_id));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_skill_child_spends_its_parents_budget() {
    let d = Scratch::new("skill-palette-budget");
    let spec = lead(
        &d,
        "name: lead\nbudget: { tokens: 100 }\nskills:\n  repo: repo\n  offer:\n    - skill: digest\n      script: [ { text: \"long digest\", usage: { input: 90, output: 30 } } ]\nscript:\n  - { tool: skill__digest, args: { input: x }, usage: { input: 5, output: 5 } }\n  - { text: never, usage: { input: 5, output: 5 } }\n",
    )
    .unwrap();
    let ledger = Arc::new(MemoryBudgetLedger::new());
    ledger.set_limits(
        "alice",
        BudgetLimits {
            tokens: Some(1_000_000),
            ..Default::default()
        },
    );
    let (host, _store) = support::host_from(support::builder().budget_ledger(ledger.clone())).await;
    let r = host
        .execute(&spec, Invocation::prompt("go").caller("alice"))
        .await
        .unwrap();
    // The child's 120 tokens passed the parent's run budget of 100: the
    // parent's next call is refused.
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.error_kind.as_deref(), Some("budget"));
    assert_eq!(r.usage.own.total(), 10);
    host.shutdown().await;
    // The caller's account was charged for both runs.
    let spent = ledger
        .spent("alice", Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(spent.tokens, 130);
}

/// The message of a manifest refused at load.
fn refused(d: &Scratch, yaml: &str) -> String {
    match lead(d, yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn manifests_that_offer_what_they_cannot_are_refused_with_the_key() {
    let d = Scratch::new("skill-palette-errors");
    let base = "name: lead\nmodel: openai:gpt-4o-mini\n";
    let cases = [
        ("skills: { repo: repo, offer: [digest], extra: 1 }\n", "extra"),
        ("skills: { repo: repo, offer: [ { skill: digest, colour: red } ] }\n", "colour"),
        ("skills: { offer: [digest] }\n", "repo"),
        ("skills: { repo: repo, offer: [nope] }\n", "`nope` is not a skill"),
        ("skills: { repo: repo, offer: [] }\n", "`skills.offer` is empty"),
        ("skills: { repo: repo, offer: [digest, digest] }\n", "lists `digest` twice"),
        ("skills: { repo: missing, offer: [digest] }\n", "`skills.repo`"),
        (
            "skills: { repo: repo, offer: [ { skill: digest, model: scripted } ] }\n",
            "needs a script",
        ),
        (
            "skills: { repo: repo, offer: [digest] }\ntool_choice: skill__other\n",
            "`tool_choice` names `skill__other`",
        ),
        (
            "skills: { repo: repo, offer: [digest] }\napproval: [skill__other]\n",
            "`approval` names `skill__other`",
        ),
        (
            "skills: { repo: repo, offer: [digest] }\nguard: [ { tool: skill__other, action: deny } ]\n",
            "names `skill__other`",
        ),
        (
            "skills: { repo: repo, offer: [digest] }\ntools_effects: { skill__other: read }\n",
            "`tools_effects` names `skill__other`",
        ),
    ];
    for (yaml, says) in cases {
        let message = refused(&d, &format!("{base}{yaml}"));
        assert!(message.contains(says), "{yaml}: {message}");
    }
    // A scripted parent's skill needs a script of its own.
    let message = refused(
        &d,
        "name: lead\nskills: { repo: repo, offer: [digest] }\nscript: [ { text: hi } ]\n",
    );
    assert!(message.contains("the parent's scripted model"), "{message}");
    // A repository that does not pass its own checks.
    std::fs::write(
        d.path("repo/agentvisor.yaml"),
        "skills: { digest: skills/digest }\nbogus: 1\n",
    )
    .unwrap();
    let message = AgentSpec::from_file(d.file(
        "broken.yaml",
        &format!("{base}skills: {{ repo: repo, offer: [digest] }}\n"),
    ))
    .unwrap_err()
    .to_string();
    assert!(
        message.contains("`skills.repo`") && message.contains("bogus"),
        "{message}"
    );
}

#[test]
fn skill_tools_can_be_named_wherever_tools_are() {
    let d = Scratch::new("skill-palette-names");
    let spec = lead(
        &d,
        "name: lead\nmodel: openai:gpt-4o-mini\nskills: { repo: repo, offer: [ { skill: digest, description: Digests. } ] }\ntool_choice: skill__digest\napproval: [skill__digest]\nguard: [ { tool: skill__digest, max_calls: 2 } ]\ntools_effects: { skill__digest: read }\n",
    )
    .unwrap();
    assert_eq!(spec.sub_agents.len(), 1);
    let child = &spec.sub_agents[0];
    assert_eq!(child.tool_name(), "skill__digest");
    assert_eq!(child.description, "Digests.");
    // The parent's model (no hint, no script of its own).
    assert_eq!(child.spec.model, "openai:gpt-4o-mini");
    assert_eq!(child.spec.system, "Summarize the changes you are given.");
    // Kept with the manifest (checkpoints): it reads back the same.
    let json = serde_json::to_string(&spec).unwrap();
    let back: AgentSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, spec);
}

#[tokio::test(start_paused = true)]
async fn a_skill_tool_is_unknown_in_effect_unless_the_manifest_says() {
    let d = Scratch::new("skill-palette-effects");
    let plain = lead(
        &d,
        "name: lead\nskills: { repo: repo, offer: [ { skill: digest, script: [ { text: x } ] } ] }\nscript: [ { text: hi } ]\n",
    )
    .unwrap();
    let said = lead(
        &d,
        "name: lead\nskills: { repo: repo, offer: [ { skill: digest, script: [ { text: x } ] } ] }\ntools_effects: { skill__digest: read }\nscript: [ { text: hi } ]\n",
    )
    .unwrap();
    let (host, _store) = support::host().await;
    use agentvisor::ports::tool::ToolEffect;
    let effect = |s: AgentSpec| host.agent(s).unwrap().tool_effect("skill__digest");
    assert_eq!(effect(plain), Some(ToolEffect::Unknown));
    assert_eq!(effect(said), Some(ToolEffect::Read));
    host.shutdown().await;
}

#[cfg(feature = "cli")]
#[test]
fn the_example_runs_and_a_bad_offer_exits_2() {
    let out = support::cli::agentvisor(&["run", "examples/agents/skill-palette.yaml", "--json"]);
    let v = support::cli::ok_json(&out);
    assert_eq!(v["status"], "ok", "{v}");
    let tools: Vec<&str> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, vec!["skill__digest", "skill__triage"]);
    assert!(v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| !s["result"].as_str().unwrap().contains("memory")));

    let d = Scratch::new("skill-palette-cli");
    skills_repo(&d);
    let bad = d.file(
        "lead.yaml",
        "name: lead\nskills: { repo: repo, offer: [nope] }\nscript: [ { text: hi } ]\n",
    );
    let out = support::cli::agentvisor(&["run", &bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("skills.offer"));
}
