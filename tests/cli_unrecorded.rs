#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Runs recorded nowhere are counted: when neither the database nor the
//! spool takes a run's terminal record, `swarm` counts the run in
//! `unrecorded` (by status, in `--json` too), its exit message says how
//! many and why, and the database's `runs list` lacks exactly those runs.
//! Without root: another process holds the database's write lock and the
//! spool cannot be written. As root: both on a full 2 MiB tmpfs.

mod support;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cli::{agentvisor, command};
use support::scratch::Scratch;
use support::small_disk::SmallDisk;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The summary a swarm printed (it exits 1: runs are recorded nowhere).
fn summary(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

/// How many runs with `status` the database lists.
fn listed(db: &str, status: &str) -> u64 {
    let out = agentvisor(&[
        "runs", "list", "--status", status, "--limit", "100000", "--json", "--db", db,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let runs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    runs.len() as u64
}

/// What a swarm's summary says of the runs recorded nowhere, checked
/// against itself and its exit message: `(unrecorded, ok told, ok unrecorded)`.
fn unrecorded(out: &Output, runs: u64) -> (u64, u64, u64) {
    let s = summary(out);
    let stderr = text(&out.stderr);
    println!("{s}\n{stderr}");
    let by_status = s["by_status"].as_object().unwrap();
    let told: u64 = by_status.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(told, runs, "{s}");
    let n = s["unrecorded"]
        .as_u64()
        .expect("the summary has `unrecorded`");
    let by = s["unrecorded_by_status"].as_object().unwrap();
    assert_eq!(
        by.values().map(|v| v.as_u64().unwrap()).sum::<u64>(),
        n,
        "{s}"
    );
    for (status, k) in by {
        assert!(
            k.as_u64().unwrap() <= by_status[status].as_u64().unwrap(),
            "{s}"
        );
    }
    assert!(
        stderr.contains(&format!("{n} run(s) ended but are recorded nowhere")),
        "the exit message says how many: {stderr}"
    );
    let ok = by_status.get("ok").and_then(Value::as_u64).unwrap_or(0);
    let ok_unrecorded = by.get("ok").and_then(Value::as_u64).unwrap_or(0);
    (n, ok, ok_unrecorded)
}

#[test]
fn runs_that_reach_neither_the_database_nor_the_spool_are_counted_unrecorded() {
    let dir = Scratch::new("unrecorded-locked");
    let db = dir.arg("a.db");
    std::fs::write(dir.path("not-a-dir"), b"x").unwrap();
    let spool = dir.arg("not-a-dir/audit.spool");
    let made = agentvisor(&["run", "examples/agents/hello.yaml", "--db", &db]);
    assert!(made.status.success(), "{}", text(&made.stderr));

    // Another process holds the write lock for as long as the swarm runs.
    let other = rusqlite::Connection::open(dir.path("a.db")).unwrap();
    other
        .execute_batch("BEGIN IMMEDIATE; DELETE FROM budget_limits WHERE 0;")
        .unwrap();
    let out = agentvisor(&[
        "swarm",
        "examples/agents/hello.yaml",
        "--runs",
        "24",
        "--concurrency",
        "6",
        "--json",
        "--db",
        &db,
        "--spool",
        &spool,
    ]);
    other.execute_batch("COMMIT").unwrap();
    let (n, ok, ok_unrecorded) = unrecorded(&out, 24);
    // Nothing the swarm did reached the database.
    assert_eq!(n, 24, "{}", text(&out.stdout));
    assert!(ok > 0, "runs admitted before the outage was known ended ok");
    assert_eq!(ok_unrecorded, ok);
    assert_eq!(
        listed(&db, "ok"),
        1 + ok - ok_unrecorded,
        "only the first run"
    );
}

#[test]
#[ignore = "mounts a tmpfs: needs root (run with --ignored, as CI does)"]
fn on_a_full_small_disk_the_swarm_says_which_runs_are_recorded_nowhere() {
    let dir = Scratch::new("unrecorded-small-disk");
    let disk = SmallDisk::mount(
        "on_a_full_small_disk_the_swarm_says_which_runs_are_recorded_nowhere",
        &dir.0,
        "2m",
    );
    let db = disk.path("a.db").display().to_string();
    // Runs that wait for their answer: the disk fills while they do.
    let file = dir.file(
        "slow.yaml",
        "name: slow\nscript:\n  - { text: fine, latency: 300ms }\n",
    );
    let child = command(&[
        "swarm",
        &file.display().to_string(),
        "--runs",
        "60",
        "--concurrency",
        "10",
        "--json",
        "--db",
        &db,
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    until_started(&disk.path("a.db"));
    let filler = disk.fill();
    let out = child.wait_with_output().unwrap();
    std::fs::remove_file(filler).unwrap();
    let (n, ok, ok_unrecorded) = unrecorded(&out, 60);
    assert!(n > 0, "{}", text(&out.stderr));
    // What the spool took is replayed by the next command on the database.
    let replayed = agentvisor(&["recover", "--db", &db]);
    assert!(replayed.status.success(), "{}", text(&replayed.stderr));
    assert_eq!(
        listed(&db, "ok"),
        ok - ok_unrecorded,
        "the runs told ok that the database lists: all but the unrecorded ones"
    );
}

/// Waits (polling the file, at most a minute) until a run started on record.
fn until_started(db: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = rusqlite::Connection::open(db)
            .and_then(|c| {
                c.query_row(
                    "SELECT COUNT(*) FROM audit_segments WHERE has_start = 1",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .unwrap_or(0);
        if n > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no run started on record");
        std::thread::sleep(Duration::from_millis(20));
    }
}
