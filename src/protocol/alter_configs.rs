//! AlterConfigs (key 33), versions 0–1, both directions: the broker decodes
//! requests and encodes responses, our admin client does the reverse. The
//! request replaces a resource's whole dynamic config (IncrementalAlterConfigs
//! edits it). Both versions share one layout (v1 only answers before
//! throttling); v2 is the first flexible version.
//!
//! ```text
//! request   resources [resource_type i8, resource_name string,
//!                      configs [name string, value nullable string]]
//!           validate_only bool
//! response  throttle_time_ms i32,
//!           responses [error_code i16, error_message nullable string,
//!                      resource_type i8, resource_name string]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterConfigsRequest {
    pub resources: Vec<AlterConfigsResource>,
    /// Check the new configs, but change nothing.
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterConfigsResource {
    /// 2 topic, 4 broker, 8 broker logger.
    pub resource_type: i8,
    pub resource_name: String,
    pub configs: Vec<AlterableConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterableConfig {
    pub name: String,
    pub value: Option<String>,
}

impl AlterConfigsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let resource_count = r.array_len(RESOURCE_BYTES_MIN)?;
        let mut resources = Vec::with_capacity(resource_count);
        for _ in 0..resource_count {
            let resource_type = r.i8()?;
            let resource_name = r.string()?;
            let config_count = r.array_len(CONFIG_BYTES_MIN)?;
            let mut configs = Vec::with_capacity(config_count);
            for _ in 0..config_count {
                let name = r.string()?;
                let value = r.nullable_string()?;
                configs.push(AlterableConfig { name, value });
            }
            resources.push(AlterConfigsResource { resource_type, resource_name, configs });
        }
        let validate_only = r.bool()?;
        Ok(Self { resources, validate_only })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.resources.len() as i32);
        for resource in &self.resources {
            w.i8(resource.resource_type);
            w.string(&resource.resource_name);
            w.i32(resource.configs.len() as i32);
            for config in &resource.configs {
                w.string(&config.name);
                w.nullable_string(config.value.as_deref());
            }
        }
        w.bool(self.validate_only);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlterConfigsResponse {
    pub throttle_time_ms: i32,
    pub responses: Vec<AlterConfigsResourceResponse>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterConfigsResourceResponse {
    pub error: ErrorCode,
    pub error_message: Option<String>,
    pub resource_type: i8,
    pub resource_name: String,
}

impl AlterConfigsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i32(self.responses.len() as i32);
        for response in &self.responses {
            w.i16(response.error.code());
            w.nullable_string(response.error_message.as_deref());
            w.i8(response.resource_type);
            w.string(&response.resource_name);
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let response_count = r.array_len(RESOURCE_RESPONSE_BYTES_MIN)?;
        let mut responses = Vec::with_capacity(response_count);
        for _ in 0..response_count {
            let error = error::from_code(r.i16()?);
            let error_message = r.nullable_string()?;
            let resource_type = r.i8()?;
            let resource_name = r.string()?;
            responses.push(AlterConfigsResourceResponse { error, error_message, resource_type, resource_name });
        }
        Ok(Self { throttle_time_ms, responses })
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated.
/// resource_type, resource_name, configs length.
const RESOURCE_BYTES_MIN: usize = 1 + 2 + 4;
/// name, value.
const CONFIG_BYTES_MIN: usize = 2 + 2;
/// error_code, error_message, resource_type, resource_name.
const RESOURCE_RESPONSE_BYTES_MIN: usize = 2 + 2 + 1 + 2;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::AlterConfigs as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "AlterConfigs v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::alter_configs_request as kp_req;
    use kafka_protocol::messages::alter_configs_response as kp_resp;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request() -> AlterConfigsRequest {
        AlterConfigsRequest {
            resources: vec![
                AlterConfigsResource {
                    resource_type: 2,
                    resource_name: "orders".into(),
                    configs: vec![
                        AlterableConfig { name: "retention.ms".into(), value: Some("3600000".into()) },
                        AlterableConfig { name: "cleanup.policy".into(), value: None },
                    ],
                },
                AlterConfigsResource { resource_type: 4, resource_name: "".into(), configs: vec![] },
            ],
            validate_only: true,
        }
    }

    fn sample_response() -> AlterConfigsResponse {
        AlterConfigsResponse {
            throttle_time_ms: 9,
            responses: vec![
                AlterConfigsResourceResponse {
                    error: ErrorCode::None,
                    error_message: None,
                    resource_type: 2,
                    resource_name: "orders".into(),
                },
                AlterConfigsResourceResponse {
                    error: ErrorCode::InvalidConfig,
                    error_message: Some("Cluster-wide broker configs are not supported.".into()),
                    resource_type: 4,
                    resource_name: "".into(),
                },
            ],
        }
    }

    fn str_bytes(s: &str) -> StrBytes {
        StrBytes::from_string(s.to_owned())
    }

    fn kp_request(ours: &AlterConfigsRequest) -> kp_req::AlterConfigsRequest {
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
                            .with_value(c.value.as_deref().map(str_bytes))
                    })
                    .collect();
                kp_req::AlterConfigsResource::default()
                    .with_resource_type(res.resource_type)
                    .with_resource_name(str_bytes(&res.resource_name))
                    .with_configs(configs)
            })
            .collect();
        kp_req::AlterConfigsRequest::default().with_resources(resources).with_validate_only(ours.validate_only)
    }

    fn kp_response(ours: &AlterConfigsResponse) -> kp_resp::AlterConfigsResponse {
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
        kp_resp::AlterConfigsResponse::default().with_throttle_time_ms(ours.throttle_time_ms).with_responses(responses)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &AlterConfigsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &AlterConfigsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn alter_configs_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(request_bytes(&sample_request(), version));
            assert_eq!(AlterConfigsRequest::decode(&mut r, version).unwrap(), sample_request(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn alter_configs_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(response_bytes(&sample_response(), version));
            assert_eq!(AlterConfigsResponse::decode(&mut r, version).unwrap(), sample_response(), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn alter_configs_request_v0_to_v1_matches_kafka_protocol_encoding() {
        let theirs = kp_request(&sample_request());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = request_bytes(&sample_request(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_req::AlterConfigsRequest::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn alter_configs_response_v0_to_v1_matches_kafka_protocol_encoding() {
        let theirs = kp_response(&sample_response());
        for version in VERSION_MIN..=VERSION_MAX {
            let ours = response_bytes(&sample_response(), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_resp::AlterConfigsResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn truncated_alter_configs_frames_are_errors_not_panics() {
        let request = request_bytes(&sample_request(), VERSION_MAX);
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(AlterConfigsRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
        let response = response_bytes(&sample_response(), VERSION_MAX);
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(AlterConfigsResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn alter_configs_resource_count_beyond_the_frame_is_refused_before_allocating() {
        // Ten resources need at least 10 × 7 bytes; 69 follow the count.
        let mut w = Writer::new();
        w.i32(10);
        w.raw(&[0; 69]);
        let mut r = Reader::new(w.into_bytes());
        let result = AlterConfigsRequest::decode(&mut r, VERSION_MAX);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn alter_configs_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_request(), VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = AlterConfigsRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn alter_configs_versions_match_the_advertised_range() {
        let range = ApiKey::AlterConfigs.range().expect("AlterConfigs is advertised");
        assert_eq!((range.version_min, range.version_max), (VERSION_MIN, VERSION_MAX));
        assert!(range.flexible_from > VERSION_MAX, "this codec writes no flexible version");
    }
}
