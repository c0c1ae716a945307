//! `--verify`: every record carries a sequence number per producer and
//! partition. The consumer that owns a partition checks each stream as it
//! reads it; at the end the producers' counts say what should have arrived.
//! Pure bookkeeping, no I/O: consumers feed sequences, the report asks for
//! the counts.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

/// One stream: a producer's records in one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    pub producer: u32,
    pub partition: i32,
}

/// What one consumer saw of one stream.
#[derive(Debug, Clone, Default)]
pub struct SequenceCheck {
    /// One past the highest sequence seen.
    next: u64,
    /// Sequences skipped so far, as ranges start -> end (exclusive).
    gaps: BTreeMap<u64, u64>,
    pub received: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

impl SequenceCheck {
    pub fn observe(&mut self, sequence: u64) {
        self.received += 1;
        if sequence == self.next {
            self.next += 1;
        } else if sequence > self.next {
            self.gaps.insert(self.next, sequence);
            self.next = sequence + 1;
        } else if self.fill_gap(sequence) {
            self.reordered += 1;
        } else {
            self.duplicated += 1;
        }
    }

    /// Takes `sequence` out of a gap; false when it was not missing (a duplicate).
    fn fill_gap(&mut self, sequence: u64) -> bool {
        let Some((&start, &end)) = self.gaps.range(..=sequence).next_back() else {
            return false;
        };
        if sequence >= end {
            return false;
        }
        self.gaps.remove(&start);
        if start < sequence {
            self.gaps.insert(start, sequence);
        }
        if sequence + 1 < end {
            self.gaps.insert(sequence + 1, end);
        }
        true
    }

    /// Sequences below `sent` never seen, not counting those the broker
    /// refused (`failed`), which were never meant to arrive.
    pub fn lost(&self, sent: u64, failed: &[Range<u64>]) -> u64 {
        let mut missing: Vec<Range<u64>> = self.gaps.iter().map(|(&start, &end)| start..end.min(sent)).collect();
        missing.push(self.next..sent);
        missing.iter().filter(|r| r.start < r.end).map(|r| r.end - r.start - overlap(r, failed)).sum()
    }

    /// Distinct sequences seen.
    pub fn unique(&self) -> u64 {
        self.received - self.duplicated
    }

    /// Merges what two consumers saw of one stream (a partition read twice).
    fn merge(&mut self, other: &SequenceCheck) {
        self.received += other.received;
        self.duplicated += other.duplicated;
        self.reordered += other.reordered;
        self.next = self.next.max(other.next);
    }
}

fn overlap(range: &Range<u64>, failed: &[Range<u64>]) -> u64 {
    failed.iter().map(|f| range.end.min(f.end).saturating_sub(range.start.max(f.start))).sum()
}

/// What the producers say they sent, per stream.
#[derive(Debug, Clone, Default)]
pub struct SentStream {
    /// Sequences 0..sent were made.
    pub sent: u64,
    /// Ranges the broker answered with an error (not expected to arrive).
    pub failed: Vec<Range<u64>>,
}

/// The verdict over all streams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyCounts {
    pub streams: u64,
    /// Records sent and not refused by the broker.
    pub expected: u64,
    /// Distinct records received.
    pub received: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Records the broker refused with an error (not counted as lost).
    pub refused: u64,
}

impl VerifyCounts {
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.reordered == 0
    }
}

/// Compares what was sent with what the consumers saw.
pub fn verdict(sent: &HashMap<StreamId, SentStream>, seen: &[HashMap<StreamId, SequenceCheck>]) -> VerifyCounts {
    let mut merged: HashMap<StreamId, SequenceCheck> = HashMap::new();
    for checks in seen {
        for (id, check) in checks {
            match merged.get_mut(id) {
                Some(existing) => existing.merge(check),
                None => {
                    merged.insert(*id, check.clone());
                }
            }
        }
    }
    let mut counts = VerifyCounts::default();
    let empty = SequenceCheck::default();
    for (id, stream) in sent {
        let check = merged.get(id).unwrap_or(&empty);
        let refused: u64 = stream.failed.iter().map(|r| r.end - r.start).sum();
        counts.streams += 1;
        counts.expected += stream.sent - refused;
        counts.refused += refused;
        counts.lost += check.lost(stream.sent, &stream.failed);
    }
    for check in merged.values() {
        counts.received += check.unique();
        counts.duplicated += check.duplicated;
        counts.reordered += check.reordered;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(sequences: &[u64]) -> SequenceCheck {
        let mut check = SequenceCheck::default();
        for &s in sequences {
            check.observe(s);
        }
        check
    }

    #[test]
    fn in_order_stream_has_nothing_missing() {
        let c = check(&[0, 1, 2, 3]);
        assert_eq!((c.received, c.duplicated, c.reordered, c.lost(4, &[])), (4, 0, 0, 0));
    }

    #[test]
    fn a_gap_that_is_never_filled_is_lost() {
        let c = check(&[0, 1, 4, 5]);
        assert_eq!(c.lost(6, &[]), 2);
        assert_eq!(c.lost(8, &[]), 4, "the tail that never came is lost too");
    }

    #[test]
    fn a_late_arrival_is_reordered_not_lost() {
        let c = check(&[0, 2, 1, 3]);
        assert_eq!((c.reordered, c.duplicated, c.lost(4, &[])), (1, 0, 0));
    }

    #[test]
    fn a_repeat_is_duplicated() {
        let c = check(&[0, 1, 1, 2, 0]);
        assert_eq!((c.duplicated, c.reordered, c.unique()), (2, 0, 3));
    }

    #[test]
    fn refused_ranges_are_not_lost() {
        let c = check(&[0, 1, 5, 6]);
        let refused = std::ops::Range { start: 2, end: 5 };
        assert_eq!(c.lost(7, std::slice::from_ref(&refused)), 0);
        assert_eq!(c.lost(9, &[2..4, 7..9]), 1);
    }

    #[test]
    fn verdict_sums_streams_and_merges_consumers() {
        let a = StreamId { producer: 0, partition: 0 };
        let b = StreamId { producer: 1, partition: 0 };
        let sent = HashMap::from([
            (a, SentStream { sent: 3, failed: vec![] }),
            (b, SentStream { sent: 2, failed: Vec::from([std::ops::Range { start: 1, end: 2 }]) }),
        ]);
        let seen = vec![HashMap::from([(a, check(&[0, 1, 2])), (b, check(&[0]))])];
        let counts = verdict(&sent, &seen);
        assert_eq!(
            counts,
            VerifyCounts { streams: 2, expected: 4, received: 4, lost: 0, duplicated: 0, reordered: 0, refused: 1 }
        );
        assert!(counts.ok());
        let seen = vec![HashMap::from([(a, check(&[0, 2]))])];
        let counts = verdict(&sent, &seen);
        assert_eq!(counts.lost, 2);
        assert!(!counts.ok());
    }
}
