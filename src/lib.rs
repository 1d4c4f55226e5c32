//! agentvisor runs LLM agent runs as supervised actors.
//!
//! A host (a swarm host, a chat bot, a soak benchmark) submits runs; each run
//! is an actor that drives the agent loop (model call → tool calls → model
//! call … → answer); a critic actor watches every run through step and tool
//! heartbeats and can steer it, extend its deadline, or kill it with a
//! distinct reason; budget and audit actors meter and record asynchronously,
//! so no run waits on bookkeeping.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use agentvisor::{AgentSpec, Host, Invocation};
//! let host = Host::builder().build().await?;
//! let spec = AgentSpec::from_file("examples/agents/hello.yaml")?;
//! let result = host.submit(spec, Invocation::prompt("add 2 and 3")).await?.await;
//! println!("{} {:?}", result.status, result.output);
//! host.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! ```text
//! Host (library handle) ── HostActor (root supervisor)
//!                            ├── Audit actor  ──▶ AuditStore port (batched)
//!                            ├── Budget actor ──▶ BudgetLedger port
//!                            └── Critic shard × N (supervisor and host of its runs)
//!                                  └── Run × many ──▶ ChatModel, Tool ports
//! ```
//!
//! A run is an actor hosted on its critic shard: its own state and message
//! vocabulary, one message at a time, supervised (a panic ends that run
//! alone), but no ractor actor, task or mailbox of its own: its messages
//! go through the shard's mailbox and the shard runs its handler, with the
//! critic's record of the run in the run's state. That makes a run cost its
//! state (a few KB less than an actor of its own) and its heartbeats field
//! updates; see `actors::run` and `actors::critic` (private).
//!
//! - [`ports`]: the traits actors depend on and the data they speak.
//! - `actors` (private): host, critic, run, budget, audit — one per file.
//! - [`providers`]: `ChatModel` batteries: scripted, OpenAI-compatible,
//!   Anthropic; the retry layer and the circuit breaker; model specs and tiers.
//! - [`pricing`]: the price table (costs in micro-dollars, context windows).
//! - [`output`]: structured output: the final answer's schema and its check.
//! - [`compaction`]: context compaction: when to summarize a run's
//!   transcript, where to cut it, what it becomes.
//! - [`stores`]: `AuditStore` / `RunIndex` / `BudgetLedger` / `Checkpointer`
//!   batteries (in memory; embedded SQLite).
//! - [`panics`]: caught panics reported as one log line, not a backtrace.
//! - [`replay`]: re-run a recorded run against its recording, compare traces.
//! - [`soak`]: the soak engine: keep runs in flight, sample the process,
//!   judge memory, statuses and records.
//! - [`tools`]: the tool registry, argument validation, built-in tools.
//! - [`spec`]: manifests, limits, invocations.
//! - [`secrets`]: the known secret values, redacted from everything a run
//!   stores, streams or prints.
//! - [`session`]: chat sessions: prompts that share a stored history.
//! - [`pipeline`]: multi-phase pipelines: ordered phases, outputs fed forward.
//! - `otel` (the `otel` feature): OpenTelemetry traces of runs, model and
//!   tool calls (GenAI semantic conventions), exported over OTLP/HTTP.

pub(crate) mod actors;
pub mod agent;
pub mod compaction;
pub mod handle;
pub mod host;
pub mod mcp;
#[cfg(feature = "otel")]
pub mod otel;
pub mod output;
pub mod panics;
pub mod pipeline;
pub mod policy;
pub mod ports;
pub mod pricing;
pub mod providers;
mod record;
pub mod replay;
pub mod secrets;
#[cfg(feature = "server")]
pub mod server;
pub mod session;
pub mod soak;
pub mod spec;
pub mod stores;
pub mod telemetry;
pub mod tools;

#[doc(hidden)]
pub use actors::critic::Fault;
pub use agent::Agent;
pub use handle::{ApprovalError, LiveState, PendingApproval, RunEvents, RunHandle, RunRef};
pub use host::{
    decide_on_record, AgentSource, Host, HostBuilder, HostConfig, HostError, ParkedRuns,
    RecordDecisionError, RecoverError, Recovery, SubmitError, MAX_RESUMES,
};
pub use pipeline::{PhaseOutcome, PipelineError, PipelineResult, PipelineRun};
pub use ports::critic::{CriticPolicy, Decision, Trigger};
pub use ports::event::{Event, RunEvent};
pub use ports::run::{
    CriticAction, CriticDecision, KillReason, LoopKind, RunId, RunResult, RunStatus, StepRecord,
    Usage,
};
pub use ports::session::{SessionMessage, SessionMeta, SessionState, SessionStore};
pub use record::{Ending, LEASE_LOST, STORE_UNAVAILABLE, SUBSCRIBER_BUFFER};
pub use record::{HostEvent, HostFeed, FEED_CAPACITY};
pub use session::{OnBusy, Session, SessionError, SessionOptions, SessionTurn};
pub use spec::{AgentSpec, Invocation, Limits, LimitsSpec, SpecError};
