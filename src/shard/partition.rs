//! A partition as its owning core holds it: the log plus the idempotent
//! producer state (the last sequence ranges of each producer).
//!
//! Producer state survives restarts: a snapshot (`producers` in the
//! partition directory) records the state as of some log offset; on open the
//! batches after that offset are replayed from the log. Without a usable
//! snapshot the active segment is replayed.
//!
//! Like Kafka, a snapshot is written when the replay it saves would reach
//! back past the active segment (after a roll) and at a clean shutdown, not
//! on a timer: a timer rewrote the file of every partition an idempotent
//! producer had touched, thousands of file replaces every few seconds with
//! thousands of partitions. After a kill -9 the replay reads at most the
//! active segment, which recovery scans anyway; after a clean shutdown
//! there is nothing to replay: the shutdown closes the log (its last
//! appends written and synced), then saves the snapshot as of the log's
//! end, then marks the log clean. The replay past the snapshot still runs
//! on a clean start (it reads nothing when the snapshot is current).
//!
//! A retried idempotent batch (a duplicate of one the state remembers) is
//! answered once the first attempt is done under the flush policy, as
//! Kafka's produce purgatory does: never sooner, so a retry cannot be
//! acknowledged while its first attempt waits for the disk or after it
//! failed with the log.
//!
//! ```text
//! producers: "SLPROD01" | crc32 (of the rest) u32 LE | snapshot_offset i64 BE | count u32 BE |
//!            count × ( producer_id i64 | epoch i16 | n u8 | n × (first_seq i32 | last_seq i32 | base_offset i64) )
//! ```

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

use crate::constants::PRODUCER_BATCHES_REMEMBERED;
use crate::log::Log;
use crate::protocol::record_batch::BatchHeader;
use crate::protocol::ErrorCode;
use crate::replica::epochs::{self, LeaderEpochCache};

/// Producer state as checks see it: by producer id, its epoch and the
/// (first sequence, last sequence, base offset) of its recent batches.
pub type ProducerState = BTreeMap<i64, (i16, Vec<(i32, i32, i64)>)>;

pub struct Partition {
    /// Shared with the fetch sessions' keys and change log.
    pub topic: Rc<str>,
    pub index: i32,
    pub log: Log,
    producers: RefCell<HashMap<i64, ProducerEntry>>,
    /// Producer state changed since the last snapshot.
    producers_dirty: Cell<bool>,
    /// Where a restore would start replaying: the offset of the snapshot on
    /// disk, or without one the active segment's base when the partition
    /// was opened.
    replay_from: Cell<i64>,
    /// A snapshot file exists (written or read by this partition).
    has_snapshot: Cell<bool>,
    /// One snapshot write at a time (they share a temporary file).
    snapshot_lock: glommio::sync::Semaphore,
    /// Leader or follower, the leader-epoch cache, acks=all waiters.
    pub replica: crate::replica::Replica,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ProducerEntry {
    epoch: i16,
    /// (first sequence, last sequence, base offset) of recent batches.
    batches: VecDeque<(i32, i32, i64)>,
}

/// What the producer state says about an incoming batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    Append,
    /// Already appended at this base offset: answer success, append nothing.
    Duplicate {
        base_offset: i64,
    },
}

impl Partition {
    pub fn new(topic: String, index: i32, log: Log) -> Self {
        Self {
            topic: topic.into(),
            index,
            log,
            producers: RefCell::new(HashMap::new()),
            producers_dirty: Cell::new(false),
            replay_from: Cell::new(0),
            has_snapshot: Cell::new(false),
            snapshot_lock: glommio::sync::Semaphore::new(1),
            replica: crate::replica::Replica::new(LeaderEpochCache::default()),
        }
    }

    /// Takes the replication state of the partition this one reopens: its
    /// role, leader-epoch cache and high watermark.
    pub fn adopt_replica_state(&self, from: &Partition) {
        *self.replica.role.borrow_mut() = from.replica.role.borrow().clone();
        *self.replica.epochs.borrow_mut() = from.replica.epochs.borrow().clone();
        self.log.set_high_watermark_limit(from.log.high_watermark_limit());
        from.replica.changed.notify(usize::MAX);
    }

