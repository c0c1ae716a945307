//! Heartbeat (key 12), versions 0–3. Keeps a member's session alive; the
//! error code is how members learn that a rebalance has started. Version 1
//! adds the throttle time, 3 static membership (`group_instance_id`).

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    /// v3+.
    pub group_instance_id: Option<String>,
}

impl HeartbeatRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let group_id = r.string()?;
        let generation_id = r.i32()?;
        let member_id = r.string()?;
        let group_instance_id = if version >= 3 { r.nullable_string()? } else { None };
        Ok(Self { group_id, generation_id, member_id, group_instance_id })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.string(&self.group_id);
        w.i32(self.generation_id);
        w.string(&self.member_id);
        if version >= 3 {
            w.nullable_string(self.group_instance_id.as_deref());
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatResponse {
    /// v1+.
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
}

impl HeartbeatResponse {
    pub fn new(error: ErrorCode) -> Self {
        Self { throttle_time_ms: 0, error }
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        if version >= 1 {
            w.i32(self.throttle_time_ms);
        }
        w.i16(self.error.code());
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = if version >= 1 { r.i32()? } else { 0 };
        let error = error::from_code(r.i16()?);
        Ok(Self { throttle_time_ms, error })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 12, version })
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

    fn request(version: i16) -> HeartbeatRequest {
        HeartbeatRequest {
            group_id: "orders".into(),
            generation_id: 12,
            member_id: "m-7".into(),
            group_instance_id: if version >= 3 { Some("host-b".into()) } else { None },
        }
    }

    fn response(version: i16) -> HeartbeatResponse {
        HeartbeatResponse { throttle_time_ms: if version >= 1 { 2 } else { 0 }, error: ErrorCode::IllegalGeneration }
    }

    fn encode_request(message: &HeartbeatRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &HeartbeatResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let bytes = encode_request(&message, version);
            let decoded = HeartbeatRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = HeartbeatResponse::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn request_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let oracle = oracle::HeartbeatRequest::default()
                .with_group_id(oracle::GroupId(text(&message.group_id)))
                .with_generation_id(message.generation_id)
                .with_member_id(text(&message.member_id))
                .with_group_instance_id(message.group_instance_id.as_deref().map(text));
            assert_eq!(encode_request(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn response_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let oracle = oracle::HeartbeatResponse::default()
                .with_throttle_time_ms(message.throttle_time_ms)
                .with_error_code(message.error.code());
            assert_eq!(encode_response(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_request(&request(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(HeartbeatRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(HeartbeatResponse::decode(&mut r, version).is_err());
            }
        }
    }
}
