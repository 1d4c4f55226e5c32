//! What another process uses, read from `/proc/PID`: resident memory (now
//! and at its peak), CPU seconds and open file descriptors — the figures
//! `agentvisor::soak::sampler` reads for this process, for a server the
//! bench started as a child. Each reader reads 0 on a system without
//! `/proc`.

use std::path::PathBuf;

/// A process by its id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Proc(pub(crate) u32);

impl Proc {
    fn path(&self, file: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/{file}", self.0))
    }

    /// Its resident set size, in bytes.
    pub(crate) fn rss_bytes(&self) -> u64 {
        self.status_kib("VmRSS:") * 1024
    }

    /// Its peak resident set size since it started, in bytes.
    pub(crate) fn peak_rss_bytes(&self) -> u64 {
        self.status_kib("VmHWM:") * 1024
    }

    /// User + system CPU seconds it has used (clock ticks of 1/100 s).
    pub(crate) fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(self.path("stat")).unwrap_or_default();
        agentvisor::soak::sampler::cpu_seconds_of(&stat)
    }

    /// Its open file descriptors (sockets included).
    pub(crate) fn open_fds(&self) -> u64 {
        std::fs::read_dir(self.path("fd"))
            .map(|d| d.count() as u64)
            .unwrap_or(0)
    }

    fn status_kib(&self, key: &str) -> u64 {
        std::fs::read_to_string(self.path("status"))
            .ok()
            .and_then(|s| agentvisor::soak::sampler::kib_of(&s, key))
            .unwrap_or(0)
    }
}

/// Bytes as MiB.
pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
