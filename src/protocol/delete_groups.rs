//! DeleteGroups (key 42), versions 0–1. Deletes empty groups and their
//! committed offsets; a group with members answers NON_EMPTY_GROUP. Both
//! versions carry the throttle time; version 1 only changes throttling.

use super::{error, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteGroupsRequest {
    pub groups_names: Vec<String>,
}

impl DeleteGroupsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        // group id (2)
        let count = r.array_len(2)?;
        let mut groups_names = Vec::with_capacity(count);
        for _ in 0..count {
            groups_names.push(r.string()?);
        }
        Ok(Self { groups_names })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.i32(self.groups_names.len() as i32);
        for name in &self.groups_names {
            w.string(name);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteGroupsResponse {
    pub throttle_time_ms: i32,
    pub results: Vec<DeletedGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletedGroup {
    pub group_id: String,
    pub error: ErrorCode,
}

impl DeleteGroupsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        debug_assert!((VERSION_MIN..=VERSION_MAX).contains(&version));
        w.i32(self.throttle_time_ms);
        w.i32(self.results.len() as i32);
        for result in &self.results {
            w.string(&result.group_id);
            w.i16(result.error.code());
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        // group id (2) + error code (2)
        let count = r.array_len(4)?;
        let mut results = Vec::with_capacity(count);
        for _ in 0..count {
            let group_id = r.string()?;
            let error = error::from_code(r.i16()?);
            results.push(DeletedGroup { group_id, error });
        }
        Ok(Self { throttle_time_ms, results })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: 42, version })
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

    fn request() -> DeleteGroupsRequest {
        DeleteGroupsRequest { groups_names: vec!["orders".into(), "".into(), "audit".into()] }
    }

    fn response() -> DeleteGroupsResponse {
        DeleteGroupsResponse {
            throttle_time_ms: 11,
            results: vec![
                DeletedGroup { group_id: "orders".into(), error: ErrorCode::None },
                DeletedGroup { group_id: "audit".into(), error: ErrorCode::NonEmptyGroup },
            ],
        }
    }

    fn encode_request(message: &DeleteGroupsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    fn encode_response(message: &DeleteGroupsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        message.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_request(&request(), version);
            let decoded = DeleteGroupsRequest::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, request(), "v{version}");
        }
    }

    #[test]
    fn response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_response(&response(), version);
            let decoded = DeleteGroupsResponse::decode(&mut Reader::new(bytes), version).unwrap();
            assert_eq!(decoded, response(), "v{version}");
        }
    }

    #[test]
    fn request_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = request();
            let oracle = oracle::DeleteGroupsRequest::default()
                .with_groups_names(message.groups_names.iter().map(|g| oracle::GroupId(text(g))).collect());
            assert_eq!(encode_request(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn response_bytes_match_kafka_protocol_crate() {
        for version in VERSION_MIN..=VERSION_MAX {
            let message = response();
            let results = message
                .results
                .iter()
                .map(|r| {
                    oracle::delete_groups_response::DeletableGroupResult::default()
                        .with_group_id(oracle::GroupId(text(&r.group_id)))
                        .with_error_code(r.error.code())
                })
                .collect();
            let oracle = oracle::DeleteGroupsResponse::default()
                .with_throttle_time_ms(message.throttle_time_ms)
                .with_results(results);
            assert_eq!(encode_response(&message, version), theirs(&oracle, version), "v{version}");
        }
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encode_request(&request(), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(DeleteGroupsRequest::decode(&mut r, version).is_err());
            }
            let bytes = encode_response(&response(), version);
            for len in 0..bytes.len() {
                let mut r = Reader::new(bytes.slice(..len));
                assert!(DeleteGroupsResponse::decode(&mut r, version).is_err());
            }
        }
    }
}
