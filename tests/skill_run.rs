//! A scheduled skill's dry run on a host (`agentvisor::skill_run`): the
//! run goes through the host like any run, its answer is read into memory
//! and outputs, and a secret of its `env` reaches neither the model nor
//! the records nor the result.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentvisor::ports::model::Role;
use agentvisor::skill_run::{self, Outcome, Phase};
use agentvisor::skills::SkillsRepo;
use agentvisor::RunStatus;
use support::scratch::Scratch;

const SECRET: &str = "tok-9f8e7d6c5b4a3210";

fn repo(script: &str, model: &str) -> Scratch {
    let dir = Scratch::new("skill-run");
    std::fs::create_dir_all(dir.path("skills/watch")).unwrap();
    dir.file(
        "skills/watch/SKILL.md",
        "---\nname: watch\nmax_turns: 3\n---\nWatch the service.\n",
    );
    dir.file(
        "agentvisor.yaml",
        &format!(
            "skills: {{ watch: skills/watch }}\nschedules:\n  - name: watcher\n    skill: watch\n    cron: \"*/5 * * * *\"\n    model: {model}\n    env: {{ SERVICE: api, TOKEN: {{ secret: watch_token }} }}\n    script:\n{script}"
        ),
    );
    dir
}

fn lookup(var: &str) -> Option<String> {
    (var == "AGENTVISOR_SECRET_WATCH_TOKEN").then(|| SECRET.to_string())
}

#[tokio::test]
async fn a_secret_reaches_neither_the_model_nor_the_records_nor_the_output() {
    let script =
        "      - text: \"Checked. <output name=\\\"short\\\">fine</output> <memory>ok</memory>\"\n";
    let dir = repo(script, "recorded");
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let spec = repo.schedule("watcher").unwrap().spec.clone();
    let model = support::RecordingModel::new(&spec);
    let (host, store) =
        support::host_from(support::builder().model("recorded", model.clone())).await;
    let result = skill_run::dry_run(&host, &repo, "watcher", lookup)
        .await
        .unwrap();
    assert_eq!(result.outcome, Outcome::Succeeded, "{result:?}");
    assert_eq!(result.status, Some(RunStatus::Ok));
    // What the model was sent: the prompt and the env, the secret as such.
    let sent = model.request(0);
    let env = sent
        .iter()
        .find(|m| m.role == Role::System && m.content.starts_with("<env>"))
        .expect("an <env> system message");
    assert_eq!(env.content, "<env>\nSERVICE=api\nTOKEN=[secret]\n</env>");
    assert!(sent
        .iter()
        .any(|m| m.role == Role::User && m.content == "Watch the service."));
    for m in &sent {
        assert!(
            !m.content.contains(SECRET),
            "sent to the model: {}",
            m.content
        );
    }
    // The result and the records hold no secret.
    let json = serde_json::to_string(&result).unwrap();
    assert!(!json.contains(SECRET), "{json}");
    assert_eq!(
        result.outputs.get("short").map(String::as_str),
        Some("fine")
    );
    assert_eq!(result.memory.as_deref(), Some("ok"));
    host.shutdown().await;
    let records = support::records(&store, result.run_id.unwrap()).await;
    assert!(!records.is_empty());
    let stored =
        serde_json::to_string(&records.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>())
            .unwrap();
    assert!(!stored.contains(SECRET), "a record holds the secret");
}

#[tokio::test]
async fn an_answer_that_holds_a_secret_anyway_is_redacted() {
    // A model that somehow answers with the secret (a scripted one here:
    // providers redact what they parse, the scripted model does not).
    let script = format!(
        "      - text: \"Used {SECRET}. <output name=\\\"short\\\">{SECRET}</output> <memory>at {SECRET}</memory>\"\n"
    );
    let dir = repo(&script, "scripted");
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let (host, _store) = support::host().await;
    let r = skill_run::dry_run(&host, &repo, "watcher", lookup)
        .await
        .unwrap();
    let json = serde_json::to_string(&r).unwrap();
    assert!(!json.contains(SECRET), "{json}");
    assert_eq!(r.memory.as_deref(), Some("at [REDACTED]"));
    assert_eq!(r.output.as_deref(), Some("Used [REDACTED]."));
    host.shutdown().await;
}

