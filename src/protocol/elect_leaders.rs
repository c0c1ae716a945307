//! ElectLeaders (key 43), versions 0–2, both directions (KIP-460): an
//! administrator moves leadership back to each partition's preferred
//! replica (type 0), or lets an out-of-sync replica lead a partition with
//! no leader (type 1, unclean). v1 adds `election_type` and the top-level
//! error; v2 is flexible.
//!
//! ```text
//! request   election_type i8 (v1+),
//!           topic_partitions nullable [topic string, partitions [i32]]  (null: every partition),
//!           timeout_ms i32
//! response  throttle_time_ms i32, error_code i16 (v1+),
//!           replica_election_results [topic string,
//!               partition_result [partition_id i32, error_code i16, error_message nullable string]]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MAX: i16 = 2;
const FLEXIBLE_FROM: i16 = 2;

/// Kafka's election types.
pub const PREFERRED: i8 = 0;
pub const UNCLEAN: i8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectLeadersRequest {
    pub election_type: i8,
    /// None: every partition of the cluster.
    pub topic_partitions: Option<Vec<(String, Vec<i32>)>>,
    pub timeout_ms: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectLeadersResponse {
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub results: Vec<(String, Vec<PartitionResult>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionResult {
    pub partition: i32,
    pub error: ErrorCode,
    pub message: Option<String>,
}

impl ElectLeadersRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let flexible = version >= FLEXIBLE_FROM;
        let election_type = if version >= 1 { r.i8()? } else { PREFERRED };
        let topic_partitions = match r.nullable_array_len_v(flexible, 2)? {
            None => None,
            Some(count) => {
                let mut topics = Vec::with_capacity(count);
                for _ in 0..count {
                    let topic = r.string_v(flexible)?;
                    let partitions_count = r.array_len_v(flexible, 4)?;
                    let mut partitions = Vec::with_capacity(partitions_count);
                    for _ in 0..partitions_count {
                        partitions.push(r.i32()?);
                    }
                    r.tagged_fields_v(flexible)?;
                    topics.push((topic, partitions));
                }
                Some(topics)
            }
        };
        let timeout_ms = r.i32()?;
        r.tagged_fields_v(flexible)?;
        Ok(Self { election_type, topic_partitions, timeout_ms })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check_version(version).is_ok(), "ElectLeaders v{version} is not supported");
        let flexible = version >= FLEXIBLE_FROM;
        if version >= 1 {
            w.i8(self.election_type);
        }
        w.nullable_array_len_v(self.topic_partitions.as_ref().map(Vec::len), flexible);
        for (topic, partitions) in self.topic_partitions.iter().flatten() {
            w.string_v(topic, flexible);
            w.array_len_v(partitions.len(), flexible);
            for partition in partitions {
                w.i32(*partition);
            }
            w.tagged_fields_v(flexible);
        }
        w.i32(self.timeout_ms);
        w.tagged_fields_v(flexible);
    }
}

