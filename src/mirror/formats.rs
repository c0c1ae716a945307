//! MirrorMaker 2's record formats (Kafka's `Struct` encoding: STRING is an
//! i16 length and UTF-8 bytes, INT16/32/64 big-endian), so its tools and
//! `RemoteClusterUtils` read what `shardlog mirror` writes:
//!
//! ```text
//! offset sync  key: topic STRING, partition INT32
//!              value: upstreamOffset INT64, offset INT64
//! checkpoint   key: group STRING, topic STRING, partition INT32
//!              value: version INT16 (0), upstreamOffset INT64, offset INT64, metadata STRING
//! heartbeat    key: sourceClusterAlias STRING, targetClusterAlias STRING
//!              value: version INT16 (0), timestamp INT64
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetSync {
    /// The source topic and partition.
    pub topic: String,
    pub partition: i32,
    /// A source offset and the target offset its record was copied to.
    pub upstream: i64,
    pub downstream: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub group: String,
    /// The target's topic (renamed) and partition.
    pub topic: String,
    pub partition: i32,
    pub upstream: i64,
    pub downstream: i64,
    pub metadata: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub source_alias: String,
    pub target_alias: String,
    pub timestamp_ms: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("record too short")]
    Short,
    #[error("string is not UTF-8")]
    Utf8,
    #[error("unknown version {0}")]
    Version(i16),
}

fn put_string(out: &mut BytesMut, s: &str) {
    out.put_i16(s.len() as i16);
    out.put_slice(s.as_bytes());
}

fn get_string(data: &mut &[u8]) -> Result<String, FormatError> {
    let len = get_i16(data)?;
    if len < 0 || data.len() < len as usize {
        return Err(FormatError::Short);
    }
    let (s, rest) = data.split_at(len as usize);
    *data = rest;
    String::from_utf8(s.to_vec()).map_err(|_| FormatError::Utf8)
}

fn get_i16(data: &mut &[u8]) -> Result<i16, FormatError> {
    if data.len() < 2 {
        return Err(FormatError::Short);
    }
    Ok(data.get_i16())
}

fn get_i32(data: &mut &[u8]) -> Result<i32, FormatError> {
    if data.len() < 4 {
        return Err(FormatError::Short);
    }
    Ok(data.get_i32())
}

fn get_i64(data: &mut &[u8]) -> Result<i64, FormatError> {
    if data.len() < 8 {
        return Err(FormatError::Short);
    }
    Ok(data.get_i64())
}

fn version(data: &mut &[u8]) -> Result<(), FormatError> {
    match get_i16(data)? {
        0 => Ok(()),
        v => Err(FormatError::Version(v)),
    }
}

impl OffsetSync {
    pub fn key(&self) -> Bytes {
        let mut out = BytesMut::new();
        put_string(&mut out, &self.topic);
        out.put_i32(self.partition);
        out.freeze()
    }

    pub fn value(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_i64(self.upstream);
        out.put_i64(self.downstream);
        out.freeze()
    }

    pub fn decode(mut key: &[u8], mut value: &[u8]) -> Result<Self, FormatError> {
        Ok(Self {
            topic: get_string(&mut key)?,
            partition: get_i32(&mut key)?,
            upstream: get_i64(&mut value)?,
            downstream: get_i64(&mut value)?,
        })
    }
}

impl Checkpoint {
    pub fn key(&self) -> Bytes {
        let mut out = BytesMut::new();
        put_string(&mut out, &self.group);
        put_string(&mut out, &self.topic);
        out.put_i32(self.partition);
        out.freeze()
    }

    pub fn value(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_i16(0);
        out.put_i64(self.upstream);
        out.put_i64(self.downstream);
        put_string(&mut out, &self.metadata);
        out.freeze()
    }

    pub fn decode(mut key: &[u8], mut value: &[u8]) -> Result<Self, FormatError> {
        let group = get_string(&mut key)?;
        let topic = get_string(&mut key)?;
        let partition = get_i32(&mut key)?;
        version(&mut value)?;
        Ok(Self {
            group,
            topic,
            partition,
            upstream: get_i64(&mut value)?,
            downstream: get_i64(&mut value)?,
            metadata: get_string(&mut value)?,
        })
    }
}

impl Heartbeat {
    pub fn key(&self) -> Bytes {
        let mut out = BytesMut::new();
        put_string(&mut out, &self.source_alias);
        put_string(&mut out, &self.target_alias);
        out.freeze()
    }

    pub fn value(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_i16(0);
        out.put_i64(self.timestamp_ms);
        out.freeze()
    }

    pub fn decode(mut key: &[u8], mut value: &[u8]) -> Result<Self, FormatError> {
        let source_alias = get_string(&mut key)?;
        let target_alias = get_string(&mut key)?;
        version(&mut value)?;
        Ok(Self { source_alias, target_alias, timestamp_ms: get_i64(&mut value)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_sync_bytes_are_kafka_struct_encoding() {
        let sync = OffsetSync { topic: "ab".into(), partition: 3, upstream: 7, downstream: 9 };
        assert_eq!(&sync.key()[..], &[0, 2, b'a', b'b', 0, 0, 0, 3]);
        assert_eq!(&sync.value()[..], &[0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 9]);
        assert_eq!(OffsetSync::decode(&sync.key(), &sync.value()), Ok(sync));
    }

    #[test]
    fn checkpoint_value_starts_with_version_zero() {
        let checkpoint = Checkpoint {
            group: "g".into(),
            topic: "east.t".into(),
            partition: 1,
            upstream: 100,
            downstream: 40,
            metadata: "m".into(),
        };
        let value = checkpoint.value();
        assert_eq!(&value[..2], &[0, 0]);
        assert_eq!(value.len(), 2 + 8 + 8 + 2 + 1);
        assert_eq!(&checkpoint.key()[..3], &[0, 1, b'g']);
        assert_eq!(Checkpoint::decode(&checkpoint.key(), &value), Ok(checkpoint));
    }

    #[test]
    fn heartbeat_round_trips_and_a_future_version_is_refused() {
        let beat = Heartbeat { source_alias: "east".into(), target_alias: "west".into(), timestamp_ms: 5 };
        assert_eq!(Heartbeat::decode(&beat.key(), &beat.value()), Ok(beat.clone()));
        let mut value = beat.value().to_vec();
        value[1] = 1;
        assert_eq!(Heartbeat::decode(&beat.key(), &value), Err(FormatError::Version(1)));
        assert_eq!(Heartbeat::decode(&beat.key()[..3], &beat.value()), Err(FormatError::Short));
    }
}
