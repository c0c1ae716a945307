//! CreateTopics (key 19), versions 2–4, both directions: the broker decodes
//! requests and encodes responses, our admin client does the reverse. None of
//! these versions is flexible (v5 is, and adds per-topic configs to the
//! response); v2–4 share one layout, v4 only relaxes what -1 may mean.
//!
//! ```text
//! request   topics [name string, num_partitions i32, replication_factor i16,
//!                   assignments [partition_index i32, broker_ids [i32]],
//!                   configs [name string, value nullable string]]
//!           timeout_ms i32, validate_only bool
//! response  throttle_time_ms i32,
//!           topics [name string, error_code i16, error_message nullable string]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 2;
pub const VERSION_MAX: i16 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopicsRequest {
    pub topics: Vec<CreatableTopic>,
    pub timeout_ms: i32,
    /// Check that the topics could be created, but create nothing.
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatableTopic {
    pub name: String,
    /// -1 when `assignments` places the partitions, or (v4+) for the broker default.
    pub num_partitions: i32,
    /// -1 when `assignments` places the replicas, or (v4+) for the broker default.
    pub replication_factor: i16,
    /// Manual placement; empty for automatic placement.
    pub assignments: Vec<CreatableReplicaAssignment>,
    pub configs: Vec<CreatableTopicConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatableReplicaAssignment {
    pub partition_index: i32,
    pub broker_ids: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatableTopicConfig {
    pub name: String,
    pub value: Option<String>,
}

impl CreateTopicsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let topic_count = r.array_len(TOPIC_BYTES_MIN)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            topics.push(CreatableTopic::decode(r)?);
        }
        let timeout_ms = r.i32()?;
        let validate_only = r.bool()?;
        Ok(Self { topics, timeout_ms, validate_only })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            topic.encode(w);
        }
        w.i32(self.timeout_ms);
        w.bool(self.validate_only);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateTopicsResponse {
    pub throttle_time_ms: i32,
    pub topics: Vec<CreatableTopicResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatableTopicResult {
    pub name: String,
    pub error: ErrorCode,
    pub error_message: Option<String>,
}

impl CreateTopicsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i32(self.topics.len() as i32);
        for topic in &self.topics {
            w.string(&topic.name);
            w.i16(topic.error.code());
            w.nullable_string(topic.error_message.as_deref());
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let topic_count = r.array_len(TOPIC_RESULT_BYTES_MIN)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let name = r.string()?;
            let error = error::from_code(r.i16()?);
            let error_message = r.nullable_string()?;
            topics.push(CreatableTopicResult { name, error, error_message });
        }
        Ok(Self { throttle_time_ms, topics })
    }
}

impl CreatableTopic {
    fn decode(r: &mut Reader) -> DecodeResult<Self> {
        let name = r.string()?;
        let num_partitions = r.i32()?;
        let replication_factor = r.i16()?;
        let assignment_count = r.array_len(ASSIGNMENT_BYTES_MIN)?;
        let mut assignments = Vec::with_capacity(assignment_count);
        for _ in 0..assignment_count {
            let partition_index = r.i32()?;
            let broker_count = r.array_len(BROKER_ID_BYTES)?;
            let mut broker_ids = Vec::with_capacity(broker_count);
            for _ in 0..broker_count {
                broker_ids.push(r.i32()?);
            }
            assignments.push(CreatableReplicaAssignment { partition_index, broker_ids });
        }
        let config_count = r.array_len(CONFIG_BYTES_MIN)?;
        let mut configs = Vec::with_capacity(config_count);
        for _ in 0..config_count {
            let name = r.string()?;
            let value = r.nullable_string()?;
            configs.push(CreatableTopicConfig { name, value });
        }
        Ok(Self { name, num_partitions, replication_factor, assignments, configs })
    }

