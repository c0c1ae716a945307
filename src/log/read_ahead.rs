//! Read-ahead for consumers reading from disk. O_DIRECT bypasses the page
//! cache and with it the kernel's read-ahead, so a consumer catching up
//! would wait for every disk read in turn: the broker reads, sends, and
//! only when the consumer asks again reads the next part. Instead, when a
//! read has to go to a log's disk, the log starts reading the next chunk
//! (as much as that read asked for) in the background; the consumer's next
//! fetch finds it in memory and starts the one after, so the disk read of
//! one fetch overlaps the transfer of the one before.
//!
//! Memory: every chunk, read or in flight, is charged to one budget per
//! core, and no read-ahead starts beyond it. A chunk leaves when a read
//! asks for an offset past it, when its log closes, or after
//! `READ_AHEAD_TTL` (a consumer that went away).

use std::cell::Cell;
use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use event_listener::Event;

use crate::protocol::record_batch::BatchHeader;

/// Read-ahead memory of one core, chunks in flight included.
pub const READ_AHEAD_BYTES_MAX: usize = 128 << 20;
/// An unread chunk is dropped this long after it was read.
pub(super) const READ_AHEAD_TTL: Duration = Duration::from_secs(10);
/// A read-ahead reads as much as the read before it asked for, within these.
const CHUNK_BYTES_MIN: usize = 64 << 10;
const CHUNK_BYTES_MAX: usize = 4 << 20;

thread_local! {
    static CHARGED: Cell<usize> = const { Cell::new(0) };
}

/// Bytes read ahead (or being read) by all the logs of the calling thread.
pub fn core_read_ahead_bytes() -> usize {
    CHARGED.with(Cell::get)
}

/// The size of the read-ahead that follows a read of `max_bytes`.
pub(super) fn chunk_bytes(max_bytes: usize) -> usize {
    max_bytes.clamp(CHUNK_BYTES_MIN, CHUNK_BYTES_MAX)
}

/// Bytes charged to the core's read-ahead budget, given back on drop.
pub(super) struct Charge(usize);

impl Charge {
    fn try_new(bytes: usize) -> Option<Self> {
        CHARGED.with(|charged| {
            let now = charged.get();
            (now + bytes <= READ_AHEAD_BYTES_MAX).then(|| {
                charged.set(now + bytes);
                Charge(bytes)
            })
        })
    }

    fn set(&mut self, bytes: usize) {
        CHARGED.with(|charged| charged.set(charged.get() - self.0 + bytes));
        self.0 = bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        CHARGED.with(|charged| charged.set(charged.get() - self.0));
    }
}

struct ChunkBatch {
    base_offset: i64,
    last_offset: i64,
    data: Bytes,
}

struct Chunk {
    id: u64,
    /// The offset the read-ahead started at.
    start: i64,
    /// The offset after its last batch.
    end: i64,
    batches: Vec<ChunkBatch>,
    _charge: Charge,
}

/// One log's read-ahead: chunks read, in offset order, and the read in flight.
#[derive(Default)]
pub(super) struct ReadAhead {
    chunks: VecDeque<Chunk>,
    /// The start offset of the read-ahead in flight.
    in_flight: Option<i64>,
    next_id: u64,
    closed: bool,
    /// Notified when the read in flight completes.
    pub done: Event,
}

/// What a read found in the read-ahead.
pub(super) struct Taken {
    pub batches: Vec<Bytes>,
    /// Where the next read-ahead should start, when one should.
    pub read_next: Option<i64>,
}

impl ReadAhead {
    /// True when the read-ahead in flight starts at `offset`: a read of it
    /// should wait rather than read the same bytes again.
    pub fn in_flight_at(&self, offset: i64) -> bool {
        self.in_flight == Some(offset)
    }

