//! Sparse per-segment indexes, kept in memory and persisted next to the
//! segment so recovery can start scanning near the end instead of at zero.
//!
//! ```text
//! .index      entries of 8 bytes:  relative_offset u32 | position u32
//! .timeindex  entries of 12 bytes: max_timestamp i64   | relative_offset u32
//! ```
//! Both are big-endian, sorted, and written whole (they are small): an entry
//! is added every `index_interval_bytes` of log, at a batch boundary.

pub const OFFSET_ENTRY_BYTES: usize = 8;
pub const TIME_ENTRY_BYTES: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub max_timestamp: i64,
    pub relative_offset: u32,
}

/// The offset and time indexes of one segment.
///
/// The time index is needed only to look up offsets by time and to
/// persist it again, so an open after a clean shutdown leaves its file
/// unread (at ten thousand partitions, a third of a cold start's disk
/// reads) and `merge_times` adds it when first needed.
#[derive(Debug, Default, Clone)]
pub struct SegmentIndex {
    pub offsets: Vec<OffsetEntry>,
    /// Time entries; while the time index file is unread, only those
    /// pushed since the open.
    pub times: Vec<TimeEntry>,
    /// While the time index file is unread: how many offset entries came
    /// from the disk (its entries are checked against the last of them).
    times_unread: Option<usize>,
}

impl SegmentIndex {
    /// Position of the last indexed batch at or before `relative_offset`.
    pub fn position_for(&self, relative_offset: u32) -> u32 {
        let at = self.offsets.partition_point(|e| e.relative_offset <= relative_offset);
        if at == 0 {
            0
        } else {
            self.offsets[at - 1].position
        }
    }

    /// Relative offset from which to scan for the first record whose timestamp
    /// is at or after `timestamp`: the last entry whose max timestamp is below it.
    pub fn scan_start_for_time(&self, timestamp: i64) -> u32 {
        debug_assert!(self.times_read());
        let at = self.times.partition_point(|e| e.max_timestamp < timestamp);
        if at == 0 {
            0
        } else {
            self.times[at - 1].relative_offset
        }
    }

    pub fn push(&mut self, offset: OffsetEntry, time: TimeEntry) {
        debug_assert!(self.offsets.last().is_none_or(|last| last.relative_offset < offset.relative_offset));
        self.offsets.push(offset);
        let time = TimeEntry {
            max_timestamp: time.max_timestamp.max(self.times.last().map_or(i64::MIN, |t| t.max_timestamp)),
            ..time
        };
        self.times.push(time);
    }

    /// Drops entries at or past `position` (after a truncation).
    pub fn truncate_to_position(&mut self, position: u32) {
        let keep = self.offsets.partition_point(|e| e.position < position);
        let cut_offset = self.offsets.get(keep).map(|e| e.relative_offset);
        self.offsets.truncate(keep);
        if let Some(cut) = cut_offset {
            let keep_times = self.times.partition_point(|e| e.relative_offset < cut);
            self.times.truncate(keep_times);
        }
    }

