//! DescribeCluster (key 60), versions 0–2, both directions. Every version is
//! flexible. v1 adds the endpoint type (1 brokers, 2 controllers), v2 asks
//! for fenced brokers and marks each broker fenced or not.
//!
//! ```text
//! request   include_cluster_authorized_operations bool, endpoint_type i8 (v1+),
//!           include_fenced_brokers bool (v2+)
//! response  throttle_time_ms i32, error_code i16, error_message nullable string,
//!           endpoint_type i8 (v1+), cluster_id string, controller_id i32,
//!           brokers [broker_id i32, host string, port i32, rack nullable string,
//!                    is_fenced bool (v2+)],
//!           cluster_authorized_operations i32
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 2;
pub const ENDPOINT_TYPE_BROKERS: i8 = 1;
/// `cluster_authorized_operations` when the client did not ask for them.
pub const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeClusterRequest {
    pub include_cluster_authorized_operations: bool,
    /// v1+; brokers below.
    pub endpoint_type: i8,
    /// v2+.
    pub include_fenced_brokers: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeClusterResponse {
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub error_message: Option<String>,
    /// v1+.
    pub endpoint_type: i8,
    pub cluster_id: String,
    pub controller_id: i32,
    pub brokers: Vec<DescribeClusterBroker>,
    pub cluster_authorized_operations: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeClusterBroker {
    pub broker_id: i32,
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
    /// v2+.
    pub is_fenced: bool,
}

impl DescribeClusterRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let include_cluster_authorized_operations = r.bool()?;
        let endpoint_type = if version >= 1 { r.i8()? } else { ENDPOINT_TYPE_BROKERS };
        let include_fenced_brokers = if version >= 2 { r.bool()? } else { false };
        r.tagged_fields()?;
        Ok(Self { include_cluster_authorized_operations, endpoint_type, include_fenced_brokers })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.bool(self.include_cluster_authorized_operations);
        if version >= 1 {
            w.i8(self.endpoint_type);
        }
        if version >= 2 {
            w.bool(self.include_fenced_brokers);
        }
        w.tagged_fields_v(true);
    }
}

impl DescribeClusterResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i32(self.throttle_time_ms);
        w.i16(self.error.code());
        w.nullable_string_v(self.error_message.as_deref(), true);
        if version >= 1 {
            w.i8(self.endpoint_type);
        }
        w.string_v(&self.cluster_id, true);
        w.i32(self.controller_id);
        w.array_len_v(self.brokers.len(), true);
        for broker in &self.brokers {
            w.i32(broker.broker_id);
            w.string_v(&broker.host, true);
            w.i32(broker.port);
            w.nullable_string_v(broker.rack.as_deref(), true);
            if version >= 2 {
                w.bool(broker.is_fenced);
            }
            w.tagged_fields_v(true);
        }
        w.i32(self.cluster_authorized_operations);
        w.tagged_fields_v(true);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let throttle_time_ms = r.i32()?;
        let error = error::from_code(r.i16()?);
        let error_message = r.nullable_string_v(true)?;
        let endpoint_type = if version >= 1 { r.i8()? } else { ENDPOINT_TYPE_BROKERS };
        let cluster_id = r.string_v(true)?;
        let controller_id = r.i32()?;
        let broker_count = r.array_len_v(true, BROKER_BYTES_MIN)?;
        let mut brokers = Vec::with_capacity(broker_count);
        for _ in 0..broker_count {
            let broker_id = r.i32()?;
            let host = r.string_v(true)?;
            let port = r.i32()?;
            let rack = r.nullable_string_v(true)?;
            let is_fenced = if version >= 2 { r.bool()? } else { false };
            r.tagged_fields()?;
            brokers.push(DescribeClusterBroker { broker_id, host, port, rack, is_fenced });
        }
        let cluster_authorized_operations = r.i32()?;
        r.tagged_fields()?;
        Ok(Self {
            throttle_time_ms,
            error,
            error_message,
            endpoint_type,
            cluster_id,
            controller_id,
            brokers,
            cluster_authorized_operations,
        })
    }
}

