//! DescribeLogDirs and AlterReplicaLogDirs. A machine has one data
//! directory (`--data`); each node (core) reports the replicas it hosts in
//! it, with their size on disk, and the directory's total and usable bytes.
//! Moving a replica to the directory it is in succeeds; any other path is
//! LOG_DIR_NOT_FOUND.

use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::metrics::DiskSpace;
use crate::protocol::alter_replica_log_dirs::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult, AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
};
use crate::protocol::describe_log_dirs::{
    DescribeLogDirsPartition, DescribeLogDirsRequest, DescribeLogDirsResponse, DescribeLogDirsResult,
    DescribeLogDirsTopic,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

pub async fn describe(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DescribeLogDirsRequest::decode(reader, version)?;
    let wanted: Option<BTreeMap<&str, &[i32]>> =
        body.topics.as_ref().map(|topics| topics.iter().map(|t| (t.topic.as_str(), t.partitions.as_slice())).collect());
    let mut topics: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for partition in shard.local_partitions() {
        let listed = match &wanted {
            None => true,
            Some(wanted) => wanted.get(&*partition.topic).is_some_and(|indexes| indexes.contains(&partition.index)),
        };
        if !listed {
            continue;
        }
        topics.entry(partition.topic.to_string()).or_default().push(DescribeLogDirsPartition {
            partition_index: partition.index,
            partition_size: i64::try_from(partition.log.size_bytes()).unwrap_or(i64::MAX),
            // A leader's log is never behind its own high watermark; the lag
            // is that of a future (moving) replica, which shardlog never has.
            offset_lag: 0,
            is_future_key: false,
        });
    }
    let data = shard.data_dir();
    let (error, total_bytes, usable_bytes) = match DiskSpace::of(&data) {
        Ok(space) => (ErrorCode::None, clamp(space.total_bytes), clamp(space.free_bytes)),
        Err(err) => {
            tracing::warn!(path = %data.display(), error = %err, "statvfs of the data directory failed");
            (ErrorCode::KafkaStorageError, -1, -1)
        }
    };
    let result = DescribeLogDirsResult {
        error,
        log_dir: data.display().to_string(),
        topics: topics
            .into_iter()
            .map(|(name, mut partitions)| {
                partitions.sort_by_key(|p| p.partition_index);
                DescribeLogDirsTopic { name, partitions }
            })
            .collect(),
        total_bytes,
        usable_bytes,
    };
    let mut w = response(request);
    DescribeLogDirsResponse { throttle_time_ms: 0, error: ErrorCode::None, results: vec![result] }
        .encode(&mut w, version);
    Ok(respond(w))
}

pub async fn alter(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = AlterReplicaLogDirsRequest::decode(reader, version)?;
    let data = shard.data_dir();
    let image = shard.image();
    let mut results: BTreeMap<String, Vec<AlterReplicaLogDirPartitionResult>> = BTreeMap::new();
    for dir in &body.dirs {
        let known_dir = same_dir(Path::new(&dir.path), &data);
        for topic in &dir.topics {
            for &index in &topic.partitions {
                let error = if !known_dir {
                    ErrorCode::LogDirNotFound
                } else if shard.local_partition(&topic.name, index).is_some() {
                    ErrorCode::None
                } else if image.partition(&topic.name, index).is_some() {
                    ErrorCode::ReplicaNotAvailable
                } else {
                    ErrorCode::UnknownTopicOrPartition
                };
                results
                    .entry(topic.name.clone())
                    .or_default()
                    .push(AlterReplicaLogDirPartitionResult { partition_index: index, error });
            }
        }
    }
    let results = results
        .into_iter()
        .map(|(topic_name, partitions)| AlterReplicaLogDirTopicResult { topic_name, partitions })
        .collect();
    let mut w = response(request);
    AlterReplicaLogDirsResponse { throttle_time_ms: 0, results }.encode(&mut w, version);
    Ok(respond(w))
}

/// Whether a client's path names the data directory: absolute, and the same
/// after normalizing `.`, `..` and trailing slashes (no symlinks resolved).
fn same_dir(path: &Path, data: &Path) -> bool {
    path.is_absolute() && normalize(path) == normalize(data)
}

fn normalize(path: &Path) -> Vec<String> {
    let mut parts: Vec<String> = Vec::new();
    for component in path.components() {
        match component {
            std::path::Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            std::path::Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts
}

fn clamp(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_the_data_directory_only_when_absolute_and_equal_once_normalized() {
        let data = Path::new("/var/lib/shardlog");
        assert!(same_dir(Path::new("/var/lib/shardlog/"), data));
        assert!(same_dir(Path::new("/var/lib/./other/../shardlog"), data));
        assert!(!same_dir(Path::new("var/lib/shardlog"), data));
        assert!(!same_dir(Path::new("/var/lib/shardlog2"), data));
        assert!(!same_dir(Path::new("/tmp"), data));
    }
}