impl ElectLeadersResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check_version(version).is_ok(), "ElectLeaders v{version} is not supported");
        let flexible = version >= FLEXIBLE_FROM;
        w.i32(self.throttle_time_ms);
        if version >= 1 {
            w.i16(self.error.code());
        }
        w.array_len_v(self.results.len(), flexible);
        for (topic, partitions) in &self.results {
            w.string_v(topic, flexible);
            w.array_len_v(partitions.len(), flexible);
            for p in partitions {
                w.i32(p.partition);
                w.i16(p.error.code());
                w.nullable_string_v(p.message.as_deref(), flexible);
                w.tagged_fields_v(flexible);
            }
            w.tagged_fields_v(flexible);
        }
        w.tagged_fields_v(flexible);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let flexible = version >= FLEXIBLE_FROM;
        let throttle_time_ms = r.i32()?;
        let error = if version >= 1 { error::from_code(r.i16()?) } else { ErrorCode::None };
        let count = r.array_len_v(flexible, 2)?;
        let mut results = Vec::with_capacity(count);
        for _ in 0..count {
            let topic = r.string_v(flexible)?;
            let partitions_count = r.array_len_v(flexible, 6)?;
            let mut partitions = Vec::with_capacity(partitions_count);
            for _ in 0..partitions_count {
                let partition = r.i32()?;
                let error = error::from_code(r.i16()?);
                let message = r.nullable_string_v(flexible)?;
                r.tagged_fields_v(flexible)?;
                partitions.push(PartitionResult { partition, error, message });
            }
            r.tagged_fields_v(flexible)?;
            results.push((topic, partitions));
        }
        r.tagged_fields_v(flexible)?;
        Ok(Self { throttle_time_ms, error, results })
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (0..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::ElectLeaders as i16, version })
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::{elect_leaders_request as kp_req, elect_leaders_response as kp_resp, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::*;

    fn encoded<F: FnOnce(&mut Writer)>(f: F) -> Bytes {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    fn theirs<T: Encodable>(message: &T, version: i16) -> Bytes {
        let mut out = BytesMut::new();
        message.encode(&mut out, version).expect("kafka-protocol encodes");
        out.freeze()
    }

    #[test]
    fn elect_leaders_matches_kafka_protocol_encoding_both_ways_in_every_version() {
        for version in 0..=VERSION_MAX {
            let request = ElectLeadersRequest {
                election_type: if version >= 1 { UNCLEAN } else { PREFERRED },
                topic_partitions: Some(vec![("t".into(), vec![0, 2])]),
                timeout_ms: 3000,
            };
            let kafka = kp_req::ElectLeadersRequest::default()
                .with_election_type(request.election_type)
                .with_topic_partitions(Some(vec![kp_req::TopicPartitions::default()
                    .with_topic(TopicName(StrBytes::from_static_str("t")))
                    .with_partitions(vec![0, 2])]))
                .with_timeout_ms(3000);
            let ours = encoded(|w| request.encode(w, version));
            assert_eq!(ours, theirs(&kafka, version), "request v{version}");
            assert_eq!(ElectLeadersRequest::decode(&mut Reader::new(ours), version).unwrap(), request);
            let all = ElectLeadersRequest { topic_partitions: None, ..request };
            let ours = encoded(|w| all.encode(w, version));
            assert_eq!(ElectLeadersRequest::decode(&mut Reader::new(ours), version).unwrap(), all);

            let response = ElectLeadersResponse {
                throttle_time_ms: 0,
                error: ErrorCode::None,
                results: vec![(
                    "t".into(),
                    vec![
                        PartitionResult { partition: 0, error: ErrorCode::None, message: None },
                        PartitionResult {
                            partition: 2,
                            error: ErrorCode::ElectionNotNeeded,
                            message: Some("already leads".into()),
                        },
                    ],
                )],
            };
            let kafka = kp_resp::ElectLeadersResponse::default().with_replica_election_results(vec![
                kp_resp::ReplicaElectionResult::default()
                    .with_topic(TopicName(StrBytes::from_static_str("t")))
                    .with_partition_result(vec![
                        kp_resp::PartitionResult::default().with_partition_id(0).with_error_message(None),
                        kp_resp::PartitionResult::default()
                            .with_partition_id(2)
                            .with_error_code(ErrorCode::ElectionNotNeeded.code())
                            .with_error_message(Some(StrBytes::from_static_str("already leads"))),
                    ]),
            ]);
            let ours = encoded(|w| response.encode(w, version));
            assert_eq!(ours, theirs(&kafka, version), "response v{version}");
            assert_eq!(ElectLeadersResponse::decode(&mut Reader::new(ours), version).unwrap(), response);
        }
    }

    #[test]
    fn a_truncated_elect_leaders_request_is_a_decode_error() {
        let request = ElectLeadersRequest {
            election_type: 0,
            topic_partitions: Some(vec![("t".into(), vec![1])]),
            timeout_ms: 1,
        };
        for version in 0..=VERSION_MAX {
            let bytes = encoded(|w| request.encode(w, version));
            for cut in 0..bytes.len() {
                assert!(ElectLeadersRequest::decode(&mut Reader::new(bytes.slice(..cut)), version).is_err());
            }
        }
    }
}
