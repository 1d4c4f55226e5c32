//! Publishing a scheduled skill's output (`agentvisor::skill_run::run`):
//! the intents recorded with the run's terminal record, delivered by the
//! host's publisher to loopback servers shaped like a webhook, Slack,
//! Discord and the GitHub API, `when` conditions, retries, a failing
//! destination beside a working one, and no token or secret in what a run
//! shows or stores.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};

use agentvisor::ports::outbox::DeliveryState;
use agentvisor::publishers::Destinations;
use agentvisor::skill_run::{self, Outcome, Phase, RunOptions, SkillRunResult};
use agentvisor::skills::SkillsRepo;
use agentvisor::{Host, RunStatus};
use support::hooks;
use support::scratch::Scratch;

const TOKEN: &str = "hook-token-5e4d3c2b1a09";
const GH_TOKEN: &str = "ghp_0123456789abcdefABCDEF";

/// A repository with one skill and one schedule, `digest`, whose model
/// answers `answer` and whose destinations are `destinations` (YAML list
/// items, indented for the schedule).
fn repo(answer: &str, destinations: &str) -> Scratch {
    let dir = Scratch::new("skill-publish");
    std::fs::create_dir_all(dir.path("skills/digest")).unwrap();
    dir.file(
        "skills/digest/SKILL.md",
        "---\nname: digest\n---\nWrite the digest.\n",
    );
    dir.file(
        "agentvisor.yaml",
        &format!(
            "skills: {{ digest: skills/digest }}\nschedules:\n  - name: daily\n    skill: digest\n    cron: \"0 7 * * *\"\n    publish_timeout: 20s\n    script:\n      - {answer}\n    destinations:\n{destinations}"
        ),
    );
    dir
}

const ANSWER: &str = r#"{ text: "All green. <output name=\"short\">3 changes</output> <memory>seen 3</memory>", usage: { input: 10, output: 5 } }"#;

fn lookup(var: &str) -> Option<String> {
    match var {
        "AGENTVISOR_SECRET_HOOK_TOKEN" => Some(TOKEN.to_string()),
        "AGENTVISOR_SECRET_GH_TOKEN" => Some(GH_TOKEN.to_string()),
        _ => None,
    }
}

/// A host whose destinations read secrets through [`lookup`] and whose
/// `stdout` goes to the returned list.
async fn host() -> (
    Host,
    Arc<agentvisor::stores::MemoryAuditStore>,
    Arc<Mutex<Vec<String>>>,
) {
    let printed = Arc::new(Mutex::new(Vec::new()));
    let sink = printed.clone();
    let destinations = Destinations::new(
        Arc::new(lookup),
        Arc::new(move |t: &str| sink.lock().unwrap().push(t.to_string())),
    );
    let (host, store) =
        support::host_from(support::builder().publisher(Arc::new(destinations))).await;
    (host, store, printed)
}

async fn run(host: &Host, dir: &Scratch) -> SkillRunResult {
    let repo = SkillsRepo::open(&dir.0).unwrap();
    skill_run::run(host, &repo, "daily", lookup, &RunOptions::default())
        .await
        .unwrap()
}

fn phases(r: &SkillRunResult) -> Vec<(Phase, Option<Phase>)> {
    r.phases.iter().map(|p| (p.phase, p.prev)).collect()
}

#[tokio::test]
async fn webhook_file_and_stdout_are_delivered_with_the_idempotency_key() {
    let hook = hooks::answering(200).await;
    let dests = format!(
        "      - {{ type: webhook, name: hook, url: \"{}/in\", output: short, template: \"{{{{skill}}}} on {{{{run_date}}}}: {{{{output}}}}\" }}\n      - {{ type: file, path: out/digest.md, when: always, template: \"# {{{{schedule}}}}\\n{{{{output}}}}\" }}\n      - {{ type: stdout }}\n",
        hook.base
    );
    let dir = repo(ANSWER, &dests);
    let (host, _store, printed) = host().await;
    let r = run(&host, &dir).await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(
        phases(&r),
        vec![
            (Phase::Boot, None),
            (Phase::Secrets, None),
            (Phase::Exec, None),
            (Phase::Publish, None)
        ]
    );
    let run_id = r.run_id.unwrap();
    let states: Vec<_> = r
        .publish
        .iter()
        .map(|p| (p.name.as_str(), p.state))
        .collect();
    assert_eq!(
        states,
        vec![
            ("hook", DeliveryState::Delivered),
            ("file", DeliveryState::Delivered),
            ("stdout", DeliveryState::Delivered)
        ]
    );
    // The webhook: one JSON POST, keyed by run and destination.
    let seen = hook.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(
        seen[0].headers.get("idempotency-key").map(String::as_str),
        Some(format!("{run_id}-0-hook").as_str())
    );
    let body = seen[0].json();
    let today = jiff::Timestamp::now()
        .to_zoned_datetime(jiff::tz::TimeZone::UTC)
        .date()
        .to_string();
    assert_eq!(body["text"], format!("digest on {today}: 3 changes"));
    assert_eq!(body["run_id"], run_id.to_string());
    assert_eq!(body["schedule"], "daily");
    // The file: relative to the repository, the remaining text.
    let written = std::fs::read_to_string(dir.path("out/digest.md")).unwrap();
    assert_eq!(written, "# daily\nAll green.");
    // stdout: the remaining text; the memory is in no publish.
    assert_eq!(*printed.lock().unwrap(), vec!["All green.".to_string()]);
    assert_eq!(r.memory.as_deref(), Some("seen 3"));
    assert!(!seen[0].body.contains("seen 3"));
    host.shutdown().await;
}

