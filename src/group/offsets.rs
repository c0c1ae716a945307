//! Committed offsets and their record format in the internal offsets log.
//!
//! One record per (group, topic, partition); the log is compacted by key, so
//! the latest record per key is the committed offset and a tombstone (null
//! value) deletes it. Big-endian, strings with an i16 length, laid out like
//! Kafka's own `__consumer_offsets` records (OffsetCommitKey v1,
//! OffsetCommitValue v3), so that Kafka tooling reads them too.
//!
//! Key:
//!
//! | at       | bytes | field                         |
//! |----------|-------|-------------------------------|
//! | 0        | 2     | key version = 1               |
//! | 2        | 2     | group id length `g`           |
//! | 4        | g     | group id, UTF-8               |
//! | 4+g      | 2     | topic length `t`              |
//! | 6+g      | t     | topic, UTF-8                  |
//! | 6+g+t    | 4     | partition, i32                |
//!
//! Value (absent for a tombstone):
//!
//! | at       | bytes | field                         |
//! |----------|-------|-------------------------------|
//! | 0        | 2     | value version = 3             |
//! | 2        | 8     | offset, i64                   |
//! | 10       | 4     | leader epoch, i32 (-1: none)  |
//! | 14       | 2     | metadata length `m`           |
//! | 16       | m     | metadata, UTF-8               |
//! | 16+m     | 8     | commit timestamp, ms, i64     |

use bytes::Bytes;

use super::config::RECORD_STRING_BYTES_MAX;
use crate::protocol::{DecodeError, Reader, Writer};

pub const KEY_VERSION: i16 = 1;
pub const VALUE_VERSION: i16 = 3;

/// What a group has committed for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    /// -1 when the client did not say.
    pub leader_epoch: i32,
    /// "" when the client sent null.
    pub metadata: String,
    /// The coordinator's clock when the commit arrived.
    pub commit_timestamp_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffsetKey {
    pub group_id: String,
    pub topic: String,
    pub partition: i32,
}

/// One entry of the offsets log: a commit, or (value `None`) a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetRecord {
    pub key: OffsetKey,
    pub value: Option<CommittedOffset>,
}

/// The key and value bytes of a record as the log stores them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedOffsetRecord {
    pub key: Bytes,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
}

