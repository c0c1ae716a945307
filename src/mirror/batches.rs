//! From fetched source batches to the batches the mirror produces.
//!
//! What is copied: the data batches of committed transactions and of plain
//! producers, from the fetch offset on. Control batches and aborted
//! transactions are skipped (the fetch is read_committed, and the aborted
//! list says what to drop, as a Kafka consumer does).
//!
//! How: a compressed batch travels as it is (its bytes, compression
//! included), re-stamped with the mirror's producer fields. Uncompressed
//! batches that follow each other are merged into one target batch (Kafka
//! takes one batch per partition per produce request; merging keeps a
//! partition of small batches from costing a round trip each), rebuilt
//! record by record with contiguous offset deltas: key, value, headers and
//! timestamp stay, byte for byte. A rebuilt batch is CreateTime: a record of
//! a LogAppendTime batch gets the time its source appended it.

use std::collections::HashSet;

use bytes::{BufMut, Bytes, BytesMut};

use crate::protocol::record_batch::{
    self, BatchError, BatchHeader, ProducerFields, ATTR_COMPRESSION_MASK, ATTR_CONTROL, ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL, HEADER_BYTES,
};

/// Largest target batch the merge builds (under Kafka's default
/// `max.message.bytes` of 1 MiB with room to spare).
pub const MERGED_BYTES_MAX: usize = 512 * 1024;

/// A source batch chosen for copying.
#[derive(Debug, Clone)]
pub struct Selected {
    pub bytes: Bytes,
    pub header: BatchHeader,
    /// Records below this offset are not copied (the fetch started inside
    /// the batch); `header.base_offset` when the whole batch is.
    pub from: i64,
}

/// The data batches of a fetched record set to copy, and the next offset to
/// fetch. `aborted` is the fetch response's (producer id, first offset).
pub fn select(batches: &[Bytes], fetch_offset: i64, aborted: &[(i64, i64)]) -> (Vec<Selected>, i64) {
    let mut aborted: Vec<(i64, i64)> = aborted.to_vec();
    aborted.sort_by_key(|&(_, first)| first);
    let mut aborted = aborted.into_iter().peekable();
    let mut aborting: HashSet<i64> = HashSet::new();
    let mut next = fetch_offset;
    let mut out = Vec::new();
    for bytes in batches {
        let Ok(header) = BatchHeader::parse(bytes, usize::MAX) else { break };
        if header.size_bytes > bytes.len() || header.magic != 2 {
            break;
        }
        if header.last_offset() < fetch_offset {
            continue;
        }
        next = header.last_offset() + 1;
        while let Some(&(producer, first)) = aborted.peek() {
            if first > header.last_offset() {
                break;
            }
            aborting.insert(producer);
            aborted.next();
        }
        if header.attributes & ATTR_CONTROL != 0 {
            if is_abort_marker(bytes) {
                aborting.remove(&header.producer_id);
            }
            continue;
        }
        if header.attributes & ATTR_TRANSACTIONAL != 0 && aborting.contains(&header.producer_id) {
            continue;
        }
        if header.record_count <= 0 {
            continue;
        }
        out.push(Selected { bytes: bytes.clone(), header, from: fetch_offset.max(header.base_offset) });
    }
    (out, next)
}

/// Whether a control batch is an abort marker (control record key:
/// version i16, type i16 with 0 = abort).
fn is_abort_marker(batch: &[u8]) -> bool {
    record_batch::record_views(batch)
        .ok()
        .and_then(|mut views| views.next())
        .and_then(Result::ok)
        .and_then(|view| view.key)
        .is_some_and(|key| key.len() >= 4 && i16::from_be_bytes([key[2], key[3]]) == 0)
}

/// The part of one source batch a target batch holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub upstream_first: i64,
    pub upstream_last: i64,
    pub records: i64,
    /// Every source offset from first to last holds one of the records.
    pub contiguous: bool,
}

/// A target batch ready to produce; its producer fields are stamped at send.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub bytes: BytesMut,
    pub attributes: i16,
    pub records: i32,
    pub pieces: Vec<Piece>,
    /// The target gives the batch's records contiguous offsets (a rebuilt
    /// batch, or a whole batch without gaps).
    pub target_contiguous: bool,
    /// Newest record time in the batch (replication latency).
    pub max_timestamp: i64,
    pub source_bytes: usize,
}

impl Prepared {
    /// The batch as it goes out, for `producer`.
    pub fn stamped(&mut self, producer: ProducerFields) -> Bytes {
        record_batch::restamp(&mut self.bytes, self.attributes, producer);
        Bytes::copy_from_slice(&self.bytes)
    }
}