#[tokio::test]
async fn a_dry_run_publishes_nothing() {
    let hook = hooks::answering(200).await;
    let dests = format!(
        "      - {{ type: webhook, url: \"{}/in\" }}\n      - {{ type: file, path: out/x.md }}\n",
        hook.base
    );
    let dir = repo(ANSWER, &dests);
    let (host, _store, _) = host().await;
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let r = skill_run::dry_run(&host, &repo, "daily", lookup)
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert!(r.publish.is_empty());
    let owed = host
        .outbox()
        .unwrap()
        .run_intents(r.run_id.unwrap())
        .await
        .unwrap();
    assert!(owed.is_empty(), "a dry run recorded intents: {owed:?}");
    host.shutdown().await;
    assert!(hook.seen().is_empty());
    assert!(!dir.path("out/x.md").exists());
}

#[tokio::test]
async fn a_failing_destination_beside_a_working_one_is_a_partial_failure() {
    let down = hooks::answering(503).await;
    let gone = hooks::answering(404).await;
    let dests = format!(
        "      - {{ type: webhook, name: down, url: \"{}/in\" }}\n      - {{ type: webhook, name: gone, url: \"{}/in\" }}\n      - {{ type: file, path: out/ok.md }}\n",
        down.base, gone.base
    );
    let dir = repo(ANSWER, &dests);
    let (host, _store, _) = host().await;
    let r = run(&host, &dir).await;
    assert_eq!(r.outcome, Outcome::PartialFailure, "{r:?}");
    assert_eq!(r.status, Some(RunStatus::Ok));
    assert!(phases(&r).contains(&(Phase::Fail, Some(Phase::Publish))));
    let by_name = |n: &str| r.publish.iter().find(|p| p.name == n).unwrap();
    // A 503 is tried again (3 tries in all); a 404 is not.
    assert_eq!(by_name("down").state, DeliveryState::Failed);
    assert_eq!(by_name("down").attempts, 3);
    assert_eq!(down.seen().len(), 3);
    assert!(by_name("down").error.as_deref().unwrap().contains("503"));
    assert_eq!(by_name("gone").state, DeliveryState::Failed);
    assert_eq!(by_name("gone").attempts, 1);
    assert_eq!(gone.seen().len(), 1);
    assert_eq!(by_name("file").state, DeliveryState::Delivered);
    assert!(dir.path("out/ok.md").exists());
    host.shutdown().await;
}

#[tokio::test]
async fn when_conditions_skip_without_failing() {
    let hook = hooks::answering(200).await;
    let dests = format!(
        "      - {{ type: webhook, name: alarm, url: \"{0}/alarm\", when: on_failure }}\n      - {{ type: webhook, name: news, url: \"{0}/news\" }}\n      - {{ type: webhook, name: log, url: \"{0}/log\", when: always }}\n",
        hook.base
    );
    // A run that ends ok: `alarm` is skipped, the others go.
    let dir = repo(ANSWER, &dests);
    let (host, _store, _) = host().await;
    let r = run(&host, &dir).await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    let states: Vec<_> = r.publish.iter().map(|p| p.state).collect();
    assert_eq!(
        states,
        vec![
            DeliveryState::Skipped,
            DeliveryState::Delivered,
            DeliveryState::Delivered
        ]
    );
    let mut paths: Vec<String> = hook.seen().iter().map(|s| s.path.clone()).collect();
    paths.sort();
    assert_eq!(paths, vec!["/log", "/news"]);
    // A run that fails: `alarm` and `log` go, `news` is skipped.
    let failing = repo("{ fail: bad_request }", &dests);
    let r = run(&host, &failing).await;
    assert_eq!(r.outcome, Outcome::Failed);
    let states: Vec<_> = r.publish.iter().map(|p| p.state).collect();
    assert_eq!(
        states,
        vec![
            DeliveryState::Delivered,
            DeliveryState::Skipped,
            DeliveryState::Delivered
        ]
    );
    let alarm = hook
        .seen()
        .into_iter()
        .find(|s| s.path == "/alarm")
        .unwrap();
    assert!(
        alarm.json()["text"]
            .as_str()
            .unwrap()
            .starts_with("run error"),
        "{}",
        alarm.body
    );
    host.shutdown().await;
}

