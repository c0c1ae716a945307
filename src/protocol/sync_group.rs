//! SyncGroup (key 14), versions 0–3. The leader sends every member's
//! assignment; every member, leader included, gets its own back. The
//! coordinator relays the assignment bytes without reading them. Version 1
//! adds the throttle time, 3 static membership (`group_instance_id`).

use bytes::Bytes;

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    /// v3+.
    pub group_instance_id: Option<String>,
    /// Empty unless sent by the leader.
    pub assignments: Vec<SyncGroupAssignment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupAssignment {
    pub member_id: String,
    pub assignment: Bytes,
}

impl SyncGroupRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let group_id = r.string()?;
        let generation_id = r.i32()?;
        let member_id = r.string()?;
        let group_instance_id = if version >= 3 { r.nullable_string()? } else { None };
        // member_id (2) + assignment (4)
        let count = r.array_len(6)?;
        let mut assignments = Vec::with_capacity(count);
        for _ in 0..count {
            let member_id = r.string()?;
            let assignment = r.bytes()?;
            assignments.push(SyncGroupAssignment { member_id, assignment });
        }
        Ok(Self { group_id, generation_id, member_id, group_instance_id, assignments })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.string(&self.group_id);
        w.i32(self.generation_id);
        w.string(&self.member_id);
        if version >= 3 {
            w.nullable_string(self.group_instance_id.as_deref());
        }
        w.i32(self.assignments.len() as i32);
        for assignment in &self.assignments {
            w.string(&assignment.member_id);
            w.bytes_v(&assignment.assignment, false);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupResponse {
    /// v1+.
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub assignment: Bytes,
}

impl SyncGroupResponse {
    pub fn error(error: ErrorCode) -> Self {
        Self { throttle_time_ms: 0, error, assignment: Bytes::new() }
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        if version >= 1 {
            w.i32(self.throttle_time_ms);
        }
        w.i16(self.error.code());
        w.bytes_v(&self.assignment, false);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = if version >= 1 { r.i32()? } else { 0 };
        let error = error::from_code(r.i16()?);
        let assignment = r.bytes()?;
        Ok(Self { throttle_time_ms, error, assignment })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 14, version })
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

    fn request(version: i16) -> SyncGroupRequest {
        SyncGroupRequest {
            group_id: "orders".into(),
            generation_id: 3,
            member_id: "m-1".into(),
            group_instance_id: if version >= 3 { Some("host-a".into()) } else { None },
            assignments: vec![
                SyncGroupAssignment { member_id: "m-1".into(), assignment: Bytes::from_static(b"p0,p1") },
                SyncGroupAssignment { member_id: "m-2".into(), assignment: Bytes::new() },
            ],
        }
    }

    fn response(version: i16) -> SyncGroupResponse {
        SyncGroupResponse {
            throttle_time_ms: if version >= 1 { 9 } else { 0 },
            error: ErrorCode::RebalanceInProgress,
            assignment: Bytes::from_static(b"p2"),
        }
    }

    fn encode_request(message: &SyncGroupRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &SyncGroupResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let bytes = encode_request(&message, version);
            let decoded = SyncGroupRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = SyncGroupResponse::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn request_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let assignments = message
                .assignments
                .iter()
                .map(|a| {
                    oracle::sync_group_request::SyncGroupRequestAssignment::default()
                        .with_member_id(text(&a.member_id))
                        .with_assignment(a.assignment.clone())
                })
                .collect();
            let oracle = oracle::SyncGroupRequest::default()
                .with_group_id(oracle::GroupId(text(&message.group_id)))
                .with_generation_id(message.generation_id)
                .with_member_id(text(&message.member_id))
                .with_group_instance_id(message.group_instance_id.as_deref().map(text))
                .with_assignments(assignments);
            assert_eq!(encode_request(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn response_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let oracle = oracle::SyncGroupResponse::default()
                .with_throttle_time_ms(message.throttle_time_ms)
                .with_error_code(message.error.code())
                .with_assignment(message.assignment.clone());
            assert_eq!(encode_response(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_request(&request(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(SyncGroupRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(SyncGroupResponse::decode(&mut r, version).is_err());
            }
        }
    }

    #[test]
    fn assignment_count_larger_than_the_frame_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.string("g");
        w.i32(1);
        w.string("m");
        w.i32(i32::MAX);
        let result = SyncGroupRequest::decode(&mut Reader::new(w.into_bytes()), 0);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })));
    }
}