#[tokio::test]
async fn memory_and_outputs_are_read_and_the_phases_recorded() {
    let script = "      - text: |\n          All good.\n          <output name=\"slack\">:ok:</output>\n          <memory>first</memory>\n          <memory>\n            second\n          </memory>\n        usage: { input: 100, output: 20 }\n";
    let dir = repo(script, "scripted");
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let (host, _store) = support::host().await;
    let r = skill_run::dry_run(&host, &repo, "watcher", lookup)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(r.output.as_deref(), Some("All good."));
    assert_eq!(r.memory.as_deref(), Some("second"));
    assert_eq!(r.outputs.get("slack").map(String::as_str), Some(":ok:"));
    assert_eq!(r.usage.own.input_tokens, 100);
    assert!(r.publish.is_empty() && r.writeback_sha.is_none() && r.dry_run);
    let phases: Vec<Phase> = r.phases.iter().map(|p| p.phase).collect();
    assert_eq!(phases, [Phase::Boot, Phase::Secrets, Phase::Exec]);
    host.shutdown().await;
}

#[tokio::test]
async fn a_missing_secret_fails_the_run_before_the_model() {
    let dir = repo("      - text: never\n", "scripted");
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let (host, _store) = support::host().await;
    let r = skill_run::dry_run(&host, &repo, "watcher", |_| None)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.error_kind.as_deref(), Some("missing_secret"));
    assert!(r
        .error
        .as_deref()
        .unwrap()
        .contains("AGENTVISOR_SECRET_WATCH_TOKEN"));
    assert!(r.run_id.is_none() && r.status.is_none());
    let last = r.phases.last().unwrap();
    assert_eq!((last.phase, last.prev), (Phase::Fail, Some(Phase::Secrets)));
    assert!(skill_run::dry_run(&host, &repo, "nope", lookup)
        .await
        .is_err());
    host.shutdown().await;
}

#[tokio::test]
async fn a_run_that_does_not_end_ok_is_a_failed_outcome() {
    let dir = repo("      - { fail: bad_request }\n", "scripted");
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let (host, _store) = support::host().await;
    let r = skill_run::dry_run(&host, &repo, "watcher", lookup)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.status, Some(RunStatus::Error));
    assert!(r.run_id.is_some() && r.error_kind.is_some());
    let last = r.phases.last().unwrap();
    assert_eq!((last.phase, last.prev), (Phase::Fail, Some(Phase::Exec)));
    host.shutdown().await;
}

/// A repository whose schedule `limited` has `settings` (YAML keys at the
/// schedule's indentation) and `script`.
fn limited(settings: &str, script: &str) -> Scratch {
    let dir = Scratch::new("skill-limits");
    std::fs::create_dir_all(dir.path("skills/watch")).unwrap();
    dir.file(
        "skills/watch/SKILL.md",
        "---\nname: watch\n---\nWatch the service.\n",
    );
    dir.file(
        "agentvisor.yaml",
        &format!(
            "skills: {{ watch: skills/watch }}\nschedules:\n  - name: limited\n    skill: watch\n    cron: \"*/5 * * * *\"\n{settings}    script:\n{script}"
        ),
    );
    dir
}

