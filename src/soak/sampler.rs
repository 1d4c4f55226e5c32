//! What this process uses, read from `/proc/self`: resident memory (now
//! and at its peak), CPU seconds, open file descriptors; and what its
//! records take on disk ([`disk_use`]: the database file, its WAL and the
//! audit spool). A soak samples them every second; a swarm or a bench
//! reads them once.
//!
//! Each reader is one small file read (or a few `stat`s) and never fails:
//! on a system without `/proc` (or a field it cannot parse), or for a file
//! that is not there, it reads 0, so a report there shows zeros rather
//! than an error.

use std::path::{Path, PathBuf};

use serde::Serialize;

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

/// Where a host's records are on disk: the SQLite database file (its
/// `-wal` and `-shm` files beside it) and the audit spool. Either may be
/// `None` (`--db :memory:` has neither).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskPaths {
    /// The database file.
    pub db: Option<PathBuf>,
    /// The audit spool: a file of JSON lines (its `PATH.N` siblings, which
    /// other processes on the same database write, are counted with it),
    /// or a directory (every file in it).
    pub spool: Option<PathBuf>,
}

/// Bytes on disk, by file, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiskUse {
    /// The database file.
    pub db_bytes: u64,
    /// Its write-ahead log and the log's index (`-wal` and `-shm`).
    pub wal_bytes: u64,
    /// The audit spool (with its siblings).
    pub spool_bytes: u64,
}

impl DiskUse {
    /// Database, WAL and spool together.
    pub fn total(&self) -> u64 {
        self.db_bytes + self.wal_bytes + self.spool_bytes
    }
}

/// What the files of `paths` hold now (their lengths: a database shrunk by
/// vacuum or a WAL truncated by a checkpoint reads smaller at once). A
/// missing file reads 0.
pub fn disk_use(paths: &DiskPaths) -> DiskUse {
    let Some(db) = &paths.db else {
        return DiskUse {
            spool_bytes: paths.spool.as_deref().map(spool_bytes).unwrap_or(0),
            ..DiskUse::default()
        };
    };
    DiskUse {
        db_bytes: file_len(db),
        wal_bytes: file_len(&suffixed(db, "-wal")) + file_len(&suffixed(db, "-shm")),
        spool_bytes: paths.spool.as_deref().map(spool_bytes).unwrap_or(0),
    }
}

/// `PATH` with `suffix` appended to its file name (`x.db` → `x.db-wal`).
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// A file's length; 0 when it is not there (or not a file).
fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .unwrap_or(0)
}

/// A spool file with its `PATH.N` siblings, or every file in a spool
/// directory.
fn spool_bytes(spool: &Path) -> u64 {
    if spool.is_dir() {
        return std::fs::read_dir(spool)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
    }
    let Some(name) = spool.file_name().and_then(|n| n.to_str()) else {
        return file_len(spool);
    };
    let dir = match spool.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return file_len(spool);
    };
    // The spool itself and `NAME.N`, N a number (another process's).
    let is_sibling = |other: &str| {
        other.strip_prefix(name).is_some_and(|rest| {
            rest.is_empty()
                || rest
                    .strip_prefix('.')
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(is_sibling))
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary one, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir()
                .join(format!("agentvisor-sampler-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn append(path: &Path, bytes: usize) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("{e}"));
        f.write_all(&vec![b'x'; bytes])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn disk_use_follows_a_database_its_wal_and_its_spool_as_they_grow() {
        let dir = TempDir::new("grow");
        let db = dir.0.join("a.db");
        let spool = dir.0.join("a.db.spool");
        let paths = DiskPaths {
            db: Some(db.clone()),
            spool: Some(spool.clone()),
        };
        // Nothing there yet: zeros, not an error.
        assert_eq!(disk_use(&paths), DiskUse::default());

        append(&db, 4096);
        append(&suffixed(&db, "-wal"), 1000);
        append(&suffixed(&db, "-shm"), 24);
        append(&spool, 10);
        let first = disk_use(&paths);
        assert_eq!(
            (first.db_bytes, first.wal_bytes, first.spool_bytes),
            (4096, 1024, 10)
        );
        assert_eq!(first.total(), 4096 + 1024 + 10);

        // The file grows: so does its reading.
        append(&db, 8192);
        append(&spool, 5);
        // Another process's spool on the same database counts; a file that
        // only starts with the spool's name does not.
        append(&suffixed(&spool, ".1"), 7);
        append(&suffixed(&spool, ".old"), 1000);
        append(&suffixed(&db, ".bak"), 1000);
        let second = disk_use(&paths);
        assert_eq!(
            (second.db_bytes, second.wal_bytes, second.spool_bytes),
            (4096 + 8192, 1024, 10 + 5 + 7)
        );

        // A WAL truncated by a checkpoint reads smaller at once.
        std::fs::write(suffixed(&db, "-wal"), b"").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(disk_use(&paths).wal_bytes, 24);
    }

    #[test]
    fn a_spool_directory_counts_every_file_in_it_and_memory_has_no_disk() {
        let dir = TempDir::new("spooldir");
        let spool = dir.0.join("spool");
        std::fs::create_dir_all(&spool).unwrap_or_else(|e| panic!("{e}"));
        append(&spool.join("1.jsonl"), 100);
        append(&spool.join("2.jsonl"), 23);
        let paths = DiskPaths {
            db: None,
            spool: Some(spool),
        };
        assert_eq!(disk_use(&paths).spool_bytes, 123);
        assert_eq!(disk_use(&DiskPaths::default()).total(), 0);
    }

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
