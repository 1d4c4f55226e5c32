//! Fork and diff (P3): a fork takes exactly K recorded steps (no model
//! call before K), goes on live under its own manifest, follows the effect
//! policy for its tool calls, is a run like any other (its critic kills
//! it, it spends its caller's budget), and reports a recording that does
//! not reproduce; `diff` finds the first step where two runs part.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::sync::{Arc, Mutex};

use agentvisor::diff::diff;
use agentvisor::fork::{fork, ForkError, ForkOptions, ForkOutcome, Recording};
use agentvisor::ports::audit::{AuditRecord, AuditStore};
use agentvisor::ports::budget::{BudgetLedger, BudgetLimits};
use agentvisor::ports::model::{ChatModel, ChatRequest, ChatResponse, ModelError};
use agentvisor::ports::tool::ToolEffect;
use agentvisor::providers::ScriptedModel;
use agentvisor::stores::{MemoryAuditStore, MemoryBudgetLedger};
use agentvisor::{Host, Invocation, KillReason, RunId, RunStatus};
use async_trait::async_trait;
use support::CountingTool;

/// A scripted model that notes the call index of every call it gets.
struct CountedModel {
    name: &'static str,
    inner: ScriptedModel,
    calls: Mutex<Vec<u32>>,
}

impl CountedModel {
    fn new(name: &'static str, script_yaml: &str) -> Arc<Self> {
        let spec = support::spec(&format!("name: s\nmodel: scripted\n{script_yaml}"));
        Arc::new(CountedModel {
            name,
            inner: ScriptedModel::new(spec.script),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn calls(&self) -> Vec<u32> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl ChatModel for CountedModel {
    fn name(&self) -> &str {
        self.name
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        self.calls.lock().unwrap().push(request.call_index);
        self.inner.complete(request).await
    }
}

/// The recorded run: five steps over `add`, `upper` and `count`.
const SOURCE_SCRIPT: &str = r#"script:
  - { tool: add, args: { a: 1, b: 2 }, usage: { input: 10, output: 5 } }
  - { tool: count, args: { n: 1 }, usage: { input: 10, output: 5 } }
  - { tool: upper, args: { text: x }, usage: { input: 10, output: 5 } }
  - { tool: count, args: { n: 2 }, usage: { input: 10, output: 5 } }
  - { text: "done A", usage: { input: 10, output: 5 } }
"#;

const SOURCE: &str = "name: forked\nmodel: source\nsystem: You add.\ntools: [add, upper, count]\n";

struct Bench {
    host: Host,
    store: Arc<MemoryAuditStore>,
    source: Arc<CountedModel>,
    forked: Arc<CountedModel>,
    counter: Arc<CountingTool>,
    ledger: Arc<MemoryBudgetLedger>,
}

/// A host with the source model, the fork's model (playing `fork_script`)
/// and the counting tool (class `unknown`: it declares none).
async fn bench(fork_script: &str) -> Bench {
    let source = CountedModel::new("source", SOURCE_SCRIPT);
    let forked = CountedModel::new("forked", fork_script);
    let counter = CountingTool::new();
    let ledger = Arc::new(MemoryBudgetLedger::new());
    let (host, store) = support::host_from(
        support::builder()
            .model("source", source.clone())
            .model("forked", forked.clone())
            .tool(counter.clone())
            .budget_ledger(ledger.clone()),
    )
    .await;
    Bench {
        host,
        store,
        source,
        forked,
        counter,
        ledger,
    }
}

impl Bench {
    async fn record(&self, caller: &str) -> (RunId, Vec<AuditRecord>) {
        let r = self
            .host
            .submit(
                support::spec(SOURCE),
                Invocation::prompt("go").caller(caller),
            )
            .await
            .unwrap()
            .await;
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        (r.run_id, self.store.run_records(r.run_id).await.unwrap())
    }

    async fn fork(
        &self,
        manifest: &str,
        records: &[AuditRecord],
        id: RunId,
        options: ForkOptions,
    ) -> ForkOutcome {
        let recording = Recording::from_records(id, records).unwrap();
        fork(&self.host, support::spec(manifest), &recording, options)
            .await
            .unwrap()
            .finish()
            .await
    }
}

fn at(k: u32) -> ForkOptions {
    ForkOptions {
        at_step: k,
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_fork_reuses_exactly_k_recorded_steps_then_plays_its_script_from_k_plus_1() {
    let b = bench(
        r#"script:
  - { text: "entry 1 stands for a recorded step" }
  - { text: "entry 2 stands for a recorded step" }
  - { text: "entry 3 stands for a recorded step" }
  - { tool: upper, args: { text: forked }, usage: { input: 7, output: 3 } }
  - { text: "done B", usage: { input: 7, output: 3 } }
"#,
    )
    .await;
    let (id, records) = b.record("cli").await;
    assert_eq!(b.source.calls().len(), 5);
    assert_eq!(b.counter.runs(), 2);
    let manifest =
        "name: forked\nmodel: forked\nsystem: You add, differently.\ntools: [add, upper, count]\n";
    let out = b.fork(manifest, &records, id, at(3)).await;
    let r = &out.result;
    assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    assert_eq!(r.output.as_deref(), Some("done B"));
    assert_ne!(r.run_id, id);
    let origin = r.forked_from.expect("a fork says where it came from");
    assert_eq!((origin.run_id, origin.step), (id, 3));
    // No model call before K: the fork's model was asked for calls 4 and 5
    // only (indices 3 and 4), and the source model never again.
    assert_eq!(b.forked.calls(), vec![3, 4]);
    assert_eq!(b.source.calls().len(), 5);
    // Steps 1 to 3 are the recording's (the `count` call answered from it:
    // the tool did not run again), then the fork's own step.
    let tools: Vec<(u32, &str, &str)> = r
        .steps
        .iter()
        .map(|s| (s.iteration, &*s.tool, s.result.as_str()))
        .collect();
    assert_eq!(
        tools,
        vec![
            (1, "add", "3"),
            (2, "count", "counted 1"),
            (3, "upper", "X"),
            (4, "upper", "FORKED")
        ]
    );
    assert_eq!(b.counter.runs(), 2);
    assert_eq!(out.divergence, None);
    // The replayed steps cost nothing: only the two live calls count.
    assert_eq!(r.usage.total(), 20);
    // Recorded like any run, with its origin; diff finds step 4 first.
    let fork_records = b.store.run_records(r.run_id).await.unwrap();
    let d = diff(id, &records, r.run_id, &fork_records).unwrap();
    let first = d.first_divergence.clone().expect("the runs part");
    assert_eq!(first.step, 4, "{d:#?}");
    assert!(d.steps[..3].iter().all(|p| p.same), "{d:#?}");
    assert_eq!(d.b.forked_from, Some(origin));
    assert!(d.endings.differences.contains(&"output"));
    b.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_fork_whose_recording_does_not_reproduce_says_where() {
    let b = bench("script:\n  - { text: unused }\n  - { text: unused }\n  - { text: unused }\n  - { text: fine }\n").await;
    let (id, records) = b.record("cli").await;
    // The fork's manifest no longer has `upper`: step 3's call, answered
    // `X` on record, is now refused as an unknown tool.
    let manifest = "name: forked\nmodel: forked\ntools: [add, count]\n";
    let out = b.fork(manifest, &records, id, at(3)).await;
    let d = out.divergence.expect("step 3 does not reproduce");
    assert_eq!(d.step, 3, "{d:#?}");
    let forked = d.forked.expect("the fork has a step 3");
    assert!(!forked.results[0].ok, "{forked:?}");
    assert!(
        forked.results[0].result.contains("unknown_tool"),
        "{forked:?}"
    );
    assert_eq!(d.recorded.unwrap().results[0].result, "X");
    // It still went on live from step 4.
    assert_eq!(out.result.output.as_deref(), Some("fine"));
    b.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn tool_calls_after_k_follow_the_effect_policy() {
    // After K = 1: `count` {n: 2} was recorded (at step 4), {n: 9} was not.
    let script = r#"script:
  - { text: unused }
  - { tool: count, args: { n: 2 } }
  - { tool: count, args: { n: 9 } }
  - { tool: add, args: { a: 4, b: 4 } }
  - { text: done }
"#;
    let b = bench(script).await;
    let (id, records) = b.record("cli").await;
    assert_eq!(b.counter.runs(), 2);
    let steps = |out: &ForkOutcome| -> Vec<(bool, String)> {
        out.result.steps[1..]
            .iter()
            .map(|s| (s.ok, s.error.clone().unwrap_or_else(|| s.result.clone())))
            .collect()
    };

    // `count` declares no class (unknown); the manifest calls it `write`.
    let manifest =
        "name: forked\nmodel: forked\ntools: [add, count]\ntools_effects: { count: write }\n";
    let out = b.fork(manifest, &records, id, at(1)).await;
    assert_eq!(out.result.status, RunStatus::Ok, "{:?}", out.result);
    let s = steps(&out);
    assert_eq!(
        s[0],
        (true, "counted 2".to_string()),
        "recorded: answered from the recording"
    );
    assert!(!s[1].0 && s[1].1.contains("not_executed_in_fork"), "{s:?}");
    assert!(s[1].1.contains("`write`"), "{s:?}");
    assert_eq!(s[2], (true, "8".to_string()), "`add` is read: live");
    assert_eq!(b.counter.runs(), 2, "the write tool never ran");

    // `--live-tools write`: both calls run live.
    let live = ForkOptions {
        live: vec![ToolEffect::Write],
        ..at(1)
    };
    let out = b.fork(manifest, &records, id, live).await;
    assert_eq!(steps(&out)[1], (true, "counted 9".to_string()));
    assert_eq!(b.counter.runs(), 4);

    // A manifest that calls the tool `read` runs it live too.
    let read = "name: forked\nmodel: forked\ntools: [add, count]\ntools_effects: { count: read }\n";
    let out = b.fork(read, &records, id, at(1)).await;
    assert_eq!(steps(&out)[1], (true, "counted 9".to_string()));
    assert_eq!(b.counter.runs(), 6);
    b.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_fork_is_killed_by_its_critic_like_any_run() {
    let b = bench(
        "script:\n  - { text: unused }\n  - { tool: add, args: { a: 1, b: 1 }, forever: true }\n",
    )
    .await;
    let (id, records) = b.record("cli").await;
    let manifest =
        "name: forked\nmodel: forked\ntools: [add, count]\ncritic: { loops: { repeat: 3 } }\n";
    let out = b.fork(manifest, &records, id, at(1)).await;
    assert_eq!(out.result.status, RunStatus::Killed, "{:?}", out.result);
    assert_eq!(out.result.kill_reason, Some(KillReason::Runaway));
    assert!(out.result.forked_from.is_some());
    b.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_fork_spends_its_callers_budget_and_not_for_the_recorded_steps() {
    let b = bench(
        "script:\n  - { text: unused }\n  - { text: unused }\n  - { tool: add, args: { a: 1, b: 1 }, usage: { input: 500, output: 100 }, forever: true }\n",
    )
    .await;
    b.ledger.set_limits(
        "alice",
        BudgetLimits {
            tokens: Some(1500),
            ..Default::default()
        },
    );
    let (id, records) = b.record("alice").await;
    // The recording's caller is the fork's: the fork is stopped by alice's
    // budget, which only its live calls spend (75 tokens recorded before).
    let manifest = "name: forked\nmodel: forked\ntools: [add, count]\ncritic: { loops: off }\n";
    let out = b.fork(manifest, &records, id, at(2)).await;
    let r = &out.result;
    assert_eq!(r.status, RunStatus::BudgetExceeded, "{r:?}");
    assert_eq!(r.kill_reason, Some(KillReason::Budget));
    assert_eq!(r.caller_id.as_deref(), Some("alice"));
    let live = b.forked.calls();
    assert!(live.iter().all(|i| *i >= 2), "{live:?}");
    assert_eq!(r.usage.total(), 600 * live.len() as u64, "{r:?}");
    b.host.shutdown().await;
    let spent = b
        .ledger
        .spent("alice", std::time::Duration::from_secs(86_400))
        .await
        .unwrap();
    assert_eq!(spent.tokens, 75 + 600 * live.len() as u64, "{spent:?}");
}

#[tokio::test(start_paused = true)]
async fn a_step_past_the_recording_is_refused_before_anything_runs() {
    let b = bench("script:\n  - { text: x }\n").await;
    let (id, records) = b.record("cli").await;
    let recording = Recording::from_records(id, &records).unwrap();
    assert_eq!(recording.last_step(), 5);
    let e = fork(
        &b.host,
        support::spec("name: f\nmodel: forked\n"),
        &recording,
        at(6),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(
            e,
            ForkError::StepOutOfRange {
                step: 6,
                last: 5,
                ..
            }
        ),
        "{e}"
    );
    assert!(b.forked.calls().is_empty());
    let e = Recording::from_records(RunId(7), &[]).err().unwrap();
    assert!(matches!(e, ForkError::NotRecorded(_)), "{e}");
    b.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn diff_of_identical_runs_finds_no_divergence_and_of_runs_parting_at_3_finds_3() {
    let b = bench("script:\n  - { text: x }\n").await;
    let (a, ra) = b.record("cli").await;
    let (c, rc) = b.record("cli").await;
    let d = diff(a, &ra, c, &rc).unwrap();
    assert_eq!(d.first_divergence, None, "{d:#?}");
    assert!(d.endings.same && d.steps.len() == 5);
    let json = serde_json::to_value(&d).unwrap();
    assert!(json["first_divergence"].is_null());

    // Another script, the same until its step 3.
    let other = "name: other\nmodel: forked\ntools: [add, upper, count]\n";
    let b2 = bench(
        r#"script:
  - { tool: add, args: { b: 2, a: 1 } }
  - { tool: count, args: { n: 1 } }
  - { tool: upper, args: { text: y } }
  - { text: "done A" }
"#,
    )
    .await;
    let (a2, ra2) = b2.record("cli").await;
    let r = b2
        .host
        .submit(support::spec(other), Invocation::prompt("go"))
        .await
        .unwrap()
        .await;
    let rb = b2.store.run_records(r.run_id).await.unwrap();
    let d = diff(a2, &ra2, r.run_id, &rb).unwrap();
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["first_divergence"]["step"], 3, "{json:#}");
    assert_eq!(
        json["first_divergence"]["what"],
        serde_json::json!(["calls", "results"])
    );
    // Steps 1 and 2 agree (arguments compared in canonical form).
    assert_eq!(json["steps"][0]["same"], true);
    assert_eq!(json["steps"][1]["same"], true);
    assert_eq!(
        json["steps"][4]["differences"],
        serde_json::json!(["missing"])
    );
    b.host.shutdown().await;
    b2.host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn eval_of_50_runs_twice_each_stops_when_its_budget_is_spent_and_reports_what_it_did() {
    use agentvisor::eval::{cohort, eval, html, EvalOptions};
    let (recorder, store) = support::host().await;
    let recorded = "name: cohort\nmodel: scripted\ntools: [add]\nscript:\n  - { tool: add, args: { a: 1, b: 2 }, usage: { input: 10, output: 5 } }\n  - { text: \"three\", usage: { input: 10, output: 5 } }\n";
    for _ in 0..50 {
        let r = recorder
            .submit(support::spec(recorded), Invocation::prompt("go"))
            .await
            .unwrap()
            .await;
        assert_eq!(r.status, RunStatus::Ok);
    }
    // Another agent's run is not in the cohort.
    recorder
        .submit(
            support::spec("name: other\nmodel: scripted\nscript: [{ text: x }]\n"),
            Invocation::prompt("go"),
        )
        .await
        .unwrap()
        .await;
    recorder.shutdown().await;

    // The sweep's host: one budget of 5 000 tokens for 100 forks of 100.
    let host = support::builder()
        .audit_store(store.clone())
        .allowance_tokens(Some(5_000))
        .build()
        .await
        .unwrap();
    let options = EvalOptions {
        agent: "cohort".into(),
        at_step: 1,
        repeats: 2,
        concurrency: 1,
        ..Default::default()
    };
    let runs = cohort(&*store, &options).await.unwrap();
    assert_eq!(runs.len(), 50);
    let forked = "name: cohort\nmodel: scripted\ntools: [add]\nscript:\n  - { text: unused }\n  - { text: \"3\", usage: { input: 90, output: 10 } }\n";
    let report = eval(&host, &runs, support::spec(forked), &options).await;
    host.shutdown().await;
    let t = &report.totals;
    assert_eq!(t.planned, 100);
    assert!(t.stopped_by_budget, "{t:#?}");
    assert_eq!(t.forked + t.not_run, 100);
    assert!((45..=55).contains(&t.forked), "about half ran: {t:#?}");
    assert!(t.tokens_after <= 5_000 + 100, "{t:#?}");
    // Every fork that ran changed the ending's output, not its status,
    // until the budget ran out; the rest say why they did not run.
    assert!(t.status_changes["ok→ok"] >= 44, "{t:#?}");
    assert!(
        t.status_changes.contains_key("ok→budget_exceeded"),
        "{t:#?}"
    );
    assert!(t.divergence_histogram["2"] >= 44, "{t:#?}");
    let skipped = report.rows.iter().filter(|r| r.after.is_none()).count();
    assert_eq!(skipped, t.not_run);
    assert!(report.rows.iter().filter(|r| r.after.is_none()).all(|r| r
        .note
        .as_deref()
        .unwrap_or("")
        .starts_with("not_run")));
    // A fork's ending changed: its run is listed.
    assert!(!t.changed.is_empty());
    let page = html(&report);
    assert!(page.contains("<svg id=\"histogram\"") && page.contains("<table id=\"forks\""));
    // The forks are runs of the agent too, but not of the next cohort.
    let again = cohort(&*store, &options).await.unwrap();
    assert_eq!(again.len(), 50);
}
