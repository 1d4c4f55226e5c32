#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Signals with the real binary: SIGTERM / SIGHUP / Ctrl-C stop admitting,
//! give runs in flight `--drain` to finish, then cancel what still runs,
//! write every record, print the result or summary and exit 143 / 129 /
//! 130; a second signal ends the drain at once. And SIGSTOP / SIGCONT (a
//! paused process): healthy runs are not taken for stalled, a `recover`
//! beside a live `swarm` ends none of its runs, and a `recover` that took
//! over the durable runs of a `swarm` paused past its leases runs each
//! once, the `swarm` writing nothing more of them.
//!
//! Each test waits for an explicit line from the child (an event on stdout
//! for `run`, the "runs in flight" log line on stderr for `swarm`) or for
//! a state of the database (polled) before it sends a signal, never for a
//! fixed time; the one fixed time is the length of a pause, which is what
//! the pause test is about. Every wait is bounded (60 s) so a regression
//! fails the test instead of hanging the suite; the bound is far above
//! what a healthy child needs (well under a second here).

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::scratch::Scratch;

const BOUND: Duration = Duration::from_secs(60);

/// A started child and its output, read line by line on threads.
struct Running {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
    out_lines: Vec<String>,
}

fn lines_of(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn start(args: &[&str]) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AGENTVISOR_DB")
        .env("AGENTVISOR_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines_of(child.stdout.take().unwrap());
    let stderr = lines_of(child.stderr.take().unwrap());
    Running {
        child,
        stdout,
        stderr,
        out_lines: Vec::new(),
    }
}

impl Running {
    /// Waits (bounded) for a stderr line that contains `needle`.
    fn await_stderr(&self, needle: &str) {
        let deadline = Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(e) => panic!("no stderr line with `{needle}`: {e}"),
            }
        }
    }

    /// Waits (bounded) for a stdout line that contains `needle`.
    fn await_stdout(&mut self, needle: &str) {
        let deadline = Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.out_lines.push(line);
                    if hit {
                        return;
                    }
                }
                Err(e) => panic!("no stdout line with `{needle}`: {e}"),
            }
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (bounded) for the exit; returns its code and all of stdout.
    fn finish(mut self) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + BOUND;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the child did not exit within {BOUND:?}");
            }
            // Polling the exit, not waiting for a deadline of the child's.
            std::thread::sleep(Duration::from_millis(20));
        };
        self.out_lines.extend(self.stdout.iter());
        (status.code(), self.out_lines)
    }
}

fn manifest(dir: &Scratch, script: &str) -> String {
    let path = dir.arg("m.yaml");
    std::fs::write(
        &path,
        format!("name: sig\nlimits: {{ stall_timeout: 2h, max_runtime: 3h, hard_timeout: 4h }}\nscript:\n{script}"),
    )
    .unwrap();
    path
}

fn summary(lines: &[String]) -> Value {
    let last = lines
        .iter()
        .rev()
        .find(|l| l.starts_with('{'))
        .expect("a JSON summary");
    serde_json::from_str(last).unwrap()
}

fn runs_on_record(db: &str) -> usize {
    let out = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .args(["--db", db, "runs", "list", "--json", "--limit", "100000"])
        .env_remove("AGENTVISOR_DB")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().unwrap().len()
}

