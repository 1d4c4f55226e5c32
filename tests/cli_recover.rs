#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Crash recovery from outside (P2): a swarm of durable runs is killed with
//! SIGKILL mid-way; `agentvisor recover` resumes what was interrupted, and
//! afterwards every run on record has exactly one terminal record.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "agentvisor-recover-{name}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn agentvisor() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agentvisor"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AGENTVISOR_DB");
    c
}

fn run(args: &[&str]) -> Output {
    agentvisor().args(args).output().expect("the binary runs")
}

/// A read-only connection to the swarm's file (another process's view).
fn read_only(db: &std::path::Path) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    c.busy_timeout(Duration::from_secs(5))?;
    Ok(c)
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swarm_of_durable_runs_killed_mid_way_is_recovered_with_one_terminal_record_each() {
    let dir = scratch("sigkill");
    let db = dir.join("agentvisor.db");
    let db_s = db.display().to_string();
    let mut child = agentvisor()
        .args([
            "swarm",
            "examples/agents/durable.yaml",
            "--runs",
            "400",
            "--concurrency",
            "80",
            "--json",
            "--db",
            &db_s,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // Kill it once some runs have finished and others are mid-way, past
    // their first step. A poll of the file, not a deadline: the swarm is
    // another process, whose progress only its file shows; the 60 s bound
    // only turns a swarm that never gets going into a failure.
    let started = Instant::now();
    let mut conn = None;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the swarm never got going"
        );
        if conn.is_none() && db.exists() {
            conn = read_only(&db).ok();
        }
        if let Some(c) = conn.as_ref() {
            let finished = c
                .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get::<_, i64>(0))
                .unwrap_or(0);
            // Mid-way: past a step and not finished (a finished run's
            // checkpoint may not be cleared yet).
            let mid_way = c
                .query_row(
                    "SELECT COUNT(*) FROM checkpoints k WHERE k.iteration > 0 \
                     AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = k.run_id)",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .unwrap_or(0);
            if finished >= 40 && mid_way >= 10 {
                break;
            }
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the swarm ended before it was killed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    drop(conn);

    let c = read_only(&db).unwrap();
    let before = count(&c, "SELECT COUNT(*) FROM runs");
    let pending = count(&c, "SELECT COUNT(*) FROM checkpoints");
    drop(c);
    assert!(before < 400, "the kill came before the swarm's end");
    assert!(
        pending > 0,
        "runs were mid-way when killed ({before} finished)"
    );

    let out = run(&["recover", "--json", "--db", &db_s]);
    assert!(
        out.status.success(),
        "recover failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let resumed = summary["resumed"].as_u64().unwrap();
    assert!(resumed > 0, "{summary}");
    assert_eq!(
        summary["by_status"]["ok"].as_u64(),
        Some(resumed),
        "{summary}"
    );

    let c = read_only(&db).unwrap();
    let on_record = count(&c, "SELECT COUNT(DISTINCT run_id) FROM audit_log");
    let finished = count(&c, "SELECT COUNT(*) FROM runs");
    let not_once = count(
        &c,
        "SELECT COUNT(*) FROM (SELECT run_id FROM audit_log WHERE kind = 'run.end' \
         GROUP BY run_id HAVING COUNT(*) <> 1)",
    );
    let without = count(
        &c,
        "SELECT COUNT(DISTINCT run_id) FROM audit_log a WHERE NOT EXISTS \
         (SELECT 1 FROM audit_log t WHERE t.run_id = a.run_id AND t.kind = 'run.end')",
    );
    let left = count(&c, "SELECT COUNT(*) FROM checkpoints");
    let not_ok = count(&c, "SELECT COUNT(*) FROM runs WHERE status <> 'ok'");
    drop(c);
    assert_eq!(not_once, 0, "a run has more than one terminal record");
    assert_eq!(without, 0, "a run on record has no terminal record");
    assert_eq!(finished, on_record);
    assert!(finished >= before + resumed as i64);
    assert_eq!(left, 0, "every checkpoint is cleared");
    assert_eq!(not_ok, 0, "every accepted durable run ends ok");

    // A second recover finds nothing to do.
    let again = run(&["recover", "--json", "--db", &db_s]);
    assert!(again.status.success());
    let s: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(s["resumed"], 0);
    assert_eq!(s["interrupted"].as_array().unwrap().len(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn recover_refuses_an_in_memory_database() {
    let out = run(&["recover", "--db", ":memory:"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":memory:"));
}
