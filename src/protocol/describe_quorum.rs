//! DescribeQuorum (key 55), versions 0–2, both directions. Every version is
//! flexible. It describes the Raft quorum of the metadata log (KRaft's
//! `__cluster_metadata` partition 0); v1 adds when each replica last
//! fetched and last caught up; v2 (KIP-853) adds error messages, each
//! replica's directory id (zero here: shardlog's voters have no directory
//! ids) and the voters' controller endpoints. kafka-python 3 reads the v2
//! error messages whatever version it got, so v2 is what it needs.
//!
//! ```text
//! request   topics [topic_name string, partitions [partition_index i32]]
//! response  error_code i16, error_message nullable string (v2+),
//!           topics [topic_name string,
//!                   partitions [partition_index i32, error_code i16,
//!                               error_message nullable string (v2+), leader_id i32,
//!                               leader_epoch i32, high_watermark i64,
//!                               current_voters [replica_id i32, replica_directory_id uuid (v2+),
//!                                               log_end_offset i64,
//!                                               last_fetch_timestamp i64 (v1+),
//!                                               last_caught_up_timestamp i64 (v1+)],
//!                               observers [same]]],
//!           nodes [node_id i32, listeners [name string, host string, port u16]] (v2+)
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 0;
pub const VERSION_MAX: i16 = 2;
/// The topic and partition KRaft names the metadata log by.
pub const METADATA_TOPIC: &str = "__cluster_metadata";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeQuorumRequest {
    pub topics: Vec<(String, Vec<i32>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeQuorumResponse {
    pub error: ErrorCode,
    /// v2+.
    pub error_message: Option<String>,
    pub topics: Vec<QuorumTopic>,
    /// v2+: each voter's controller endpoints.
    pub nodes: Vec<QuorumNode>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumNode {
    pub node_id: i32,
    /// (listener name, host, port).
    pub listeners: Vec<(String, String, u16)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumTopic {
    pub topic_name: String,
    pub partitions: Vec<QuorumPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumPartition {
    pub partition_index: i32,
    pub error: ErrorCode,
    /// v2+.
    pub error_message: Option<String>,
    pub leader_id: i32,
    pub leader_epoch: i32,
    pub high_watermark: i64,
    pub current_voters: Vec<ReplicaState>,
    pub observers: Vec<ReplicaState>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaState {
    pub replica_id: i32,
    pub log_end_offset: i64,
    /// v1+; -1 unknown.
    pub last_fetch_timestamp: i64,
    /// v1+; -1 unknown.
    pub last_caught_up_timestamp: i64,
}

impl DescribeQuorumRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let count = r.array_len_v(true, 1 + 1 + 1)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = r.string_v(true)?;
            let partition_count = r.array_len_v(true, 4 + 1)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                partitions.push(r.i32()?);
                r.tagged_fields()?;
            }
            r.tagged_fields()?;
            topics.push((name, partitions));
        }
        r.tagged_fields()?;
        Ok(Self { topics })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.array_len_v(self.topics.len(), true);
        for (name, partitions) in &self.topics {
            w.string_v(name, true);
            w.array_len_v(partitions.len(), true);
            for partition in partitions {
                w.i32(*partition);
                w.tagged_fields_v(true);
            }
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }
}

impl DescribeQuorumResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        w.i16(self.error.code());
        if version >= 2 {
            w.nullable_string_v(self.error_message.as_deref(), true);
        }
        w.array_len_v(self.topics.len(), true);
        for topic in &self.topics {
            w.string_v(&topic.topic_name, true);
            w.array_len_v(topic.partitions.len(), true);
            for p in &topic.partitions {
                w.i32(p.partition_index);
                w.i16(p.error.code());
                if version >= 2 {
                    w.nullable_string_v(p.error_message.as_deref(), true);
                }
                w.i32(p.leader_id);
                w.i32(p.leader_epoch);
                w.i64(p.high_watermark);
                for replicas in [&p.current_voters, &p.observers] {
                    w.array_len_v(replicas.len(), true);
                    for replica in replicas {
                        w.i32(replica.replica_id);
                        if version >= 2 {
                            w.uuid(&[0; 16]);
                        }
                        w.i64(replica.log_end_offset);
                        if version >= 1 {
                            w.i64(replica.last_fetch_timestamp);
                            w.i64(replica.last_caught_up_timestamp);
                        }
                        w.tagged_fields_v(true);
                    }
                }
                w.tagged_fields_v(true);
            }
            w.tagged_fields_v(true);
        }
        if version >= 2 {
            w.array_len_v(self.nodes.len(), true);
            for node in &self.nodes {
                w.i32(node.node_id);
                w.array_len_v(node.listeners.len(), true);
                for (name, host, port) in &node.listeners {
                    w.string_v(name, true);
                    w.string_v(host, true);
                    w.i16(*port as i16);
                    w.tagged_fields_v(true);
                }
                w.tagged_fields_v(true);
            }
        }
        w.tagged_fields_v(true);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let error = error::from_code(r.i16()?);
        let error_message = if version >= 2 { r.nullable_string_v(true)? } else { None };
        let topic_count = r.array_len_v(true, 1 + 1 + 1)?;
        let mut topics = Vec::with_capacity(topic_count);
        for _ in 0..topic_count {
            let topic_name = r.string_v(true)?;
            let partition_count = r.array_len_v(true, PARTITION_BYTES_MIN)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition_index = r.i32()?;
                let partition_error = error::from_code(r.i16()?);
                let partition_message = if version >= 2 { r.nullable_string_v(true)? } else { None };
                let leader_id = r.i32()?;
                let leader_epoch = r.i32()?;
                let high_watermark = r.i64()?;
                let mut lists = [Vec::new(), Vec::new()];
                for list in &mut lists {
                    let count = r.array_len_v(true, 4 + 8 + 1)?;
                    for _ in 0..count {
                        let replica_id = r.i32()?;
                        if version >= 2 {
                            r.uuid()?;
                        }
                        let log_end_offset = r.i64()?;
                        let (fetched, caught_up) = if version >= 1 { (r.i64()?, r.i64()?) } else { (-1, -1) };
                        r.tagged_fields()?;
                        list.push(ReplicaState {
                            replica_id,
                            log_end_offset,
                            last_fetch_timestamp: fetched,
                            last_caught_up_timestamp: caught_up,
                        });
                    }
                }
                r.tagged_fields()?;
                let [current_voters, observers] = lists;
                partitions.push(QuorumPartition {
                    partition_index,
                    error: partition_error,
                    error_message: partition_message,
                    leader_id,
                    leader_epoch,
                    high_watermark,
                    current_voters,
                    observers,
                });
            }
            r.tagged_fields()?;
            topics.push(QuorumTopic { topic_name, partitions });
        }
        let mut nodes = Vec::new();
        if version >= 2 {
            let count = r.array_len_v(true, 4 + 1 + 1)?;
            for _ in 0..count {
                let node_id = r.i32()?;
                let listener_count = r.array_len_v(true, 1 + 1 + 2 + 1)?;
                let mut listeners = Vec::with_capacity(listener_count);
                for _ in 0..listener_count {
                    let name = r.string_v(true)?;
                    let host = r.string_v(true)?;
                    let port = r.i16()? as u16;
                    r.tagged_fields()?;
                    listeners.push((name, host, port));
                }
                r.tagged_fields()?;
                nodes.push(QuorumNode { node_id, listeners });
            }
        }
        r.tagged_fields()?;
        Ok(Self { error, error_message, topics, nodes })
    }
}

