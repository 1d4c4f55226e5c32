//! The outbox on SQLite: a run's publish intents are on file with its
//! terminal record, and a host that ends after the run and before
//! publishing leaves them owed; the next host on the file delivers them,
//! once, with the idempotency key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentvisor::ports::outbox::{DeliveryState, OutboxStore, PublishHook};
use agentvisor::publishers::Destinations;
use agentvisor::skills::SkillsRepo;
use agentvisor::stores::SqliteStore;
use agentvisor::{Host, RunStatus};
use support::hooks;
use support::scratch::Scratch;

fn repo(hook: &str) -> Scratch {
    let dir = Scratch::new("skill-outbox");
    std::fs::create_dir_all(dir.path("skills/digest")).unwrap();
    dir.file(
        "skills/digest/SKILL.md",
        "---\nname: digest\n---\nWrite the digest.\n",
    );
    dir.file(
        "agentvisor.yaml",
        &format!(
            "skills: {{ digest: skills/digest }}\nschedules:\n  - name: daily\n    skill: digest\n    cron: \"0 7 * * *\"\n    script:\n      - {{ text: \"news\" }}\n    destinations:\n      - {{ type: webhook, name: hook, url: \"{hook}/in\" }}\n      - {{ type: file, path: out/news.md }}\n"
        ),
    );
    dir
}

async fn host_on(store: Arc<SqliteStore>, scan: Option<Duration>) -> Host {
    let destinations = Destinations::new(Arc::new(|_: &str| None), Arc::new(|_: &str| {}));
    support::builder()
        .audit_store(store)
        .publisher(Arc::new(destinations))
        .publish_scan_every(scan)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn intents_left_owed_by_a_host_that_ended_are_delivered_once_by_the_next() {
    let hook = hooks::answering(200).await;
    let dir = repo(&hook.base);
    let db = dir.path("agentvisor.db");
    let repo = SkillsRepo::open(&dir.0).unwrap();

    // Host 1 runs the schedule and ends before it publishes: the run's
    // intents are recorded with its terminal record, nothing is sent.
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let host = host_on(store.clone(), None).await;
    let mut plan = repo.plan("daily", |_| None).unwrap();
    let publish = repo.publish_plan(&plan).unwrap();
    plan.invocation.publish = PublishHook::new(Arc::new(publish));
    let result = host
        .submit(plan.spec.clone(), plan.invocation)
        .await
        .unwrap()
        .await;
    assert_eq!(result.status, RunStatus::Ok);
    let run_id = result.run_id;
    let owed = store.run_intents(run_id).await.unwrap();
    assert_eq!(owed.len(), 2);
    assert!(owed.iter().all(|(_, r)| r.state == DeliveryState::Owed));
    assert_eq!(owed[0].0.key, format!("{run_id}-0-hook"));
    host.shutdown().await;
    drop(host);
    drop(store);
    assert!(hook.seen().is_empty());

    // Host 2 opens the same file: its publisher delivers what is owed.
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let host = host_on(store.clone(), None).await;
    let reports = host.publish(run_id, Duration::from_secs(30)).await.unwrap();
    assert_eq!(reports.len(), 2);
    assert!(
        reports.iter().all(|r| r.state == DeliveryState::Delivered),
        "{reports:?}"
    );
    // The start's scan and the explicit call deliver it once between them.
    let seen = hook.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].headers.get("idempotency-key").map(String::as_str),
        Some(format!("{run_id}-0-hook").as_str())
    );
    assert_eq!(
        std::fs::read_to_string(dir.path("out/news.md")).unwrap(),
        "news"
    );
    host.shutdown().await;
    drop(host);
    drop(store);

    // Host 3: nothing is owed any more, nothing is sent again.
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let host = host_on(store.clone(), None).await;
    let reports = host.publish(run_id, Duration::from_secs(30)).await.unwrap();
    assert!(reports.iter().all(|r| r.state == DeliveryState::Delivered));
    assert!(store.owed(u64::MAX, 10).await.unwrap().is_empty());
    host.shutdown().await;
    assert_eq!(hook.seen().len(), 1);
}

#[tokio::test]
async fn a_host_delivers_what_is_owed_at_its_start_without_being_asked() {
    let hook = hooks::answering(200).await;
    let dir = repo(&hook.base);
    let db = dir.path("agentvisor.db");
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let host = host_on(store.clone(), None).await;
    let mut plan = repo.plan("daily", |_| None).unwrap();
    plan.invocation.publish = PublishHook::new(Arc::new(repo.publish_plan(&plan).unwrap()));
    let run_id = host
        .submit(plan.spec.clone(), plan.invocation)
        .await
        .unwrap()
        .await
        .run_id;
    host.shutdown().await;
    drop(host);
    drop(store);

    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let host = host_on(store.clone(), None).await;
    // Nobody asks: the start's scan delivers.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let states: Vec<DeliveryState> = store
            .run_intents(run_id)
            .await
            .unwrap()
            .into_iter()
            .map(|(_, r)| r.state)
            .collect();
        if states.iter().all(|s| *s == DeliveryState::Delivered) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{states:?}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(hook.seen().len(), 1);
    host.shutdown().await;
}

