//! The W1 workload, the bare-tokio floor it is measured against, and the
//! driver that measures both: shared by the benches in `benches/` (as
//! `support::workload`), `examples/w1.rs` and `tests/workload_w1.rs` (by
//! `#[path]`). It is no part of the library: it reads the library's public
//! API like any caller.
//!
//! # W1
//! One run = 3 model calls and 2 tool executions against the scripted model:
//! call 1 returns `add(a=2, b=3)`, call 2 returns `upper(text="done")`, call 3
//! returns the text `final: 5 DONE`; each model call first sleeps L (none
//! when L = 0). The manifest is `examples/agents/w1.yaml` (compiled in), so
//! `agentvisor swarm examples/agents/w1.yaml` runs exactly this workload.
//!
//! # The floor
//! [`Floor`] is the same agent loop as a plain async fn, one plain tokio
//! task per run, with a trait-object model (the same [`ScriptedModel`]) and
//! the same tool set (argument validation included), and nothing else: no
//! actors, no critic, no budget, no audit. It is what a run costs when nobody watches
//! it; every agentvisor figure is read as a ratio to it.
//!
//! # Figures
//! [`run_engine`] runs N runs with C in flight (C worker tasks, each taking
//! the next run until N have started) and returns [`Figures`]: runs/s, CPU
//! seconds per 1000 runs (user + system time of this process), and peak RSS
//! (reset before the runs where the kernel allows it), read through
//! [`agentvisor::soak::sampler`]. The process figures are
//! process-wide: measure one engine at a time, and in a child process of its
//! own when the memory figure matters (as `examples/w1.rs` does). On a
//! system without `/proc` they read as 0.
//!
//! This module only measures; it must not change how a host runs (it builds
//! one with a [`HostBuilder`] like any caller).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use agentvisor::ports::model::{ChatModel, ChatRequest, Message, Role};
use agentvisor::ports::tool::ToolContext;
use agentvisor::providers::ScriptedModel;
use agentvisor::soak::sampler::{cpu_seconds, peak_rss_bytes, reset_peak_rss, rss_bytes};
use agentvisor::tools::{RegistryError, ToolRegistry, ToolSet};
use agentvisor::{
    AgentSpec, HostBuilder, HostError, Invocation, RunId, RunStatus, SpecError, SubmitError,
};

/// The W1 manifest (`examples/agents/w1.yaml`), with no latency.
pub(crate) const W1_MANIFEST: &str = include_str!("../../examples/agents/w1.yaml");

/// Model calls the floor makes at most, like a run's default `max_iterations`.
const FLOOR_MAX_ITERATIONS: u32 = 12;

/// Why a workload could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum WorkloadError {
    /// The manifest does not parse.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The manifest names a tool the registry does not have.
    #[error(transparent)]
    Tool(#[from] RegistryError),
    /// The host could not be built.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The host refused the agent.
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

/// The W1 manifest with every model call first sleeping `latency`.
pub(crate) fn w1_spec(latency: Duration) -> Result<AgentSpec, WorkloadError> {
    let mut spec = AgentSpec::from_yaml(W1_MANIFEST)?;
    if !latency.is_zero() {
        for entry in &mut spec.script {
            entry.latency = Some(latency);
        }
    }
    Ok(spec)
}

/// What runs the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Engine {
    /// The agent loop on plain tokio tasks ([`Floor`]).
    Floor,
    /// The full runtime: runs hosted on critic shards, budget and audit (in memory).
    Agentvisor,
}

impl Engine {
    /// Its name on the command line and in reports.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Engine::Floor => "floor",
            Engine::Agentvisor => "agentvisor",
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Engine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "floor" => Ok(Engine::Floor),
            "agentvisor" => Ok(Engine::Agentvisor),
            other => Err(format!(
                "unknown engine `{other}` (known: floor, agentvisor)"
            )),
        }
    }
}

/// How much of the workload to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Runs in all (N).
    pub(crate) runs: u64,
    /// Runs in flight at once (C).
    pub(crate) concurrency: u64,
    /// How long each model call first sleeps (L).
    pub(crate) latency: Duration,
}

