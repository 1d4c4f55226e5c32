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
//! The folders of `src/` are the layers; imports flow down only:
//!
//! ```text
//! faces         cli/ (the binary), server/ (HTTP, SSE, dashboard), soak/
//!   │
//! orchestration session, pipeline, replay,     drive runs through the host
//!               fork, diff, eval, skill_run, schedules
//!   │
//! facade        host/ (with its session table and the palettes), handle
//!   │
//! actors        host, critic/, run/, watch, judging, budget, audit/, mcp,
//!               scheduler/
//!   │
//! kernel        spec/, agent, record/, policy, judge, pricing, output, compaction,
//!               skills/
//!   │
//! batteries     providers/, stores/, tools/, mcp/,     (each ─▶ ports)
//!               publishers/
//!   │
//! ports         the traits and the plain data they speak (imports only ports)
//!
//! observability/ (telemetry, otel) and base/ (panics, secrets) sit beside
//! the ports: any layer may use them, they use nothing above the ports.
//! ```
//!
//! The supervision tree as built:
//!
//! ```text
//! Host (library handle) ── HostActor (root supervisor, actors/host.rs)
//!   │                        ├── Audit actor  ──▶ writer task ──▶ AuditStore port
//!   │                        │     │              (group commit, spool)
//!   │                        │     └──▶ checkpoint task ──▶ Checkpointer port
//!   │                        │          (saves, clears, lease renewals)
//!   │                        ├── Budget actor ──▶ BudgetLedger port
//!   │                        ├── Publisher actor ──▶ Publisher port, OutboxStore
//!   │                        │     (the audit store's outbox; a task per delivery)
//!   │                        ├── MCP server actors (actors/mcp/): one per
//!   │                        │     `scope: host` server, and one per run and
//!   │                        │     `scope: run` server (stopped when its run
//!   │                        │     ends); spawned by the host's MCP hub
//!   │                        │     (actors/mcp/hub.rs), stopped by it at shutdown
//!   │                        └── Critic shard × N (supervisor and host of its runs;
//!   │                              │               one sleeper task for its timers)
//!   │                              └── Run × many ──▶ ChatModel, Tool ports
//!   │                                    │  (its calls and model judges are tasks)
//!   │                                    └── a palette's sub-agent call
//!   │                                        (host/palette.rs): a child Run on
//!   │                                        a shard, like any run
//!   └── session table (host/sessions.rs): the chat sessions open on the
//!       host; a session's prompt is a run like any other, its model
//!       wrapped to keep history
//!
//! Scheduler actor (actors/scheduler/, beside the host: `serve --skills`,
//!   │   `schedules::Scheduler`): one timer task for the earliest next fire
//!   ├── write-behind task ──▶ ScheduleStore port
//!   └── a task per fire ──▶ ScheduleRunner (HostRunner: a skill run,
//!         submitted to the host like any run)
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
//! The modules, by layer (each keeps its path at the crate's root:
//! `agentvisor::spec`, `agentvisor::host`, …):
//!
//! - faces: [`server`] (the `server` feature): the HTTP API over a host;
//!   `soak` (the benchmark's engine, hidden from the docs): keep runs in
//!   flight, sample the process, judge memory, statuses and records; the
//!   command line is the binary's.
//! - orchestration: [`session`]: chat sessions: prompts that share a stored
//!   history; [`pipeline`]: multi-phase pipelines: ordered phases, outputs
//!   fed forward; [`replay`]: re-run a recorded run against its recording,
//!   compare traces; [`fork`]: a new run that takes a recorded run's first
//!   steps and goes on live under other settings; [`diff`]: two recorded
//!   runs aligned step by step; [`eval`]: a cohort forked under one
//!   budget, and what changed; [`skill_run`]: one run of a scheduled
//!   skill (model, parsing, its publishes waited for); `writeback` (the `git`
//!   feature): a skill's memory committed and pushed to its git
//!   repository, serialized per repository, parked until it lands; [`schedules`]: the scheduler
//!   of a skills repository (one timer, overlap, missed fires,
//!   auto-pause, daily budgets, state in a `ScheduleStore`).
//! - facade: [`host`]: build a host, submit and recover runs, the palettes
//!   of sub-agents; [`handle`]: what a caller holds on a run.
//! - `actors` (private): host, critic, run, watch, judging, budget, audit,
//!   mcp, scheduler — one per file or folder (judging is a run's model-judge state,
//!   not an actor of its own).
//! - kernel: [`spec`]: manifests, limits, invocations; [`agent`]: a manifest
//!   resolved to run; `record` (private): a run's shared record and the
//!   host's registry of runs; [`policy`]: the default critic policy;
//!   [`judge`]: the model judges' questions, schemas and the reading of
//!   their answers (the critic's judge, the approval judge);
//!   [`pricing`]: the price table (costs in micro-dollars, context windows);
//!   [`output`]: structured output: the final answer's schema and its check;
//!   [`skills`]: skills repositories (`agentvisor.yaml`, `SKILL.md`), their
//!   schedules' cron, time zones and jitter, a skill's memory and outputs;
//!   [`compaction`]: when to summarize a run's transcript, where to cut it,
//!   what it becomes.
//! - batteries: [`providers`]: `ChatModel` batteries: scripted,
//!   OpenAI-compatible, Anthropic; the retry layer and the circuit breaker;
//!   model specs and tiers. [`stores`]: `AuditStore` / `RunIndex` /
//!   `BudgetLedger` / `Checkpointer` / `SessionStore` / `WriteIntents` / `ScheduleStore` batteries (in memory;
//!   embedded SQLite; PostgreSQL), and `RunQueue` batteries (in memory,
//!   PostgreSQL, NATS JetStream). [`tools`]: the tool registry, argument validation,
//!   built-in tools. [`mcp`]: MCP servers as tool sources.
//!   [`publishers`]: `Publisher` batteries, the destinations of scheduled
//!   skills (stdout, file, webhook, Slack, Discord, GitHub issues, email).
//! - [`ports`]: the traits actors depend on and the data they speak.
//! - observability: `telemetry` (the kernel's counters, read by the
//!   server's `/metrics`; hidden from the docs); `otel` (the
//!   `otel` feature): OpenTelemetry traces of runs, model and tool calls
//!   (GenAI semantic conventions), exported over OTLP/HTTP.
//! - base: `panics` (hidden from the docs: the binary's hook): caught
//!   panics reported as one log line, not a backtrace; [`secrets`]: the known secret values, redacted from
//!   everything a run stores, streams or prints.
//!
//! The layer rules can be checked with `grep`, from the crate's root:
//!
//! ```text
//! # ports import only ports (prints nothing)
//! grep -rnE 'crate::[a-z_]+' src/ports | grep -v '//' | grep -v 'crate::ports'
//! # below the facade, nothing names the facade, orchestration or faces;
//! # kernel, batteries, observability and base name no actor.
//! # (The first prints two lines: the test that lists every wrapper of the
//! # model port, the session's and the fork's among them.)
//! grep -rnE 'crate::(facade|orchestration|host|handle|session|pipeline|replay|fork|diff|eval|server|soak)\b' \
//!     src/actors src/kernel src/providers src/stores src/tools src/mcp \
//!     src/observability src/base | grep -vE ':[0-9]+:\s*//'
//! grep -rnE 'crate::actors\b' src/kernel src/providers src/stores src/tools \
//!     src/mcp src/observability src/base | grep -vE ':[0-9]+:\s*//'
//! ```

