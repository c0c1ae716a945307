//! DescribeLogDirs (key 35), versions 1–4, both directions. v1 is v0's
//! layout (answered after throttling); v2 is flexible; v3 adds a top-level
//! error code; v4 adds each directory's total and usable bytes.
//!
//! ```text
//! request   topics nullable [topic string, partitions [i32]]   (null: every partition)
//! response  throttle_time_ms i32, error_code i16 (v3+),
//!           results [error_code i16, log_dir string,
//!                    topics [name string,
//!                            partitions [partition_index i32, partition_size i64,
//!                                        offset_lag i64, is_future_key bool]],
//!                    total_bytes i64 (v4+), usable_bytes i64 (v4+)]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 1;
pub const VERSION_MAX: i16 = 4;
pub const FLEXIBLE_VERSION_MIN: i16 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeLogDirsRequest {
    /// `None`: every partition of every topic.
    pub topics: Option<Vec<DescribableLogDirTopic>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribableLogDirTopic {
    pub topic: String,
    pub partitions: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeLogDirsResponse {
    pub throttle_time_ms: i32,
    /// v3+.
    pub error: ErrorCode,
    pub results: Vec<DescribeLogDirsResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeLogDirsResult {
    pub error: ErrorCode,
    pub log_dir: String,
    pub topics: Vec<DescribeLogDirsTopic>,
    /// v4+; -1 unknown.
    pub total_bytes: i64,
    /// v4+; -1 unknown.
    pub usable_bytes: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeLogDirsTopic {
    pub name: String,
    pub partitions: Vec<DescribeLogDirsPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeLogDirsPartition {
    pub partition_index: i32,
    pub partition_size: i64,
    pub offset_lag: i64,
    pub is_future_key: bool,
}

impl DescribeLogDirsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        let topics = match r.nullable_array_len_v(flexible, topic_bytes_min(flexible))? {
            None => None,
            Some(count) => {
                let mut topics = Vec::with_capacity(count);
                for _ in 0..count {
                    let topic = r.string_v(flexible)?;
                    let partition_count = r.array_len_v(flexible, 4)?;
                    let mut partitions = Vec::with_capacity(partition_count);
                    for _ in 0..partition_count {
                        partitions.push(r.i32()?);
                    }
                    r.tagged_fields_v(flexible)?;
                    topics.push(DescribableLogDirTopic { topic, partitions });
                }
                Some(topics)
            }
        };
        r.tagged_fields_v(flexible)?;
        Ok(Self { topics })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        w.nullable_array_len_v(self.topics.as_ref().map(Vec::len), flexible);
        for topic in self.topics.iter().flatten() {
            w.string_v(&topic.topic, flexible);
            w.array_len_v(topic.partitions.len(), flexible);
            for partition in &topic.partitions {
                w.i32(*partition);
            }
            w.tagged_fields_v(flexible);
        }
        w.tagged_fields_v(flexible);
    }
}

impl DescribeLogDirsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        w.i32(self.throttle_time_ms);
        if version >= 3 {
            w.i16(self.error.code());
        }
        w.array_len_v(self.results.len(), flexible);
        for result in &self.results {
            w.i16(result.error.code());
            w.string_v(&result.log_dir, flexible);
            w.array_len_v(result.topics.len(), flexible);
            for topic in &result.topics {
                w.string_v(&topic.name, flexible);
                w.array_len_v(topic.partitions.len(), flexible);
                for partition in &topic.partitions {
                    w.i32(partition.partition_index);
                    w.i64(partition.partition_size);
                    w.i64(partition.offset_lag);
                    w.bool(partition.is_future_key);
                    w.tagged_fields_v(flexible);
                }
                w.tagged_fields_v(flexible);
            }
            if version >= 4 {
                w.i64(result.total_bytes);
                w.i64(result.usable_bytes);
            }
            w.tagged_fields_v(flexible);
        }
        w.tagged_fields_v(flexible);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        let throttle_time_ms = r.i32()?;
        let error = if version >= 3 { error::from_code(r.i16()?) } else { ErrorCode::None };
        let result_count = r.array_len_v(flexible, result_bytes_min(flexible))?;
        let mut results = Vec::with_capacity(result_count);
        for _ in 0..result_count {
            let result_error = error::from_code(r.i16()?);
            let log_dir = r.string_v(flexible)?;
            let topic_count = r.array_len_v(flexible, topic_bytes_min(flexible))?;
            let mut topics = Vec::with_capacity(topic_count);
            for _ in 0..topic_count {
                let name = r.string_v(flexible)?;
                let partition_count = r.array_len_v(flexible, PARTITION_BYTES_MIN)?;
                let mut partitions = Vec::with_capacity(partition_count);
                for _ in 0..partition_count {
                    partitions.push(DescribeLogDirsPartition {
                        partition_index: r.i32()?,
                        partition_size: r.i64()?,
                        offset_lag: r.i64()?,
                        is_future_key: r.bool()?,
                    });
                    r.tagged_fields_v(flexible)?;
                }
                r.tagged_fields_v(flexible)?;
                topics.push(DescribeLogDirsTopic { name, partitions });
            }
            let (total_bytes, usable_bytes) = if version >= 4 { (r.i64()?, r.i64()?) } else { (-1, -1) };
            r.tagged_fields_v(flexible)?;
            results.push(DescribeLogDirsResult { error: result_error, log_dir, topics, total_bytes, usable_bytes });
        }
        r.tagged_fields_v(flexible)?;
        Ok(Self { throttle_time_ms, error, results })
    }
}

// The smallest encoding of one element of each array, so that a count the
// rest of the frame cannot hold is refused before anything is allocated.

/// A topic: name and array length (+ tagged fields).
fn topic_bytes_min(flexible: bool) -> usize {
    if flexible {
        1 + 1 + 1
    } else {
        2 + 4
    }
}

/// A result: error code, log dir and topics length (+ tagged fields).
fn result_bytes_min(flexible: bool) -> usize {
    if flexible {
        2 + 1 + 1 + 1
    } else {
        2 + 2 + 4
    }
}

/// partition_index, partition_size, offset_lag, is_future_key.
const PARTITION_BYTES_MIN: usize = 4 + 8 + 8 + 1;

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::DescribeLogDirs as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "DescribeLogDirs v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::describe_log_dirs_request as kp_req;
    use kafka_protocol::messages::describe_log_dirs_response as kp_resp;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request() -> DescribeLogDirsRequest {
        DescribeLogDirsRequest {
            topics: Some(vec![DescribableLogDirTopic { topic: "orders".into(), partitions: vec![0, 2] }]),
        }
    }

    fn sample_response(version: i16) -> DescribeLogDirsResponse {
        DescribeLogDirsResponse {
            throttle_time_ms: 0,
            error: ErrorCode::None,
            results: vec![DescribeLogDirsResult {
                error: ErrorCode::None,
                log_dir: "/var/lib/shardlog".into(),
                topics: vec![DescribeLogDirsTopic {
                    name: "orders".into(),
                    partitions: vec![DescribeLogDirsPartition {
                        partition_index: 2,
                        partition_size: 1 << 33,
                        offset_lag: 0,
                        is_future_key: false,
                    }],
                }],
                total_bytes: if version >= 4 { 1 << 40 } else { -1 },
                usable_bytes: if version >= 4 { 1 << 39 } else { -1 },
            }],
        }
    }

    fn kp_response(ours: &DescribeLogDirsResponse) -> kp_resp::DescribeLogDirsResponse {
        let results = ours
            .results
            .iter()
            .map(|result| {
                let topics = result
                    .topics
                    .iter()
                    .map(|topic| {
                        let partitions = topic
                            .partitions
                            .iter()
                            .map(|p| {
                                kp_resp::DescribeLogDirsPartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_partition_size(p.partition_size)
                                    .with_offset_lag(p.offset_lag)
                                    .with_is_future_key(p.is_future_key)
                            })
                            .collect();
                        kp_resp::DescribeLogDirsTopic::default()
                            .with_name(TopicName(StrBytes::from_string(topic.name.clone())))
                            .with_partitions(partitions)
                    })
                    .collect();
                kp_resp::DescribeLogDirsResult::default()
                    .with_error_code(result.error.code())
                    .with_log_dir(StrBytes::from_string(result.log_dir.clone()))
                    .with_topics(topics)
                    .with_total_bytes(result.total_bytes)
                    .with_usable_bytes(result.usable_bytes)
            })
            .collect();
        kp_resp::DescribeLogDirsResponse::default()
            .with_throttle_time_ms(ours.throttle_time_ms)
            .with_error_code(ours.error.code())
            .with_results(results)
    }

    fn encoded<F: FnOnce(&mut Writer)>(f: F) -> Bytes {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    #[test]
    fn describe_log_dirs_round_trips_in_every_version_with_and_without_topics() {
        for version in VERSION_MIN..=VERSION_MAX {
            for request in [sample_request(), DescribeLogDirsRequest { topics: None }] {
                let mut r = Reader::new(encoded(|w| request.encode(w, version)));
                assert_eq!(DescribeLogDirsRequest::decode(&mut r, version).unwrap(), request, "v{version}");
                assert_eq!(r.remaining(), 0, "v{version}");
            }
            let mut r = Reader::new(encoded(|w| sample_response(version).encode(w, version)));
            assert_eq!(DescribeLogDirsResponse::decode(&mut r, version).unwrap(), sample_response(version));
            assert_eq!(r.remaining(), 0, "v{version}");
        }
    }

    #[test]
    fn describe_log_dirs_matches_kafka_protocol_encoding() {
        for version in VERSION_MIN..=VERSION_MAX {
            for topics in [None, Some(vec![(String::from("orders"), vec![0, 2])])] {
                let theirs = kp_req::DescribeLogDirsRequest::default().with_topics(topics.clone().map(|topics| {
                    topics
                        .into_iter()
                        .map(|(name, partitions)| {
                            kp_req::DescribableLogDirTopic::default()
                                .with_topic(TopicName(StrBytes::from_string(name)))
                                .with_partitions(partitions)
                        })
                        .collect()
                }));
                let mut buf = BytesMut::new();
                theirs.encode(&mut buf, version).unwrap();
                let ours = DescribeLogDirsRequest::decode(&mut Reader::new(buf.freeze()), version).unwrap();
                let expected =
                    if topics.is_some() { sample_request() } else { DescribeLogDirsRequest { topics: None } };
                assert_eq!(ours, expected, "v{version}");
            }
            let ours = encoded(|w| sample_response(version).encode(w, version));
            let decoded = kp_resp::DescribeLogDirsResponse::decode(&mut ours.clone(), version).unwrap();
            assert_eq!(decoded, kp_response(&sample_response(version)), "v{version}");
        }
    }

    #[test]
    fn truncated_describe_log_dirs_frames_are_errors_not_panics() {
        let request = encoded(|w| sample_request().encode(w, VERSION_MAX));
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(DescribeLogDirsRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
        let response = encoded(|w| sample_response(VERSION_MAX).encode(w, VERSION_MAX));
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(DescribeLogDirsResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn a_describe_log_dirs_partition_count_beyond_the_frame_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.i32(1);
        w.string("t");
        w.i32(1_000_000);
        w.raw(&[0; 16]);
        let result = DescribeLogDirsRequest::decode(&mut Reader::new(w.into_bytes()), 1);
        assert!(matches!(result, Err(DecodeError::ArrayTooLong { .. })), "{result:?}");
    }

    #[test]
    fn describe_log_dirs_versions_match_the_advertised_range() {
        let range = ApiKey::DescribeLogDirs.range().expect("DescribeLogDirs is advertised");
        assert_eq!(
            (range.version_min, range.version_max, range.flexible_from),
            (VERSION_MIN, VERSION_MAX, FLEXIBLE_VERSION_MIN)
        );
    }
}
