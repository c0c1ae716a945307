//! The controller's decisions as records (issue 29): given the committed
//! `ClusterImage` and a request, the records that carry it out and the answer
//! for each item, like KRaft's ReplicationControlManager,
//! ClusterControlManager and ProducerIdControlManager. Pure: the controller
//! shell proposes the records to the quorum and answers the client once they
//! commit. A refused item adds no record, so one bad topic never blocks the
//! others of a request.
//!
//! Placement is across machines: a new partition's leader is an unfenced
//! node with the fewest partitions, preferring racks (then machines) that
//! hold fewer of the topic's partitions, so a topic spreads over the cluster.
//! One replica per partition until replication (issue 30).

use std::collections::{BTreeMap, BTreeSet};

use super::controller::{topic_id, validate_topic_name, ConfigCheck, ItemResult, PartitionGrowth};
use super::image::{ClusterImage, TopicId};
use super::metadata::NodeId;
use super::records::{
    ConfigResource, MachineRegistration, MetadataRecord, NodeRegistration, PartitionChange, PartitionRecord,
};
use crate::constants;
use crate::protocol::ErrorCode;

/// A topic to create.
#[derive(Debug, Clone)]
pub struct TopicRequest {
    pub name: String,
    /// -1: `ControlContext::default_partitions`.
    pub partitions: i32,
    /// -1 or 1 until replication.
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
    /// Explicit placement: (partition index, node ids of its replicas);
    /// then `partitions` and `replication_factor` are -1.
    pub assignments: Vec<(i32, Vec<i32>)>,
}

/// What the controller needs besides the image.
pub struct ControlContext<'a> {
    pub default_partitions: i32,
    /// Validates a topic's configs.
    pub check_topic_configs: &'a ConfigCheck<'a>,
    /// Seeds topic ids (the shell passes time and the log offset).
    pub salt: u64,
}

/// Records to commit and the per-item answers to give once they commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub records: Vec<MetadataRecord>,
    pub items: Vec<ItemResult>,
}

/// CreateTopics.
pub fn create_topics(image: &ClusterImage, topics: &[TopicRequest], context: &ControlContext<'_>) -> Decision {
    let mut decision = Decision::default();
    let mut load = Load::of(image);
    let mut names = BTreeSet::new();
    for (nth, topic) in topics.iter().enumerate() {
        let name = topic.name.as_str();
        let refused = |error, message: &str| ItemResult { name: name.into(), error, message: Some(message.into()) };
        if let Err(reason) = validate_topic_name(name) {
            decision.items.push(refused(ErrorCode::InvalidTopicException, reason));
            continue;
        }
        if image.topic_ids.contains_key(name) || !names.insert(name) {
            decision.items.push(refused(ErrorCode::TopicAlreadyExists, &format!("topic '{name}' already exists")));
            continue;
        }
        if let Err(reason) = (context.check_topic_configs)(&topic.configs) {
            decision.items.push(refused(ErrorCode::InvalidConfig, &reason));
            continue;
        }
        let leaders = if topic.assignments.is_empty() {
            let count = if topic.partitions == -1 { context.default_partitions } else { topic.partitions };
            if count <= 0 || count > constants::TOPIC_PARTITIONS_MAX {
                decision.items.push(refused(ErrorCode::InvalidPartitions, "number of partitions must be 1 ..= 100000"));
                continue;
            }
            if topic.replication_factor != -1 && topic.replication_factor != 1 {
                decision.items.push(refused(
                    ErrorCode::InvalidReplicationFactor,
                    "one replica per partition: replication across machines is not built yet",
                ));
                continue;
            }
            match load.place(image, count as usize) {
                Some(leaders) => leaders,
                None => {
                    decision.items.push(refused(ErrorCode::InvalidReplicationFactor, "no unfenced node to place on"));
                    continue;
                }
            }
        } else {
            if topic.partitions != -1 || topic.replication_factor != -1 {
                decision.items.push(refused(
                    ErrorCode::InvalidRequest,
                    "Both numPartitions or replicationFactor and replicasAssignments were set",
                ));
                continue;
            }
            let mut sorted: Vec<&(i32, Vec<i32>)> = topic.assignments.iter().collect();
            sorted.sort_by_key(|(partition, _)| *partition);
            if sorted.iter().enumerate().any(|(i, (partition, _))| *partition != i as i32) {
                decision.items.push(refused(
                    ErrorCode::InvalidReplicaAssignment,
                    "partitions should be a consecutive 0-based integer sequence",
                ));
                continue;
            }
            let assignments: Vec<Vec<i32>> = sorted.into_iter().map(|(_, replicas)| replicas.clone()).collect();
            match assigned_leaders(image, &assignments) {
                Ok(leaders) => {
                    load.count(&leaders);
                    leaders
                }
                Err((error, reason)) => {
                    decision.items.push(refused(error, &reason));
                    continue;
                }
            }
        };
        let id = topic_id(name, context.salt.wrapping_add(nth as u64));
        decision.records.push(MetadataRecord::Topic { name: name.into(), topic_id: id });
        for (index, leader) in leaders.iter().enumerate() {
            decision.records.push(new_partition(id, index as i32, *leader));
        }
        for (key, value) in &topic.configs {
            decision.records.push(MetadataRecord::Config {
                resource: ConfigResource::Topic(name.into()),
                name: key.clone(),
                value: Some(value.clone()),
            });
        }
        decision.items.push(ItemResult { name: name.into(), error: ErrorCode::None, message: None });
    }
    decision
}

