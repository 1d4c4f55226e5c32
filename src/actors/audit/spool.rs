//! The audit spool: an append-only file of JSON lines (one
//! [`AuditRecord`] per line) where the audit writer puts batches the store
//! does not take, read back from a byte offset when it replays them.
//! File I/O runs on tokio's blocking pool.
//!
//! Guarantees: a line is a whole record or is skipped (a line cut by a
//! crash is ended before the next append, and one that does not parse is
//! counted and skipped); records come back in the order they were
//! appended. Written without `fsync`: the spool survives a process crash,
//! like the SQLite store in `synchronous = NORMAL`.
//!
//! One process a spool file ([`claim`]): a host locks its spool file for
//! its life (an advisory `flock`, released by the kernel when the process
//! ends, however it ends). A host whose configured spool another live
//! process holds (a `recover` beside a running `swarm`, on the same
//! database) takes the next free sibling, `PATH.1`, `PATH.2`…; and a host
//! that starts takes in the siblings no live process holds (their owners
//! died with records in them): their records are appended to its own
//! spool, replayed with it, and the files removed. So no two processes
//! replay and truncate one file, and no record in a dead process's spool
//! is left behind.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::ports::audit::AuditRecord;

/// A spool file this process holds: its path, and the open file whose lock
/// keeps other processes off it (released when it is dropped).
#[derive(Debug)]
pub(crate) struct SpoolClaim {
    /// The spool this host writes.
    pub(crate) path: PathBuf,
    _lock: File,
}

/// The most siblings a spool may have (processes at once on one path).
const MAX_SIBLINGS: u32 = 1024;

/// `PATH.n`.
fn sibling(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// Opens and locks `path` if no other process holds it. The lock is taken
/// on the file the path names once it is locked (a file removed between
/// the open and the lock is not taken: the path would name another).
fn try_take(path: &Path, create: bool) -> std::io::Result<Option<File>> {
    let f = match OpenOptions::new()
        .read(true)
        .append(true)
        .create(create)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let same = match std::fs::metadata(path) {
            Ok(m) => {
                let held = f.metadata()?;
                m.ino() == held.ino() && m.dev() == held.dev()
            }
            Err(_) => false,
        };
        if !same {
            return Ok(None);
        }
    }
    Ok(Some(f))
}

/// Claims a spool file for this process: `path` unless another live
/// process holds it, else the first free `PATH.n`; then takes in every
/// sibling (and `path`) no live process holds (see the module doc).
/// Blocking file I/O: call it once, when a host starts.
pub(crate) fn claim(path: &Path) -> std::io::Result<SpoolClaim> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut claimed = None;
    for n in 0..=MAX_SIBLINGS {
        let p = if n == 0 {
            path.to_path_buf()
        } else {
            sibling(path, n)
        };
        if let Some(f) = try_take(&p, true)? {
            claimed = Some((p, f));
            break;
        }
    }
    let Some((mine, mut lock)) = claimed else {
        return Err(std::io::Error::other(format!(
            "every spool file from {} to .{MAX_SIBLINGS} is held by a live process",
            path.display()
        )));
    };
    // Spools of processes that ended: taken in, in the order of their names.
    for n in 0..=MAX_SIBLINGS {
        let p = if n == 0 {
            path.to_path_buf()
        } else {
            sibling(path, n)
        };
        if p == mine {
            continue;
        }
        let Some(mut orphan) = try_take(&p, false)? else {
            continue;
        };
        let mut records = Vec::new();
        orphan.read_to_end(&mut records)?;
        if !records.is_empty() {
            if !records.ends_with(b"\n") {
                records.push(b'\n');
            }
            end_cut_line(&mut lock)?;
            lock.write_all(&records)?;
            tracing::info!(from = %p.display(), into = %mine.display(), bytes = records.len(), "took in the audit spool of a process that ended");
        }
        if n == 0 {
            // The configured path stays (a later process may claim it):
            // emptied, not removed.
            orphan.set_len(0)?;
        } else {
            std::fs::remove_file(&p)?;
        }
    }
    Ok(SpoolClaim {
        path: mine,
        _lock: lock,
    })
}

/// Ends a line `f` (opened for appending) was left in by a crash.
fn end_cut_line(f: &mut File) -> std::io::Result<()> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    f.seek(std::io::SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    f.read_exact(&mut last)?;
    if last[0] != b'\n' {
        f.write_all(b"\n")?;
    }
    Ok(())
}

