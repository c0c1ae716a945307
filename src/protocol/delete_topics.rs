//! DeleteTopics (key 20), versions 1–3, both directions: the broker decodes
//! requests and encodes responses, our admin client does the reverse. The
//! three versions share one layout (v3 only adds TOPIC_DELETION_DISABLED to
//! the errors a broker may answer); v4 is the first flexible version.
//!
//! ```text
//! request   topic_names [string], timeout_ms i32
//! response  throttle_time_ms i32, responses [name string, error_code i16]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 1;
pub const VERSION_MAX: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteTopicsRequest {
    pub topic_names: Vec<String>,
    pub timeout_ms: i32,
}

impl DeleteTopicsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let name_count = r.array_len(TOPIC_NAME_BYTES_MIN)?;
        let mut topic_names = Vec::with_capacity(name_count);
        for _ in 0..name_count {
            topic_names.push(r.string()?);
        }
        let timeout_ms = r.i32()?;
        Ok(Self { topic_names, timeout_ms })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.topic_names.len() as i32);
        for name in &self.topic_names {
            w.string(name);
        }
        w.i32(self.timeout_ms);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteTopicsResponse {
    pub throttle_time_ms: i32,
    pub responses: Vec<DeletableTopicResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletableTopicResult {
    pub name: String,
    pub error: ErrorCode,
}

impl DeleteTopicsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i32(self.responses.len() as i32);
        for result in &self.responses {
            w.string(&result.name);
            w.i16(result.error.code());
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let result_count = r.array_len(TOPIC_RESULT_BYTES_MIN)?;
        let mut responses = Vec::with_capacity(result_count);
        for _ in 0..result_count {
            let name = r.string()?;
            let error = error::from_code(r.i16()?);
            responses.push(DeletableTopicResult { name, error });
        }
        Ok(Self { throttle_time_ms, responses })
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated.
/// A string's length prefix.
const TOPIC_NAME_BYTES_MIN: usize = 2;
/// name, error_code.
const TOPIC_RESULT_BYTES_MIN: usize = 2 + 2;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::DeleteTopics as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "DeleteTopics v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::delete_topics_request as kp_req;
    use kafka_protocol::messages::delete_topics_response as kp_resp;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request() -> DeleteTopicsRequest {
        DeleteTopicsRequest { topic_names: vec!["orders".into(), "".into(), "ünïcode".into()], timeout_ms: 15_000 }
    }

    fn sample_response() -> DeleteTopicsResponse {
        DeleteTopicsResponse {
            throttle_time_ms: 3,
            responses: vec![
                DeletableTopicResult { name: "orders".into(), error: ErrorCode::None },
                DeletableTopicResult { name: "".into(), error: ErrorCode::InvalidTopicException },
                DeletableTopicResult { name: "ünïcode".into(), error: ErrorCode::UnknownTopicOrPartition },
            ],
        }
    }

    fn topic_name(s: &str) -> TopicName {
        TopicName(StrBytes::from_string(s.to_owned()))
    }

    fn kp_request(ours: &DeleteTopicsRequest) -> kp_req::DeleteTopicsRequest {
        kp_req::DeleteTopicsRequest::default()
            .with_topic_names(ours.topic_names.iter().map(|n| topic_name(n)).collect())
            .with_timeout_ms(ours.timeout_ms)
    }

    fn kp_response(ours: &DeleteTopicsResponse) -> kp_resp::DeleteTopicsResponse {
        let responses = ours
            .responses
            .iter()
            .map(|t| {
                kp_resp::DeletableTopicResult::default()
                    .with_name(Some(topic_name(&t.name)))
                    .with_error_code(t.error.code())
            })
            .collect();
        kp_resp::DeleteTopicsResponse::default().with_throttle_time_ms(ours.throttle_time_ms).with_responses(responses)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &DeleteTopicsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &DeleteTopicsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn delete_topics_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(request_bytes(&sample_request(), version));
            assert_eq!(DeleteTopicsRequest::decode(&mut r, version).unwrap(), sample_request(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn delete_topics_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(response_bytes(&sample_response(), version));
            assert_eq!(DeleteTopicsResponse::decode(&mut r, version).unwrap(), sample_response(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn delete_topics_request_v1_to_v3_matches_kafka_protocol_encoding() {
        let theirs = kp_request(&sample_request());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = request_bytes(&sample_request(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_req::DeleteTopicsRequest::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn delete_topics_response_v1_to_v3_matches_kafka_protocol_encoding() {
        let theirs = kp_response(&sample_response());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = response_bytes(&sample_response(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_resp::DeleteTopicsResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn truncated_delete_topics_frames_are_errors_not_panics() {
        let request = request_bytes(&sample_request(), VERSION_MAX);
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(DeleteTopicsRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
        let response = response_bytes(&sample_response(), VERSION_MAX);
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(DeleteTopicsResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn delete_topics_name_count_beyond_the_frame_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.i32(i32::MAX);
        w.raw(&[0; 64]);
        let mut r = Reader::new(w.into_bytes());
        let result = DeleteTopicsRequest::decode(&mut r, VERSION_MAX);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn delete_topics_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_request(), VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = DeleteTopicsRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn delete_topics_versions_match_the_advertised_range() {
        let range = ApiKey::DeleteTopics.range().expect("DeleteTopics is advertised");
        assert_eq!((range.version_min, range.version_max), (VERSION_MIN, VERSION_MAX));
        assert!(range.flexible_from > VERSION_MAX, "this codec writes no flexible version");
    }
}
