#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The command line on PostgreSQL (the `postgres` feature; the server on
//! 127.0.0.1:5432, or `AGENTVISOR_TEST_POSTGRES`; each test its own
//! database): `run` then `runs list|show` read the run back; `swarm --runs
//! 200` records every run once; a durable run keeps its checkpoint and
//! leases on the server while it runs and leaves none once it ends; a
//! swarm of durable runs killed mid-way (SIGKILL) is resumed by `recover`
//! from the server, each run ending once; sessions and budgets; `skill
//! run` delivers its publishes through the server's outbox, each recorded
//! delivered once; the commands that do not run on PostgreSQL yet refuse
//! with exit 2 and create nothing.
//!
//! Waits for a state of the database are bounded polls (20 ms apart, 60 s
//! at most), never a wait for a deadline.

mod support;

use std::io::Write;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cli::ok_json;
use support::scratch::Scratch;

/// The binary with `args` on `db`, its spool in `dir`.
fn on(db: &str, dir: &Scratch, args: &[&str]) -> std::process::Command {
    let spool = dir.arg("pg.spool");
    let mut all = vec!["--db", db, "--spool", &spool];
    all.extend_from_slice(args);
    support::cli::command(&all)
}

fn output(db: &str, dir: &Scratch, args: &[&str]) -> Output {
    on(db, dir, args).output().unwrap()
}

/// A connection to the database of `url`.
async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

async fn count(client: &tokio_postgres::Client, query: &str) -> i64 {
    client.query_one(query, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_then_runs_list_and_show_read_it_back_and_a_swarm_records_every_run_once() {
    let db = support::postgres::fresh_database().await;
    let dir = Scratch::new("cli-postgres-run");
    let run = ok_json(&output(
        &db,
        &dir,
        &["run", "examples/agents/hello.yaml", "--json"],
    ));
    assert_eq!(run["status"], "ok");
    assert_eq!(run["output"], "2+3=5, DONE");
    let id = run["run_id"].as_str().unwrap().to_string();

    let listed = ok_json(&output(&db, &dir, &["runs", "list", "--json"]));
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["run_id"], id.as_str());
    assert_eq!(listed[0]["agent"], "hello");
    assert_eq!(listed[0]["caller_id"], "cli");
    assert_eq!(listed[0]["status"], "ok");

    let shown = ok_json(&output(&db, &dir, &["runs", "show", &id, "--json"]));
    assert_eq!(shown["result"]["run_id"], id.as_str());
    assert_eq!(shown["result"]["output"], "2+3=5, DONE");
    let records = shown["records"].as_array().unwrap();
    let client = sql(&db).await;
    let stored = client
        .query_one(
            "SELECT count(*) FROM audit_records WHERE run_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(records.len() as i64, stored);
    assert!(records.len() > 4, "{records:?}");
    // The start names the manifest, read back whole; the end is the result.
    let (first, last) = (&records[0]["entry"], &records[records.len() - 1]["entry"]);
    assert_eq!(first["record"], "run_started", "{first}");
    assert_eq!(first["manifest"]["json"]["name"], "hello", "{first}");
    assert_eq!(last["record"], "terminal", "{last}");
    assert_eq!(last["run_id"], id.as_str(), "{last}");
    // The human form too.
    let human = output(&db, &dir, &["runs", "show", &id]);
    assert_eq!(human.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&human.stdout).contains(&format!("run {id}: ok")));

    let swarm = output(
        &db,
        &dir,
        &["swarm", "examples/agents/hello.yaml", "--runs", "200"],
    );
    let said = String::from_utf8_lossy(&swarm.stdout);
    assert_eq!(
        swarm.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&swarm.stderr)
    );
    assert!(
        said.contains("audit:         200 terminal records"),
        "{said}"
    );
    // Every run once, with exactly one terminal record, ended ok.
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM runs WHERE caller_id = 'swarm'"
        )
        .await,
        200
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM runs WHERE caller_id = 'swarm' AND status = 'ok'"
        )
        .await,
        200
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM (SELECT run_id FROM audit_records WHERE kind = 2 \
             GROUP BY run_id HAVING count(*) = 1) t"
        )
        .await,
        201
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM audit_records WHERE kind = 2").await,
        201
    );
    let all = ok_json(&output(
        &db,
        &dir,
        &["runs", "list", "--json", "--limit", "1000"],
    ));
    assert_eq!(all.as_array().unwrap().len(), 201);
    let swarm_runs = ok_json(&output(
        &db,
        &dir,
        &[
            "runs", "list", "--json", "--caller", "swarm", "--limit", "1000",
        ],
    ));
    assert_eq!(swarm_runs.as_array().unwrap().len(), 200);
    // The ledger on the server counted them.
    let spent = ok_json(&output(&db, &dir, &["budget", "show", "swarm", "--json"]));
    assert_eq!(spent["spent"]["runs"], 200, "{spent}");
}