/// DeleteTopics.
pub fn delete_topics(image: &ClusterImage, names: &[String]) -> Decision {
    let mut decision = Decision::default();
    let mut removed = BTreeSet::new();
    for name in names {
        match image.topic_ids.get(name) {
            Some(id) if removed.insert(*id) => {
                decision.records.push(MetadataRecord::RemoveTopic { topic_id: *id });
                decision.items.push(ItemResult { name: name.clone(), error: ErrorCode::None, message: None });
            }
            _ => decision.items.push(ItemResult {
                name: name.clone(),
                error: ErrorCode::UnknownTopicOrPartition,
                message: Some("no such topic".into()),
            }),
        }
    }
    decision
}

/// CreatePartitions: grows `name` to `count`, placed by the controller or
/// by `assignments` (one replica list per new partition).
pub fn create_partitions(image: &ClusterImage, name: &str, count: i32, assignments: Option<&[Vec<i32>]>) -> Decision {
    let refused = |error, message: String| Decision {
        records: Vec::new(),
        items: vec![ItemResult { name: name.into(), error, message: Some(message) }],
    };
    let Some(topic) = image.topic(name) else {
        return refused(ErrorCode::UnknownTopicOrPartition, "no such topic".into());
    };
    let current = topic.partitions.len() as i32;
    if count <= current || count > constants::TOPIC_PARTITIONS_MAX {
        return refused(
            ErrorCode::InvalidPartitions,
            format!("topic has {current} partitions; the new count must be larger (and at most 100000)"),
        );
    }
    let added = (count - current) as usize;
    let leaders = match assignments {
        Some(assignments) if assignments.len() != added => {
            return refused(
                ErrorCode::InvalidReplicaAssignment,
                format!(
                    "Increasing the number of partitions by {added} but {} assignments provided.",
                    assignments.len()
                ),
            )
        }
        Some(assignments) => match assigned_leaders(image, assignments) {
            Ok(leaders) => leaders,
            Err((error, reason)) => return refused(error, reason),
        },
        None => match Load::of(image).place(image, added) {
            Some(leaders) => leaders,
            None => return refused(ErrorCode::InvalidReplicationFactor, "no unfenced node to place on".into()),
        },
    };
    let records =
        leaders.iter().enumerate().map(|(i, leader)| new_partition(topic.id, current + i as i32, *leader)).collect();
    Decision { records, items: vec![ItemResult { name: name.into(), error: ErrorCode::None, message: None }] }
}

