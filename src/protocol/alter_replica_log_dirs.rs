//! AlterReplicaLogDirs (key 34), versions 1–2, both directions. v1 is v0's
//! layout (answered after throttling); v2 is flexible.
//!
//! ```text
//! request   dirs [path string, topics [name string, partitions [i32]]]
//! response  throttle_time_ms i32,
//!           results [topic_name string, partitions [partition_index i32, error_code i16]]
//! ```

use super::{error, ApiKey, DecodeError, DecodeResult, ErrorCode, Reader, Writer};

pub const VERSION_MIN: i16 = 1;
pub const VERSION_MAX: i16 = 2;
pub const FLEXIBLE_VERSION_MIN: i16 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterReplicaLogDirsRequest {
    pub dirs: Vec<AlterReplicaLogDir>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterReplicaLogDir {
    /// The absolute directory the replicas should live in.
    pub path: String,
    pub topics: Vec<AlterReplicaLogDirTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterReplicaLogDirTopic {
    pub name: String,
    pub partitions: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterReplicaLogDirsResponse {
    pub throttle_time_ms: i32,
    pub results: Vec<AlterReplicaLogDirTopicResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterReplicaLogDirTopicResult {
    pub topic_name: String,
    pub partitions: Vec<AlterReplicaLogDirPartitionResult>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterReplicaLogDirPartitionResult {
    pub partition_index: i32,
    pub error: ErrorCode,
}

impl AlterReplicaLogDirsRequest {
    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        let dir_count = r.array_len_v(flexible, named_array_bytes_min(flexible))?;
        let mut dirs = Vec::with_capacity(dir_count);
        for _ in 0..dir_count {
            let path = r.string_v(flexible)?;
            let topic_count = r.array_len_v(flexible, named_array_bytes_min(flexible))?;
            let mut topics = Vec::with_capacity(topic_count);
            for _ in 0..topic_count {
                let name = r.string_v(flexible)?;
                let partition_count = r.array_len_v(flexible, 4)?;
                let mut partitions = Vec::with_capacity(partition_count);
                for _ in 0..partition_count {
                    partitions.push(r.i32()?);
                }
                r.tagged_fields_v(flexible)?;
                topics.push(AlterReplicaLogDirTopic { name, partitions });
            }
            r.tagged_fields_v(flexible)?;
            dirs.push(AlterReplicaLogDir { path, topics });
        }
        r.tagged_fields_v(flexible)?;
        Ok(Self { dirs })
    }

    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        w.array_len_v(self.dirs.len(), flexible);
        for dir in &self.dirs {
            w.string_v(&dir.path, flexible);
            w.array_len_v(dir.topics.len(), flexible);
            for topic in &dir.topics {
                w.string_v(&topic.name, flexible);
                w.array_len_v(topic.partitions.len(), flexible);
                for partition in &topic.partitions {
                    w.i32(*partition);
                }
                w.tagged_fields_v(flexible);
            }
            w.tagged_fields_v(flexible);
        }
        w.tagged_fields_v(flexible);
    }
}

impl AlterReplicaLogDirsResponse {
    pub fn encode(&self, w: &mut Writer, version: i16) {
        assert_version(version);
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        w.i32(self.throttle_time_ms);
        w.array_len_v(self.results.len(), flexible);
        for result in &self.results {
            w.string_v(&result.topic_name, flexible);
            w.array_len_v(result.partitions.len(), flexible);
            for partition in &result.partitions {
                w.i32(partition.partition_index);
                w.i16(partition.error.code());
                w.tagged_fields_v(flexible);
            }
            w.tagged_fields_v(flexible);
        }
        w.tagged_fields_v(flexible);
    }

    pub fn decode(r: &mut Reader, version: i16) -> DecodeResult<Self> {
        check_version(version)?;
        let flexible = version >= FLEXIBLE_VERSION_MIN;
        let throttle_time_ms = r.i32()?;
        let result_count = r.array_len_v(flexible, named_array_bytes_min(flexible))?;
        let mut results = Vec::with_capacity(result_count);
        for _ in 0..result_count {
            let topic_name = r.string_v(flexible)?;
            let partition_count = r.array_len_v(flexible, 4 + 2)?;
            let mut partitions = Vec::with_capacity(partition_count);
            for _ in 0..partition_count {
                let partition_index = r.i32()?;
                let error = error::from_code(r.i16()?);
                r.tagged_fields_v(flexible)?;
                partitions.push(AlterReplicaLogDirPartitionResult { partition_index, error });
            }
            r.tagged_fields_v(flexible)?;
            results.push(AlterReplicaLogDirTopicResult { topic_name, partitions });
        }
        r.tagged_fields_v(flexible)?;
        Ok(Self { throttle_time_ms, results })
    }
}

/// A name followed by an array (+ tagged fields): the smallest element of
/// each array here.
fn named_array_bytes_min(flexible: bool) -> usize {
    if flexible {
        1 + 1 + 1
    } else {
        2 + 4
    }
}

fn check_version(version: i16) -> DecodeResult<()> {
    if (VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Ok(());
    }
    Err(DecodeError::UnsupportedVersion { api_key: ApiKey::AlterReplicaLogDirs as i16, version })
}

/// The header parser only admits supported versions, so another one here is
/// our own bug.
fn assert_version(version: i16) {
    assert!((VERSION_MIN..=VERSION_MAX).contains(&version), "AlterReplicaLogDirs v{version} is not supported");
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::alter_replica_log_dirs_request as kp_req;
    use kafka_protocol::messages::alter_replica_log_dirs_response as kp_resp;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    use super::*;

    fn sample_request() -> AlterReplicaLogDirsRequest {
        AlterReplicaLogDirsRequest {
            dirs: vec![AlterReplicaLogDir {
                path: "/var/lib/shardlog".into(),
                topics: vec![AlterReplicaLogDirTopic { name: "orders".into(), partitions: vec![1, 3] }],
            }],
        }
    }

    fn sample_response() -> AlterReplicaLogDirsResponse {
        AlterReplicaLogDirsResponse {
            throttle_time_ms: 0,
            results: vec![AlterReplicaLogDirTopicResult {
                topic_name: "orders".into(),
                partitions: vec![
                    AlterReplicaLogDirPartitionResult { partition_index: 1, error: ErrorCode::None },
                    AlterReplicaLogDirPartitionResult { partition_index: 3, error: ErrorCode::LogDirNotFound },
                ],
            }],
        }
    }

    fn encoded<F: FnOnce(&mut Writer)>(f: F) -> Bytes {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    #[test]
    fn alter_replica_log_dirs_round_trips_and_matches_kafka_protocol_encoding() {
        for version in VERSION_MIN..=VERSION_MAX {
            let theirs =
                kp_req::AlterReplicaLogDirsRequest::default().with_dirs(vec![kp_req::AlterReplicaLogDir::default()
                    .with_path(StrBytes::from_static_str("/var/lib/shardlog"))
                    .with_topics(vec![kp_req::AlterReplicaLogDirTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str("orders")))
                        .with_partitions(vec![1, 3])])]);
            let mut buf = BytesMut::new();
            theirs.encode(&mut buf, version).unwrap();
            assert_eq!(buf.freeze(), encoded(|w| sample_request().encode(w, version)), "v{version}");
            let mut r = Reader::new(encoded(|w| sample_request().encode(w, version)));
            assert_eq!(AlterReplicaLogDirsRequest::decode(&mut r, version).unwrap(), sample_request());

            let ours = encoded(|w| sample_response().encode(w, version));
            let decoded = kp_resp::AlterReplicaLogDirsResponse::decode(&mut ours.clone(), version).unwrap();
            let codes: Vec<i16> = decoded.results[0].partitions.iter().map(|p| p.error_code).collect();
            assert_eq!(codes, vec![0, ErrorCode::LogDirNotFound.code()], "v{version}");
            let mut r = Reader::new(ours);
            assert_eq!(AlterReplicaLogDirsResponse::decode(&mut r, version).unwrap(), sample_response());
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn truncated_alter_replica_log_dirs_frames_are_errors_not_panics() {
        let request = encoded(|w| sample_request().encode(w, VERSION_MAX));
        for len in 0..request.len() {
            let mut r = Reader::new(request.slice(..len));
            assert!(AlterReplicaLogDirsRequest::decode(&mut r, VERSION_MAX).is_err(), "request cut at {len}");
        }
        let response = encoded(|w| sample_response().encode(w, VERSION_MAX));
        for len in 0..response.len() {
            let mut r = Reader::new(response.slice(..len));
            assert!(AlterReplicaLogDirsResponse::decode(&mut r, VERSION_MAX).is_err(), "response cut at {len}");
        }
    }

    #[test]
    fn alter_replica_log_dirs_versions_match_the_advertised_range() {
        let range = ApiKey::AlterReplicaLogDirs.range().expect("AlterReplicaLogDirs is advertised");
        assert_eq!(
            (range.version_min, range.version_max, range.flexible_from),
            (VERSION_MIN, VERSION_MAX, FLEXIBLE_VERSION_MIN)
        );
    }
}
