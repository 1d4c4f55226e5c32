#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The database's bounds from outside: a lock held by another process
//! neither hides a run's result nor waits silently (the records go to the
//! spool, `--spool` says where), and damage in the middle of the file is
//! refused with exit 2 by `--check` and by `recover`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "agentvisor-cli-durability-{name}-{}-{}",
        std::process::id(),
        agentvisor::RunId::new()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AGENTVISOR_DB")
        .env_remove("AGENTVISOR_SPOOL")
        .args(args)
        .output()
        .expect("the binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_locked_database_delays_a_result_by_a_second_at_most_and_says_so() {
    let dir = scratch("locked");
    let db = dir.join("a.db");
    let spool = dir.join("elsewhere.spool");
    let (db_s, spool_s) = (db.display().to_string(), spool.display().to_string());
    let made = run(&["run", "examples/agents/hello.yaml", "--db", &db_s]);
    assert!(made.status.success(), "{}", text(&made.stderr));

    // Another process holds the write lock for as long as the run takes.
    let other = rusqlite::Connection::open(&db).unwrap();
    other
        .execute_batch("BEGIN IMMEDIATE; DELETE FROM budget_limits WHERE 0;")
        .unwrap();
    let started = Instant::now();
    let out = run(&[
        "run",
        "examples/agents/hello.yaml",
        "--json",
        "--db",
        &db_s,
        "--spool",
        &spool_s,
    ]);
    let took = started.elapsed();
    other.execute_batch("COMMIT").unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "ok");
    // Each write gives up after a second (the audit batch, the budget
    // commit, the drain's last try): never the minutes a lock may last.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(
        stderr.contains("another process holds its lock"),
        "{stderr}"
    );
    assert!(stderr.contains(&spool_s), "the spool is named: {stderr}");
    assert!(std::fs::metadata(&spool).unwrap().len() > 0);

    // The next command on the database (and that spool) replays it.
    let recovered = run(&["recover", "--json", "--db", &db_s, "--spool", &spool_s]);
    assert!(recovered.status.success(), "{}", text(&recovered.stderr));
    let listed = run(&["runs", "list", "--json", "--db", &db_s]);
    let runs: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let ids: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["run_id"].as_str())
        .collect();
    assert!(ids.contains(&result["run_id"].as_str().unwrap()), "{runs}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Overwrites one page in the middle of the file (not the header).
fn damage(db: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let len = std::fs::metadata(db).unwrap().len();
    let page = 16_384;
    assert!(
        len >= 6 * page,
        "the file has pages to damage ({len} bytes)"
    );
    let mut f = std::fs::OpenOptions::new().write(true).open(db).unwrap();
    f.seek(SeekFrom::Start((len / page / 2) * page)).unwrap();
    f.write_all(&vec![0xA5; page as usize]).unwrap();
}

#[test]
fn damage_in_the_middle_of_the_file_is_refused_by_check_and_by_recover() {
    let dir = scratch("damage");
    let db = dir.join("a.db");
    let db_s = db.display().to_string();
    let made = run(&[
        "swarm",
        "examples/agents/hello.yaml",
        "--runs",
        "400",
        "--concurrency",
        "50",
        "--db",
        &db_s,
    ]);
    assert!(made.status.success(), "{}", text(&made.stderr));
    let clean = run(&["runs", "list", "--limit", "1", "--check", "--db", &db_s]);
    assert!(clean.status.success(), "{}", text(&clean.stderr));

    damage(&db);
    for args in [
        vec!["runs", "list", "--limit", "1", "--check", "--db", &db_s],
        vec!["recover", "--db", &db_s],
    ] {
        let out = run(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&db_s), "{args:?} names the file: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
