//! Retention on SQLite: pruning the oldest finished runs in small batches
//! (each one short write transaction on the writer thread, so appends
//! queue behind it for milliseconds at most), counting them in
//! `runs_pruned`, giving the freed pages back to the file system
//! (`PRAGMA incremental_vacuum`, a bounded number of pages a job) and
//! keeping the WAL short (`wal_checkpoint(TRUNCATE)` that does not wait
//! for readers).
//!
//! Never pruned: a run without a `runs` row (in flight: its records are
//! segments only), a run with a `checkpoints` row (durable, or parked for
//! approval).

use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::audit::unavailable;
use super::{to_i64, to_u64, SqliteStore};
use crate::ports::audit::AuditStoreError;
use crate::ports::retention::{PruneReport, PrunedCount, Retention};
use crate::ports::run::RunStatus;

/// Free pages given back to the file system per writer job, at most
/// (1024 pages of 16 KiB: 16 MiB, a few milliseconds of work).
const VACUUM_PAGES_PER_JOB: i64 = 1024;

/// How long the WAL truncation after a prune waits for readers: not at
/// all, nearly (it is tried again after the next prune).
const TRUNCATE_BUSY: Duration = Duration::from_millis(10);

/// What the file holds, as SQLite counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes of a page.
    pub page_size: u64,
    /// Pages in the file.
    pub pages: u64,
    /// Pages free for reuse (what a vacuum gives back).
    pub free_pages: u64,
    /// `PRAGMA auto_vacuum`: 0 none, 1 full, 2 incremental.
    pub auto_vacuum: i64,
}

impl Footprint {
    /// Bytes in pages that hold data: the file's size once vacuumed.
    pub fn used_bytes(&self) -> u64 {
        self.pages.saturating_sub(self.free_pages) * self.page_size
    }

    /// Whether freed pages can go back to the file system without a full
    /// `VACUUM` (the file was created in incremental auto-vacuum mode).
    pub fn shrinks(&self) -> bool {
        self.auto_vacuum == 2
    }
}

/// One run the policy would prune.
struct Candidate {
    run_id: String,
    agent: String,
    status: String,
    finished_at: i64,
}

fn footprint(c: &Connection) -> rusqlite::Result<Footprint> {
    let one = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0));
    Ok(Footprint {
        page_size: to_u64(one("PRAGMA page_size")?),
        pages: to_u64(one("PRAGMA page_count")?),
        free_pages: to_u64(one("PRAGMA freelist_count")?),
        auto_vacuum: one("PRAGMA auto_vacuum")?,
    })
}

/// The records a run holds (all three places).
fn records_of(c: &Connection, run_id: &str) -> rusqlite::Result<u64> {
    let n: i64 = c
        .prepare_cached(
            "SELECT (SELECT COALESCE(SUM(records), 0) FROM audit_segments WHERE run_id = ?1) \
             + (SELECT COUNT(*) FROM audit_records WHERE run_id = ?1) \
             + COALESCE((SELECT tail_records FROM runs WHERE run_id = ?1), 0)",
        )?
        .query_row([run_id], |r| r.get(0))?;
    Ok(to_u64(n))
}