#[tokio::test]
async fn slack_and_discord_get_their_webhook_shapes() {
    let slack = hooks::answering(200).await;
    let discord = hooks::answering(204).await;
    let long = "x".repeat(2500);
    let answer = format!("{{ text: \"{long}\" }}");
    let dests = format!(
        "      - {{ type: slack, url: \"{}/services/T0/B0/abc\" }}\n      - {{ type: discord, url: \"{}/api/webhooks/1/tok\" }}\n",
        slack.base, discord.base
    );
    let dir = repo(&answer, &dests);
    let (host, _store, _) = host().await;
    let r = run(&host, &dir).await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    let s = slack.seen();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].path, "/services/T0/B0/abc");
    assert_eq!(s[0].json(), serde_json::json!({ "text": long }));
    let d = discord.seen();
    assert_eq!(d.len(), 1);
    // Discord takes 2000 characters at most.
    assert_eq!(
        d[0].json(),
        serde_json::json!({ "content": "x".repeat(2000) })
    );
    // Targets are shown without their paths (where the tokens are).
    for p in &r.publish {
        assert!(!p.target.contains("/services"), "{}", p.target);
        assert!(!p.target.contains("tok"), "{}", p.target);
    }
    host.shutdown().await;
}

#[tokio::test]
async fn a_github_issue_is_opened_and_the_older_one_closed() {
    let gh = hooks::serve(Arc::new(|s: &hooks::Seen, _| match s.method.as_str() {
        "GET" => (
            200,
            serde_json::json!([
                { "number": 3, "body": "old\n\n<!-- agentvisor schedule=daily -->" },
                { "number": 4, "body": "someone else's issue" }
            ])
            .to_string(),
        ),
        "POST" => (201, serde_json::json!({ "number": 7 }).to_string()),
        _ => (200, "{}".to_string()),
    }))
    .await;
    let dests = format!(
        "      - {{ type: github-issue, repo: acme/ops, token: {{ secret: gh_token }}, base_url: \"{}/api/v3\", title: \"Digest {{{{run_date}}}}\", labels: [digest], close_older: true }}\n",
        gh.base
    );
    let dir = repo(ANSWER, &dests);
    let (host, store, _) = host().await;
    let r = run(&host, &dir).await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(r.publish[0].detail.as_deref(), Some("issue #7 (closed #3)"));
    let seen = gh.seen();
    let calls: Vec<(String, String)> = seen
        .iter()
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect();
    assert_eq!(
        calls,
        vec![
            (
                "GET".to_string(),
                "/api/v3/repos/acme/ops/issues?state=open&per_page=100".to_string()
            ),
            (
                "POST".to_string(),
                "/api/v3/repos/acme/ops/issues".to_string()
            ),
            (
                "PATCH".to_string(),
                "/api/v3/repos/acme/ops/issues/3".to_string()
            ),
        ]
    );
    for s in &seen {
        assert_eq!(
            s.headers.get("authorization").map(String::as_str),
            Some(format!("Bearer {GH_TOKEN}").as_str())
        );
    }
    let created = seen[1].json();
    assert!(created["title"].as_str().unwrap().starts_with("Digest 20"));
    assert_eq!(created["labels"], serde_json::json!(["digest"]));
    assert!(created["body"].as_str().unwrap().starts_with("All green."));
    assert_eq!(seen[2].json(), serde_json::json!({ "state": "closed" }));
    // The token is in no result, record or outbox row.
    let json = serde_json::to_string(&r).unwrap();
    assert!(!json.contains(GH_TOKEN));
    let stored = host
        .outbox()
        .unwrap()
        .run_intents(r.run_id.unwrap())
        .await
        .unwrap();
    assert!(!format!("{stored:?}").contains(GH_TOKEN));
    host.shutdown().await;
    let records = support::records(&store, r.run_id.unwrap()).await;
    assert!(!format!("{records:?}").contains(GH_TOKEN));
}