#[tokio::test]
async fn a_run_over_its_per_run_budget_is_stopped_by_the_budget() {
    let dir = limited(
        "    budget: { per_run: { tokens: 50 } }\n",
        "      - { tool: add, args: { a: 1, b: 2 }, usage: { input: 100, output: 10 } }\n      - { tool: add, args: { a: 3, b: 4 }, usage: { input: 100, output: 10 } }\n      - { text: never, usage: { input: 100, output: 10 } }\n",
    );
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let (host, _store) = support::host().await;
    let options = skill_run::RunOptions::default();
    let r = skill_run::run(&host, &repo, "limited", |_| None, &options)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.status, Some(RunStatus::BudgetExceeded), "{r:?}");
    assert_eq!(r.kill_reason, Some(agentvisor::KillReason::Budget));
    // Stopped after the call that crossed the cap: the answer never came.
    assert!(r.usage.own.input_tokens <= 200, "{:?}", r.usage);
    assert_ne!(r.output.as_deref(), Some("never"));
    let last = r.phases.last().unwrap();
    assert_eq!((last.phase, last.prev), (Phase::Fail, Some(Phase::Exec)));
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_model_is_killed_at_the_schedules_max_runtime() {
    let dir = limited(
        "    limits: { max_runtime: 5s, stall_timeout: 60s, soft_timeout: 4s }\n",
        "      - { text: late, latency: 120s }\n",
    );
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let (host, _store) = support::host().await;
    let started = tokio::time::Instant::now();
    let options = skill_run::RunOptions::default();
    let r = skill_run::run(&host, &repo, "limited", |_| None, &options)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.status, Some(RunStatus::Timeout), "{r:?}");
    assert_eq!(r.kill_reason, Some(agentvisor::KillReason::Deadline));
    assert!(r.output.as_deref() != Some("late"));
    // Killed at the deadline (on the paused clock), not after the reply.
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(60), "{took:?}");
    host.shutdown().await;
}

/// A writeback that answers `sha` (or fails) and keeps what it was given.
struct FakeWriteback {
    answer: Result<Option<String>, String>,
    got: std::sync::Mutex<Vec<(String, bool)>>,
}

#[async_trait::async_trait]
impl skill_run::MemoryWriteback for FakeWriteback {
    async fn write_back(
        &self,
        _repo: &SkillsRepo,
        schedule: &agentvisor::skills::Schedule,
        _run_id: agentvisor::RunId,
        memory: &str,
        skip_push: bool,
    ) -> Result<Option<String>, skill_run::WritebackError> {
        assert_eq!(schedule.name, "limited");
        self.got
            .lock()
            .unwrap()
            .push((memory.to_string(), skip_push));
        self.answer.clone().map_err(skill_run::WritebackError)
    }
}

#[tokio::test]
async fn the_writeback_phase_runs_the_given_writeback_and_its_failure_is_partial() {
    let dir = limited(
        "    writeback: { path: memory/watch.md }\n",
        "      - { text: \"ok <memory>seen</memory>\" }\n",
    );
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let (host, _store) = support::host().await;
    let good = std::sync::Arc::new(FakeWriteback {
        answer: Ok(Some("abc123".into())),
        got: Default::default(),
    });
    let options = skill_run::RunOptions {
        skip_push: true,
        writeback: Some(good.clone()),
        ..Default::default()
    };
    let r = skill_run::run(&host, &repo, "limited", |_| None, &options)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(r.writeback_sha.as_deref(), Some("abc123"));
    let phases: Vec<Phase> = r.phases.iter().map(|p| p.phase).collect();
    assert_eq!(
        phases,
        [Phase::Boot, Phase::Secrets, Phase::Exec, Phase::Writeback]
    );
    assert_eq!(*good.got.lock().unwrap(), vec![("seen".to_string(), true)]);
    // A dry run does not write back.
    let dry = skill_run::RunOptions {
        dry_run: true,
        ..options.clone()
    };
    let r = skill_run::run(&host, &repo, "limited", |_| None, &dry)
        .await
        .unwrap();
    assert!(r.writeback_sha.is_none());
    assert_eq!(good.got.lock().unwrap().len(), 1);
    // A writeback that fails: partial failure, `fail` after `writeback`.
    let bad = skill_run::RunOptions {
        writeback: Some(std::sync::Arc::new(FakeWriteback {
            answer: Err("push rejected".into()),
            got: Default::default(),
        })),
        ..Default::default()
    };
    let r = skill_run::run(&host, &repo, "limited", |_| None, &bad)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::PartialFailure, "{r:?}");
    assert!(r.writeback_sha.is_none());
    let last = r.phases.last().unwrap();
    assert_eq!(
        (last.phase, last.prev),
        (Phase::Fail, Some(Phase::Writeback))
    );
    assert_eq!(r.error.as_deref(), Some("push rejected"));
    host.shutdown().await;
}