/// The oldest finished runs `retention` does not keep, at most `batch`.
fn candidates(
    c: &Connection,
    retention: &Retention,
    now_ms: u64,
    batch: usize,
    fp: &Footprint,
) -> rusqlite::Result<(Vec<Candidate>, bool)> {
    // Runs are ordered as `runs_by_finish` holds them: (finished_at,
    // rowid). Those before `cutoff` go (by age, by count).
    let mut want: u64 = 0;
    let mut cutoff: Option<(i64, i64)> = None;
    let mut raise = |bound: (i64, i64)| {
        cutoff = Some(cutoff.map_or(bound, |c: (i64, i64)| c.max(bound)));
    };
    if let Some(age) = retention.max_age {
        raise((
            to_i64(now_ms.saturating_sub(age.as_millis() as u64)),
            i64::MIN,
        ));
    }
    if let Some(max) = retention.max_runs {
        // The newest run past the bound, found walking `runs_by_finish`
        // back over the runs kept (not counting them all): it and every
        // run before it go.
        let edge: Option<(i64, i64)> = c
            .query_row(
                "SELECT finished_at, rowid FROM runs ORDER BY finished_at DESC, rowid DESC \
                 LIMIT 1 OFFSET ?1",
                [to_i64(max)],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if let Some((t, row)) = edge {
            raise((t, row.saturating_add(1)));
        }
    }
    if let Some(max) = retention.max_bytes {
        let count = to_u64(c.query_row("SELECT COUNT(*) FROM runs", [], |r| r.get::<_, i64>(0))?);
        let used = fp.used_bytes();
        if used > max && count > 0 {
            // Runs take about the same bytes: prune the share over the
            // bound (at least one), and look again next pass.
            let per_run = (used / count).max(1);
            want = want.max((used - max).div_ceil(per_run).max(1));
        }
    }
    let limit = batch.max(1) as u64;
    if want == 0 && cutoff.is_none() {
        return Ok((Vec::new(), false));
    }
    // The oldest first, in `runs_by_finish` order (no sort); by age or
    // count a range of that index, so a pass reads only what it prunes.
    let mut stmt = c.prepare_cached(
        "SELECT run_id, agent, status, finished_at, rowid FROM runs \
         WHERE (finished_at, rowid) < (?1, ?2) \
         AND NOT EXISTS (SELECT 1 FROM checkpoints k WHERE k.run_id = runs.run_id) \
         ORDER BY finished_at, rowid LIMIT ?3",
    )?;
    let bound = if want > 0 {
        (i64::MAX, i64::MAX)
    } else {
        cutoff.unwrap_or((i64::MIN, i64::MIN))
    };
    let rows = stmt.query_map(params![bound.0, bound.1, to_i64(limit)], |r| {
        Ok((
            Candidate {
                run_id: r.get(0)?,
                agent: r.get(1)?,
                status: r.get(2)?,
                finished_at: r.get(3)?,
            },
            r.get::<_, i64>(4)?,
        ))
    })?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let (cand, rowid) = row?;
        // Past the bytes bound, or before the age or count bound.
        let before = cutoff.is_some_and(|t| (cand.finished_at, rowid) < t);
        if (i as u64) < want || before {
            out.push(cand);
        } else {
            break;
        }
        if out.len() as u64 >= limit {
            break;
        }
    }
    let more = out.len() as u64 >= limit;
    Ok((out, more))
}

impl SqliteStore {
    /// What the file holds: pages, free pages, auto-vacuum mode.
    pub async fn footprint(&self) -> Result<Footprint, AuditStoreError> {
        self.read(|c| footprint(c).map_err(unavailable)).await
    }