#[tokio::test]
async fn tokens_and_secrets_reach_no_result_record_or_error() {
    // A webhook whose address carries a token (a secret), answering 500
    // with the request echoed back; and one whose literal address carries
    // a token in its query.
    let echo = hooks::serve(Arc::new(|s: &hooks::Seen, _| {
        (500, format!("{{\"echo\": \"{}\"}}", s.path))
    }))
    .await;
    let dir = repo(
        ANSWER,
        &format!(
            "      - {{ type: webhook, name: secret-url, url: {{ secret: hook_token }} }}\n      - {{ type: webhook, name: literal, url: \"{}/in?token=lit-tok-abcdef012345\", headers: {{ Authorization: {{ secret: hook_token }} }} }}\n",
            echo.base
        ),
    );
    // The secret is the whole address here.
    let url = format!("{}/hooks/{TOKEN}", echo.base);
    let secret_url = url.clone();
    let lookup = move |var: &str| match var {
        "AGENTVISOR_SECRET_HOOK_TOKEN" => Some(secret_url.clone()),
        _ => None,
    };
    let printed = Arc::new(Mutex::new(Vec::new()));
    let sink = printed.clone();
    let lookup_arc = lookup.clone();
    let destinations = Destinations::new(
        Arc::new(move |v: &str| lookup_arc(v)),
        Arc::new(move |t: &str| sink.lock().unwrap().push(t.to_string())),
    );
    let (host, store) =
        support::host_from(support::builder().publisher(Arc::new(destinations))).await;
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let r = skill_run::run(&host, &repo, "daily", lookup, &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::PartialFailure, "{r:?}");
    // Both requests reached the server (three tries each), the header too.
    let seen = echo.seen();
    assert_eq!(seen.len(), 6);
    assert!(seen
        .iter()
        .any(|s| s.headers.get("authorization") == Some(&url)));
    let json = serde_json::to_string(&r).unwrap();
    for needle in [TOKEN, "lit-tok-abcdef012345", "/hooks/"] {
        assert!(!json.contains(needle), "{needle} in {json}");
    }
    assert!(r.publish.iter().all(|p| p.error.is_some()));
    host.shutdown().await;
    let records = format!("{:?}", support::records(&store, r.run_id.unwrap()).await);
    for needle in [TOKEN, "lit-tok-abcdef012345"] {
        assert!(!records.contains(needle), "{needle} in the records");
    }
}

#[tokio::test]
async fn destinations_are_delivered_in_parallel() {
    // Two webhooks that answer only once both requests have arrived:
    // delivered one after the other, the first would get a 503 after 2 s
    // and need another try.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let handler = move || {
        let barrier = barrier.clone();
        async move {
            match tokio::time::timeout(std::time::Duration::from_secs(2), barrier.wait()).await {
                Ok(_) => axum::http::StatusCode::OK,
                Err(_) => axum::http::StatusCode::SERVICE_UNAVAILABLE,
            }
        }
    };
    let app = axum::Router::new().fallback(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let dests = format!(
        "      - {{ type: webhook, name: a, url: \"{base}/a\" }}\n      - {{ type: webhook, name: b, url: \"{base}/b\" }}\n"
    );
    let dir = repo(ANSWER, &dests);
    let yaml = std::fs::read_to_string(dir.path("agentvisor.yaml")).unwrap();
    dir.file(
        "agentvisor.yaml",
        &yaml.replace("publish_timeout: 20s", "publish_timeout: 3s"),
    );
    let (host, _store, _) = host().await;
    let r = run(&host, &dir).await;
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    for p in &r.publish {
        assert_eq!(
            (p.state, p.attempts),
            (DeliveryState::Delivered, 1),
            "{p:?}"
        );
    }
    host.shutdown().await;
}

