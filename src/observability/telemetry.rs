//! What the kernel counts, through the [`metrics`](https://docs.rs/metrics)
//! facade (the `metrics` feature): runs by status and kill reason, critic
//! decisions, model call latency, tokens, cost, retries, circuit breaker
//! states, the audit queue and spool.
//!
//! Nothing is counted until a recorder is installed and [`enable`] is
//! called (the server and `--metrics-addr` do both): until then every hook
//! here is one relaxed atomic load, so a library user who exports no
//! metrics pays nothing on the hot path, and labels (which allocate) are
//! only built when someone reads them. Without the `metrics` feature the
//! hooks compile to nothing.
//!
//! Metric names (Prometheus text, as `/metrics` shows them):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `agentvisor_runs_total` | counter | `status`, `kill_reason` |
//! | `agentvisor_active_runs` | gauge | (set at scrape time by the exporter) |
//! | `agentvisor_runs_awaiting_approval` | gauge | (set at scrape time by the exporter) |
//! | `agentvisor_critic_decisions_total` | counter | `action`, `reason` |
//! | `agentvisor_model_call_duration_seconds` | histogram | `provider`, `model` |
//! | `agentvisor_tokens_total` | counter | `kind` (`input`, `output`) |
//! | `agentvisor_cost_micros_total` | counter | |
//! | `agentvisor_model_retries_total` | counter | `model`, `kind` |
//! | `agentvisor_breaker_state` | gauge | `model` (0 closed, 1 half-open, 2 open) |
//! | `agentvisor_audit_queue_depth` | gauge | |
//! | `agentvisor_audit_held_records` | gauge | |
//! | `agentvisor_audit_spool_bytes` | gauge | |
// Without the `metrics` feature each hook is its early return alone.
#![cfg_attr(
    not(feature = "metrics"),
    allow(clippy::needless_return, unused_variables)
)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::ports::run::{CriticDecision, RunResult};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Starts counting (call it after installing a `metrics` recorder). Without
/// the `metrics` feature it does nothing.
pub fn enable() {
    ENABLED.store(cfg!(feature = "metrics"), Ordering::Relaxed);
}

/// Whether metrics are counted.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The name of the model-call latency histogram (exporters give it buckets).
pub const MODEL_CALL_SECONDS: &str = "agentvisor_model_call_duration_seconds";

/// The handles of the metrics every run touches, registered once: a
/// `counter!` with labels builds its key (allocating the labels) and looks
/// it up in the recorder's registry at each call, which a host doing tens
/// of thousands of runs a second pays several times a run. Taken only once
/// [`enabled`] (the recorder is installed by then, and stays: a process
/// has one global recorder).
#[cfg(feature = "metrics")]
struct Handles {
    /// `agentvisor_runs_total` by (status, kill reason).
    runs: dashmap::DashMap<(&'static str, &'static str), metrics::Counter>,
    input_tokens: metrics::Counter,
    output_tokens: metrics::Counter,
    cost: metrics::Counter,
    /// The model-call histogram by model spec (`provider:name`).
    model_calls: dashmap::DashMap<String, metrics::Histogram>,
    audit_queue: metrics::Gauge,
}

#[cfg(feature = "metrics")]
fn handles() -> &'static Handles {
    static HANDLES: std::sync::OnceLock<Handles> = std::sync::OnceLock::new();
    HANDLES.get_or_init(|| Handles {
        runs: dashmap::DashMap::new(),
        input_tokens: metrics::counter!("agentvisor_tokens_total", "kind" => "input"),
        output_tokens: metrics::counter!("agentvisor_tokens_total", "kind" => "output"),
        cost: metrics::counter!("agentvisor_cost_micros_total"),
        model_calls: dashmap::DashMap::new(),
        audit_queue: metrics::gauge!("agentvisor_audit_queue_depth"),
    })
}

/// A run ended with `result`: its status, kill reason, tokens and cost.
#[inline]
pub(crate) fn run_ended(result: &RunResult) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        let h = handles();
        let key = (
            result.status.as_str(),
            result.kill_reason.map(|k| k.as_str()).unwrap_or(""),
        );
        match h.runs.get(&key) {
            Some(c) => c.increment(1),
            None => h
                .runs
                .entry(key)
                .or_insert_with(|| {
                    metrics::counter!("agentvisor_runs_total", "status" => key.0, "kill_reason" => key.1)
                })
                .increment(1),
        }
        h.input_tokens.increment(result.usage.input_tokens);
        h.output_tokens.increment(result.usage.output_tokens);
        h.cost.increment(result.cost_micros);
    }
}

/// The critic (or an operator) decided `d` about a run.
#[inline]
pub(crate) fn decided(d: &CriticDecision) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "agentvisor_critic_decisions_total",
        "action" => match d.action {
            crate::CriticAction::Steer => "steer",
            crate::CriticAction::Extend => "extend",
            crate::CriticAction::RaiseIterations => "raise_iterations",
            crate::CriticAction::Kill => "kill",
            crate::CriticAction::Deny => "deny",
            crate::CriticAction::Ask => "ask",
        },
        "reason" => d.reason.clone()
    )
    .increment(1);
}

/// A model call of `model` (its spec, `provider:name`) took `took`.
#[inline]
pub(crate) fn model_call(model: &str, took: Duration) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        let h = handles();
        match h.model_calls.get(model) {
            Some(hist) => hist.record(took.as_secs_f64()),
            None => {
                let provider = model.split_once(':').map_or(model, |(p, _)| p).to_string();
                h.model_calls
                    .entry(model.to_string())
                    .or_insert_with(|| {
                        metrics::histogram!(MODEL_CALL_SECONDS, "provider" => provider, "model" => model.to_string())
                    })
                    .record(took.as_secs_f64());
            }
        }
    }
}

/// A model call failed with `kind` and is retried.
#[inline]
pub(crate) fn retried(model: &str, kind: &str) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    metrics::counter!("agentvisor_model_retries_total", "model" => model.to_string(), "kind" => kind.to_string())
        .increment(1);
}

/// A circuit breaker's state: 0 closed, 1 half-open, 2 open.
#[inline]
pub(crate) fn breaker(model: &str, state: u8) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    metrics::gauge!("agentvisor_breaker_state", "model" => model.to_string()).set(f64::from(state));
}

/// Records waiting in the audit actor's buffer.
#[inline]
pub(crate) fn audit_queue(records: usize) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    handles().audit_queue.set(records as f64);
}

/// Records the audit writer holds in memory (the store fails, no spool),
/// and the spool's size in bytes.
pub(crate) fn audit_held(records: usize, spool: Option<&std::path::Path>) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("agentvisor_audit_held_records").set(records as f64);
        if let Some(path) = spool {
            let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
            metrics::gauge!("agentvisor_audit_spool_bytes").set(bytes as f64);
        }
    }
}
