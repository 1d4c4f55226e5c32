//! Latencies in fixed memory, and the one percentile rule every report of
//! this crate uses (soak, swarm, benches): the nearest rank, the smallest
//! value with at least `q` of all values at or below it.
//!
//! [`LatencyHistogram`] counts microseconds in log-linear buckets (32 per
//! power of two), reports a bucket at its middle (within 1.6 % of any value
//! in it), records without a lock and costs the same memory however long a
//! soak runs.

use std::sync::atomic::{AtomicU64, Ordering};

/// Sub-buckets per power of two: 2^5 = 32, so a bucket is at most 1/32 of
/// its value wide (reported at its middle: within 1.6 %).
const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
/// The largest power of two tracked (2^40 µs is 12 days).
const MAX_EXP: u32 = 40;
/// Buckets in a histogram.
pub const BUCKETS: usize = SUB + (MAX_EXP - SUB_BITS + 1) as usize * SUB;

/// The nearest rank of quantile `q` (0..=1) among `n` values: 1-based, so
/// the `q` quantile of sorted `v` is `v[nearest_rank(v.len(), q) - 1]`.
/// 0 when `n` is 0.
pub fn nearest_rank(n: usize, q: f64) -> usize {
    if n == 0 {
        return 0;
    }
    ((q * n as f64).ceil() as usize).clamp(1, n)
}

/// Latencies in µs, counted in log-linear buckets: fixed memory however
/// long the soak, lock-free to record.
pub struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    max: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("max_us", &self.max_us())
            .finish_non_exhaustive()
    }
}

impl LatencyHistogram {
    /// Counts one latency, in µs.
    pub fn record(&self, us: u64) {
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(us, Ordering::Relaxed);
    }

    /// The counts since the last take, and resets them.
    pub fn take(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.swap(0, Ordering::Relaxed))
            .collect()
    }

    /// The counts so far, left in place.
    pub fn counts(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    /// The largest latency recorded (never reset), in µs.
    pub fn max_us(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }
}

fn bucket_of(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros();
    if exp > MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (us >> (exp - SUB_BITS)) as usize & (SUB - 1);
    SUB + (exp - SUB_BITS) as usize * SUB + sub
}

/// The middle of a bucket, in µs.
fn bucket_value(i: usize) -> f64 {
    if i < SUB {
        return i as f64;
    }
    let shift = ((i - SUB) / SUB) as u32;
    let sub = ((i - SUB) % SUB) as u64;
    let low = (SUB as u64 + sub) << shift;
    low as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
}

/// The `q` quantile (0..=1) of histogram counts (from [`LatencyHistogram`]),
/// in µs (0 when empty).
pub fn percentile_us(counts: &[u64], q: f64) -> f64 {
    let n: u64 = counts.iter().sum();
    let rank = nearest_rank(n as usize, q) as u64;
    if rank == 0 {
        return 0.0;
    }
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_value(i);
        }
    }
    0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_within_two_percent() {
        for v in [
            0u64,
            1,
            31,
            32,
            33,
            63,
            64,
            100,
            1_000,
            12_345,
            999_999,
            1 << 39,
        ] {
            let mid = bucket_value(bucket_of(v));
            let err = (mid - v as f64).abs() / (v as f64).max(1.0);
            assert!(err <= 1.0 / 64.0 + 1e-9, "{v}: {mid}");
        }
        // Monotone: a larger value never lands in an earlier bucket.
        let mut last = 0;
        for v in (0..5_000_000u64).step_by(997) {
            let b = bucket_of(v);
            assert!(b >= last && b < BUCKETS);
            last = b;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_come_from_the_counts_and_take_resets() {
        let h = LatencyHistogram::default();
        assert_eq!(percentile_us(&h.take(), 0.5), 0.0);
        for us in 1..=1000u64 {
            h.record(us * 1000); // 1 ms … 1 s
        }
        assert_eq!(h.counts().iter().sum::<u64>(), 1000);
        let counts = h.take();
        let p50 = percentile_us(&counts, 0.50);
        let p99 = percentile_us(&counts, 0.99);
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.02, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.02, "{p99}");
        assert_eq!(h.max_us(), 1_000_000);
        assert_eq!(h.take().iter().sum::<u64>(), 0);
    }

    #[test]
    fn nearest_rank_is_the_smallest_value_with_q_at_or_below() {
        assert_eq!(nearest_rank(0, 0.5), 0);
        assert_eq!(nearest_rank(1, 0.0), 1);
        assert_eq!(nearest_rank(10, 0.5), 5);
        assert_eq!(nearest_rank(10, 0.99), 10);
        assert_eq!(nearest_rank(100, 0.99), 99);
        assert_eq!(nearest_rank(100, 1.0), 100);
        // Small values are exact, so the histogram agrees with sorting.
        let h = LatencyHistogram::default();
        for us in [5, 1, 9, 3, 7] {
            h.record(us);
        }
        assert_eq!(percentile_us(&h.counts(), 0.5), 5.0);
        assert_eq!(percentile_us(&h.counts(), 1.0), 9.0);
    }
}
