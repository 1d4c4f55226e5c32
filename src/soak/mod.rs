//! The soak engine: keep C runs of one agent in flight for a while, sample
//! the process every second, and judge what happened. `agentvisor soak` is
//! a thin face over it; a test or another host calls it directly:
//!
//! ```no_run
//! # async fn demo(host: agentvisor::Host, agent: agentvisor::Agent) {
//! use std::time::Duration;
//! use agentvisor::soak::{Report, Soak, SoakPlan};
//! let plan = SoakPlan::new(&agent, Duration::from_secs(600), 100);
//! let soaked = Soak::start(&host, &agent, plan).finish(&host, |_| {}).await;
//! # let settings: agentvisor::soak::Settings = todo!();
//! let report = Report::new(settings, soaked, None, agent.limits().max_tool_errors);
//! assert!(report.verdict.pass);
//! # }
//! ```
//!
//! - [`driver`]: the workers, the once-a-second sampler, the drain.
//! - [`sampler`]: the process's RSS, peak RSS, CPU seconds and open file
//!   descriptors, from `/proc/self` (0 where there is none).
//! - [`histogram`]: latencies in fixed memory; the one percentile rule.
//! - [`verdict`]: RSS slope (robust, with its confidence; a soak too short
//!   to judge says so), statuses against the faults injected, one terminal
//!   record per run.
//! - [`report`]: settings, series, summary and verdict, as serialized.
//! - [`figures`]: how every figure of a report is written.
//!
//! # Samples (one a second)
//! Runs completed in that second (runs/s) and their latency p50/p99 (submit
//! to result, from a log-bucketed histogram: within 1.6 %), RSS (`VmRSS`),
//! open file descriptors, runs alive ([`Host::live_runs`]), live actors,
//! CPU % (of one core) and the statuses so far. Live actors are counted,
//! not listed: a run is exactly one actor (hosted on a critic shard; its
//! model and tool calls are tasks it holds, not actors), and a host has a
//! fixed root, audit, budget and one critic per shard; so live actors =
//! runs alive + 3 + shards.
//!
//! # Chaos
//! A soak's faults come from wrapping the agent's model in a
//! [`ChaosModel`](crate::providers::chaos::ChaosModel) before the host is
//! built; its [`counts`](crate::providers::chaos::ChaosModel::counts) go to
//! [`Report::new`], which judges every status against them.
//!
//! # Memory
//! The in-memory audit store keeps a bounded window of the latest records
//! (32 768) and counts every record ever written; at soak rates (about 13
//! records a run) the window is full within seconds, inside the warm-up, so
//! it sets the RSS plateau, not its slope. RSS also steps up when the load
//! steps up (more runs alive at once) and the allocator keeps those pages
//! for reuse: the slope is judged on soaks of a minute or more after
//! warm-up, robustly, and an interval that reaches both sides of the limit
//! is called inconclusive rather than a failure.
//!
//! [`Host::live_runs`]: crate::Host::live_runs

pub mod driver;
pub mod figures;
pub mod histogram;
pub mod report;
pub mod sampler;
pub mod verdict;

pub use driver::{drain_limit, status_key, Sample, Soak, SoakPlan, Soaked, Stopper};
pub use figures::{mib, round3};
pub use histogram::{nearest_rank, percentile_us, LatencyHistogram};
pub use report::{Report, Settings, Summary};
pub use verdict::{RssOutcome, RssVerdict, StatusVerdict, TerminalVerdict, Verdict};