/// One slice of the spool.
pub(super) struct Chunk {
    pub(super) records: Vec<AuditRecord>,
    pub(super) next_offset: u64,
    pub(super) skipped: usize,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// Whether the spool holds records; ends a line cut by a crash so the
/// next append starts on a line of its own.
pub(super) fn prepare(path: &Path) -> std::io::Result<u64> {
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    f.seek(std::io::SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    std::io::Read::read_exact(&mut f, &mut last)?;
    if last[0] != b'\n' {
        f.write_all(b"\n")?;
    }
    // How many records it holds (lines that are not empty).
    f.seek(std::io::SeekFrom::Start(0))?;
    let mut lines = 0;
    for line in std::io::BufReader::new(f).split(b'\n') {
        if !line?.is_empty() {
            lines += 1;
        }
    }
    Ok(lines)
}

/// Appends `records` as JSON lines (one write).
pub(super) async fn append(path: &Path, records: &[AuditRecord]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(records.len() * 256);
    for r in records {
        serde_json::to_writer(&mut buf, r)?;
        buf.push(b'\n');
    }
    let path = path.to_path_buf();
    blocking(move || {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        // A write cut short (a full disk) is taken back, so the next
        // append starts on a line of its own and no record is half in.
        let before = f.metadata()?.len();
        match f.write_all(&buf) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = f.set_len(before);
                Err(e)
            }
        }
    })
    .await
}

/// Reads up to `max` records from byte `offset`.
pub(super) async fn read(path: &Path, offset: u64, max: usize) -> std::io::Result<Chunk> {
    let path = path.to_path_buf();
    blocking(move || {
        let mut f = std::fs::File::open(&path)?;
        f.seek(std::io::SeekFrom::Start(offset))?;
        let mut r = std::io::BufReader::new(f);
        let mut chunk = Chunk {
            records: Vec::new(),
            next_offset: offset,
            skipped: 0,
        };
        let mut line = Vec::new();
        while chunk.records.len() < max {
            line.clear();
            let n = r.read_until(b'\n', &mut line)?;
            if n == 0 {
                break;
            }
            chunk.next_offset += n as u64;
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            if text.is_empty() {
                continue;
            }
            match serde_json::from_slice::<AuditRecord>(text) {
                Ok(rec) => chunk.records.push(rec),
                Err(_) => chunk.skipped += 1,
            }
        }
        Ok(chunk)
    })
    .await
}

/// Empties the spool (everything in it is in the store).
pub(super) async fn truncate(path: &Path) -> std::io::Result<()> {
    let path = path.to_path_buf();
    blocking(move || {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)?
            .set_len(0)
    })
    .await
}

/// What a spool holds, by run: the runs whose terminal record is in it,
/// and the seq after each run's last record in it (what `recover` must not
/// reuse).
#[derive(Debug, Default)]
pub(crate) struct SpoolIndex {
    /// Runs with a terminal record in the spool.
    pub(crate) finished: std::collections::HashSet<crate::ports::run::RunId>,
    /// The seq after each run's last record in the spool.
    pub(crate) next_seq: std::collections::HashMap<crate::ports::run::RunId, u32>,
}

/// Reads a whole spool (a missing file holds nothing). Blocking: call it on
/// the blocking pool.
pub(crate) fn scan(path: &Path) -> std::io::Result<SpoolIndex> {
    let mut index = SpoolIndex::default();
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(index),
        Err(e) => return Err(e),
    };
    for line in std::io::BufReader::new(f).split(b'\n') {
        let line = line?;
        let Ok(r) = serde_json::from_slice::<AuditRecord>(&line) else {
            continue;
        };
        if r.is_terminal() {
            index.finished.insert(r.run_id);
        }
        let next = index.next_seq.entry(r.run_id).or_insert(0);
        *next = (*next).max(r.seq.saturating_add(1));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::audit::AuditEntry;
    use crate::ports::event::RunEvent;
    use crate::ports::run::RunId;

    #[tokio::test]
    async fn spool_lines_round_trip_from_an_offset() {
        let dir = std::env::temp_dir().join(format!("agentvisor-spool-{}", RunId::new()));
        let path = dir.join("spool.jsonl");
        let run = RunId::new();
        let recs: Vec<AuditRecord> = (0..5)
            .map(|i| AuditRecord {
                run_id: run,
                seq: i,
                at_ms: 7,
                entry: AuditEntry::Event(RunEvent::StepStart { iteration: i }),
            })
            .collect();
        assert!(append(&path, &recs[..3]).await.is_ok());
        assert!(append(&path, &recs[3..]).await.is_ok());
        let first = read(&path, 0, 2).await.ok();
        let first = first.as_ref().map(|c| (c.records.clone(), c.next_offset));
        let Some((got, next)) = first else {
            panic!("spool read failed")
        };
        assert_eq!(got, recs[..2].to_vec());
        let rest = read(&path, next, 100).await.ok();
        assert_eq!(rest.map(|c| c.records), Some(recs[2..].to_vec()));
        assert!(truncate(&path).await.is_ok());
        assert_eq!(prepare(&path).ok(), Some(0));
        let _ = std::fs::remove_dir_all(dir);
    }
}