/// broker_id, host, port, rack, tagged fields: the smallest broker entry.
const BROKER_BYTES_MIN: usize = 4 + 1 + 4 + 1 + 1;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::DescribeCluster as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "DescribeCluster v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::describe_cluster_request as kp_req;
    use kafka_protocol::messages::describe_cluster_response as kp_resp;
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request(version: i16) -> DescribeClusterRequest {
        DescribeClusterRequest {
            include_cluster_authorized_operations: true,
            endpoint_type: ENDPOINT_TYPE_BROKERS,
            include_fenced_brokers: version >= 2,
        }
    }

    fn sample_response(version: i16) -> DescribeClusterResponse {
        DescribeClusterResponse {
            throttle_time_ms: 0,
            error: ErrorCode::None,
            error_message: None,
            endpoint_type: ENDPOINT_TYPE_BROKERS,
            cluster_id: "shardlog-0000".into(),
            controller_id: 0,
            brokers: vec![
                DescribeClusterBroker { broker_id: 0, host: "h".into(), port: 9092, rack: None, is_fenced: false },
                DescribeClusterBroker {
                    broker_id: 1,
                    host: "h".into(),
                    port: 9093,
                    rack: Some("r1".into()),
                    is_fenced: version >= 2,
                },
            ],
            cluster_authorized_operations: AUTHORIZED_OPERATIONS_OMITTED,
        }
    }

    fn kp_response(ours: &DescribeClusterResponse) -> kp_resp::DescribeClusterResponse {
        let brokers = ours
            .brokers
            .iter()
            .map(|b| {
                kp_resp::DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(b.broker_id))
                    .with_host(StrBytes::from_string(b.host.clone()))
                    .with_port(b.port)
                    .with_rack(b.rack.clone().map(StrBytes::from_string))
            })
            .collect();
        kp_resp::DescribeClusterResponse::default()
            .with_throttle_time_ms(ours.throttle_time_ms)
            .with_error_code(ours.error.code())
            .with_error_message(ours.error_message.clone().map(StrBytes::from_string))
            .with_endpoint_type(ours.endpoint_type)
            .with_cluster_id(StrBytes::from_string(ours.cluster_id.clone()))
            .with_controller_id(BrokerId(ours.controller_id))
            .with_brokers(brokers)
            .with_cluster_authorized_operations(ours.cluster_authorized_operations)
    }

    fn encoded<F: FnOnce(&mut Writer)>(f: F) -> Bytes {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    #[test]
    fn describe_cluster_round_trips_in_every_version() {
        for version in VERSION_MIN..=VERSION_MAX {
            let bytes = encoded(|w| sample_request(version).encode(w, version));
            let mut r = Reader::new(bytes);
            assert_eq!(DescribeClusterRequest::decode(&mut r, version).unwrap(), sample_request(version));
            assert_eq!(r.remaining(), 0, "v{version}");
            let bytes = encoded(|w| sample_response(version).encode(w, version));
            let mut r = Reader::new(bytes);
            assert_eq!(DescribeClusterResponse::decode(&mut r, version).unwrap(), sample_response(version));
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn describe_cluster_v0_to_v1_matches_kafka_protocol_encoding() {
        // kafka-protocol 0.15 knows v0-v1; v2 only adds the fenced flags.
        for version in 0..=1 {
            let theirs = kp_req::DescribeClusterRequest::default()
                .with_include_cluster_authorized_operations(true)
                .with_endpoint_type(ENDPOINT_TYPE_BROKERS);
            let mut buf = BytesMut::new();
            theirs.encode(&mut buf, version).unwrap();
            let ours = DescribeClusterRequest::decode(&mut Reader::new(buf.freeze()), version).unwrap();
            assert_eq!(ours, sample_request(version), "v{version}");

            let ours = encoded(|w| sample_response(version).encode(w, version));
            let decoded = kp_resp::DescribeClusterResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, kp_response(&sample_response(version)), "v{version}");
        }
    }

    #[test]
    fn truncated_describe_cluster_frames_are_errors_not_panics() {
        let response = encoded(|w| sample_response(VERSION_MAX).encode(w, VERSION_MAX));
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(DescribeClusterResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
        let request = encoded(|w| sample_request(VERSION_MAX).encode(w, VERSION_MAX));
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(DescribeClusterRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
    }

    #[test]
    fn describe_cluster_versions_match_the_advertised_range() {
        let range = ApiKey::DescribeCluster.range().expect("DescribeCluster is advertised");
        assert_eq!((range.version_min, range.version_max, range.flexible_from), (VERSION_MIN, VERSION_MAX, 0));
    }
}
