//! AlterPartitionReassignments (key 45) and ListPartitionReassignments (key
//! 46), version 0 of each, both directions (KIP-455): an administrator
//! gives a partition a new replica set (or cancels a move in progress with
//! null), and lists the moves in progress. Both are flexible from v0.
//!
//! ```text
//! alter request    timeout_ms i32,
//!                  topics [name string, partitions [partition_index i32, replicas nullable [i32]]]
//! alter response   throttle_time_ms i32, error_code i16, error_message nullable string,
//!                  responses [name string,
//!                      partitions [partition_index i32, error_code i16, error_message nullable string]]
//! list request     timeout_ms i32, topics nullable [name string, partition_indexes [i32]]
//! list response    throttle_time_ms i32, error_code i16, error_message nullable string,
//!                  topics [name string, partitions [partition_index i32, replicas [i32],
//!                      adding_replicas [i32], removing_replicas [i32]]]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MAX: i16 = 0;

/// One partition's new replicas; None cancels its move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReassignablePartition {
    pub partition: i32,
    pub replicas: Option<Vec<i32>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterPartitionReassignmentsRequest {
    pub timeout_ms: i32,
    pub topics: Vec<(String, Vec<ReassignablePartition>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReassignmentResult {
    pub partition: i32,
    pub error: ErrorCode,
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterPartitionReassignmentsResponse {
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub message: Option<String>,
    pub responses: Vec<(String, Vec<ReassignmentResult>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPartitionReassignmentsRequest {
    pub timeout_ms: i32,
    /// None: every move in progress.
    pub topics: Option<Vec<(String, Vec<i32>)>>,
}

/// A move in progress: every replica it involves, and which of them it
/// adds and removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OngoingReassignment {
    pub partition: i32,
    pub replicas: Vec<i32>,
    pub adding: Vec<i32>,
    pub removing: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPartitionReassignmentsResponse {
    pub throttle_time_ms: i32,
    pub error: ErrorCode,
    pub message: Option<String>,
    pub topics: Vec<(String, Vec<OngoingReassignment>)>,
}

fn i32s(r: &mut Reader) -> DecodeResult<Vec<i32>> {
    let count = r.array_len_v(true, 4)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(r.i32()?);
    }
    Ok(out)
}

fn write_i32s(w: &mut Writer, values: &[i32]) {
    w.array_len_v(values.len(), true);
    for value in values {
        w.i32(*value);
    }
}

impl AlterPartitionReassignmentsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(ApiKey::AlterPartitionReassignments, version)?;
        let timeout_ms = r.i32()?;
        let count = r.array_len_v(true, 2)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = r.string_v(true)?;
            let partitions_count = r.array_len_v(true, 6)?;
            let mut partitions = Vec::with_capacity(partitions_count);
            for _ in 0..partitions_count {
                let partition = r.i32()?;
                let replicas = match r.nullable_array_len_v(true, 4)? {
                    None => None,
                    Some(count) => {
                        let mut replicas = Vec::with_capacity(count);
                        for _ in 0..count {
                            replicas.push(r.i32()?);
                        }
                        Some(replicas)
                    }
                };
                r.tagged_fields_v(true)?;
                partitions.push(ReassignablePartition { partition, replicas });
            }
            r.tagged_fields_v(true)?;
            topics.push((name, partitions));
        }
        r.tagged_fields_v(true)?;
        Ok(Self { timeout_ms, topics })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check_version(ApiKey::AlterPartitionReassignments, version).is_ok());
        w.i32(self.timeout_ms);
        w.array_len_v(self.topics.len(), true);
        for (name, partitions) in &self.topics {
            w.string_v(name, true);
            w.array_len_v(partitions.len(), true);
            for p in partitions {
                w.i32(p.partition);
                w.nullable_array_len_v(p.replicas.as_ref().map(Vec::len), true);
                for replica in p.replicas.iter().flatten() {
                    w.i32(*replica);
                }
                w.tagged_fields_v(true);
            }
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }
}

impl AlterPartitionReassignmentsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check_version(ApiKey::AlterPartitionReassignments, version).is_ok());
        w.i32(self.throttle_time_ms);
        w.i16(self.error.code());
        w.nullable_string_v(self.message.as_deref(), true);
        w.array_len_v(self.responses.len(), true);
        for (name, partitions) in &self.responses {
            w.string_v(name, true);
            w.array_len_v(partitions.len(), true);
            for p in partitions {
                w.i32(p.partition);
                w.i16(p.error.code());
                w.nullable_string_v(p.message.as_deref(), true);
                w.tagged_fields_v(true);
            }
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(ApiKey::AlterPartitionReassignments, version)?;
        let throttle_time_ms = r.i32()?;
        let error = error::from_code(r.i16()?);
        let message = r.nullable_string_v(true)?;
        let count = r.array_len_v(true, 2)?;
        let mut responses = Vec::with_capacity(count);
        for _ in 0..count {
            let name = r.string_v(true)?;
            let partitions_count = r.array_len_v(true, 7)?;
            let mut partitions = Vec::with_capacity(partitions_count);
            for _ in 0..partitions_count {
                let partition = r.i32()?;
                let error = error::from_code(r.i16()?);
                let message = r.nullable_string_v(true)?;
                r.tagged_fields_v(true)?;
                partitions.push(ReassignmentResult { partition, error, message });
            }
            r.tagged_fields_v(true)?;
            responses.push((name, partitions));
        }
        r.tagged_fields_v(true)?;
        Ok(Self { throttle_time_ms, error, message, responses })
    }
}

