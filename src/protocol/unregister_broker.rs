//! UnregisterBroker (key 64), version 0, both directions; flexible (KIP-500:
//! an administrator removes a broker that is gone for good). shardlog
//! unregisters the whole machine the named node belongs to, once it is
//! fenced and holds no replica.
//!
//! ```text
//! request   broker_id i32
//! response  throttle_time_ms i32, error_code i16, error_message nullable string
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MAX: i16 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnregisterBrokerRequest {
    pub broker_id: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnregisterBrokerResponse {
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub error_message: Option<String>,
}

impl UnregisterBrokerRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let broker_id = r.i32()?;
        r.tagged_fields()?;
        Ok(Self { broker_id })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check_version(version).is_ok(), "UnregisterBroker v{version} is not supported");
        w.i32(self.broker_id);
        w.tagged_fields_v(true);
    }
}

impl UnregisterBrokerResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check_version(version).is_ok(), "UnregisterBroker v{version} is not supported");
        w.i32(self.throttle_time_ms);
        w.i16(self.error.code());
        w.nullable_string_v(self.error_message.as_deref(), true);
        w.tagged_fields_v(true);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let error = error::from_code(r.i16()?);
        let error_message = r.nullable_string_v(true)?;
        r.tagged_fields()?;
        Ok(Self { throttle_time_ms, error, error_message })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (0..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::UnregisterBroker as i16, version })
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::{unregister_broker_request as kp_req, unregister_broker_response as kp_resp};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::*;

    fn encoded<F: FnOnce(&mut Writer)>(f: F) -> Bytes {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    fn theirs<T: Encodable>(message: &T) -> Bytes {
        let mut out = BytesMut::new();
        message.encode(&mut out, 0).expect("kafka-protocol encodes");
        out.freeze()
    }

    #[test]
    fn unregister_broker_matches_kafka_protocol_encoding_both_ways() {
        let request = UnregisterBrokerRequest { broker_id: 7 };
        let ours = encoded(|w| request.encode(w, 0));
        assert_eq!(
            ours,
            theirs(&kp_req::UnregisterBrokerRequest::default().with_broker_id(kafka_protocol::messages::BrokerId(7)))
        );
        assert_eq!(UnregisterBrokerRequest::decode(&mut Reader::new(ours), 0).unwrap(), request);
        let response = UnregisterBrokerResponse {
            throttle_time_ms: 0,
            error: ErrorCode::InvalidRequest,
            error_message: Some("leads partitions".into()),
        };
        let ours = encoded(|w| response.encode(w, 0));
        let kafka = kp_resp::UnregisterBrokerResponse::default()
            .with_error_code(ErrorCode::InvalidRequest.code())
            .with_error_message(Some(StrBytes::from_static_str("leads partitions")));
        assert_eq!(ours, theirs(&kafka));
        assert_eq!(UnregisterBrokerResponse::decode(&mut Reader::new(ours), 0).unwrap(), response);
    }

    #[test]
    fn a_truncated_unregister_broker_request_is_a_decode_error() {
        let bytes = encoded(|w| UnregisterBrokerRequest { broker_id: 7 }.encode(w, 0));
        for cut in 0..bytes.len() {
            assert!(UnregisterBrokerRequest::decode(&mut Reader::new(bytes.slice(..cut)), 0).is_err());
        }
    }
}