    fn encode(&self, w: &mut Writer) {
        w.string(&self.name);
        w.i32(self.num_partitions);
        w.i16(self.replication_factor);
        w.i32(self.assignments.len() as i32);
        for assignment in &self.assignments {
            w.i32(assignment.partition_index);
            w.i32(assignment.broker_ids.len() as i32);
            for &broker_id in &assignment.broker_ids {
                w.i32(broker_id);
            }
        }
        w.i32(self.configs.len() as i32);
        for config in &self.configs {
            w.string(&config.name);
            w.nullable_string(config.value.as_deref());
        }
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated.
/// name, num_partitions, replication_factor, two array lengths.
const TOPIC_BYTES_MIN: usize = 2 + 4 + 2 + 4 + 4;
/// partition_index, broker_ids length.
const ASSIGNMENT_BYTES_MIN: usize = 4 + 4;
const BROKER_ID_BYTES: usize = 4;
/// name, value (null is still a length).
const CONFIG_BYTES_MIN: usize = 2 + 2;
/// name, error_code, error_message.
const TOPIC_RESULT_BYTES_MIN: usize = 2 + 2 + 2;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::CreateTopics as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "CreateTopics v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::create_topics_request as kp_req;
    use kafka_protocol::messages::create_topics_response as kp_resp;
    use kafka_protocol::messages::{BrokerId, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request() -> CreateTopicsRequest {
        CreateTopicsRequest {
            topics: vec![
                CreatableTopic {
                    name: "orders".into(),
                    num_partitions: 12,
                    replication_factor: 3,
                    assignments: vec![],
                    configs: vec![
                        CreatableTopicConfig { name: "cleanup.policy".into(), value: Some("compact".into()) },
                        CreatableTopicConfig { name: "retention.ms".into(), value: None },
                    ],
                },
                CreatableTopic {
                    name: "placed-ü".into(),
                    num_partitions: -1,
                    replication_factor: -1,
                    assignments: vec![
                        CreatableReplicaAssignment { partition_index: 0, broker_ids: vec![1, 2, 3] },
                        CreatableReplicaAssignment { partition_index: 1, broker_ids: vec![] },
                    ],
                    configs: vec![],
                },
            ],
            timeout_ms: 30_000,
            validate_only: true,
        }
    }

    fn sample_response() -> CreateTopicsResponse {
        CreateTopicsResponse {
            throttle_time_ms: 7,
            topics: vec![
                CreatableTopicResult { name: "orders".into(), error: ErrorCode::None, error_message: None },
                CreatableTopicResult {
                    name: "placed-ü".into(),
                    error: ErrorCode::TopicAlreadyExists,
                    error_message: Some("Topic 'placed-ü' already exists.".into()),
                },
            ],
        }
    }

    fn str_bytes(s: &str) -> StrBytes {
        StrBytes::from_string(s.to_owned())
    }

    fn kp_request(ours: &CreateTopicsRequest) -> kp_req::CreateTopicsRequest {
        let topics = ours
            .topics
            .iter()
            .map(|t| {
                kp_req::CreatableTopic::default()
                    .with_name(TopicName(str_bytes(&t.name)))
                    .with_num_partitions(t.num_partitions)
                    .with_replication_factor(t.replication_factor)
                    .with_assignments(
                        t.assignments
                            .iter()
                            .map(|a| {
                                kp_req::CreatableReplicaAssignment::default()
                                    .with_partition_index(a.partition_index)
                                    .with_broker_ids(a.broker_ids.iter().map(|&b| BrokerId(b)).collect())
                            })
                            .collect(),
                    )
                    .with_configs(
                        t.configs
                            .iter()
                            .map(|c| {
                                kp_req::CreatableTopicConfig::default()
                                    .with_name(str_bytes(&c.name))
                                    .with_value(c.value.as_deref().map(str_bytes))
                            })
                            .collect(),
                    )
            })
            .collect();
        kp_req::CreateTopicsRequest::default()
            .with_topics(topics)
            .with_timeout_ms(ours.timeout_ms)
            .with_validate_only(ours.validate_only)
    }

    fn kp_response(ours: &CreateTopicsResponse) -> kp_resp::CreateTopicsResponse {
        let topics = ours
            .topics
            .iter()
            .map(|t| {
                kp_resp::CreatableTopicResult::default()
                    .with_name(TopicName(str_bytes(&t.name)))
                    .with_error_code(t.error.code())
                    .with_error_message(t.error_message.as_deref().map(str_bytes))
            })
            .collect();
        kp_resp::CreateTopicsResponse::default().with_throttle_time_ms(ours.throttle_time_ms).with_topics(topics)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &CreateTopicsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &CreateTopicsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn create_topics_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(request_bytes(&sample_request(), version));
            assert_eq!(CreateTopicsRequest::decode(&mut r, version).unwrap(), sample_request(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn create_topics_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(response_bytes(&sample_response(), version));
            assert_eq!(CreateTopicsResponse::decode(&mut r, version).unwrap(), sample_response(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn create_topics_request_v2_to_v4_matches_kafka_protocol_encoding() {
        let theirs = kp_request(&sample_request());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = request_bytes(&sample_request(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_req::CreateTopicsRequest::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn create_topics_response_v2_to_v4_matches_kafka_protocol_encoding() {
        let theirs = kp_response(&sample_response());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = response_bytes(&sample_response(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_resp::CreateTopicsResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn truncated_create_topics_frames_are_errors_not_panics() {
        let request = request_bytes(&sample_request(), VERSION_MAX);
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(CreateTopicsRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
        let response = response_bytes(&sample_response(), VERSION_MAX);
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(CreateTopicsResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn create_topics_topic_count_beyond_the_frame_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.i32(i32::MAX);
        w.raw(&[0; 64]);
        let mut r = Reader::new(w.into_bytes());
        let result = CreateTopicsRequest::decode(&mut r, VERSION_MAX);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn create_topics_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_request(), VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = CreateTopicsRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn create_topics_versions_match_the_advertised_range() {
        let range = ApiKey::CreateTopics.range().expect("CreateTopics is advertised");
        assert_eq!((range.version_min, range.version_max), (VERSION_MIN, VERSION_MAX));
        assert!(range.flexible_from > VERSION_MAX, "this codec writes no flexible version");
    }
}
