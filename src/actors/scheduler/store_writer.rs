//! The scheduler's write-behind task: every change of a schedule's state
//! is queued here and written to the `ScheduleStore` in order, what queued
//! up meanwhile in one batch (the last state of each schedule), so the
//! scheduler's handlers never wait on the store. A flush answers once
//! everything queued before it is written.
//!
//! Back-pressure: the queue is unbounded, but each round drains it whole
//! and keeps one state per schedule, so it holds what changed while one
//! batch was written (a tick of 1 000 schedules: about 2 000 entries,
//! written as 1 000 rows). A batch that fails three times, a second apart,
//! is logged (`error`, with the count of states not written); the next
//! change of those schedules writes their whole state again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::ports::schedule::{ScheduleState, ScheduleStore};

/// A write for the write-behind task.
pub(super) enum Write {
    /// A schedule's state (replaces its row).
    Put(Box<ScheduleState>),
    /// Schedules no longer in the repository.
    Remove(Vec<String>),
    /// Answer once everything before is written.
    Flush(oneshot::Sender<()>),
}

/// Writes states in order, batching what queued up meanwhile; a failed
/// write is tried again (three times, a second apart) and then logged as
/// lost.
pub(super) async fn write_behind(
    store: Arc<dyn ScheduleStore>,
    mut rx: mpsc::UnboundedReceiver<Write>,
) {
    while let Some(first) = rx.recv().await {
        let mut ops = vec![first];
        while let Ok(op) = rx.try_recv() {
            ops.push(op);
        }
        let mut puts: BTreeMap<String, ScheduleState> = BTreeMap::new();
        let mut flushed = Vec::new();
        for op in ops {
            match op {
                Write::Put(s) => {
                    puts.insert(s.name.clone(), *s);
                }
                Write::Remove(names) => {
                    put(&*store, std::mem::take(&mut puts)).await;
                    for attempt in 1..=3 {
                        match store.remove(&names).await {
                            Ok(()) => break,
                            Err(e) if attempt == 3 => {
                                tracing::error!(error = %e, "schedule state: removing schedules failed")
                            }
                            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                        }
                    }
                }
                Write::Flush(done) => flushed.push(done),
            }
        }
        put(&*store, puts).await;
        for done in flushed {
            let _ = done.send(());
        }
    }
}

async fn put(store: &dyn ScheduleStore, puts: BTreeMap<String, ScheduleState>) {
    if puts.is_empty() {
        return;
    }
    let batch: Vec<ScheduleState> = puts.into_values().collect();
    for attempt in 1..=3 {
        match store.put_all(&batch).await {
            Ok(()) => return,
            Err(e) if attempt == 3 => {
                tracing::error!(error = %e, schedules = batch.len(), "schedule state not written")
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}