#[tokio::test]
async fn intents_are_written_with_their_batch_and_a_replay_changes_nothing() {
    use agentvisor::ports::audit::{AuditEntry, AuditRecord, AuditStore};
    use agentvisor::ports::outbox::{DeliveryReport, PublishIntent};

    let dir = Scratch::new("skill-outbox-replay");
    let store = Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap());
    // A finished run's result (from a host on memory) to record here.
    let (mem, _) = support::host().await;
    let result = mem
        .execute(
            support::spec(support::HELLO),
            agentvisor::Invocation::prompt("hi"),
        )
        .await
        .unwrap();
    mem.shutdown().await;
    assert_eq!(result.status, RunStatus::Ok);
    let run_id = result.run_id;
    let intent = PublishIntent {
        key: PublishIntent::key_of(run_id, 0, "hook"),
        run_id,
        index: 0,
        name: "hook".into(),
        kind: "webhook".into(),
        target: serde_json::json!({ "url": { "secret": "hook_url" } }),
        shown: "[secret hook_url]".into(),
        body: "news".into(),
        skipped: None,
        schedule: "daily".into(),
        skill: "digest".into(),
        timeout_ms: 30_000,
        at_ms: 1,
    };
    let batch = vec![
        AuditRecord {
            run_id,
            seq: 0,
            at_ms: 1,
            entry: AuditEntry::Publish(vec![intent.clone()].into()),
        },
        AuditRecord {
            run_id,
            seq: 0,
            at_ms: 1,
            entry: AuditEntry::Terminal(Arc::new(result)),
        },
    ];
    store.append(&batch).await.unwrap();
    // The intent is in the outbox, not among the run's records.
    let on_file = store.run_intents(run_id).await.unwrap();
    assert_eq!(on_file.len(), 1);
    assert_eq!(on_file[0].0, intent);
    let records = store.run_records(run_id).await.unwrap();
    assert_eq!(records.len(), 1);
    assert!(records[0].is_terminal());
    // Delivered, then the batch written again (a spool replay): the row
    // keeps its outcome, nothing is owed.
    let mut report = DeliveryReport::of(&intent);
    assert!(store.claim(&intent.key, "me", 100, 1).await.unwrap());
    assert!(!store.claim(&intent.key, "other", 100, 50).await.unwrap());
    report.state = DeliveryState::Delivered;
    report.attempts = 1;
    report.at_ms = 2;
    store.record_outcome(&report).await.unwrap();
    store.append(&batch).await.unwrap();
    let on_file = store.run_intents(run_id).await.unwrap();
    assert_eq!(on_file[0].1, report);
    assert!(store.owed(u64::MAX, 10).await.unwrap().is_empty());
    assert_eq!(store.stats().await.unwrap().terminal_records, 1);
}

#[tokio::test]
async fn pruning_a_run_takes_its_settled_publishes_and_keeps_owed_ones() {
    use agentvisor::ports::audit::AuditStore;
    use agentvisor::ports::retention::Retention;

    let hook = hooks::answering(200).await;
    let dir = repo(&hook.base);
    let repo = SkillsRepo::open(&dir.0).unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path("a.db")).await.unwrap());
    let host = host_on(store.clone(), None).await;
    let mut ids = Vec::new();
    for deliver in [true, false] {
        let mut plan = repo.plan("daily", |_| None).unwrap();
        plan.invocation.publish = PublishHook::new(Arc::new(repo.publish_plan(&plan).unwrap()));
        let id = host
            .submit(plan.spec.clone(), plan.invocation)
            .await
            .unwrap()
            .await
            .run_id;
        if deliver {
            host.publish(id, Duration::from_secs(30)).await.unwrap();
        }
        ids.push(id);
    }
    host.shutdown().await;
    let everything = Retention {
        max_runs: Some(0),
        ..Retention::default()
    };
    let report = store
        .prune(&everything, agentvisor::ports::run::unix_ms(), 100, false)
        .await
        .unwrap();
    assert_eq!(report.runs, 2, "{report:?}");
    // The delivered run's rows went; the owed run's stay, still owed.
    assert!(store.run_intents(ids[0]).await.unwrap().is_empty());
    let owed = store.run_intents(ids[1]).await.unwrap();
    assert_eq!(owed.len(), 2);
    assert!(owed.iter().all(|(_, r)| r.state == DeliveryState::Owed));
}