    /// Reads the leader-epoch cache kept beside the log, without the
    /// entries of batches past the log's end (a crash lost them).
    pub async fn load_epochs(&self) {
        let path = self.log.dir().join(epochs::FILE_NAME);
        let raw = match self.log.disk().read_small_file(&path).await {
            Ok(raw) => raw,
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "reading the leader-epoch cache failed; starting without");
                None
            }
        };
        let Some(raw) = raw else { return };
        match LeaderEpochCache::decode(&raw) {
            Some(mut cache) => {
                cache.truncate_from(self.log.log_end_offset());
                *self.replica.epochs.borrow_mut() = cache;
            }
            None => tracing::warn!(path = %path.display(), "the leader-epoch cache is damaged; starting without"),
        }
    }

    /// Records that `epoch` starts at `start_offset` and persists the cache
    /// (synced) when that changed it; before a batch of a new epoch is
    /// written, so that the cache never misses an epoch the log holds.
    pub async fn assign_epoch(&self, epoch: i32, start_offset: i64) -> std::io::Result<()> {
        if !self.replica.epochs.borrow_mut().assign(epoch, start_offset) {
            return Ok(());
        }
        self.persist_epochs().await
    }

    pub async fn persist_epochs(&self) -> std::io::Result<()> {
        let encoded = self.replica.epochs.borrow().encode();
        self.log.disk().replace_file(&self.log.dir().join(epochs::FILE_NAME), encoded, true).await
    }

    /// Drops the producer snapshot (a truncation cut batches it may
    /// remember; the reopened partition rebuilds from the log).
    pub async fn forget_producer_snapshot(&self) -> std::io::Result<()> {
        self.log.disk().remove_if_present(&self.log.dir().join(SNAPSHOT_FILE)).await
    }

    /// Rebuilds producer state: the snapshot, then the batches after it.
    /// After a clean shutdown the snapshot is current (the shutdown writes
    /// it after the log's last append, as of the log's end, and marks the
    /// log clean only once it is saved), so the replay past it reads
    /// nothing; it runs all the same, so that a snapshot older than its
    /// log can never vouch for it. Without a snapshot, a clean shutdown
    /// means no idempotent batch was written since the last one.
    pub async fn restore_producers(&self, clean_shutdown: bool) -> Result<(), crate::log::LogError> {
        let snapshot = self.read_snapshot_file().await;
        self.has_snapshot.set(snapshot.is_some());
        if clean_shutdown && snapshot.is_none() {
            self.replay_from.set(self.log.active_segment_base_offset());
            return Ok(());
        }
        let (offset, mut producers) =
            snapshot.unwrap_or_else(|| (self.log.active_segment_base_offset(), HashMap::new()));
        let log_start = self.log.log_start_offset();
        if offset < log_start {
            // Retention deleted data the snapshot does not cover: what the
            // snapshot knows of a producer is older than a gap the replay
            // cannot fill. As Kafka does, forget the batches below the log
            // start (and producers left with none): a producer's next
            // batch is then taken, where a stale last sequence refused it
            // as out of order.
            for entry in producers.values_mut() {
                entry.batches.retain(|(_, _, base)| *base >= log_start);
            }
            producers.retain(|_, entry| !entry.batches.is_empty());
        }
        *self.producers.borrow_mut() = producers;
        let offset = offset.clamp(log_start, self.log.local_end_offset());
        self.replay_from.set(offset);
        self.replay_producers_from(offset).await
    }

    /// Records the sequences of every idempotent batch from `offset` to the
    /// high-water mark.
    async fn replay_producers_from(&self, mut offset: i64) -> Result<(), crate::log::LogError> {
        while offset < self.log.local_end_offset() {
            let read = self.log.read_for_replica(offset, 1 << 20).await?;
            let Some(last) = read.batches.last() else { break };
            let next = BatchHeader::parse(last, usize::MAX)?.last_offset() + 1;
            for batch in &read.batches {
                let header = BatchHeader::parse(batch, usize::MAX)?;
                if header.base_offset >= offset {
                    self.record_sequence(&header, header.base_offset);
                }
            }
            offset = next;
            glommio::yield_if_needed().await;
        }
        Ok(())
    }

    /// Writes the producer snapshot (write, then rename) at a clean
    /// shutdown, after the log is closed: if it changed, or if one exists
    /// and the log has grown past it, so that the next start replays
    /// nothing.
    pub async fn snapshot_producers(&self) -> std::io::Result<()> {
        self.write_snapshot(|partition| {
            partition.producers_dirty.get()
                || (partition.has_snapshot.get() && partition.replay_from.get() < partition.log.durable_end_offset())
        })
        .await
    }

    /// The producer state as a restore would rebuild it: each producer's
    /// epoch and remembered (first sequence, last sequence, base offset)
    /// of its recent batches, by producer id. For checks and tests.
    pub fn producer_state(&self) -> ProducerState {
        let producers = self.producers.borrow();
        producers.iter().map(|(id, entry)| (*id, (entry.epoch, entry.batches.iter().copied().collect()))).collect()
    }

    /// Rebuilds the producer state from the whole log, ignoring any
    /// snapshot: what a snapshot must agree with. For checks and tests.
    pub async fn replay_whole_log(&self) -> Result<(), crate::log::LogError> {
        self.producers.borrow_mut().clear();
        self.replay_producers_from(self.log.log_start_offset()).await
    }

    /// The snapshot on disk, if there is a valid one: its offset and the
    /// producer state it holds, as `producer_state` shows it.
    pub async fn read_snapshot(&self) -> Option<(i64, ProducerState)> {
        let (offset, producers) = self.read_snapshot_file().await?;
        let state =
            producers.into_iter().map(|(id, entry)| (id, (entry.epoch, entry.batches.into_iter().collect()))).collect();
        Some((offset, state))
    }

    /// Writes the producer snapshot if a restore would otherwise replay
    /// more than the active segment: the segment rolled since the snapshot
    /// (or since the open that rebuilt the state from the active segment).
    pub async fn snapshot_producers_if_rolled(&self) -> std::io::Result<()> {
        self.write_snapshot(|partition| {
            (partition.producers_dirty.get() || partition.has_snapshot.get())
                && partition.replay_from.get() < partition.log.active_segment_base_offset()
        })
        .await
    }

    /// Writes the first snapshot of a partition that has none, once an
    /// idempotent batch is appended to it, before that batch is answered.
    /// Without a snapshot a restore replays only the active segment, so a
    /// crash after the next roll forgot the producers of the segments
    /// before it: their retries were refused as out of order (or, with
    /// the producer forgotten, stored twice). With one, a restore replays
    /// from its offset, across segments; later ones come after rolls.
    pub async fn snapshot_producers_if_none(&self) -> std::io::Result<()> {
        self.write_snapshot(|partition| !partition.has_snapshot.get()).await
    }

    async fn write_snapshot(&self, due: impl Fn(&Self) -> bool) -> std::io::Result<()> {
        if !due(self) {
            return Ok(());
        }
        let _writing = self.snapshot_lock.acquire_permit(1).await.map_err(|e| std::io::Error::other(e.to_string()))?;
        if !due(self) {
            return Ok(());
        }
        // As of what a crash keeps: a batch appended but not yet durable
        // is left to the replay, so that if the crash loses it the producer's
        // retry is appended instead of answered as a duplicate.
        let offset = self.log.durable_end_offset();
        let encoded = encode_snapshot(offset, &self.producers.borrow());
        // Cleared first: a batch recorded while the file is written marks
        // the partition dirty again for the next snapshot.
        self.producers_dirty.set(false);
        // Synced before it takes the name: after a power loss the name
        // must not hold a torn file (the restore would then fall back to
        // the active segment alone).
        if let Err(err) = self.log.disk().replace_file(&self.log.dir().join(SNAPSHOT_FILE), encoded, true).await {
            self.producers_dirty.set(true);
            return Err(err);
        }
        self.has_snapshot.set(true);
        self.replay_from.set(offset);
        Ok(())
    }

    /// The snapshot on disk, decoded; `None` without a valid one.
    async fn read_snapshot_file(&self) -> Option<(i64, HashMap<i64, ProducerEntry>)> {
        let raw = self.log.disk().read_small_file(&self.log.dir().join(SNAPSHOT_FILE)).await.ok()??;
        decode_snapshot(&raw)
    }

    /// Checks an idempotent batch against the producer's recent sequences.
    pub fn check_sequence(&self, header: &BatchHeader) -> Result<SequenceCheck, ErrorCode> {
        if header.producer_id < 0 {
            return Ok(SequenceCheck::Append);
        }
        let producers = self.producers.borrow();
        let Some(entry) = producers.get(&header.producer_id) else {
            return Ok(SequenceCheck::Append);
        };
        check(entry, header)
    }

    /// Records an appended idempotent batch.
    pub fn record_sequence(&self, header: &BatchHeader, base_offset: i64) {
        if header.producer_id < 0 || header.base_sequence < 0 {
            return;
        }
        self.producers_dirty.set(true);
        let mut producers = self.producers.borrow_mut();
        let entry = producers.entry(header.producer_id).or_default();
        if header.producer_epoch != entry.epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        let last_sequence = header.base_sequence.wrapping_add(header.last_offset_delta);
        entry.batches.push_back((header.base_sequence, last_sequence, base_offset));
        while entry.batches.len() > PRODUCER_BATCHES_REMEMBERED {
            entry.batches.pop_front();
        }
    }
}

