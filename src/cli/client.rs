//! The command line as a client of `agentvisor serve`: with `--server URL`
//! (or `AGENTVISOR_URL`) and the token in `AGENTVISOR_TOKEN`, `runs list`,
//! `runs show` and `replay` read the server, and `runs kill|steer|extend|
//! cancel|approve|deny ID` send commands to a run in flight there.
//!
//! Exit codes: 0 on success; 1 when the run is not found (or not yours),
//! has ended (a command), or its replay differs; 2 when the server cannot
//! be reached, refuses the token, or the input is bad.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use agentvisor::ports::audit::AuditRecord;
use agentvisor::server::api::{RunList, RunView};
use agentvisor::RunId;

use super::replay::ReplayArgs;
use super::runs::{ControlCommand, RunsArgs, RunsCommand};
use super::tree::{Node, Tree};

/// A client of one server.
struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

/// A failed request: the exit code and what to print.
struct Failure(ExitCode, String);

impl Api {
    fn new(url: &str) -> Self {
        Api {
            http: client(),
            base: url.trim_end_matches('/').to_string(),
            token: std::env::var("AGENTVISOR_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        let resp = req.send().await.map_err(|e| {
            Failure(
                ExitCode::from(2),
                format!("cannot reach {}: {}", self.base, without_url(&e)),
            )
        })?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(json);
        }
        let message = json["error"]["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{status}"));
        let code = match status.as_u16() {
            404 | 409 => 1,
            _ => 2,
        };
        Err(Failure(ExitCode::from(code), message))
    }
}

/// reqwest's errors name the URL; ours already does.
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), "");
    }
    s
}

/// An HTTP client (rustls on ring, handed over ready-made: no process-wide
/// crypto provider needed).
fn client() -> reqwest::Client {
    let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let builder = match rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
    {
        Ok(b) => {
            builder.tls_backend_preconfigured(b.with_root_certificates(roots).with_no_client_auth())
        }
        Err(_) => builder,
    };
    builder.build().unwrap_or_else(|_| reqwest::Client::new())
}

fn fail(f: Failure) -> ExitCode {
    errln!("error: {}", f.1);
    f.0
}

fn check_id(id: &str) -> Result<(), ExitCode> {
    match id.parse::<RunId>() {
        Ok(_) if id.len() == 32 => Ok(()),
        _ => Err(super::refuse(format!(
            "`{id}` is not a run id (32 hex digits, as `agentvisor runs list` prints them)"
        ))),
    }
}