    pub fn encode_offsets(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.offsets.len() * OFFSET_ENTRY_BYTES);
        for e in &self.offsets {
            out.extend_from_slice(&e.relative_offset.to_be_bytes());
            out.extend_from_slice(&e.position.to_be_bytes());
        }
        out
    }

    pub fn encode_times(&self) -> Vec<u8> {
        debug_assert!(self.times_read());
        let mut out = Vec::with_capacity(self.times.len() * TIME_ENTRY_BYTES);
        for e in &self.times {
            out.extend_from_slice(&e.max_timestamp.to_be_bytes());
            out.extend_from_slice(&e.relative_offset.to_be_bytes());
        }
        out
    }

    /// Decodes persisted indexes, keeping the sorted prefix that fits within
    /// `log_bytes` (entries past the log's end are stale after a crash).
    pub fn decode(offsets: &[u8], times: &[u8], log_bytes: u64) -> Self {
        let mut index = SegmentIndex::decode_offsets(offsets, log_bytes);
        index.merge_times(times);
        index
    }

    /// Decodes the persisted offset index as `decode` does and leaves the
    /// time index unread.
    pub fn decode_offsets(offsets: &[u8], log_bytes: u64) -> Self {
        let mut index = SegmentIndex::default();
        for chunk in offsets.chunks_exact(OFFSET_ENTRY_BYTES) {
            let relative_offset = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let position = u32::from_be_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
            let sorted = index
                .offsets
                .last()
                .is_none_or(|last| last.relative_offset < relative_offset && last.position < position);
            if !sorted || u64::from(position) >= log_bytes {
                break;
            }
            index.offsets.push(OffsetEntry { relative_offset, position });
        }
        index.times_unread = Some(index.offsets.len());
        index
    }

    pub fn times_read(&self) -> bool {
        self.times_unread.is_none()
    }

    /// Adds the persisted time index (the file's content) under the entries
    /// pushed since the open, keeping its sorted prefix that the offset
    /// index read at the open covers. Returns whether every entry in the
    /// file was kept; does nothing once the file was merged.
    pub fn merge_times(&mut self, times: &[u8]) -> bool {
        let Some(from_disk) = self.times_unread.take() else { return true };
        let last_relative = from_disk.checked_sub(1).map_or(0, |last| self.offsets[last].relative_offset);
        let pushed = std::mem::take(&mut self.times);
        let mut kept_all = times.len().is_multiple_of(TIME_ENTRY_BYTES);
        for chunk in times.chunks_exact(TIME_ENTRY_BYTES) {
            let mut ts = [0u8; 8];
            ts.copy_from_slice(&chunk[..8]);
            let max_timestamp = i64::from_be_bytes(ts);
            let relative_offset = u32::from_be_bytes([chunk[8], chunk[9], chunk[10], chunk[11]]);
            let sorted = self
                .times
                .last()
                .is_none_or(|last| last.relative_offset < relative_offset && last.max_timestamp <= max_timestamp);
            if !sorted || relative_offset > last_relative {
                kept_all = false;
                break;
            }
            self.times.push(TimeEntry { max_timestamp, relative_offset });
        }
        for time in pushed {
            let max_timestamp = time.max_timestamp.max(self.times.last().map_or(i64::MIN, |t| t.max_timestamp));
            self.times.push(TimeEntry { max_timestamp, ..time });
        }
        kept_all
    }

    pub fn memory_bytes(&self) -> usize {
        self.offsets.capacity() * std::mem::size_of::<OffsetEntry>()
            + self.times.capacity() * std::mem::size_of::<TimeEntry>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SegmentIndex {
        let mut index = SegmentIndex::default();
        for i in 0..10u32 {
            index.push(
                OffsetEntry { relative_offset: i * 10, position: i * 4096 },
                TimeEntry { max_timestamp: 1000 + i64::from(i) * 100, relative_offset: i * 10 },
            );
        }
        index
    }

    #[test]
    fn lookup_finds_last_entry_at_or_before_offset() {
        let index = sample();
        assert_eq!(index.position_for(0), 0);
        assert_eq!(index.position_for(15), 4096);
        assert_eq!(index.position_for(90), 9 * 4096);
        assert_eq!(index.position_for(1000), 9 * 4096);
    }

    #[test]
    fn decode_drops_entries_past_the_log_end() {
        let index = sample();
        let decoded = SegmentIndex::decode(&index.encode_offsets(), &index.encode_times(), 5 * 4096);
        assert_eq!(decoded.offsets.len(), 5);
        assert!(decoded.times.iter().all(|t| t.relative_offset <= 40));
    }

    #[test]
    fn decode_stops_at_unsorted_garbage() {
        let index = sample();
        let mut bytes = index.encode_offsets();
        bytes[8 * 3..8 * 4].copy_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
        let decoded = SegmentIndex::decode(&bytes, &[], u64::MAX);
        assert_eq!(decoded.offsets.len(), 3);
    }

    #[test]
    fn time_index_stays_monotonic_when_timestamps_step_backwards() {
        let mut index = SegmentIndex::default();
        for (i, ts) in [1000i64, 5000, 3000, 2000, 6000].into_iter().enumerate() {
            let i = i as u32;
            index.push(
                OffsetEntry { relative_offset: i, position: i * 10 },
                TimeEntry { max_timestamp: ts, relative_offset: i },
            );
        }
        let times: Vec<i64> = index.times.iter().map(|t| t.max_timestamp).collect();
        assert_eq!(times, vec![1000, 5000, 5000, 5000, 6000]);
    }

    #[test]
    fn a_time_index_read_after_pushes_goes_under_them_and_keeps_them_sorted() {
        let index = sample();
        let (offsets, times) = (index.encode_offsets(), index.encode_times());
        let mut lazy = SegmentIndex::decode_offsets(&offsets, u64::MAX);
        assert!(!lazy.times_read() && lazy.times.is_empty());
        // Pushed before the file is read: a timestamp below the file's last.
        lazy.push(
            OffsetEntry { relative_offset: 100, position: 10 * 4096 },
            TimeEntry { max_timestamp: 1200, relative_offset: 100 },
        );
        lazy.push(
            OffsetEntry { relative_offset: 110, position: 11 * 4096 },
            TimeEntry { max_timestamp: 9000, relative_offset: 110 },
        );
        assert!(lazy.merge_times(&times));
        assert!(lazy.times_read());
        let mut expected = index.times.clone();
        expected.push(TimeEntry { max_timestamp: 1900, relative_offset: 100 });
        expected.push(TimeEntry { max_timestamp: 9000, relative_offset: 110 });
        assert_eq!(lazy.times, expected);
        assert_eq!(lazy.scan_start_for_time(1950), 100);
        // Merging again changes nothing.
        assert!(lazy.merge_times(&times));
        assert_eq!(lazy.times, expected);
        // Entries the offsets read at the open do not cover are dropped.
        let mut short = SegmentIndex::decode_offsets(&offsets[..3 * OFFSET_ENTRY_BYTES], u64::MAX);
        assert!(!short.merge_times(&times));
        assert_eq!(short.times, index.times[..3]);
    }

    #[test]
    fn time_lookup_starts_before_first_later_timestamp() {
        let index = sample();
        assert_eq!(index.scan_start_for_time(0), 0);
        assert_eq!(index.scan_start_for_time(1250), 20);
    }
}
