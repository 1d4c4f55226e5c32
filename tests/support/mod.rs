//! Shared helpers for the integration tests: building hosts, parsing
//! manifests, collecting events, reading the audit log back, and a few test
//! batteries (a model that records what it was asked, tools that count their
//! calls or hang until dropped).
//!
//! Every test binary includes this module with `mod support;` and uses only
//! part of it, hence `dead_code` is allowed here. Scratch directories are in
//! [`scratch`], running the binary in [`cli`], a model that streams in
//! [`streaming`]; a server on a loopback socket (`loopback`) and
//! `agentvisor serve` as a process (`serving`) need the `cli` feature.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, missing_docs)]

pub(crate) mod cli;
pub(crate) mod hooks;
#[cfg(feature = "cli")]
pub(crate) mod loopback;
#[cfg(feature = "nats")]
pub(crate) mod nats;
pub(crate) mod outage;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod scratch;
#[cfg(feature = "cli")]
pub(crate) mod serving;
pub(crate) mod small_disk;
pub(crate) mod streaming;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use agentvisor::ports::audit::{AuditEntry, AuditRecord, AuditStore};
use agentvisor::ports::model::{
    ChatModel, ChatRequest, ChatResponse, Message, ModelError, Role, ToolSpec,
};
use agentvisor::ports::tool::{Tool, ToolContext, ToolError};
use agentvisor::providers::ScriptedModel;
use agentvisor::stores::MemoryAuditStore;
use agentvisor::{
    AgentSource, AgentSpec, Host, HostBuilder, HostConfig, Invocation, RunEvent, RunEvents, RunId,
    RunResult,
};
use async_trait::async_trait;
use serde_json::{json, Value};

/// A host builder as tests want it: built-in tools and the test tools
/// (`fail`, `panic`), in-memory stores, two critic shards (so the runs of
/// one test spread over more than one supervisor).
pub(crate) fn builder() -> HostBuilder {
    Host::builder()
        .config(HostConfig {
            critic_shards: 2,
            ..HostConfig::default()
        })
        .test_tools()
}

/// A default test host, with its audit store kept for reading back.
pub(crate) async fn host() -> (Host, Arc<MemoryAuditStore>) {
    host_from(builder()).await
}

/// Builds `b` with an in-memory audit store the test can read.
pub(crate) async fn host_from(b: HostBuilder) -> (Host, Arc<MemoryAuditStore>) {
    let store = Arc::new(MemoryAuditStore::new());
    let host = b
        .audit_store(store.clone())
        .build()
        .await
        .expect("host builds");
    (host, store)
}

/// Parses a manifest, failing the test with the parser's message.
pub(crate) fn spec(yaml: &str) -> AgentSpec {
    match AgentSpec::from_yaml(yaml) {
        Ok(s) => s,
        Err(e) => panic!("test manifest does not parse: {e}\n{yaml}"),
    }
}

/// Submits `agent` with `inv`, reads the run's events until the stream
/// ends and waits for its result.
pub(crate) async fn run_to_end(
    host: &Host,
    agent: impl Into<AgentSource>,
    inv: Invocation,
) -> (RunResult, Vec<RunEvent>) {
    let (handle, events) = host.submit_streaming(agent, inv).await.unwrap();
    let events = collect(events).await;
    (handle.await, events)
}

/// Reads events until the stream ends (the run ended).
pub(crate) async fn collect(mut events: RunEvents) -> Vec<RunEvent> {
    let mut out = Vec::new();
    while let Some(e) = events.next().await {
        out.push(e.event);
    }
    out
}

/// The wire name of an event (`step.start`, `tool.call`, …).
pub(crate) fn kind(e: &RunEvent) -> String {
    let v = serde_json::to_value(e).expect("events serialize");
    v["type"].as_str().expect("events carry a type").to_string()
}

/// The wire names of a list of events.
pub(crate) fn kinds(events: &[RunEvent]) -> Vec<String> {
    events.iter().map(kind).collect()
}

/// The wire names, without streamed text deltas.
pub(crate) fn kinds_without_deltas(events: &[RunEvent]) -> Vec<String> {
    kinds(events)
        .into_iter()
        .filter(|k| k != "text.delta")
        .collect()
}

/// Every audit record of a run, in `seq` order.
pub(crate) async fn records(store: &MemoryAuditStore, run: RunId) -> Vec<AuditRecord> {
    store.run_records(run).await.expect("memory store reads")
}

/// The events among a run's audit records, in order.
pub(crate) fn audited_events(records: &[AuditRecord]) -> Vec<RunEvent> {
    records
        .iter()
        .filter_map(|r| match &r.entry {
            AuditEntry::Event(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

/// `records` re-keyed to a new run (and its terminal result changed by
/// `f`): the new run's id and its records.
pub(crate) fn rekey(
    records: &[AuditRecord],
    f: impl Fn(&mut RunResult),
) -> (RunId, Vec<AuditRecord>) {
    let id = RunId::new();
    let out = records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.run_id = id;
            if let AuditEntry::Terminal(res) = &r.entry {
                let mut res = RunResult::clone(res);
                res.run_id = id;
                f(&mut res);
                r.entry = AuditEntry::Terminal(Arc::new(res));
            }
            r
        })
        .collect();
    (id, out)
}

/// The example `hello` manifest.
pub(crate) fn hello_spec() -> AgentSpec {
    AgentSpec::from_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/agents/hello.yaml"
    ))
    .unwrap()
}