/// CreatePartitions for several topics: each decided on the image with the
/// ones before it replayed, so a topic named twice grows once.
pub fn create_partitions_many(image: &ClusterImage, growths: &[PartitionGrowth]) -> Decision {
    let mut working = image.clone();
    let mut decision = Decision::default();
    for PartitionGrowth { name, count, assignments } in growths {
        let one = create_partitions(&working, name, *count, assignments.as_deref());
        if !one.records.is_empty() {
            let mut delta = super::image::MetadataDelta::new(&working);
            for record in &one.records {
                delta.replay(working.provenance, record).expect("a decision replays on the image it was made on");
            }
            working = delta.finish().0;
        }
        decision.records.extend(one.records);
        decision.items.extend(one.items);
    }
    decision
}

/// Sets (`Some`) or deletes (`None`) dynamic configs of one resource;
/// `check` validates the resource's resulting set.
pub fn alter_configs(
    image: &ClusterImage,
    resource: &ConfigResource,
    changes: &[(String, Option<String>)],
    replace: bool,
    check: &ConfigCheck<'_>,
) -> Decision {
    let (name, current) = match resource {
        ConfigResource::Topic(topic) => (topic.clone(), image.configs.topics.get(topic)),
        ConfigResource::Broker(None) => (String::new(), Some(&image.configs.cluster)),
        ConfigResource::Broker(Some(node)) => (node.to_string(), image.configs.nodes.get(node)),
    };
    let refused = |error, message: String| Decision {
        records: Vec::new(),
        items: vec![ItemResult { name: name.clone(), error, message: Some(message) }],
    };
    match resource {
        ConfigResource::Topic(topic) if !image.topic_ids.contains_key(topic) => {
            return refused(ErrorCode::UnknownTopicOrPartition, "no such topic".into())
        }
        ConfigResource::Broker(Some(node)) if !image.nodes.contains_key(&NodeId(*node)) => {
            return refused(ErrorCode::InvalidRequest, format!("no node {node}"))
        }
        _ => {}
    }
    let current = current.cloned().unwrap_or_default();
    let mut next = if replace { BTreeMap::new() } else { current.clone() };
    for (key, value) in changes {
        match value {
            Some(value) => next.insert(key.clone(), value.clone()),
            None => next.remove(key),
        };
    }
    if let Err(reason) = check(&next) {
        let error = match resource {
            ConfigResource::Topic(_) => ErrorCode::InvalidConfig,
            ConfigResource::Broker(_) => ErrorCode::InvalidRequest,
        };
        return refused(error, reason);
    }
    let mut records = Vec::new();
    for key in current.keys().filter(|k| !next.contains_key(*k)) {
        records.push(MetadataRecord::Config { resource: resource.clone(), name: key.clone(), value: None });
    }
    for (key, value) in next.iter().filter(|(k, v)| current.get(*k) != Some(*v)) {
        records.push(MetadataRecord::Config {
            resource: resource.clone(),
            name: key.clone(),
            value: Some(value.clone()),
        });
    }
    Decision { records, items: vec![ItemResult { name, error: ErrorCode::None, message: None }] }
}

/// A machine (re)registers with one endpoint per core. It keeps the node
/// ids it had for the cores it still runs and gets fresh ones, never used
/// before, for new cores; the partitions of cores it no longer runs move to
/// its other nodes (they share its data directory). A machine registering
/// for the first time gets `first_id..` when those ids were never used
/// (`--node-id-base`).
pub fn register_machine(
    image: &ClusterImage,
    machine: u64,
    incarnation: u64,
    rack: Option<String>,
    endpoints: &[(String, i32)],
    first_id: Option<i32>,
) -> Result<Vec<MetadataRecord>, (ErrorCode, String)> {
    if machine == 0 || endpoints.is_empty() {
        return Err((ErrorCode::InvalidRequest, "a machine has a non-zero id and at least one core".into()));
    }
    let old: Vec<i32> =
        image.machines.iter().find(|(id, _)| id.get() == machine).map(|(_, m)| m.nodes.clone()).unwrap_or_default();
    let mut next_id = image.node_id_next;
    if let Some(first) = first_id.filter(|first| old.is_empty() && *first >= image.node_id_next) {
        next_id = first;
    }
    let nodes: Vec<NodeRegistration> = endpoints
        .iter()
        .enumerate()
        .map(|(core, (host, port))| {
            let node_id = old.get(core).copied().unwrap_or_else(|| {
                next_id += 1;
                next_id - 1
            });
            NodeRegistration { node_id, core: core as u32, host: host.clone(), port: *port }
        })
        .collect();
    let mut records =
        vec![MetadataRecord::RegisterMachine(MachineRegistration { machine, incarnation, rack, nodes: nodes.clone() })];
    let removed: BTreeSet<i32> = old.iter().skip(nodes.len()).copied().collect();
    if !removed.is_empty() {
        let mut kept: Vec<(usize, i32)> = nodes.iter().map(|n| (0, n.node_id)).collect();
        for topic in image.topics.values() {
            for (index, partition) in topic.partitions.iter().enumerate() {
                if removed.contains(&partition.leader) {
                    kept.sort();
                    let to = kept[0].1;
                    kept[0].0 += 1;
                    records.push(move_partition(topic.id, index as i32, to));
                }
            }
        }
    }
    Ok(records)
}