impl ListPartitionReassignmentsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(ApiKey::ListPartitionReassignments, version)?;
        let timeout_ms = r.i32()?;
        let topics = match r.nullable_array_len_v(true, 2)? {
            None => None,
            Some(count) => {
                let mut topics = Vec::with_capacity(count);
                for _ in 0..count {
                    let name = r.string_v(true)?;
                    let partitions = i32s(r)?;
                    r.tagged_fields_v(true)?;
                    topics.push((name, partitions));
                }
                Some(topics)
            }
        };
        r.tagged_fields_v(true)?;
        Ok(Self { timeout_ms, topics })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check_version(ApiKey::ListPartitionReassignments, version).is_ok());
        w.i32(self.timeout_ms);
        w.nullable_array_len_v(self.topics.as_ref().map(Vec::len), true);
        for (name, partitions) in self.topics.iter().flatten() {
            w.string_v(name, true);
            write_i32s(w, partitions);
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }
}

impl ListPartitionReassignmentsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert!(check_version(ApiKey::ListPartitionReassignments, version).is_ok());
        w.i32(self.throttle_time_ms);
        w.i16(self.error.code());
        w.nullable_string_v(self.message.as_deref(), true);
        w.array_len_v(self.topics.len(), true);
        for (name, partitions) in &self.topics {
            w.string_v(name, true);
            w.array_len_v(partitions.len(), true);
            for p in partitions {
                w.i32(p.partition);
                write_i32s(w, &p.replicas);
                write_i32s(w, &p.adding);
                write_i32s(w, &p.removing);
                w.tagged_fields_v(true);
            }
            w.tagged_fields_v(true);
        }
        w.tagged_fields_v(true);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(ApiKey::ListPartitionReassignments, version)?;
        let throttle_time_ms = r.i32()?;
        let error = error::from_code(r.i16()?);
        let message = r.nullable_string_v(true)?;
        let count = r.array_len_v(true, 2)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = r.string_v(true)?;
            let partitions_count = r.array_len_v(true, 8)?;
            let mut partitions = Vec::with_capacity(partitions_count);
            for _ in 0..partitions_count {
                let partition = r.i32()?;
                let replicas = i32s(r)?;
                let adding = i32s(r)?;
                let removing = i32s(r)?;
                r.tagged_fields_v(true)?;
                partitions.push(OngoingReassignment { partition, replicas, adding, removing });
            }
            r.tagged_fields_v(true)?;
            topics.push((name, partitions));
        }
        r.tagged_fields_v(true)?;
        Ok(Self { throttle_time_ms, error, message, topics })
    }
}

