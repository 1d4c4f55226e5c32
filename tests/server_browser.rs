//! The dashboard in a real browser: headless Chromium driven through
//! chromedriver (Debian's `chromium` and `chromium-driver`, which
//! `.ci/run` installs) against a server on a loopback socket. The page
//! loads and goes live; a submitted run appears with its whole id and
//! ends; live runs are listed first; the kill button asks first (keeping
//! the run when told to) and then kills a slow run; a page opened later
//! shows every ended run's tokens, cost and last critic decision; a
//! parent's page shows its sub-agent in its tree and its events; a run
//! waiting for approval lists the call on its page and the approve button
//! lets it finish; and the browser console holds no error. The page's
//! screenshot is saved to `docs/dashboard.png`.
//!
//! Runs with `cargo test --features peers` (it needs the programs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentvisor::server::auth::{Caller, Role, TokenTable};
use agentvisor::server::catalog::Catalog;
use agentvisor::server::{Server, ServerConfig};
use serde_json::{json, Value};
use support::loopback::{QUICK, SLOW};

const GATED: &str = r#"
name: gated
model: scripted
prompt: add
tools: [add]
approval: [add]
limits: { max_runtime: 120s, stall_timeout: 120s }
script:
  - { tool: add, args: { a: 2, b: 3 } }
  - { text: "approved" }
"#;

const TOKEN: &str = "av_browser_test_token";

/// Finds a program on `PATH` (or at one of `also`).
fn program(names: &[&str], also: &[&str]) -> Option<String> {
    let path = std::env::var("PATH").unwrap_or_default();
    for n in names {
        for dir in path.split(':') {
            let p = std::path::Path::new(dir).join(n);
            if p.is_file() {
                return Some(p.display().to_string());
            }
        }
    }
    also.iter()
        .find(|p| std::path::Path::new(p).is_file())
        .map(|p| p.to_string())
}