pub(crate) async fn runs(a: RunsArgs, url: &str) -> ExitCode {
    let api = Api::new(url);
    match a.command {
        RunsCommand::List(l) => {
            if let Some(root) = &l.root {
                if let Err(code) = check_id(root) {
                    return code;
                }
            }
            // A page at a time (the server's pages hold at most 500),
            // each from the cursor the previous one ended at, until
            // `--limit` runs are listed or the server has no more.
            let want = l.limit as usize;
            let mut runs = Vec::new();
            let mut cursor: Option<String> = None;
            while runs.len() < want {
                let mut path = format!("/v1/runs?limit={}", (want - runs.len()).clamp(1, 500));
                if let Some(s) = l.status {
                    path.push_str(&format!("&status={s}"));
                }
                if let Some(root) = &l.root {
                    path.push_str(&format!("&root={root}"));
                }
                if let Some(c) = &cursor {
                    path.push_str(&format!("&cursor={c}"));
                }
                let page: RunList = match api.call(reqwest::Method::GET, &path, None).await {
                    Ok(v) => match serde_json::from_value(v) {
                        Ok(l) => l,
                        Err(e) => return super::refuse(format!("unexpected answer: {e}")),
                    },
                    Err(f) => return fail(f),
                };
                runs.extend(page.runs.into_iter().filter(|r| {
                    l.caller
                        .as_deref()
                        .is_none_or(|c| r.caller_id.as_deref() == Some(c))
                }));
                match page.next_cursor {
                    // Cursors are hex: safe in a query as they are.
                    Some(c) if c.bytes().all(|b| b.is_ascii_alphanumeric()) => cursor = Some(c),
                    _ => break,
                }
            }
            runs.truncate(want);
            if l.json {
                outln!("{}", serde_json::to_string(&runs).unwrap_or_default());
                return ExitCode::SUCCESS;
            }
            if runs.is_empty() {
                outln!("no runs on {url}");
                return ExitCode::SUCCESS;
            }
            outln!(
                "{:<32}  {:<20}  {:<16}  {:<12}  {:<20}  {:>8}",
                "RUN_ID",
                "STATUS",
                "AGENT",
                "CALLER",
                "FINISHED (UTC)",
                "MS"
            );
            for r in &runs {
                let status = match &r.kill_reason {
                    Some(k) => format!("{} ({k})", r.status),
                    None => r.status.clone(),
                };
                outln!(
                    "{:<32}  {:<20}  {:<16}  {:<12}  {:<20}  {:>8}",
                    r.run_id,
                    status,
                    r.agent,
                    r.caller_id.as_deref().unwrap_or("-"),
                    r.finished_at
                        .map(super::runs::utc)
                        .unwrap_or_else(|| "-".into()),
                    r.duration_ms
                );
            }
            ExitCode::SUCCESS
        }
        RunsCommand::Show(s) if s.tree => {
            if let Err(code) = check_id(&s.run_id) {
                return code;
            }
            match tree(&api, &s.run_id).await {
                Ok(t) if t.is_empty() => {
                    errln!("error: no run {} on {url}", s.run_id);
                    ExitCode::from(1)
                }
                Ok(t) => {
                    super::runs::print_tree(&t, s.json);
                    ExitCode::SUCCESS
                }
                Err(f) => fail(f),
            }
        }
        RunsCommand::Show(s) => {
            if let Err(code) = check_id(&s.run_id) {
                return code;
            }
            let view: RunView = match api
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/runs/{}", s.run_id),
                    None,
                )
                .await
            {
                Ok(v) => match serde_json::from_value(v) {
                    Ok(v) => v,
                    Err(e) => return super::refuse(format!("unexpected answer: {e}")),
                },
                Err(f) => return fail(f),
            };
            let records = match api
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/runs/{}/records", s.run_id),
                    None,
                )
                .await
            {
                Ok(v) => serde_json::from_value::<Vec<AuditRecord>>(v).unwrap_or_default(),
                Err(f) => return fail(f),
            };
            if s.json {
                let shown =
                    serde_json::json!({"result": view.result, "records": records, "run": view});
                outln!("{shown}");
                return ExitCode::SUCCESS;
            }
            match view.result.as_deref() {
                Some(r) => super::run::print_human(r),
                None => {
                    let live = view.live.as_ref();
                    outln!(
                        "run {}: running (agent {}, iteration {}, {} tokens)",
                        view.run_id,
                        view.agent,
                        live.map_or(0, |l| l.iteration),
                        live.map_or(0, |l| l.tokens)
                    );
                }
            }
            outln!("records:");
            for r in &records {
                outln!("  {:>4}  {}", r.seq, super::runs::describe(&r.entry));
            }
            ExitCode::SUCCESS
        }
        RunsCommand::Control(c) => control(&api, c).await,
        RunsCommand::Prune(_) => {
            super::refuse("runs prune works on the database file: give --db PATH, not --server")
        }
    }
}

