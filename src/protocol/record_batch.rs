//! Kafka v2 record batches: header layout, validation and the two in-place
//! patches the broker makes (base offset, partition leader epoch).
//!
//! ```text
//! offset  size  field                   covered by CRC
//!      0     8  base_offset             no   (patched by the broker)
//!      8     4  batch_length            no   (bytes after this field)
//!     12     4  partition_leader_epoch  no   (patched by the broker)
//!     16     1  magic (= 2)             no
//!     17     4  crc (CRC-32C)           no
//!     21     2  attributes              yes
//!     23     4  last_offset_delta       yes
//!     27     8  base_timestamp          yes
//!     35     8  max_timestamp           yes
//!     43     8  producer_id             yes
//!     51     2  producer_epoch          yes
//!     53     4  base_sequence           yes
//!     57     4  record_count            yes
//!     61     …  records                 yes
//! ```
//!
//! Validation lives here alone and is shared by the produce path, log recovery
//! and the fuzzers.

use bytes::{BufMut, Bytes, BytesMut};

pub const BASE_OFFSET_AT: usize = 0;
pub const BATCH_LENGTH_AT: usize = BASE_OFFSET_AT + 8;
pub const LEADER_EPOCH_AT: usize = BATCH_LENGTH_AT + 4;
pub const MAGIC_AT: usize = LEADER_EPOCH_AT + 4;
pub const CRC_AT: usize = MAGIC_AT + 1;
pub const ATTRIBUTES_AT: usize = CRC_AT + 4;
pub const LAST_OFFSET_DELTA_AT: usize = ATTRIBUTES_AT + 2;
pub const BASE_TIMESTAMP_AT: usize = LAST_OFFSET_DELTA_AT + 4;
pub const MAX_TIMESTAMP_AT: usize = BASE_TIMESTAMP_AT + 8;
pub const PRODUCER_ID_AT: usize = MAX_TIMESTAMP_AT + 8;
pub const PRODUCER_EPOCH_AT: usize = PRODUCER_ID_AT + 8;
pub const BASE_SEQUENCE_AT: usize = PRODUCER_EPOCH_AT + 2;
pub const RECORD_COUNT_AT: usize = BASE_SEQUENCE_AT + 4;
pub const HEADER_BYTES: usize = RECORD_COUNT_AT + 4;
/// `batch_length` counts the bytes after itself.
pub const LENGTH_PREFIX_BYTES: usize = BATCH_LENGTH_AT + 4;

const _: () = assert!(HEADER_BYTES == 61);

pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
pub const ATTR_LOG_APPEND_TIME: i16 = 0x08;
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
pub const ATTR_CONTROL: i16 = 0x20;

/// Why a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    #[error("batch header truncated: {0} bytes")]
    Truncated(usize),
    #[error("batch length {0} is out of range")]
    BadLength(i64),
    #[error("unsupported magic {0}")]
    BadMagic(i8),
    #[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("record count {count} disagrees with last offset delta {last_offset_delta}")]
    CountMismatch { count: i32, last_offset_delta: i32 },
    #[error("records do not parse: {0}")]
    BadRecords(&'static str),
}

impl BatchError {
    /// CRC and framing problems are CORRUPT_MESSAGE; a well-framed batch whose
    /// contents lie is INVALID_RECORD.
    pub fn error_code(&self) -> super::ErrorCode {
        match self {
            BatchError::CountMismatch { .. } | BatchError::BadRecords(_) => super::ErrorCode::InvalidRecord,
            _ => super::ErrorCode::CorruptMessage,
        }
    }
}

