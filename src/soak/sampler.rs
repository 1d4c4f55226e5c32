//! What this process uses, read from `/proc/self`: resident memory (now
//! and at its peak), CPU seconds, open file descriptors. A soak samples
//! them every second; a swarm or a bench reads them once.
//!
//! Each reader is one small file read and never fails: on a system without
//! `/proc` (or a field it cannot parse) it reads 0, so a report there shows
//! zeros rather than an error.

/// User + system CPU seconds this process has used (all its threads), from
/// `/proc/self/stat` (clock ticks of 1/100 s); 0 without `/proc`.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    cpu_seconds_of(&stat)
}

/// utime + stime of a `/proc/PID/stat` line, in seconds (another
/// process's, for a bench that watches a child).
pub fn cpu_seconds_of(stat: &str) -> f64 {
    // The command name may hold spaces and parentheses: fields start after
    // the last `)`; utime and stime are fields 14 and 15 of the line.
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// This process's resident set size, in bytes; 0 without `/proc`.
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// This process's peak resident set size (since it started, or since
/// [`reset_peak_rss`]), in bytes; 0 without `/proc`.
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

/// Resets the peak-RSS mark to the current RSS (Linux: `5` to
/// `/proc/self/clear_refs`). Returns whether the kernel allowed it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Open file descriptors of this process (0 without `/proc`).
pub fn open_fds() -> u64 {
    // The directory handle itself is one of the entries.
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1) as u64)
        .unwrap_or(0)
}

/// A `Vm…:` line of `/proc/self/status`, in KiB.
fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| kib_of(&s, key))
        .unwrap_or(0)
}

/// The value of `key` (`VmRSS:`, `VmHWM:`…) in a `/proc/PID/status`
/// text, in KiB.
pub fn kib_of(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_fields_are_read_after_the_command_name() {
        // A command name with a space and a `)` in it.
        let stat = "42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0";
        assert_eq!(cpu_seconds_of(stat), 3.0);
        assert_eq!(cpu_seconds_of(""), 0.0);
    }

    #[test]
    fn status_lines_are_read_in_kib() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(kib_of(status, "VmRSS:"), Some(1024));
        assert_eq!(kib_of(status, "VmHWM:"), Some(2048));
        assert_eq!(kib_of(status, "VmSwap:"), None);
    }
}