/// Polls the database (bounded) until `sql`, a count, reaches `want`.
fn until_count(db: &str, sql: &str, want: i64) {
    let deadline = Instant::now() + BOUND;
    loop {
        let n = count(db, sql);
        if n >= want {
            return;
        }
        assert!(Instant::now() < deadline, "`{sql}` stays at {n} < {want}");
        // Polling the file for a state, not waiting for a deadline.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A count from the database (0 while it cannot be read yet).
fn count(db: &str, sql: &str) -> i64 {
    let Ok(conn) = rusqlite::Connection::open(db) else {
        return 0;
    };
    let _ = conn.busy_timeout(Duration::from_secs(5));
    conn.query_row(sql, [], |r| r.get(0)).unwrap_or(0)
}

/// Runs started and not finished, on record.
const UNFINISHED: &str = "SELECT COUNT(DISTINCT run_id) FROM audit_segments \
     WHERE has_start = 1 AND run_id NOT IN (SELECT run_id FROM runs)";

/// `agentvisor recover --json` on `db`: its exit and summary.
fn recover(db: &str) -> (Option<i32>, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .args(["--db", db, "recover", "--json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AGENTVISOR_DB")
        .env_remove("AGENTVISOR_SPOOL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    (
        out.status.code(),
        summary,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every run on record has exactly one terminal record: its `runs` row
/// (one per run id), and one `run.end` among its records.
fn one_terminal_record_each(db: &str) {
    let started = count(
        db,
        "SELECT COUNT(DISTINCT run_id) FROM audit_log WHERE kind = 'run.start'",
    );
    assert!(started > 0);
    assert_eq!(
        count(db, "SELECT COUNT(*) FROM runs"),
        started,
        "a run unfinished"
    );
    assert_eq!(
        count(
            db,
            "SELECT COUNT(*) FROM (SELECT run_id FROM audit_log WHERE kind = 'run.end' \
             GROUP BY run_id HAVING COUNT(*) <> 1)"
        ),
        0,
        "a run with more than one run.end record"
    );
}

fn swarm_args<'a>(db: &'a str, file: &'a str, drain: &'a str) -> Vec<&'a str> {
    vec![
        "--db",
        db,
        "swarm",
        file,
        "--runs",
        "100000",
        "--concurrency",
        "20",
        "--drain",
        drain,
        "--json",
    ]
}

#[test]
fn swarm_sigterm_drains_then_cancels_flushes_and_exits_143() {
    let dir = Scratch::new("term");
    let db = dir.arg("a.db");
    let file = manifest(&dir, "  - { text: slow, latency: 1h }\n");
    let child = start(&swarm_args(&db, &file, "200ms"));
    child.await_stderr("runs in flight");
    child.signal("TERM");
    let (code, out) = child.finish();
    assert_eq!(code, Some(143));
    let s = summary(&out);
    let cancelled = s["by_status"]["cancelled"].as_u64().unwrap_or(0);
    assert!(cancelled >= 1, "{s}");
    assert_eq!(s["by_status"].get("ok"), None, "{s}");
    let runs = s["runs"].as_u64().unwrap();
    assert!(runs < 100_000, "admission stopped: {s}");
    assert_eq!(s["audit_terminal_records"].as_u64().unwrap(), runs, "{s}");
    assert_eq!(runs_on_record(&db) as u64, runs, "every record was written");
}

#[test]
fn swarm_sighup_lets_runs_in_flight_finish_within_the_drain_and_exits_129() {
    let dir = Scratch::new("hup");
    let db = dir.arg("a.db");
    let file = manifest(&dir, "  - { text: quick, latency: 300ms }\n");
    let child = start(&swarm_args(&db, &file, "30s"));
    child.await_stderr("runs in flight");
    child.signal("HUP");
    let (code, out) = child.finish();
    assert_eq!(code, Some(129));
    let s = summary(&out);
    let runs = s["runs"].as_u64().unwrap();
    assert!(runs < 100_000, "{s}");
    assert_eq!(
        s["by_status"]["ok"].as_u64().unwrap(),
        runs,
        "all drained ok: {s}"
    );
    assert_eq!(runs_on_record(&db) as u64, runs);
}

#[test]
fn swarm_ctrl_c_drains_and_exits_130_and_a_second_signal_ends_at_once() {
    let dir = Scratch::new("int");
    let db = dir.arg("a.db");
    let file = manifest(&dir, "  - { hang: true }\n");
    // A drain of an hour: only the second signal can end it in time.
    let child = start(&swarm_args(&db, &file, "1h"));
    child.await_stderr("runs in flight");
    child.signal("INT");
    child.await_stderr("SIGINT: no new runs");
    child.signal("TERM");
    let (code, out) = child.finish();
    assert_eq!(code, Some(130), "the first signal decides the code");
    let s = summary(&out);
    let runs = s["runs"].as_u64().unwrap();
    assert_eq!(s["by_status"]["cancelled"].as_u64().unwrap(), runs, "{s}");
    assert_eq!(runs_on_record(&db) as u64, runs);
}

#[test]
fn run_sigterm_cancels_after_the_drain_prints_the_result_and_exits_143() {
    let dir = Scratch::new("run");
    let db = dir.arg("a.db");
    let file = manifest(&dir, "  - { hang: true }\n");
    let mut child = start(&[
        "--db", &db, "run", &file, "--events", "--json", "--drain", "100ms",
    ]);
    child.await_stdout("step.start");
    child.signal("TERM");
    let (code, out) = child.finish();
    assert_eq!(code, Some(143));
    let result: Value = serde_json::from_str(out.last().unwrap()).unwrap();
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(runs_on_record(&db), 1);
}

#[test]
fn a_swarm_paused_past_its_stall_timeout_kills_none_of_its_healthy_runs() {
    let dir = Scratch::new("pause");
    let db = dir.arg("a.db");
    let file = dir.arg("m.yaml");
    // Each run waits 300 ms for its answer: healthy, well within its stall
    // timeout of 1 s.
    std::fs::write(
        &file,
        "name: slow\nlimits: { stall_timeout: 1s, max_runtime: 1h, hard_timeout: 2h }\nscript:\n  - { text: fine, latency: 300ms }\n",
    )
    .unwrap();
    let child = start(&swarm_args(&db, &file, "30s"));
    child.await_stderr("runs in flight");
    until_count(&db, "SELECT COUNT(*) FROM runs", 20);
    // Frozen for 3 s (a VM pause, a laptop sleep): three stall timeouts,
    // past the critic's pause detection (a gap over 1.5 s). The sleep is
    // the pause itself.
    child.signal("STOP");
    std::thread::sleep(Duration::from_secs(3));
    let before = count(&db, "SELECT COUNT(*) FROM runs");
    child.signal("CONT");
    // It goes on: runs finish after the pause, then it drains.
    until_count(&db, "SELECT COUNT(*) FROM runs", before + 40);
    child.signal("TERM");
    let (code, out) = child.finish();
    assert_eq!(code, Some(143));
    let s = summary(&out);
    let runs = s["runs"].as_u64().unwrap();
    assert_eq!(s["by_status"]["ok"].as_u64(), Some(runs), "{s}");
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM runs WHERE status <> 'ok'"),
        0,
        "no run ended killed/stalled"
    );
    assert_eq!(runs_on_record(&db) as u64, runs);
}

#[test]
fn recover_beside_a_live_swarm_ends_none_of_its_runs() {
    let dir = Scratch::new("beside");
    let db = dir.arg("a.db");
    let file = manifest(&dir, "  - { hang: true }\n");
    let child = start(&swarm_args(&db, &file, "100ms"));
    child.await_stderr("runs in flight");
    // Its 20 runs (the concurrency) are in flight and on record.
    until_count(&db, UNFINISHED, 20);
    let (code, s, stderr) = recover(&db);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(s["interrupted"].as_array().map(Vec::len), Some(0), "{s}");
    assert_eq!(s["leased"].as_array().map(Vec::len), Some(20), "{s}");
    // The swarm ends its runs itself: cancelled by its drain, on record
    // once each, none `interrupted`.
    child.signal("TERM");
    let (code, out) = child.finish();
    assert_eq!(code, Some(143));
    let s = summary(&out);
    assert_eq!(s["by_status"]["cancelled"].as_u64(), Some(20), "{s}");
    one_terminal_record_each(&db);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM runs WHERE error_kind = 'interrupted'"
        ),
        0
    );
}