/// The fields of a batch header the broker reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Total size of the batch in bytes (length prefix included).
    pub size_bytes: usize,
    pub leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Parses the fixed header; checks only that it is there and that the
    /// length is plausible against `batch_bytes_max`.
    pub fn parse(data: &[u8], batch_bytes_max: usize) -> Result<Self, BatchError> {
        if data.len() < HEADER_BYTES {
            return Err(BatchError::Truncated(data.len()));
        }
        let batch_length = read_i32(data, BATCH_LENGTH_AT);
        let size = i64::from(batch_length) + LENGTH_PREFIX_BYTES as i64;
        if size < HEADER_BYTES as i64 || size > batch_bytes_max.min(i32::MAX as usize) as i64 {
            return Err(BatchError::BadLength(i64::from(batch_length)));
        }
        Ok(Self {
            base_offset: read_i64(data, BASE_OFFSET_AT),
            size_bytes: size as usize,
            leader_epoch: read_i32(data, LEADER_EPOCH_AT),
            magic: data[MAGIC_AT] as i8,
            crc: read_i32(data, CRC_AT) as u32,
            attributes: read_i16(data, ATTRIBUTES_AT),
            last_offset_delta: read_i32(data, LAST_OFFSET_DELTA_AT),
            base_timestamp: read_i64(data, BASE_TIMESTAMP_AT),
            max_timestamp: read_i64(data, MAX_TIMESTAMP_AT),
            producer_id: read_i64(data, PRODUCER_ID_AT),
            producer_epoch: read_i16(data, PRODUCER_EPOCH_AT),
            base_sequence: read_i32(data, BASE_SEQUENCE_AT),
            record_count: read_i32(data, RECORD_COUNT_AT),
        })
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    pub fn compression(&self) -> i16 {
        self.attributes & ATTR_COMPRESSION_MASK
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }
}