/// index, error, leader, epoch, high watermark, two arrays, tagged fields.
const PARTITION_BYTES_MIN: usize = 4 + 2 + 4 + 4 + 8 + 1 + 1 + 1;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::DescribeQuorum as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "DescribeQuorum v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::describe_quorum_request as kp_req;
    use kafka_protocol::messages::describe_quorum_response as kp_resp;
    use kafka_protocol::messages::{BrokerId, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_response(version: i16) -> DescribeQuorumResponse {
        let replica = |replica_id, log_end_offset| ReplicaState {
            replica_id,
            log_end_offset,
            last_fetch_timestamp: if version >= 1 { 1_700_000_000_000 } else { -1 },
            last_caught_up_timestamp: if version >= 1 { 1_700_000_000_001 } else { -1 },
        };
        DescribeQuorumResponse {
            error: ErrorCode::None,
            error_message: None,
            nodes: if version >= 2 {
                vec![QuorumNode { node_id: 3, listeners: vec![("CONTROLLER".into(), "10.0.0.3".into(), 9093)] }]
            } else {
                Vec::new()
            },
            topics: vec![QuorumTopic {
                topic_name: METADATA_TOPIC.into(),
                partitions: vec![QuorumPartition {
                    partition_index: 0,
                    error: ErrorCode::None,
                    error_message: None,
                    leader_id: 3,
                    leader_epoch: 7,
                    high_watermark: 42,
                    current_voters: vec![replica(3, 42), replica(1, 40)],
                    observers: vec![replica(9, 12)],
                }],
            }],
        }
    }

    fn encoded<F: FnOnce(&mut Writer)>(f: F) -> Bytes {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    #[test]
    fn describe_quorum_round_trips_and_matches_kafka_protocol_encoding() {
        for version in VERSION_MIN..=VERSION_MAX {
            let request = DescribeQuorumRequest { topics: vec![(METADATA_TOPIC.into(), vec![0])] };
            let theirs = kp_req::DescribeQuorumRequest::default().with_topics(vec![kp_req::TopicData::default()
                .with_topic_name(TopicName(StrBytes::from_static_str(METADATA_TOPIC)))
                .with_partitions(vec![kp_req::PartitionData::default().with_partition_index(0)])]);
            let mut buf = BytesMut::new();
            theirs.encode(&mut buf, version).unwrap();
            assert_eq!(buf.freeze(), encoded(|w| request.encode(w, version)), "v{version}");

            let ours = encoded(|w| sample_response(version).encode(w, version));
            let decoded = kp_resp::DescribeQuorumResponse::decode(&mut ours.clone(), version).unwrap();
            let partition = &decoded.topics[0].partitions[0];
            assert_eq!((partition.leader_id, partition.leader_epoch, partition.high_watermark), (BrokerId(3), 7, 42));
            let voters: Vec<(i32, i64)> =
                partition.current_voters.iter().map(|v| (v.replica_id.0, v.log_end_offset)).collect();
            assert_eq!(voters, vec![(3, 42), (1, 40)], "v{version}");
            let mut r = Reader::new(ours);
            assert_eq!(DescribeQuorumResponse::decode(&mut r, version).unwrap(), sample_response(version));
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn truncated_describe_quorum_frames_are_errors_not_panics() {
        let response = encoded(|w| sample_response(VERSION_MAX).encode(w, VERSION_MAX));
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(DescribeQuorumResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
        let request =
            encoded(|w| DescribeQuorumRequest { topics: vec![("t".into(), vec![0, 1])] }.encode(w, VERSION_MAX));
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(DescribeQuorumRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
    }

    #[test]
    fn describe_quorum_versions_match_the_advertised_range() {
        let range = ApiKey::DescribeQuorum.range().expect("DescribeQuorum is advertised");
        assert_eq!((range.version_min, range.version_max, range.flexible_from), (VERSION_MIN, VERSION_MAX, 0));
    }
}