#[tokio::test]
async fn a_batch_whose_intents_cannot_be_written_leaves_no_terminal_record_either() {
    use agentvisor::ports::audit::{AuditEntry, AuditRecord, AuditStore, RunIndex};
    use agentvisor::ports::outbox::PublishIntent;

    let dir = Scratch::new("skill-outbox-atomic");
    let db = dir.path("a.db");
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let (mem, _) = support::host().await;
    let result = mem
        .execute(
            support::spec(support::HELLO),
            agentvisor::Invocation::prompt("hi"),
        )
        .await
        .unwrap();
    mem.shutdown().await;
    let run_id = result.run_id;
    let intent = PublishIntent {
        key: PublishIntent::key_of(run_id, 0, "file"),
        run_id,
        index: 0,
        name: "file".into(),
        kind: "file".into(),
        target: serde_json::json!({ "path": "/tmp/x" }),
        shown: "/tmp/x".into(),
        body: "news".into(),
        skipped: None,
        schedule: "daily".into(),
        skill: "digest".into(),
        timeout_ms: 30_000,
        at_ms: 1,
    };
    let batch = vec![
        AuditRecord {
            run_id,
            seq: 0,
            at_ms: 1,
            entry: AuditEntry::Publish(vec![intent].into()),
        },
        AuditRecord {
            run_id,
            seq: 0,
            at_ms: 1,
            entry: AuditEntry::Terminal(Arc::new(result)),
        },
    ];
    // The outbox cannot take rows (its table is gone): the whole batch
    // fails, so the terminal record is not on file without its intents.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch("DROP TABLE outbox").unwrap();
    drop(conn);
    assert!(store.append(&batch).await.is_err());
    assert!(store.run_result(run_id).await.unwrap().is_none());
    assert!(store.run_records(run_id).await.unwrap().is_empty());
}

/// A repository whose `daily` schedule runs on the model `gate` (each
/// host brings its own), reads a secret and publishes to `hook` (`when`).
fn gated_repo(hook: &str, when: &str) -> Scratch {
    let dir = Scratch::new("skill-outbox-recover");
    std::fs::create_dir_all(dir.path("skills/digest")).unwrap();
    dir.file(
        "skills/digest/SKILL.md",
        "---\nname: digest\n---\nWrite the digest.\n",
    );
    dir.file(
        "agentvisor.yaml",
        &format!(
            "skills: {{ digest: skills/digest }}\nschedules:\n  - name: daily\n    skill: digest\n    cron: \"0 7 * * *\"\n    model: gate\n    durable: true\n    limits: {{ max_runtime: 1h, stall_timeout: 1h }}\n    env: {{ TOKEN: {{ secret: tok }} }}\n    destinations:\n      - {{ type: webhook, name: hook, url: \"{hook}/in\", when: {when} }}\n"
        ),
    );
    dir
}

/// A host on the file whose model `gate` plays `script`. Its runs are not
/// durable by default: the schedule's `durable: true` makes its run so.
async fn durable_host_on(db: &std::path::Path, script: &str) -> (Host, Arc<SqliteStore>) {
    let store = Arc::new(SqliteStore::open(db).await.unwrap());
    let gate = agentvisor::AgentSpec::from_yaml(&format!("name: gate\nscript:\n{script}")).unwrap();
    let destinations = Destinations::new(Arc::new(|_: &str| None), Arc::new(|_: &str| {}));
    let host = Host::builder()
        .model(
            "gate",
            Arc::new(agentvisor::providers::ScriptedModel::new(gate.script)),
        )
        .audit_store(store.clone())
        .checkpointer(store.clone())
        .publisher(Arc::new(destinations))
        .publish_scan_every(None)
        .build()
        .await
        .unwrap();
    (host, store)
}

const SECRET_VALUE: &str = "tok-value-9f8e7d6c5b4a";

/// Polls (bounded, real time) until `done` holds.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let bound = std::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(std::time::Instant::now() < bound, "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

/// A host on `db` starts the skill run of `dir` (its model call never
/// answers), then dies mid-run: its runtime is dropped, nothing of it is
/// finalized; its leases then run out (as they would after `lease_ttl`).
fn crash_mid_run(dir: &Scratch, db: &std::path::Path) -> agentvisor::RunId {
    use agentvisor::ports::audit::AuditStore;
    let crashed = runtime(2);
    let run_id = crashed.block_on(async {
        let (host, store) = durable_host_on(db, "  - { hang: true }\n").await;
        let repo = SkillsRepo::open(&dir.0).unwrap();
        let lookup = |k: &str| (k == "AGENTVISOR_SECRET_TOK").then(|| SECRET_VALUE.to_string());
        let runner = host.clone();
        tokio::spawn(async move {
            let _ = agentvisor::skill_run::run(
                &runner,
                &repo,
                "daily",
                lookup,
                &agentvisor::skill_run::RunOptions::default(),
            )
            .await;
        });
        let mut id = None;
        until("the run is accepted and started", || {
            let found = host.runs().first().map(|r| r.run_id);
            id = id.or(found);
            let store = store.clone();
            async move {
                match found {
                    Some(run) => !store.run_records(run).await.unwrap().is_empty(),
                    None => false,
                }
            }
        })
        .await;
        id.unwrap()
    });
    drop(crashed);
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch(
        "UPDATE checkpoints SET lease_until = 0; UPDATE host_leases SET lease_until = 0;",
    )
    .unwrap();
    run_id
}

