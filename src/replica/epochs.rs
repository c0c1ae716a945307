//! The leader-epoch cache of one replica (KIP-101): for each leader epoch
//! the offset of its first batch. A leader adds its epoch when it takes
//! over, at its log end; a follower adds an epoch when the first batch of
//! it arrives. OffsetForLeaderEpoch answers from it, and a follower that
//! returns after a leader change truncates to the largest epoch it shares
//! with the leader (`truncation_offset`), never to its high watermark.
//!
//! Persisted beside the log (`leader-epochs`), replaced whole on each
//! change (rare: once per leader change); entries at or past the log end
//! are dropped at open, since a crash may have lost their batches.
//!
//! ```text
//! leader-epochs: "SLEPOCH1" | crc32 (of the rest) u32 LE | count u32 BE |
//!                count × ( epoch i32 BE | start_offset i64 BE )
//! ```

/// An epoch and the offset its first batch has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

/// Kafka's "undefined" epoch and offset in OffsetForLeaderEpoch answers.
pub const UNDEFINED_EPOCH: i32 = -1;
pub const UNDEFINED_OFFSET: i64 = -1;

/// Entries by increasing epoch and start offset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderEpochCache {
    entries: Vec<EpochEntry>,
}

pub const FILE_NAME: &str = "leader-epochs";
const MAGIC: &[u8; 8] = b"SLEPOCH1";
const ENTRY_BYTES: usize = 12;
/// More entries than any partition sees in practice (one per leader
/// change); a file claiming more is damaged.
const ENTRIES_MAX: usize = 1 << 20;

impl LeaderEpochCache {
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// Records that `epoch` starts at `start_offset`; true when that
    /// changed the cache (the caller persists it). An epoch at or below the
    /// latest changes nothing. Entries starting at or past `start_offset`
    /// belong to a log suffix this epoch replaced, and go.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> bool {
        if self.latest().is_some_and(|latest| epoch <= latest.epoch) {
            return false;
        }
        self.entries.retain(|e| e.start_offset < start_offset);
        self.entries.push(EpochEntry { epoch, start_offset });
        true
    }

    /// KIP-101: the largest epoch at or below `requested` and the offset
    /// where it ends (the start of the next larger epoch, or `log_end` for
    /// the latest); undefined when `requested` is above every epoch or the
    /// cache is empty. For `requested` below the first epoch, the first
    /// epoch's start, with `requested` (as Kafka answers).
    pub fn end_offset_for(&self, requested: i32, log_end: i64) -> (i32, i64) {
        let Some(latest) = self.latest() else { return (UNDEFINED_EPOCH, UNDEFINED_OFFSET) };
        if requested == latest.epoch {
            return (latest.epoch, log_end);
        }
        let higher = self.entries.iter().find(|e| e.epoch > requested);
        let Some(higher) = higher else { return (UNDEFINED_EPOCH, UNDEFINED_OFFSET) };
        match self.entries.iter().rev().find(|e| e.epoch <= requested) {
            Some(floor) => (floor.epoch, higher.start_offset),
            None => (requested, higher.start_offset),
        }
    }

    /// Drops the entries of batches at or past `end` (a truncated suffix);
    /// true when that changed the cache.
    pub fn truncate_from(&mut self, end: i64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end);
        self.entries.len() != before
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(4 + self.entries.len() * ENTRY_BYTES);
        body.extend_from_slice(&(self.entries.len() as u32).to_be_bytes());
        for entry in &self.entries {
            body.extend_from_slice(&entry.epoch.to_be_bytes());
            body.extend_from_slice(&entry.start_offset.to_be_bytes());
        }
        let mut out = Vec::with_capacity(MAGIC.len() + 4 + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a file; None when it is damaged (the caller starts empty and
    /// says so: a follower with no epochs truncates to its high watermark).
    pub fn decode(raw: &[u8]) -> Option<Self> {
        let rest = raw.strip_prefix(MAGIC.as_slice())?;
        let (crc, body) = rest.split_first_chunk::<4>()?;
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return None;
        }
        let (count, mut entries_raw) = body.split_first_chunk::<4>()?;
        let count = u32::from_be_bytes(*count) as usize;
        if count > ENTRIES_MAX || entries_raw.len() != count * ENTRY_BYTES {
            return None;
        }
        let mut cache = Self::default();
        while let Some((entry, rest)) = entries_raw.split_first_chunk::<ENTRY_BYTES>() {
            let epoch = i32::from_be_bytes(entry[..4].try_into().expect("4 bytes"));
            let start_offset = i64::from_be_bytes(entry[4..].try_into().expect("8 bytes"));
            let ordered = cache.latest().is_none_or(|l| l.epoch < epoch && l.start_offset <= start_offset);
            if !ordered {
                return None;
            }
            cache.entries.push(EpochEntry { epoch, start_offset });
            entries_raw = rest;
        }
        Some(cache)
    }
}