pub(crate) mod actors;
mod base;
mod facade;
mod kernel;
pub mod mcp;
mod observability;
mod orchestration;
pub mod ports;
pub mod providers;
pub mod publishers;
#[cfg(feature = "server")]
pub mod server;
#[doc(hidden)]
pub mod soak;
pub mod stores;
pub mod tools;

// The layers' modules keep their paths of the public API
// (`agentvisor::spec`, `agentvisor::host`, …) and of the crate
// (`crate::spec`, `crate::record`, …).
#[doc(hidden)]
pub use base::panics;
pub use base::secrets;
pub use facade::{handle, host};
pub use kernel::{agent, compaction, judge, output, policy, pricing, skills, spec};
pub(crate) use kernel::{dispatch, record};
#[cfg(feature = "otel")]
pub use observability::otel;
#[doc(hidden)]
pub use observability::telemetry;
#[cfg(feature = "git")]
pub use orchestration::writeback;
pub use orchestration::{diff, eval, fork, pipeline, replay, schedules, session, skill_run};

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
    CriticAction, CriticDecision, CriticUsage, KillReason, LoopKind, RunId, RunResult, RunStatus,
    RunUsage, StepRecord, Usage,
};
pub use ports::session::{SessionMessage, SessionMeta, SessionState, SessionStore};
pub use record::{Ending, LEASE_LOST, STORE_UNAVAILABLE, SUBSCRIBER_BUFFER};
pub use record::{HostEvent, HostFeed, FEED_CAPACITY};
pub use session::{OnBusy, Session, SessionError, SessionOptions, SessionTurn};
pub use spec::{AgentSpec, Invocation, Limits, LimitsSpec, SpecError};