/// Checks a whole batch: magic 2, length, CRC-32C, and for uncompressed batches
/// that the records parse and their number matches the header. `data` must be
/// exactly one batch.
pub fn validate(data: &[u8], batch_bytes_max: usize) -> Result<BatchHeader, BatchError> {
    let header = validate_framing(data, batch_bytes_max)?;
    if header.size_bytes != data.len() {
        return Err(BatchError::BadLength(data.len() as i64 - LENGTH_PREFIX_BYTES as i64));
    }
    if header.record_count < 0 || header.last_offset_delta < 0 || header.last_offset_delta != header.record_count - 1 {
        return Err(BatchError::CountMismatch {
            count: header.record_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    if header.compression() == 0 {
        let parsed = count_records(&data[HEADER_BYTES..])?;
        if parsed != header.record_count as usize {
            return Err(BatchError::CountMismatch {
                count: header.record_count,
                last_offset_delta: header.last_offset_delta,
            });
        }
    }
    Ok(header)
}

/// Checks magic, length and CRC: what recovery needs to trust a stored batch.
/// `data` may extend past the batch.
pub fn validate_framing(data: &[u8], batch_bytes_max: usize) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(data, batch_bytes_max)?;
    if header.magic != 2 {
        return Err(BatchError::BadMagic(header.magic));
    }
    if header.size_bytes > data.len() {
        return Err(BatchError::Truncated(data.len()));
    }
    let computed = crc32c::crc32c(&data[ATTRIBUTES_AT..header.size_bytes]);
    if computed != header.crc {
        return Err(BatchError::CrcMismatch { stored: header.crc, computed });
    }
    Ok(header)
}

/// Walks uncompressed records by their length prefixes and counts them.
fn count_records(mut records: &[u8]) -> Result<usize, BatchError> {
    let mut count = 0usize;
    while !records.is_empty() {
        let (len, used) = read_varint(records).ok_or(BatchError::BadRecords("record length"))?;
        if len < 0 || (len as usize) > records.len() - used {
            return Err(BatchError::BadRecords("record length exceeds batch"));
        }
        records = &records[used + len as usize..];
        count += 1;
    }
    Ok(count)
}

/// Zig-zag varint from a slice: (value, bytes used).
pub fn read_varint(data: &[u8]) -> Option<(i64, usize)> {
    let mut raw: u64 = 0;
    for (index, byte) in data.iter().take(10).enumerate() {
        raw |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((((raw >> 1) as i64) ^ -((raw & 1) as i64), index + 1));
        }
    }
    None
}

/// Writes the broker-assigned base offset and leader epoch (outside the CRC).
pub fn patch(batch: &mut [u8], base_offset: i64, leader_epoch: i32) {
    assert!(batch.len() >= HEADER_BYTES);
    batch[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&base_offset.to_be_bytes());
    batch[LEADER_EPOCH_AT..LEADER_EPOCH_AT + 4].copy_from_slice(&leader_epoch.to_be_bytes());
}

/// Rewrites a whole batch for a new producer (the mirror's re-produce): base
/// offset 0 and leader epoch -1 (the broker assigns both), `attributes`,
/// the producer fields, and the CRC-32C over the changed bytes. Records and
/// timestamps stay byte for byte, compressed or not.
pub fn restamp(batch: &mut [u8], attributes: i16, producer: ProducerFields) {
    assert!(batch.len() >= HEADER_BYTES);
    patch(batch, 0, -1);
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    batch[PRODUCER_ID_AT..PRODUCER_ID_AT + 8].copy_from_slice(&producer.producer_id.to_be_bytes());
    batch[PRODUCER_EPOCH_AT..PRODUCER_EPOCH_AT + 2].copy_from_slice(&producer.producer_epoch.to_be_bytes());
    batch[BASE_SEQUENCE_AT..BASE_SEQUENCE_AT + 4].copy_from_slice(&producer.base_sequence.to_be_bytes());
    let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Splits a record set (several batches back to back) into whole batches.
/// A trailing partial batch (allowed in fetch responses) is ignored.
pub fn split_batches(mut data: Bytes, batch_bytes_max: usize) -> Result<Vec<Bytes>, BatchError> {
    let mut out = Vec::new();
    while let Some(size) = next_batch_size(&data, batch_bytes_max)? {
        out.push(data.split_to(size));
    }
    Ok(out)
}

/// `split_batches` for a uniquely owned record set (a produce request's):
/// the batches stay uniquely owned, so offsets can be patched in place.
pub fn split_batches_mut(mut data: BytesMut, batch_bytes_max: usize) -> Result<Vec<BytesMut>, BatchError> {
    let mut out = Vec::new();
    while let Some(size) = next_batch_size(&data, batch_bytes_max)? {
        out.push(data.split_to(size));
    }
    Ok(out)
}

/// Size of the whole batch at the start of `data`; None when `data` holds
/// no whole batch.
fn next_batch_size(data: &[u8], batch_bytes_max: usize) -> Result<Option<usize>, BatchError> {
    if data.len() < LENGTH_PREFIX_BYTES {
        return Ok(None);
    }
    let batch_length = read_i32(data, BATCH_LENGTH_AT);
    let size = i64::from(batch_length) + LENGTH_PREFIX_BYTES as i64;
    if size < HEADER_BYTES as i64 || size > batch_bytes_max.min(i32::MAX as usize) as i64 {
        return Err(BatchError::BadLength(i64::from(batch_length)));
    }
    Ok((size as usize <= data.len()).then_some(size as usize))
}

/// One record to encode into a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
    pub timestamp_delta: i64,
    pub offset_delta: i32,
}

/// Producer fields of a batch (idempotence); `NONE` for plain producers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerFields {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

impl ProducerFields {
    pub const NONE: Self = Self { producer_id: -1, producer_epoch: -1, base_sequence: -1 };
}

/// Encodes an uncompressed v2 batch (used by our client, the load generator and
/// the internal offsets log).
pub fn encode_batch(records: &[Record], base_timestamp: i64, producer: ProducerFields) -> Bytes {
    let bytes = records.iter().map(record_bytes).sum();
    let mut batch = BatchBuilder::new(base_timestamp, bytes);
    for record in records {
        batch.push(record);
    }
    batch.finish(producer)
}

/// Builds an uncompressed v2 batch record by record in one buffer, each
/// record written once where it stays (a load generator's batches are
/// hundreds of MB/s: building records apart and copying them together cost
/// it more than the socket did).
pub struct BatchBuilder {
    out: BytesMut,
    base_timestamp: i64,
    max_timestamp_delta: Option<i64>,
    last_offset_delta: Option<i32>,
    records: i32,
}

impl BatchBuilder {
    /// An empty batch with room for `records_bytes` of records.
    pub fn new(base_timestamp: i64, records_bytes: usize) -> Self {
        let mut out = BytesMut::with_capacity(HEADER_BYTES + records_bytes);
        out.resize(HEADER_BYTES, 0);
        Self { out, base_timestamp, max_timestamp_delta: None, last_offset_delta: None, records: 0 }
    }

    /// Appends `record`.
    pub fn push(&mut self, record: &Record) {
        let value = record.value.as_deref();
        self.push_with(
            record.timestamp_delta,
            record.offset_delta,
            record.key.as_deref(),
            value.map(<[u8]>::len),
            &record.headers,
            |out| out.put_slice(value.unwrap_or_default()),
        );
    }

    /// Appends a record whose value of `value_bytes` (None: a null value)
    /// `write_value` writes into the batch.
    pub fn push_with(
        &mut self,
        timestamp_delta: i64,
        offset_delta: i32,
        key: Option<&[u8]>,
        value_bytes: Option<usize>,
        headers: &[(String, Option<Bytes>)],
        write_value: impl FnOnce(&mut BytesMut),
    ) {
        let body = record_body_bytes(timestamp_delta, offset_delta, key.map(<[u8]>::len), value_bytes, headers);
        let out = &mut self.out;
        put_varlong(out, body as i64);
        out.put_i8(0);
        put_varlong(out, timestamp_delta);
        put_varlong(out, i64::from(offset_delta));
        put_opt_bytes(out, key);
        match value_bytes {
            Some(len) => {
                put_varlong(out, len as i64);
                let before = out.len();
                write_value(out);
                assert_eq!(out.len() - before, len, "the value is as long as announced");
            }
            None => put_varlong(out, -1),
        }
        put_varlong(out, headers.len() as i64);
        for (k, v) in headers {
            put_opt_bytes(out, Some(k.as_bytes()));
            put_opt_bytes(out, v.as_deref());
        }
        self.max_timestamp_delta = Some(self.max_timestamp_delta.map_or(timestamp_delta, |m| m.max(timestamp_delta)));
        self.last_offset_delta = Some(self.last_offset_delta.map_or(offset_delta, |m| m.max(offset_delta)));
        self.records += 1;
    }

    /// The timestamp record timestamp deltas count from.
    pub fn base_timestamp(&self) -> i64 {
        self.base_timestamp
    }

    /// Records pushed so far.
    pub fn records(&self) -> i32 {
        self.records
    }

    /// The batch's size so far, header included.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// True before the first record.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The finished batch: header filled in, CRC computed.
    pub fn finish(self, producer: ProducerFields) -> Bytes {
        let mut out = self.out;
        let body_bytes = out.len() - HEADER_BYTES;
        let mut header = &mut out[..HEADER_BYTES];
        header.put_i64(0);
        header.put_i32((HEADER_BYTES - LENGTH_PREFIX_BYTES + body_bytes) as i32);
        header.put_i32(-1);
        header.put_i8(2);
        header.put_u32(0);
        header.put_i16(0);
        header.put_i32(self.last_offset_delta.unwrap_or(0));
        header.put_i64(self.base_timestamp);
        header.put_i64(self.base_timestamp + self.max_timestamp_delta.unwrap_or(0));
        header.put_i64(producer.producer_id);
        header.put_i16(producer.producer_epoch);
        header.put_i32(producer.base_sequence);
        header.put_i32(self.records);
        let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
        out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        out.freeze()
    }
}

/// Encoded size of `record` in a batch, its length prefix included.
fn record_bytes(record: &Record) -> usize {
    let body = record_body_bytes(
        record.timestamp_delta,
        record.offset_delta,
        record.key.as_ref().map(Bytes::len),
        record.value.as_ref().map(Bytes::len),
        &record.headers,
    );
    varlong_len(body as i64) + body
}

/// Encoded size of a record after its length prefix.
fn record_body_bytes(
    timestamp_delta: i64,
    offset_delta: i32,
    key_bytes: Option<usize>,
    value_bytes: Option<usize>,
    headers: &[(String, Option<Bytes>)],
) -> usize {
    1 + varlong_len(timestamp_delta)
        + varlong_len(i64::from(offset_delta))
        + opt_bytes_len(key_bytes)
        + opt_bytes_len(value_bytes)
        + varlong_len(headers.len() as i64)
        + headers
            .iter()
            .map(|(k, v)| opt_bytes_len(Some(k.len())) + opt_bytes_len(v.as_ref().map(Bytes::len)))
            .sum::<usize>()
}

/// Bytes of a zigzag varlong.
fn varlong_len(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - (z | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes of a nullable byte string of `len` bytes (None: null).
fn opt_bytes_len(len: Option<usize>) -> usize {
    match len {
        Some(n) => varlong_len(n as i64) + n,
        None => 1,
    }
}

/// Decodes the records of an uncompressed batch (client side, tests).
pub fn decode_records(batch: &[u8]) -> Result<Vec<Record>, BatchError> {
    let owned = |field: Option<&[u8]>| field.map(Bytes::copy_from_slice);
    let mut out = Vec::new();
    for view in record_views(batch)? {
        let view = view?;
        let mut headers = Vec::with_capacity(view.header_count);
        let mut rest = view.headers;
        for _ in 0..view.header_count {
            let key = take_field(&mut rest)?.ok_or(BatchError::BadRecords("null header key"))?;
            let key = String::from_utf8(key.to_vec()).map_err(|_| BatchError::BadRecords("header key utf8"))?;
            headers.push((key, owned(take_field(&mut rest)?)));
        }
        out.push(Record {
            key: owned(view.key),
            value: owned(view.value),
            headers,
            timestamp_delta: view.timestamp_delta,
            offset_delta: view.offset_delta,
        });
    }
    Ok(out)
}

/// One record of an uncompressed batch, its fields borrowed from the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub header_count: usize,
    /// The encoded headers (`header_count` of them).
    pub headers: &'a [u8],
}

/// The records of an uncompressed batch, without copying (a consumer that
/// only looks at them). Stops after the first malformed record.
pub fn record_views(batch: &[u8]) -> Result<RecordViews<'_>, BatchError> {
    let header = BatchHeader::parse(batch, usize::MAX)?;
    if header.compression() != 0 {
        return Err(BatchError::BadRecords("compressed batch"));
    }
    let end = header.size_bytes.min(batch.len());
    Ok(RecordViews { data: &batch[HEADER_BYTES..end] })
}

pub struct RecordViews<'a> {
    data: &'a [u8],
}

