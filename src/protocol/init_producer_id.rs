//! InitProducerId (key 22), versions 0–1, both directions: the broker decodes
//! requests and encodes responses, our client does the reverse. Both versions
//! share one layout (v1 only answers before throttling); v2 is the first
//! flexible version and v3 adds the current producer id and epoch.
//!
//! ```text
//! request   transactional_id nullable string, transaction_timeout_ms i32
//! response  throttle_time_ms i32, error_code i16, producer_id i64, producer_epoch i16
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdRequest {
    /// `None` for an idempotent producer outside transactions.
    pub transactional_id: Option<String>,
    /// How long an idle transaction may stay open; meaningful only with a
    /// transactional id.
    pub transaction_timeout_ms: i32,
}

impl InitProducerIdRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let transactional_id = r.nullable_string()?;
        let transaction_timeout_ms = r.i32()?;
        Ok(Self { transactional_id, transaction_timeout_ms })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.nullable_string(self.transactional_id.as_deref());
        w.i32(self.transaction_timeout_ms);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdResponse {
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    /// -1 with an error.
    pub producer_id: i64,
    pub producer_epoch: i16,
}

impl InitProducerIdResponse {
    /// An answer carrying only an error, with the schema's -1 placeholders.
    pub fn error(error: ErrorCode) -> Self {
        Self { throttle_time_ms: 0, error, producer_id: -1, producer_epoch: -1 }
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i16(self.error.code());
        w.i64(self.producer_id);
        w.i16(self.producer_epoch);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let error = error::from_code(r.i16()?);
        let producer_id = r.i64()?;
        let producer_epoch = r.i16()?;
        Ok(Self { throttle_time_ms, error, producer_id, producer_epoch })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::InitProducerId as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "InitProducerId v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::{
        InitProducerIdRequest as KpRequest, InitProducerIdResponse as KpResponse, ProducerId, TransactionalId,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_requests() -> Vec<InitProducerIdRequest> {
        vec![
            InitProducerIdRequest { transactional_id: Some("payments-tx-1".into()), transaction_timeout_ms: 60_000 },
            InitProducerIdRequest { transactional_id: None, transaction_timeout_ms: -1 },
            InitProducerIdRequest { transactional_id: Some("".into()), transaction_timeout_ms: 0 },
        ]
    }

    fn sample_responses() -> Vec<InitProducerIdResponse> {
        vec![
            InitProducerIdResponse {
                throttle_time_ms: 5,
                error: ErrorCode::None,
                producer_id: 0x1234_5678_9abc,
                producer_epoch: 3,
            },
            InitProducerIdResponse::error(ErrorCode::CoordinatorLoadInProgress),
        ]
    }

    fn kp_request(ours: &InitProducerIdRequest) -> KpRequest {
        KpRequest::default()
            .with_transactional_id(
                ours.transactional_id.as_ref().map(|id| TransactionalId(StrBytes::from_string(id.clone()))),
            )
            .with_transaction_timeout_ms(ours.transaction_timeout_ms)
    }

    fn kp_response(ours: &InitProducerIdResponse) -> KpResponse {
        KpResponse::default()
            .with_throttle_time_ms(ours.throttle_time_ms)
            .with_error_code(ours.error.code())
            .with_producer_id(ProducerId(ours.producer_id))
            .with_producer_epoch(ours.producer_epoch)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &InitProducerIdRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &InitProducerIdResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn init_producer_id_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            for request in sample_requests() {
                let mut r = Reader::new(request_bytes(&request, version));
                assert_eq!(InitProducerIdRequest::decode(&mut r, version).unwrap(), request, "v{version}");
                assert_eq!(r.remaining(), 0, "v{version}");
            }
        }
    }

    #[test]
    fn init_producer_id_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            for response in sample_responses() {
                let mut r = Reader::new(response_bytes(&response, version));
                assert_eq!(InitProducerIdResponse::decode(&mut r, version).unwrap(), response, "v{version}");
                assert_eq!(r.remaining(), 0, "v{version}");
            }
        }
    }

    #[test]
    fn init_producer_id_request_v0_to_v1_matches_kafka_protocol_encoding() {
        for version in VERSION_MIN..=VERSION_MAX {
            for request in sample_requests() {
                let theirs = kp_request(&request);
                let ours = request_bytes(&request, version);
                assert_eq!(ours, kp_encode(&theirs, version), "v{version} {request:?}");
                assert_eq!(KpRequest::decode(&mut ours.clone(), version).unwrap(), theirs, "v{version}");
            }
        }
    }

    #[test]
    fn init_producer_id_response_v0_to_v1_matches_kafka_protocol_encoding() {
        for version in VERSION_MIN..=VERSION_MAX {
            for response in sample_responses() {
                let theirs = kp_response(&response);
                let ours = response_bytes(&response, version);
                assert_eq!(ours, kp_encode(&theirs, version), "v{version} {response:?}");
                assert_eq!(KpResponse::decode(&mut ours.clone(), version).unwrap(), theirs, "v{version}");
            }
        }
    }

    #[test]
    fn truncated_init_producer_id_frames_are_errors_not_panics() {
        let request = request_bytes(&sample_requests()[0], VERSION_MAX);
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(InitProducerIdRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
        let response = response_bytes(&sample_responses()[0], VERSION_MAX);
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(InitProducerIdResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn init_producer_id_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_requests()[0], VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = InitProducerIdRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn init_producer_id_versions_match_the_advertised_range() {
        let range = ApiKey::InitProducerId.range().expect("InitProducerId is advertised");
        assert_eq!((range.version_min, range.version_max), (VERSION_MIN, VERSION_MAX));
        assert!(range.flexible_from > VERSION_MAX, "this codec writes no flexible version");
    }
}
