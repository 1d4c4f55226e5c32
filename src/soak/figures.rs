//! How every figure of a soak or swarm report is written: three decimals,
//! memory in MiB.

/// Rounds to three decimals: every figure in a soak or swarm report.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Bytes in MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