impl<'a> Iterator for RecordViews<'a> {
    type Item = Result<RecordView<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.data.is_empty() {
            return None;
        }
        let view = next_record(&mut self.data);
        if view.is_err() {
            self.data = &[];
        }
        Some(view)
    }
}

fn next_record<'a>(data: &mut &'a [u8]) -> Result<RecordView<'a>, BatchError> {
    let len = take_varint(data)?;
    if len < 0 || len as usize > data.len() {
        return Err(BatchError::BadRecords("record length"));
    }
    let mut rec = &data[..len as usize];
    *data = &data[len as usize..];
    if rec.is_empty() {
        return Err(BatchError::BadRecords("attributes"));
    }
    rec = &rec[1..];
    let timestamp_delta = take_varint(&mut rec)?;
    let offset_delta = take_varint(&mut rec)? as i32;
    let key = take_field(&mut rec)?;
    let value = take_field(&mut rec)?;
    let header_count = take_varint(&mut rec)?;
    if header_count < 0 || header_count as usize > rec.len() {
        return Err(BatchError::BadRecords("header count"));
    }
    Ok(RecordView { timestamp_delta, offset_delta, key, value, header_count: header_count as usize, headers: rec })
}

fn take_varint(rec: &mut &[u8]) -> Result<i64, BatchError> {
    let (v, n) = read_varint(rec).ok_or(BatchError::BadRecords("varint"))?;
    *rec = &rec[n..];
    Ok(v)
}

