//! DescribeConfigs (key 32), versions 1–3, both directions: the broker decodes
//! requests and encodes responses, our admin client does the reverse. v1 is
//! the floor because v0 carries `is_default` where v1+ carries
//! `config_source` and synonyms; v3 adds each entry's type and documentation;
//! v4 is the first flexible version.
//!
//! ```text
//! request   resources [resource_type i8, resource_name string,
//!                      configuration_keys nullable [string]]
//!           include_synonyms bool, include_documentation bool (v3+)
//! response  throttle_time_ms i32,
//!           results [error_code i16, error_message nullable string,
//!                    resource_type i8, resource_name string,
//!                    configs [name string, value nullable string, read_only bool,
//!                             config_source i8, is_sensitive bool,
//!                             synonyms [name string, value nullable string, source i8],
//!                             config_type i8 (v3+), documentation nullable string (v3+)]]
//! ```
//!
//! Fields a version lacks are dropped on encode (Kafka marks them ignorable)
//! and read as their schema defaults on decode.

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 1;
pub const VERSION_MAX: i16 = 3;

/// First version with `include_documentation`, `config_type` and `documentation`.
const DOCUMENTATION_VERSION_MIN: i16 = 3;

/// `config_type` when the version does not carry it: Kafka's UNKNOWN.
pub const CONFIG_TYPE_UNKNOWN: i8 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeConfigsRequest {
    pub resources: Vec<DescribeConfigsResource>,
    pub include_synonyms: bool,
    /// Sent from v3; false below.
    pub include_documentation: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeConfigsResource {
    /// 2 topic, 4 broker, 8 broker logger.
    pub resource_type: i8,
    pub resource_name: String,
    /// `None` asks for every key.
    pub configuration_keys: Option<Vec<String>>,
}

impl DescribeConfigsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let resource_count = r.array_len(RESOURCE_BYTES_MIN)?;
        let mut resources = Vec::with_capacity(resource_count);
        for _ in 0..resource_count {
            resources.push(DescribeConfigsResource::decode(r)?);
        }
        let include_synonyms = r.bool()?;
        let include_documentation = if version >= DOCUMENTATION_VERSION_MIN { r.bool()? } else { false };
        Ok(Self { resources, include_synonyms, include_documentation })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.resources.len() as i32);
        for resource in &self.resources {
            resource.encode(w);
        }
        w.bool(self.include_synonyms);
        if version >= DOCUMENTATION_VERSION_MIN {
            w.bool(self.include_documentation);
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DescribeConfigsResponse {
    pub throttle_time_ms: i32,
    pub results: Vec<DescribeConfigsResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeConfigsResult {
    pub error: ErrorCode,
    pub error_message: Option<String>,
    pub resource_type: i8,
    pub resource_name: String,
    pub configs: Vec<DescribeConfigsResourceResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeConfigsResourceResult {
    pub name: String,
    /// Null for sensitive entries.
    pub value: Option<String>,
    pub read_only: bool,
    /// Where the value comes from: 1 dynamic topic, 2 dynamic broker, 3 dynamic
    /// default broker, 4 static broker, 5 default, 6 dynamic broker logger.
    pub config_source: i8,
    pub is_sensitive: bool,
    pub synonyms: Vec<DescribeConfigsSynonym>,
    /// Sent from v3; `CONFIG_TYPE_UNKNOWN` below.
    pub config_type: i8,
    /// Sent from v3; `None` below.
    pub documentation: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeConfigsSynonym {
    pub name: String,
    pub value: Option<String>,
    pub source: i8,
}

impl DescribeConfigsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i32(self.results.len() as i32);
        for result in &self.results {
            w.i16(result.error.code());
            w.nullable_string(result.error_message.as_deref());
            w.i8(result.resource_type);
            w.string(&result.resource_name);
            w.i32(result.configs.len() as i32);
            for config in &result.configs {
                config.encode(w, version);
            }
        }
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let result_count = r.array_len(RESULT_BYTES_MIN)?;
        let mut results = Vec::with_capacity(result_count);
        for _ in 0..result_count {
            let error = error::from_code(r.i16()?);
            let error_message = r.nullable_string()?;
            let resource_type = r.i8()?;
            let resource_name = r.string()?;
            let config_count = r.array_len(config_bytes_min(version))?;
            let mut configs = Vec::with_capacity(config_count);
            for _ in 0..config_count {
                configs.push(DescribeConfigsResourceResult::decode(r, version)?);
            }
            results.push(DescribeConfigsResult { error, error_message, resource_type, resource_name, configs });
        }
        Ok(Self { throttle_time_ms, results })
    }
}

impl DescribeConfigsResource {
    fn decode(r: &mut Reader) -> DecodeResult<Self> {
        let resource_type = r.i8()?;
        let resource_name = r.string()?;
        let configuration_keys = match r.nullable_array_len(KEY_BYTES_MIN)? {
            None => None,
            Some(key_count) => {
                let mut keys = Vec::with_capacity(key_count);
                for _ in 0..key_count {
                    keys.push(r.string()?);
                }
                Some(keys)
            }
        };
        Ok(Self { resource_type, resource_name, configuration_keys })
    }

    fn encode(&self, w: &mut Writer) {
        w.i8(self.resource_type);
        w.string(&self.resource_name);
        match &self.configuration_keys {
            None => w.i32(-1),
            Some(keys) => {
                w.i32(keys.len() as i32);
                for key in keys {
                    w.string(key);
                }
            }
        }
    }
}

impl DescribeConfigsResourceResult {
    fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        let name = r.string()?;
        let value = r.nullable_string()?;
        let read_only = r.bool()?;
        let config_source = r.i8()?;
        let is_sensitive = r.bool()?;
        let synonym_count = r.array_len(SYNONYM_BYTES_MIN)?;
        let mut synonyms = Vec::with_capacity(synonym_count);
        for _ in 0..synonym_count {
            let name = r.string()?;
            let value = r.nullable_string()?;
            let source = r.i8()?;
            synonyms.push(DescribeConfigsSynonym { name, value, source });
        }
        let (config_type, documentation) = if version >= DOCUMENTATION_VERSION_MIN {
            (r.i8()?, r.nullable_string()?)
        } else {
            (CONFIG_TYPE_UNKNOWN, None)
        };
        Ok(Self { name, value, read_only, config_source, is_sensitive, synonyms, config_type, documentation })
    }

    fn encode(&self, w: &mut Writer, version: i16) {
        w.string(&self.name);
        w.nullable_string(self.value.as_deref());
        w.bool(self.read_only);
        w.i8(self.config_source);
        w.bool(self.is_sensitive);
        w.i32(self.synonyms.len() as i32);
        for synonym in &self.synonyms {
            w.string(&synonym.name);
            w.nullable_string(synonym.value.as_deref());
            w.i8(synonym.source);
        }
        if version >= DOCUMENTATION_VERSION_MIN {
            w.i8(self.config_type);
            w.nullable_string(self.documentation.as_deref());
        }
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated.
/// resource_type, resource_name, configuration_keys length.
const RESOURCE_BYTES_MIN: usize = 1 + 2 + 4;
/// A string's length prefix.
const KEY_BYTES_MIN: usize = 2;
/// error_code, error_message, resource_type, resource_name, configs length.
const RESULT_BYTES_MIN: usize = 2 + 2 + 1 + 2 + 4;
/// name, value, source.
const SYNONYM_BYTES_MIN: usize = 2 + 2 + 1;

/// name, value, read_only, config_source, is_sensitive, synonyms length, and
/// from v3 config_type and documentation.
fn config_bytes_min(version: i16) -> usize {
    let base = 2 + 2 + 1 + 1 + 1 + 4;
    if version >= DOCUMENTATION_VERSION_MIN {
        base + 1 + 2
    } else {
        base
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::DescribeConfigs as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "DescribeConfigs v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::describe_configs_request as kp_req;
    use kafka_protocol::messages::describe_configs_response as kp_resp;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    /// A request whose every field the given version carries.
    fn sample_request(version: i16) -> DescribeConfigsRequest {
        DescribeConfigsRequest {
            resources: vec![
                DescribeConfigsResource {
                    resource_type: 2,
                    resource_name: "orders".into(),
                    configuration_keys: Some(vec!["retention.ms".into(), "cleanup.policy".into()]),
                },
                DescribeConfigsResource { resource_type: 4, resource_name: "1".into(), configuration_keys: None },
                DescribeConfigsResource {
                    resource_type: 8,
                    resource_name: "1".into(),
                    configuration_keys: Some(vec![]),
                },
            ],
            include_synonyms: true,
            include_documentation: version >= DOCUMENTATION_VERSION_MIN,
        }
    }

    /// A response whose every field the given version carries.
    fn sample_response(version: i16) -> DescribeConfigsResponse {
        let documented = version >= DOCUMENTATION_VERSION_MIN;
        DescribeConfigsResponse {
            throttle_time_ms: 2,
            results: vec![
                DescribeConfigsResult {
                    error: ErrorCode::None,
                    error_message: None,
                    resource_type: 2,
                    resource_name: "orders".into(),
                    configs: vec![
                        DescribeConfigsResourceResult {
                            name: "retention.ms".into(),
                            value: Some("604800000".into()),
                            read_only: false,
                            config_source: 1,
                            is_sensitive: false,
                            synonyms: vec![
                                DescribeConfigsSynonym {
                                    name: "retention.ms".into(),
                                    value: Some("604800000".into()),
                                    source: 1,
                                },
                                DescribeConfigsSynonym { name: "log.retention.ms".into(), value: None, source: 4 },
                            ],
                            config_type: if documented { 5 } else { CONFIG_TYPE_UNKNOWN },
                            documentation: documented.then(|| "How long to keep a log segment.".into()),
                        },
                        DescribeConfigsResourceResult {
                            name: "sasl.jaas.config".into(),
                            value: None,
                            read_only: true,
                            config_source: 5,
                            is_sensitive: true,
                            synonyms: vec![],
                            config_type: if documented { 9 } else { CONFIG_TYPE_UNKNOWN },
                            documentation: None,
                        },
                    ],
                },
                DescribeConfigsResult {
                    error: ErrorCode::InvalidRequest,
                    error_message: Some("Unknown resource type 9".into()),
                    resource_type: 9,
                    resource_name: "x".into(),
                    configs: vec![],
                },
            ],
        }
    }

    fn str_bytes(s: &str) -> StrBytes {
        StrBytes::from_string(s.to_owned())
    }

    fn kp_request(ours: &DescribeConfigsRequest) -> kp_req::DescribeConfigsRequest {
        let resources = ours
            .resources
            .iter()
            .map(|res| {
                kp_req::DescribeConfigsResource::default()
                    .with_resource_type(res.resource_type)
                    .with_resource_name(str_bytes(&res.resource_name))
                    .with_configuration_keys(
                        res.configuration_keys.as_ref().map(|keys| keys.iter().map(|k| str_bytes(k)).collect()),
                    )
            })
            .collect();
        kp_req::DescribeConfigsRequest::default()
            .with_resources(resources)
            .with_include_synonyms(ours.include_synonyms)
            .with_include_documentation(ours.include_documentation)
    }

    fn kp_response(ours: &DescribeConfigsResponse) -> kp_resp::DescribeConfigsResponse {
        let results = ours
            .results
            .iter()
            .map(|res| {
                let configs = res
                    .configs
                    .iter()
                    .map(|c| {
                        let synonyms = c
                            .synonyms
                            .iter()
                            .map(|s| {
                                kp_resp::DescribeConfigsSynonym::default()
                                    .with_name(str_bytes(&s.name))
                                    .with_value(s.value.as_deref().map(str_bytes))
                                    .with_source(s.source)
                            })
                            .collect();
                        kp_resp::DescribeConfigsResourceResult::default()
                            .with_name(str_bytes(&c.name))
                            .with_value(c.value.as_deref().map(str_bytes))
                            .with_read_only(c.read_only)
                            .with_config_source(c.config_source)
                            .with_is_sensitive(c.is_sensitive)
                            .with_synonyms(synonyms)
                            .with_config_type(c.config_type)
                            .with_documentation(c.documentation.as_deref().map(str_bytes))
                    })
                    .collect();
                kp_resp::DescribeConfigsResult::default()
                    .with_error_code(res.error.code())
                    .with_error_message(res.error_message.as_deref().map(str_bytes))
                    .with_resource_type(res.resource_type)
                    .with_resource_name(str_bytes(&res.resource_name))
                    .with_configs(configs)
            })
            .collect();
        kp_resp::DescribeConfigsResponse::default().with_throttle_time_ms(ours.throttle_time_ms).with_results(results)
    }

    fn kp_encode<M: Encodable>(message: &M, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("kafka-protocol encodes the message");
        buf.freeze()
    }

    fn request_bytes(request: &DescribeConfigsRequest, version: i16) -> Bytes {
        let mut w = Writer::new();
        request.encode(&mut w, version);
        w.into_bytes()
    }

    fn response_bytes(response: &DescribeConfigsResponse, version: i16) -> Bytes {
        let mut w = Writer::new();
        response.encode(&mut w, version);
        w.into_bytes()
    }

    #[test]
    fn describe_configs_request_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(request_bytes(&sample_request(version), version));
            assert_eq!(DescribeConfigsRequest::decode(&mut r, version).unwrap(), sample_request(version), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn describe_configs_response_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let mut r = Reader::new(response_bytes(&sample_response(version), version));
            let decoded = DescribeConfigsResponse::decode(&mut r, version).unwrap();
            assert_eq!(decoded, sample_response(version), "v{version}");
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn describe_configs_request_v1_to_v3_matches_kafka_protocol_encoding() {
        for version in VERSION_MIN..=VERSION_MAX {
            let theirs = kp_request(&sample_request(version));
            let ours = request_bytes(&sample_request(version), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_req::DescribeConfigsRequest::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, theirs, "v{version}");
        }
    }

    #[test]
    fn describe_configs_response_v1_to_v3_matches_kafka_protocol_encoding() {
        for version in VERSION_MIN..=VERSION_MAX {
            let theirs = kp_response(&sample_response(version));
            let ours = response_bytes(&sample_response(version), version);
            assert_eq!(ours, kp_encode(&theirs, version), "v{version}");
            let decoded = kp_resp::DescribeConfigsResponse::decode(&mut ours.clone(), version).unwrap();
            let mut expected = theirs;
            if version < DOCUMENTATION_VERSION_MIN {
                // Absent, kafka-protocol reads it as "" (the Java default); we read None.
                for config in expected.results.iter_mut().flat_map(|result| result.configs.iter_mut()) {
                    config.documentation = Some(StrBytes::default());
                }
            }
            assert_eq!(decoded, expected, "v{version}");
        }
    }

    #[test]
    fn describe_configs_v2_drops_the_v3_documentation_fields() {
        let mut request = sample_request(VERSION_MAX);
        request.include_documentation = true;
        let v2 = request_bytes(&request, 2);
        let decoded = DescribeConfigsRequest::decode(&mut Reader::new(v2), 2).unwrap();
        assert!(!decoded.include_documentation);

        let v2 = response_bytes(&sample_response(VERSION_MAX), 2);
        let decoded = DescribeConfigsResponse::decode(&mut Reader::new(v2), 2).unwrap();
        assert_eq!(decoded, sample_response(2));
    }

    #[test]
    fn describe_configs_null_key_list_stays_distinct_from_an_empty_one() {
        let mut r = Reader::new(request_bytes(&sample_request(VERSION_MAX), VERSION_MAX));
        let decoded = DescribeConfigsRequest::decode(&mut r, VERSION_MAX).unwrap();
        assert_eq!(decoded.resources[1].configuration_keys, None);
        assert_eq!(decoded.resources[2].configuration_keys, Some(vec![]));
    }

    #[test]
    fn truncated_describe_configs_frames_are_errors_not_panics() {
        for version in VERSION_MIN..=VERSION_MAX {
            let request = request_bytes(&sample_request(version), version);
            for len in 0..request.len() {
                let mut r = Reader::new(request.slice(..len));
                assert!(DescribeConfigsRequest::decode(&mut r, version).is_err(), "v{version} request cut at {len}");
            }
            let response = response_bytes(&sample_response(version), version);
            for len in 0..response.len() {
                let mut r = Reader::new(response.slice(..len));
                assert!(DescribeConfigsResponse::decode(&mut r, version).is_err(), "v{version} response cut at {len}");
            }
        }
    }

    #[test]
    fn describe_configs_config_count_beyond_the_frame_is_refused_before_allocating() {
        // Four v3 entries need at least 4 × 14 bytes; 55 follow the count.
        let mut w = Writer::new();
        w.i32(0); // throttle_time_ms
        w.i32(1); // one result
        w.i16(0);
        w.nullable_string(None);
        w.i8(2);
        w.string("orders");
        w.i32(4);
        w.raw(&[0; 55]);
        let mut r = Reader::new(w.into_bytes());
        let result = DescribeConfigsResponse::decode(&mut r, 3);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn describe_configs_versions_outside_the_served_range_are_refused() {
        let bytes = request_bytes(&sample_request(VERSION_MAX), VERSION_MAX);
        for version in [VERSION_MIN - 1, VERSION_MAX + 1] {
            let result = DescribeConfigsRequest::decode(&mut Reader::new(bytes.clone()), version);
            assert!(matches!(result, Err(DecodeError::UnsupportedVersion { .. })), "v{version}");
        }
    }

    #[test]
    fn describe_configs_versions_match_the_advertised_range() {
        let range = ApiKey::DescribeConfigs.range().expect("DescribeConfigs is advertised");
        assert_eq!((range.version_min, range.version_max), (VERSION_MIN, VERSION_MAX));
        assert!(range.flexible_from > VERSION_MAX, "this codec writes no flexible version");
    }
}