/// One real run of `hello` on an in-memory store: its result and its
/// records (start, events, terminal), for tests that write them elsewhere.
pub(crate) async fn hello_run() -> (RunResult, Vec<AuditRecord>) {
    let mem = Arc::new(MemoryAuditStore::new());
    let host = Host::builder()
        .audit_store(mem.clone())
        .build()
        .await
        .unwrap();
    let result = host
        .execute(hello_spec(), Invocation::prompt("add"))
        .await
        .unwrap();
    host.shutdown().await;
    let records = mem.run_records(result.run_id).await.unwrap();
    (result, records)
}

/// How many terminal records a run has.
pub(crate) fn terminal_count(records: &[AuditRecord]) -> usize {
    records.iter().filter(|r| r.is_terminal()).count()
}

/// A model that panics as soon as it is polled, with `self.0` as the
/// panic's text (a run's handler panics in the shard).
pub(crate) struct PanickingModel(pub(crate) &'static str);

#[async_trait]
impl ChatModel for PanickingModel {
    fn name(&self) -> &str {
        "panicking"
    }

    async fn complete(&self, _request: ChatRequest) -> Result<ChatResponse, ModelError> {
        panic!("{}", self.0);
    }
}

/// Four model calls of 600 tokens each (2 400 in all): three `echo` steps,
/// then an answer, on the [`RecordingModel`] (`model: recorded`).
pub(crate) const SPENDER: &str = r#"
name: spender
model: recorded
tools: [echo]
script:
  - { tool: echo, args: { text: one }, usage: { input: 500, output: 100 } }
  - { tool: echo, args: { text: two }, usage: { input: 500, output: 100 } }
  - { tool: echo, args: { text: three }, usage: { input: 500, output: 100 } }
  - { text: "done", usage: { input: 500, output: 100 } }
"#;

/// A scripted model (the manifest's `script`) that also records the
/// transcript of every request it gets. Register it with
/// `builder().model("recorded", model)` and write `model: recorded`.
pub(crate) struct RecordingModel {
    inner: ScriptedModel,
    requests: Mutex<Vec<Vec<Message>>>,
    /// The reply cap (`max_tokens`) each request asked for.
    caps: Mutex<Vec<Option<u32>>>,
}

impl RecordingModel {
    pub(crate) fn new(spec: &AgentSpec) -> Arc<Self> {
        Arc::new(RecordingModel {
            inner: ScriptedModel::new(spec.script.clone()),
            requests: Mutex::new(Vec::new()),
            caps: Mutex::new(Vec::new()),
        })
    }

    /// The reply cap (`max_tokens`) of each call so far.
    pub(crate) fn reply_caps(&self) -> Vec<Option<u32>> {
        self.caps.lock().unwrap().clone()
    }

    /// How many model calls were made.
    pub(crate) fn calls(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// The transcript of call `i` (0-based).
    pub(crate) fn request(&self, i: usize) -> Vec<Message> {
        self.requests.lock().unwrap()[i].clone()
    }

    /// The tool messages of call `i`.
    pub(crate) fn tool_messages(&self, i: usize) -> Vec<String> {
        self.request(i)
            .into_iter()
            .filter(|m| m.role == Role::Tool)
            .map(|m| m.content)
            .collect()
    }
}

#[async_trait]
impl ChatModel for RecordingModel {
    fn name(&self) -> &str {
        "recorded"
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        self.requests
            .lock()
            .unwrap()
            .push(request.messages.as_ref().clone());
        self.caps
            .lock()
            .unwrap()
            .push(request.options.as_ref().and_then(|o| o.max_tokens));
        self.inner.complete(request).await
    }
}

/// `count` {n: integer}: counts how often it really ran.
pub(crate) struct CountingTool {
    spec: ToolSpec,
    runs: AtomicUsize,
}

impl CountingTool {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(CountingTool {
            spec: ToolSpec {
                name: "count".into(),
                description: "Counts its calls.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {"n": {"type": "integer"}},
                    "required": ["n"],
                    "additionalProperties": false,
                }),
            },
            runs: AtomicUsize::new(0),
        })
    }

    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Tool for CountingTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<String, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(format!("counted {}", args["n"]))
    }
}

/// `wait` {}: never returns; counts calls started and calls dropped (a
/// killed run must drop its in-flight call at once).
pub(crate) struct HangingTool {
    spec: ToolSpec,
    started: AtomicUsize,
    dropped: Arc<AtomicUsize>,
    stubborn: bool,
}

struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl HangingTool {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(HangingTool {
            spec: ToolSpec {
                name: "wait".into(),
                description: "Waits forever.".into(),
                parameters: json!({"type": "object"}),
            },
            started: AtomicUsize::new(0),
            dropped: Arc::new(AtomicUsize::new(0)),
            stubborn: false,
        })
    }

    /// A `wait` tool that ignores the run's cancellation signal.
    pub(crate) fn stubborn() -> Arc<Self> {
        let mut t = Arc::into_inner(Self::new()).expect("a fresh tool");
        t.stubborn = true;
        Arc::new(t)
    }

    pub(crate) fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    pub(crate) fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Tool for HangingTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _args: Value, ctx: ToolContext) -> Result<String, ToolError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let _guard = DropCounter(self.dropped.clone());
        if self.stubborn {
            // Ignores the run's cancellation signal: dropped after the grace.
            std::future::pending::<()>().await;
        }
        // Waits until the run is stopped, then cleans up at once.
        ctx.cancelled().await;
        Err(ToolError::Failed("cancelled".into()))
    }
}

/// A manifest whose run calls `add` once and answers.
pub(crate) const HELLO: &str =
    "name: hello\ntools: [add]\nscript:\n  - { tool: add, args: { a: 2, b: 3 } }\n  - { text: \"5\" }\n";
