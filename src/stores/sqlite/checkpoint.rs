//! Durable runs' checkpoints on SQLite, by delta (schema version 12): one
//! row per run in `checkpoints` holds what does not grow with the run
//! (its header as JSON in `state`, with the agent, iteration and resume
//! count beside it for `SELECT`s by hand) and its lease (`owner`,
//! `lease_until`, schema version 6); `checkpoint_entries` holds what
//! grows, one row per entry: the manifest and invocation (list 0, written
//! with the run's first save), the transcript's messages (list 1), the
//! step records (list 2) and the critic decisions (list 3). A save writes
//! the header and only the entries past what it keeps of the run's last
//! save ([`Unchanged`]), dropping the run's entries past those, so a run's
//! checkpoints write bytes in proportion to its steps. A row written
//! before version 12 (`layout` 0: its whole checkpoint in `state`) still
//! loads; its next save writes it whole.
//!
//! A run's first save creates its row; later saves update it only while
//! the saver holds it (fencing: see the port), and write entries only
//! then. A claim is one conditional `UPDATE` on the writer thread (and
//! under SQLite's write lock against other processes), so one claimer at
//! most wins; so is a host take-over (`host_leases`, schema version 8).

use std::collections::HashMap;

use async_trait::async_trait;
use rusqlite::{params, Connection, Transaction};

use super::{to_i64, SqliteStore};
use crate::ports::checkpoint::{
    Checkpoint, CheckpointError, Checkpointer, Claim, HostClaim, Lease, Renewal, Unchanged,
};
use crate::ports::run::{unix_ms, RunId};
use crate::stores::checkpoint_parts::{self, Lists, Parts, GROWING, START};

fn unavailable(e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Unavailable(e.to_string())
}

/// One save, ready to bind: its `checkpoints` row and its entries.
struct Row {
    run_id: String,
    agent: String,
    iteration: i64,
    attempts: i64,
    updated_at: i64,
    /// Its header (`state`) and entries.
    parts: Parts,
}

impl Row {
    /// `c`, keeping what `keep` says of the run's last save (see
    /// [`Parts::of`]).
    fn of(c: &Checkpoint, keep: Unchanged) -> Result<Self, serde_json::Error> {
        Ok(Row {
            run_id: c.run_id.to_string(),
            agent: c.agent.to_string(),
            iteration: i64::from(c.iteration),
            attempts: i64::from(c.resumes),
            updated_at: to_i64(c.saved_at),
            parts: Parts::of(c, keep)?,
        })
    }
}

/// What a save found.
#[derive(Default)]
struct Saved {
    /// The positions of the rows not written: their runs are another
    /// owner's, or gone.
    lost: Vec<usize>,
    /// The positions of the rows not written because the store holds less
    /// of their runs than they keep (a row written before schema version
    /// 12): to be saved again whole.
    behind: Vec<usize>,
}