fn check_version(api: ApiKey, version: i16) -> DecodeResult<()> {
    if (0..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: api as i16, version })
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::{
        alter_partition_reassignments_request as alter_req, alter_partition_reassignments_response as alter_resp,
        list_partition_reassignments_request as list_req, list_partition_reassignments_response as list_resp, BrokerId,
        TopicName,
    };
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

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
    }

    fn brokers(ids: &[i32]) -> Vec<BrokerId> {
        ids.iter().map(|id| BrokerId(*id)).collect()
    }

    #[test]
    fn alter_partition_reassignments_matches_kafka_protocol_encoding_both_ways() {
        let request = AlterPartitionReassignmentsRequest {
            timeout_ms: 30_000,
            topics: vec![(
                "t".into(),
                vec![
                    ReassignablePartition { partition: 0, replicas: Some(vec![3, 4]) },
                    ReassignablePartition { partition: 1, replicas: None },
                ],
            )],
        };
        let kafka = alter_req::AlterPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_topics(vec![
            alter_req::ReassignableTopic::default().with_name(name("t")).with_partitions(vec![
                alter_req::ReassignablePartition::default()
                    .with_partition_index(0)
                    .with_replicas(Some(brokers(&[3, 4]))),
                alter_req::ReassignablePartition::default().with_partition_index(1).with_replicas(None),
            ]),
        ]);
        let ours = encoded(|w| request.encode(w, 0));
        assert_eq!(ours, theirs(&kafka, 0));
        assert_eq!(AlterPartitionReassignmentsRequest::decode(&mut Reader::new(ours), 0).unwrap(), request);

        let response = AlterPartitionReassignmentsResponse {
            throttle_time_ms: 0,
            error: ErrorCode::None,
            message: None,
            responses: vec![(
                "t".into(),
                vec![
                    ReassignmentResult { partition: 0, error: ErrorCode::None, message: None },
                    ReassignmentResult {
                        partition: 1,
                        error: ErrorCode::NoReassignmentInProgress,
                        message: Some("none".into()),
                    },
                ],
            )],
        };
        let kafka =
            alter_resp::AlterPartitionReassignmentsResponse::default().with_error_message(None).with_responses(vec![
                alter_resp::ReassignableTopicResponse::default().with_name(name("t")).with_partitions(vec![
                    alter_resp::ReassignablePartitionResponse::default()
                        .with_partition_index(0)
                        .with_error_message(None),
                    alter_resp::ReassignablePartitionResponse::default()
                        .with_partition_index(1)
                        .with_error_code(ErrorCode::NoReassignmentInProgress.code())
                        .with_error_message(Some(StrBytes::from_static_str("none"))),
                ]),
            ]);
        let ours = encoded(|w| response.encode(w, 0));
        assert_eq!(ours, theirs(&kafka, 0));
        assert_eq!(AlterPartitionReassignmentsResponse::decode(&mut Reader::new(ours), 0).unwrap(), response);
    }

    #[test]
    fn list_partition_reassignments_matches_kafka_protocol_encoding_both_ways() {
        for topics in [None, Some(vec![("t".to_string(), vec![0, 2])])] {
            let request = ListPartitionReassignmentsRequest { timeout_ms: 1000, topics: topics.clone() };
            let kafka = list_req::ListPartitionReassignmentsRequest::default().with_timeout_ms(1000).with_topics(
                topics.map(|_| {
                    vec![list_req::ListPartitionReassignmentsTopics::default()
                        .with_name(name("t"))
                        .with_partition_indexes(vec![0, 2])]
                }),
            );
            let ours = encoded(|w| request.encode(w, 0));
            assert_eq!(ours, theirs(&kafka, 0));
            assert_eq!(ListPartitionReassignmentsRequest::decode(&mut Reader::new(ours), 0).unwrap(), request);
        }
        let response = ListPartitionReassignmentsResponse {
            throttle_time_ms: 0,
            error: ErrorCode::None,
            message: None,
            topics: vec![(
                "t".into(),
                vec![OngoingReassignment { partition: 0, replicas: vec![3, 1, 2], adding: vec![3], removing: vec![2] }],
            )],
        };
        let kafka =
            list_resp::ListPartitionReassignmentsResponse::default().with_error_message(None).with_topics(vec![
                list_resp::OngoingTopicReassignment::default().with_name(name("t")).with_partitions(vec![
                    list_resp::OngoingPartitionReassignment::default()
                        .with_partition_index(0)
                        .with_replicas(brokers(&[3, 1, 2]))
                        .with_adding_replicas(brokers(&[3]))
                        .with_removing_replicas(brokers(&[2])),
                ]),
            ]);
        let ours = encoded(|w| response.encode(w, 0));
        assert_eq!(ours, theirs(&kafka, 0));
        assert_eq!(ListPartitionReassignmentsResponse::decode(&mut Reader::new(ours), 0).unwrap(), response);
    }
}
