//! JoinGroup (key 11), versions 0–5. A long poll: the coordinator holds the
//! request until the rebalance completes (see `group::state`). Version 1 adds
//! the rebalance timeout, 2 the throttle time, 4 the two-step join with
//! MEMBER_ID_REQUIRED, 5 static membership (`group_instance_id`).

use bytes::Bytes;

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupRequest {
    pub group_id: String,
    pub session_timeout_ms: i32,
    /// -1 in v0, which has no such field: the session timeout stands in.
    pub rebalance_timeout_ms: i32,
    /// Empty on a member's first join.
    pub member_id: String,
    /// v5+.
    pub group_instance_id: Option<String>,
    pub protocol_type: String,
    /// In the member's order of preference.
    pub protocols: Vec<JoinGroupProtocol>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupProtocol {
    pub name: String,
    pub metadata: Bytes,
}

impl JoinGroupRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let group_id = r.string()?;
        let session_timeout_ms = r.i32()?;
        let rebalance_timeout_ms = if version >= 1 { r.i32()? } else { -1 };
        let member_id = r.string()?;
        let group_instance_id = if version >= 5 { r.nullable_string()? } else { None };
        let protocol_type = r.string()?;
        // name (2) + metadata (4)
        let count = r.array_len(6)?;
        let mut protocols = Vec::with_capacity(count);
        for _ in 0..count {
            let name = r.string()?;
            let metadata = r.bytes()?;
            protocols.push(JoinGroupProtocol { name, metadata });
        }
        Ok(Self {
            group_id,
            session_timeout_ms,
            rebalance_timeout_ms,
            member_id,
            group_instance_id,
            protocol_type,
            protocols,
        })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.string(&self.group_id);
        w.i32(self.session_timeout_ms);
        if version >= 1 {
            w.i32(self.rebalance_timeout_ms);
        }
        w.string(&self.member_id);
        if version >= 5 {
            w.nullable_string(self.group_instance_id.as_deref());
        }
        w.string(&self.protocol_type);
        w.i32(self.protocols.len() as i32);
        for protocol in &self.protocols {
            w.string(&protocol.name);
            w.bytes_v(&protocol.metadata, false);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupResponse {
    /// v2+.
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub generation_id: i32,
    pub protocol_name: String,
    pub leader: String,
    pub member_id: String,
    /// Filled for the leader only: every member with its metadata for the
    /// chosen protocol.
    pub members: Vec<JoinGroupMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupMember {
    pub member_id: String,
    /// v5+.
    pub group_instance_id: Option<String>,
    pub metadata: Bytes,
}

impl JoinGroupResponse {
    /// A failed join: generation -1, no protocol, no leader, no members.
    pub fn error(member_id: String, error: ErrorCode) -> Self {
        Self {
            throttle_time_ms: 0,
            error,
            generation_id: -1,
            protocol_name: String::new(),
            leader: String::new(),
            member_id,
            members: Vec::new(),
        }
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        if version >= 2 {
            w.i32(self.throttle_time_ms);
        }
        w.i16(self.error.code());
        w.i32(self.generation_id);
        w.string(&self.protocol_name);
        w.string(&self.leader);
        w.string(&self.member_id);
        w.i32(self.members.len() as i32);
        for member in &self.members {
            w.string(&member.member_id);
            if version >= 5 {
                w.nullable_string(member.group_instance_id.as_deref());
            }
            w.bytes_v(&member.metadata, false);
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = if version >= 2 { r.i32()? } else { 0 };
        let error = error::from_code(r.i16()?);
        let generation_id = r.i32()?;
        let protocol_name = r.string()?;
        let leader = r.string()?;
        let member_id = r.string()?;
        // member_id (2) + group_instance_id (2, v5+) + metadata (4)
        let member_bytes_min = if version >= 5 { 8 } else { 6 };
        let count = r.array_len(member_bytes_min)?;
        let mut members = Vec::with_capacity(count);
        for _ in 0..count {
            let member_id = r.string()?;
            let group_instance_id = if version >= 5 { r.nullable_string()? } else { None };
            let metadata = r.bytes()?;
            members.push(JoinGroupMember { member_id, group_instance_id, metadata });
        }
        Ok(Self { throttle_time_ms, error, generation_id, protocol_name, leader, member_id, members })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 11, version })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
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

    fn request(version: i16) -> JoinGroupRequest {
        JoinGroupRequest {
            group_id: "orders".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: if version >= 1 { 60_000 } else { -1 },
            member_id: "consumer-1-abc".into(),
            group_instance_id: if version >= 5 { Some("host-a".into()) } else { None },
            protocol_type: "consumer".into(),
            protocols: vec![
                JoinGroupProtocol { name: "range".into(), metadata: Bytes::from_static(b"\x00\x01r") },
                JoinGroupProtocol { name: "roundrobin".into(), metadata: Bytes::new() },
            ],
        }
    }

    fn response(version: i16) -> JoinGroupResponse {
        let instance = |name: &str| {
            if version >= 5 {
                Some(name.to_owned())
            } else {
                None
            }
        };
        JoinGroupResponse {
            throttle_time_ms: if version >= 2 { 5 } else { 0 },
            error: ErrorCode::None,
            generation_id: 4,
            protocol_name: "range".into(),
            leader: "m-1".into(),
            member_id: "m-1".into(),
            members: vec![
                JoinGroupMember {
                    member_id: "m-1".into(),
                    group_instance_id: instance("host-a"),
                    metadata: Bytes::from_static(b"meta-1"),
                },
                JoinGroupMember { member_id: "m-2".into(), group_instance_id: None, metadata: Bytes::new() },
            ],
        }
    }

    fn oracle_request(message: &JoinGroupRequest) -> oracle::JoinGroupRequest {
        let protocols = message
            .protocols
            .iter()
            .map(|p| {
                oracle::join_group_request::JoinGroupRequestProtocol::default()
                    .with_name(text(&p.name))
                    .with_metadata(p.metadata.clone())
            })
            .collect();
        oracle::JoinGroupRequest::default()
            .with_group_id(oracle::GroupId(text(&message.group_id)))
            .with_session_timeout_ms(message.session_timeout_ms)
            .with_rebalance_timeout_ms(message.rebalance_timeout_ms)
            .with_member_id(text(&message.member_id))
            .with_group_instance_id(message.group_instance_id.as_deref().map(text))
            .with_protocol_type(text(&message.protocol_type))
            .with_protocols(protocols)
    }

    fn oracle_response(message: &JoinGroupResponse) -> oracle::JoinGroupResponse {
        let members = message
            .members
            .iter()
            .map(|m| {
                oracle::join_group_response::JoinGroupResponseMember::default()
                    .with_member_id(text(&m.member_id))
                    .with_group_instance_id(m.group_instance_id.as_deref().map(text))
                    .with_metadata(m.metadata.clone())
            })
            .collect();
        oracle::JoinGroupResponse::default()
            .with_throttle_time_ms(message.throttle_time_ms)
            .with_error_code(message.error.code())
            .with_generation_id(message.generation_id)
            .with_protocol_name(Some(text(&message.protocol_name)))
            .with_leader(text(&message.leader))
            .with_member_id(text(&message.member_id))
            .with_members(members)
    }

    fn encode_request(message: &JoinGroupRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &JoinGroupResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let bytes = encode_request(&message, version);
            let decoded = JoinGroupRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = JoinGroupResponse::decode(&mut Reader::new(bytes), version).unwrap();
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
                assert!(JoinGroupRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(JoinGroupResponse::decode(&mut r, version).is_err());
            }
        }
    }

    #[test]
    fn protocol_count_larger_than_the_frame_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.string("g");
        w.i32(10_000);
        w.i32(60_000);
        w.string("");
        w.string("consumer");
        w.i32(1_000_000);
        let result = JoinGroupRequest::decode(&mut Reader::new(w.into_bytes()), 1);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })));
    }
}
