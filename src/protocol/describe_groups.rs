//! DescribeGroups (key 15), versions 0–4. State, protocol and members of
//! each named group; an unknown group is described as "Dead" with no error.
//! Version 1 adds the throttle time, 3 the authorized operations, 4 the
//! members' `group_instance_id`.

use bytes::Bytes;

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 4;

/// `authorized_operations` when the client did not ask for them.
pub const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeGroupsRequest {
    pub groups: Vec<String>,
    /// v3+.
    pub include_authorized_operations: bool,
}

impl DescribeGroupsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        // group id (2)
        let count = r.array_len(2)?;
        let mut groups = Vec::with_capacity(count);
        for _ in 0..count {
            groups.push(r.string()?);
        }
        let include_authorized_operations = if version >= 3 { r.bool()? } else { false };
        Ok(Self { groups, include_authorized_operations })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.i32(self.groups.len() as i32);
        for group in &self.groups {
            w.string(group);
        }
        if version >= 3 {
            w.bool(self.include_authorized_operations);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DescribeGroupsResponse {
    /// v1+.
    pub throttle_time_ms: i32,
    pub groups: Vec<DescribedGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedGroup {
    pub error: ErrorCode,
    pub group_id: String,
    /// "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead".
    pub group_state: String,
    pub protocol_type: String,
    /// The chosen protocol while the group is Stable, else empty.
    pub protocol_data: String,
    pub members: Vec<DescribedMember>,
    /// v3+.
    pub authorized_operations: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedMember {
    pub member_id: String,
    /// v4+.
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub member_metadata: Bytes,
    pub member_assignment: Bytes,
}

impl DescribeGroupsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        if version >= 1 {
            w.i32(self.throttle_time_ms);
        }
        w.i32(self.groups.len() as i32);
        for group in &self.groups {
            w.i16(group.error.code());
            w.string(&group.group_id);
            w.string(&group.group_state);
            w.string(&group.protocol_type);
            w.string(&group.protocol_data);
            w.i32(group.members.len() as i32);
            for member in &group.members {
                w.string(&member.member_id);
                if version >= 4 {
                    w.nullable_string(member.group_instance_id.as_deref());
                }
                w.string(&member.client_id);
                w.string(&member.client_host);
                w.bytes_v(&member.member_metadata, false);
                w.bytes_v(&member.member_assignment, false);
            }
            if version >= 3 {
                w.i32(group.authorized_operations);
            }
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = if version >= 1 { r.i32()? } else { 0 };
        // error (2) + four strings (4 × 2) + member count (4) + operations (4, v3+)
        let group_bytes_min = if version >= 3 { 18 } else { 14 };
        let count = r.array_len(group_bytes_min)?;
        let mut groups = Vec::with_capacity(count);
        for _ in 0..count {
            groups.push(decode_group(r, version)?);
        }
        Ok(Self { throttle_time_ms, groups })
    }
}

fn decode_group(r: &mut Reader, version: i16) -> DecodeResult<DescribedGroup> {
    let error = error::from_code(r.i16()?);
    let group_id = r.string()?;
    let group_state = r.string()?;
    let protocol_type = r.string()?;
    let protocol_data = r.string()?;
    // member id, client id, client host (3 × 2) + instance id (2, v4+) + two byte arrays (2 × 4)
    let member_bytes_min = if version >= 4 { 16 } else { 14 };
    let count = r.array_len(member_bytes_min)?;
    let mut members = Vec::with_capacity(count);
    for _ in 0..count {
        let member_id = r.string()?;
        let group_instance_id = if version >= 4 { r.nullable_string()? } else { None };
        let client_id = r.string()?;
        let client_host = r.string()?;
        let member_metadata = r.bytes()?;
        let member_assignment = r.bytes()?;
        members.push(DescribedMember {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            member_metadata,
            member_assignment,
        });
    }
    let authorized_operations = if version >= 3 { r.i32()? } else { AUTHORIZED_OPERATIONS_OMITTED };
    Ok(DescribedGroup { error, group_id, group_state, protocol_type, protocol_data, members, authorized_operations })
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 15, version })
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

    fn request(version: i16) -> DescribeGroupsRequest {
        DescribeGroupsRequest {
            groups: vec!["orders".into(), "audit".into()],
            include_authorized_operations: version >= 3,
        }
    }

    fn response(version: i16) -> DescribeGroupsResponse {
        let operations = if version >= 3 { 0b1010 } else { AUTHORIZED_OPERATIONS_OMITTED };
        DescribeGroupsResponse {
            throttle_time_ms: if version >= 1 { 3 } else { 0 },
            groups: vec![
                DescribedGroup {
                    error: ErrorCode::None,
                    group_id: "orders".into(),
                    group_state: "Stable".into(),
                    protocol_type: "consumer".into(),
                    protocol_data: "range".into(),
                    members: vec![DescribedMember {
                        member_id: "m-1".into(),
                        group_instance_id: if version >= 4 { Some("host-a".into()) } else { None },
                        client_id: "client".into(),
                        client_host: "/10.0.0.1".into(),
                        member_metadata: Bytes::from_static(b"meta"),
                        member_assignment: Bytes::from_static(b"assign"),
                    }],
                    authorized_operations: operations,
                },
                DescribedGroup {
                    error: ErrorCode::None,
                    group_id: "audit".into(),
                    group_state: "Dead".into(),
                    protocol_type: String::new(),
                    protocol_data: String::new(),
                    members: Vec::new(),
                    authorized_operations: operations,
                },
            ],
        }
    }

    fn oracle_response(message: &DescribeGroupsResponse) -> oracle::DescribeGroupsResponse {
        use oracle::describe_groups_response::{DescribedGroup as Group, DescribedGroupMember as Member};
        let groups = message
            .groups
            .iter()
            .map(|group| {
                let members = group
                    .members
                    .iter()
                    .map(|m| {
                        Member::default()
                            .with_member_id(text(&m.member_id))
                            .with_group_instance_id(m.group_instance_id.as_deref().map(text))
                            .with_client_id(text(&m.client_id))
                            .with_client_host(text(&m.client_host))
                            .with_member_metadata(m.member_metadata.clone())
                            .with_member_assignment(m.member_assignment.clone())
                    })
                    .collect();
                Group::default()
                    .with_error_code(group.error.code())
                    .with_group_id(oracle::GroupId(text(&group.group_id)))
                    .with_group_state(text(&group.group_state))
                    .with_protocol_type(text(&group.protocol_type))
                    .with_protocol_data(text(&group.protocol_data))
                    .with_members(members)
                    .with_authorized_operations(group.authorized_operations)
            })
            .collect();
        oracle::DescribeGroupsResponse::default().with_throttle_time_ms(message.throttle_time_ms).with_groups(groups)
    }

    fn encode_request(message: &DescribeGroupsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &DescribeGroupsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let bytes = encode_request(&message, version);
            let decoded = DescribeGroupsRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = DescribeGroupsResponse::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn request_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request(version);
            let oracle = oracle::DescribeGroupsRequest::default()
                .with_groups(message.groups.iter().map(|g| oracle::GroupId(text(g))).collect())
                .with_include_authorized_operations(message.include_authorized_operations);
            assert_eq!(encode_request(&message, version), theirs(&oracle, version), "v{version}");
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
                assert!(DescribeGroupsRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(DescribeGroupsResponse::decode(&mut r, version).is_err());
            }
        }
    }
}