    /// Prunes (see [`AuditStore::prune`](crate::ports::audit::AuditStore::prune)).
    pub(super) async fn prune_runs(
        &self,
        retention: &Retention,
        now_ms: u64,
        batch: usize,
        dry_run: bool,
    ) -> Result<PruneReport, AuditStoreError> {
        let retention = *retention;
        let before = self.footprint().await?;
        let (chosen, more) = self
            .read(move |c| {
                let (cands, more) =
                    candidates(c, &retention, now_ms, batch, &before).map_err(unavailable)?;
                let mut out = Vec::with_capacity(cands.len());
                for cand in cands {
                    // Counted again as they go; a dry run counts here.
                    let records = if dry_run {
                        records_of(c, &cand.run_id).map_err(unavailable)?
                    } else {
                        0
                    };
                    out.push((cand, records));
                }
                Ok::<_, AuditStoreError>((out, more))
            })
            .await?;
        let mut report = PruneReport {
            dry_run,
            more,
            bytes_before: before.used_bytes(),
            ..PruneReport::default()
        };
        if chosen.is_empty() || dry_run {
            for (cand, records) in &chosen {
                report.add(&cand.agent, status_of(&cand.status), *records);
            }
            report.bytes_after = report.bytes_before;
            return Ok(report);
        }
        let pruned = self
            .writer
            .write(move |tx| {
                // Per run: one read of its row, its deletes; what runs share
                // (templates' references, the pruned counts) is summed over
                // the batch and written once a key, so a batch costs about
                // four statements a run and the writer keeps up with a swarm.
                let mut done: Vec<(String, String, u64)> = Vec::new();
                let mut row = tx.prepare_cached(
                    "SELECT tail_ref, result_ref, COALESCE(tail_records, 0) FROM runs \
                     WHERE run_id = ?1",
                )?;
                // Checked again under the write lock: a run that got a
                // checkpoint since the read stays.
                let mut del_run = tx.prepare_cached(
                    "DELETE FROM runs WHERE run_id = ?1 AND NOT EXISTS \
                     (SELECT 1 FROM checkpoints k WHERE k.run_id = ?1)",
                )?;
                let mut del_segments = tx.prepare_cached(
                    "DELETE FROM audit_segments WHERE run_id = ?1 RETURNING records",
                )?;
                let mut del_records =
                    tx.prepare_cached("DELETE FROM audit_records WHERE run_id = ?1")?;
                // A pruned run's settled publishes go with it (schema
                // version 15); one still owed stays until it is delivered.
                let mut del_outbox = tx.prepare_cached(
                    "DELETE FROM outbox WHERE run_id = ?1 AND state <> 'owed'",
                )?;
                let mut unrefs: std::collections::HashMap<i64, i64> =
                    std::collections::HashMap::new();
                let mut counts: std::collections::BTreeMap<(String, String), (i64, i64)> =
                    std::collections::BTreeMap::new();
                for (cand, _) in &chosen {
                    let Some((tail_ref, result_ref, tail_records)) = row
                        .query_row([&cand.run_id], |r| {
                            Ok((
                                r.get::<_, Option<i64>>(0)?,
                                r.get::<_, Option<i64>>(1)?,
                                r.get::<_, i64>(2)?,
                            ))
                        })
                        .optional()?
                    else {
                        continue;
                    };
                    if del_run.execute([&cand.run_id])? == 0 {
                        continue;
                    }
                    for id in [tail_ref, result_ref].into_iter().flatten() {
                        *unrefs.entry(id).or_default() += 1;
                    }
                    let mut records = tail_records;
                    let mut segs = del_segments.query([&cand.run_id])?;
                    while let Some(r) = segs.next()? {
                        records += r.get::<_, i64>(0)?;
                    }
                    drop(segs);
                    // Records of schema version 1 (one row each), if any.
                    records += del_records.execute([&cand.run_id])? as i64;
                    del_outbox.execute([&cand.run_id])?;
                    let c = counts
                        .entry((cand.agent.clone(), cand.status.clone()))
                        .or_default();
                    c.0 += 1;
                    c.1 += records;
                    done.push((cand.agent.clone(), cand.status.clone(), to_u64(records)));
                }
                // A pruned row's templates lose their references; one
                // nobody points at any more goes (schema version 11).
                let mut unref =
                    tx.prepare_cached("UPDATE run_templates SET refs = refs - ?2 WHERE id = ?1")?;
                let mut drop_unused =
                    tx.prepare_cached("DELETE FROM run_templates WHERE id = ?1 AND refs <= 0")?;
                for (id, n) in unrefs {
                    unref.execute(params![id, n])?;
                    drop_unused.execute([id])?;
                }
                let mut count = tx.prepare_cached(
                    "INSERT INTO runs_pruned (agent, status, runs, records) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (agent, status) DO UPDATE SET runs = runs_pruned.runs + excluded.runs, \
                     records = runs_pruned.records + excluded.records",
                )?;
                for ((agent, status), (runs, records)) in counts {
                    count.execute(params![agent, status, runs, records])?;
                }
                // Manifests no kept run ran (schema version 14): a run's
                // batch refreshes its manifest's `used_ms` at most a minute
                // after the run started, so one unused since two minutes
                // before the oldest kept start (finished or in flight) is
                // named by no record. With no run left, two minutes before
                // now. Looked for only when the file holds many (the
                // oldest start is a scan of `runs`, which has no index by
                // start): a host runs a few manifests, kept at no cost.
                let many = || -> rusqlite::Result<bool> {
                    tx.query_row(
                        "SELECT COUNT(*) > 256 FROM (SELECT 1 FROM manifests LIMIT 257)",
                        [],
                        |r| r.get(0),
                    )
                };
                if !done.is_empty() && many()? {
                    tx.execute(
                        "DELETE FROM manifests WHERE used_ms < MIN(\
                         COALESCE((SELECT MIN(started_at) FROM runs), ?1), \
                         COALESCE((SELECT MIN(at_base) FROM audit_segments WHERE has_start = 1), ?1), \
                         ?1) - 120000",
                        [to_i64(now_ms)],
                    )?;
                }
                Ok(done)
            })
            .await
            .map_err(unavailable)?;
        for (agent, status, records) in &pruned {
            report.add(agent, status_of(status), *records);
        }
        self.give_back(report.more).await;
        report.bytes_after = self.footprint().await?.used_bytes();
        // Runs are not all the same size, nor is every page theirs: look
        // again while the bytes are over the bound.
        if retention
            .max_bytes
            .is_some_and(|max| report.bytes_after > max)
            && report.runs > 0
        {
            report.more = true;
        }
        Ok(report)
    }

