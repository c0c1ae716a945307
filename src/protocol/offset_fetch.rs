//! OffsetFetch (key 9), versions 1–5. Reads a group's committed offsets; a
//! partition with no commit answers offset -1. Version 2 allows a null topic
//! list ("every topic the group committed") and adds a top-level error, 3 the
//! throttle time, 5 the leader epoch.

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 1;
pub const VERSION_MAX: i16 = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchRequest {
    pub group_id: String,
    /// `None` (v2+) asks for every committed partition of the group.
    pub topics: Option<Vec<OffsetFetchTopic>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchTopic {
    pub name: String,
    pub partition_indexes: Vec<i32>,
}

impl OffsetFetchRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let group_id = r.string()?;
        let raw_count = r.i32()?;
        if raw_count < 0 && version >= 2 {
            return Ok(Self { group_id, topics: None });
        }
        // name (2) + partition count (4); a null array in v1 reads as empty.
        let topic_count = check_count(r, raw_count, 6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let partition_count = r.array_len(4)?;
            let mut partition_indexes = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                partition_indexes.push(r.i32()?);
            }
            topics.push(OffsetFetchTopic { name, partition_indexes });
        }
        Ok(Self { group_id, topics: Some(topics) })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.string(&self.group_id);
        let Some(topics) = &self.topics else {
            // v1 cannot say "all topics"; an empty list is the closest.
            w.i32(if version >= 2 { -1 } else { 0 });
            return;
        };
        w.i32(topics.len() as i32);
        for topic in topics {
            w.string(&topic.name);
            w.i32(topic.partition_indexes.len() as i32);
            for index in &topic.partition_indexes {
                w.i32(*index);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchResponse {
    /// v3+.
    pub throttle_time_ms: i32,
    pub topics: Vec<OffsetFetchTopicResponse>,
    /// v2+.
    pub error: ErrorCode,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchTopicResponse {
    pub name: String,
    pub partitions: Vec<OffsetFetchPartitionResponse>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchPartitionResponse {
    pub partition_index: i32,
    /// -1 when the group has no commit for the partition.
    pub committed_offset: i64,
    /// v5+; -1 when unknown.
    pub committed_leader_epoch: i32,
    pub metadata: Option<String>,
    pub error: ErrorCode,
}

impl OffsetFetchPartitionResponse {
    /// A partition without a committed offset.
    pub fn none(partition_index: i32) -> Self {
        Self {
            partition_index,
            committed_offset: -1,
            committed_leader_epoch: -1,
            metadata: Some(String::new()),
            error: ErrorCode::None,
        }
    }
}

impl OffsetFetchResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        if version >= 3 {
            w.i32(self.throttle_time_ms);
        }
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for partition in &topic.partitions {
                w.i32(partition.partition_index);
                w.i64(partition.committed_offset);
                if version >= 5 {
                    w.i32(partition.committed_leader_epoch);
                }
                w.nullable_string(partition.metadata.as_deref());
                w.i16(partition.error.code());
            }
        }
        if version >= 2 {
            w.i16(self.error.code());
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = if version >= 3 { r.i32()? } else { 0 };
        // name (2) + partition count (4)
        let topic_count = r.array_len(6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            // index (4) + offset (8) + leader epoch (4, v5+) + metadata (2) + error (2)
            let partition_bytes_min = if version >= 5 { 20 } else { 16 };
            let partition_count = r.array_len(partition_bytes_min)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition_index = r.i32()?;
                let committed_offset = r.i64()?;
                let committed_leader_epoch = if version >= 5 { r.i32()? } else { -1 };
                let metadata = r.nullable_string()?;
                let error = error::from_code(r.i16()?);
                partitions.push(OffsetFetchPartitionResponse {
                    partition_index,
                    committed_offset,
                    committed_leader_epoch,
                    metadata,
                    error,
                });
            }
            topics.push(OffsetFetchTopicResponse { name, partitions });
        }
        let error = if version >= 2 { error::from_code(r.i16()?) } else { ErrorCode::None };
        Ok(Self { throttle_time_ms, topics, error })
    }
}

/// `Reader::array_len` for a count already read (the null check comes first).
fn check_count(r: &mut Reader, raw_count: i32, element_bytes_min: usize) -> DecodeResult<usize> {
    if raw_count < 0 {
        return Ok(0);
    }
    let needed = (raw_count as u64).saturating_mul(element_bytes_min as u64);
    if needed > r.remaining() as u64 {
        return Err(DecodeError::ArrayTooLong { count: i64::from(raw_count), remaining: r.remaining() });
    }
    Ok(raw_count as usize)
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 9, version })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages as oracle;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn theirs<T: Encodable>(message: &T, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("oracle encodes");
        buf.freeze()
    }

    fn text(value: &str) -> StrBytes {
        StrBytes::from_string(value.to_owned())
    }

    fn request(_version: i16) -> OffsetFetchRequest {
        OffsetFetchRequest {
            group_id: "orders".into(),
            topics: Some(vec![
                OffsetFetchTopic { name: "payments".into(), partition_indexes: vec![0, 1, 7] },
                OffsetFetchTopic { name: "refunds".into(), partition_indexes: Vec::new() },
            ]),
        }
    }

    fn response(version: i16) -> OffsetFetchResponse {
        let epoch = if version >= 5 { 9 } else { -1 };
        OffsetFetchResponse {
            throttle_time_ms: if version >= 3 { 1 } else { 0 },
            topics: vec![OffsetFetchTopicResponse {
                name: "payments".into(),
                partitions: vec![
                    OffsetFetchPartitionResponse {
                        partition_index: 0,
                        committed_offset: 77,
                        committed_leader_epoch: epoch,
                        metadata: Some("m".into()),
                        error: ErrorCode::None,
                    },
                    OffsetFetchPartitionResponse {
                        partition_index: 1,
                        committed_offset: -1,
                        committed_leader_epoch: -1,
                        metadata: None,
                        error: ErrorCode::UnknownTopicOrPartition,
                    },
                ],
            }],
            error: if version >= 2 { ErrorCode::NotCoordinator } else { ErrorCode::None },
        }
    }

    fn oracle_request(message: &OffsetFetchRequest) -> oracle::OffsetFetchRequest {
        let topics = message.topics.as_ref().map(|topics| {
            topics
                .iter()
                .map(|topic| {
                    oracle::offset_fetch_request::OffsetFetchRequestTopic::default()
                        .with_name(oracle::TopicName(text(&topic.name)))
                        .with_partition_indexes(topic.partition_indexes.clone())
                })
                .collect()
        });
        oracle::OffsetFetchRequest::default()
            .with_group_id(oracle::GroupId(text(&message.group_id)))
            .with_topics(topics)
    }

    fn oracle_response(message: &OffsetFetchResponse) -> oracle::OffsetFetchResponse {
        use oracle::offset_fetch_response::{OffsetFetchResponsePartition, OffsetFetchResponseTopic};
        let topics = message
            .topics
            .iter()
            .map(|topic| {
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        OffsetFetchResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_committed_offset(p.committed_offset)
                            .with_committed_leader_epoch(p.committed_leader_epoch)
                            .with_metadata(p.metadata.as_deref().map(text))
                            .with_error_code(p.error.code())
                    })
                    .collect();
                OffsetFetchResponseTopic::default()
                    .with_name(oracle::TopicName(text(&topic.name)))
                    .with_partitions(partitions)
            })
            .collect();
        oracle::OffsetFetchResponse::default()
            .with_throttle_time_ms(message.throttle_time_ms)
            .with_topics(topics)
            .with_error_code(message.error.code())
    }

    fn encode_request(message: &OffsetFetchRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &OffsetFetchResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let bytes = encode_request(&message, version);
            let decoded = OffsetFetchRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn null_topic_list_round_trips_from_v2() {
        for version in 2..=VERSION_MAX {
            let message = OffsetFetchRequest { group_id: "g".into(), topics: None };
            let bytes = encode_request(&message, version);
            assert_eq!(bytes, theirs(&oracle_request(&message), version));
            let decoded = OffsetFetchRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = OffsetFetchResponse::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn request_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let expected = theirs(&oracle_request(&message), version);
            assert_eq!(encode_request(&message, version), expected, "v{version}");
        }
    }

    #[test]
    fn response_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let expected = theirs(&oracle_response(&message), version);
            assert_eq!(encode_response(&message, version), expected, "v{version}");
        }
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_request(&request(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(OffsetFetchRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(OffsetFetchResponse::decode(&mut r, version).is_err());
            }
        }
    }

    #[test]
    fn topic_count_larger_than_the_frame_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.string("g");
        w.i32(50_000_000);
        let result = OffsetFetchRequest::decode(&mut Reader::new(w.into_bytes()), 3);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })));
    }
}