/// A length-prefixed (varint) nullable field.
fn take_field<'a>(rec: &mut &'a [u8]) -> Result<Option<&'a [u8]>, BatchError> {
    let len = take_varint(rec)?;
    if len < 0 {
        return Ok(None);
    }
    if len as usize > rec.len() {
        return Err(BatchError::BadRecords("field length"));
    }
    let (field, rest) = rec.split_at(len as usize);
    *rec = rest;
    Ok(Some(field))
}

/// Writes a zig-zag varint (record fields).
pub fn put_varlong(buf: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    buf.put_u8(z as u8);
}

fn put_opt_bytes(buf: &mut BytesMut, data: Option<&[u8]>) {
    match data {
        Some(d) => {
            put_varlong(buf, d.len() as i64);
            buf.put_slice(d);
        }
        None => put_varlong(buf, -1),
    }
}

pub fn read_i16(data: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([data[at], data[at + 1]])
}

pub fn read_i32(data: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

pub fn read_i64(data: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&data[at..at + 8]);
    i64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Bytes {
        let records: Vec<Record> = (0..3)
            .map(|i| Record {
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(vec![i as u8; 10])),
                headers: vec![("h".into(), Some(Bytes::from_static(b"v")))],
                timestamp_delta: i,
                offset_delta: i as i32,
            })
            .collect();
        encode_batch(&records, 1_700_000_000_000, ProducerFields::NONE)
    }

    #[test]
    fn encoded_batch_validates_and_decodes() {
        let batch = sample();
        let header = validate(&batch, 1 << 20).unwrap();
        assert_eq!(header.record_count, 3);
        assert_eq!(header.max_timestamp, 1_700_000_000_002);
        let records = decode_records(&batch).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(records[2].key.as_deref(), Some(&b"k2"[..]));
    }

    #[test]
    fn varlong_sizes_match_the_encoding() {
        for v in [0i64, 1, -1, 63, -64, 64, -65, 8191, 8192, 1 << 20, -(1 << 40), i64::MAX, i64::MIN] {
            let mut out = BytesMut::new();
            put_varlong(&mut out, v);
            assert_eq!(varlong_len(v), out.len(), "{v}");
        }
    }

    #[test]
    fn built_batches_decode_to_their_records_in_exactly_the_space_reserved() {
        // Null and empty keys and values, lengths whose varints take 1 to 3
        // bytes, negative and large timestamp deltas.
        let records: Vec<Record> = (0..40)
            .map(|i: usize| Record {
                key: match i % 3 {
                    0 => None,
                    1 => Some(Bytes::new()),
                    _ => Some(Bytes::from(vec![b'k'; i * 7])),
                },
                value: (!i.is_multiple_of(5)).then(|| Bytes::from(vec![i as u8; (i * i * 97) % 20_000])),
                headers: (0..i % 3).map(|h| (format!("h{h}"), (h % 2 == 0).then(|| Bytes::from("v")))).collect(),
                timestamp_delta: (i as i64 - 20) * 1_000_003,
                offset_delta: i as i32,
            })
            .collect();
        let batch = encode_batch(&records, 1_700_000_000_000, ProducerFields::NONE);
        assert_eq!(batch.len(), HEADER_BYTES + records.iter().map(record_bytes).sum::<usize>());
        let header = validate(&batch, 1 << 20).unwrap();
        assert_eq!(header.record_count, 40);
        assert_eq!(header.last_offset(), 39);
        assert_eq!(header.max_timestamp, 1_700_000_000_000 + 19 * 1_000_003);
        assert_eq!(decode_records(&batch).unwrap(), records);

        // Values written in place by the caller give the same bytes.
        let mut built = BatchBuilder::new(1_700_000_000_000, 0);
        for record in &records {
            let value = record.value.clone();
            built.push_with(
                record.timestamp_delta,
                record.offset_delta,
                record.key.as_deref(),
                value.as_ref().map(Bytes::len),
                &record.headers,
                |out| out.put_slice(value.as_deref().unwrap_or_default()),
            );
        }
        assert_eq!(built.records(), 40);
        assert_eq!(built.finish(ProducerFields::NONE), batch);
    }

    #[test]
    fn patching_offset_and_epoch_keeps_crc_valid() {
        let mut batch = sample().to_vec();
        patch(&mut batch, 12345, 7);
        let header = validate(&batch, 1 << 20).unwrap();
        assert_eq!(header.base_offset, 12345);
        assert_eq!(header.leader_epoch, 7);
    }

    #[test]
    fn flipped_bit_fails_crc() {
        let mut batch = sample().to_vec();
        let last = batch.len() - 1;
        batch[last] ^= 1;
        assert!(matches!(validate(&batch, 1 << 20), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn count_disagreeing_with_records_is_invalid_record() {
        let mut batch = sample().to_vec();
        batch[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&4i32.to_be_bytes());
        batch[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4].copy_from_slice(&3i32.to_be_bytes());
        let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
        batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        let err = validate(&batch, 1 << 20).unwrap_err();
        assert_eq!(err.error_code(), crate::protocol::ErrorCode::InvalidRecord);
    }

    #[test]
    fn wrong_magic_is_refused() {
        let mut batch = sample().to_vec();
        batch[MAGIC_AT] = 1;
        assert_eq!(validate(&batch, 1 << 20), Err(BatchError::BadMagic(1)));
    }
}
