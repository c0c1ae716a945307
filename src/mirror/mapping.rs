//! Where each copied source record landed on the target, per partition,
//! and the offset translation built on it (checkpoints, group offset sync,
//! `shardlog group translate-offsets`).
//!
//! Every acknowledged target batch adds one [`Copied`] per source batch it
//! holds. A source batch without offset gaps, written to a batch whose
//! target offsets are contiguous, maps offset for offset (`exact`); one
//! with gaps (compaction, aborted transactions) maps conservatively, to the
//! first target offset of its batch. Translation is never ahead of the copy:
//! an offset past what was copied translates to the target's position after
//! the last copied record, so a consumer that fails over re-reads, never
//! skips.

use std::collections::VecDeque;

/// Copied batches remembered per partition for exact translation; older
/// offsets translate through the last offset sync (conservatively).
const REMEMBERED: usize = 4096;

/// One source batch (or the part of it at or after the start offset) and
/// where it went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub upstream_first: i64,
    pub upstream_last: i64,
    pub downstream_first: i64,
    pub records: i64,
    /// Source offsets contiguous and target offsets contiguous.
    pub exact: bool,
}

impl Copied {
    pub fn downstream_last(&self) -> i64 {
        self.downstream_first + self.records - 1
    }
}

#[derive(Debug, Clone, Default)]
pub struct Mapping {
    recent: VecDeque<Copied>,
    /// The latest offset sync known for the partition (from the syncs topic
    /// at start, or the latest exact batch since).
    sync: Option<(i64, i64)>,
    /// The sync known at start (translates what was copied before).
    start_sync: Option<(i64, i64)>,
    /// The next source offset to copy and the target offset it will get.
    frontier: Option<(i64, i64)>,
}

impl Mapping {
    /// Starts at `upstream` (the next source offset to copy), which will
    /// land at `downstream`; `sync` is the latest offset sync read back.
    pub fn starting(upstream: i64, downstream: i64, sync: Option<(i64, i64)>) -> Self {
        Self { recent: VecDeque::new(), sync, start_sync: sync, frontier: Some((upstream, downstream)) }
    }

    /// Records an acknowledged copy (in offset order).
    pub fn copied(&mut self, copy: Copied) {
        if copy.exact {
            self.sync = Some((copy.upstream_last, copy.downstream_last()));
        }
        self.frontier = Some((copy.upstream_last + 1, copy.downstream_first + copy.records));
        if self.recent.len() == REMEMBERED {
            self.recent.pop_front();
        }
        self.recent.push_back(copy);
    }

    /// The newest (source offset, target offset) pair that can be written
    /// as an offset sync: the last record of an exactly mapped batch.
    pub fn sync(&self) -> Option<(i64, i64)> {
        self.sync
    }

    /// The next source offset to copy and where it will land.
    pub fn frontier(&self) -> Option<(i64, i64)> {
        self.frontier
    }

    /// The target offset from which a consumer that committed `upstream` on
    /// the source reads on, missing nothing; None when it cannot be known
    /// (before anything was copied and with no sync at or below it).
    pub fn translate(&self, upstream: i64) -> Option<i64> {
        let (frontier_up, frontier_down) = self.frontier?;
        if upstream >= frontier_up {
            return Some(frontier_down);
        }
        // The first copied batch that ends at or after `upstream`.
        let at = self.recent.partition_point(|c| c.upstream_last < upstream);
        if let Some(copy) = self.recent.get(at) {
            if copy.upstream_first <= upstream && copy.exact {
                return Some(copy.downstream_first + (upstream - copy.upstream_first));
            }
            if at > 0 || copy.upstream_first <= upstream {
                // In a gap before this batch, or inside an inexact one.
                return Some(copy.downstream_first);
            }
        }
        // Older than what is remembered: MirrorMaker 2's rule, the record
        // after the sync (what is between is re-read).
        let below = [self.sync, self.start_sync].into_iter().flatten().filter(|&(up, _)| up <= upstream).max();
        match below {
            Some((up, down)) if up == upstream => Some(down),
            Some((_, down)) => Some(down + 1),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(up: (i64, i64), down: i64, records: i64) -> Copied {
        Copied {
            upstream_first: up.0,
            upstream_last: up.1,
            downstream_first: down,
            records,
            exact: up.1 - up.0 + 1 == records,
        }
    }

    #[test]
    fn contiguous_batches_translate_offset_for_offset() {
        let mut m = Mapping::starting(100, 0, None);
        m.copied(copy((100, 109), 0, 10));
        m.copied(copy((110, 119), 10, 10));
        assert_eq!(m.translate(100), Some(0));
        assert_eq!(m.translate(105), Some(5));
        assert_eq!(m.translate(119), Some(19));
        assert_eq!(m.translate(120), Some(20), "everything copied was consumed");
        assert_eq!(m.sync(), Some((119, 19)));
    }

    #[test]
    fn translation_is_never_ahead_of_the_copy() {
        let mut m = Mapping::starting(0, 50, None);
        assert_eq!(m.translate(1_000), Some(50), "nothing copied: the target's position");
        m.copied(copy((0, 9), 50, 10));
        assert_eq!(m.translate(1_000), Some(60));
    }

    #[test]
    fn gaps_translate_to_the_first_record_after_them() {
        let mut m = Mapping::starting(0, 0, None);
        m.copied(copy((0, 4), 0, 5));
        // 5..=9 were aborted or compacted away: the next batch starts at 10.
        m.copied(copy((10, 14), 5, 5));
        assert_eq!(m.translate(7), Some(5));
        // A batch with gaps inside maps to its own start.
        m.copied(Copied { upstream_first: 15, upstream_last: 30, downstream_first: 10, records: 4, exact: false });
        assert_eq!(m.translate(20), Some(10));
        assert_eq!(m.translate(31), Some(14));
        assert_eq!(m.sync(), Some((14, 9)), "an inexact batch is never a sync");
    }

    #[test]
    fn offsets_older_than_memory_use_the_sync_conservatively() {
        let m = Mapping::starting(500, 80, Some((499, 79)));
        assert_eq!(m.translate(500), Some(80));
        assert_eq!(m.translate(499), Some(79), "the synced record itself");
        assert_eq!(m.translate(10), None);
        let mut m = Mapping::starting(500, 80, Some((300, 40)));
        m.copied(copy((500, 509), 80, 10));
        assert_eq!(m.translate(400), Some(41), "the record after the sync");
    }
}
