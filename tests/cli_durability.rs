#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The database's bounds from outside: a lock held by another process
//! neither hides a run's result nor waits silently (the records go to the
//! spool, `--spool` says where), and damage in the middle of the file is
//! refused with exit 2 by `--check` and by `recover`; a database deleted
//! under a running command, or records that nothing takes, end it non-zero
//! with a message that says how many records and where the spool is.

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

/// Polls (bounded, 60 s) until `sql`, a count on `db`, reaches `want`.
fn until_count(db: &Path, sql: &str, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = rusqlite::Connection::open(db)
            .and_then(|c| c.query_row(sql, [], |r| r.get::<_, i64>(0)))
            .unwrap_or(0);
        if n >= want {
            return;
        }
        assert!(Instant::now() < deadline, "`{sql}` stays at {n} < {want}");
        // Polling the file for a state, not waiting for a deadline.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded, 60 s) for a child's exit; its code and stderr.
fn finish(mut child: std::process::Child) -> (Option<i32>, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            return (status.code(), stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AGENTVISOR_DB")
        .env_remove("AGENTVISOR_SPOOL")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs")
}

#[test]
fn a_database_deleted_under_a_swarm_or_a_run_ends_it_non_zero_naming_the_spool() {
    let dir = scratch("deleted");
    let file = dir.join("m.yaml");
    // Runs that wait a second for their answer: the file is deleted while
    // they do.
    std::fs::write(
        &file,
        "name: slow\nscript:\n  - { text: fine, latency: 1s }\n",
    )
    .unwrap();
    let file_s = file.display().to_string();
    for (name, args) in [
        (
            "swarm",
            vec!["swarm", &file_s, "--runs", "10", "--concurrency", "10"],
        ),
        ("run", vec!["run", &file_s]),
    ] {
        let db = dir.join(format!("{name}.db"));
        let db_s = db.display().to_string();
        let mut all = args.clone();
        all.extend(["--db", &db_s]);
        let child = spawn(&all);
        // Its runs are on record (started), then the file goes.
        until_count(
            &db,
            "SELECT COUNT(*) FROM audit_segments WHERE has_start = 1",
            1,
        );
        std::fs::remove_file(&db).unwrap();
        let (code, stderr) = finish(child);
        assert_eq!(code, Some(1), "{name}: {stderr}");
        assert!(stderr.contains("deleted or replaced"), "{name}: {stderr}");
        assert!(stderr.contains("could not be written"), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{db_s}.spool")),
            "{name} names the spool: {stderr}"
        );
        assert!(std::fs::metadata(format!("{db_s}.spool")).unwrap().len() > 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn soak_says_how_many_records_it_could_not_write_and_exits_non_zero() {
    let dir = scratch("soak-lost");
    let db = dir.join("a.db");
    // Neither the database (deleted below) nor the spool (its directory
    // is a file) takes records.
    std::fs::write(dir.join("not-a-dir"), b"x").unwrap();
    let spool = dir.join("not-a-dir/audit.spool");
    let (db_s, spool_s) = (db.display().to_string(), spool.display().to_string());
    let child = spawn(&[
        "soak",
        "examples/agents/hello.yaml",
        "--duration",
        "4s",
        "--concurrency",
        "4",
        "--db",
        &db_s,
        "--spool",
        &spool_s,
    ]);
    until_count(&db, "SELECT COUNT(*) FROM runs", 1);
    std::fs::remove_file(&db).unwrap();
    let (code, stderr) = finish(child);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("could not be written"), "{stderr}");
    assert!(stderr.contains(&spool_s), "the spool is named: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