/// Turns selected batches into target batches, in order.
pub fn prepare(selected: &[Selected]) -> Result<Vec<Prepared>, BatchError> {
    let mut out = Vec::new();
    let mut run: Vec<&Selected> = Vec::new();
    let mut run_bytes = 0;
    for batch in selected {
        if batch.header.compression() != 0 {
            if !run.is_empty() {
                out.push(rebuild(&run)?);
                run.clear();
                run_bytes = 0;
            }
            out.push(as_is(batch));
            continue;
        }
        if !run.is_empty() && run_bytes + batch.bytes.len() > MERGED_BYTES_MAX {
            out.push(rebuild(&run)?);
            run.clear();
            run_bytes = 0;
        }
        run_bytes += batch.bytes.len();
        run.push(batch);
    }
    if !run.is_empty() {
        out.push(rebuild(&run)?);
    }
    Ok(out)
}

/// A compressed batch, bytes unchanged but for the producer fields.
fn as_is(batch: &Selected) -> Prepared {
    let header = &batch.header;
    let gapless = i64::from(header.last_offset_delta) + 1 == i64::from(header.record_count);
    Prepared {
        bytes: BytesMut::from(&batch.bytes[..header.size_bytes]),
        attributes: header.attributes & (ATTR_COMPRESSION_MASK),
        records: header.record_count,
        pieces: vec![Piece {
            upstream_first: header.base_offset,
            upstream_last: header.last_offset(),
            records: i64::from(header.record_count),
            contiguous: gapless,
        }],
        target_contiguous: gapless,
        max_timestamp: header.max_timestamp,
        source_bytes: header.size_bytes,
    }
}