    /// Whole batches from `offset` when a chunk holds it: at most
    /// `max_bytes` (at least one batch), none at or past `high_watermark`.
    /// Chunks wholly before `offset` are dropped first.
    pub fn take(&mut self, offset: i64, max_bytes: usize, high_watermark: i64) -> Option<Taken> {
        while self.chunks.front().is_some_and(|c| c.end <= offset) {
            self.chunks.pop_front();
        }
        let first = self.chunks.front()?;
        if first.start > offset {
            return None;
        }
        let mut batches = Vec::new();
        let mut bytes = 0usize;
        let mut expect = first.start;
        'chunks: for chunk in &self.chunks {
            if chunk.start > expect {
                break;
            }
            for batch in &chunk.batches {
                if batch.last_offset < offset {
                    continue;
                }
                if batch.base_offset >= high_watermark || (!batches.is_empty() && bytes + batch.data.len() > max_bytes)
                {
                    break 'chunks;
                }
                bytes += batch.data.len();
                batches.push(batch.data.clone());
            }
            expect = chunk.end;
        }
        // Reading the only chunk left: read the one after it meanwhile.
        let read_next =
            (self.chunks.len() == 1 && self.in_flight.is_none() && !self.closed).then_some(self.chunks[0].end);
        Some(Taken { batches, read_next })
    }

    /// Marks a read-ahead from `start` of `bytes` as in flight and charges
    /// it; None when one is in flight already, the log is closed, a chunk
    /// holds `start`, or the core's budget is spent.
    pub fn begin(&mut self, start: i64, bytes: usize) -> Option<Charge> {
        if self.in_flight.is_some() || self.closed || self.chunks.iter().any(|c| c.start <= start && start < c.end) {
            return None;
        }
        let charge = Charge::try_new(bytes)?;
        self.in_flight = Some(start);
        Some(charge)
    }

    /// Stores what the read-ahead from `start` read and wakes its waiters;
    /// the chunk's id (for `expire`), or None when nothing was kept.
    pub fn finish(&mut self, start: i64, read: Vec<Bytes>, mut charge: Charge) -> Option<u64> {
        self.in_flight = None;
        self.done.notify(usize::MAX);
        let batches: Vec<ChunkBatch> = read
            .into_iter()
            .filter_map(|data| {
                let header = BatchHeader::parse(&data, usize::MAX).ok()?;
                Some(ChunkBatch { base_offset: header.base_offset, last_offset: header.last_offset(), data })
            })
            .collect();
        let end = batches.last()?.last_offset + 1;
        if self.closed || end <= start {
            return None;
        }
        charge.set(batches.iter().map(|b| b.data.len()).sum());
        // A reader may have moved on meanwhile: keep the chunks in order.
        while self.chunks.back().is_some_and(|c| c.start >= start) {
            self.chunks.pop_back();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.chunks.push_back(Chunk { id, start, end, batches, _charge: charge });
        Some(id)
    }

    /// Drops the chunk `id` if it is still unread.
    pub fn expire(&mut self, id: u64) {
        self.chunks.retain(|c| c.id != id);
    }

    /// Drops every chunk and starts no more (the log closed).
    pub fn close(&mut self) {
        self.closed = true;
        self.chunks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record_batch::{encode_batch, ProducerFields, Record};

    /// A batch of `count` records at `base` (the base offset patched in).
    fn batch_at(base: i64, count: usize) -> Bytes {
        let records: Vec<Record> = (0..count)
            .map(|r| Record { value: Some(Bytes::from(vec![7u8; 100])), offset_delta: r as i32, ..Record::default() })
            .collect();
        let mut data = bytes::BytesMut::from(&encode_batch(&records, 0, ProducerFields::NONE)[..]);
        data[..8].copy_from_slice(&base.to_be_bytes());
        data.freeze()
    }

    #[test]
    fn the_core_budget_refuses_a_read_ahead_beyond_it_and_gets_bytes_back_on_drop() {
        let all = Charge::try_new(READ_AHEAD_BYTES_MAX).expect("the whole budget");
        assert!(Charge::try_new(1).is_none(), "nothing left");
        let mut ahead = ReadAhead::default();
        assert!(ahead.begin(0, 1).is_none(), "no read-ahead beyond the budget");
        drop(all);
        assert_eq!(core_read_ahead_bytes(), 0);
        let mut one = Charge::try_new(4096).unwrap();
        one.set(100);
        assert_eq!(core_read_ahead_bytes(), 100);
        drop(one);
        assert_eq!(core_read_ahead_bytes(), 0);
    }

    #[test]
    fn a_chunk_answers_reads_within_it_until_a_read_moves_past_it() {
        let mut ahead = ReadAhead::default();
        let charge = ahead.begin(0, 64 << 10).expect("starts");
        assert!(ahead.in_flight_at(0));
        assert!(ahead.begin(0, 64 << 10).is_none(), "one read-ahead in flight per log");
        assert!(ahead.take(0, 1 << 20, 100).is_none(), "nothing read yet");
        let (first, second) = (batch_at(0, 10), batch_at(10, 10));
        let id = ahead.finish(0, vec![first.clone(), second.clone()], charge).expect("kept");
        assert!(!ahead.in_flight_at(0));
        assert_eq!(core_read_ahead_bytes(), first.len() + second.len(), "charged what was read");

        let taken = ahead.take(0, 1 << 20, 100).unwrap();
        assert_eq!(taken.batches, vec![first.clone(), second.clone()]);
        assert_eq!(taken.read_next, Some(20), "reading the last chunk reads the next one");
        // Whole batches within the byte limit (at least one), and below the
        // high-water mark.
        assert_eq!(ahead.take(5, 1, 100).unwrap().batches, vec![first.clone()]);
        assert_eq!(ahead.take(0, 1 << 20, 10).unwrap().batches, vec![first]);
        assert_eq!(ahead.take(15, 1 << 20, 100).unwrap().batches, vec![second]);
        // Past the chunk: it is dropped and its bytes given back.
        assert!(ahead.take(20, 1 << 20, 100).is_none());
        assert_eq!(core_read_ahead_bytes(), 0);
        ahead.expire(id);

        let charge = ahead.begin(20, 64 << 10).unwrap();
        let id = ahead.finish(20, vec![batch_at(20, 5)], charge).unwrap();
        ahead.expire(id);
        assert!(ahead.take(20, 1 << 20, 100).is_none(), "an expired chunk is gone");
        assert_eq!(core_read_ahead_bytes(), 0);
    }

    #[test]
    fn a_closed_log_keeps_no_chunk_and_starts_none() {
        let mut ahead = ReadAhead::default();
        let charge = ahead.begin(0, 64 << 10).unwrap();
        ahead.close();
        assert!(ahead.finish(0, vec![batch_at(0, 3)], charge).is_none(), "finished after the close: dropped");
        assert!(ahead.begin(3, 64 << 10).is_none());
        assert_eq!(core_read_ahead_bytes(), 0);
    }
}
