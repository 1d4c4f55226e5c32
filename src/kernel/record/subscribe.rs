//! One subscriber's view of a run's events: the run's past read from the
//! audit store, then its live events, with no gap and no duplicate, and a
//! `lagged` notice and a catch-up from the store for a subscriber that falls
//! behind its bounded buffer.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::stream::{self, Stream};
use tokio::sync::{mpsc, oneshot};

use super::{terminal_events, Command, RunShared};
use crate::ports::audit::{AuditEntry, AuditStore};
use crate::ports::event::{Event, RunEvent};
use crate::ports::run::RunId;

/// How long a catching-up subscriber waits for the run's records to be
/// written before it reads the store anyway.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(5);

/// A subscription's state between events.
struct SubState {
    shared: Arc<RunShared>,
    buffer: usize,
    /// The next `seq` the subscriber has not seen.
    cursor: u32,
    /// Events read from the store, waiting to be handed out.
    backlog: std::collections::VecDeque<Event>,
    live: Option<(mpsc::Receiver<Event>, Arc<OnceLock<u32>>)>,
    /// The live stream's first `seq`: live events before it are dropped
    /// (the store gave them).
    head: u32,
    ended: bool,
    /// Joined (again) at `head`, the run ended or not: the store is read
    /// for what came before, at the next read.
    joined: Option<(u32, bool)>,
}

/// A run's events, in order, for one subscriber: what the run recorded
/// before the subscriber joined (read from the audit store), then the live
/// events. Bounded: a subscriber that falls [`SUBSCRIBER_BUFFER`] events
/// behind gets a `lagged` event with the `seq` it resumes from, and catches
/// up from the store. Ends after the run's terminal events.
pub(crate) fn subscribe(
    shared: Arc<RunShared>,
    from_seq: u32,
    buffer: usize,
) -> Pin<Box<dyn Stream<Item = Event> + Send>> {
    // Joined now, not at the first read: what the run does from here on is
    // live, what it did before comes from the store.
    let (rx, lagged, head, ended) = shared.attach(buffer);
    let st = SubState {
        shared,
        buffer,
        cursor: from_seq,
        backlog: Default::default(),
        live: (!ended).then_some((rx, lagged)),
        head,
        ended: false,
        joined: Some((head, ended)),
    };
    Box::pin(stream::unfold(st, |mut st| async move {
        let ev = next_event(&mut st).await?;
        Some((ev, st))
    }))
}

async fn next_event(st: &mut SubState) -> Option<Event> {
    loop {
        if let Some((head, ended)) = st.joined.take() {
            if st.cursor < head || ended {
                catch_up(st, head, ended).await;
            }
            if ended {
                st.ended = true;
            }
            continue;
        }
        if let Some(ev) = st.backlog.pop_front() {
            st.cursor = st.cursor.max(next_cursor(&ev));
            return Some(ev);
        }
        if st.ended {
            return None;
        }
        let Some((rx, lagged)) = &mut st.live else {
            // Re-join after a lag: live from `head`, the store before it.
            let (rx, lagged, head, ended) = st.shared.attach(st.buffer);
            st.head = head;
            st.joined = Some((head, ended));
            if !ended {
                st.live = Some((rx, lagged));
            }
            continue;
        };
        match rx.recv().await {
            Some(ev) => {
                // A child's events (forwarded live) have the child's seqs.
                let is_record = ev.run_id == st.shared.run_id
                    && !matches!(ev.event, RunEvent::TextDelta { .. });
                if is_record && ev.seq < st.head.max(st.cursor) {
                    continue;
                }
                if is_record {
                    st.cursor = next_cursor(&ev);
                }
                return Some(ev);
            }
            None => {
                let lag = lagged.get().copied();
                st.live = None;
                match lag {
                    Some(resume_from) => {
                        st.cursor = st.cursor.min(resume_from);
                        return Some(Event {
                            run_id: st.shared.run_id,
                            parent_run_id: st.shared.parent_run_id,
                            seq: resume_from,
                            event: RunEvent::Lagged { resume_from },
                        });
                    }
                    None => {
                        st.ended = true;
                    }
                }
            }
        }
    }
}

/// The events of a run that has ended, from record `from_seq` on, read from
/// the audit store (`None`: no record of the run is on file). The stream
/// ends after `run.end`.
pub(crate) async fn stored_events(
    store: &dyn AuditStore,
    run_id: RunId,
    from_seq: u32,
) -> Result<Option<Vec<Event>>, crate::ports::audit::AuditStoreError> {
    let records = store.run_records(run_id).await?;
    if records.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    let mut parent_run_id = None;
    for r in records {
        if let AuditEntry::RunStarted(info) = &r.entry {
            parent_run_id = info.parent_run_id;
            continue;
        }
        if r.seq < from_seq {
            continue;
        }
        let events = match r.entry {
            AuditEntry::Event(ev) => vec![ev],
            AuditEntry::Terminal(res) => terminal_events(&res),
            AuditEntry::RunStarted(_) | AuditEntry::Publish(_) => continue,
        };
        out.extend(events.into_iter().map(|event| Event {
            run_id,
            parent_run_id,
            seq: r.seq,
            event,
        }));
    }
    Ok(Some(out))
}

/// The first `seq` a subscriber has not seen after `ev`: the next one,
/// except after a terminal `error`, whose `run.end` shares its record.
fn next_cursor(ev: &Event) -> u32 {
    match ev.event {
        RunEvent::Error { .. } => ev.seq,
        _ => ev.seq.saturating_add(1),
    }
}

/// Reads the run's records `[cursor, head)` from the store (all of them
/// when the run has ended) into the backlog, once the run's shard and the
/// audit actor have written what the run made so far.
async fn catch_up(st: &mut SubState, head: u32, ended: bool) {
    let shared = &st.shared;
    if ended {
        // Its result is delivered once its terminal record is written.
        let _ = tokio::time::timeout(BARRIER_TIMEOUT, shared.result()).await;
    } else {
        let (tx, rx) = oneshot::channel();
        shared.command(Command::Barrier(tx));
        let _ = tokio::time::timeout(BARRIER_TIMEOUT, rx).await;
    }
    let records = match shared.host.store.run_records(shared.run_id).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(run_id = %shared.run_id, error = %e, "a subscriber could not read the run's records");
            Vec::new()
        }
    };
    for r in records {
        if r.seq < st.cursor || (!ended && r.seq >= head) {
            continue;
        }
        let events = match r.entry {
            AuditEntry::Event(ev) => vec![ev],
            AuditEntry::Terminal(res) => terminal_events(&res),
            AuditEntry::RunStarted(_) | AuditEntry::Publish(_) => continue,
        };
        for event in events {
            st.backlog.push_back(Event {
                run_id: shared.run_id,
                parent_run_id: shared.parent_run_id,
                seq: r.seq,
                event,
            });
        }
    }
    if ended && st.backlog.is_empty() {
        // Nothing on record (an in-memory store that was not kept): end
        // with the delivered result, if any.
        if let Some(res) = shared.delivered() {
            let seq = shared.last_seq();
            for event in terminal_events(&res) {
                st.backlog.push_back(Event {
                    run_id: shared.run_id,
                    parent_run_id: shared.parent_run_id,
                    seq,
                    event,
                });
            }
        }
    }
}