/// Removes a machine stopped for good (an admin command). Refused while any
/// of its nodes leads a partition: move those first.
pub fn unregister_machine(image: &ClusterImage, machine: u64) -> Result<Vec<MetadataRecord>, (ErrorCode, String)> {
    let Some((_, registered)) = image.machines.iter().find(|(id, _)| id.get() == machine) else {
        return Err((ErrorCode::BrokerIdNotRegistered, format!("machine {machine} is not registered")));
    };
    for topic in image.topics.values() {
        if let Some(index) = topic.partitions.iter().position(|p| registered.nodes.contains(&p.leader)) {
            return Err((
                ErrorCode::InvalidRequest,
                format!("machine {machine} still leads partition {index} of topic {}", topic.name),
            ));
        }
    }
    Ok(vec![MetadataRecord::UnregisterMachine { machine, machine_epoch: registered.epoch }])
}

/// A producer-id block for a machine: ids `[start, start + block)`.
pub fn allocate_producer_ids(image: &ClusterImage, machine: u64) -> Result<(i64, Vec<MetadataRecord>), ErrorCode> {
    let registered = image.machines.iter().find(|(id, _)| id.get() == machine).map(|(_, m)| m.epoch);
    let Some(machine_epoch) = registered else {
        return Err(ErrorCode::InvalidRequest);
    };
    let start = image.producer_id_next.max(1);
    let next_producer_id = start + constants::PRODUCER_ID_BLOCK;
    Ok((start, vec![MetadataRecord::ProducerIds { machine, machine_epoch, next_producer_id }]))
}

fn new_partition(topic_id: TopicId, partition: i32, leader: i32) -> MetadataRecord {
    MetadataRecord::Partition(PartitionRecord {
        topic_id,
        partition,
        replicas: vec![leader],
        isr: vec![leader],
        leader,
        leader_epoch: 0,
        partition_epoch: 0,
    })
}

fn move_partition(topic_id: TopicId, partition: i32, to: i32) -> MetadataRecord {
    MetadataRecord::PartitionChange(PartitionChange {
        topic_id,
        partition,
        leader: Some(to),
        isr: Some(vec![to]),
        replicas: Some(vec![to]),
    })
}

/// The leader of each explicitly placed partition, checked as Kafka checks
/// assignments.
fn assigned_leaders(image: &ClusterImage, assignments: &[Vec<i32>]) -> Result<Vec<i32>, (ErrorCode, String)> {
    let invalid = |reason: String| Err((ErrorCode::InvalidReplicaAssignment, reason));
    let width = assignments.first().map_or(0, Vec::len);
    let mut leaders = Vec::with_capacity(assignments.len());
    for replicas in assignments {
        if replicas.is_empty() {
            return invalid("a partition's replica list is empty".into());
        }
        let mut seen = BTreeSet::new();
        if let Some(duplicate) = replicas.iter().find(|n| !seen.insert(**n)) {
            return invalid(format!("duplicate node {duplicate} in a replica list"));
        }
        let unknown: Vec<String> =
            replicas.iter().filter(|n| !image.nodes.contains_key(&NodeId(**n))).map(|n| n.to_string()).collect();
        if !unknown.is_empty() {
            return invalid(format!("Unknown broker(s) in replica assignment: {}.", unknown.join(", ")));
        }
        if replicas.len() != width {
            return invalid("All partitions should have the same number of replicas.".into());
        }
        if replicas.len() > 1 {
            return Err((
                ErrorCode::InvalidReplicationFactor,
                "one replica per partition: replication across machines is not built yet".into(),
            ));
        }
        leaders.push(replicas[0]);
    }
    Ok(leaders)
}

