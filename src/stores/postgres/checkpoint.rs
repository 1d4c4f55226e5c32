//! `Checkpointer` on PostgreSQL: durable runs' checkpoints by delta, their
//! leases and host leases (schema version 3), with the semantics of the
//! SQLite battery (the conformance suite runs both).
//!
//! A checkpoint is kept in parts (`crate::stores::checkpoint_parts`): one
//! `checkpoints` row per run (its header, its lease) and its entries in
//! `checkpoint_entries`. A save writes the header and only the entries past
//! what it keeps of the run's previous save.
//!
//! # Fencing
//!
//! Every write of a run is one statement conditional on its lease, in the
//! transaction of the batch: a save other than a run's first is an
//! `UPDATE … WHERE owner = $owner` (the owner, unique per host and
//! process, is the fencing token), a first save an upsert that takes the
//! row only when nobody holds it or its lease expired, and a claim an
//! `UPDATE` with the same condition. PostgreSQL re-checks the condition on
//! the row's latest version under its row lock, so of a claim and a save
//! racing on one run exactly one wins; a save refused writes no entry.
//!
//! # Time
//!
//! Lease times are Unix ms of the writer's clock, as on SQLite: a lease
//! taken at `now` holds until `now + ttl`, and expired means
//! `lease_until <= now` of whoever looks. Hosts on one database need
//! clocks in step (NTP): a host whose clock runs late makes its leases
//! look shorter to the others, which may then take its runs early — its
//! writes are fenced, so nothing is written twice, but the run is resumed
//! sooner than its lease said.

use std::collections::HashMap;

use async_trait::async_trait;
use deadpool_postgres::Transaction;

use super::{to_i64, to_u64, Cause, PostgresStore};
use crate::ports::checkpoint::{
    Checkpoint, CheckpointError, Checkpointer, Claim, HostClaim, Lease, Renewal, Unchanged,
};
use crate::ports::run::{unix_ms, RunId};
use crate::stores::checkpoint_parts::{self, Lists, Parts, GROWING, START};

fn unavailable(e: impl Into<Cause>) -> CheckpointError {
    CheckpointError::Unavailable(crate::secrets::redact_string(e.into().0))
}

/// Rows a statement writes at most, and entries it inserts: under the
/// server's limit on a statement's parameters (arrays are one each, so
/// this only bounds a statement's size).
const CHUNK: usize = 4096;

/// One save, ready to bind.
struct Row {
    run_id: String,
    agent: String,
    iteration: i64,
    attempts: i64,
    updated_at: i64,
    parts: Parts,
}

impl Row {
    fn of(c: &Checkpoint, keep: Unchanged) -> Result<Self, CheckpointError> {
        Ok(Row {
            run_id: c.run_id.to_string(),
            agent: c.agent.to_string(),
            iteration: i64::from(c.iteration),
            attempts: i64::from(c.resumes),
            updated_at: to_i64(c.saved_at),
            parts: Parts::of(c, keep).map_err(unavailable)?,
        })
    }

    /// The entries of lists 1 to 3 after the save.
    fn counts(&self) -> [i32; 3] {
        self.parts
            .counts()
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
    }

    /// Where each of lists 1 to 3 is written from.
    fn froms(&self) -> [i32; 3] {
        self.parts
            .lists
            .each_ref()
            .map(|l| i32::try_from(l.from).unwrap_or(i32::MAX))
    }
}

/// The header columns of some rows, ready to bind as arrays.
#[derive(Default)]
struct Headers<'a> {
    run_id: Vec<&'a str>,
    agent: Vec<&'a str>,
    iteration: Vec<i64>,
    attempts: Vec<i64>,
    state: Vec<&'a str>,
    updated_at: Vec<i64>,
    messages: Vec<i32>,
    steps: Vec<i32>,
    decisions: Vec<i32>,
    /// Written whole (with its manifest and invocation).
    whole: Vec<bool>,
    /// What each save keeps of lists 1 to 3.
    from_messages: Vec<i32>,
    from_steps: Vec<i32>,
    from_decisions: Vec<i32>,
}

