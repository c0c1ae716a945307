//! OffsetCommit (key 8), versions 2–7. A member (or a simple consumer with
//! generation -1 and no member id) stores its positions. Versions 2–4 carry a
//! retention time that we read and ignore (retention is broker
//! configuration); 3 adds the throttle time, 6 the leader epoch, 7 static
//! membership (`group_instance_id`).

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 2;
pub const VERSION_MAX: i16 = 7;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitRequest {
    pub group_id: String,
    /// -1 for a consumer that assigns partitions itself.
    pub generation_id: i32,
    pub member_id: String,
    /// v7+.
    pub group_instance_id: Option<String>,
    /// v2–4 only; -1 means "the broker's default".
    pub retention_time_ms: i64,
    pub topics: Vec<OffsetCommitTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitTopic {
    pub name: String,
    pub partitions: Vec<OffsetCommitPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitPartition {
    pub partition_index: i32,
    pub committed_offset: i64,
    /// v6+; -1 when unknown.
    pub committed_leader_epoch: i32,
    pub committed_metadata: Option<String>,
}

impl OffsetCommitRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let group_id = r.string()?;
        let generation_id = r.i32()?;
        let member_id = r.string()?;
        let group_instance_id = if version >= 7 { r.nullable_string()? } else { None };
        let retention_time_ms = if version <= 4 { r.i64()? } else { -1 };
        // name (2) + partition count (4)
        let topic_count = r.array_len(6)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            // index (4) + offset (8) + leader epoch (4, v6+) + metadata (2)
            let partition_bytes_min = if version >= 6 { 18 } else { 14 };
            let partition_count = r.array_len(partition_bytes_min)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition_index = r.i32()?;
                let committed_offset = r.i64()?;
                let committed_leader_epoch = if version >= 6 { r.i32()? } else { -1 };
                let committed_metadata = r.nullable_string()?;
                partitions.push(OffsetCommitPartition {
                    partition_index,
                    committed_offset,
                    committed_leader_epoch,
                    committed_metadata,
                });
            }
            topics.push(OffsetCommitTopic { name, partitions });
        }
        Ok(Self { group_id, generation_id, member_id, group_instance_id, retention_time_ms, topics })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.string(&self.group_id);
        w.i32(self.generation_id);
        w.string(&self.member_id);
        if version >= 7 {
            w.nullable_string(self.group_instance_id.as_deref());
        }
        if version <= 4 {
            w.i64(self.retention_time_ms);
        }
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for partition in &topic.partitions {
                w.i32(partition.partition_index);
                w.i64(partition.committed_offset);
                if version >= 6 {
                    w.i32(partition.committed_leader_epoch);
                }
                w.nullable_string(partition.committed_metadata.as_deref());
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OffsetCommitResponse {
    /// v3+.
    pub throttle_time_ms: i32,
    pub topics: Vec<OffsetCommitTopicResponse>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitTopicResponse {
    pub name: String,
    pub partitions: Vec<OffsetCommitPartitionResponse>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitPartitionResponse {
    pub partition_index: i32,
    pub error: ErrorCode,
}

impl OffsetCommitResponse {
    /// The same error for every partition of the request.
    pub fn all(request: &OffsetCommitRequest, error: ErrorCode) -> Self {
        let topics = request
            .topics
            .iter()
            .map(|topic| OffsetCommitTopicResponse {
                name: topic.name.clone(),
                partitions: topic
                    .partitions
                    .iter()
                    .map(|p| OffsetCommitPartitionResponse { partition_index: p.partition_index, error })
                    .collect(),
            })
            .collect();
        Self { throttle_time_ms: 0, topics }
    }

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
                w.i16(partition.error.code());
            }
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
            // index (4) + error code (2)
            let partition_count = r.array_len(6)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition_index = r.i32()?;
                let error = error::from_code(r.i16()?);
                partitions.push(OffsetCommitPartitionResponse { partition_index, error });
            }
            topics.push(OffsetCommitTopicResponse { name, partitions });
        }
        Ok(Self { throttle_time_ms, topics })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 8, version })
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

    fn request(version: i16) -> OffsetCommitRequest {
        let epoch = if version >= 6 { 5 } else { -1 };
        OffsetCommitRequest {
            group_id: "orders".into(),
            generation_id: 8,
            member_id: "m-1".into(),
            group_instance_id: if version >= 7 { Some("host-a".into()) } else { None },
            retention_time_ms: if version <= 4 { 86_400_000 } else { -1 },
            topics: vec![
                OffsetCommitTopic {
                    name: "payments".into(),
                    partitions: vec![
                        OffsetCommitPartition {
                            partition_index: 0,
                            committed_offset: 1_000,
                            committed_leader_epoch: epoch,
                            committed_metadata: Some("checkpoint".into()),
                        },
                        OffsetCommitPartition {
                            partition_index: 3,
                            committed_offset: 42,
                            committed_leader_epoch: epoch,
                            committed_metadata: None,
                        },
                    ],
                },
                OffsetCommitTopic { name: "empty".into(), partitions: Vec::new() },
            ],
        }
    }

    fn response(version: i16) -> OffsetCommitResponse {
        OffsetCommitResponse {
            throttle_time_ms: if version >= 3 { 6 } else { 0 },
            topics: vec![OffsetCommitTopicResponse {
                name: "payments".into(),
                partitions: vec![
                    OffsetCommitPartitionResponse { partition_index: 0, error: ErrorCode::None },
                    OffsetCommitPartitionResponse { partition_index: 3, error: ErrorCode::OffsetMetadataTooLarge },
                ],
            }],
        }
    }

    fn oracle_request(message: &OffsetCommitRequest) -> oracle::OffsetCommitRequest {
        use oracle::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
        let topics = message
            .topics
            .iter()
            .map(|topic| {
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(p.partition_index)
                            .with_committed_offset(p.committed_offset)
                            .with_committed_leader_epoch(p.committed_leader_epoch)
                            .with_committed_metadata(p.committed_metadata.as_deref().map(text))
                    })
                    .collect();
                OffsetCommitRequestTopic::default()
                    .with_name(oracle::TopicName(text(&topic.name)))
                    .with_partitions(partitions)
            })
            .collect();
        oracle::OffsetCommitRequest::default()
            .with_group_id(oracle::GroupId(text(&message.group_id)))
            .with_generation_id_or_member_epoch(message.generation_id)
            .with_member_id(text(&message.member_id))
            .with_group_instance_id(message.group_instance_id.as_deref().map(text))
            .with_retention_time_ms(message.retention_time_ms)
            .with_topics(topics)
    }

    fn oracle_response(message: &OffsetCommitResponse) -> oracle::OffsetCommitResponse {
        use oracle::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
        let topics = message
            .topics
            .iter()
            .map(|topic| {
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        OffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(p.error.code())
                    })
                    .collect();
                OffsetCommitResponseTopic::default()
                    .with_name(oracle::TopicName(text(&topic.name)))
                    .with_partitions(partitions)
            })
            .collect();
        oracle::OffsetCommitResponse::default().with_throttle_time_ms(message.throttle_time_ms).with_topics(topics)
    }

    fn encode_request(message: &OffsetCommitRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &OffsetCommitResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let bytes = encode_request(&message, version);
            let decoded = OffsetCommitRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = OffsetCommitResponse::decode(&mut Reader::new(bytes), version).unwrap();
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
                assert!(OffsetCommitRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(OffsetCommitResponse::decode(&mut r, version).is_err());
            }
        }
    }

    #[test]
    fn versions_before_2_are_refused() {
        let bytes = encode_request(&request(2), 2);
        let result = OffsetCommitRequest::decode(&mut Reader::new(bytes), 1);
        assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })));
    }
}