const SNAPSHOT_FILE: &str = "producers";
const SNAPSHOT_MAGIC: &[u8; 8] = b"SLPROD01";

fn encode_snapshot(offset: i64, producers: &HashMap<i64, ProducerEntry>) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&offset.to_be_bytes());
    body.extend_from_slice(&(producers.len() as u32).to_be_bytes());
    for (producer_id, entry) in producers {
        body.extend_from_slice(&producer_id.to_be_bytes());
        body.extend_from_slice(&entry.epoch.to_be_bytes());
        let kept: Vec<_> = entry.batches.iter().filter(|(_, _, base)| *base < offset).collect();
        body.push(kept.len() as u8);
        for (first, last, base) in kept {
            body.extend_from_slice(&first.to_be_bytes());
            body.extend_from_slice(&last.to_be_bytes());
            body.extend_from_slice(&base.to_be_bytes());
        }
    }
    let mut out = SNAPSHOT_MAGIC.to_vec();
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn decode_snapshot(raw: &[u8]) -> Option<(i64, HashMap<i64, ProducerEntry>)> {
    let rest = raw.strip_prefix(SNAPSHOT_MAGIC)?;
    let (crc, body) = rest.split_at_checked(4)?;
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let out = body.get(at..at + n)?;
        at += n;
        Some(out)
    };
    let offset = i64::from_be_bytes(take(8)?.try_into().ok()?);
    let count = u32::from_be_bytes(take(4)?.try_into().ok()?);
    let mut producers = HashMap::new();
    for _ in 0..count {
        let producer_id = i64::from_be_bytes(take(8)?.try_into().ok()?);
        let epoch = i16::from_be_bytes(take(2)?.try_into().ok()?);
        let n = take(1)?[0] as usize;
        let mut batches = VecDeque::with_capacity(n.min(PRODUCER_BATCHES_REMEMBERED));
        for _ in 0..n {
            let first = i32::from_be_bytes(take(4)?.try_into().ok()?);
            let last = i32::from_be_bytes(take(4)?.try_into().ok()?);
            let base = i64::from_be_bytes(take(8)?.try_into().ok()?);
            batches.push_back((first, last, base));
        }
        producers.insert(producer_id, ProducerEntry { epoch, batches });
    }
    Some((offset, producers))
}