#[tokio::test]
async fn a_run_that_never_started_publishes_its_on_failure_destinations() {
    let hook = hooks::answering(200).await;
    let dests = format!(
        "      - {{ type: webhook, name: alarm, url: \"{}/in\", when: on_failure, template: \"{{{{schedule}}}} failed: {{{{output}}}}\" }}\n      - {{ type: webhook, name: report, url: \"{}/in\" }}\n      - {{ type: file, path: out/last.md, when: always }}\n",
        hook.base, hook.base
    );
    let dir = repo(ANSWER, &dests);
    // The schedule needs a secret nobody set: the run fails in `secrets`.
    let manifest = std::fs::read_to_string(dir.path("agentvisor.yaml")).unwrap();
    dir.file(
        "agentvisor.yaml",
        &manifest.replace(
            "    publish_timeout: 20s\n",
            "    publish_timeout: 20s\n    env: { TOKEN: { secret: never_set } }\n",
        ),
    );
    let (host, store, _) = host().await;
    let r = run(&host, &dir).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.error_kind.as_deref(), Some("missing_secret"));
    assert_eq!(r.status, None, "no agent run started");
    assert_eq!(
        phases(&r),
        vec![
            (Phase::Boot, None),
            (Phase::Secrets, None),
            (Phase::Fail, Some(Phase::Secrets)),
            (Phase::Publish, None)
        ]
    );
    // The failure is on record as a run that ended `error`, with its
    // intents: the on_failure and always ones delivered, the other skipped.
    let run_id = r.run_id.expect("the failure is recorded");
    let states: Vec<_> = r
        .publish
        .iter()
        .map(|p| (p.name.as_str(), p.state))
        .collect();
    assert_eq!(
        states,
        vec![
            ("alarm", DeliveryState::Delivered),
            ("report", DeliveryState::Skipped),
            ("file", DeliveryState::Delivered)
        ]
    );
    let seen = hook.seen();
    assert_eq!(seen.len(), 1, "only the on_failure webhook");
    assert_eq!(
        seen[0].headers.get("idempotency-key").map(String::as_str),
        Some(format!("{run_id}-0-alarm").as_str())
    );
    let text = seen[0].json()["text"].as_str().unwrap().to_string();
    assert!(
        text.starts_with("daily failed: run error: ")
            && text.contains("AGENTVISOR_SECRET_NEVER_SET"),
        "{text}"
    );
    let written = std::fs::read_to_string(dir.path("out/last.md")).unwrap();
    assert!(written.contains("AGENTVISOR_SECRET_NEVER_SET"), "{written}");
    host.shutdown().await;
    let records = support::records(&store, run_id).await;
    assert_eq!(support::terminal_count(&records), 1);
    match records.last().map(|r| &r.entry) {
        Some(agentvisor::ports::audit::AuditEntry::Terminal(t)) => {
            assert_eq!(t.status, RunStatus::Error);
            assert_eq!(t.error_kind.as_deref(), Some("missing_secret"));
            assert_eq!(t.agent, "digest");
            assert_eq!(t.caller_id.as_deref(), Some("schedule:daily"));
            assert!(t.steps.is_empty());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_dry_run_that_never_started_records_nothing() {
    let hook = hooks::answering(200).await;
    let dests = format!(
        "      - {{ type: webhook, url: \"{}/in\", when: always }}\n",
        hook.base
    );
    let dir = repo(ANSWER, &dests);
    let manifest = std::fs::read_to_string(dir.path("agentvisor.yaml")).unwrap();
    dir.file(
        "agentvisor.yaml",
        &manifest.replace(
            "    publish_timeout: 20s\n",
            "    publish_timeout: 20s\n    env: { TOKEN: { secret: never_set } }\n",
        ),
    );
    let (host, store, _) = host().await;
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let r = skill_run::dry_run(&host, &repo, "daily", lookup)
        .await
        .unwrap();
    assert_eq!(r.error_kind.as_deref(), Some("missing_secret"));
    assert!(r.run_id.is_none() && r.publish.is_empty());
    host.shutdown().await;
    use agentvisor::ports::audit::AuditStore;
    assert_eq!(store.stats().await.unwrap().terminal_records, 0);
    assert!(hook.seen().is_empty());
}

#[tokio::test]
async fn a_run_its_host_refuses_to_submit_publishes_its_failure_too() {
    let hook = hooks::answering(200).await;
    let dests = format!(
        "      - {{ type: webhook, name: alarm, url: \"{}/in\", when: on_failure }}\n",
        hook.base
    );
    let dir = repo(ANSWER, &dests);
    let manifest = std::fs::read_to_string(dir.path("agentvisor.yaml")).unwrap();
    dir.file(
        "agentvisor.yaml",
        &manifest.replace(
            "    publish_timeout: 20s\n",
            "    publish_timeout: 20s\n    model: nosuch:model\n",
        ),
    );
    let (host, _store, _) = host().await;
    let r = run(&host, &dir).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.error_kind.as_deref(), Some("submit"));
    assert!(phases(&r).contains(&(Phase::Fail, Some(Phase::Exec))));
    assert_eq!(r.publish.len(), 1);
    assert_eq!(r.publish[0].state, DeliveryState::Delivered);
    let seen = hook.seen();
    assert_eq!(seen.len(), 1);
    let text = seen[0].json()["text"].as_str().unwrap().to_string();
    assert!(text.contains("nosuch:model"), "{text}");
    host.shutdown().await;
}