/// Why a record cannot be written or read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OffsetRecordError {
    #[error("{field} is {len} bytes, more than an offset record holds")]
    FieldTooLong { field: &'static str, len: usize },
    #[error("unknown offset key version {0}")]
    UnknownKeyVersion(i16),
    #[error("unknown offset value version {0}")]
    UnknownValueVersion(i16),
    #[error("{0} bytes left over after the record")]
    TrailingBytes(usize),
    #[error("malformed offset record: {0}")]
    Malformed(#[from] DecodeError),
}

impl OffsetRecord {
    pub fn encode(&self) -> Result<EncodedOffsetRecord, OffsetRecordError> {
        check_len("group id", &self.key.group_id)?;
        check_len("topic", &self.key.topic)?;
        let mut w = Writer::new();
        w.i16(KEY_VERSION);
        w.string(&self.key.group_id);
        w.string(&self.key.topic);
        w.i32(self.key.partition);
        let key = w.into_bytes();
        let Some(value) = &self.value else {
            return Ok(EncodedOffsetRecord { key, value: None });
        };
        check_len("metadata", &value.metadata)?;
        let mut w = Writer::new();
        w.i16(VALUE_VERSION);
        w.i64(value.offset);
        w.i32(value.leader_epoch);
        w.string(&value.metadata);
        w.i64(value.commit_timestamp_ms);
        Ok(EncodedOffsetRecord { key, value: Some(w.into_bytes()) })
    }

    pub fn decode(key: Bytes, value: Option<Bytes>) -> Result<Self, OffsetRecordError> {
        let mut r = Reader::new(key);
        let key_version = r.i16()?;
        if key_version != KEY_VERSION {
            return Err(OffsetRecordError::UnknownKeyVersion(key_version));
        }
        let group_id = r.string()?;
        let topic = r.string()?;
        let partition = r.i32()?;
        check_consumed(&r)?;
        let key = OffsetKey { group_id, topic, partition };
        let Some(value) = value else {
            return Ok(Self { key, value: None });
        };
        let mut r = Reader::new(value);
        let value_version = r.i16()?;
        if value_version != VALUE_VERSION {
            return Err(OffsetRecordError::UnknownValueVersion(value_version));
        }
        let offset = r.i64()?;
        let leader_epoch = r.i32()?;
        let metadata = r.string()?;
        let commit_timestamp_ms = r.i64()?;
        check_consumed(&r)?;
        let value = CommittedOffset { offset, leader_epoch, metadata, commit_timestamp_ms };
        Ok(Self { key, value: Some(value) })
    }
}

fn check_len(field: &'static str, value: &str) -> Result<(), OffsetRecordError> {
    if value.len() > RECORD_STRING_BYTES_MAX {
        return Err(OffsetRecordError::FieldTooLong { field, len: value.len() });
    }
    Ok(())
}

fn check_consumed(r: &Reader) -> Result<(), OffsetRecordError> {
    if r.remaining() != 0 {
        return Err(OffsetRecordError::TrailingBytes(r.remaining()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> OffsetRecord {
        OffsetRecord {
            key: OffsetKey { group_id: "orders".into(), topic: "payments".into(), partition: 7 },
            value: Some(CommittedOffset {
                offset: 1_234,
                leader_epoch: 5,
                metadata: "checkpoint".into(),
                commit_timestamp_ms: 1_700_000_000_000,
            }),
        }
    }

    #[test]
    fn commit_record_round_trips() {
        let encoded = record().encode().unwrap();
        let decoded = OffsetRecord::decode(encoded.key, encoded.value).unwrap();
        assert_eq!(decoded, record());
    }

    #[test]
    fn tombstone_round_trips_with_a_null_value() {
        let tombstone = OffsetRecord { key: record().key, value: None };
        let encoded = tombstone.encode().unwrap();
        assert_eq!(encoded.value, None);
        assert_eq!(OffsetRecord::decode(encoded.key, None).unwrap(), tombstone);
    }

    #[test]
    fn bytes_follow_the_documented_layout() {
        let encoded = record().encode().unwrap();
        let mut key = vec![0, 1, 0, 6];
        key.extend_from_slice(b"orders");
        key.extend_from_slice(&[0, 8]);
        key.extend_from_slice(b"payments");
        key.extend_from_slice(&7i32.to_be_bytes());
        assert_eq!(&encoded.key[..], &key[..]);

        let mut value = vec![0, 3];
        value.extend_from_slice(&1_234i64.to_be_bytes());
        value.extend_from_slice(&5i32.to_be_bytes());
        value.extend_from_slice(&[0, 10]);
        value.extend_from_slice(b"checkpoint");
        value.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        assert_eq!(encoded.value.as_deref(), Some(&value[..]));
    }

    #[test]
    fn truncated_records_are_errors_not_panics() {
        let encoded = record().encode().unwrap();
        for len in 0..encoded.key.len() {
            assert!(OffsetRecord::decode(encoded.key.slice(..len), None).is_err());
        }
        let value = encoded.value.unwrap();
        for len in 0..value.len() {
            let result = OffsetRecord::decode(encoded.key.clone(), Some(value.slice(..len)));
            assert!(result.is_err());
        }
    }

    #[test]
    fn unknown_versions_and_trailing_bytes_are_refused() {
        let encoded = record().encode().unwrap();
        let mut key = encoded.key.to_vec();
        key[1] = 9;
        let result = OffsetRecord::decode(Bytes::from(key), None);
        assert_eq!(result, Err(OffsetRecordError::UnknownKeyVersion(9)));

        let mut value = encoded.value.clone().unwrap().to_vec();
        value.push(0);
        let result = OffsetRecord::decode(encoded.key.clone(), Some(Bytes::from(value)));
        assert_eq!(result, Err(OffsetRecordError::TrailingBytes(1)));
    }

    #[test]
    fn strings_longer_than_an_i16_length_are_refused_not_truncated() {
        let mut long = record();
        long.key.topic = "t".repeat(RECORD_STRING_BYTES_MAX + 1);
        assert!(matches!(long.encode(), Err(OffsetRecordError::FieldTooLong { field: "topic", .. })));
    }
}