fn check(entry: &ProducerEntry, header: &BatchHeader) -> Result<SequenceCheck, ErrorCode> {
    if header.producer_epoch < entry.epoch {
        return Err(ErrorCode::InvalidProducerEpoch);
    }
    if header.producer_epoch > entry.epoch {
        // A bumped epoch starts over at sequence 0.
        return if header.base_sequence == 0 {
            Ok(SequenceCheck::Append)
        } else {
            Err(ErrorCode::OutOfOrderSequenceNumber)
        };
    }
    let last_sequence = header.base_sequence.wrapping_add(header.last_offset_delta);
    if let Some((_, _, base_offset)) =
        entry.batches.iter().find(|(first, last, _)| *first == header.base_sequence && *last == last_sequence)
    {
        return Ok(SequenceCheck::Duplicate { base_offset: *base_offset });
    }
    match entry.batches.back() {
        Some((_, last, _)) if header.base_sequence == last.wrapping_add(1) => Ok(SequenceCheck::Append),
        None => Ok(SequenceCheck::Append),
        _ => Err(ErrorCode::OutOfOrderSequenceNumber),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(producer_epoch: i16, base_sequence: i32, count: i32) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            size_bytes: 100,
            leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: 7,
            producer_epoch,
            base_sequence,
            record_count: count,
        }
    }

    fn entry_after(batches: &[(i16, i32, i32, i64)]) -> ProducerEntry {
        let mut entry = ProducerEntry::default();
        for (epoch, seq, count, offset) in batches {
            entry.epoch = *epoch;
            entry.batches.push_back((*seq, seq + count - 1, *offset));
        }
        entry
    }

    #[test]
    fn next_sequence_appends_and_a_repeat_is_a_duplicate() {
        let entry = entry_after(&[(0, 0, 3, 100), (0, 3, 2, 103)]);
        assert_eq!(check(&entry, &header(0, 5, 1)), Ok(SequenceCheck::Append));
        assert_eq!(check(&entry, &header(0, 3, 2)), Ok(SequenceCheck::Duplicate { base_offset: 103 }));
    }

    #[test]
    fn snapshot_round_trips_and_rejects_corruption() {
        let mut producers = HashMap::new();
        producers.insert(7, entry_after(&[(2, 0, 3, 100), (2, 3, 2, 103)]));
        let encoded = encode_snapshot(105, &producers);
        assert_eq!(decode_snapshot(&encoded), Some((105, producers)));
        let mut broken = encoded.clone();
        let last = broken.len() - 1;
        broken[last] ^= 1;
        assert_eq!(decode_snapshot(&broken), None);
        assert_eq!(decode_snapshot(&encoded[..10]), None);
    }

    #[test]
    fn snapshot_leaves_batches_at_or_past_its_offset_to_the_replay() {
        let mut producers = HashMap::new();
        producers.insert(7, entry_after(&[(2, 0, 3, 100), (2, 3, 2, 103)]));
        let (offset, decoded) = decode_snapshot(&encode_snapshot(103, &producers)).unwrap();
        assert_eq!(offset, 103);
        assert_eq!(decoded[&7], entry_after(&[(2, 0, 3, 100)]));
    }

    #[test]
    fn gap_is_out_of_order_and_old_epoch_is_fenced() {
        let entry = entry_after(&[(1, 0, 3, 100)]);
        assert_eq!(check(&entry, &header(1, 7, 1)), Err(ErrorCode::OutOfOrderSequenceNumber));
        assert_eq!(check(&entry, &header(0, 3, 1)), Err(ErrorCode::InvalidProducerEpoch));
        assert_eq!(check(&entry, &header(2, 0, 1)), Ok(SequenceCheck::Append));
        assert_eq!(check(&entry, &header(2, 4, 1)), Err(ErrorCode::OutOfOrderSequenceNumber));
    }
}
