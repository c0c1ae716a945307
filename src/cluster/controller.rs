//! The controller's decisions as pure functions: given the current image and
//! a request, produce the next image and per-item results. No I/O here; the
//! shard that hosts the controller persists and distributes the result.

use std::collections::BTreeMap;

use super::metadata::{MetadataImage, PartitionInfo, ShardId, TopicInfo};
use crate::constants;
use crate::protocol::ErrorCode;

/// Validates a topic's configs (the broker supplies it; the controller
/// itself knows no config semantics).
pub type ConfigCheck = dyn Fn(&BTreeMap<String, String>) -> Result<(), String>;

/// One topic to create.
#[derive(Debug, Clone)]
pub struct NewTopic {
    pub name: String,
    /// -1: broker default.
    pub partitions: i32,
    /// -1 or 1 on a single node.
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemResult {
    pub name: String,
    pub error: ErrorCode,
    pub message: Option<String>,
}

impl ItemResult {
    fn ok(name: &str) -> Self {
        Self { name: name.into(), error: ErrorCode::None, message: None }
    }
    fn err(name: &str, error: ErrorCode, message: impl Into<String>) -> Self {
        Self { name: name.into(), error, message: Some(message.into()) }
    }
}

/// Checks a topic name the way Kafka does.
pub fn validate_topic_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("topic name is empty");
    }
    if name == "." || name == ".." {
        return Err("topic name cannot be . or ..");
    }
    if name.len() > constants::TOPIC_NAME_BYTES_MAX {
        return Err("topic name is longer than 249 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return Err("topic name may contain only ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

/// Places `count` new partitions on the least-loaded shards, in turn.
pub fn place_partitions(load: &mut [usize], count: usize) -> Vec<ShardId> {
    (0..count)
        .map(|_| {
            let (shard, _) = load.iter().enumerate().min_by_key(|(i, n)| (**n, *i)).unwrap_or((0, &0));
            load[shard] += 1;
            ShardId(shard as u32)
        })
        .collect()
}

/// A fresh random-looking topic id (UUID v4 layout) from a seed.
pub fn topic_id(name: &str, salt: u64) -> [u8; 16] {
    let a = crc32fast::hash(name.as_bytes()) as u64;
    let mixed = [a ^ salt.rotate_left(17), salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ a.rotate_left(31)];
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&mixed[0].to_be_bytes());
    id[8..].copy_from_slice(&mixed[1].to_be_bytes());
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

/// Creates topics; `check_configs` validates a topic's configs.
pub fn create_topics(
    image: &MetadataImage,
    topics: &[NewTopic],
    default_partitions: i32,
    validate_only: bool,
    salt: u64,
    check_configs: &ConfigCheck,
) -> (MetadataImage, Vec<ItemResult>) {
    let mut next = image.clone();
    let mut load = image.partitions_per_shard();
    let mut results = Vec::with_capacity(topics.len());
    for topic in topics {
        let name = topic.name.as_str();
        if let Err(reason) = validate_topic_name(name) {
            results.push(ItemResult::err(name, ErrorCode::InvalidTopicException, reason));
            continue;
        }
        if next.durable.topics.contains_key(name) {
            results.push(ItemResult::err(
                name,
                ErrorCode::TopicAlreadyExists,
                format!("topic '{name}' already exists"),
            ));
            continue;
        }
        let partitions = if topic.partitions == -1 { default_partitions } else { topic.partitions };
        if partitions <= 0 || partitions > constants::TOPIC_PARTITIONS_MAX {
            results.push(ItemResult::err(
                name,
                ErrorCode::InvalidPartitions,
                "number of partitions must be 1 ..= 100000",
            ));
            continue;
        }
        if topic.replication_factor != -1 && topic.replication_factor != 1 {
            results.push(ItemResult::err(
                name,
                ErrorCode::InvalidReplicationFactor,
                "replication factor must be 1 on a single node",
            ));
            continue;
        }
        if let Err(reason) = check_configs(&topic.configs) {
            results.push(ItemResult::err(name, ErrorCode::InvalidConfig, reason));
            continue;
        }
        let shards = place_partitions(&mut load, partitions as usize);
        let info = TopicInfo {
            name: name.into(),
            topic_id: topic_id(name, salt.wrapping_add(results.len() as u64)),
            partitions: shards.into_iter().map(|shard| PartitionInfo { shard, leader_epoch: 0 }).collect(),
            configs: topic.configs.clone(),
        };
        if !validate_only {
            next.durable.topics.insert(name.into(), info);
        }
        results.push(ItemResult::ok(name));
    }
    next.version += 1;
    (next, results)
}

pub fn delete_topics(image: &MetadataImage, names: &[String]) -> (MetadataImage, Vec<ItemResult>) {
    let mut next = image.clone();
    let results = names
        .iter()
        .map(|name| match next.durable.topics.remove(name) {
            Some(_) => ItemResult::ok(name),
            None => ItemResult::err(name, ErrorCode::UnknownTopicOrPartition, "no such topic"),
        })
        .collect();
    next.version += 1;
    (next, results)
}

/// Grows topics to `count` partitions each.
pub fn create_partitions(
    image: &MetadataImage,
    requests: &[(String, i32)],
    validate_only: bool,
) -> (MetadataImage, Vec<ItemResult>) {
    let mut next = image.clone();
    let mut load = image.partitions_per_shard();
    let mut results = Vec::with_capacity(requests.len());
    for (name, count) in requests {
        let Some(topic) = next.durable.topics.get_mut(name) else {
            results.push(ItemResult::err(name, ErrorCode::UnknownTopicOrPartition, "no such topic"));
            continue;
        };
        let current = topic.partitions.len() as i32;
        if *count <= current || *count > constants::TOPIC_PARTITIONS_MAX {
            results.push(ItemResult::err(
                name,
                ErrorCode::InvalidPartitions,
                format!("topic has {current} partitions; the new count must be larger (and at most 100000)"),
            ));
            continue;
        }
        if !validate_only {
            let shards = place_partitions(&mut load, (*count - current) as usize);
            topic.partitions.extend(shards.into_iter().map(|shard| PartitionInfo { shard, leader_epoch: 0 }));
        }
        results.push(ItemResult::ok(name));
    }
    next.version += 1;
    (next, results)
}

/// Replaces (or, with `incremental`, edits) a topic's configs.
pub fn alter_topic_configs(
    image: &MetadataImage,
    name: &str,
    change: &dyn Fn(&mut BTreeMap<String, String>),
    check_configs: &ConfigCheck,
    validate_only: bool,
) -> (MetadataImage, ItemResult) {
    let mut next = image.clone();
    let Some(topic) = next.durable.topics.get_mut(name) else {
        return (next, ItemResult::err(name, ErrorCode::UnknownTopicOrPartition, "no such topic"));
    };
    let mut configs = topic.configs.clone();
    change(&mut configs);
    if let Err(reason) = check_configs(&configs) {
        return (next, ItemResult::err(name, ErrorCode::InvalidConfig, reason));
    }
    if !validate_only {
        topic.configs = configs;
    }
    next.version += 1;
    (next, ItemResult::ok(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::metadata::{NodeId, NodeInfo, PersistedMetadata};

    fn image(shards: u32) -> MetadataImage {
        MetadataImage {
            version: 1,
            nodes: (0..shards)
                .map(|i| NodeInfo {
                    node_id: NodeId(i as i32),
                    host: "h".into(),
                    port: 9092 + i as i32,
                    shard: ShardId(i),
                })
                .collect(),
            controller: NodeId(0),
            durable: PersistedMetadata::default(),
        }
    }

    fn new_topic(name: &str, partitions: i32) -> NewTopic {
        NewTopic { name: name.into(), partitions, replication_factor: -1, configs: BTreeMap::new() }
    }

    #[test]
    fn partitions_are_balanced_across_shards() {
        let (next, results) =
            create_topics(&image(3), &[new_topic("a", 4), new_topic("b", 5)], 1, false, 1, &|_| Ok(()));
        assert!(results.iter().all(|r| r.error == ErrorCode::None));
        assert_eq!(next.partitions_per_shard(), vec![3, 3, 3]);
    }

    #[test]
    fn invalid_and_duplicate_topics_get_kafka_errors() {
        let (next, _) = create_topics(&image(2), &[new_topic("a", 1)], 1, false, 1, &|_| Ok(()));
        let (_, results) = create_topics(
            &next,
            &[new_topic("a", 1), new_topic("bad name", 1), new_topic("z", 0), new_topic("ok", -1)],
            3,
            false,
            2,
            &|_| Ok(()),
        );
        let codes: Vec<ErrorCode> = results.iter().map(|r| r.error).collect();
        assert_eq!(
            codes,
            vec![
                ErrorCode::TopicAlreadyExists,
                ErrorCode::InvalidTopicException,
                ErrorCode::InvalidPartitions,
                ErrorCode::None
            ]
        );
    }

    #[test]
    fn validate_only_changes_nothing() {
        let (next, results) = create_topics(&image(2), &[new_topic("a", 2)], 1, true, 1, &|_| Ok(()));
        assert_eq!(results[0].error, ErrorCode::None);
        assert!(next.topic("a").is_none());
    }

    #[test]
    fn partitions_only_grow() {
        let (next, _) = create_topics(&image(2), &[new_topic("a", 2)], 1, false, 1, &|_| Ok(()));
        let (grown, results) = create_partitions(&next, &[("a".into(), 5), ("a".into(), 1)], false);
        assert_eq!(results[0].error, ErrorCode::None);
        assert_eq!(results[1].error, ErrorCode::InvalidPartitions);
        assert_eq!(grown.topic("a").unwrap().partitions.len(), 5);
    }
}
