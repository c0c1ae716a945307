//! OffsetForLeaderEpoch (key 23), versions 2–3, both directions: the broker
//! decodes requests and encodes responses, followers and our client do the
//! reverse. v2 is the floor (it adds `current_leader_epoch` for fencing, and
//! Kafka 4.0 dropped v0–1); v3 adds `replica_id`; v4 is the first flexible
//! version.
//!
//! ```text
//! request   replica_id i32 (v3+),
//!           topics [topic string,
//!                   partitions [partition i32, current_leader_epoch i32, leader_epoch i32]]
//! response  throttle_time_ms i32,
//!           topics [topic string,
//!                   partitions [error_code i16, partition i32, leader_epoch i32, end_offset i64]]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 2;
pub const VERSION_MAX: i16 = 3;

/// First version that carries `replica_id`.
const REPLICA_ID_VERSION_MIN: i16 = 3;

/// `replica_id` of a consumer.
pub const REPLICA_ID_CONSUMER: i32 = -1;
/// `replica_id` when the version does not carry it (the schema default,
/// Kafka's "debugging" replica).
pub const REPLICA_ID_DEFAULT: i32 = -2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetForLeaderEpochRequest {
    /// The follower's broker id, `REPLICA_ID_CONSUMER` for a consumer; sent
    /// from v3, `REPLICA_ID_DEFAULT` below.
    pub replica_id: i32,
    pub topics: Vec<OffsetForLeaderTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetForLeaderTopic {
    pub topic: String,
    pub partitions: Vec<OffsetForLeaderPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetForLeaderPartition {
    pub partition: i32,
    /// The leader epoch the sender knows, to fence stale metadata; -1 skips the check.
    pub current_leader_epoch: i32,
    /// The epoch whose end offset is asked for.
    pub leader_epoch: i32,
}

impl OffsetForLeaderEpochRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let replica_id = if version >= REPLICA_ID_VERSION_MIN { r.i32()? } else { REPLICA_ID_DEFAULT };
        let topic_count = r.array_len(TOPIC_BYTES_MIN)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let topic = r.string()?;
            let partition_count = r.array_len(PARTITION_BYTES)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition = r.i32()?;
                let current_leader_epoch = r.i32()?;
                let leader_epoch = r.i32()?;
                partitions.push(OffsetForLeaderPartition { partition, current_leader_epoch, leader_epoch });
            }
            topics.push(OffsetForLeaderTopic { topic, partitions });
        }
        Ok(Self { replica_id, topics })
    }

    /// Below v3 `replica_id` is not sent, whatever its value (Kafka marks it
    /// ignorable).
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        if version >= REPLICA_ID_VERSION_MIN {
            w.i32(self.replica_id);
        }
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.topic);
            w.i32(topic.partitions.len() as i32);
            for partition in &topic.partitions {
                w.i32(partition.partition);
                w.i32(partition.current_leader_epoch);
                w.i32(partition.leader_epoch);
            }
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OffsetForLeaderEpochResponse {
    pub throttle_time_ms: i32,
    pub topics: Vec<OffsetForLeaderTopicResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetForLeaderTopicResult {
    pub topic: String,
    pub partitions: Vec<EpochEndOffset>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochEndOffset {
    pub error: ErrorCode,
    pub partition: i32,
    /// The largest epoch not above the one asked for; -1 when unknown.
    pub leader_epoch: i32,
    /// Where that epoch ends; -1 when unknown.
    pub end_offset: i64,
}

impl EpochEndOffset {
    /// An answer carrying only an error, with the schema's -1 placeholders.
    pub fn error(partition: i32, error: ErrorCode) -> Self {
        Self { error, partition, leader_epoch: -1, end_offset: -1 }
    }
}

impl OffsetForLeaderEpochResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.topic);
            w.i32(topic.partitions.len() as i32);
            for partition in &topic.partitions {
                w.i16(partition.error.code());
                w.i32(partition.partition);
                w.i32(partition.leader_epoch);
                w.i64(partition.end_offset);
            }
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let topic_count = r.array_len(TOPIC_BYTES_MIN)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let topic = r.string()?;
            let partition_count = r.array_len(PARTITION_RESULT_BYTES)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let error = error::from_code(r.i16()?);
                let partition = r.i32()?;
                let leader_epoch = r.i32()?;
                let end_offset = r.i64()?;
                partitions.push(EpochEndOffset { error, partition, leader_epoch, end_offset });
            }
            topics.push(OffsetForLeaderTopicResult { topic, partitions });
        }
        Ok(Self { throttle_time_ms, topics })
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated.
/// topic, partitions length (requests and responses alike).
const TOPIC_BYTES_MIN: usize = 2 + 4;
/// partition, current_leader_epoch, leader_epoch.
const PARTITION_BYTES: usize = 4 + 4 + 4;
/// error_code, partition, leader_epoch, end_offset.
const PARTITION_RESULT_BYTES: usize = 2 + 4 + 4 + 8;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::OffsetForLeaderEpoch as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "OffsetForLeaderEpoch v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::offset_for_leader_epoch_request as kp_req;
    use kafka_protocol::messages::offset_for_leader_epoch_response as kp_resp;
    use kafka_protocol::messages::{BrokerId, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    /// A request whose every field the given version carries.
    fn sample_request(version: i16) -> OffsetForLeaderEpochRequest {
        OffsetForLeaderEpochRequest {
            replica_id: if version >= REPLICA_ID_VERSION_MIN { 3 } else { REPLICA_ID_DEFAULT },
            topics: vec![
                OffsetForLeaderTopic {
                    topic: "orders".into(),
                    partitions: vec![
                        OffsetForLeaderPartition { partition: 0, current_leader_epoch: 5, leader_epoch: 4 },
                        OffsetForLeaderPartition { partition: 9, current_leader_epoch: -1, leader_epoch: 0 },
                    ],
                },
                OffsetForLeaderTopic { topic: "quiet".into(), partitions: vec![] },
            ],
        }
    }

    fn sample_response() -> OffsetForLeaderEpochResponse {
        OffsetForLeaderEpochResponse {
            throttle_time_ms: 1,
            topics: vec![OffsetForLeaderTopicResult {
                topic: "orders".into(),
                partitions: vec![
                    EpochEndOffset { error: ErrorCode::None, partition: 0, leader_epoch: 4, end_offset: 1 << 33 },
                    EpochEndOffset::error(9, ErrorCode::FencedLeaderEpoch),
                ],
            }],
        }
    }

    fn topic_name(s: &str) -> TopicName {
        TopicName(StrBytes::from_string(s.to_owned()))
    }

    fn kp_request(ours: &OffsetForLeaderEpochRequest) -> kp_req::OffsetForLeaderEpochRequest {
        let topics = ours
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        kp_req::OffsetForLeaderPartition::default()
                            .with_partition(p.partition)
                            .with_current_leader_epoch(p.current_leader_epoch)
                            .with_leader_epoch(p.leader_epoch)
                    })
                    .collect();
                kp_req::OffsetForLeaderTopic::default().with_topic(topic_name(&t.topic)).with_partitions(partitions)
            })
            .collect();
        kp_req::OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(ours.replica_id)).with_topics(topics)
    }

    fn kp_response(ours: &OffsetForLeaderEpochResponse) -> kp_resp::OffsetForLeaderEpochResponse {
        let topics = ours
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        kp_resp::EpochEndOffset::default()
                            .with_error_code(p.error.code())
                            .with_partition(p.partition)
                            .with_leader_epoch(p.leader_epoch)
                            .with_end_offset(p.end_offset)
                    })
                    .collect();
                kp_resp::OffsetForLeaderTopicResult::default()
                    .with_topic(topic_name(&t.topic))
                    .with_partitions(partitions)
            })
            .collect();
        kp_resp::OffsetForLeaderEpochResponse::default()
            .with_throttle_time_ms(ours.throttle_time_ms)
            .with_topics(topics)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &OffsetForLeaderEpochRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &OffsetForLeaderEpochResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn offset_for_leader_epoch_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(request_bytes(&sample_request(version), version));
            let decoded = OffsetForLeaderEpochRequest::decode(&mut r, version).unwrap();
            assert_eq!(decoded, sample_request(version), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn offset_for_leader_epoch_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(response_bytes(&sample_response(), version));
            let decoded = OffsetForLeaderEpochResponse::decode(&mut r, version).unwrap();
            assert_eq!(decoded, sample_response(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn offset_for_leader_epoch_request_v2_to_v3_matches_kafka_protocol_encoding() {
        for version in VERSION_MIN..=VERSION_MAX {
            let theirs = kp_request(&sample_request(version));
            let ours = request_bytes(&sample_request(version), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_req::OffsetForLeaderEpochRequest::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn offset_for_leader_epoch_response_v2_to_v3_matches_kafka_protocol_encoding() {
        let theirs = kp_response(&sample_response());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = response_bytes(&sample_response(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_resp::OffsetForLeaderEpochResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn offset_for_leader_epoch_v2_request_omits_replica_id_and_reads_the_default() {
        let v3 = request_bytes(&sample_request(3), 3);
        let v2 = request_bytes(&sample_request(3), 2);
        assert_eq!(v2.len() + 4, v3.len());
        let decoded = OffsetForLeaderEpochRequest::decode(&mut Reader::new(v2), 2).unwrap();
        assert_eq!(decoded.replica_id, REPLICA_ID_DEFAULT);
    }

    #[test]
    fn truncated_offset_for_leader_epoch_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let request = request_bytes(&sample_request(version), version);
            for len in 0..request.len() {
                let mut r = Reader::new(request.slice(..len));
                let result = OffsetForLeaderEpochRequest::decode(&mut r, version);
                assert!(result.is_err(), "v{version} request cut at {len}");
            }
        }
        let response = response_bytes(&sample_response(), VERSION_MAX);
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(OffsetForLeaderEpochResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn offset_for_leader_epoch_partition_count_beyond_the_frame_is_refused_before_allocating() {
        // Four partition results need at least 4 × 18 bytes; 71 follow the count.
        let mut w = Writer::new();
        w.i32(0); // throttle_time_ms
        w.i32(1);
        w.string("orders");
        w.i32(4);
        w.raw(&[0; 71]);
        let mut r = Reader::new(w.into_bytes());
        let result = OffsetForLeaderEpochResponse::decode(&mut r, VERSION_MAX);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn offset_for_leader_epoch_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_request(VERSION_MAX), VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = OffsetForLeaderEpochRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn offset_for_leader_epoch_versions_match_the_advertised_range() {
        let range = ApiKey::OffsetForLeaderEpoch.range().expect("OffsetForLeaderEpoch is advertised");
        assert_eq!((range.version_min, range.version_max), (VERSION_MIN, VERSION_MAX));
        assert!(range.flexible_from > VERSION_MAX, "this codec writes no flexible version");
    }
}
