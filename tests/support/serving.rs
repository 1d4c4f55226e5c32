//! `agentvisor serve` as a process of a test: started on a database file
//! with a directory of agents, talked to over HTTP, then crashed
//! (SIGKILL) or stopped (SIGTERM, drained).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running `agentvisor serve`; killed if dropped.
pub(crate) struct Serving {
    child: Child,
    /// `http://ADDR`.
    pub(crate) base: String,
    http: reqwest::Client,
}

impl Serving {
    /// Starts `serve` on `db` with the agents of `agents` (no tokens: every
    /// request is the admin `anonymous`), `extra` flags after them, and
    /// waits for its `listening on` line.
    pub(crate) fn start(db: &Path, agents: &Path, extra: &[&str]) -> Serving {
        Self::start_draining_for(db, agents, "1s", extra)
    }

    /// [`start`](Self::start) with `--drain drain`.
    pub(crate) fn start_draining_for(
        db: &Path,
        agents: &Path,
        drain: &str,
        extra: &[&str],
    ) -> Serving {
        let mut args = vec![
            "--db".to_string(),
            db.display().to_string(),
            "serve".to_string(),
            "--addr".to_string(),
            "127.0.0.1:0".to_string(),
            "--drain".to_string(),
            drain.to_string(),
            "--agents".to_string(),
            agents.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = super::cli::command(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let base = first
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {first:?}"))
            .to_string();
        Serving {
            child,
            base,
            http: super::loopback::http_client(),
        }
    }

    /// `METHOD {base}{path}` with `body`: the status and the JSON answer
    /// (`Null` when it is not JSON).
    pub(crate) async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = r.send().await.unwrap();
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (code, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Polls `GET {path}` (every 20 ms, at most a minute) until `done`
    /// holds of its answer, which it returns.
    pub(crate) async fn poll(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let (_, v) = self.call("GET", path, None).await;
            if done(&v) {
                return v;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "GET {path} never answered as awaited: {v}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: the process dies at once, as in a crash.
    pub(crate) fn crash(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends the process `sig` (`TERM`, `HUP`).
    pub(crate) fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// SIGTERM, then waits for the drained exit (which must be 0).
    pub(crate) async fn stop(self) {
        self.signal("TERM");
        self.exited().await;
    }

    /// Waits (at most a minute) for the process to exit, which must be
    /// with 0.
    pub(crate) async fn exited(mut self) {
        let started = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "serve did not exit after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "{status:?}");
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