/// One uncompressed target batch holding the records (at or after each
/// batch's `from`) of a run of uncompressed source batches.
fn rebuild(run: &[&Selected]) -> Result<Prepared, BatchError> {
    let mut records: Vec<(i64, &[u8])> = Vec::new();
    let mut pieces = Vec::with_capacity(run.len());
    let mut source_bytes = 0;
    for batch in run {
        let header = &batch.header;
        source_bytes += header.size_bytes;
        let append_time = header.attributes & ATTR_LOG_APPEND_TIME != 0;
        let mut data = &batch.bytes[HEADER_BYTES..header.size_bytes];
        let mut piece: Option<Piece> = None;
        for _ in 0..header.record_count {
            let (length, n) = record_batch::read_varint(data).ok_or(BatchError::BadRecords("record length"))?;
            data = &data[n..];
            if length < 1 || length as usize > data.len() {
                return Err(BatchError::BadRecords("record length"));
            }
            let (record, rest) = data.split_at(length as usize);
            data = rest;
            let mut body = &record[1..];
            let (timestamp_delta, n) = record_batch::read_varint(body).ok_or(BatchError::BadRecords("timestamp"))?;
            body = &body[n..];
            let (offset_delta, n) = record_batch::read_varint(body).ok_or(BatchError::BadRecords("offset delta"))?;
            body = &body[n..];
            let offset = header.base_offset + offset_delta;
            if offset < batch.from {
                continue;
            }
            let timestamp = if append_time { header.max_timestamp } else { header.base_timestamp + timestamp_delta };
            records.push((timestamp, body));
            piece = Some(match piece {
                None => Piece { upstream_first: offset, upstream_last: offset, records: 1, contiguous: true },
                Some(p) => Piece {
                    upstream_first: p.upstream_first,
                    upstream_last: offset,
                    records: p.records + 1,
                    contiguous: p.contiguous && offset == p.upstream_last + 1,
                },
            });
        }
        pieces.extend(piece);
    }
    let base_timestamp = records.first().map_or(0, |(t, _)| *t);
    let max_timestamp = records.iter().map(|(t, _)| *t).max().unwrap_or(base_timestamp);
    let mut out = BytesMut::with_capacity(HEADER_BYTES + source_bytes + records.len() * 8);
    out.resize(HEADER_BYTES, 0);
    for (index, (timestamp, tail)) in records.iter().enumerate() {
        let mut head = BytesMut::with_capacity(24);
        head.put_u8(0);
        record_batch::put_varlong(&mut head, timestamp - base_timestamp);
        record_batch::put_varlong(&mut head, index as i64);
        record_batch::put_varlong(&mut out, (head.len() + tail.len()) as i64);
        out.put_slice(&head);
        out.put_slice(tail);
    }
    let count = records.len() as i32;
    let length = (out.len() - 12) as i32;
    let mut header = &mut out[..HEADER_BYTES];
    header.put_i64(0);
    header.put_i32(length);
    header.put_i32(-1);
    header.put_i8(2);
    header.put_u32(0);
    header.put_i16(0);
    header.put_i32((count - 1).max(0));
    header.put_i64(base_timestamp);
    header.put_i64(max_timestamp);
    header.put_i64(-1);
    header.put_i16(-1);
    header.put_i32(-1);
    header.put_i32(count);
    Ok(Prepared {
        bytes: out,
        attributes: 0,
        records: count,
        pieces,
        target_contiguous: true,
        max_timestamp,
        source_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record_batch::{decode_records, encode_batch, validate, Record};

    fn batch(base_offset: i64, values: &[&str], base_timestamp: i64) -> Bytes {
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::copy_from_slice(v.as_bytes())),
                headers: vec![("h".into(), Some(Bytes::from_static(b"x")))],
                timestamp_delta: i as i64 * 10,
                offset_delta: i as i32,
            })
            .collect();
        let mut bytes = BytesMut::from(&encode_batch(&records, base_timestamp, ProducerFields::NONE)[..]);
        record_batch::patch(&mut bytes, base_offset, 0);
        bytes.freeze()
    }

    #[test]
    fn uncompressed_batches_merge_into_one_valid_batch_keeping_every_field() {
        let fetched = vec![batch(10, &["a", "b"], 1_000), batch(12, &["c"], 2_000)];
        let (selected, next) = select(&fetched, 10, &[]);
        assert_eq!(next, 13);
        let mut prepared = prepare(&selected).unwrap();
        assert_eq!(prepared.len(), 1);
        let out = prepared[0].stamped(ProducerFields { producer_id: 7, producer_epoch: 0, base_sequence: 3 });
        let header = validate(&out, usize::MAX).expect("a valid batch, CRC included");
        assert_eq!((header.producer_id, header.base_sequence, header.record_count), (7, 3, 3));
        let records = decode_records(&out).unwrap();
        let values: Vec<_> = records.iter().map(|r| r.value.clone().unwrap()).collect();
        assert_eq!(values, vec![Bytes::from("a"), Bytes::from("b"), Bytes::from("c")]);
        assert_eq!(records[2].key, Some(Bytes::from("k0")));
        assert_eq!(records[2].headers, vec![("h".to_string(), Some(Bytes::from_static(b"x")))]);
        let times: Vec<_> = records.iter().map(|r| header.base_timestamp + r.timestamp_delta).collect();
        assert_eq!(times, vec![1_000, 1_010, 2_000]);
        assert_eq!(
            prepared[0].pieces,
            vec![
                Piece { upstream_first: 10, upstream_last: 11, records: 2, contiguous: true },
                Piece { upstream_first: 12, upstream_last: 12, records: 1, contiguous: true },
            ]
        );
    }

    #[test]
    fn records_before_the_fetch_offset_are_not_copied() {
        let fetched = vec![batch(10, &["a", "b", "c"], 0)];
        let (selected, _) = select(&fetched, 11, &[]);
        let prepared = prepare(&selected).unwrap();
        let values: Vec<_> =
            decode_records(&prepared[0].bytes).unwrap().into_iter().map(|r| r.value.unwrap()).collect();
        assert_eq!(values, vec![Bytes::from("b"), Bytes::from("c")]);
        assert_eq!(prepared[0].pieces[0].upstream_first, 11);
    }

    #[test]
    fn aborted_transactions_and_control_batches_are_skipped() {
        let mut data = BytesMut::from(&batch(0, &["aborted"], 0)[..]);
        data[record_batch::ATTRIBUTES_AT + 1] |= ATTR_TRANSACTIONAL as u8;
        data[record_batch::PRODUCER_ID_AT..record_batch::PRODUCER_ID_AT + 8].copy_from_slice(&5i64.to_be_bytes());
        let mut control = BytesMut::from(&batch(1, &["marker"], 0)[..]);
        control[record_batch::ATTRIBUTES_AT + 1] |= (ATTR_TRANSACTIONAL | ATTR_CONTROL) as u8;
        let fetched = vec![data.freeze(), control.freeze(), batch(2, &["kept"], 0)];
        let (selected, next) = select(&fetched, 0, &[(5, 0)]);
        assert_eq!(next, 3);
        assert_eq!(selected.len(), 1);
        assert_eq!(selected[0].header.base_offset, 2);
        let (selected, _) = select(&fetched, 0, &[]);
        assert_eq!(selected.len(), 2, "committed transactional data is copied");
    }

    #[test]
    fn a_partial_trailing_batch_ends_the_selection() {
        let whole = batch(0, &["a"], 0);
        let cut = batch(1, &["b"], 0).slice(..20);
        let (selected, next) = select(&[whole, cut], 0, &[]);
        assert_eq!((selected.len(), next), (1, 1));
    }
}