struct Driver {
    child: Child,
    base: String,
    session: String,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    /// Fails the test if the browser's console logged an error (`SEVERE`).
    async fn assert_no_console_errors(&self) {
        let logs = self
            .call(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({"type": "browser"})),
            )
            .await;
        let severe: Vec<&Value> = logs["value"]
            .as_array()
            .map(|a| a.iter().filter(|e| e["level"] == "SEVERE").collect())
            .unwrap_or_default();
        assert!(severe.is_empty(), "browser console errors: {severe:?}");
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        wd(&self.http, method, &url, body).await
    }

    async fn script(&self, js: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": js, "args": []})),
        )
        .await["value"]
            .clone()
    }

    /// Polls `js` (which returns a value) until `ok` holds, up to 30 s.
    async fn wait_for(&self, what: &str, js: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.script(js).await;
            if ok(&v) {
                return v;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "timed out waiting for {what}: last {v}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn wd(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Value {
    let mut r = http.request(method, url);
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let text = r.send().await.unwrap().text().await.unwrap();
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_driver(chromium: &str, chromedriver: &str, profile: &std::path::Path) -> Driver {
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let http = support::loopback::http_client();
    let base = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    loop {
        let ready = http.get(format!("{base}/status")).send().await.ok();
        if let Some(r) = ready {
            let v: Value =
                serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or(Value::Null);
            if v["value"]["ready"] == true {
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "chromedriver did not come up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let caps = json!({"capabilities": {"alwaysMatch": {
        "browserName": "chrome",
        "goog:loggingPrefs": {"browser": "ALL"},
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--window-size=1400,900",
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    }}});
    let v = wd(
        &http,
        reqwest::Method::POST,
        &format!("{base}/session"),
        Some(caps),
    )
    .await;
    let session = v["value"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no webdriver session: {v}"))
        .to_string();
    Driver {
        child,
        base,
        session,
        http,
    }
}

fn b64decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter_map(val) {
        acc = (acc << 6) | c;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_runs_live_and_kills_one() {
    let chromium = program(
        &["chromium", "chromium-browser"],
        &["/usr/lib/chromium/chromium"],
    )
    .expect("chromium is installed (.ci/run installs Debian's chromium)");
    let chromedriver = program(&["chromedriver"], &["/usr/lib/chromium/chromedriver"])
        .expect("chromedriver is installed (.ci/run installs Debian's chromium-driver)");

    let (host, store) = support::host().await;
    let server = Server::new(host.clone(), store, ServerConfig::default());
    let mut agents: Vec<_> = [QUICK, SLOW, GATED]
        .map(|y| host.agent(support::spec(y)).unwrap())
        .into();
    // A parent that delegates once, for the run page's tree.
    let dir = support::scratch::Scratch::new("browser-tree");
    let child = dir.file("helper.yaml", QUICK);
    let lead = dir.file(
        "lead.yaml",
        &format!(
            "name: lead\nmodel: scripted\nprompt: go\nagents:\n  helper: {}\nscript:\n  - {{ tool: agent__helper, args: {{ prompt: add }} }}\n  - {{ text: \"the helper said five\", usage: {{ input: 20, output: 4 }} }}\n",
            child.display()
        ),
    );
    agents.push(
        host.agent(agentvisor::AgentSpec::from_file(&lead).unwrap())
            .unwrap(),
    );
    server.set_catalog(Catalog::from_agents(agents));
    server.set_tokens(Some(TokenTable::from_tokens([(
        TOKEN,
        Caller {
            id: "ops".into(),
            role: Role::Admin,
        },
    )])));
    // The example skills repository's schedules, for the schedules panel.
    let skills =
        agentvisor::skills::SkillsRepo::open(std::path::Path::new("examples/skills")).unwrap();
    let scheduler = agentvisor::schedules::Scheduler::start(
        skills,
        agentvisor::schedules::SchedulerConfig {
            store: Arc::new(agentvisor::stores::MemoryScheduleStore::new()),
            runner: Arc::new(agentvisor::schedules::HostRunner::new(host.clone())),
            ledger: None,
            clock: agentvisor::schedules::SchedulerClock::System,
        },
    )
    .await
    .unwrap();
    server.set_scheduler(Some(scheduler));
    let (base, _stop) = support::loopback::serve(&server).await;

    let profile = std::env::temp_dir().join(format!("agentvisor-chromium-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let d = start_driver(&chromium, &chromedriver, &profile).await;
    d.call(
        reqwest::Method::POST,
        "/url",
        Some(json!({"url": format!("{base}/?token={TOKEN}")})),
    )
    .await;
    d.wait_for(
        "the live feed",
        "return document.getElementById('conn').textContent",
        |v| v == "live",
    )
    .await;

    // A submitted run appears and ends ok.
    let api = support::loopback::http_client();
    let submit = |agent: &'static str| {
        let api = api.clone();
        let base = base.clone();
        async move {
            let r = api
                .post(format!("{base}/v1/runs"))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(json!({"agent": agent}).to_string())
                .send()
                .await
                .unwrap();
            let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            v["run_id"].as_str().unwrap().to_string()
        }
    };
    let quick = submit("quick").await;
    let row_status = |id: &str| {
        format!(
            "const r = document.querySelector('tr[data-id=\"{id}\"] td.status'); return r ? r.textContent : null"
        )
    };
    d.wait_for("the quick run to end ok", &row_status(&quick), |v| {
        v == "ok"
    })
    .await;
    // Its id is shown whole (sibling runs share a long time prefix).
    let cell = |id: &str, class: &str| {
        format!(
            "const r = document.querySelector('tr[data-id=\"{id}\"] td.{class}'); return r ? r.textContent : null"
        )
    };
    assert_eq!(d.script(&cell(&quick, "id")).await, quick.as_str());

    // A slow run appears running, listed before the ended one; its kill
    // button asks first, keeps it running when told to, then kills it.
    let slow = submit("slow").await;
    d.wait_for("the slow run to show running", &row_status(&slow), |v| {
        v == "running"
    })
    .await;
    assert_eq!(
        d.script("return document.querySelector('#runs tbody tr').dataset.id")
            .await,
        slow.as_str(),
        "the live run is listed first"
    );
    // A live run shows its cost so far (the scripted model is free).
    d.wait_for("the slow run's cost", &cell(&slow, "cost"), |v| {
        v == "0.0000"
    })
    .await;
    let click_kill = format!(
        "const b = document.querySelector('tr[data-id=\"{slow}\"] button.kill'); if (!b) return false; b.click(); return true"
    );
    let asking = "return document.getElementById('confirm').open";
    assert_eq!(
        d.script(&click_kill).await,
        true,
        "the slow run has a kill button"
    );
    d.wait_for("the kill to ask first", asking, |v| v == true)
        .await;
    d.script("document.getElementById('confirm-no').click(); return true")
        .await;
    d.wait_for("the question to close", asking, |v| v == false)
        .await;
    let status_of = |id: String| {
        let api = api.clone();
        let base = base.clone();
        async move {
            let view = api
                .get(format!("{base}/v1/runs/{id}"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            serde_json::from_str::<Value>(&view).unwrap()
        }
    };
    assert_eq!(
        status_of(slow.clone()).await["status"],
        "running",
        "a kill the operator took back does not kill"
    );
    assert_eq!(d.script(&click_kill).await, true);
    d.wait_for("the kill to ask again", asking, |v| v == true)
        .await;
    d.script("document.getElementById('confirm-yes').click(); return true")
        .await;
    d.wait_for("the slow run to show killed", &row_status(&slow), |v| {
        v.as_str().is_some_and(|s| s.starts_with("killed"))
    })
    .await;
    let view = status_of(slow.clone()).await;
    assert_eq!(view["status"], "killed");
    assert_eq!(view["kill_reason"], "operator");

    // A page opened now shows every ended run's tokens, cost and last
    // critic decision (read from each run's result, not from the feed).
    d.call(
        reqwest::Method::POST,
        "/url",
        Some(json!({"url": format!("{base}/?token={TOKEN}&again=1")})),
    )
    .await;
    let usage = status_of(quick.clone()).await["result"]["usage"].clone();
    let tokens = usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap();
    assert!(tokens > 0, "{usage}");
    d.wait_for("the quick run's tokens", &cell(&quick, "tokens"), |v| {
        v == tokens.to_string().as_str()
    })
    .await;
    d.wait_for("the quick run's decision", &cell(&quick, "decision"), |v| {
        v == "–"
    })
    .await;
    assert_eq!(d.script(&cell(&quick, "cost")).await, "0.0000");
    d.wait_for("the killed run's decision", &cell(&slow, "decision"), |v| {
        v.as_str().is_some_and(|s| s.starts_with("kill (operator"))
    })
    .await;

    // A parent's page: its sub-agent in its tree, its events to run.end.
    let parent_id = submit("lead").await;
    d.wait_for("the parent to end ok", &row_status(&parent_id), |v| {
        v == "ok"
    })
    .await;
    d.script(&format!("location.hash = '#run/{parent_id}'; return true"))
        .await;
    d.wait_for(
        "the parent's tree",
        &format!(
            "const c = document.querySelectorAll('#r-tree li[data-id=\"{parent_id}\"] > ul > li'); return c.length === 1 ? c[0].textContent : ''"
        ),
        |v| v.as_str().is_some_and(|s| s.contains(" ok")),
    )
    .await;
    d.wait_for(
        "the parent's events",
        "const l = document.querySelectorAll('#r-timeline li'); return l.length ? l[l.length - 1].textContent : ''",
        |v| v.as_str().is_some_and(|s| s.contains("run.end")),
    )
    .await;

    // The run page: its timeline ends with run.end.
    d.script(&format!("location.hash = '#run/{quick}'; return true"))
        .await;
    d.wait_for(
        "the quick run's timeline",
        "const l = document.querySelectorAll('#r-timeline li'); return l.length ? l[l.length - 1].textContent : ''",
        |v| v.as_str().is_some_and(|s| s.contains("run.end")),
    )
    .await;
    // A fork's page links its source and shows their diff: the quick run
    // forked at step 1 with its own script does what it did.
    let fork = api
        .post(format!("{base}/v1/runs/{quick}/fork?wait=10"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(json!({"at_step": 1}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status().as_u16(), 201);
    let fork: Value = serde_json::from_str(&fork.text().await.unwrap()).unwrap();
    assert_eq!(fork["status"], "ok", "{fork}");
    let fork_id = fork["run_id"].as_str().unwrap().to_string();
    d.script(&format!("location.hash = '#run/{fork_id}'; return true"))
        .await;
    d.wait_for(
        "the fork's diff",
        "return document.getElementById('r-diff-summary').textContent",
        |v| v.as_str().is_some_and(|s| s.starts_with("no divergence")),
    )
    .await;
    assert_eq!(
        d.script("return document.querySelector('#r-fork-source a').getAttribute('href')")
            .await,
        format!("#run/{quick}").as_str()
    );
    assert_eq!(
        d.script("return document.querySelectorAll('#r-diff tr[data-step]').length")
            .await,
        2,
        "both of the source's steps are compared"
    );

    // A run waiting for approval: its page lists the call; Approve runs it.
    let gated = submit("gated").await;
    d.script(&format!("location.hash = '#run/{gated}'; return true"))
        .await;
    d.wait_for(
        "the call waiting for approval",
        "const b = document.getElementById('b-approve'); return b.disabled ? '' : document.getElementById('r-approvals').textContent",
        |v| v.as_str().is_some_and(|s| s.contains("add")),
    )
    .await;
    d.script("document.getElementById('b-approve').click(); return true")
        .await;
    d.wait_for(
        "the approved run to end ok",
        "return document.getElementById('r-status').textContent",
        |v| v == "ok",
    )
    .await;
    assert_eq!(
        d.script("return document.getElementById('r-approval').hidden")
            .await,
        true,
        "nothing waits any more"
    );
    d.script("location.hash = ''; return true").await;
    d.wait_for("the runs table again", &row_status(&quick), |v| v == "ok")
        .await;
    // A fuller picture for the screenshot: more runs, one still running,
    // and the charts past their first ticks.
    for _ in 0..5 {
        submit("quick").await;
    }
    let running = submit("slow").await;
    d.wait_for("the running run", &row_status(&running), |v| v == "running")
        .await;
    d.wait_for(
        "the latency chart",
        "return document.getElementById('v-lat').textContent",
        |v| v.as_str().is_some_and(|s| s.contains('/')),
    )
    .await;
    d.wait_for(
        "the active runs chart",
        "return document.getElementById('v-active').textContent",
        |v| v == "1",
    )
    .await;

    let shot = d.call(reqwest::Method::GET, "/screenshot", None).await;
    let png = b64decode(shot["value"].as_str().expect("a screenshot"));
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    std::fs::write(docs.join("dashboard.png"), &png).unwrap();

    // The schedules panel lists the repository's schedules; Pause pauses
    // one (the panel says so) and Resume clears it.
    let names = d
        .wait_for(
            "the schedules panel",
            "return [...document.querySelectorAll('#s-table tbody tr')].map(r => r.cells[0].textContent)",
            |v| v.as_array().is_some_and(|a| a.len() == 3),
        )
        .await;
    assert_eq!(
        names,
        json!(["triage", "weekday-digest", "weekly-digest"]),
        "{names}"
    );
    d.script(
        "document.querySelector('button[data-act=pause][data-name=triage]').click(); return 1",
    )
    .await;
    d.wait_for(
        "triage paused in the panel",
        "return [...document.querySelectorAll('#s-table tbody tr')].filter(r => r.cells[0].textContent === 'triage').map(r => r.cells[6].textContent)",
        |v| v[0].as_str().is_some_and(|t| t.starts_with("paused")),
    )
    .await;
    d.script(
        "document.querySelector('button[data-act=resume][data-name=triage]').click(); return 1",
    )
    .await;
    d.wait_for(
        "triage resumed in the panel",
        "return [...document.querySelectorAll('#s-table tbody tr')].filter(r => r.cells[0].textContent === 'triage').map(r => r.cells[6].textContent)",
        |v| v[0] == "",
    )
    .await;

    // No errors in the browser console.
    d.assert_no_console_errors().await;

    api.post(format!("{base}/v1/runs/{running}/cancel"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    d.call(reqwest::Method::DELETE, "", None).await;
    drop(d);
    let _ = std::fs::remove_dir_all(&profile);
    server.close_streams();
}

/// `agentvisor ARGS` (the binary this build made); its output.
fn agentvisor_bin(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentvisor"))
        .args(args)
        .env("AGENTVISOR_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("agentvisor runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eval_report_page_shows_its_forks_and_histogram() {
    let chromium = program(
        &["chromium", "chromium-browser"],
        &["/usr/lib/chromium/chromium"],
    )
    .expect("chromium is installed (.ci/run installs Debian's chromium)");
    let chromedriver = program(&["chromedriver"], &["/usr/lib/chromium/chromedriver"])
        .expect("chromedriver is installed (.ci/run installs Debian's chromium-driver)");

    // Record a cohort of 3 hello runs, then eval it twice each onto
    // another script from step 1, with a report.
    let dir = support::scratch::Scratch::new("browser-eval");
    let db = dir.arg("eval.db");
    let out = agentvisor_bin(&[
        "swarm",
        "examples/agents/hello.yaml",
        "--runs",
        "3",
        "--db",
        &db,
    ]);
    assert!(out.status.success(), "{out:?}");
    let report = dir.arg("report");
    let out = agentvisor_bin(&[
        "eval",
        "--agent",
        "hello",
        "--manifest",
        "examples/agents/hello_forked.yaml",
        "--at-step",
        "1",
        "--repeats",
        "2",
        "--budget-tokens",
        "1000000",
        "--db",
        &db,
        "--report",
        &report,
    ]);
    assert!(out.status.success(), "{out:?}");
    let page = dir.path("report").join("index.html");
    assert!(page.exists(), "no {}", page.display());

    let profile =
        std::env::temp_dir().join(format!("agentvisor-chromium-eval-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let d = start_driver(&chromium, &chromedriver, &profile).await;
    d.call(
        reqwest::Method::POST,
        "/url",
        Some(json!({"url": format!("file://{}", page.display())})),
    )
    .await;
    // The table: a header row and one row per fork (3 runs × 2).
    d.wait_for(
        "the forks table",
        "const t = document.getElementById('forks'); return t ? t.rows.length : 0",
        |v| v == 7,
    )
    .await;
    // The histogram: every fork diverged at step 2 (the forked script
    // answers differently from its first live call): one bar, as tall as
    // the chart allows, titled with its count.
    let bars = d
        .script(
            "return [...document.querySelectorAll('#histogram rect')].map(r => [r.getAttribute('height'), r.textContent])",
        )
        .await;
    assert_eq!(bars, json!([["160", "6"]]), "{bars}");
    // The page is self-contained: it drew without errors.
    d.assert_no_console_errors().await;
}
