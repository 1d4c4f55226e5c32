//! `agentvisor serve` under load: W1 runs submitted over keep-alive HTTP
//! connections against the in-process swarm, and 1 000 event streams on
//! 1 000 live runs.
//!
//! Run with: `cargo bench --bench serve` (settings: `-- --runs 50000
//! --connections 256 --store sqlite|memory`, or `SERVE_RUNS=…`; `--part
//! submit` or `--part sse` runs one part).
//!
//! The server is the release binary itself (`agentvisor --db FILE|:memory:
//! serve --addr 127.0.0.1:0 --agents DIR --rate-limit 0`), started by the bench as
//! a child process with the W1 manifest in a temporary agents directory, so
//! the server and the client share no runtime, allocator or RSS figure; no
//! `--tokens`, so every request is the admin `anonymous` (the loopback
//! default); no request rate limit (the default 200/s would answer 429).
//! Each part starts a server of its own.
//!
//! # submit
//! Settings (defaults): `connections` = 256 keep-alive connections (each
//! opened and sent one untimed request first), each submitting `POST
//! /v1/runs?wait=5 {"agent": "w1"}` one after another until `runs` =
//! 50 000 are submitted; each answer must be 201 with the run's result
//! `ok`. The client is a load generator's: the request bytes prepared once,
//! the answer read by its `content-length` and its JSON body parsed (a
//! general HTTP client spent about as much CPU a run as the server did, on
//! the same two cores). `latency-ms` L = 0 (each W1 model call first
//! sleeps L). The baseline is the in-process swarm: `store` = `sqlite`
//! (default) runs the server on a fresh SQLite file (`--db FILE`, as
//! deployed) against the `agentvisor swarm` binary on a fresh file of its
//! own (`swarm W1 --runs inproc-runs --concurrency connections`), both
//! paying for the audit log on disk; `store` = `memory` runs it with
//! `--db :memory:` against a host built in the bench process (default
//! `HostConfig`, stores in memory; `support::workload::run_engine`).
//! `inproc-runs` = 200 000 runs with as many in flight as there are
//! connections. `rounds` = 3, each the baseline then the server, back to
//! back.
//!
//! With memory stores a W1 run costs about 11 CPU µs in process, and one
//! HTTP round trip on loopback (the HTTP floor below, server and client
//! together) about 12 on these shared cores: no server can then reach
//! half the in-process rate with one request a run, and the ratio says how
//! much the API adds over that floor.
//!
//! Printed per round: runs/s of both, the ratio server / in-process (issue
//! 23's target: ≥ 0.5), p50/p99/max request latency (client side, send to
//! body read), CPU seconds per 1000 runs of the server process and of the
//! client (this process); then the HTTP floor (`runs` requests of `GET
//! /healthz` on the same connections: what HTTP alone costs both sides
//! here) and the medians. Both processes share the machine's cores: the
//! client's HTTP work counts against the server.
//!
//! # sse
//! Settings (defaults): `streams` = 1 000 runs of W1 whose model calls
//! each sleep `live-ms` = 1 000 ms (a run lasts at least 3 s), submitted
//! without `wait`; then one `GET /v1/runs/{id}/events` per run (no
//! `Last-Event-ID`: from the first event), all open at once, each on its
//! own connection. A stream counts as opened on a live run when its
//! response headers arrived less than 3 × `live-ms` after its run was
//! submitted (the run cannot have ended earlier). Each stream is read to
//! its end and checked: every event is the stream's run, `id:` equals the
//! event's `seq` and strictly increases, no `lagged` event, the last event
//! is `run.end`, the stream then ends; after all ended, the ids must be
//! exactly the `seq`s of the run's event records (`GET
//! /v1/runs/{id}/records`): every event delivered once, in order. The
//! server's RSS is read from `/proc/PID` idle, with the runs live, and at
//! its peak while the streams are open (sampled every 10 ms, and VmHWM).
//!
//! `harness = false`: a plain binary that drives a server process and
//! measures the in-process baseline in the same run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentvisor::ports::audit::{AuditEntry, AuditRecord};
use agentvisor::soak::sampler::cpu_seconds;
use agentvisor::{AgentSpec, Host};
use serde::Deserialize;
use support::process::{mib, Proc};
use support::workload::{run_engine, Engine, Settings, W1_MANIFEST};
use support::{ratio, setting, Summary};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let part: String = setting("SERVE", "part", "all".to_string());
    let rt = support::runtime();
    if part == "all" || part == "submit" {
        rt.block_on(submit_part());
    }
    if part == "all" || part == "sse" {
        rt.block_on(sse_part());
    }
}

