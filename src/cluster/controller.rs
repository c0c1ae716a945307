//! The controller's decisions as pure functions: given the current image and
//! a request, produce the next image and per-item results. No I/O here; the
//! shard that hosts the controller persists and distributes the result.

use std::collections::{BTreeMap, BTreeSet};

use super::metadata::{MetadataImage, NodeId, PartitionInfo, PersistedMetadata, ShardId, TopicInfo};
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
    /// Explicit placement: (partition index, node ids of its replicas).
    /// When given, `partitions` and `replication_factor` must be -1.
    pub assignments: Vec<(i32, Vec<i32>)>,
}

/// Growth of one topic (CreatePartitions).
#[derive(Debug, Clone)]
pub struct PartitionGrowth {
    pub name: String,
    /// The new total partition count.
    pub count: i32,
    /// Explicit placement of each new partition: node ids of its replicas.
    pub assignments: Option<Vec<Vec<i32>>>,
}

/// Which dynamic broker configs an alteration changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerResource {
    /// The cluster-wide defaults (the broker resource with the empty name).
    Cluster,
    Node(NodeId),
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
        if !topic.assignments.is_empty() {
            match assigned_topic_shards(image, topic) {
                Ok(shards) => {
                    if let Err(reason) = check_configs(&topic.configs) {
                        results.push(ItemResult::err(name, ErrorCode::InvalidConfig, reason));
                        continue;
                    }
                    for shard in &shards {
                        if let Some(count) = load.get_mut(shard.0 as usize) {
                            *count += 1;
                        }
                    }
                    if !validate_only {
                        let salt = salt.wrapping_add(results.len() as u64);
                        next.durable.topics.insert(name.into(), new_topic_info(name, salt, shards, &topic.configs));
                    }
                    results.push(ItemResult::ok(name));
                }
                Err((error, reason)) => results.push(ItemResult::err(name, error, reason)),
            }
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
        if !validate_only {
            let salt = salt.wrapping_add(results.len() as u64);
            next.durable.topics.insert(name.into(), new_topic_info(name, salt, shards, &topic.configs));
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
    requests: &[PartitionGrowth],
    validate_only: bool,
) -> (MetadataImage, Vec<ItemResult>) {
    let mut next = image.clone();
    let mut load = image.partitions_per_shard();
    let mut results = Vec::with_capacity(requests.len());
    for PartitionGrowth { name, count, assignments } in requests {
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
        let added = (*count - current) as usize;
        let shards = match assignments {
            Some(assignments) if assignments.len() != added => {
                results.push(ItemResult::err(
                    name,
                    ErrorCode::InvalidReplicaAssignment,
                    format!(
                        "Increasing the number of partitions by {added} but {} assignments provided.",
                        assignments.len()
                    ),
                ));
                continue;
            }
            Some(assignments) => {
                let replicas: Vec<&[i32]> = assignments.iter().map(Vec::as_slice).collect();
                match assigned_shards(image, &replicas) {
                    Ok(shards) => shards,
                    Err((error, reason)) => {
                        results.push(ItemResult::err(name, error, reason));
                        continue;
                    }
                }
            }
            None => place_partitions(&mut load, added),
        };
        if !validate_only {
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

/// A partition moved to another core of the same machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMove {
    pub topic: String,
    pub partition: i32,
    pub from: ShardId,
    pub to: ShardId,
}

/// Moves the partitions of cores a restart no longer runs (`--cores` lower
/// than before) to the least-loaded remaining cores, bumping their leader
/// epoch. Every core of a machine reads the same data directory, so a
/// partition moves without copying a byte.
pub fn rehome_partitions(durable: &mut PersistedMetadata, cores: usize) -> Vec<PartitionMove> {
    assert!(cores > 0, "a machine runs at least one core");
    let mut load = vec![0usize; cores];
    for topic in durable.topics.values() {
        for p in &topic.partitions {
            if let Some(count) = load.get_mut(p.shard.0 as usize) {
                *count += 1;
            }
        }
    }
    let mut moves = Vec::new();
    for topic in durable.topics.values_mut() {
        for (index, p) in topic.partitions.iter_mut().enumerate() {
            if (p.shard.0 as usize) < cores {
                continue;
            }
            let to = place_partitions(&mut load, 1)[0];
            moves.push(PartitionMove { topic: topic.name.clone(), partition: index as i32, from: p.shard, to });
            p.shard = to;
            p.leader_epoch += 1;
        }
    }
    moves
}

/// Edits the dynamic broker configs of the cluster or of one node;
/// `check` validates the resource's resulting set.
pub fn alter_broker_configs(
    image: &MetadataImage,
    resource: BrokerResource,
    change: &dyn Fn(&mut BTreeMap<String, String>),
    check: &ConfigCheck,
    validate_only: bool,
) -> (MetadataImage, ItemResult) {
    let mut next = image.clone();
    let name = match resource {
        BrokerResource::Cluster => String::new(),
        BrokerResource::Node(node) => node.0.to_string(),
    };
    if let BrokerResource::Node(node) = resource {
        if image.node(node).is_none() {
            return (next, ItemResult::err(&name, ErrorCode::InvalidRequest, format!("no node {}", node.0)));
        }
    }
    let durable = &mut next.durable;
    let current = match resource {
        BrokerResource::Cluster => &mut durable.broker_configs,
        BrokerResource::Node(node) => durable.node_configs.entry(node.0).or_default(),
    };
    let mut configs = current.clone();
    change(&mut configs);
    if let Err(reason) = check(&configs) {
        return (image.clone(), ItemResult::err(&name, ErrorCode::InvalidRequest, reason));
    }
    if !validate_only {
        *current = configs;
    }
    durable.node_configs.retain(|_, configs| !configs.is_empty());
    next.version += 1;
    (next, ItemResult::ok(&name))
}

fn new_topic_info(name: &str, salt: u64, shards: Vec<ShardId>, configs: &BTreeMap<String, String>) -> TopicInfo {
    TopicInfo {
        name: name.into(),
        topic_id: topic_id(name, salt),
        partitions: shards.into_iter().map(|shard| PartitionInfo { shard, leader_epoch: 0 }).collect(),
        configs: configs.clone(),
    }
}

/// The shards of a topic created with explicit assignments, checked as
/// Kafka checks them.
fn assigned_topic_shards(image: &MetadataImage, topic: &NewTopic) -> Result<Vec<ShardId>, (ErrorCode, String)> {
    if topic.partitions != -1 || topic.replication_factor != -1 {
        return Err((
            ErrorCode::InvalidRequest,
            "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time."
                .into(),
        ));
    }
    if topic.assignments.len() > constants::TOPIC_PARTITIONS_MAX as usize {
        return Err((ErrorCode::InvalidPartitions, "number of partitions must be 1 ..= 100000".into()));
    }
    let mut sorted: Vec<&(i32, Vec<i32>)> = topic.assignments.iter().collect();
    sorted.sort_by_key(|(partition, _)| *partition);
    if sorted.iter().enumerate().any(|(i, (partition, _))| *partition != i as i32) {
        return Err((
            ErrorCode::InvalidReplicaAssignment,
            "partitions should be a consecutive 0-based integer sequence".into(),
        ));
    }
    let replicas: Vec<&[i32]> = sorted.iter().map(|(_, brokers)| brokers.as_slice()).collect();
    assigned_shards(image, &replicas)
}

/// The shard of each explicitly placed partition, from the node ids of its
/// replicas. Each core is a node; a partition has one replica until
/// replication lands.
fn assigned_shards(image: &MetadataImage, replicas: &[&[i32]]) -> Result<Vec<ShardId>, (ErrorCode, String)> {
    let invalid = |reason: String| Err((ErrorCode::InvalidReplicaAssignment, reason));
    let width = replicas.first().map_or(0, |brokers| brokers.len());
    let mut shards = Vec::with_capacity(replicas.len());
    for brokers in replicas {
        if brokers.is_empty() {
            return invalid("a partition's replica list is empty".into());
        }
        let mut seen = BTreeSet::new();
        if let Some(duplicate) = brokers.iter().find(|b| !seen.insert(**b)) {
            return invalid(format!("duplicate node {duplicate} in a replica list"));
        }
        let unknown: Vec<String> =
            brokers.iter().filter(|b| image.node(NodeId(**b)).is_none()).map(|b| b.to_string()).collect();
        if !unknown.is_empty() {
            return invalid(format!("Unknown broker(s) in replica assignment: {}.", unknown.join(", ")));
        }
        if brokers.len() != width {
            return invalid("All partitions should have the same number of replicas.".into());
        }
        if brokers.len() > 1 {
            return Err((
                ErrorCode::InvalidReplicationFactor,
                "one replica per partition: replication across nodes is not built yet".into(),
            ));
        }
        let node = image.node(NodeId(brokers[0])).expect("checked above");
        shards.push(node.shard);
    }
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::metadata::{NodeId, NodeInfo};

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
        NewTopic {
            name: name.into(),
            partitions,
            replication_factor: -1,
            configs: BTreeMap::new(),
            assignments: Vec::new(),
        }
    }

    fn growth(name: &str, count: i32, assignments: Option<Vec<Vec<i32>>>) -> PartitionGrowth {
        PartitionGrowth { name: name.into(), count, assignments }
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
        let (grown, results) = create_partitions(&next, &[growth("a", 5, None), growth("a", 1, None)], false);
        assert_eq!(results[0].error, ErrorCode::None);
        assert_eq!(results[1].error, ErrorCode::InvalidPartitions);
        assert_eq!(grown.topic("a").unwrap().partitions.len(), 5);
    }

    #[test]
    fn an_explicit_assignment_places_each_partition_on_the_named_node() {
        let topic = NewTopic {
            partitions: -1,
            assignments: vec![(1, vec![0]), (0, vec![2]), (2, vec![2])],
            ..new_topic("a", -1)
        };
        let (next, results) = create_topics(&image(3), &[topic], 1, false, 1, &|_| Ok(()));
        assert_eq!(results[0].error, ErrorCode::None, "{:?}", results[0].message);
        let shards: Vec<u32> = next.topic("a").unwrap().partitions.iter().map(|p| p.shard.0).collect();
        assert_eq!(shards, vec![2, 0, 2]);

        let (grown, results) = create_partitions(&next, &[growth("a", 5, Some(vec![vec![1], vec![0]]))], false);
        assert_eq!(results[0].error, ErrorCode::None, "{:?}", results[0].message);
        let shards: Vec<u32> = grown.topic("a").unwrap().partitions.iter().map(|p| p.shard.0).collect();
        assert_eq!(shards, vec![2, 0, 2, 1, 0]);
    }

    #[test]
    fn an_assignment_naming_an_unknown_node_or_with_gaps_is_an_invalid_replica_assignment() {
        let with = |assignments: Vec<(i32, Vec<i32>)>| NewTopic { assignments, ..new_topic("a", -1) };
        let cases = [
            (with(vec![(0, vec![7])]), ErrorCode::InvalidReplicaAssignment),
            (with(vec![(0, vec![0]), (2, vec![1])]), ErrorCode::InvalidReplicaAssignment),
            (with(vec![(0, vec![])]), ErrorCode::InvalidReplicaAssignment),
            (with(vec![(0, vec![1, 1])]), ErrorCode::InvalidReplicaAssignment),
            (with(vec![(0, vec![0]), (1, vec![0, 1])]), ErrorCode::InvalidReplicaAssignment),
            (with(vec![(0, vec![0, 1])]), ErrorCode::InvalidReplicationFactor),
            (NewTopic { partitions: 2, ..with(vec![(0, vec![0])]) }, ErrorCode::InvalidRequest),
        ];
        for (topic, expected) in cases {
            let described = format!("{:?}", topic.assignments);
            let (next, results) = create_topics(&image(2), &[topic], 1, false, 1, &|_| Ok(()));
            assert_eq!(results[0].error, expected, "{described}");
            assert!(next.topic("a").is_none(), "{described}");
        }
        let (next, _) = create_topics(&image(2), &[new_topic("a", 1)], 1, false, 1, &|_| Ok(()));
        for assignments in [vec![vec![5]], vec![vec![0], vec![1]]] {
            let (grown, results) = create_partitions(&next, &[growth("a", 2, Some(assignments.clone()))], false);
            assert_eq!(results[0].error, ErrorCode::InvalidReplicaAssignment, "{assignments:?}");
            assert_eq!(grown.topic("a").unwrap().partitions.len(), 1);
        }
    }

    #[test]
    fn broker_configs_change_per_node_or_cluster_wide_and_a_refused_change_keeps_the_old_set() {
        let set = |key: &'static str, value: &'static str| {
            move |configs: &mut BTreeMap<String, String>| {
                configs.insert(key.into(), value.into());
            }
        };
        let (next, result) =
            alter_broker_configs(&image(2), BrokerResource::Cluster, &set("log.retention.ms", "1"), &|_| Ok(()), false);
        assert_eq!(result.error, ErrorCode::None);
        assert_eq!(next.durable.broker_configs.get("log.retention.ms").map(String::as_str), Some("1"));
        let (next, result) = alter_broker_configs(
            &next,
            BrokerResource::Node(NodeId(1)),
            &set("log.segment.bytes", "1048576"),
            &|_| Ok(()),
            false,
        );
        assert_eq!(result.error, ErrorCode::None);
        assert_eq!(next.durable.node_configs[&1].len(), 1);
        let refuse = |_: &BTreeMap<String, String>| Err("no".to_string());
        let (after, result) =
            alter_broker_configs(&next, BrokerResource::Cluster, &set("num.partitions", "3"), &refuse, false);
        assert_eq!(result.error, ErrorCode::InvalidRequest);
        assert_eq!(after.durable, next.durable);
        let (_, result) = alter_broker_configs(
            &next,
            BrokerResource::Node(NodeId(9)),
            &set("log.retention.ms", "1"),
            &|_| Ok(()),
            false,
        );
        assert_eq!(result.error, ErrorCode::InvalidRequest);
    }

    #[test]
    fn partitions_of_removed_cores_move_to_the_least_loaded_remaining_ones_with_a_new_epoch() {
        let (image, _) = create_topics(&image(4), &[new_topic("a", 8)], 1, false, 1, &|_| Ok(()));
        let mut durable = image.durable.clone();
        let moves = rehome_partitions(&mut durable, 2);
        assert_eq!(moves.len(), 4, "{moves:?}");
        assert!(moves.iter().all(|m| m.from.0 >= 2 && m.to.0 < 2));
        let partitions = &durable.topics["a"].partitions;
        assert!(partitions.iter().all(|p| p.shard.0 < 2));
        let per_core: Vec<usize> = (0..2).map(|c| partitions.iter().filter(|p| p.shard.0 == c).count()).collect();
        assert_eq!(per_core, vec![4, 4]);
        for m in &moves {
            assert_eq!(partitions[m.partition as usize].leader_epoch, 1, "{m:?}");
        }
        assert!(rehome_partitions(&mut durable, 2).is_empty(), "nothing left to move");
        assert!(rehome_partitions(&mut durable, 8).is_empty(), "more cores move nothing");
    }
}