impl<'a> Headers<'a> {
    fn of(rows: &[&'a Row]) -> Self {
        let mut h = Headers::default();
        for r in rows {
            let [m, s, d] = r.counts();
            let [mf, sf, df] = r.froms();
            h.run_id.push(&r.run_id);
            h.agent.push(&r.agent);
            h.iteration.push(r.iteration);
            h.attempts.push(r.attempts);
            h.state.push(&r.parts.header);
            h.updated_at.push(r.updated_at);
            h.messages.push(m);
            h.steps.push(s);
            h.decisions.push(d);
            h.whole.push(r.parts.start.is_some());
            h.from_messages.push(mf);
            h.from_steps.push(sf);
            h.from_decisions.push(df);
        }
        h
    }
}

/// Updates the rows of later saves that `owner` holds (and that hold what
/// each save keeps, unless it is written whole); answers the run ids
/// written.
async fn update_held(
    tx: &Transaction<'_>,
    rows: &[&Row],
    owner: &str,
    until: i64,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let h = Headers::of(rows);
    let written = tx
        .query(
            "UPDATE checkpoints c SET agent = u.agent, iteration = u.iteration, \
             attempts = u.attempts, state = u.state, updated_at = u.updated_at, \
             lease_until = $14, messages = u.messages, steps = u.steps, decisions = u.decisions \
             FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::int8[], \
             $7::int4[], $8::int4[], $9::int4[], $10::bool[], $11::int4[], $12::int4[], \
             $13::int4[]) AS u(run_id, agent, iteration, attempts, state, updated_at, messages, \
             steps, decisions, whole, mf, sf, df) \
             WHERE c.run_id = u.run_id AND c.owner = $15 AND (u.whole OR (c.messages >= u.mf \
             AND c.steps >= u.sf AND c.decisions >= u.df)) \
             RETURNING c.run_id",
            &[
                &h.run_id,
                &h.agent,
                &h.iteration,
                &h.attempts,
                &h.state,
                &h.updated_at,
                &h.messages,
                &h.steps,
                &h.decisions,
                &h.whole,
                &h.from_messages,
                &h.from_steps,
                &h.from_decisions,
                &until,
                &owner,
            ],
        )
        .await?;
    Ok(written.iter().map(|r| r.get(0)).collect())
}

/// Creates the rows of first saves, or takes rows nobody holds at `now`
/// (or `owner` holds); answers the run ids written.
async fn upsert_first(
    tx: &Transaction<'_>,
    rows: &[&Row],
    owner: &str,
    until: i64,
    now: i64,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let h = Headers::of(rows);
    let written = tx
        .query(
            "INSERT INTO checkpoints (run_id, agent, iteration, attempts, state, updated_at, \
             owner, lease_until, messages, steps, decisions) \
             SELECT u.run_id, u.agent, u.iteration, u.attempts, u.state, u.updated_at, $10, $11, \
             u.messages, u.steps, u.decisions \
             FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::int8[], \
             $7::int4[], $8::int4[], $9::int4[]) AS u(run_id, agent, iteration, attempts, state, \
             updated_at, messages, steps, decisions) \
             ON CONFLICT (run_id) DO UPDATE SET agent = EXCLUDED.agent, \
             iteration = EXCLUDED.iteration, attempts = EXCLUDED.attempts, \
             state = EXCLUDED.state, updated_at = EXCLUDED.updated_at, owner = EXCLUDED.owner, \
             lease_until = EXCLUDED.lease_until, messages = EXCLUDED.messages, \
             steps = EXCLUDED.steps, decisions = EXCLUDED.decisions \
             WHERE checkpoints.owner IS NULL OR checkpoints.owner = EXCLUDED.owner \
             OR checkpoints.lease_until <= $12 \
             RETURNING run_id",
            &[
                &h.run_id,
                &h.agent,
                &h.iteration,
                &h.attempts,
                &h.state,
                &h.updated_at,
                &h.messages,
                &h.steps,
                &h.decisions,
                &owner,
                &until,
                &now,
            ],
        )
        .await?;
    Ok(written.iter().map(|r| r.get(0)).collect())
}

/// Writes the entries of `rows` (their rows are written): a save written
/// whole replaces all of its run's entries; any other replaces those past
/// each list's `from` (none, after a step: it appends).
async fn write_entries(tx: &Transaction<'_>, rows: &[&Row]) -> Result<(), tokio_postgres::Error> {
    // What goes: (run, list, from); list -1 is every list.
    let (mut d_run, mut d_list, mut d_from) = (Vec::new(), Vec::<i16>::new(), Vec::<i32>::new());
    let (mut run, mut list, mut seq, mut body) =
        (Vec::new(), Vec::<i16>::new(), Vec::<i32>::new(), Vec::new());
    for r in rows {
        let mut add = |l: u8, at: usize, b: &str| {
            run.push(r.run_id.as_str());
            list.push(i16::from(l));
            seq.push(i32::try_from(at).unwrap_or(i32::MAX));
            body.push(b.to_string());
        };
        if let Some(start) = &r.parts.start {
            d_run.push(r.run_id.as_str());
            d_list.push(-1);
            d_from.push(0);
            for (at, b) in start.iter().enumerate() {
                add(START, at, b);
            }
        }
        for (l, entries) in GROWING.into_iter().zip(&r.parts.lists) {
            if r.parts.start.is_none() {
                d_run.push(r.run_id.as_str());
                d_list.push(i16::from(l));
                d_from.push(i32::try_from(entries.from).unwrap_or(i32::MAX));
            }
            for (i, b) in entries.entries.iter().enumerate() {
                add(l, entries.from + i, b);
            }
        }
    }
    if !d_run.is_empty() {
        tx.execute(
            "DELETE FROM checkpoint_entries e \
             USING UNNEST($1::text[], $2::int2[], $3::int4[]) AS d(run_id, list, from_seq) \
             WHERE e.run_id = d.run_id AND (d.list < 0 OR e.list = d.list) \
             AND e.seq >= d.from_seq",
            &[&d_run, &d_list, &d_from],
        )
        .await?;
    }
    for at in (0..run.len()).step_by(CHUNK) {
        let to = (at + CHUNK).min(run.len());
        tx.execute(
            "INSERT INTO checkpoint_entries (run_id, list, seq, body) \
             SELECT * FROM UNNEST($1::text[], $2::int2[], $3::int4[], $4::text[])",
            &[&&run[at..to], &&list[at..to], &&seq[at..to], &&body[at..to]],
        )
        .await?;
    }
    Ok(())
}

/// What a save found.
#[derive(Default)]
struct Saved {
    /// The positions of the rows not written: their runs are another
    /// owner's, or gone.
    lost: Vec<usize>,
    /// The positions of the rows not written because the store holds less
    /// of their runs than they keep: to be written whole.
    behind: Vec<usize>,
}

/// A row and its place in its batch.
type Placed<'a> = (usize, &'a Row);

