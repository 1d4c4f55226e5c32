//! Run with: cargo run --release --example w1 -- --runs 200000 --concurrency 1000 --latency-ms 0
//!
//! Workload W1 — one run = 3 model calls and 2 tool executions against the
//! scripted model (`add(2,3)`, `upper("done")`, then the text `final: 5
//! DONE`), each model call first sleeping L ms — through two engines:
//!
//! - `floor`: the same loop as plain tokio tasks with a trait-object model
//!   and the same tool set (argument validation included), nothing else: no
//!   actors, no critic, no budget, no audit.
//! - `agentvisor`: the full runtime with critic, budget and audit (in
//!   memory) on.
//!
//! Each engine runs in its own child process (same binary), so the figures
//! do not share an allocator or a peak-RSS mark. Printed per engine: runs/s,
//! CPU seconds per 1000 runs, bytes per concurrent run (peak RSS minus the
//! RSS before the runs, over C: meaningful when L keeps all C runs alive at
//! once, e.g. `--runs 100000 --concurrency 100000 --latency-ms 2000`), and
//! the ratios agentvisor / floor.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentvisor::ports::model::{ChatModel, ChatRequest, Message, Role};
use agentvisor::ports::tool::ToolContext;
use agentvisor::providers::ScriptedModel;
use agentvisor::spec::ScriptEntry;
use agentvisor::tools::{ToolRegistry, ToolSet};
use agentvisor::{AgentSpec, Host, HostConfig, Invocation, RunId, RunStatus};
use serde::{Deserialize, Serialize};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone, Copy, Debug)]
struct Settings {
    runs: u64,
    concurrency: u64,
    latency_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Figures {
    engine: String,
    runs: u64,
    ok: u64,
    elapsed_s: f64,
    runs_per_sec: f64,
    cpu_s_per_1000: f64,
    bytes_per_concurrent_run: f64,
}

fn w1_spec(latency_ms: u64) -> AgentSpec {
    let text = include_str!("agents/w1.yaml");
    let mut spec = AgentSpec::from_yaml(text).unwrap_or_else(|e| panic!("w1.yaml: {e}"));
    if latency_ms > 0 {
        for e in &mut spec.script {
            e.latency = Some(Duration::from_millis(latency_ms));
        }
    }
    spec
}

/// The floor: the agent loop as a plain async fn.
async fn floor_run(model: Arc<dyn ChatModel>, tools: ToolSet, system: &str, prompt: &str) -> bool {
    let mut transcript = vec![
        Message::text(Role::System, system),
        Message::text(Role::User, prompt),
    ];
    for i in 0..12u32 {
        let req = ChatRequest {
            messages: Arc::new(transcript.clone()),
            tools: tools.specs(),
            call_index: i,
            response_schema: None,
            on_delta: None,
        };
        let Ok(resp) = model.complete(req).await else {
            return false;
        };
        if resp.tool_calls.is_empty() {
            return true;
        }
        let calls = resp.tool_calls.clone();
        transcript.push(Message {
            role: Role::Assistant,
            content: resp.text,
            tool_calls: resp.tool_calls,
            tool_call_id: None,
        });
        for call in calls {
            let out = match tools.prepare(&call) {
                Ok(p) => {
                    let ctx = ToolContext {
                        run_id: RunId(0),
                        call_id: call.id.clone(),
                    };
                    p.execute(ctx, Duration::from_secs(60), 16384)
                        .await
                        .unwrap_or_else(|e| e.to_string())
                }
                Err(e) => e.to_string(),
            };
            transcript.push(Message {
                role: Role::Tool,
                content: out,
                tool_calls: Vec::new(),
                tool_call_id: Some(call.id),
            });
        }
    }
    false
}

async fn drive<F, Fut>(s: Settings, one: F) -> (u64, f64)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..s.concurrency.min(s.runs) {
        let (next, ok, one) = (next.clone(), ok.clone(), one.clone());
        let runs = s.runs;
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < runs {
                if one().await {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    (ok.load(Ordering::Relaxed), t0.elapsed().as_secs_f64())
}

fn proc_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU seconds of this process.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

async fn run_engine(engine: &str, s: Settings) -> Figures {
    let spec = w1_spec(s.latency_ms);
    let base_rss = proc_kib("VmRSS:") * 1024;
    let cpu0 = cpu_seconds();
    let (ok, elapsed) = match engine {
        "floor" => {
            let entries: Vec<ScriptEntry> = spec.script.clone();
            let model: Arc<dyn ChatModel> = Arc::new(ScriptedModel::new(entries));
            let tools = ToolRegistry::with_builtins()
                .select(&spec.tools)
                .unwrap_or_else(|e| panic!("{e}"));
            let system: Arc<str> = Arc::from(spec.system.as_str());
            let prompt: Arc<str> = Arc::from(spec.prompt.clone().unwrap_or_default().as_str());
            drive(s, move || {
                let (model, tools, system, prompt) =
                    (model.clone(), tools.clone(), system.clone(), prompt.clone());
                async move { floor_run(model, tools, &system, &prompt).await }
            })
            .await
        }
        _ => {
            let config = HostConfig::default();
            let host = Host::builder()
                .config(config)
                .build()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let agent = host.agent(spec).unwrap_or_else(|e| panic!("{e}"));
            let h = host.clone();
            let r = drive(s, move || {
                let (host, agent) = (h.clone(), agent.clone());
                async move {
                    match host.submit(&agent, Invocation::default()).await {
                        Ok(handle) => handle.await.status == RunStatus::Ok,
                        Err(_) => false,
                    }
                }
            })
            .await;
            host.shutdown().await;
            r
        }
    };
    let cpu = cpu_seconds() - cpu0;
    let peak = proc_kib("VmHWM:") * 1024;
    Figures {
        engine: engine.to_string(),
        runs: s.runs,
        ok,
        elapsed_s: elapsed,
        runs_per_sec: s.runs as f64 / elapsed,
        cpu_s_per_1000: cpu * 1000.0 / s.runs as f64,
        bytes_per_concurrent_run: peak.saturating_sub(base_rss) as f64
            / s.concurrency.min(s.runs) as f64,
    }
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let s = Settings {
        runs: arg(&args, "--runs", 200_000),
        concurrency: arg(&args, "--concurrency", 1000),
        latency_ms: arg(&args, "--latency-ms", 0),
    };
    if let Some(i) = args.iter().position(|a| a == "--engine") {
        let engine = args.get(i + 1).cloned().unwrap_or_default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let f = rt.block_on(run_engine(&engine, s));
        println!("{}", serde_json::to_string(&f).unwrap_or_default());
        return;
    }
    println!(
        "W1: runs={} concurrency={} latency={}ms",
        s.runs, s.concurrency, s.latency_ms
    );
    let mut figs = Vec::new();
    for engine in ["floor", "agentvisor"] {
        let out = std::process::Command::new(&args[0])
            .args([
                "--engine",
                engine,
                "--runs",
                &s.runs.to_string(),
                "--concurrency",
                &s.concurrency.to_string(),
                "--latency-ms",
                &s.latency_ms.to_string(),
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot start {engine}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let f: Figures =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{engine}: {e}: {text}"));
        println!(
            "{:<11} {:>10.0} runs/s  {:>7.3} CPU s/1000 runs  {:>9.0} B/concurrent run  ({} of {} ok, {:.2} s)",
            f.engine, f.runs_per_sec, f.cpu_s_per_1000, f.bytes_per_concurrent_run, f.ok, f.runs, f.elapsed_s
        );
        figs.push(f);
    }
    let (fl, av) = (&figs[0], &figs[1]);
    println!(
        "ratio agentvisor/floor: throughput {:.2}x, CPU per run {:.2}x, memory per concurrent run {:.2}x",
        av.runs_per_sec / fl.runs_per_sec,
        av.cpu_s_per_1000 / fl.cpu_s_per_1000,
        av.bytes_per_concurrent_run / fl.bytes_per_concurrent_run.max(1.0)
    );
}
