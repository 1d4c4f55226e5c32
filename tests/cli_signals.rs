#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Signals with the real binary: SIGTERM / SIGHUP / Ctrl-C stop admitting,
//! give runs in flight `--drain` to finish, then cancel what still runs,
//! write every record, print the result or summary and exit 143 / 129 /
//! 130; a second signal ends the drain at once.
//!
//! Each test waits for an explicit line from the child (an event on stdout
//! for `run`, the "runs in flight" log line on stderr for `swarm`) before
//! it sends a signal, never for a fixed time. Every wait is bounded (60 s)
//! so a regression fails the test instead of hanging the suite; the bound
//! is far above what a healthy child needs (well under a second here).

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