/// Where a follower truncates, given its own cache and log end and the
/// leader's answer (`leader_epoch`, `leader_end`) to OffsetForLeaderEpoch
/// for the follower's latest epoch; None when the leader's answer is
/// undefined (the caller falls back to its high watermark, as Kafka does).
/// When the leader answered an older epoch than the follower asked about,
/// the follower's own end of that epoch bounds the cut too (KIP-279), and
/// the follower asks again with its new latest epoch until the two agree.
pub fn truncation_offset(follower: &LeaderEpochCache, log_end: i64, leader_epoch: i32, leader_end: i64) -> Option<i64> {
    if leader_epoch == UNDEFINED_EPOCH || leader_end == UNDEFINED_OFFSET {
        return None;
    }
    let asked = follower.latest().map_or(UNDEFINED_EPOCH, |l| l.epoch);
    if leader_epoch == asked {
        return Some(leader_end.min(log_end));
    }
    let (_, own_end) = follower.end_offset_for(leader_epoch, log_end);
    let own_end = if own_end == UNDEFINED_OFFSET { log_end } else { own_end };
    Some(leader_end.min(own_end).min(log_end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(entries: &[(i32, i64)]) -> LeaderEpochCache {
        let mut cache = LeaderEpochCache::default();
        for (epoch, start) in entries {
            assert!(cache.assign(*epoch, *start));
        }
        cache
    }

    #[test]
    fn end_offsets_follow_kafkas_answers() {
        let epochs = cache(&[(1, 0), (3, 10), (4, 25)]);
        assert_eq!(epochs.end_offset_for(4, 40), (4, 40), "the latest epoch ends at the log end");
        assert_eq!(epochs.end_offset_for(3, 40), (3, 25));
        assert_eq!(epochs.end_offset_for(2, 40), (1, 10), "an epoch this log never had: the one below it");
        assert_eq!(epochs.end_offset_for(0, 40), (0, 0), "below the first epoch");
        assert_eq!(epochs.end_offset_for(5, 40), (UNDEFINED_EPOCH, UNDEFINED_OFFSET));
        assert_eq!(LeaderEpochCache::default().end_offset_for(1, 9), (UNDEFINED_EPOCH, UNDEFINED_OFFSET));
    }

    #[test]
    fn a_new_epoch_replaces_the_entries_of_the_suffix_it_overwrites() {
        let mut epochs = cache(&[(1, 0), (2, 10), (3, 20)]);
        assert!(!epochs.assign(3, 30), "the same epoch again changes nothing");
        assert!(!epochs.assign(2, 30), "an older epoch changes nothing");
        assert!(epochs.assign(5, 15));
        assert_eq!(
            epochs.entries(),
            &[
                EpochEntry { epoch: 1, start_offset: 0 },
                EpochEntry { epoch: 2, start_offset: 10 },
                EpochEntry { epoch: 5, start_offset: 15 }
            ]
        );
        assert!(epochs.truncate_from(10));
        assert_eq!(epochs.latest(), Some(EpochEntry { epoch: 1, start_offset: 0 }));
        assert!(!epochs.truncate_from(10));
    }

    #[test]
    fn the_file_round_trips_and_damage_is_refused() {
        let epochs = cache(&[(1, 0), (7, 1234), (9, 1 << 40)]);
        let raw = epochs.encode();
        assert_eq!(LeaderEpochCache::decode(&raw), Some(epochs));
        for at in 0..raw.len() {
            let mut bad = raw.clone();
            bad[at] ^= 0x10;
            assert_eq!(LeaderEpochCache::decode(&bad), None, "a flip at byte {at}");
        }
        assert_eq!(LeaderEpochCache::decode(&raw[..raw.len() - 1]), None);
        assert_eq!(LeaderEpochCache::decode(b""), None);
    }

    #[test]
    fn a_follower_that_led_an_epoch_the_leader_never_saw_cuts_that_epochs_batches() {
        // Leader: epochs 1 at 0, 3 at 10, log end 30. The follower led
        // epoch 2 from 8 to 14 while partitioned, and never saw epoch 3.
        let leader = cache(&[(1, 0), (3, 10)]);
        let follower = cache(&[(1, 0), (2, 8)]);
        let (epoch, end) = leader.end_offset_for(2, 30);
        assert_eq!((epoch, end), (1, 10));
        let cut = truncation_offset(&follower, 14, epoch, end).expect("defined");
        assert_eq!(cut, 8, "epoch 2's batches go, though the leader's epoch 1 ends at 10");
        // Asked again with its latest epoch, now 1: nothing more to cut.
        let mut follower = follower;
        follower.truncate_from(cut);
        let (epoch, end) = leader.end_offset_for(follower.latest().unwrap().epoch, 30);
        assert_eq!(truncation_offset(&follower, cut, epoch, end), Some(8));
    }

    #[test]
    fn a_follower_behind_in_the_same_epoch_keeps_everything() {
        let leader = cache(&[(1, 0), (3, 10)]);
        let follower = cache(&[(1, 0), (3, 10)]);
        let (epoch, end) = leader.end_offset_for(3, 30);
        assert_eq!(truncation_offset(&follower, 22, epoch, end), Some(22));
        assert_eq!(truncation_offset(&follower, 22, UNDEFINED_EPOCH, UNDEFINED_OFFSET), None);
    }
}