impl Settings {
    /// Worker tasks the driver starts: C, or N when fewer.
    pub(crate) fn workers(&self) -> u64 {
        self.concurrency.min(self.runs).max(1)
    }
}

/// What one engine measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Figures {
    /// Which engine.
    pub(crate) engine: Engine,
    /// Runs started.
    pub(crate) runs: u64,
    /// Runs that ended `ok`.
    pub(crate) ok: u64,
    /// Wall time from the first run's start to the last run's result.
    pub(crate) elapsed_s: f64,
    /// Runs per second of wall time.
    pub(crate) runs_per_sec: f64,
    /// CPU seconds (user + system, the whole process) per 1000 runs, from
    /// just before the engine started to just after it stopped.
    pub(crate) cpu_s_per_1000: f64,
    /// RSS before the engine started, in bytes.
    pub(crate) base_rss_bytes: u64,
    /// Peak RSS while it ran, in bytes (since the process started if the
    /// kernel refused to reset the mark).
    pub(crate) peak_rss_bytes: u64,
    /// Peak RSS minus base RSS, over the runs in flight: the memory of one
    /// concurrent run when L keeps all of them alive at once.
    pub(crate) bytes_per_concurrent_run: f64,
}

/// Figures of agentvisor over the floor's, measured in the same run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Ratios {
    /// agentvisor runs/s over the floor's (higher is better; 1.0 is the floor).
    pub(crate) throughput: f64,
    /// agentvisor CPU per run over the floor's (lower is better).
    pub(crate) cpu_per_run: f64,
    /// agentvisor bytes per concurrent run over the floor's (lower is better).
    pub(crate) memory_per_run: f64,
}

impl Ratios {
    /// `agentvisor` over `floor`.
    pub(crate) fn of(agentvisor: &Figures, floor: &Figures) -> Self {
        let over = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        Ratios {
            throughput: over(agentvisor.runs_per_sec, floor.runs_per_sec),
            cpu_per_run: over(agentvisor.cpu_s_per_1000, floor.cpu_s_per_1000),
            memory_per_run: over(
                agentvisor.bytes_per_concurrent_run,
                floor.bytes_per_concurrent_run,
            ),
        }
    }
}

/// The floor: a W1-style agent loop with nothing around it. Cheap to clone;
/// every clone shares the model and the tools.
#[derive(Clone)]
pub(crate) struct Floor {
    model: Arc<dyn ChatModel>,
    tools: ToolSet,
    system: Arc<str>,
    prompt: Arc<str>,
    limits: agentvisor::Limits,
}

impl Floor {
    /// The floor of `spec`: its script as a [`ScriptedModel`] behind the
    /// [`ChatModel`] trait, its tools from the built-in registry.
    pub(crate) fn new(spec: &AgentSpec) -> Result<Self, WorkloadError> {
        let tools = ToolRegistry::with_builtins().select(&spec.tools)?;
        Ok(Floor {
            model: Arc::new(ScriptedModel::new(spec.script.clone())),
            tools,
            system: Arc::from(spec.system.as_str()),
            prompt: Arc::from(spec.prompt.as_deref().unwrap_or_default()),
            limits: spec.limits.resolve(&Default::default()),
        })
    }

