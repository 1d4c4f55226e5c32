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

/// Runs pruned per store call, at most.
pub(crate) const PRUNE_BATCH: usize = 1024;

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
    loop {
        match store.prune(retention, unix_ms(), PRUNE_BATCH, false).await {
            Ok(report) => {
                total += report.runs;
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