#[test]
fn a_swarm_paused_past_its_leases_loses_its_durable_runs_to_recover_and_writes_nothing_of_them() {
    let dir = Scratch::new("fenced");
    let db = dir.arg("a.db");
    let file = dir.arg("m.yaml");
    // A step, then an answer a second later.
    std::fs::write(
        &file,
        "name: dur\ndurable: true\ntools: [add]\nlimits: { stall_timeout: 1h, max_runtime: 1h, hard_timeout: 2h }\nscript:\n  - { tool: add, args: { a: 1, b: 2 } }\n  - { text: done, latency: 1s }\n",
    )
    .unwrap();
    let n = 10;
    let n_s = n.to_string();
    let child = start(&[
        "--db",
        &db,
        "--lease-ttl",
        "1s",
        "swarm",
        &file,
        "--runs",
        &n_s,
        "--concurrency",
        &n_s,
        "--json",
    ]);
    child.await_stderr("runs in flight");
    until_count(
        &db,
        "SELECT COUNT(*) FROM checkpoints WHERE iteration = 1",
        n,
    );
    // Paused past its 1 s leases: a `recover` (polled until one claims:
    // the leases must expire first) resumes its runs and finishes them.
    child.signal("STOP");
    let deadline = Instant::now() + BOUND;
    let mut resumed = 0;
    while resumed < n {
        assert!(
            Instant::now() < deadline,
            "recover resumed {resumed} of {n}"
        );
        let (code, s, stderr) = recover(&db);
        if code != Some(0) {
            // The swarm was stopped within one of its (millisecond) writes
            // and holds the database's lock: let it finish that write.
            child.signal("CONT");
            child.signal("STOP");
            assert!(stderr.contains("lock"), "{stderr}");
            continue;
        }
        resumed += s["resumed"].as_i64().unwrap_or(0);
        assert_eq!(
            s["by_status"]["ok"].as_i64().unwrap_or(0),
            s["resumed"].as_i64().unwrap_or(0),
            "{s}"
        );
        // Polling for the leases to expire, not waiting for a deadline.
        std::thread::sleep(Duration::from_millis(100));
    }
    // It comes back: its answers are due at once, but the runs are not
    // its own any more; it writes nothing of them. What it tells its
    // caller never disagrees with the record: `cancelled` (lease lost),
    // or `ok` where the host that took the run over recorded it `ok`
    // (which of the two depends on whether the paused swarm learns of the
    // takeover before or after its answer is due).
    child.signal("CONT");
    let (_, out) = child.finish();
    let s = summary(&out);
    let told = |status: &str| s["by_status"][status].as_i64().unwrap_or(0);
    assert_eq!(told("cancelled") + told("ok"), n, "{s}");
    assert_eq!(s["audit_terminal_records"].as_i64(), Some(0), "{s}");
    one_terminal_record_each(&db);
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM runs WHERE status = 'ok'"),
        n
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM checkpoints"), 0);
}