/// Writes `rows` (run ids unique among them) under a lease (`owner` until
/// `until`), at `now`, in `tx`.
async fn write(
    tx: &Transaction<'_>,
    rows: &[Row],
    owner: &str,
    until: i64,
    now: i64,
) -> Result<Saved, tokio_postgres::Error> {
    let mut out = Saved::default();
    let mut written: Vec<&Row> = Vec::with_capacity(rows.len());
    let (first, later): (Vec<Placed>, Vec<Placed>) =
        rows.iter().enumerate().partition(|(_, r)| r.parts.first);
    for part in later.chunks(CHUNK) {
        let of: Vec<&Row> = part.iter().map(|(_, r)| *r).collect();
        let done = update_held(tx, &of, owner, until).await?;
        let missed: Vec<&str> = part
            .iter()
            .filter(|(_, r)| !done.contains(&r.run_id))
            .map(|(_, r)| r.run_id.as_str())
            .collect();
        // Of those not written, the ones `owner` still holds hold less
        // than their saves keep; locked, so they stay its own until the
        // transaction ends.
        let held: Vec<String> = if missed.is_empty() {
            Vec::new()
        } else {
            tx.query(
                "SELECT run_id FROM checkpoints WHERE run_id = ANY($1) AND owner = $2 \
                 FOR UPDATE",
                &[&missed, &owner],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect()
        };
        for (i, r) in part {
            if done.contains(&r.run_id) {
                written.push(r);
            } else if held.contains(&r.run_id) {
                out.behind.push(*i);
            } else {
                out.lost.push(*i);
            }
        }
    }
    for part in first.chunks(CHUNK) {
        let of: Vec<&Row> = part.iter().map(|(_, r)| *r).collect();
        let done = upsert_first(tx, &of, owner, until, now).await?;
        for (i, r) in part {
            if done.contains(&r.run_id) {
                written.push(r);
            } else {
                out.lost.push(*i);
            }
        }
    }
    if !written.is_empty() {
        write_entries(tx, &written).await?;
    }
    Ok(out)
}

/// Splits `checkpoints` into rounds in which each run is saved once, in
/// order (a batch that saves a run twice writes both, one after the
/// other); each item keeps its position in the batch.
fn rounds(checkpoints: &[Checkpoint]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<RunId, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (i, c) in checkpoints.iter().enumerate() {
        let n = seen.entry(c.run_id).or_insert(0);
        if rounds.len() <= *n {
            rounds.push(Vec::new());
        }
        if let Some(round) = rounds.get_mut(*n) {
            round.push(i);
        }
        *n += 1;
    }
    rounds
}

/// A `checkpoints` row as read.
struct Stored {
    run_id: String,
    state: String,
    counts: [i64; 3],
}

#[async_trait]
impl Checkpointer for PostgresStore {
    async fn save(
        &self,
        checkpoints: &[Checkpoint],
        lease: &Lease,
    ) -> Result<Vec<RunId>, CheckpointError> {
        if checkpoints.is_empty() {
            return Ok(Vec::new());
        }
        let now = unix_ms();
        let (until, now) = (to_i64(lease.until(now)), to_i64(now));
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        let mut lost = Vec::new();
        for round in rounds(checkpoints) {
            let of: Vec<&Checkpoint> = round.iter().filter_map(|&i| checkpoints.get(i)).collect();
            let rows = of
                .iter()
                .map(|c| Row::of(c, c.unchanged))
                .collect::<Result<Vec<_>, _>>()?;
            let saved = write(&tx, &rows, &lease.owner, until, now)
                .await
                .map_err(unavailable)?;
            lost.extend(
                saved
                    .lost
                    .iter()
                    .filter_map(|&i| of.get(i))
                    .map(|c| c.run_id),
            );
            // Rows that hold less than their saves keep (a save before
            // them was not written): written whole, in this transaction.
            if !saved.behind.is_empty() {
                let again: Vec<&Checkpoint> = saved
                    .behind
                    .iter()
                    .filter_map(|&i| of.get(i).copied())
                    .collect();
                let rows = again
                    .iter()
                    .map(|c| Row::of(c, Unchanged::default()))
                    .collect::<Result<Vec<_>, _>>()?;
                let saved = write(&tx, &rows, &lease.owner, until, now)
                    .await
                    .map_err(unavailable)?;
                lost.extend(
                    saved
                        .lost
                        .into_iter()
                        .chain(saved.behind)
                        .filter_map(|i| again.get(i))
                        .map(|c| c.run_id),
                );
            }
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(lost)
    }

    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        if runs.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = runs.iter().map(RunId::to_string).collect();
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        tx.execute("DELETE FROM checkpoints WHERE run_id = ANY($1)", &[&ids])
            .await
            .map_err(unavailable)?;
        tx.execute(
            "DELETE FROM checkpoint_entries WHERE run_id = ANY($1)",
            &[&ids],
        )
        .await
        .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)
    }

    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        let mut client = self.client().await.map_err(unavailable)?;
        // One snapshot for both reads: a save between them is seen by
        // both or neither.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(unavailable)?;
        let rows: Vec<Stored> = tx
            .query(
                "SELECT run_id, state, messages, steps, decisions FROM checkpoints \
                 ORDER BY updated_at, run_id",
                &[],
            )
            .await
            .map_err(unavailable)?
            .iter()
            .map(|r| Stored {
                run_id: r.get(0),
                state: r.get(1),
                counts: [2, 3, 4].map(|i| i64::from(r.get::<_, i32>(i))),
            })
            .collect();
        let mut entries: HashMap<String, Lists> = HashMap::new();
        for r in tx
            .query(
                "SELECT run_id, list, seq, body FROM checkpoint_entries \
                 ORDER BY run_id, list, seq",
                &[],
            )
            .await
            .map_err(unavailable)?
        {
            let (run_id, list, seq, body): (String, i16, i32, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            checkpoint_parts::push_entry(
                entries.entry(run_id).or_default(),
                i64::from(list),
                i64::from(seq),
                body,
            );
        }
        tx.commit().await.map_err(unavailable)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let parts = entries.remove(&row.run_id);
            match checkpoint_parts::assemble(&row.state, parts, row.counts) {
                Ok(c) => out.push(c),
                // One unreadable checkpoint must not keep every other run
                // from resuming: it is reported and left in place.
                Err(error) => {
                    tracing::error!(run_id = %row.run_id, %error, "a checkpoint does not load; skipped")
                }
            }
        }
        Ok(out)
    }

    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError> {
        let now = unix_ms();
        let (id, until, now) = (run_id.to_string(), to_i64(lease.until(now)), to_i64(now));
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        let taken = tx
            .execute(
                "UPDATE checkpoints SET owner = $2, lease_until = $3 WHERE run_id = $1 \
                 AND (owner IS NULL OR owner = $2 OR lease_until <= $4)",
                &[&id, &lease.owner, &until, &now],
            )
            .await
            .map_err(unavailable)?;
        let claim = if taken == 1 {
            Claim::Claimed
        } else {
            let holder = tx
                .query_opt(
                    "SELECT owner, lease_until FROM checkpoints WHERE run_id = $1",
                    &[&id],
                )
                .await
                .map_err(unavailable)?;
            match holder {
                Some(r) => Claim::HeldBy {
                    owner: r.get::<_, Option<String>>(0).unwrap_or_default(),
                    until_ms: to_u64(r.get(1)),
                },
                None => Claim::Missing,
            }
        };
        tx.commit().await.map_err(unavailable)?;
        Ok(claim)
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal, CheckpointError> {
        let until = to_i64(lease.until(unix_ms()));
        let owner = &lease.owner;
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        // The host lease, read locked (a take-over waits for this
        // transaction, or this read waits for it), then renewed; a row
        // another transaction made meanwhile is read again.
        let taken_over = loop {
            let prior = tx
                .query_opt(
                    "SELECT taken_over FROM host_leases WHERE owner = $1 FOR UPDATE",
                    &[owner],
                )
                .await
                .map_err(unavailable)?;
            if let Some(prior) = prior {
                tx.execute(
                    "UPDATE host_leases SET lease_until = $2, taken_over = 0 WHERE owner = $1",
                    &[owner, &until],
                )
                .await
                .map_err(unavailable)?;
                break prior.get::<_, i64>(0) != 0;
            }
            let made = tx
                .execute(
                    "INSERT INTO host_leases (owner, lease_until, taken_over) VALUES ($1, $2, 0) \
                     ON CONFLICT (owner) DO NOTHING",
                    &[owner, &until],
                )
                .await
                .map_err(unavailable)?;
            if made == 1 {
                break false;
            }
        };
        let runs = tx
            .execute(
                "UPDATE checkpoints SET lease_until = $2 WHERE owner = $1",
                &[owner, &until],
            )
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(Renewal { runs, taken_over })
    }

    async fn held_by(&self, owner: &str) -> Result<Vec<RunId>, CheckpointError> {
        let client = self.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT run_id FROM checkpoints WHERE owner = $1 ORDER BY run_id",
                &[&owner],
            )
            .await
            .map_err(unavailable)?;
        Ok(rows
            .iter()
            .filter_map(|r| r.get::<_, &str>(0).parse().ok())
            .collect())
    }

    async fn take_over_host(&self, owner: &str, gone: bool) -> Result<HostClaim, CheckpointError> {
        let now = to_i64(unix_ms());
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        let claim = loop {
            // Live: a lease not expired and not taken over since it was
            // last renewed.
            let taken = tx
                .execute(
                    "UPDATE host_leases SET taken_over = $2 WHERE owner = $1 \
                     AND (lease_until <= $2 OR taken_over <> 0 OR $3)",
                    &[&owner, &now, &gone],
                )
                .await
                .map_err(unavailable)?;
            if taken == 1 {
                break HostClaim::TakenOver;
            }
            let until = tx
                .query_opt(
                    "SELECT lease_until FROM host_leases WHERE owner = $1",
                    &[&owner],
                )
                .await
                .map_err(unavailable)?;
            if let Some(until) = until {
                break HostClaim::Live {
                    until_ms: to_u64(until.get(0)),
                };
            }
            // It holds none (released, or it never took one): a row that
            // says it was taken over, should it come back. A row it made
            // meanwhile is looked at again.
            let made = tx
                .execute(
                    "INSERT INTO host_leases (owner, lease_until, taken_over) VALUES ($1, 0, $2) \
                     ON CONFLICT (owner) DO NOTHING",
                    &[&owner, &now],
                )
                .await
                .map_err(unavailable)?;
            if made == 1 {
                break HostClaim::TakenOver;
            }
        };
        tx.commit().await.map_err(unavailable)?;
        Ok(claim)
    }

    async fn release(&self, owner: &str) -> Result<(), CheckpointError> {
        let mut client = self.client().await.map_err(unavailable)?;
        let tx = client.transaction().await.map_err(unavailable)?;
        tx.execute(
            "UPDATE checkpoints SET owner = NULL, lease_until = 0 WHERE owner = $1",
            &[&owner],
        )
        .await
        .map_err(unavailable)?;
        tx.execute("DELETE FROM host_leases WHERE owner = $1", &[&owner])
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)
    }
}