// ---------------------------------------------------------------- server

/// `agentvisor serve` as a child process, killed when dropped.
struct ServerProcess {
    child: Child,
    base: String,
    proc: Proc,
    dir: PathBuf,
}

impl ServerProcess {
    /// Starts a server whose agents are `w1` (W1, model latency `latency`)
    /// and `w1-live` (W1, model latency `live`).
    fn start(latency: Duration, live: Duration, store: Store) -> Self {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "agentvisor-bench-serve-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("w1.yaml"), w1_yaml("w1", latency)).unwrap();
        std::fs::write(dir.join("w1-live.yaml"), w1_yaml("w1-live", live)).unwrap();
        let db = match store {
            Store::Memory => PathBuf::from(":memory:"),
            Store::Sqlite => dir.join("serve.db"),
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
            .arg("--db")
            .arg(&db)
            .args(["serve", "--addr", "127.0.0.1:0"])
            .arg("--agents")
            .arg(&dir)
            .args(["--rate-limit", "0"])
            // The server's warnings (a shard held long on a loaded
            // machine) would drown the figures: errors only, unless asked.
            .env(
                "AGENTVISOR_LOG",
                std::env::var("AGENTVISOR_LOG").unwrap_or_else(|_| "error".into()),
            )
            .env_remove("AGENTVISOR_URL")
            .env_remove("AGENTVISOR_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start agentvisor serve");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("agentvisor serve did not start: `{line}`"))
            .to_string();
        // Whatever it prints later is read and dropped (a full pipe would
        // block it).
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let proc = Proc(child.id());
        ServerProcess {
            child,
            base,
            proc,
            dir,
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where the server and the in-process baseline keep their records.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Store {
    /// In memory (`--db :memory:`; the baseline a host with memory stores).
    Memory,
    /// A fresh SQLite file each (the default deployment; the baseline is
    /// the `agentvisor swarm` binary).
    Sqlite,
}

impl std::str::FromStr for Store {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "memory" => Ok(Store::Memory),
            "sqlite" => Ok(Store::Sqlite),
            other => Err(format!("store `{other}`: memory or sqlite")),
        }
    }
}

/// The in-process swarm on SQLite: `agentvisor swarm` of W1 (latency
/// `latency`) with `runs` runs, `concurrency` in flight, on a fresh file.
/// Its runs/s as it reports them.
fn swarm_on_sqlite(runs: u64, concurrency: usize, latency: Duration) -> f64 {
    let dir = std::env::temp_dir().join(format!("agentvisor-bench-swarm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("w1.yaml"), w1_yaml("w1", latency)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .arg("--db")
        .arg(dir.join("swarm.db"))
        .arg("swarm")
        .arg(dir.join("w1.yaml"))
        .args(["--runs", &runs.to_string()])
        .args(["--concurrency", &concurrency.to_string(), "--json"])
        .env("AGENTVISOR_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("run agentvisor swarm");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "agentvisor swarm: {out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        summary["by_status"]["ok"], runs,
        "every swarm run must end ok"
    );
    summary["runs_per_sec"].as_f64().unwrap()
}

/// The W1 manifest named `name`, each model call first sleeping `latency`.
fn w1_yaml(name: &str, latency: Duration) -> String {
    let mut yaml = String::new();
    for line in W1_MANIFEST.lines() {
        let l = if line.starts_with("name:") {
            format!("name: {name}")
        } else if !latency.is_zero() && line.trim_start().starts_with("- {") {
            let entry = line.strip_suffix(" }").expect("a W1 script entry");
            format!("{entry}, latency: {}ms }}", latency.as_millis())
        } else {
            line.to_string()
        };
        yaml.push_str(&l);
        yaml.push('\n');
    }
    let spec = AgentSpec::from_yaml(&yaml).expect("the W1 variant parses");
    assert_eq!(spec.script.len(), 3);
    for entry in &spec.script {
        let want = (!latency.is_zero()).then_some(latency);
        assert_eq!(entry.latency, want, "{yaml}");
    }
    yaml
}

/// An HTTP client keeping at most `idle` connections (rustls on ring handed
/// over ready-made: reqwest is built without a process-wide crypto
/// provider; the bench speaks plain HTTP).
fn http_client(idle: usize) -> reqwest::Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .pool_max_idle_per_host(idle)
        .pool_idle_timeout(Duration::from_secs(600))
        .tcp_nodelay(true)
        .build()
        .unwrap()
}

/// The part of a run's view the bench reads.
#[derive(Deserialize)]
struct View {
    run_id: String,
    status: String,
}

/// `POST /v1/runs[?wait=5]` of `agent`: the run's view, or why not.
async fn submit(
    client: &reqwest::Client,
    base: &str,
    agent: &str,
    wait: bool,
) -> Result<View, String> {
    let url = if wait {
        format!("{base}/v1/runs?wait=5")
    } else {
        format!("{base}/v1/runs")
    };
    let resp = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(format!(r#"{{"agent":"{agent}"}}"#))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if status != reqwest::StatusCode::CREATED {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

/// One keep-alive HTTP/1.1 connection that sends a request prepared once
/// and reads the answer by its `content-length`, as a load generator does:
/// the submit part measures the server, and a general client (pooling,
/// header maps, redirects) would spend more of the shared cores than the
/// server it measures. Used only for `POST /v1/runs?wait=5`, whose answers
/// always carry `content-length`.
struct Conn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(base: &str) -> Conn {
        let addr = base.strip_prefix("http://").expect("an http:// base");
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            buf: Vec::with_capacity(4096),
        }
    }

    /// `POST /v1/runs[?wait=5]` of `agent`, as bytes to send as they are.
    fn submit_request(base: &str, agent: &str, wait: bool) -> Vec<u8> {
        let host = base.strip_prefix("http://").expect("an http:// base");
        let body = format!(r#"{{"agent":"{agent}"}}"#);
        let path = if wait { "/v1/runs?wait=5" } else { "/v1/runs" };
        format!(
            "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// Reads what the server sent next (through `chunk`) onto `buf`; `closed`
    /// is the error if it closed the connection instead.
    async fn read_more(&mut self, chunk: &mut [u8], closed: &str) -> Result<(), String> {
        use tokio::io::AsyncReadExt;
        let n = self.stream.read(chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(closed.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Sends `request`; the answer's status and body.
    async fn send(&mut self, request: &[u8]) -> Result<(u16, Vec<u8>), String> {
        use tokio::io::AsyncWriteExt;
        self.stream
            .write_all(request)
            .await
            .map_err(|e| e.to_string())?;
        self.buf.clear();
        let mut chunk = [0u8; 8192];
        let (head_len, body_len) = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end]).map_err(|e| e.to_string())?;
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .ok_or_else(|| format!("an answer without content-length: {head}"))?;
                break (end + 4, len);
            }
            self.read_more(&mut chunk, "the server closed the connection")
                .await?;
        };
        while self.buf.len() < head_len + body_len {
            self.read_more(&mut chunk, "the server closed the connection mid-answer")
                .await?;
        }
        if self.buf.len() > head_len + body_len {
            return Err("bytes after the answer (none was asked for)".into());
        }
        let status = std::str::from_utf8(self.buf.get(9..12).unwrap_or_default())
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("a malformed status line")?;
        Ok((status, self.buf[head_len..].to_vec()))
    }

    /// Submits a run as `request` (from [`Conn::submit_request`]): its view.
    async fn submit(&mut self, request: &[u8]) -> Result<View, String> {
        let (status, body) = self.send(request).await?;
        view_of(status, &body)
    }
}

/// The view a submission answered (201), or why not.
fn view_of(status: u16, body: &[u8]) -> Result<View, String> {
    if status != 201 {
        return Err(format!("{status}: {}", String::from_utf8_lossy(body)));
    }
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

/// A submission with `?wait` answered 201 with its run ended `ok`.
fn ended_ok(status: u16, body: &[u8]) -> Result<(), String> {
    match view_of(status, body)? {
        v if v.status == "ok" => Ok(()),
        v => Err(format!("run {} ended {}", v.run_id, v.status)),
    }
}

/// `GET /healthz` answered 200.
fn healthy(status: u16, body: &[u8]) -> Result<(), String> {
    match status {
        200 => Ok(()),
        _ => Err(format!("{status}: {}", String::from_utf8_lossy(body))),
    }
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Runs `f(i)` for `i` in `0..n` with `workers` at a time; the results in
/// order of `i`.
async fn parallel<T, F, Fut>(n: usize, workers: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = T> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let out: Arc<Mutex<Vec<Option<T>>>> = Arc::new(Mutex::new((0..n).map(|_| None).collect()));
    let tasks: Vec<_> = (0..workers.min(n).max(1))
        .map(|_| {
            let (next, out, f) = (next.clone(), out.clone(), f.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= n {
                        break;
                    }
                    let v = f(i).await;
                    out.lock().unwrap()[i] = Some(v);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let out = std::mem::take(&mut *out.lock().unwrap());
    out.into_iter().map(|v| v.unwrap()).collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

// ---------------------------------------------------------------- submit

/// What one load of the server measured.
struct Load {
    ok: u64,
    elapsed: Duration,
    latency: Summary,
    server_cpu_s: f64,
    client_cpu_s: f64,
    first_error: Option<String>,
}

/// Sends `request` `n` times over `conns`, each connection one request
/// after another; `check` says whether an answer (status, body) is right.
async fn load(
    server: &ServerProcess,
    conns: Vec<Conn>,
    n: u64,
    request: &[u8],
    check: fn(u16, &[u8]) -> Result<(), String>,
) -> (Load, Vec<Conn>) {
    let next = Arc::new(AtomicU64::new(0));
    let (server_cpu0, client_cpu0) = (server.proc.cpu_seconds(), cpu_seconds());
    let t0 = Instant::now();
    let request: Arc<[u8]> = request.into();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let (next, request) = (next.clone(), request.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let (mut ok, mut first_error) = (0u64, None);
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    let t = Instant::now();
                    let r = c.send(&request).await;
                    lat.push(t.elapsed());
                    match r.and_then(|(status, body)| check(status, &body)) {
                        Ok(()) => ok += 1,
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                (ok, lat, first_error, c)
            })
        })
        .collect();
    let (mut ok, mut lat, mut first_error, mut conns) = (0, Vec::new(), None, Vec::new());
    for t in tasks {
        let (o, l, e, c) = t.await.unwrap();
        conns.push(c);
        ok += o;
        lat.extend(l);
        first_error = first_error.or(e);
    }
    let elapsed = t0.elapsed();
    let load = Load {
        ok,
        elapsed,
        latency: Summary::of(&mut lat),
        server_cpu_s: server.proc.cpu_seconds() - server_cpu0,
        client_cpu_s: cpu_seconds() - client_cpu0,
        first_error,
    };
    (load, conns)
}

async fn submit_part() {
    let runs: u64 = setting("SERVE", "runs", 50_000);
    let inproc_runs: u64 = setting("SERVE", "inproc-runs", 200_000);
    let connections: usize = setting("SERVE", "connections", 256).max(1);
    let rounds: usize = setting("SERVE", "rounds", 3).max(1);
    let latency = Duration::from_millis(setting("SERVE", "latency-ms", 0));
    let store: Store = setting("SERVE", "store", Store::Sqlite);
    println!(
        "bench serve/submit: runs={runs} inproc-runs={inproc_runs} connections={connections} latency={}ms rounds={rounds} store={store:?}; server: `agentvisor --db {} serve --rate-limit 0` as a child process",
        latency.as_millis(),
        match store {
            Store::Memory => ":memory:",
            Store::Sqlite => "FILE",
        }
    );
    let server = ServerProcess::start(latency, Duration::ZERO, store);
    // Every connection opens, and answers one untimed request.
    let fds0 = server.proc.open_fds();
    let request = Conn::submit_request(&server.base, "w1", true);
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(Conn::open(&server.base).await);
    }
    let warm = futures_util::future::join_all(conns.iter_mut().map(|c| c.submit(&request))).await;
    for w in warm {
        assert_eq!(w.map(|v| v.status).as_deref(), Ok("ok"), "warm-up request");
    }
    println!(
        "  server open descriptors: {fds0} idle, {} with the clients connected",
        server.proc.open_fds()
    );
    let settings = Settings {
        runs: inproc_runs,
        concurrency: connections as u64,
        latency,
    };
    let (mut ratios, mut served, mut inproc, mut p50s, mut p99s) =
        (vec![], vec![], vec![], vec![], vec![]);
    for round in 1..=rounds {
        println!("round {round}");
        let base_rps = match store {
            Store::Memory => {
                let base = run_engine(Engine::Agentvisor, settings, Host::builder())
                    .await
                    .unwrap();
                assert_eq!(base.ok, inproc_runs, "every in-process run must end ok");
                println!(
                    "  in-process  {:>9.0} runs/s  {:>7.4} CPU s/1000 runs  ({} runs, {} in flight, {:.2} s)",
                    base.runs_per_sec, base.cpu_s_per_1000, base.runs, connections, base.elapsed_s
                );
                base.runs_per_sec
            }
            Store::Sqlite => {
                let rps = tokio::task::spawn_blocking(move || {
                    swarm_on_sqlite(inproc_runs, connections, latency)
                })
                .await
                .unwrap();
                println!(
                    "  in-process  {rps:>9.0} runs/s  (`agentvisor swarm`, {inproc_runs} runs, {connections} in flight, SQLite)"
                );
                rps
            }
        };
        let (l, back) = load(&server, conns, runs, &request, ended_ok).await;
        conns = back;
        if let Some(e) = &l.first_error {
            println!("  first failed request: {e}");
        }
        assert_eq!(l.ok, runs, "every submitted run must answer 201 ok");
        let rps = runs as f64 / l.elapsed.as_secs_f64();
        println!(
            "  server      {:>9.0} runs/s  {:>7.4} CPU s/1000 runs (server) + {:.4} (client)  ({} runs, {} connections, {:.2} s)",
            rps,
            l.server_cpu_s * 1000.0 / runs as f64,
            l.client_cpu_s * 1000.0 / runs as f64,
            runs,
            connections,
            l.elapsed.as_secs_f64()
        );
        println!(
            "  request latency: p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  mean {:.2} ms",
            ms(l.latency.p50),
            ms(l.latency.p99),
            ms(l.latency.max),
            ms(l.latency.mean)
        );
        let r = ratio(rps, base_rps);
        println!("  ratio server/in-process: throughput {r:.3}x");
        ratios.push(r);
        served.push(rps);
        inproc.push(base_rps);
        p50s.push(ms(l.latency.p50));
        p99s.push(ms(l.latency.p99));
    }
    // What HTTP alone costs here: the same connections asking `/healthz`.
    let host = server.base.strip_prefix("http://").unwrap();
    let health = format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n");
    let (l, _) = load(&server, conns, runs, health.as_bytes(), healthy).await;
    assert_eq!(l.ok, runs, "every GET /healthz must answer 200");
    println!(
        "HTTP floor (GET /healthz on the same connections): {:.0} requests/s  {:.4} CPU s/1000 requests (server) + {:.4} (client)",
        runs as f64 / l.elapsed.as_secs_f64(),
        l.server_cpu_s * 1000.0 / runs as f64,
        l.client_cpu_s * 1000.0 / runs as f64,
    );
    let r = median(ratios);
    println!(
        "median of {rounds}: in-process {:.0} runs/s, server {:.0} runs/s, p50 {:.2} ms, p99 {:.2} ms",
        median(inproc),
        median(served),
        median(p50s),
        median(p99s)
    );
    println!(
        "RESULT serve/submit ({store:?} stores) throughput ratio {r:.3}x (target >= 0.50: {})",
        if r >= 0.5 { "met" } else { "NOT met" }
    );
}

// ---------------------------------------------------------------- sse

/// One frame of an event stream.
#[derive(Default)]
struct Frame {
    id: Option<String>,
    data: String,
}

/// The part of an event the bench reads.
#[derive(Deserialize)]
struct EventHead {
    #[serde(rename = "type")]
    kind: String,
    run_id: String,
    seq: u32,
}

/// What one stream delivered.
struct Delivered {
    /// The `id:`s, in the order they came.
    ids: Vec<u32>,
    /// Events without an `id:` (streamed `text.delta`s), by type.
    unnumbered: BTreeMap<String, u64>,
    /// Opened before its run could have ended.
    opened_live: bool,
    /// What was wrong with it, if anything.
    fault: Option<String>,
}

/// Reads `run_id`'s event stream from its first event to its end.
async fn stream(
    client: reqwest::Client,
    base: String,
    run_id: String,
    submitted: Instant,
    live_for: Duration,
) -> Delivered {
    let mut d = Delivered {
        ids: Vec::new(),
        unnumbered: BTreeMap::new(),
        opened_live: false,
        fault: None,
    };
    let resp = match client
        .get(format!("{base}/v1/runs/{run_id}/events"))
        .send()
        .await
    {
        Ok(r) if r.status() == reqwest::StatusCode::OK => r,
        Ok(r) => {
            d.fault = Some(format!("status {}", r.status()));
            return d;
        }
        Err(e) => {
            d.fault = Some(e.to_string());
            return d;
        }
    };
    d.opened_live = submitted.elapsed() < live_for;
    let mut resp = resp;
    let mut buf = String::new();
    let mut last_kind = String::new();
    let mut ended = false;
    loop {
        let chunk = match tokio::time::timeout(Duration::from_secs(60), resp.chunk()).await {
            Ok(Ok(Some(c))) => c,
            Ok(Ok(None)) => {
                ended = true;
                break;
            }
            Ok(Err(e)) => {
                d.fault.get_or_insert(e.to_string());
                break;
            }
            Err(_) => {
                d.fault.get_or_insert("no data for 60 s".into());
                break;
            }
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut f = Frame::default();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    f.id = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    f.data.push_str(v.trim_start());
                }
            }
            if f.data.is_empty() {
                continue; // a keep-alive comment
            }
            let ev: EventHead = match serde_json::from_str(&f.data) {
                Ok(ev) => ev,
                Err(e) => {
                    d.fault.get_or_insert(format!("bad event {e}: {}", f.data));
                    continue;
                }
            };
            if ev.run_id != run_id {
                d.fault.get_or_insert(format!("event of run {}", ev.run_id));
            }
            if ev.kind == "lagged" {
                d.fault.get_or_insert("lagged".into());
            }
            match f.id.as_deref().map(str::parse::<u32>) {
                None => *d.unnumbered.entry(ev.kind.clone()).or_default() += 1,
                Some(Ok(id)) => {
                    if id != ev.seq {
                        d.fault.get_or_insert(format!("id {id} on seq {}", ev.seq));
                    }
                    if d.ids.last().is_some_and(|&last| id <= last) {
                        d.fault
                            .get_or_insert(format!("id {id} after {:?}", d.ids.last()));
                    }
                    d.ids.push(id);
                }
                Some(Err(e)) => {
                    d.fault.get_or_insert(format!("id: {e}"));
                }
            }
            last_kind = ev.kind;
        }
    }
    if ended && last_kind != "run.end" {
        d.fault
            .get_or_insert(format!("ended after `{last_kind}`, not run.end"));
    }
    d
}

/// The `seq`s of `run_id`'s event records (what its stream must carry).
async fn record_seqs(client: &reqwest::Client, base: &str, run_id: &str) -> Vec<u32> {
    let body = client
        .get(format!("{base}/v1/runs/{run_id}/records"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let records: Vec<AuditRecord> = serde_json::from_slice(&body).unwrap();
    records
        .iter()
        .filter(|r| !matches!(r.entry, AuditEntry::RunStarted(_)))
        .map(|r| r.seq)
        .collect()
}

async fn sse_part() {
    let n: usize = setting("SERVE", "streams", 1000);
    let live = Duration::from_millis(setting("SERVE", "live-ms", 1000));
    // The run's three model calls each sleep `live`: it cannot end sooner.
    let live_for = live * 3;
    println!(
        "bench serve/sse: streams={n} live-ms={} (each run lasts at least {} ms); server: `agentvisor --db :memory: serve --rate-limit 0` as a child process",
        live.as_millis(),
        live_for.as_millis()
    );
    let server = ServerProcess::start(Duration::ZERO, live, Store::Memory);
    let proc = server.proc;
    let base = server.base.clone();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_idle = proc.rss_bytes();
    let client = http_client(usize::MAX);
    let t0 = Instant::now();
    let runs: Vec<(String, Instant)> = parallel(n, 64, {
        let (client, base) = (client.clone(), base.clone());
        move |_| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let t = Instant::now();
                let v = submit(&client, &base, "w1-live", false).await.unwrap();
                assert_eq!(v.status, "running");
                (v.run_id, t)
            }
        }
    })
    .await;
    let submitted_in = t0.elapsed();
    let rss_runs = proc.rss_bytes();
    // The server's RSS, every 10 ms, while the streams are open.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while sampling.load(Ordering::Relaxed) {
                peak = peak.max(proc.rss_bytes());
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let t1 = Instant::now();
    let streams: Vec<_> = runs
        .iter()
        .map(|(id, t)| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(stream(client, base, id.clone(), *t, live_for))
        })
        .collect();
    let mut delivered = Vec::with_capacity(n);
    for s in streams {
        delivered.push(s.await.unwrap());
    }
    let streamed_in = t1.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let rss_peak_sampled = sampler.join().unwrap();
    let rss_hwm = proc.peak_rss_bytes();
    let rss_after = proc.rss_bytes();
    // Every event once and in order: the ids are the run's record seqs.
    let expected = parallel(n, 64, {
        let (client, base, runs) = (client.clone(), base.clone(), Arc::new(runs.clone()));
        move |i| {
            let (client, base, runs) = (client.clone(), base.clone(), runs.clone());
            async move { record_seqs(&client, &base, &runs[i].0).await }
        }
    })
    .await;
    let mut faults = 0;
    for (i, (d, want)) in delivered.iter_mut().zip(&expected).enumerate() {
        if d.fault.is_none() && d.ids != *want {
            d.fault = Some(format!("ids {:?}, records {:?}", d.ids, want));
        }
        if let Some(f) = &d.fault {
            if faults < 5 {
                println!("  stream {i} ({}): {f}", runs[i].0);
            }
            faults += 1;
        }
    }
    let events: usize = delivered.iter().map(|d| d.ids.len()).sum();
    let mut unnumbered: BTreeMap<String, u64> = BTreeMap::new();
    for d in &delivered {
        for (kind, count) in &d.unnumbered {
            *unnumbered.entry(kind.clone()).or_default() += count;
        }
    }
    let opened_live = delivered.iter().filter(|d| d.opened_live).count();
    println!(
        "  {n} runs submitted in {:.2} s; {n} streams opened, {opened_live} of them before their run could have ended; all ended {:.2} s after the first opened",
        submitted_in.as_secs_f64(),
        streamed_in.as_secs_f64()
    );
    println!(
        "  delivered: {} of {n} streams complete, every event once and in order (ids = the run's record seqs, ending with run.end): {events} events ({:.1} a stream), {unnumbered:?} without an id",
        n - faults,
        events as f64 / n as f64
    );
    println!(
        "  server RSS: idle {:.1} MiB, with {n} live runs {:.1} MiB, peak with {n} streams {:.1} MiB (sampled) / {:.1} MiB (VmHWM), after {:.1} MiB; {:.1} KiB a live run + its stream over idle",
        mib(rss_idle),
        mib(rss_runs),
        mib(rss_peak_sampled),
        mib(rss_hwm),
        mib(rss_after),
        rss_peak_sampled.max(rss_hwm).saturating_sub(rss_idle) as f64 / 1024.0 / n as f64
    );
    println!(
        "RESULT serve/sse {} of {n} streams delivered every event once and in order ({}); server peak RSS {:.1} MiB",
        n - faults,
        if faults == 0 && opened_live == n {
            "met"
        } else {
            "NOT met"
        },
        mib(rss_peak_sampled.max(rss_hwm))
    );
    assert_eq!(
        faults, 0,
        "every stream must deliver every event once, in order"
    );
}