#[test]
fn a_durable_skill_run_resumed_by_another_host_publishes_once() {
    use agentvisor::ports::audit::AuditStore;
    use agentvisor::ports::checkpoint::Checkpointer;

    let main = runtime(1);
    let hook = main.block_on(hooks::answering(200));
    let dir = gated_repo(&hook.base, "on_success");
    let db = dir.path("agentvisor.db");
    let run_id = crash_mid_run(&dir, &db);

    main.block_on(async {
        // What the crash left: a checkpoint whose invocation keeps the
        // publish plan's recipe, the secret by name only; no terminal
        // record, nothing in the outbox.
        let store = Arc::new(SqliteStore::open(&db).await.unwrap());
        let saved = store.load_all().await.unwrap();
        assert_eq!(saved.len(), 1);
        let inv = saved[0].invocation.text();
        assert!(
            inv.contains("\"kind\":\"skill\"") && inv.contains("\"tok\""),
            "{inv}"
        );
        assert!(!inv.contains(SECRET_VALUE), "a secret's value was saved");
        assert!(store.run_intents(run_id).await.unwrap().is_empty());
        drop(store);

        // Host 2 on the same file resumes the run; its model answers; the
        // terminal record carries the intent and the publisher delivers
        // it without being asked.
        let (host, store) = durable_host_on(&db, "  - { text: news }\n").await;
        let recovery = host.recover().await.unwrap();
        assert_eq!(recovery.resumed.len(), 1, "{recovery:?}");
        let result = recovery.resumed.into_iter().next().unwrap().await;
        assert_eq!(result.run_id, run_id);
        assert_eq!(result.status, RunStatus::Ok, "{result:?}");
        until("the intent is delivered", || {
            let store = store.clone();
            async move {
                let all = store.run_intents(run_id).await.unwrap();
                !all.is_empty() && all.iter().all(|(_, r)| r.state == DeliveryState::Delivered)
            }
        })
        .await;
        let seen = hook.seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].json()["text"], "news");
        assert_eq!(
            seen[0].headers.get("idempotency-key").map(String::as_str),
            Some(format!("{run_id}-0-hook").as_str())
        );
        host.shutdown().await;
        drop(host);
        drop(store);

        // Host 3: nothing is owed, nothing is sent again.
        let (host, store) = durable_host_on(&db, "  - { text: never }\n").await;
        let recovery = host.recover().await.unwrap();
        assert!(recovery.resumed.is_empty());
        assert!(store.owed(u64::MAX, 10).await.unwrap().is_empty());
        let terminals = store
            .run_records(run_id)
            .await
            .unwrap()
            .iter()
            .filter(|r| r.is_terminal())
            .count();
        assert_eq!(terminals, 1);
        host.shutdown().await;
        assert_eq!(hook.seen().len(), 1);
    });
}

#[test]
fn a_durable_skill_run_ended_without_being_resumed_still_owes_its_publishes() {
    let main = runtime(1);
    let hook = main.block_on(hooks::answering(200));
    let dir = gated_repo(&hook.base, "always");
    let db = dir.path("agentvisor.db");
    let run_id = crash_mid_run(&dir, &db);
    // It was resumed too often already: recovery ends it `crash_loop`.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch("UPDATE checkpoints SET state = json_set(state, '$.resumes', 3);")
        .unwrap();
    drop(conn);
    main.block_on(async {
        use agentvisor::ports::audit::RunIndex;
        let (host, store) = durable_host_on(&db, "  - { text: never }\n").await;
        let recovery = host.recover().await.unwrap();
        assert_eq!(recovery.crash_loops, vec![run_id], "{recovery:?}");
        until("the terminal record is written", || {
            let store = store.clone();
            async move { store.run_result(run_id).await.unwrap().is_some() }
        })
        .await;
        // Its `always` destination is owed with the error, and delivered
        // when asked (or by the next scan).
        let reports = host.publish(run_id, Duration::from_secs(30)).await.unwrap();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].state, DeliveryState::Delivered, "{reports:?}");
        let seen = hook.seen();
        assert_eq!(seen.len(), 1);
        let text = seen[0].json()["text"].as_str().unwrap().to_string();
        assert!(text.starts_with("run error: resumed 3 times"), "{text}");
        host.shutdown().await;
    });
}
