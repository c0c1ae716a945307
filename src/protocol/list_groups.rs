//! ListGroups (key 16), versions 0–2. The groups this coordinator owns, with
//! their protocol type ("consumer" for consumer groups). The request has no
//! fields in these versions. Version 1 adds the throttle time.

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListGroupsRequest {}

impl ListGroupsRequest {
    pub fn decode(_r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        Ok(Self {})
    }

    pub fn encode(&self, _w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListGroupsResponse {
    /// v1+.
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub groups: Vec<ListedGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroup {
    pub group_id: String,
    pub protocol_type: String,
}

impl ListGroupsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        if version >= 1 {
            w.i32(self.throttle_time_ms);
        }
        w.i16(self.error.code());
        w.i32(self.groups.len() as i32);
        for group in &self.groups {
            w.string(&group.group_id);
            w.string(&group.protocol_type);
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = if version >= 1 { r.i32()? } else { 0 };
        let error = error::from_code(r.i16()?);
        // group id (2) + protocol type (2)
        let count = r.array_len(4)?;
        let mut groups = Vec::with_capacity(count);
        for _ in 0..count {
            let group_id = r.string()?;
            let protocol_type = r.string()?;
            groups.push(ListedGroup { group_id, protocol_type });
        }
        Ok(Self { throttle_time_ms, error, groups })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 16, version })
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

    fn response(version: i16) -> ListGroupsResponse {
        ListGroupsResponse {
            throttle_time_ms: if version >= 1 { 8 } else { 0 },
            error: ErrorCode::None,
            groups: vec![
                ListedGroup { group_id: "orders".into(), protocol_type: "consumer".into() },
                ListedGroup { group_id: "offsets-only".into(), protocol_type: String::new() },
            ],
        }
    }

    fn encode_response(message: &ListGroupsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut w = Writer::new();
            ListGroupsRequest {}.encode(&mut w, version);
            let bytes = w.into_bytes();
            assert_eq!(bytes, theirs(&oracle::ListGroupsRequest::default(), version));
            let decoded = ListGroupsRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, ListGroupsRequest {});
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let bytes = encode_response(&message, version);
            let decoded = ListGroupsResponse::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, message, "v{version}");
        }
    }

    #[test]
    fn response_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response(version);
            let groups = message
                .groups
                .iter()
                .map(|g| {
                    oracle::list_groups_response::ListedGroup::default()
                        .with_group_id(oracle::GroupId(text(&g.group_id)))
                        .with_protocol_type(text(&g.protocol_type))
                })
                .collect();
            let oracle = oracle::ListGroupsResponse::default()
                .with_throttle_time_ms(message.throttle_time_ms)
                .with_error_code(message.error.code())
                .with_groups(groups);
            assert_eq!(encode_response(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_response(&response(version), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(ListGroupsResponse::decode(&mut r, version).is_err());
            }
        }
    }
}
