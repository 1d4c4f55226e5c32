#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Crash recovery from outside (P2): durable runs parked mid-way are killed
//! with SIGKILL beside runs that finished; `agentvisor recover` resumes what
//! was interrupted, and afterwards every run on record has exactly one
//! terminal record.

use std::path::{Path, PathBuf};
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

/// A read-only connection to the database (`None` until it exists).
fn open(db: &Path) -> Option<Connection> {
    Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).ok()
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |row| row.get(0)).unwrap_or(0)
}

/// Durable runs that take two steps at once, then park in a model call of
/// `PARK` (well under the stall timeout): killed while parked, each has a
/// checkpoint past its second step, and a resumed one ends `ok` after it.
const PARKED: &str = "\
name: parked
model: scripted
durable: true
prompt: Add 2 and 3, then shout done.
tools: [add, upper]
limits: { max_iterations: 12, max_runtime: 60s, stall_timeout: 30s }
script:
  - { tool: add, args: { a: 2, b: 3 }, latency: 10ms }
  - { tool: upper, args: { text: done }, latency: 10ms }
  - { text: \"2+3=5, DONE\", latency: 4s }
";

/// How many parked runs.
const PARKED_RUNS: i64 = 20;

#[test]
fn durable_runs_killed_mid_way_are_recovered_with_one_terminal_record_each() {
    let dir = scratch("sigkill");
    let db = dir.join("agentvisor.db");
    let db_s = db.display().to_string();

    // Runs that finish before the crash: the child's exit says they did.
    let out = run(&[
        "swarm",
        "examples/agents/durable.yaml",
        "--runs",
        "40",
        "--concurrency",
        "40",
        "--json",
        "--db",
        &db_s,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let parked = dir.join("parked.yaml");
    std::fs::write(&parked, PARKED).unwrap();
    let mut child = agentvisor()
        .args([
            "swarm",
            parked.to_str().unwrap(),
            "--runs",
            &PARKED_RUNS.to_string(),
            "--concurrency",
            &PARKED_RUNS.to_string(),
            "--json",
            "--db",
            &db_s,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // The child says a run is recoverable the one way `recover` reads it: a
    // checkpoint past its second step in the database. This must be real
    // processes and real time (a SIGKILL mid-run), so the wait is a poll of
    // that signal with a bound (60 s: a cold, loaded machine takes well
    // under a second). Once every run is parked the state holds for the
    // 4 s of the parked call, so when the kill comes within that time
    // does not matter; were it later, fewer runs would be resumed and the
    // counts below still add up.
    let started = Instant::now();
    loop {
        let parked_runs = open(&db)
            .map(|c| count(&c, "SELECT COUNT(*) FROM checkpoints WHERE iteration >= 2"))
            .unwrap_or(0);
        if parked_runs == PARKED_RUNS {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the parked runs never got past their second step ({parked_runs} did)"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the swarm ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let c = open(&db).unwrap();
    let before = count(&c, "SELECT COUNT(*) FROM runs");
    let pending = count(&c, "SELECT COUNT(*) FROM checkpoints");
    drop(c);
    assert!(
        (40..40 + PARKED_RUNS).contains(&before),
        "{before} runs finished"
    );
    assert_eq!(before + pending, 40 + PARKED_RUNS, "{pending} checkpoints");

    let out = run(&["recover", "--json", "--db", &db_s]);
    assert!(
        out.status.success(),
        "recover failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let resumed = summary["resumed"].as_u64().unwrap();
    assert_eq!(resumed as i64, pending, "{summary}");
    assert_eq!(
        summary["by_status"]["ok"].as_u64(),
        Some(resumed),
        "{summary}"
    );

    let c = open(&db).unwrap();
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
    assert_eq!(finished, 40 + PARKED_RUNS, "every run ends once");
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
