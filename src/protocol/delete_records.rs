//! DeleteRecords (key 21), versions 0–1, both directions: the broker decodes
//! requests and encodes responses, our admin client does the reverse. Both
//! versions share one layout (v1 only answers before throttling); v2 is the
//! first flexible version.
//!
//! ```text
//! request   topics [name string, partitions [partition_index i32, offset i64]]
//!           timeout_ms i32
//! response  throttle_time_ms i32,
//!           topics [name string,
//!                   partitions [partition_index i32, low_watermark i64, error_code i16]]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsRequest {
    pub topics: Vec<DeleteRecordsTopic>,
    pub timeout_ms: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsTopic {
    pub name: String,
    pub partitions: Vec<DeleteRecordsPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsPartition {
    pub partition_index: i32,
    /// Records below this offset go; -1 means the high watermark.
    pub offset: i64,
}

impl DeleteRecordsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let topic_count = r.array_len(TOPIC_BYTES_MIN)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let partition_count = r.array_len(PARTITION_BYTES)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition_index = r.i32()?;
                let offset = r.i64()?;
                partitions.push(DeleteRecordsPartition { partition_index, offset });
            }
            topics.push(DeleteRecordsTopic { name, partitions });
        }
        let timeout_ms = r.i32()?;
        Ok(Self { topics, timeout_ms })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for partition in &topic.partitions {
                w.i32(partition.partition_index);
                w.i64(partition.offset);
            }
        }
        w.i32(self.timeout_ms);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteRecordsResponse {
    pub throttle_time_ms: i32,
    pub topics: Vec<DeleteRecordsTopicResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsTopicResult {
    pub name: String,
    pub partitions: Vec<DeleteRecordsPartitionResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsPartitionResult {
    pub partition_index: i32,
    /// The partition's log start offset after the deletion.
    pub low_watermark: i64,
    pub error: ErrorCode,
}

impl DeleteRecordsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i32(topic.partitions.len() as i32);
            for partition in &topic.partitions {
                w.i32(partition.partition_index);
                w.i64(partition.low_watermark);
                w.i16(partition.error.code());
            }
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let topic_count = r.array_len(TOPIC_BYTES_MIN)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let partition_count = r.array_len(PARTITION_RESULT_BYTES)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition_index = r.i32()?;
                let low_watermark = r.i64()?;
                let error = error::from_code(r.i16()?);
                partitions.push(DeleteRecordsPartitionResult { partition_index, low_watermark, error });
            }
            topics.push(DeleteRecordsTopicResult { name, partitions });
        }
        Ok(Self { throttle_time_ms, topics })
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated.
/// name, partitions length (requests and responses alike).
const TOPIC_BYTES_MIN: usize = 2 + 4;
/// partition_index, offset.
const PARTITION_BYTES: usize = 4 + 8;
/// partition_index, low_watermark, error_code.
const PARTITION_RESULT_BYTES: usize = 4 + 8 + 2;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::DeleteRecords as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "DeleteRecords v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::delete_records_request as kp_req;
    use kafka_protocol::messages::delete_records_response as kp_resp;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request() -> DeleteRecordsRequest {
        DeleteRecordsRequest {
            topics: vec![
                DeleteRecordsTopic {
                    name: "orders".into(),
                    partitions: vec![
                        DeleteRecordsPartition { partition_index: 0, offset: 1 << 40 },
                        DeleteRecordsPartition { partition_index: 7, offset: -1 },
                    ],
                },
                DeleteRecordsTopic { name: "quiet".into(), partitions: vec![] },
            ],
            timeout_ms: 5_000,
        }
    }

    fn sample_response() -> DeleteRecordsResponse {
        DeleteRecordsResponse {
            throttle_time_ms: 11,
            topics: vec![DeleteRecordsTopicResult {
                name: "orders".into(),
                partitions: vec![
                    DeleteRecordsPartitionResult { partition_index: 0, low_watermark: 1 << 40, error: ErrorCode::None },
                    DeleteRecordsPartitionResult {
                        partition_index: 7,
                        low_watermark: -1,
                        error: ErrorCode::OffsetOutOfRange,
                    },
                ],
            }],
        }
    }

    fn topic_name(s: &str) -> TopicName {
        TopicName(StrBytes::from_string(s.to_owned()))
    }

    fn kp_request(ours: &DeleteRecordsRequest) -> kp_req::DeleteRecordsRequest {
        let topics = ours
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        kp_req::DeleteRecordsPartition::default()
                            .with_partition_index(p.partition_index)
                            .with_offset(p.offset)
                    })
                    .collect();
                kp_req::DeleteRecordsTopic::default().with_name(topic_name(&t.name)).with_partitions(partitions)
            })
            .collect();
        kp_req::DeleteRecordsRequest::default().with_topics(topics).with_timeout_ms(ours.timeout_ms)
    }

    fn kp_response(ours: &DeleteRecordsResponse) -> kp_resp::DeleteRecordsResponse {
        let topics = ours
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        kp_resp::DeleteRecordsPartitionResult::default()
                            .with_partition_index(p.partition_index)
                            .with_low_watermark(p.low_watermark)
                            .with_error_code(p.error.code())
                    })
                    .collect();
                kp_resp::DeleteRecordsTopicResult::default().with_name(topic_name(&t.name)).with_partitions(partitions)
            })
            .collect();
        kp_resp::DeleteRecordsResponse::default().with_throttle_time_ms(ours.throttle_time_ms).with_topics(topics)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &DeleteRecordsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &DeleteRecordsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn delete_records_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(request_bytes(&sample_request(), version));
            assert_eq!(DeleteRecordsRequest::decode(&mut r, version).unwrap(), sample_request(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn delete_records_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(response_bytes(&sample_response(), version));
            assert_eq!(DeleteRecordsResponse::decode(&mut r, version).unwrap(), sample_response(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn delete_records_request_v0_to_v1_matches_kafka_protocol_encoding() {
        let theirs = kp_request(&sample_request());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = request_bytes(&sample_request(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_req::DeleteRecordsRequest::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn delete_records_response_v0_to_v1_matches_kafka_protocol_encoding() {
        let theirs = kp_response(&sample_response());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = response_bytes(&sample_response(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_resp::DeleteRecordsResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn truncated_delete_records_frames_are_errors_not_panics() {
        let request = request_bytes(&sample_request(), VERSION_MAX);
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(DeleteRecordsRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
        let response = response_bytes(&sample_response(), VERSION_MAX);
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(DeleteRecordsResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn delete_records_partition_count_beyond_the_frame_is_refused_before_allocating() {
        // 5 partitions of 12 bytes cannot fit in the 59 bytes that follow.
        let mut w = Writer::new();
        w.i32(1);
        w.string("orders");
        w.i32(5);
        w.raw(&[0; 59]);
        let mut r = Reader::new(w.into_bytes());
        let result = DeleteRecordsRequest::decode(&mut r, VERSION_MAX);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn delete_records_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_request(), VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = DeleteRecordsRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn delete_records_versions_match_the_advertised_range() {
        let range = ApiKey::DeleteRecords.range().expect("DeleteRecords is advertised");
        assert_eq!((range.version_min, range.version_max), (VERSION_MIN, VERSION_MAX));
        assert!(range.flexible_from > VERSION_MAX, "this codec writes no flexible version");
    }
}
