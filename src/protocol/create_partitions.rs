//! CreatePartitions (key 37), versions 0–1, both directions: the broker
//! decodes requests and encodes responses, our admin client does the reverse.
//! Both versions share one layout (v1 only answers before throttling); v2 is
//! the first flexible version.
//!
//! ```text
//! request   topics [name string, count i32,
//!                   assignments nullable [broker_ids [i32]]]
//!           timeout_ms i32, validate_only bool
//! response  throttle_time_ms i32,
//!           results [name string, error_code i16, error_message nullable string]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePartitionsRequest {
    pub topics: Vec<CreatePartitionsTopic>,
    pub timeout_ms: i32,
    /// Check that the partitions could be added, but add none.
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePartitionsTopic {
    pub name: String,
    /// The partition count wanted, not the number to add.
    pub count: i32,
    /// Replicas of each new partition, in order; `None` lets the broker place them.
    pub assignments: Option<Vec<CreatePartitionsAssignment>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePartitionsAssignment {
    pub broker_ids: Vec<i32>,
}

impl CreatePartitionsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let topic_count = r.array_len(TOPIC_BYTES_MIN)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            topics.push(CreatePartitionsTopic::decode(r)?);
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
pub struct CreatePartitionsResponse {
    pub throttle_time_ms: i32,
    pub results: Vec<CreatePartitionsTopicResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePartitionsTopicResult {
    pub name: String,
    pub error: ErrorCode,
    pub error_message: Option<String>,
}

impl CreatePartitionsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i32(self.results.len() as i32);
        for result in &self.results {
            w.string(&result.name);
            w.i16(result.error.code());
            w.nullable_string(result.error_message.as_deref());
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let result_count = r.array_len(TOPIC_RESULT_BYTES_MIN)?;
        let mut results = Vec::with_capacity(result_count);
        for _ in 0..result_count {
            let name = r.string()?;
            let error = error::from_code(r.i16()?);
            let error_message = r.nullable_string()?;
            results.push(CreatePartitionsTopicResult { name, error, error_message });
        }
        Ok(Self { throttle_time_ms, results })
    }
}

impl CreatePartitionsTopic {
    fn decode(r: &mut Reader) -> DecodeResult<Self> {
        let name = r.string()?;
        let count = r.i32()?;
        let assignments = match r.nullable_array_len(ASSIGNMENT_BYTES_MIN)? {
            None => None,
            Some(assignment_count) => {
                let mut assignments = Vec::with_capacity(assignment_count);
                for _ in 0..assignment_count {
                    let broker_count = r.array_len(BROKER_ID_BYTES)?;
                    let mut broker_ids = Vec::with_capacity(broker_count);
                    for _ in 0..broker_count {
                        broker_ids.push(r.i32()?);
                    }
                    assignments.push(CreatePartitionsAssignment { broker_ids });
                }
                Some(assignments)
            }
        };
        Ok(Self { name, count, assignments })
    }

    fn encode(&self, w: &mut Writer) {
        w.string(&self.name);
        w.i32(self.count);
        match &self.assignments {
            None => w.i32(-1),
            Some(assignments) => {
                w.i32(assignments.len() as i32);
                for assignment in assignments {
                    w.i32(assignment.broker_ids.len() as i32);
                    for &broker_id in &assignment.broker_ids {
                        w.i32(broker_id);
                    }
                }
            }
        }
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated.
/// name, count, assignments length.
const TOPIC_BYTES_MIN: usize = 2 + 4 + 4;
/// broker_ids length.
const ASSIGNMENT_BYTES_MIN: usize = 4;
const BROKER_ID_BYTES: usize = 4;
/// name, error_code, error_message.
const TOPIC_RESULT_BYTES_MIN: usize = 2 + 2 + 2;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::CreatePartitions as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "CreatePartitions v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::create_partitions_request as kp_req;
    use kafka_protocol::messages::create_partitions_response as kp_resp;
    use kafka_protocol::messages::{BrokerId, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request() -> CreatePartitionsRequest {
        CreatePartitionsRequest {
            topics: vec![
                CreatePartitionsTopic { name: "orders".into(), count: 24, assignments: None },
                CreatePartitionsTopic {
                    name: "placed".into(),
                    count: 3,
                    assignments: Some(vec![
                        CreatePartitionsAssignment { broker_ids: vec![1, 2] },
                        CreatePartitionsAssignment { broker_ids: vec![] },
                    ]),
                },
                CreatePartitionsTopic { name: "empty-assignments".into(), count: 1, assignments: Some(vec![]) },
            ],
            timeout_ms: 10_000,
            validate_only: false,
        }
    }

    fn sample_response() -> CreatePartitionsResponse {
        CreatePartitionsResponse {
            throttle_time_ms: 0,
            results: vec![
                CreatePartitionsTopicResult { name: "orders".into(), error: ErrorCode::None, error_message: None },
                CreatePartitionsTopicResult {
                    name: "placed".into(),
                    error: ErrorCode::InvalidPartitions,
                    error_message: Some("Topic already has 3 partitions.".into()),
                },
            ],
        }
    }

    fn str_bytes(s: &str) -> StrBytes {
        StrBytes::from_string(s.to_owned())
    }

    fn kp_request(ours: &CreatePartitionsRequest) -> kp_req::CreatePartitionsRequest {
        let topics = ours
            .topics
            .iter()
            .map(|t| {
                let assignments = t.assignments.as_ref().map(|assignments| {
                    assignments
                        .iter()
                        .map(|a| {
                            kp_req::CreatePartitionsAssignment::default()
                                .with_broker_ids(a.broker_ids.iter().map(|&b| BrokerId(b)).collect())
                        })
                        .collect()
                });
                kp_req::CreatePartitionsTopic::default()
                    .with_name(TopicName(str_bytes(&t.name)))
                    .with_count(t.count)
                    .with_assignments(assignments)
            })
            .collect();
        kp_req::CreatePartitionsRequest::default()
            .with_topics(topics)
            .with_timeout_ms(ours.timeout_ms)
            .with_validate_only(ours.validate_only)
    }

    fn kp_response(ours: &CreatePartitionsResponse) -> kp_resp::CreatePartitionsResponse {
        let results = ours
            .results
            .iter()
            .map(|t| {
                kp_resp::CreatePartitionsTopicResult::default()
                    .with_name(TopicName(str_bytes(&t.name)))
                    .with_error_code(t.error.code())
                    .with_error_message(t.error_message.as_deref().map(str_bytes))
            })
            .collect();
        kp_resp::CreatePartitionsResponse::default().with_throttle_time_ms(ours.throttle_time_ms).with_results(results)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &CreatePartitionsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &CreatePartitionsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn create_partitions_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(request_bytes(&sample_request(), version));
            assert_eq!(CreatePartitionsRequest::decode(&mut r, version).unwrap(), sample_request(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn create_partitions_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(response_bytes(&sample_response(), version));
            assert_eq!(CreatePartitionsResponse::decode(&mut r, version).unwrap(), sample_response(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn create_partitions_request_v0_to_v1_matches_kafka_protocol_encoding() {
        let theirs = kp_request(&sample_request());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = request_bytes(&sample_request(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_req::CreatePartitionsRequest::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn create_partitions_response_v0_to_v1_matches_kafka_protocol_encoding() {
        let theirs = kp_response(&sample_response());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = response_bytes(&sample_response(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_resp::CreatePartitionsResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn create_partitions_null_assignments_stay_distinct_from_empty_ones() {
        let mut r = Reader::new(request_bytes(&sample_request(), VERSION_MAX));
        let decoded = CreatePartitionsRequest::decode(&mut r, VERSION_MAX).unwrap();
        assert_eq!(decoded.topics[0].assignments, None);
        assert_eq!(decoded.topics[2].assignments, Some(vec![]));
    }

    #[test]
    fn truncated_create_partitions_frames_are_errors_not_panics() {
        let request = request_bytes(&sample_request(), VERSION_MAX);
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(CreatePartitionsRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
        let response = response_bytes(&sample_response(), VERSION_MAX);
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(CreatePartitionsResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn create_partitions_assignment_count_beyond_the_frame_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.i32(1); // one topic
        w.string("orders");
        w.i32(3); // count
        w.i32(i32::MAX); // assignments
        w.raw(&[0; 64]);
        let mut r = Reader::new(w.into_bytes());
        let result = CreatePartitionsRequest::decode(&mut r, VERSION_MAX);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn create_partitions_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_request(), VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = CreatePartitionsRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn create_partitions_versions_match_the_advertised_range() {
        let range = ApiKey::CreatePartitions.range().expect("CreatePartitions is advertised");
        assert_eq!((range.version_min, range.version_max), (VERSION_MIN, VERSION_MAX));
        assert!(range.flexible_from > VERSION_MAX, "this codec writes no flexible version");
    }
}