/// A durable run: one step (checkpointed), then a model call that never
/// answers.
const WAITS: &str = r#"
name: waits
model: scripted
durable: true
prompt: add, then wait
tools: [add]
limits: { max_runtime: 1h, soft_timeout: 1h, stall_timeout: 1h, hard_timeout: 2h }
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { hang: true }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_run_keeps_its_checkpoint_and_leases_on_the_server_until_it_ends() {
    let db = support::postgres::fresh_database().await;
    let dir = Scratch::new("cli-postgres-durable");
    let manifest = dir.file("waits.yaml", WAITS);
    // The schema first, so the polls below find its tables.
    agentvisor::stores::PostgresStore::connect(&db)
        .await
        .unwrap();
    // From a directory of its own: the default spool goes there.
    let mut child = support::cli::command(&["--db", &db, "run", manifest.to_str().unwrap()])
        .current_dir(&dir.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = sql(&db).await;
    let bound = Instant::now() + Duration::from_secs(60);
    let owner = loop {
        let row = client
            .query_opt(
                "SELECT c.owner FROM checkpoints c JOIN host_leases h ON h.owner = c.owner \
                 WHERE c.iteration = 1",
                &[],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            break row.get::<_, String>(0);
        }
        assert!(
            Instant::now() < bound,
            "no checkpoint of step 1 under a host lease within 60 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM checkpoint_entries WHERE list = 1"
        )
        .await,
        3,
        "the prompt, the model's call, the tool's result"
    );
    let spools: Vec<_> = std::fs::read_dir(dir.path(".agentvisor"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        spools
            .iter()
            .any(|f| f.starts_with("postgres-") && f.ends_with(".spool")),
        "{spools:?}"
    );
    // Ctrl-C: cancelled at once, on record; its checkpoint cleared and its
    // leases given up.
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(": cancelled"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM runs WHERE status = 'cancelled'"
        )
        .await,
        1
    );
    assert_eq!(count(&client, "SELECT count(*) FROM checkpoints").await, 0);
    assert_eq!(
        count(&client, "SELECT count(*) FROM checkpoint_entries").await,
        0
    );
    let left = client
        .query("SELECT owner FROM host_leases WHERE owner = $1", &[&owner])
        .await
        .unwrap();
    assert!(left.is_empty(), "the host lease is released");
}

/// Three slow calls: a run is in flight for about a second.
const SLOW: &str = r#"
name: slow
model: scripted
durable: true
prompt: add, shout, answer
tools: [add, upper]
limits: { max_runtime: 1h, soft_timeout: 1h, stall_timeout: 1h, hard_timeout: 2h }
script:
  - { tool: add, args: { a: 2, b: 3 }, latency: 300ms }
  - { tool: upper, args: { text: done }, latency: 300ms }
  - { text: "2+3=5, DONE", latency: 300ms }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swarm_killed_mid_way_is_recovered_from_the_server_each_run_ending_once() {
    let db = support::postgres::fresh_database().await;
    let dir = Scratch::new("cli-postgres-recover");
    let manifest = dir.file("slow.yaml", SLOW);
    agentvisor::stores::PostgresStore::connect(&db)
        .await
        .unwrap();
    let client = sql(&db).await;
    let mut swarm = on(
        &db,
        &dir,
        &[
            "swarm",
            manifest.to_str().unwrap(),
            "--runs",
            "60",
            "--concurrency",
            "30",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // Killed once its first 30 runs are accepted (checkpointed), before
    // any of them ends.
    let bound = Instant::now() + Duration::from_secs(60);
    while count(&client, "SELECT count(*) FROM checkpoints").await < 30 {
        assert!(Instant::now() < bound, "30 runs not accepted within 60 s");
        assert!(swarm.try_wait().unwrap().is_none(), "the swarm ended early");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    swarm.kill().unwrap();
    swarm.wait().unwrap();
    let in_flight = count(&client, "SELECT count(*) FROM checkpoints").await;
    let ended = count(&client, "SELECT count(*) FROM runs").await;
    assert!(in_flight >= 30, "{in_flight}");

    // Another process resumes every one of them from its checkpoint.
    let summary = ok_json(&output(&db, &dir, &["recover", "--json"]));
    assert_eq!(summary["resumed"], in_flight, "{summary}");
    assert_eq!(summary["by_status"]["ok"], in_flight, "{summary}");
    assert_eq!(summary["leased"].as_array().unwrap().len(), 0, "{summary}");
    // Every run accepted ended once, ok; nothing is left to resume. (A
    // run's `run.start` record rides in the audit log's group commit, and
    // its first checkpoint is saved beside it, not after it: a SIGKILL
    // between the two leaves a resumed run without its start record. So
    // the runs are counted by their terminal records; ordering the first
    // checkpoint after the start record is still to do.)
    let ended_once = count(
        &client,
        "SELECT count(*) FROM (SELECT run_id FROM audit_records WHERE kind = 2 \
         GROUP BY run_id HAVING count(*) = 1) t",
    )
    .await;
    assert_eq!(ended_once, in_flight + ended);
    assert_eq!(
        count(&client, "SELECT count(*) FROM runs WHERE status = 'ok'").await,
        ended_once
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM audit_records WHERE kind = 2").await,
        ended_once
    );
    assert_eq!(count(&client, "SELECT count(*) FROM checkpoints").await, 0);
    let again = ok_json(&output(&db, &dir, &["recover", "--json"]));
    assert_eq!(again["resumed"], 0, "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_is_kept_on_the_server_and_budgets_are_set_there() {
    let db = support::postgres::fresh_database().await;
    let dir = Scratch::new("cli-postgres-chat");
    let chat = dir.file(
        "chat.yaml",
        "name: chat\nmodel: scripted\nsystem: You answer.\nscript:\n  - { text: \"Hello Ada.\" }\n",
    );
    let mut child = on(
        &db,
        &dir,
        &["chat", chat.to_str().unwrap(), "--session", "ada"],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"My name is Ada.\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Hello Ada."));
    let shown = ok_json(&output(&db, &dir, &["sessions", "show", "ada", "--json"]));
    let messages: Vec<&Value> = shown["messages"].as_array().unwrap().iter().collect();
    assert_eq!(messages.len(), 2, "{shown}");
    assert_eq!(messages[0]["content"], "My name is Ada.");
    assert_eq!(messages[1]["content"], "Hello Ada.");
    let listed = ok_json(&output(&db, &dir, &["sessions", "list", "--json"]));
    assert_eq!(listed[0]["id"], "ada");

    let set = output(&db, &dir, &["budget", "set", "alice", "--tokens", "1000"]);
    assert_eq!(
        set.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let shown = ok_json(&output(&db, &dir, &["budget", "show", "alice", "--json"]));
    assert_eq!(shown["limits"]["tokens"], 1000, "{shown}");
}

#[tokio::test]
async fn the_commands_that_do_not_run_on_postgres_yet_refuse_it_creating_nothing() {
    let db = support::postgres::fresh_database().await;
    let dir = Scratch::new("cli-postgres-refused");
    let id = "0123456789abcdef0123456789abcdef";
    for args in [
        vec!["serve", "--addr", "127.0.0.1:0"],
        vec!["replay", id],
        vec!["fork", id, "--at-step", "1"],
        vec!["diff", id, id],
        vec!["runs", "prune", "--retain", "max_runs=1"],
    ] {
        let out = support::cli::command(&[&["--db", &db][..], &args].concat())
            .current_dir(&dir.0)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("does not run on PostgreSQL yet"),
            "{args:?}: {stderr}"
        );
        let made: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
        assert!(made.is_empty(), "{args:?} created {made:?}");
    }
    // A server that does not answer, or a database it does not have: exit
    // 2, the password never shown.
    let gone = "postgres://agent:s3cret@127.0.0.1:9/agentvisor";
    let out = support::cli::command(&["--db", gone, "runs", "list"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

#[tokio::test]
async fn skill_run_delivers_its_publishes_through_the_servers_outbox() {
    let db = support::postgres::fresh_database().await;
    let dir = Scratch::new("cli-postgres-skill");
    std::fs::create_dir_all(dir.path("repo/skills/a")).unwrap();
    dir.file("repo/skills/a/SKILL.md", "---\nname: a\n---\nHi\n");
    dir.file(
        "repo/agentvisor.yaml",
        "skills: { a: skills/a }\nschedules:\n  - name: s\n    skill: a\n    cron: \"0 * * * *\"\n    script: [{ text: \"hello <memory>m</memory>\" }]\n    destinations:\n      - { type: file, path: out/a.txt, template: \"{{skill}}: {{output}}\" }\n      - { type: webhook, name: nowhere, url: \"http://127.0.0.1:9/in\", when: on_failure }\n",
    );
    let repo = dir.arg("repo");
    let r = ok_json(&output(
        &db,
        &dir,
        &["skill", "run", &repo, "--schedule", "s", "--json"],
    ));
    assert_eq!(r["outcome"], "succeeded", "{r}");
    assert_eq!(r["publish"][0]["state"], "delivered", "{r}");
    assert_eq!(r["publish"][1]["state"], "skipped", "{r}");
    assert_eq!(
        std::fs::read_to_string(dir.path("repo/out/a.txt")).unwrap(),
        "a: hello"
    );
    // On the server: the run's two intents, one delivered in one try, the
    // other skipped; neither claimed any more, nothing owed.
    let run_id = r["run_id"].as_str().unwrap().to_string();
    let client = sql(&db).await;
    let rows = client
        .query(
            "SELECT idx, state, attempts, claimed_by FROM outbox WHERE run_id = $1 ORDER BY idx",
            &[&run_id],
        )
        .await
        .unwrap();
    let rows: Vec<(i32, String, i32, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        rows,
        [
            (0, "delivered".to_string(), 1, None),
            (1, "skipped".to_string(), 0, None)
        ]
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM outbox WHERE state = 'owed'").await,
        0
    );
    // The run's log holds no publish record; `runs show` gives the
    // publishes' outcomes with the run, read from the server.
    assert_eq!(
        count(
            &client,
            &format!("SELECT count(*) FROM runs WHERE run_id = '{run_id}' AND status = 'ok'")
        )
        .await,
        1
    );
    let shown = ok_json(&output(&db, &dir, &["runs", "show", &run_id, "--json"]));
    assert_eq!(shown["publish"][0]["state"], "delivered", "{shown}");
    assert_eq!(shown["publish"][1]["state"], "skipped", "{shown}");
    // A second run of the schedule is a new run: its intents are its own,
    // and the first run's stay delivered once.
    let again = ok_json(&output(
        &db,
        &dir,
        &["skill", "run", &repo, "--schedule", "s", "--json"],
    ));
    assert_eq!(again["publish"][0]["state"], "delivered", "{again}");
    assert_ne!(again["run_id"], r["run_id"]);
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM outbox WHERE state = 'delivered' AND attempts = 1"
        )
        .await,
        2
    );
}