/// Partitions led per node, and per machine and rack, for placement.
struct Load {
    per_node: BTreeMap<i32, usize>,
}

impl Load {
    fn of(image: &ClusterImage) -> Self {
        let mut per_node: BTreeMap<i32, usize> = image.nodes.keys().map(|n| (n.0, 0)).collect();
        for topic in image.topics.values() {
            for partition in &topic.partitions {
                if let Some(count) = per_node.get_mut(&partition.leader) {
                    *count += 1;
                }
            }
        }
        Self { per_node }
    }

    fn count(&mut self, leaders: &[i32]) {
        for leader in leaders {
            *self.per_node.entry(*leader).or_default() += 1;
        }
    }

    /// Leaders for `count` new partitions of one topic: each on an unfenced
    /// node that leads the fewest partitions; among those, in the rack and
    /// then on the machine with the fewest of this topic's new partitions.
    /// `None` when every machine is fenced.
    fn place(&mut self, image: &ClusterImage, count: usize) -> Option<Vec<i32>> {
        let live: Vec<(i32, u64, Option<&str>)> = image
            .nodes
            .iter()
            .filter_map(|(node, placement)| {
                let machine = image.machines.iter().find(|(id, _)| id.get() == placement.machine)?.1;
                (!machine.fenced).then_some((node.0, placement.machine, machine.rack.as_deref()))
            })
            .collect();
        if live.is_empty() {
            return None;
        }
        let mut per_machine: BTreeMap<u64, usize> = BTreeMap::new();
        let mut per_rack: BTreeMap<Option<&str>, usize> = BTreeMap::new();
        let mut leaders = Vec::with_capacity(count);
        for _ in 0..count {
            let (node, machine, rack) = *live
                .iter()
                .min_by_key(|(node, machine, rack)| {
                    (
                        self.per_node.get(node).copied().unwrap_or(0),
                        per_rack.get(rack).copied().unwrap_or(0),
                        per_machine.get(machine).copied().unwrap_or(0),
                        *node,
                    )
                })
                .expect("live is not empty");
            *per_rack.entry(rack).or_default() += 1;
            *per_machine.entry(machine).or_default() += 1;
            *self.per_node.entry(node).or_default() += 1;
            leaders.push(node);
        }
        Some(leaders)
    }
}

#[cfg(test)]
mod tests {
    use super::super::image::{MetadataDelta, Provenance};
    use super::*;

    fn check_nothing(_: &BTreeMap<String, String>) -> Result<(), String> {
        Ok(())
    }

