//! IncrementalAlterConfigs (key 44), versions 0–1, both directions: the broker
//! decodes requests and encodes responses, our admin client does the reverse.
//! Each entry sets, deletes, appends to or subtracts from one key, leaving
//! the others alone. v1 is flexible: compact strings and arrays, and a
//! tagged-field section after each struct and at the end of the body (its
//! request header is v2 and response header v1; `mod.rs` handles those). We
//! know no tags, so received ones are skipped and none are written.
//!
//! ```text
//! request   resources [resource_type i8, resource_name string,
//!                      configs [name string, config_operation i8, value nullable string]]
//!           validate_only bool
//! response  throttle_time_ms i32,
//!           responses [error_code i16, error_message nullable string,
//!                      resource_type i8, resource_name string]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 1;
/// First version with compact encodings and tagged fields.
pub const FLEXIBLE_VERSION_MIN: i16 = 1;

// `config_operation` values (Kafka's AlterConfigOp.OpType).
pub const CONFIG_OPERATION_SET: i8 = 0;
pub const CONFIG_OPERATION_DELETE: i8 = 1;
pub const CONFIG_OPERATION_APPEND: i8 = 2;
pub const CONFIG_OPERATION_SUBTRACT: i8 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementalAlterConfigsRequest {
    pub resources: Vec<IncrementalAlterConfigsResource>,
    /// Check the changes, but make none.
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementalAlterConfigsResource {
    /// 2 topic, 4 broker, 8 broker logger.
    pub resource_type: i8,
    pub resource_name: String,
    pub configs: Vec<IncrementalAlterableConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementalAlterableConfig {
    pub name: String,
    /// One of the `CONFIG_OPERATION_*` values.
    pub config_operation: i8,
    pub value: Option<String>,
}

impl IncrementalAlterConfigsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        let resource_count = r.array_len_v(flexible, resource_bytes_min(flexible))?;
        let mut resources = Vec::with_capacity(resource_count);
        for _ in 0..resource_count {
            resources.push(IncrementalAlterConfigsResource::decode(r, flexible)?);
        }
        let validate_only = r.bool()?;
        r.tagged_fields_v(flexible)?;
        Ok(Self { resources, validate_only })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        w.array_len_v(self.resources.len(), flexible);
        for resource in &self.resources {
            resource.encode(w, flexible);
        }
        w.bool(self.validate_only);
        w.tagged_fields_v(flexible);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncrementalAlterConfigsResponse {
    pub throttle_time_ms: i32,
    pub responses: Vec<IncrementalAlterConfigsResourceResponse>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementalAlterConfigsResourceResponse {
    pub error: ErrorCode,
    pub error_message: Option<String>,
    pub resource_type: i8,
    pub resource_name: String,
}

impl IncrementalAlterConfigsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        w.i32(self.throttle_time_ms);
        w.array_len_v(self.responses.len(), flexible);
        for response in &self.responses {
            w.i16(response.error.code());
            w.nullable_string_v(response.error_message.as_deref(), flexible);
            w.i8(response.resource_type);
            w.string_v(&response.resource_name, flexible);
            w.tagged_fields_v(flexible);
        }
        w.tagged_fields_v(flexible);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        let throttle_time_ms = r.i32()?;
        let response_count = r.array_len_v(flexible, resource_response_bytes_min(flexible))?;
        let mut responses = Vec::with_capacity(response_count);
        for _ in 0..response_count {
            let error = error::from_code(r.i16()?);
            let error_message = r.nullable_string_v(flexible)?;
            let resource_type = r.i8()?;
            let resource_name = r.string_v(flexible)?;
            r.tagged_fields_v(flexible)?;
            responses.push(IncrementalAlterConfigsResourceResponse {
                error,
                error_message,
                resource_type,
                resource_name,
            });
        }
        r.tagged_fields_v(flexible)?;
        Ok(Self { throttle_time_ms, responses })
    }
}

impl IncrementalAlterConfigsResource {
    fn decode(r: &mut Reader, flexible: bool) -> DecodeResult<Self> {
        let resource_type = r.i8()?;
        let resource_name = r.string_v(flexible)?;
        let config_count = r.array_len_v(flexible, config_bytes_min(flexible))?;
        let mut configs = Vec::with_capacity(config_count);
        for _ in 0..config_count {
            let name = r.string_v(flexible)?;
            let config_operation = r.i8()?;
            let value = r.nullable_string_v(flexible)?;
            r.tagged_fields_v(flexible)?;
            configs.push(IncrementalAlterableConfig { name, config_operation, value });
        }
        r.tagged_fields_v(flexible)?;
        Ok(Self { resource_type, resource_name, configs })
    }

    fn encode(&self, w: &mut Writer, flexible: bool) {
        w.i8(self.resource_type);
        w.string_v(&self.resource_name, flexible);
        w.array_len_v(self.configs.len(), flexible);
        for config in &self.configs {
            w.string_v(&config.name, flexible);
            w.i8(config.config_operation);
            w.nullable_string_v(config.value.as_deref(), flexible);
            w.tagged_fields_v(flexible);
        }
        w.tagged_fields_v(flexible);
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated. A
// classic string or array length takes 2 or 4 bytes; a compact one, and an
// empty tagged-field section, take at least 1.

/// resource_type, resource_name, configs length (+ tagged fields).
fn resource_bytes_min(flexible: bool) -> usize {
    if flexible {
        1 + 1 + 1 + 1
    } else {
        1 + 2 + 4
    }
}

/// name, config_operation, value (+ tagged fields).
fn config_bytes_min(flexible: bool) -> usize {
    if flexible {
        1 + 1 + 1 + 1
    } else {
        2 + 1 + 2
    }
}

/// error_code, error_message, resource_type, resource_name (+ tagged fields).
fn resource_response_bytes_min(flexible: bool) -> usize {
    if flexible {
        2 + 1 + 1 + 1 + 1
    } else {
        2 + 2 + 1 + 2
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::IncrementalAlterConfigs as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "IncrementalAlterConfigs v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::incremental_alter_configs_request as kp_req;
    use kafka_protocol::messages::incremental_alter_configs_response as kp_resp;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request() -> IncrementalAlterConfigsRequest {
        IncrementalAlterConfigsRequest {
            resources: vec![
                IncrementalAlterConfigsResource {
                    resource_type: 2,
                    resource_name: "orders".into(),
                    configs: vec![
                        IncrementalAlterableConfig {
                            name: "retention.ms".into(),
                            config_operation: CONFIG_OPERATION_SET,
                            value: Some("3600000".into()),
                        },
                        IncrementalAlterableConfig {
                            name: "cleanup.policy".into(),
                            config_operation: CONFIG_OPERATION_DELETE,
                            value: None,
                        },
                        IncrementalAlterableConfig {
                            name: "leader.replication.throttled.replicas".into(),
                            config_operation: CONFIG_OPERATION_APPEND,
                            value: Some("0:1".into()),
                        },
                    ],
                },
                IncrementalAlterConfigsResource { resource_type: 4, resource_name: "".into(), configs: vec![] },
            ],
            validate_only: false,
        }
    }

    fn sample_response() -> IncrementalAlterConfigsResponse {
        IncrementalAlterConfigsResponse {
            throttle_time_ms: 4,
            responses: vec![
                IncrementalAlterConfigsResourceResponse {
                    error: ErrorCode::None,
                    error_message: None,
                    resource_type: 2,
                    resource_name: "orders".into(),
                },
                IncrementalAlterConfigsResourceResponse {
                    error: ErrorCode::PolicyViolation,
                    error_message: Some("Broker configs are read-only here.".into()),
                    resource_type: 4,
                    resource_name: "".into(),
                },
            ],
        }
    }

    fn str_bytes(s: &str) -> StrBytes {
        StrBytes::from_string(s.to_owned())
    }

    fn kp_request(ours: &IncrementalAlterConfigsRequest) -> kp_req::IncrementalAlterConfigsRequest {
        let resources = ours
            .resources
            .iter()
            .map(|res| {
                let configs = res
                    .configs
                    .iter()
                    .map(|c| {
                        kp_req::AlterableConfig::default()
                            .with_name(str_bytes(&c.name))
                            .with_config_operation(c.config_operation)
                            .with_value(c.value.as_deref().map(str_bytes))
                    })
                    .collect();
                kp_req::AlterConfigsResource::default()
                    .with_resource_type(res.resource_type)
                    .with_resource_name(str_bytes(&res.resource_name))
                    .with_configs(configs)
            })
            .collect();
        kp_req::IncrementalAlterConfigsRequest::default()
            .with_resources(resources)
            .with_validate_only(ours.validate_only)
    }

    fn kp_response(ours: &IncrementalAlterConfigsResponse) -> kp_resp::IncrementalAlterConfigsResponse {
        let responses = ours
            .responses
            .iter()
            .map(|res| {
                kp_resp::AlterConfigsResourceResponse::default()
                    .with_error_code(res.error.code())
                    .with_error_message(res.error_message.as_deref().map(str_bytes))
                    .with_resource_type(res.resource_type)
                    .with_resource_name(str_bytes(&res.resource_name))
            })
            .collect();
        kp_resp::IncrementalAlterConfigsResponse::default()
            .with_throttle_time_ms(ours.throttle_time_ms)
            .with_responses(responses)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &IncrementalAlterConfigsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &IncrementalAlterConfigsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn incremental_alter_configs_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(request_bytes(&sample_request(), version));
            let decoded = IncrementalAlterConfigsRequest::decode(&mut r, version).unwrap();
            assert_eq!(decoded, sample_request(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn incremental_alter_configs_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(response_bytes(&sample_response(), version));
            let decoded = IncrementalAlterConfigsResponse::decode(&mut r, version).unwrap();
            assert_eq!(decoded, sample_response(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn incremental_alter_configs_request_v0_and_flexible_v1_match_kafka_protocol_encoding() {
        let theirs = kp_request(&sample_request());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = request_bytes(&sample_request(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_req::IncrementalAlterConfigsRequest::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn incremental_alter_configs_response_v0_and_flexible_v1_match_kafka_protocol_encoding() {
        let theirs = kp_response(&sample_response());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = response_bytes(&sample_response(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_resp::IncrementalAlterConfigsResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn incremental_alter_configs_v1_skips_unknown_tagged_fields_at_every_level() {
        let tags = BTreeMap::from([(7, Bytes::from_static(b"xyz")), (300, Bytes::new())]);
        let mut theirs = kp_request(&sample_request()).with_unknown_tagged_fields(tags.clone());
        for resource in &mut theirs.resources {
            resource.unknown_tagged_fields = tags.clone();
            for config in &mut resource.configs {
                config.unknown_tagged_fields = tags.clone();
            }
        }
        let mut r = Reader::new(kp_encode(&theirs, 1));
        assert_eq!(IncrementalAlterConfigsRequest::decode(&mut r, 1).unwrap(), sample_request());
        assert_eq!(r.remaining(), 0);

        let mut theirs = kp_response(&sample_response()).with_unknown_tagged_fields(tags.clone());
        for response in &mut theirs.responses {
            response.unknown_tagged_fields = tags.clone();
        }
        let mut r = Reader::new(kp_encode(&theirs, 1));
        assert_eq!(IncrementalAlterConfigsResponse::decode(&mut r, 1).unwrap(), sample_response());
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn truncated_incremental_alter_configs_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let request = request_bytes(&sample_request(), version);
            for len in 0..request.len() {
                let mut r = Reader::new(request.slice(..len));
                let result = IncrementalAlterConfigsRequest::decode(&mut r, version);
                assert!(result.is_err(), "v{version} request cut at {len}");
            }
            let response = response_bytes(&sample_response(), version);
            for len in 0..response.len() {
                let mut r = Reader::new(response.slice(..len));
                let result = IncrementalAlterConfigsResponse::decode(&mut r, version);
                assert!(result.is_err(), "v{version} response cut at {len}");
            }
        }
    }

    #[test]
    fn incremental_alter_configs_compact_config_count_beyond_the_frame_is_refused_before_allocating() {
        // Sixteen flexible configs need at least 16 × 4 bytes; 63 follow the count.
        let mut w = Writer::new();
        w.array_len_v(1, true);
        w.i8(2);
        w.string_v("orders", true);
        w.array_len_v(16, true);
        w.raw(&[0; 63]);
        let mut r = Reader::new(w.into_bytes());
        let result = IncrementalAlterConfigsRequest::decode(&mut r, 1);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn incremental_alter_configs_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_request(), VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = IncrementalAlterConfigsRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn incremental_alter_configs_versions_match_the_advertised_range() {
        let range = ApiKey::IncrementalAlterConfigs.range().expect("IncrementalAlterConfigs is advertised");
        assert_eq!(
            (range.version_min, range.version_max, range.flexible_from),
            (VERSION_MIN, VERSION_MAX, FLEXIBLE_VERSION_MIN)
        );
    }
}
