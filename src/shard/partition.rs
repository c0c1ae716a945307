//! A partition as its owning core holds it: the log plus the idempotent
//! producer state (the last sequence ranges of each producer).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use crate::constants::PRODUCER_BATCHES_REMEMBERED;
use crate::log::Log;
use crate::protocol::record_batch::BatchHeader;
use crate::protocol::ErrorCode;

pub struct Partition {
    pub topic: String,
    pub index: i32,
    pub log: Log,
    producers: RefCell<HashMap<i64, ProducerEntry>>,
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
    Duplicate { base_offset: i64 },
}

impl Partition {
    pub fn new(topic: String, index: i32, log: Log) -> Self {
        Self { topic, index, log, producers: RefCell::new(HashMap::new()) }
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

fn check(entry: &ProducerEntry, header: &BatchHeader) -> Result<SequenceCheck, ErrorCode> {
    if header.producer_epoch < entry.epoch {
        return Err(ErrorCode::InvalidProducerEpoch);
    }
    if header.producer_epoch > entry.epoch {
        // A bumped epoch starts over at sequence 0.
        return if header.base_sequence == 0 { Ok(SequenceCheck::Append) } else { Err(ErrorCode::OutOfOrderSequenceNumber) };
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
    fn gap_is_out_of_order_and_old_epoch_is_fenced() {
        let entry = entry_after(&[(1, 0, 3, 100)]);
        assert_eq!(check(&entry, &header(1, 7, 1)), Err(ErrorCode::OutOfOrderSequenceNumber));
        assert_eq!(check(&entry, &header(0, 3, 1)), Err(ErrorCode::InvalidProducerEpoch));
        assert_eq!(check(&entry, &header(2, 0, 1)), Ok(SequenceCheck::Append));
        assert_eq!(check(&entry, &header(2, 4, 1)), Err(ErrorCode::OutOfOrderSequenceNumber));
    }
}
