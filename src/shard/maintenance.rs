//! A core's upkeep: interval fsyncs, retention, reopening logs that failed
//! for a full disk, and the clean shutdown.

use std::rc::{Rc, Weak};
use std::time::Duration;

use futures::StreamExt;

use super::partition::Partition;
use super::Shard;
use super::PARTITION_OPEN_CONCURRENCY;
use crate::log::Log;

impl Shard {
    /// Stops accepting, lets in-flight requests finish (bounded), then
    /// closes every log cleanly.
    pub async fn shutdown(&self) {
        self.shutting_down.set(true);
        self.shutdown_event.notify(usize::MAX);
        for _ in 0..200 {
            if self.in_flight_requests.get() == 0 {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        let partitions: Vec<Rc<Partition>> = self.partitions.borrow().values().cloned().collect();
        // Closing is a write, a trim and an fdatasync per log: many at once.
        // The order makes the next start trust only what is whole: the log
        // is closed first (its last appends written and synced), then the
        // producer snapshot is saved as of its final end, and only then is
        // the log marked clean. A snapshot taken before the close missed
        // the batches still being written, and the clean start that
        // trusted it rejected the producer's next sequence.
        let closing = futures::stream::iter(partitions)
            .map(|partition| async move {
                let (topic, index) = (&partition.topic, partition.index);
                if let Err(err) = partition.log.close_unmarked().await {
                    tracing::error!(%topic, partition = index, error = %err, "closing log failed");
                    return;
                }
                if let Err(err) = partition.snapshot_producers().await {
                    tracing::error!(%topic, partition = index, error = %err, "writing producer snapshot failed; the next start replays the log");
                    return;
                }
                if let Err(err) = partition.log.mark_clean() {
                    tracing::error!(%topic, partition = index, error = %err, "marking the log clean failed; the next start scans it");
                }
            })
            .buffer_unordered(PARTITION_OPEN_CONCURRENCY);
        closing.collect::<()>().await;
    }

    /// Background upkeep: interval fsyncs, retention checks, reopening
    /// logs failed for a full disk.
    ///
    /// Walking every partition is the cost here: at ten thousand partitions
    /// a walk of all of them held the core for 1 ms (6 ms with retention),
    /// long enough to show in the produce p99, and glommio's preemption
    /// does not come within it. So the walk is spread out: each tick visits
    /// its share of the partitions, and a cycle of `TICKS_PER_CYCLE` ticks
    /// visits them all (failed logs, the set of logs with an interval
    /// flush); every `CYCLES_PER_RETENTION`th cycle also applies retention
    /// and writes the producer snapshots of logs that rolled. Each tick
    /// syncs the logs the last cycle found with an interval flush.
    pub async fn run_maintenance(self: Rc<Self>) {
        let mut cycle: u64 = 0;
        let mut visited = 0usize;
        let mut interval_flushed: Vec<Weak<Partition>> = Vec::new();
        let mut found: Vec<Weak<Partition>> = Vec::new();
        while !self.shutting_down.get() {
            glommio::timer::sleep(MAINTENANCE_TICK).await;
            let now = crate::log::now_ms();
            for partition in interval_flushed.iter().filter_map(Weak::upgrade) {
                if self.shutting_down.get() {
                    return;
                }
                sync_if_interval_due(&partition.log, now).await;
            }
            let (share, count) = {
                let partitions = self.partitions.borrow();
                let count = partitions.len();
                let share: Vec<Rc<Partition>> =
                    partitions.values().skip(visited).take(count.div_ceil(TICKS_PER_CYCLE)).cloned().collect();
                (share, count)
            };
            let retention = cycle.is_multiple_of(CYCLES_PER_RETENTION);
            visited += share.len();
            for partition in share {
                if self.shutting_down.get() {
                    return;
                }
                let log = &partition.log;
                if log.is_failed() {
                    // Only a full disk heals by itself; an EIO keeps the log
                    // stopped (reads still served) until an operator restarts.
                    if log.failed_for_space() {
                        self.reopen(&partition).await;
                    }
                    continue;
                }
                if sync_if_interval_due(log, now).await {
                    found.push(Rc::downgrade(&partition));
                }
                if retention {
                    let log_start = log.log_start_offset();
                    let _ = log.enforce_retention(now).await;
                    if log.log_start_offset() != log_start {
                        self.readable_changed(&partition);
                    }
                    let _ = partition.snapshot_producers_if_rolled().await;
                }
            }
            if visited >= count {
                visited = 0;
                cycle += 1;
                interval_flushed = std::mem::take(&mut found);
            }
        }
    }

    /// Replaces a failed log by reopening it from disk (recovery keeps what
    /// was durably written; the failed appends were never acknowledged).
    async fn reopen(&self, failed: &Rc<Partition>) {
        let key = (failed.topic.to_string(), failed.index);
        let config = failed.log.config();
        // The failed log lets go of its files first: no write of its may
        // land after the new log's recovery has cut the file.
        if let Err(err) = failed.log.close_unmarked().await {
            tracing::debug!(topic = %key.0, partition = key.1, error = %err, "closing a failed log before reopening it");
        }
        match Log::open(failed.log.dir().to_path_buf(), config).await {
            Ok((log, report)) => {
                let partition = Rc::new(Partition::new(key.0.clone(), key.1, log));
                partition.adopt_replica_state(failed);
                if let Err(err) = partition.restore_producers(report.clean_shutdown).await {
                    tracing::error!(topic = %key.0, partition = key.1, error = %err, "reopened log unreadable");
                    return;
                }
                tracing::warn!(topic = %key.0, partition = key.1, truncated_bytes = report.truncated_bytes, "reopened a failed log");
                let still_same = self.partitions.borrow().get(&key.0, key.1).is_some_and(|p| Rc::ptr_eq(p, failed));
                if still_same {
                    self.partitions.borrow_mut().insert(partition);
                }
            }
            Err(err) => {
                tracing::error!(topic = %key.0, partition = key.1, error = %err, "reopening a failed log failed")
            }
        }
    }
}

/// How often the maintenance task wakes (the finest interval flush it
/// serves on time).
const MAINTENANCE_TICK: Duration = Duration::from_millis(50);

/// Ticks in which every partition is visited once: a log that failed for a
/// full disk is retried, and a partition whose flush policy became an
/// interval starts being synced, within a cycle (1 s).
const TICKS_PER_CYCLE: usize = 20;

/// Retention and producer snapshots every this many cycles (5 s).
const CYCLES_PER_RETENTION: u64 = 5;

/// Syncs `log` when its policy is an interval that is due at `now`; true
/// when its policy is an interval (due or not).
async fn sync_if_interval_due(log: &Log, now: u64) -> bool {
    let crate::log::FlushPolicy::IntervalMs(ms) = log.config().flush else { return false };
    if log.needs_sync() && now % ms.max(1) < MAINTENANCE_TICK.as_millis() as u64 {
        let _ = log.sync().await;
    }
    true
}
