//! LeaveGroup (key 13), versions 0–3. Versions 0–2 name one member; version 3
//! names a batch, each by member id and/or group instance id (an operator may
//! remove a static member by its instance id alone), and answers per member.
//! Version 1 adds the throttle time.

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 3;

/// First version that names members in a batch.
pub const BATCH_VERSION_MIN: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveGroupRequest {
    pub group_id: String,
    /// v0–2 only.
    pub member_id: String,
    /// v3+ only.
    pub members: Vec<LeavingMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeavingMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
}

impl LeaveGroupRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let group_id = r.string()?;
        if version < BATCH_VERSION_MIN {
            let member_id = r.string()?;
            return Ok(Self { group_id, member_id, members: Vec::new() });
        }
        // member_id (2) + group_instance_id (2)
        let count = r.array_len(4)?;
        let mut members = Vec::with_capacity(count);
        for _ in 0..count {
            let member_id = r.string()?;
            let group_instance_id = r.nullable_string()?;
            members.push(LeavingMember { member_id, group_instance_id });
        }
        Ok(Self { group_id, member_id: String::new(), members })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.string(&self.group_id);
        if version < BATCH_VERSION_MIN {
            w.string(&self.member_id);
            return;
        }
        w.i32(self.members.len() as i32);
        for member in &self.members {
            w.string(&member.member_id);
            w.nullable_string(member.group_instance_id.as_deref());
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveGroupResponse {
    /// v1+.
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    /// v3+ only.
    pub members: Vec<LeftMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub error: ErrorCode,
}

impl LeaveGroupResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        if version >= 1 {
            w.i32(self.throttle_time_ms);
        }
        w.i16(self.error.code());
        if version < BATCH_VERSION_MIN {
            return;
        }
        w.i32(self.members.len() as i32);
        for member in &self.members {
            w.string(&member.member_id);
            w.nullable_string(member.group_instance_id.as_deref());
            w.i16(member.error.code());
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = if version >= 1 { r.i32()? } else { 0 };
        let error = error::from_code(r.i16()?);
        let mut members = Vec::new();
        if version >= BATCH_VERSION_MIN {
            // member_id (2) + group_instance_id (2) + error_code (2)
            let count = r.array_len(6)?;
            members.reserve(count);
            for _ in 0..count {
                let member_id = r.string()?;
                let group_instance_id = r.nullable_string()?;
                let error = error::from_code(r.i16()?);
                members.push(LeftMember { member_id, group_instance_id, error });
            }
        }
        Ok(Self { throttle_time_ms, error, members })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 13, version })
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

    fn request(version: i16) -> LeaveGroupRequest {
        if version < BATCH_VERSION_MIN {
            return LeaveGroupRequest { group_id: "orders".into(), member_id: "m-1".into(), members: Vec::new() };
        }
        LeaveGroupRequest {
            group_id: "orders".into(),
            member_id: String::new(),
            members: vec![
                LeavingMember { member_id: "m-1".into(), group_instance_id: None },
                LeavingMember { member_id: String::new(), group_instance_id: Some("host-c".into()) },
            ],
        }
    }

    fn response(version: i16) -> LeaveGroupResponse {
        let members = if version < BATCH_VERSION_MIN {
            Vec::new()
        } else {
            vec![
                LeftMember { member_id: "m-1".into(), group_instance_id: None, error: ErrorCode::None },
                LeftMember {
                    member_id: String::new(),
                    group_instance_id: Some("host-c".into()),
                    error: ErrorCode::UnknownMemberId,
                },
            ]
        };
        LeaveGroupResponse {
            throttle_time_ms: if version >= 1 { 4 } else { 0 },
            error: if version < BATCH_VERSION_MIN { ErrorCode::UnknownMemberId } else { ErrorCode::None },
            members,
        }
    }

    fn encode_request(message: &LeaveGroupRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &LeaveGroupResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let bytes = encode_request(&message, version);
            let decoded = LeaveGroupRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = LeaveGroupResponse::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn request_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let members = message
                .members
                .iter()
                .map(|m| {
                    oracle::leave_group_request::MemberIdentity::default()
                        .with_member_id(text(&m.member_id))
                        .with_group_instance_id(m.group_instance_id.as_deref().map(text))
                })
                .collect();
            let oracle = oracle::LeaveGroupRequest::default()
                .with_group_id(oracle::GroupId(text(&message.group_id)))
                .with_member_id(text(&message.member_id))
                .with_members(members);
            assert_eq!(encode_request(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn response_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let members = message
                .members
                .iter()
                .map(|m| {
                    oracle::leave_group_response::MemberResponse::default()
                        .with_member_id(text(&m.member_id))
                        .with_group_instance_id(m.group_instance_id.as_deref().map(text))
                        .with_error_code(m.error.code())
                })
                .collect();
            let oracle = oracle::LeaveGroupResponse::default()
                .with_throttle_time_ms(message.throttle_time_ms)
                .with_error_code(message.error.code())
                .with_members(members);
            assert_eq!(encode_response(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_request(&request(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(LeaveGroupRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(LeaveGroupResponse::decode(&mut r, version).is_err());
            }
        }
    }
}
