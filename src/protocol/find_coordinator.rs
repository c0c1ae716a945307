//! FindCoordinator (key 10), versions 0–2: which node runs the coordinator
//! for a consumer group (key type 0) or a transactional id (key type 1).
//! Version 1 adds the key type, throttle time and an error message.

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 2;

/// `key_type` of a consumer-group lookup.
pub const KEY_TYPE_GROUP: i8 = 0;
/// `key_type` of a transactional-id lookup.
pub const KEY_TYPE_TRANSACTION: i8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindCoordinatorRequest {
    pub key: String,
    /// Absent in v0, where the key is always a group id.
    pub key_type: i8,
}

impl FindCoordinatorRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let key = r.string()?;
        let key_type = if version >= 1 { r.i8()? } else { KEY_TYPE_GROUP };
        Ok(Self { key, key_type })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.string(&self.key);
        if version >= 1 {
            w.i8(self.key_type);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindCoordinatorResponse {
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub error_message: Option<String>,
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

impl FindCoordinatorResponse {
    /// A failed lookup: no node, as Kafka answers it.
    pub fn error(error: ErrorCode) -> Self {
        Self { throttle_time_ms: 0, error, error_message: None, node_id: -1, host: String::new(), port: -1 }
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        if version >= 1 {
            w.i32(self.throttle_time_ms);
        }
        w.i16(self.error.code());
        if version >= 1 {
            w.nullable_string(self.error_message.as_deref());
        }
        w.i32(self.node_id);
        w.string(&self.host);
        w.i32(self.port);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = if version >= 1 { r.i32()? } else { 0 };
        let error = error::from_code(r.i16()?);
        let error_message = if version >= 1 { r.nullable_string()? } else { None };
        let node_id = r.i32()?;
        let host = r.string()?;
        let port = r.i32()?;
        Ok(Self { throttle_time_ms, error, error_message, node_id, host, port })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 10, version })
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

    fn request(version: i16) -> FindCoordinatorRequest {
        let key_type = if version >= 1 { KEY_TYPE_TRANSACTION } else { KEY_TYPE_GROUP };
        FindCoordinatorRequest { key: "payments".into(), key_type }
    }

    fn response(version: i16) -> FindCoordinatorResponse {
        FindCoordinatorResponse {
            throttle_time_ms: if version >= 1 { 7 } else { 0 },
            error: ErrorCode::None,
            error_message: if version >= 1 { Some("fine".into()) } else { None },
            node_id: 3,
            host: "broker-3".into(),
            port: 9095,
        }
    }

    fn encode_request(message: &FindCoordinatorRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &FindCoordinatorResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let bytes = encode_request(&message, version);
            let decoded = FindCoordinatorRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = FindCoordinatorResponse::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn request_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let oracle =
                oracle::FindCoordinatorRequest::default().with_key(text(&message.key)).with_key_type(message.key_type);
            assert_eq!(encode_request(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn response_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let oracle = oracle::FindCoordinatorResponse::default()
                .with_throttle_time_ms(message.throttle_time_ms)
                .with_error_code(message.error.code())
                .with_error_message(message.error_message.as_deref().map(text))
                .with_node_id(oracle::BrokerId(message.node_id))
                .with_host(text(&message.host))
                .with_port(message.port);
            assert_eq!(encode_response(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_request(&request(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(FindCoordinatorRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(FindCoordinatorResponse::decode(&mut r, version).is_err());
            }
        }
    }

    #[test]
    fn version_outside_the_range_is_refused() {
        let bytes = encode_request(&request(2), 2);
        let result = FindCoordinatorRequest::decode(&mut Reader::new(bytes), 3);
        assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })));
    }
}
