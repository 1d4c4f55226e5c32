//! What every bench shares: settings read from `--name value` arguments or
//! environment variables, the runtime, latency summaries, and the W1
//! workload ([`workload`]). Each bench states its own settings in its
//! header.

#![allow(dead_code)]

pub(crate) mod process;
pub(crate) mod workload;

use std::str::FromStr;
use std::time::Duration;

/// A setting: `--name value` on the command line (`cargo bench --bench B --
/// --name value`), else the environment variable `PREFIX_NAME` (upper case,
/// `-` as `_`), else `default`. An unparsable value is an error, not a
/// silent default.
pub(crate) fn setting<T: FromStr>(prefix: &str, name: &str, default: T) -> T
where
    T::Err: std::fmt::Display,
{
    let flag = format!("--{name}");
    let args: Vec<String> = std::env::args().collect();
    let from_arg = args
        .iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1).cloned());
    let var = format!("{prefix}_{}", name.replace('-', "_")).to_uppercase();
    match from_arg.or_else(|| std::env::var(&var).ok()) {
        Some(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{flag} / {var}: cannot parse `{v}`: {e}")),
        None => default,
    }
}

/// A comma-separated list setting (`10000,100000`).
pub(crate) fn list_setting(prefix: &str, name: &str, default: &str) -> Vec<u64> {
    let text: String = setting(prefix, name, default.to_string());
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|e| panic!("--{name}: cannot parse `{s}`: {e}"))
        })
        .collect()
}

/// The multi-threaded runtime every bench runs on (one worker per CPU, as
/// `#[tokio::main]` would start).
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Latencies, summarized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Summary {
    /// How many.
    pub(crate) count: usize,
    /// Their mean.
    pub(crate) mean: Duration,
    /// The median.
    pub(crate) p50: Duration,
    /// The 99th percentile.
    pub(crate) p99: Duration,
    /// The largest.
    pub(crate) max: Duration,
}

impl Summary {
    /// Summarizes `samples` (sorts them).
    pub(crate) fn of(samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        let count = samples.len();
        // The crate's one percentile rule (the nearest rank).
        let at = |q: f64| match agentvisor::soak::nearest_rank(count, q) {
            0 => Duration::ZERO,
            rank => samples[rank - 1],
        };
        let total: Duration = samples.iter().sum();
        Summary {
            count,
            mean: total / count.max(1) as u32,
            p50: at(0.50),
            p99: at(0.99),
            max: samples.last().copied().unwrap_or_default(),
        }
    }

    /// `mean … p50 … p99 … max …` in microseconds.
    pub(crate) fn micros(&self) -> String {
        format!(
            "mean {:>9.1} µs  p50 {:>9.1} µs  p99 {:>9.1} µs  max {:>9.1} µs  (n={})",
            us(self.mean),
            us(self.p50),
            us(self.p99),
            us(self.max),
            self.count
        )
    }
}

/// A duration in microseconds.
pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `a / b`, or NaN when `b` is zero.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}