    fn context() -> ControlContext<'static> {
        ControlContext { default_partitions: 1, check_topic_configs: &check_nothing, salt: 7 }
    }

    /// Commits `records` on top of `image` (what the quorum and every
    /// machine's loader do).
    fn commit(image: &ClusterImage, records: &[MetadataRecord]) -> ClusterImage {
        let at = Provenance { offset: image.provenance.offset + 1, epoch: 1 };
        let mut delta = MetadataDelta::new(image);
        for record in records {
            delta.replay(at, record).unwrap_or_else(|e| panic!("{record:?}: {e}"));
        }
        delta.finish().0
    }

    fn endpoints(machine: u64, cores: usize) -> Vec<(String, i32)> {
        (0..cores).map(|core| (format!("10.0.0.{machine}"), 9092 + core as i32)).collect()
    }

    /// Three machines of two cores in racks a, a, b, all unfenced.
    fn cluster() -> ClusterImage {
        let mut image = ClusterImage::default();
        for (machine, rack) in [(1, "a"), (2, "a"), (3, "b")] {
            let records =
                register_machine(&image, machine, 1, Some(rack.into()), &endpoints(machine, 2), None).unwrap();
            image = commit(&image, &records);
            let epoch = image.provenance.offset;
            image = commit(&image, &[MetadataRecord::UnfenceMachine { machine, machine_epoch: epoch }]);
        }
        image
    }

    fn topic(name: &str, partitions: i32) -> TopicRequest {
        TopicRequest {
            name: name.into(),
            partitions,
            replication_factor: -1,
            configs: BTreeMap::new(),
            assignments: Vec::new(),
        }
    }

    fn machine_of(image: &ClusterImage, node: i32) -> u64 {
        image.nodes[&NodeId(node)].machine
    }

    #[test]
    fn machines_get_distinct_node_ids_that_survive_a_reregistration() {
        let image = cluster();
        let ids: Vec<i32> = image.nodes.keys().map(|n| n.0).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4, 5]);
        let again = register_machine(&image, 2, 2, Some("a".into()), &endpoints(2, 3), None).unwrap();
        let image = commit(&image, &again);
        let two = image.machines.iter().find(|(id, _)| id.get() == 2).unwrap().1;
        assert_eq!(two.nodes, vec![2, 3, 6], "old cores keep their ids, a new core gets a fresh one");
    }

    #[test]
    fn a_topic_spreads_over_racks_and_machines_and_balances_nodes() {
        let image = cluster();
        let decision = create_topics(&image, &[topic("t", 6)], &context());
        assert_eq!(decision.items[0].error, ErrorCode::None);
        let image = commit(&image, &decision.records);
        let leaders: Vec<i32> = image.topic("t").unwrap().partitions.iter().map(|p| p.leader).collect();
        let mut per_node = leaders.clone();
        per_node.sort();
        assert_eq!(per_node, vec![0, 1, 2, 3, 4, 5], "one partition per node");
        let racks_of_first_two: BTreeSet<u64> = leaders[..2].iter().map(|n| machine_of(&image, *n)).collect();
        assert!(racks_of_first_two.contains(&3), "rack b gets one of the first two partitions: {leaders:?}");
    }

    #[test]
    fn fenced_machines_get_no_new_partitions() {
        let image = cluster();
        let epoch = image.machines.iter().find(|(id, _)| id.get() == 3).unwrap().1.epoch;
        let image = commit(&image, &[MetadataRecord::FenceMachine { machine: 3, machine_epoch: epoch }]);
        let image = commit(&image, &create_topics(&image, &[topic("t", 8)], &context()).records);
        assert!(image.topic("t").unwrap().partitions.iter().all(|p| machine_of(&image, p.leader) != 3));
    }

    #[test]
    fn refused_items_add_no_records_and_do_not_block_the_others() {
        let image = cluster();
        let assigned = TopicRequest { partitions: -1, assignments: vec![(0, vec![9])], ..topic("bad-node", -1) };
        let decision = create_topics(
            &image,
            &[topic("ok", 2), topic("bad name", 1), topic("ok", 1), topic("zero", 0), assigned],
            &context(),
        );
        let codes: Vec<ErrorCode> = decision.items.iter().map(|i| i.error).collect();
        assert_eq!(
            codes,
            vec![
                ErrorCode::None,
                ErrorCode::InvalidTopicException,
                ErrorCode::TopicAlreadyExists,
                ErrorCode::InvalidPartitions,
                ErrorCode::InvalidReplicaAssignment,
            ]
        );
        let image = commit(&image, &decision.records);
        assert_eq!(image.topic_ids.keys().collect::<Vec<_>>(), vec!["ok"]);
    }

    #[test]
    fn partitions_grow_topics_are_deleted_and_configs_change_by_records() {
        let image = cluster();
        let image = commit(&image, &create_topics(&image, &[topic("t", 2)], &context()).records);
        let grown = create_partitions(&image, "t", 4, Some(&[vec![5], vec![5]]));
        assert_eq!(grown.items[0].error, ErrorCode::None);
        let image = commit(&image, &grown.records);
        let leaders: Vec<i32> = image.topic("t").unwrap().partitions.iter().map(|p| p.leader).collect();
        assert_eq!(&leaders[2..], &[5, 5]);
        assert_eq!(create_partitions(&image, "t", 3, None).items[0].error, ErrorCode::InvalidPartitions);

        let resource = ConfigResource::Topic("t".into());
        let set = alter_configs(&image, &resource, &[("retention.ms".into(), Some("1".into()))], false, &check_nothing);
        let image = commit(&image, &set.records);
        assert_eq!(image.configs.topics["t"]["retention.ms"], "1");
        let cleared = alter_configs(&image, &resource, &[], true, &check_nothing);
        let image = commit(&image, &cleared.records);
        assert!(!image.configs.topics.contains_key("t"));

        let deleted = delete_topics(&image, &["t".into(), "t".into(), "none".into()]);
        let codes: Vec<ErrorCode> = deleted.items.iter().map(|i| i.error).collect();
        assert_eq!(
            codes,
            vec![ErrorCode::None, ErrorCode::UnknownTopicOrPartition, ErrorCode::UnknownTopicOrPartition]
        );
        assert!(commit(&image, &deleted.records).topic("t").is_none());
    }

    #[test]
    fn a_machine_restarting_with_fewer_cores_moves_its_removed_nodes_partitions_to_its_others() {
        let image = cluster();
        let assignments = vec![(0, vec![2]), (1, vec![3]), (2, vec![3])];
        let request = TopicRequest { partitions: -1, assignments, ..topic("t", -1) };
        let image = commit(&image, &create_topics(&image, &[request], &context()).records);
        let records = register_machine(&image, 2, 2, Some("a".into()), &endpoints(2, 1), None).unwrap();
        let image = commit(&image, &records);
        let partitions = &image.topic("t").unwrap().partitions;
        assert!(partitions.iter().all(|p| p.leader == 2), "machine 2 keeps only node 2");
        assert_eq!(partitions[1].leader_epoch, 1);
        assert!(!image.nodes.contains_key(&NodeId(3)));
    }

    #[test]
    fn a_machine_leaves_only_once_it_leads_nothing_and_its_node_ids_are_never_reused() {
        let image = cluster();
        let request = TopicRequest { partitions: -1, assignments: vec![(0, vec![4])], ..topic("t", -1) };
        let image = commit(&image, &create_topics(&image, &[request], &context()).records);
        let refused = unregister_machine(&image, 3).unwrap_err();
        assert!(refused.1.contains("still leads partition 0 of topic t"), "{refused:?}");
        let image = commit(&image, &delete_topics(&image, &["t".into()]).records);
        let image = commit(&image, &unregister_machine(&image, 3).unwrap());
        assert!(!image.nodes.contains_key(&NodeId(4)) && !image.nodes.contains_key(&NodeId(5)));
        let image = commit(&image, &register_machine(&image, 4, 1, None, &endpoints(4, 2), Some(2)).unwrap());
        let four = image.machines.iter().find(|(id, _)| id.get() == 4).unwrap().1;
        assert_eq!(four.nodes, vec![6, 7], "ids 4 and 5 belonged to machine 3, 2 is taken: the hint is ignored");
        let gone = unregister_machine(&image, 3).unwrap_err();
        assert_eq!(
            gone.0,
            ErrorCode::BrokerIdNotRegistered,
            "gone already: what a retry forwarded by a lagging machine hears"
        );
    }

    #[test]
    fn producer_id_blocks_never_overlap() {
        let image = cluster();
        let (first, records) = allocate_producer_ids(&image, 1).unwrap();
        let image = commit(&image, &records);
        let (second, _) = allocate_producer_ids(&image, 2).unwrap();
        assert_eq!(second, first + constants::PRODUCER_ID_BLOCK);
        assert_eq!(allocate_producer_ids(&image, 42), Err(ErrorCode::InvalidRequest));
    }
}