    /// Gives free pages back to the file system (a bounded number a writer
    /// job) when the file allows it and they are worth it, and at the end
    /// of a pass (`more` false) truncates the WAL unless a reader holds it.
    /// Failures are logged: the next prune tries again.
    async fn give_back(&self, more: bool) {
        let Ok(fp) = self.footprint().await else {
            return;
        };
        // Free pages are reused by the next inserts: they go back to the
        // file system only once they are a quarter of the file, or the
        // pass is over (a host that keeps writing would grow it again).
        let worth = fp.free_pages > 0 && (!more || fp.free_pages * 4 > fp.pages);
        if fp.shrinks() && worth {
            loop {
                let Ok(now) = self.footprint().await else {
                    break;
                };
                if now.free_pages == 0 {
                    break;
                }
                let done = self
                    .writer
                    .raw(super::APPEND_BUSY_TIMEOUT, |c| {
                        // A pragma takes no bound parameter.
                        let mut st = c.prepare_cached(&format!(
                            "PRAGMA incremental_vacuum({VACUUM_PAGES_PER_JOB})"
                        ))?;
                        let mut rows = st.query([])?;
                        while rows.next()?.is_some() {}
                        Ok(())
                    })
                    .await;
                if let Err(e) = done {
                    tracing::debug!(error = %e, "incremental vacuum skipped");
                    break;
                }
                if now.free_pages as i64 <= VACUUM_PAGES_PER_JOB {
                    break;
                }
            }
        }
        if self.file_backed && !more {
            let done = self
                .writer
                .raw(TRUNCATE_BUSY, |c| {
                    let busy: i64 =
                        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
                    if busy != 0 {
                        tracing::debug!("WAL truncation after a prune blocked by a reader");
                    }
                    Ok(())
                })
                .await;
            if let Err(e) = done {
                tracing::debug!(error = %e, "WAL truncation after a prune skipped");
            }
        }
    }

    /// Rewrites the whole file (`VACUUM`) in incremental auto-vacuum mode:
    /// a file created before schema version 10 then shrinks as runs are
    /// pruned. Takes the write lock for as long as it takes (the file's
    /// size); for `agentvisor runs prune --vacuum`, not for a busy host.
    pub async fn vacuum(&self) -> Result<(), AuditStoreError> {
        self.writer
            .raw(super::BUSY_TIMEOUT, |c| {
                c.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
            })
            .await
            .map_err(unavailable)?;
        if self.file_backed {
            let _ = self.writer.checkpoint("TRUNCATE").await;
        }
        Ok(())
    }

    /// The runs pruned so far, by agent and status.
    pub(super) async fn pruned_counts(&self) -> Result<Vec<PrunedCount>, AuditStoreError> {
        self.read(|c| {
            let mut st = c
                .prepare(
                    "SELECT agent, status, runs, records FROM runs_pruned ORDER BY agent, status",
                )
                .map_err(unavailable)?;
            let rows = st
                .query_map([], |r| {
                    Ok(PrunedCount {
                        agent: r.get(0)?,
                        status: status_of(&r.get::<_, String>(1)?),
                        runs: to_u64(r.get(2)?),
                        records: to_u64(r.get(3)?),
                    })
                })
                .map_err(unavailable)?;
            rows.collect::<Result<_, _>>().map_err(unavailable)
        })
        .await
    }

    /// Pruned runs and records, summed (for [`SqliteStore::totals`]).
    pub(super) fn pruned_sums(c: &Connection) -> rusqlite::Result<(i64, i64)> {
        c.query_row(
            "SELECT COALESCE(SUM(runs), 0), COALESCE(SUM(records), 0) FROM runs_pruned",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map(|v| v.unwrap_or((0, 0)))
    }
}

/// A stored status back (an unknown one reads as `error`).
fn status_of(s: &str) -> RunStatus {
    s.parse().unwrap_or(RunStatus::Error)
}