/// The tree under run `id` on the server (`GET /v1/runs?root=`, a page at
/// a time), each run's tokens from its live state or its result.
async fn tree(api: &Api, id: &str) -> Result<Tree, Failure> {
    let unexpected =
        |e: serde_json::Error| Failure(ExitCode::from(2), format!("unexpected answer: {e}"));
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/runs?root={id}&limit=500");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page: RunList =
            serde_json::from_value(api.call(reqwest::Method::GET, &path, None).await?)
                .map_err(unexpected)?;
        items.extend(page.runs);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let now = agentvisor::ports::run::unix_ms();
    let mut nodes = Vec::with_capacity(items.len());
    for r in items {
        let (tokens, cost_micros) = match &r.live {
            Some(live) => (live.tokens, 0),
            None => {
                let view: RunView = serde_json::from_value(
                    api.call(
                        reqwest::Method::GET,
                        &format!("/v1/runs/{}", r.run_id),
                        None,
                    )
                    .await?,
                )
                .map_err(unexpected)?;
                match view.result {
                    Some(res) => (res.usage.total(), res.cost_micros),
                    None => (0, 0),
                }
            }
        };
        let parse = |s: &str| s.parse::<RunId>().ok();
        let Some(run_id) = parse(&r.run_id) else {
            continue;
        };
        nodes.push(Node {
            run_id,
            parent_run_id: r.parent_run_id.as_deref().and_then(parse),
            agent: r.agent,
            status: r.status,
            kill_reason: r.kill_reason,
            error_kind: r.error_kind,
            tokens,
            cost_micros,
            started_at: r.finished_at.unwrap_or(now).saturating_sub(r.duration_ms),
            duration_ms: r.duration_ms,
        });
    }
    let id = id
        .parse::<RunId>()
        .map_err(|_| Failure(ExitCode::from(2), format!("`{id}` is not a run id")))?;
    Ok(Tree::new(id, nodes))
}

async fn control(api: &Api, c: ControlCommand) -> ExitCode {
    let (id, action, body) = match c {
        ControlCommand::Kill { run_id } => (run_id, "kill", None),
        ControlCommand::Cancel { run_id } => (run_id, "cancel", None),
        ControlCommand::Approve { run_id, call } => (
            run_id,
            "approve",
            Some(serde_json::json!({ "call_id": call })),
        ),
        ControlCommand::Deny {
            run_id,
            call,
            reason,
        } => (
            run_id,
            "deny",
            Some(serde_json::json!({ "call_id": call, "note": reason })),
        ),
        ControlCommand::Steer { run_id, text } => {
            (run_id, "steer", Some(serde_json::json!({ "text": text })))
        }
        ControlCommand::Extend { run_id, by } => {
            (run_id, "extend", Some(serde_json::json!({ "seconds": by })))
        }
    };
    if let Err(code) = check_id(&id) {
        return code;
    }
    match api
        .call(
            reqwest::Method::POST,
            &format!("/v1/runs/{id}/{action}"),
            body,
        )
        .await
    {
        Ok(v) => {
            outln!("{action}: sent to run {id}");
            // An approval decision names the calls it covers.
            for c in v["calls"].as_array().into_iter().flatten() {
                outln!(
                    "  {} {}({})",
                    c["call_id"].as_str().unwrap_or("?"),
                    c["tool"].as_str().unwrap_or("?"),
                    c["arguments"].as_str().unwrap_or("")
                );
            }
            ExitCode::SUCCESS
        }
        Err(f) => fail(f),
    }
}

pub(crate) async fn replay(a: ReplayArgs, url: &str) -> ExitCode {
    let api = Api::new(url);
    if let Err(code) = check_id(&a.run_id) {
        return code;
    }
    let run_id: RunId = match a.run_id.parse() {
        Ok(id) => id,
        Err(_) => return ExitCode::from(2),
    };
    let records = match api
        .call(
            reqwest::Method::GET,
            &format!("/v1/runs/{}/records", a.run_id),
            None,
        )
        .await
    {
        Ok(v) => match serde_json::from_value::<Vec<AuditRecord>>(v) {
            Ok(r) => r,
            Err(e) => return super::refuse(format!("unexpected answer: {e}")),
        },
        Err(f) => return fail(f),
    };
    if records.is_empty() {
        errln!("error: no run {run_id} on {url}");
        return ExitCode::from(1);
    }
    super::replay::report_replay(run_id, &records, a.json).await
}