/// Saves `save` under a lease (`owner` until `until`) and clears `clear`,
/// in one transaction. A run's first checkpoint creates its row, or takes
/// one nobody holds at `now`; a later one only updates a row `owner`
/// holds, and only if the row has what it keeps (else it is `behind`). A
/// row written has its entries past each list's `from` replaced by the
/// save's (all of them, for a save written whole).
fn write(
    tx: &Transaction<'_>,
    save: &[Row],
    clear: &[String],
    owner: &str,
    until: i64,
    now: i64,
) -> rusqlite::Result<Saved> {
    let mut out = Saved::default();
    let mut written = Vec::with_capacity(save.len());
    if save.iter().any(|c| !c.parts.first) {
        let mut update = tx.prepare_cached(
            "UPDATE checkpoints SET agent = ?2, iteration = ?3, attempts = ?4, state = ?5, \
             updated_at = ?6, lease_until = ?8, layout = 1, messages = ?9, steps = ?10, \
             decisions = ?11 \
             WHERE run_id = ?1 AND owner = ?7 AND (?12 OR (layout = 1 AND messages >= ?13 \
             AND steps >= ?14 AND decisions >= ?15))",
        )?;
        let mut held =
            tx.prepare_cached("SELECT 1 FROM checkpoints WHERE run_id = ?1 AND owner = ?2")?;
        for (i, c) in save.iter().enumerate().filter(|(_, c)| !c.parts.first) {
            let [m, s, d] = c.parts.counts().map(|n| n as i64);
            let [mf, sf, df] = c.parts.lists.each_ref().map(|l| l.from as i64);
            let n = update.execute(params![
                c.run_id,
                c.agent,
                c.iteration,
                c.attempts,
                c.parts.header,
                c.updated_at,
                owner,
                until,
                m,
                s,
                d,
                c.parts.start.is_some(),
                mf,
                sf,
                df
            ])?;
            if n == 1 {
                written.push(i);
            } else if held.exists(params![c.run_id, owner])? {
                out.behind.push(i);
            } else {
                out.lost.push(i);
            }
        }
    }
    if save.iter().any(|c| c.parts.first) {
        let mut upsert = tx.prepare_cached(
            "INSERT INTO checkpoints (run_id, agent, iteration, attempts, state, updated_at, \
             owner, lease_until, layout, messages, steps, decisions) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 1, ?10, ?11, ?12) \
             ON CONFLICT (run_id) DO UPDATE SET agent = excluded.agent, \
             iteration = excluded.iteration, attempts = excluded.attempts, \
             state = excluded.state, updated_at = excluded.updated_at, \
             owner = excluded.owner, lease_until = excluded.lease_until, layout = 1, \
             messages = excluded.messages, steps = excluded.steps, \
             decisions = excluded.decisions \
             WHERE checkpoints.owner IS NULL OR checkpoints.owner = excluded.owner \
             OR checkpoints.lease_until <= ?9",
        )?;
        for (i, c) in save.iter().enumerate().filter(|(_, c)| c.parts.first) {
            let [m, s, d] = c.parts.counts().map(|n| n as i64);
            let n = upsert.execute(params![
                c.run_id,
                c.agent,
                c.iteration,
                c.attempts,
                c.parts.header,
                c.updated_at,
                owner,
                until,
                now,
                m,
                s,
                d
            ])?;
            if n == 0 {
                out.lost.push(i);
            } else {
                written.push(i);
            }
        }
    }
    if !written.is_empty() {
        write_entries(tx, save, &written)?;
    }
    if !clear.is_empty() {
        let mut row = tx.prepare_cached("DELETE FROM checkpoints WHERE run_id = ?1")?;
        let mut entries = tx.prepare_cached("DELETE FROM checkpoint_entries WHERE run_id = ?1")?;
        for run_id in clear {
            row.execute([run_id])?;
            entries.execute([run_id])?;
        }
    }
    Ok(out)
}

/// Writes the entries of the saves at `written` (their rows are written):
/// a save written whole replaces all of its run's; any other replaces
/// those past each list's `from` (none, after a step: it appends).
fn write_entries(tx: &Transaction<'_>, save: &[Row], written: &[usize]) -> rusqlite::Result<()> {
    let mut delete_all = tx.prepare_cached("DELETE FROM checkpoint_entries WHERE run_id = ?1")?;
    let mut delete_from = tx.prepare_cached(
        "DELETE FROM checkpoint_entries WHERE run_id = ?1 AND list = ?2 AND seq >= ?3",
    )?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO checkpoint_entries (run_id, list, seq, body) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for c in written.iter().filter_map(|&i| save.get(i)) {
        if let Some(start) = &c.parts.start {
            delete_all.execute([&c.run_id])?;
            for (seq, body) in (0i64..).zip(start) {
                insert.execute(params![c.run_id, START, seq, body])?;
            }
        }
        for (list, l) in GROWING.into_iter().zip(&c.parts.lists) {
            let from = l.from as i64;
            if c.parts.start.is_none() {
                delete_from.execute(params![c.run_id, list, from])?;
            }
            for (seq, body) in (from..).zip(&l.entries) {
                insert.execute(params![c.run_id, list, seq, body])?;
            }
        }
    }
    Ok(())
}

/// A `checkpoints` row as read.
struct Stored {
    run_id: String,
    state: String,
    layout: i64,
    /// The entries of lists 1 to 3 its checkpoint has.
    counts: [i64; 3],
}

