//! An MCP server for agentvisor's own tests and bench, on rmcp's server
//! side: tools that answer, hang, crash the process, flood stderr, return
//! huge and image results, report progress, and change the tool list.
//!
//! Run with: cargo run --example mcp_test_server -- [FLAGS]
//!
//! Flags: `--ignore-sigterm` (only SIGKILL ends it), `--fail-start` (writes
//! to stderr and exits 2 before speaking MCP), `--slow-start-ms N`,
//! `--grandchild` (starts a `sleep` child in its process group; `pid`
//! reports it), `--http ADDR` (streamable HTTP on ADDR instead of stdio;
//! prints the URL), `--parent` (not a server: starts a host whose agent
//! uses this server, prints what its `pid` tool reports, then waits to be
//! killed; with `--grandchild` its server gets `--grandchild` too).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};

#[derive(Clone, Default)]
struct TestServer {
    extra: Arc<AtomicBool>,
    grandchild: Option<u32>,
}

fn schema(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

fn tools(extra: bool) -> Vec<Tool> {
    let obj = |props: Value, req: &[&str]| {
        schema(json!({"type": "object", "properties": props, "required": req}))
    };
    let mut t = vec![
        // Annotated read-only (its effect class is `read`); the others
        // say nothing (`unknown`) but `env`, which reads the outside world.
        Tool::new(
            "echo",
            "Returns its text.",
            obj(json!({"text": {"type": "string"}}), &["text"]),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
        Tool::new(
            "add",
            "Adds two numbers.",
            obj(
                json!({"a": {"type": "number"}, "b": {"type": "number"}}),
                &["a", "b"],
            ),
        ),
        Tool::new(
            "hang",
            "Never answers; appends `started` to `marker` when called, `cancelled` on cancellation.",
            obj(json!({"marker": {"type": "string"}}), &[]),
        ),
        Tool::new(
            "slow",
            "Sleeps `ms`, silently.",
            obj(json!({"ms": {"type": "integer"}}), &["ms"]),
        ),
        Tool::new(
            "progress",
            "Reports progress `steps` times, `interval_ms` apart, then answers.",
            obj(
                json!({"steps": {"type": "integer"}, "interval_ms": {"type": "integer"}}),
                &["steps", "interval_ms"],
            ),
        ),
        Tool::new(
            "crash",
            "Writes to stderr and exits.",
            obj(json!({"code": {"type": "integer"}}), &[]),
        ),
        Tool::new(
            "flood",
            "Writes `kib` KiB to stderr.",
            obj(json!({"kib": {"type": "integer"}}), &["kib"]),
        ),
        Tool::new(
            "huge",
            "Returns `bytes` bytes of text.",
            obj(json!({"bytes": {"type": "integer"}}), &["bytes"]),
        ),
        Tool::new("image", "Returns a small PNG.", obj(json!({}), &[])),
        Tool::new(
            "fail",
            "Returns an error result.",
            obj(json!({"message": {"type": "string"}}), &[]),
        ),
        Tool::new(
            "pid",
            "Returns the server's pid (and its child's).",
            obj(json!({}), &[]),
        ),
        Tool::new(
            "env",
            "Returns an environment variable or <unset>.",
            obj(json!({"name": {"type": "string"}}), &["name"]),
        )
        .annotate(ToolAnnotations::new().open_world(true)),
        Tool::new(
            "add_tool",
            "Adds the tool `extra` and says the list changed.",
            obj(json!({}), &[]),
        ),
    ];
    if extra {
        t.push(Tool::new(
            "extra",
            "Appears after add_tool.",
            obj(json!({}), &[]),
        ));
    }
    t
}

fn text(s: impl Into<String>) -> Result<CallToolResponse, ErrorData> {
    Ok(CallToolResult::success(vec![ContentBlock::text(s)]).into())
}

fn int(args: &Map<String, Value>, key: &str, default: u64) -> u64 {
    args.get(key).and_then(Value::as_u64).unwrap_or(default)
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools(
            self.extra.load(Ordering::SeqCst),
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        let str_arg = |k: &str| {
            args.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        match request.name.as_ref() {
            "echo" => text(str_arg("text")),
            "add" => {
                let n = |k: &str| args.get(k).and_then(Value::as_f64).unwrap_or(0.0);
                text(format!("{}", n("a") + n("b")))
            }
            "hang" => {
                let marker = str_arg("marker");
                let note = |line: &str| {
                    use std::io::Write;
                    if !marker.is_empty() {
                        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&marker) {
                            let _ = writeln!(f, "{line}");
                        }
                    }
                };
                note("started");
                context.ct.cancelled().await;
                note("cancelled");
                text("cancelled")
            }
            "slow" => {
                tokio::time::sleep(Duration::from_millis(int(&args, "ms", 0))).await;
                text("slept")
            }
            "progress" => {
                let steps = int(&args, "steps", 1);
                let every = Duration::from_millis(int(&args, "interval_ms", 10));
                let token = context.meta.get_progress_token();
                for i in 0..steps {
                    tokio::time::sleep(every).await;
                    if let Some(t) = &token {
                        let p = ProgressNotificationParam::new(t.clone(), (i + 1) as f64)
                            .with_total(steps as f64);
                        let _ = context.peer.notify_progress(p).await;
                    }
                }
                text(format!("done after {steps} steps"))
            }
            "crash" => {
                eprintln!("test server: crashing on purpose");
                std::process::exit(int(&args, "code", 3) as i32);
            }
            "flood" => {
                use std::io::Write;
                let line = "x".repeat(1023);
                let mut err = std::io::stderr().lock();
                for _ in 0..int(&args, "kib", 64) {
                    let _ = writeln!(err, "{line}");
                }
                let _ = writeln!(err, "the last line of the flood");
                text("flooded")
            }
            "huge" => text("h".repeat(int(&args, "bytes", 1 << 20) as usize)),
            "image" => Ok(CallToolResult::success(vec![
                ContentBlock::text("a picture:"),
                ContentBlock::image("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==", "image/png"),
            ])
            .into()),
            "fail" => Ok(CallToolResult::error(vec![ContentBlock::text(str_arg("message"))]).into()),
            "pid" => text(match self.grandchild {
                Some(c) => format!("{} {c}", std::process::id()),
                None => std::process::id().to_string(),
            }),
            "env" => text(std::env::var(str_arg("name")).unwrap_or_else(|_| "<unset>".into())),
            "add_tool" => {
                self.extra.store(true, Ordering::SeqCst);
                let _ = context.peer.notify_tool_list_changed().await;
                text("added")
            }
            "extra" => text("extra here"),
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }
}

#[tokio::main]
pub(crate) async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    let value = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if has("--parent") {
        return parent(has("--grandchild")).await;
    }
    if has("--fail-start") {
        eprintln!("test server: bad configuration, giving up");
        std::process::exit(2);
    }
    if let Some(ms) = value("--slow-start-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    // Holding a handler keeps SIGTERM from ending the process.
    let _term = if has("--ignore-sigterm") {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok()
    } else {
        None
    };
    let mut server = TestServer::default();
    let _child = if has("--grandchild") {
        let child = std::process::Command::new("sleep").arg("1000").spawn().ok();
        server.grandchild = child.as_ref().map(|c| c.id());
        child
    } else {
        None
    };
    if let Some(addr) = value("--http") {
        return http(server, &addr).await;
    }
    match server.serve(rmcp::transport::stdio()).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(e) => eprintln!("test server: {e}"),
    }
}

async fn http(server: TestServer, addr: &str) {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => return eprintln!("test server: {e}"),
    };
    if let Ok(a) = listener.local_addr() {
        println!("http://{a}/mcp");
    }
    let _ = axum::serve(listener, router).await;
}

/// A host whose agent uses this very program as its MCP server (with
/// `--grandchild` when `grandchild`): prints what the server's `pid` tool
/// reports once a run has called it, then waits to be killed.
async fn parent(grandchild: bool) {
    use agentvisor::{AgentSpec, Host, Invocation};
    let me = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let flag = if grandchild { ", \"--grandchild\"" } else { "" };
    let yaml = format!(
        "name: parent\nmcp:\n  servers:\n    - {{ name: t, command: [{me:?}{flag}] }}\n\
         script:\n  - {{ tool: t__pid, args: {{}} }}\n  - {{ text: done }}\n"
    );
    let spec = match AgentSpec::from_yaml(&yaml) {
        Ok(s) => s,
        Err(e) => return eprintln!("{e}"),
    };
    let host = match Host::builder().build().await {
        Ok(h) => h,
        Err(e) => return eprintln!("{e}"),
    };
    let result = match host.execute(spec, Invocation::default()).await {
        Ok(r) => r,
        Err(e) => return eprintln!("{e}"),
    };
    let pid = result
        .steps
        .first()
        .map(|s| s.result.clone())
        .unwrap_or_default();
    println!("{pid}");
    tokio::time::sleep(Duration::from_secs(3600)).await;
}