    /// One run: model call, tool calls, model call … until the model answers
    /// with text (`true`), fails, or 12 calls were made (`false`).
    pub(crate) async fn run_once(&self) -> bool {
        let mut transcript = Vec::with_capacity(8);
        if !self.system.is_empty() {
            transcript.push(Message::text(Role::System, &*self.system));
        }
        transcript.push(Message::text(Role::User, &*self.prompt));
        let mut transcript = Arc::new(transcript);
        for call_index in 0..FLOOR_MAX_ITERATIONS {
            let request = ChatRequest {
                messages: transcript.clone(),
                tools: self.tools.specs(),
                call_index,
                response_schema: None,
                on_delta: None,
                deadline: None,
                on_retry: None,
                options: None,
                observer: None,
            };
            let Ok(response) = self.model.complete(request).await else {
                return false;
            };
            if response.tool_calls.is_empty() {
                return true;
            }
            let calls = response.tool_calls.clone();
            Arc::make_mut(&mut transcript).push(Message {
                role: Role::Assistant,
                content: response.text,
                tool_calls: response.tool_calls,
                tool_call_id: None,
                attachments: Vec::new(),
            });
            for call in calls {
                let content = match self.tools.prepare(&call) {
                    Ok(prepared) => {
                        let ctx = ToolContext::new(RunId(0), call.id.clone());
                        let cap = self.limits.max_tool_result_bytes as usize;
                        prepared
                            .execute(ctx, self.limits.tool_timeout, cap)
                            .await
                            .unwrap_or_else(|e| format!("error: {e}"))
                    }
                    Err(e) => format!("error: {e}"),
                };
                Arc::make_mut(&mut transcript).push(Message {
                    role: Role::Tool,
                    content,
                    tool_calls: Vec::new(),
                    tool_call_id: Some(call.id),
                    attachments: Vec::new(),
                });
            }
        }
        false
    }
}

/// Runs `runs` runs with `concurrency` in flight: that many worker tasks,
/// each starting the next run (`one()`) as soon as its last one ended, until
/// `runs` have started. Returns how many returned `true`, and the wall time.
pub(crate) async fn drive<F, Fut>(runs: u64, concurrency: u64, one: F) -> (u64, Duration)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let workers: Vec<_> = (0..concurrency.min(runs).max(1))
        .map(|_| {
            let (next, ok, one) = (next.clone(), ok.clone(), one.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < runs {
                    if one().await {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        // A worker only ends by finishing its loop (or by a panic in `one`,
        // which the count then shows as runs that were not ok).
        let _ = worker.await;
    }
    (ok.load(Ordering::Relaxed), t0.elapsed())
}

/// Runs W1 with `settings` through `engine` in this process and measures it.
/// The agentvisor engine runs on the host `host` builds (`Host::builder()`:
/// critic, budget and audit on, stores in memory), shut down (audit drained)
/// before the figures are read; the floor ignores it.
pub(crate) async fn run_engine(
    engine: Engine,
    settings: Settings,
    host: HostBuilder,
) -> Result<Figures, WorkloadError> {
    let spec = w1_spec(settings.latency)?;
    reset_peak_rss();
    let base_rss = rss_bytes();
    let cpu0 = cpu_seconds();
    let (ok, elapsed) = match engine {
        Engine::Floor => {
            let floor = Floor::new(&spec)?;
            // A tokio task per run, as a run is an actor (a task) of its
            // own: what the floor leaves out is everything around the loop,
            // not the task that carries it.
            drive(settings.runs, settings.concurrency, move || {
                let floor = floor.clone();
                async move {
                    tokio::spawn(async move { floor.run_once().await })
                        .await
                        .unwrap_or(false)
                }
            })
            .await
        }
        Engine::Agentvisor => {
            let host = host.build().await?;
            let agent = host.agent(spec)?;
            let h = host.clone();
            let measured = drive(settings.runs, settings.concurrency, move || {
                let (host, agent) = (h.clone(), agent.clone());
                async move {
                    match host.submit(&agent, Invocation::default()).await {
                        Ok(handle) => handle.shared().await.status == RunStatus::Ok,
                        Err(_) => false,
                    }
                }
            })
            .await;
            host.shutdown().await;
            measured
        }
    };
    let cpu = cpu_seconds() - cpu0;
    let peak_rss = peak_rss_bytes().max(base_rss);
    let runs = settings.runs.max(1) as f64;
    Ok(Figures {
        engine,
        runs: settings.runs,
        ok,
        elapsed_s: elapsed.as_secs_f64(),
        runs_per_sec: settings.runs as f64 / elapsed.as_secs_f64().max(1e-9),
        cpu_s_per_1000: cpu * 1000.0 / runs,
        base_rss_bytes: base_rss,
        peak_rss_bytes: peak_rss,
        bytes_per_concurrent_run: (peak_rss - base_rss) as f64 / settings.workers() as f64,
    })
}