/// Reads every checkpoint row and every entry, in one read transaction
/// (so a save between the two reads is seen by both or neither).
fn read_all(c: &Connection) -> rusqlite::Result<(Vec<Stored>, HashMap<String, Lists>)> {
    let tx = c.unchecked_transaction()?;
    let rows = {
        let mut stmt = tx.prepare(
            "SELECT run_id, state, layout, messages, steps, decisions FROM checkpoints \
             ORDER BY updated_at, run_id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(Stored {
                run_id: r.get(0)?,
                state: r.get(1)?,
                layout: r.get(2)?,
                counts: [r.get(3)?, r.get(4)?, r.get(5)?],
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()?
    };
    let mut entries: HashMap<String, Lists> = HashMap::new();
    {
        let mut stmt = tx.prepare(
            "SELECT run_id, list, seq, body FROM checkpoint_entries ORDER BY run_id, list, seq",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let (run_id, list, seq, body): (String, i64, i64, String) =
                (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
            checkpoint_parts::push_entry(entries.entry(run_id).or_default(), list, seq, body);
        }
    }
    tx.commit()?;
    Ok((rows, entries))
}

/// A checkpoint from its row and entries.
fn assemble(row: Stored, entries: Option<Lists>) -> Result<Checkpoint, String> {
    if row.layout == 0 {
        return serde_json::from_str::<Checkpoint>(&row.state).map_err(|e| e.to_string());
    }
    checkpoint_parts::assemble(&row.state, entries, row.counts)
}

#[async_trait]
impl Checkpointer for SqliteStore {
    async fn save(
        &self,
        checkpoints: &[Checkpoint],
        lease: &Lease,
    ) -> Result<Vec<RunId>, CheckpointError> {
        if checkpoints.is_empty() {
            return Ok(Vec::new());
        }
        let rows = checkpoints
            .iter()
            .map(|c| Row::of(c, c.unchanged))
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        let mut lost = self.save_rows(rows, lease).await?;
        // Rows the store holds less of than their saves keep (written
        // before schema version 12): written whole, once more.
        let behind = std::mem::take(&mut lost.behind);
        let mut lost: Vec<RunId> = lost
            .lost
            .into_iter()
            .filter_map(|i| checkpoints.get(i).map(|c| c.run_id))
            .collect();
        if !behind.is_empty() {
            let again: Vec<&Checkpoint> =
                behind.iter().filter_map(|&i| checkpoints.get(i)).collect();
            let rows = again
                .iter()
                .map(|c| Row::of(c, Unchanged::default()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(unavailable)?;
            let saved = self.save_rows(rows, lease).await?;
            lost.extend(
                saved
                    .lost
                    .into_iter()
                    .chain(saved.behind)
                    .filter_map(|i| again.get(i).map(|c| c.run_id)),
            );
        }
        Ok(lost)
    }

    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        if runs.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = runs.iter().map(RunId::to_string).collect();
        self.writer
            .write(move |tx| write(tx, &[], &ids, "", 0, 0))
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        let (rows, mut entries) = self.read(|c| read_all(c).map_err(unavailable)).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let run_id = row.run_id.clone();
            let parts = entries.remove(&run_id);
            match assemble(row, parts) {
                Ok(c) => out.push(c),
                // One unreadable checkpoint must not keep every other run
                // from resuming: it is reported and left in place.
                Err(error) => {
                    tracing::error!(%run_id, %error, "a checkpoint does not load; skipped")
                }
            }
        }
        Ok(out)
    }

    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError> {
        let now = unix_ms();
        let (id, owner, until) = (run_id.to_string(), lease.owner.clone(), lease.until(now));
        self.writer
            .write(move |tx| {
                let taken = tx.execute(
                    "UPDATE checkpoints SET owner = ?2, lease_until = ?3 WHERE run_id = ?1 \
                     AND (owner IS NULL OR owner = ?2 OR lease_until <= ?4)",
                    rusqlite::params![id, owner, to_i64(until), to_i64(now)],
                )?;
                if taken == 1 {
                    return Ok(Claim::Claimed);
                }
                use rusqlite::OptionalExtension;
                let holder: Option<(Option<String>, i64)> = tx
                    .query_row(
                        "SELECT owner, lease_until FROM checkpoints WHERE run_id = ?1",
                        [&id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                Ok(match holder {
                    Some((owner, until)) => Claim::HeldBy {
                        owner: owner.unwrap_or_default(),
                        until_ms: u64::try_from(until).unwrap_or(0),
                    },
                    None => Claim::Missing,
                })
            })
            .await
            .map_err(unavailable)
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal, CheckpointError> {
        let (owner, until) = (lease.owner.clone(), to_i64(lease.until(unix_ms())));
        self.writer
            .write(move |tx| {
                use rusqlite::OptionalExtension;
                let prior: Option<i64> = tx
                    .prepare_cached("SELECT taken_over FROM host_leases WHERE owner = ?1")?
                    .query_row([&owner], |r| r.get(0))
                    .optional()?;
                tx.prepare_cached(
                    "INSERT INTO host_leases (owner, lease_until, taken_over) VALUES (?1, ?2, 0) \
                     ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until, \
                     taken_over = 0",
                )?
                .execute(rusqlite::params![owner, until])?;
                let runs = tx
                    .prepare_cached("UPDATE checkpoints SET lease_until = ?2 WHERE owner = ?1")?
                    .execute(rusqlite::params![owner, until])?;
                Ok(Renewal {
                    runs: runs as u64,
                    taken_over: prior.is_some_and(|t| t != 0),
                })
            })
            .await
            .map_err(unavailable)
    }

    async fn held_by(&self, owner: &str) -> Result<Vec<RunId>, CheckpointError> {
        let owner = owner.to_string();
        let ids: Vec<String> = self
            .read(move |c| {
                let mut stmt = c
                    .prepare("SELECT run_id FROM checkpoints WHERE owner = ?1")
                    .map_err(unavailable)?;
                let rows = stmt.query_map([owner], |r| r.get(0)).map_err(unavailable)?;
                rows.collect::<Result<_, _>>().map_err(unavailable)
            })
            .await?;
        Ok(ids.iter().filter_map(|s| s.parse().ok()).collect())
    }

    async fn take_over_host(&self, owner: &str, gone: bool) -> Result<HostClaim, CheckpointError> {
        let owner = owner.to_string();
        let now = to_i64(unix_ms());
        self.writer
            .write(move |tx| {
                use rusqlite::OptionalExtension;
                // Live: a lease not expired and not taken over since it was
                // last renewed.
                let taken = tx.execute(
                    "UPDATE host_leases SET taken_over = ?2 WHERE owner = ?1 \
                     AND (lease_until <= ?2 OR taken_over <> 0 OR ?3)",
                    rusqlite::params![owner, now, gone],
                )?;
                if taken == 1 {
                    return Ok(HostClaim::TakenOver);
                }
                let until: Option<i64> = tx
                    .query_row(
                        "SELECT lease_until FROM host_leases WHERE owner = ?1",
                        [&owner],
                        |r| r.get(0),
                    )
                    .optional()?;
                match until {
                    Some(until) => Ok(HostClaim::Live {
                        until_ms: u64::try_from(until).unwrap_or(0),
                    }),
                    // It holds none (released, or it never took one): a row
                    // that says it was taken over, should it come back.
                    None => {
                        tx.execute(
                            "INSERT INTO host_leases (owner, lease_until, taken_over) \
                             VALUES (?1, 0, ?2)",
                            rusqlite::params![owner, now],
                        )?;
                        Ok(HostClaim::TakenOver)
                    }
                }
            })
            .await
            .map_err(unavailable)
    }

    async fn release(&self, owner: &str) -> Result<(), CheckpointError> {
        let owner = owner.to_string();
        self.writer
            .write(move |tx| {
                tx.execute(
                    "UPDATE checkpoints SET owner = NULL, lease_until = 0 WHERE owner = ?1",
                    [&owner],
                )?;
                tx.execute("DELETE FROM host_leases WHERE owner = ?1", [&owner])
                    .map(drop)
            })
            .await
            .map_err(unavailable)
    }
}

impl SqliteStore {
    /// Writes `rows` under `lease`, on the writer thread.
    async fn save_rows(&self, rows: Vec<Row>, lease: &Lease) -> Result<Saved, CheckpointError> {
        let now = unix_ms();
        let (owner, until) = (lease.owner.clone(), to_i64(lease.until(now)));
        self.writer
            .write(move |tx| write(tx, &rows, &[], &owner, until, to_i64(now)))
            .await
            .map_err(unavailable)
    }
}
