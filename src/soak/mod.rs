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
#![doc = include_str!("../../docs/soak.md")]

pub mod driver;
pub mod figures;
pub mod histogram;
pub mod report;
pub mod sampler;
pub mod verdict;

pub use driver::{drain_limit, status_key, Sample, Soak, SoakPlan, Soaked, Stopper};
pub use figures::{mib, round3};
pub use histogram::{nearest_rank, percentile_us, LatencyHistogram};
pub use report::{DiskSummary, Report, Settings, Summary};
pub use sampler::{disk_use, DiskPaths, DiskUse};
pub use verdict::{
    DiskOutcome, DiskVerdict, RssOutcome, RssVerdict, StatusVerdict, TerminalVerdict, Verdict,
    VerdictOutcome,
};
