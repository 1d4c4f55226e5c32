//! Background pruning (`HostConfig::retention`): a task that asks the
//! audit store, every `HostConfig::retention_every`, to prune the oldest
//! finished runs the policy no longer keeps, one small batch at a time
//! (each batch one short transaction on the store's writer, so the runs'
//! records queue behind it for milliseconds, never for a whole pass).

use std::sync::Arc;
use std::time::Duration;

use crate::ports::audit::AuditStore;
use crate::ports::retention::Retention;
use crate::ports::run::unix_ms;

/// Runs pruned per store call, to begin with.
pub(crate) const PRUNE_BATCH: usize = 1024;

/// The most runs one store call prunes: a batch that large holds the
/// writer for a few hundred milliseconds at worst.
pub(crate) const MAX_PRUNE_BATCH: usize = 32 * 1024;

/// The next batch's size: doubled (up to [`MAX_PRUNE_BATCH`]) while a pass
/// over a bytes bound makes no headway — the runs' records, which the
/// writer takes between two batches, filled at least what the last batch
/// freed — so pruning outpaces any swarm; back to [`PRUNE_BATCH`] once it
/// gains.
pub(crate) fn next_batch(batch: usize, bytes_before: u64, bytes_after: u64) -> usize {
    if bytes_after >= bytes_before {
        (batch * 2).min(MAX_PRUNE_BATCH)
    } else {
        PRUNE_BATCH
    }
}

/// The pause between two batches of one pass: the writer takes the runs'
/// batches in between.
const BETWEEN_BATCHES: Duration = Duration::from_millis(2);

/// The pruning task; stopped by [`Pruning::stop`] or when dropped.
pub(crate) struct Pruning {
    task: tokio::task::AbortHandle,
}

impl Pruning {
    /// Starts the task, if `retention` bounds anything.
    pub(crate) fn start(
        store: Arc<dyn AuditStore>,
        retention: Retention,
        every: Duration,
    ) -> Option<Pruning> {
        if !retention.is_set() {
            return None;
        }
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                prune_pass(&*store, &retention).await;
            }
        });
        Some(Pruning {
            task: task.abort_handle(),
        })
    }

    /// Stops the task (a batch being written finishes in the store).
    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Pruning {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One pass: batches until the policy is met (or a batch fails: logged,
/// tried again at the next pass).
pub(crate) async fn prune_pass(store: &dyn AuditStore, retention: &Retention) -> u64 {
    let mut total = 0;
    let mut batch = PRUNE_BATCH;
    // The bytes used after the previous batch (the next one's start, less
    // what the writer added in between).
    let mut last_after: Option<u64> = None;
    loop {
        match store.prune(retention, unix_ms(), batch, false).await {
            Ok(report) => {
                total += report.runs;
                if retention.max_bytes.is_some() {
                    let before = last_after.unwrap_or(report.bytes_before);
                    batch = next_batch(batch, before, report.bytes_after);
                    last_after = Some(report.bytes_after);
                }
                if report.runs > 0 {
                    tracing::debug!(
                        runs = report.runs,
                        records = report.records,
                        bytes_after = report.bytes_after,
                        "pruned finished runs"
                    );
                }
                if !report.more || report.runs == 0 {
                    return total;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pruning old runs failed; trying again later");
                return total;
            }
        }
        tokio::time::sleep(BETWEEN_BATCHES).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_that_makes_no_headway_prunes_more_a_batch() {
        // The bytes did not fall since the last batch: the records that
        // came in filled what it freed. Double, up to the cap.
        assert_eq!(next_batch(PRUNE_BATCH, 1_000, 1_000), 2 * PRUNE_BATCH);
        assert_eq!(next_batch(PRUNE_BATCH, 1_000, 1_200), 2 * PRUNE_BATCH);
        let mut b = PRUNE_BATCH;
        for _ in 0..10 {
            b = next_batch(b, 5_000, 5_100);
        }
        assert_eq!(b, MAX_PRUNE_BATCH);
        // Headway: back to the small batch that keeps the writer's pauses
        // short.
        assert_eq!(next_batch(MAX_PRUNE_BATCH, 5_000, 4_000), PRUNE_BATCH);
    }
}
