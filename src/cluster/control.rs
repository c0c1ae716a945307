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
//! Its followers go to other machines (a machine holds at most one replica
//! of a partition: its cores share one data directory), other racks first.
//!
//! Elections (issue 30): when a machine is fenced or registers again after
//! a restart, its nodes leave every ISR and each partition it led gets the
//! first replica, in assignment order, that is in the ISR and serving. A
//! partition whose in-sync replicas are all on that machine keeps its
//! registration (they alone hold every committed write): its leader is
//! unavailable while fenced and serves again once heard. When a machine is
//! unfenced, leaderless partitions whose ISR it is in get it back. Unclean
//! election (a replica outside the ISR) is never done here.

use std::collections::{BTreeMap, BTreeSet};

use super::controller::{topic_id, validate_topic_name, ConfigCheck, ItemResult, PartitionGrowth};
use super::image::{ClusterImage, TopicId};
use super::metadata::NodeId;
use super::records::{
    ConfigResource, MachineRegistration, MetadataRecord, NodeRegistration, PartitionChange, PartitionRecord,
    Reassignment, StoredScram,
};
use crate::constants;
use crate::protocol::ErrorCode;

/// A topic to create.
#[derive(Debug, Clone)]
pub struct TopicRequest {
    pub name: String,
    /// -1: `ControlContext::default_partitions`.
    pub partitions: i32,
    /// -1: `ControlContext::default_replication_factor`.
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
    /// Explicit placement: (partition index, node ids of its replicas);
    /// then `partitions` and `replication_factor` are -1.
    pub assignments: Vec<(i32, Vec<i32>)>,
}

/// What the controller needs besides the image.
pub struct ControlContext<'a> {
    pub default_partitions: i32,
    /// `default.replication.factor`.
    pub default_replication_factor: i16,
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
        let placed = if topic.assignments.is_empty() {
            let count = if topic.partitions == -1 { context.default_partitions } else { topic.partitions };
            if count <= 0 || count > constants::TOPIC_PARTITIONS_MAX {
                decision.items.push(refused(ErrorCode::InvalidPartitions, "number of partitions must be 1 ..= 100000"));
                continue;
            }
            let factor = if topic.replication_factor == -1 {
                context.default_replication_factor
            } else {
                topic.replication_factor
            };
            match load.place(image, count as usize, factor) {
                Ok(placed) => placed,
                Err((error, reason)) => {
                    decision.items.push(refused(error, &reason));
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
            match check_assignments(image, &assignments) {
                Ok(()) => {
                    load.count(&assignments);
                    assignments
                }
                Err((error, reason)) => {
                    decision.items.push(refused(error, &reason));
                    continue;
                }
            }
        };
        let id = topic_id(name, context.salt.wrapping_add(nth as u64));
        decision.records.push(MetadataRecord::Topic { name: name.into(), topic_id: id });
        for (index, replicas) in placed.into_iter().enumerate() {
            decision.records.push(new_partition(id, index as i32, replicas));
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
        if name == constants::OFFSETS_TOPIC {
            decision.items.push(ItemResult {
                name: name.clone(),
                error: ErrorCode::InvalidRequest,
                message: Some(format!("{name} is internal: it holds every group's committed offsets")),
            });
            continue;
        }
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
    if name == constants::OFFSETS_TOPIC {
        return refused(
            ErrorCode::InvalidRequest,
            format!("{name} is internal: more partitions would move groups away from their committed offsets"),
        );
    }
    let current = topic.partitions.len() as i32;
    if count <= current || count > constants::TOPIC_PARTITIONS_MAX {
        return refused(
            ErrorCode::InvalidPartitions,
            format!("topic has {current} partitions; the new count must be larger (and at most 100000)"),
        );
    }
    let added = (count - current) as usize;
    let placed = match assignments {
        Some(assignments) if assignments.len() != added => {
            return refused(
                ErrorCode::InvalidReplicaAssignment,
                format!(
                    "Increasing the number of partitions by {added} but {} assignments provided.",
                    assignments.len()
                ),
            )
        }
        Some(assignments) => match check_assignments(image, assignments) {
            Ok(()) => assignments.to_vec(),
            Err((error, reason)) => return refused(error, reason),
        },
        None => {
            // New partitions get as many replicas as the first one has.
            let factor = topic.partitions.first().map_or(1, |p| p.replicas.len()) as i16;
            match Load::of(image).place(image, added, factor) {
                Ok(placed) => placed,
                Err((error, reason)) => return refused(error, reason),
            }
        }
    };
    let records = placed
        .into_iter()
        .enumerate()
        .map(|(i, replicas)| new_partition(topic.id, current + i as i32, replicas))
        .collect();
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
                // At most one replica of a partition per machine.
                if let Some(gone) = partition.replicas.iter().find(|n| removed.contains(n)) {
                    kept.sort();
                    let to = kept[0].1;
                    kept[0].0 += 1;
                    records.push(rehome_replica(topic.id, index as i32, partition, *gone, to));
                }
            }
        }
    }
    // A registration fences the machine until the controller hears from
    // it (KIP-631): its old self may have led partitions and been in ISRs
    // with what it had before it restarted.
    if !old.is_empty() {
        let replayed = replayed(image, &records);
        let down: BTreeSet<i32> = nodes.iter().map(|n| n.node_id).collect();
        records.extend(leave(&replayed, &down));
    }
    Ok(records)
}

/// Fences a machine (its lease ran out, or gossip declared it down): the
/// FenceMachine record and the elections it brings.
pub fn fence_machine(image: &ClusterImage, machine: u64) -> Vec<MetadataRecord> {
    let Some((_, registered)) = image.machines.iter().find(|(id, _)| id.get() == machine) else { return Vec::new() };
    let mut records = vec![MetadataRecord::FenceMachine { machine, machine_epoch: registered.epoch }];
    let down: BTreeSet<i32> = registered.nodes.iter().copied().collect();
    records.extend(leave(image, &down));
    records
}

/// Fences several machines at once: each election sees the ones before it.
pub fn fence_machines(image: &ClusterImage, machines: &[u64]) -> Vec<MetadataRecord> {
    let mut working = image.clone();
    let mut records = Vec::new();
    for machine in machines {
        let more = fence_machine(&working, *machine);
        working = replayed(&working, &more);
        records.extend(more);
    }
    records
}

/// Unfences a machine: the UnfenceMachine record, and leadership for the
/// leaderless partitions whose ISR holds one of its nodes.
pub fn unfence_machine(image: &ClusterImage, machine: u64) -> Vec<MetadataRecord> {
    let Some((_, registered)) = image.machines.iter().find(|(id, _)| id.get() == machine) else { return Vec::new() };
    let mut records = vec![MetadataRecord::UnfenceMachine { machine, machine_epoch: registered.epoch }];
    let up: BTreeSet<i32> = registered.nodes.iter().copied().collect();
    for topic in image.topics.values() {
        for (index, partition) in topic.partitions.iter().enumerate() {
            if partition.leader >= 0 {
                continue;
            }
            let eligible = |n: &&i32| partition.isr.contains(n) && (up.contains(n) || serving(image, **n));
            if let Some(leader) = partition.replicas.iter().find(eligible) {
                records.push(MetadataRecord::PartitionChange(PartitionChange {
                    topic_id: topic.id,
                    partition: index as i32,
                    leader: Some(*leader),
                    isr: None,
                    replicas: None,
                }));
            }
        }
    }
    records
}

/// An ISR change a partition's leader asks for (Kafka's AlterPartition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrChange {
    pub topic_id: TopicId,
    pub partition: i32,
    pub leader: i32,
    /// The epoch of the leader's machine (KIP-841: a restarted machine's
    /// old requests are refused).
    pub machine_epoch: u64,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub isr: Vec<i32>,
}

/// AlterPartition, with KRaft's checks: the requester still leads in that
/// leader epoch, the change is made on the current partition epoch, and
/// every replica joining the ISR is on a serving machine.
pub fn alter_isr(image: &ClusterImage, change: &IsrChange) -> Result<Vec<MetadataRecord>, (ErrorCode, String)> {
    let partition = image
        .topics
        .get(&change.topic_id)
        .and_then(|t| t.partitions.get(usize::try_from(change.partition).ok()?))
        .ok_or((ErrorCode::UnknownTopicOrPartition, "no such partition".to_string()))?;
    let machine = image.nodes.get(&NodeId(change.leader)).map(|p| p.machine);
    let machine_epoch = machine.and_then(|m| image.machines.iter().find(|(id, _)| id.get() == m)).map(|(_, m)| m.epoch);
    if machine_epoch != Some(change.machine_epoch) {
        return Err((ErrorCode::StaleBrokerEpoch, format!("machine epoch {} is not current", change.machine_epoch)));
    }
    if partition.leader != change.leader || partition.leader_epoch != change.leader_epoch {
        return Err((
            ErrorCode::FencedLeaderEpoch,
            format!("leader {} epoch {} is not the current leader", change.leader, change.leader_epoch),
        ));
    }
    if partition.partition_epoch != change.partition_epoch {
        return Err((
            ErrorCode::InvalidUpdateVersion,
            format!("partition epoch {} is not the current {}", change.partition_epoch, partition.partition_epoch),
        ));
    }
    let mut seen = BTreeSet::new();
    let valid = change.isr.contains(&change.leader)
        && change.isr.iter().all(|n| partition.replicas.contains(n) && seen.insert(*n));
    if !valid {
        return Err((
            ErrorCode::InvalidRequest,
            format!("ISR {:?} is not a set of replicas with the leader", change.isr),
        ));
    }
    if let Some(joining) = change.isr.iter().find(|n| !partition.isr.contains(n) && !serving(image, **n)) {
        return Err((ErrorCode::IneligibleReplica, format!("replica {joining} is on a fenced machine")));
    }
    let mut records = vec![MetadataRecord::PartitionChange(PartitionChange {
        topic_id: change.topic_id,
        partition: change.partition,
        leader: None,
        isr: Some(change.isr.clone()),
        replicas: None,
    })];
    // The ISR may now hold every replica a move asked for: it completes.
    let after = replayed(image, &records);
    records.extend(complete_reassignment(&after, change.topic_id, change.partition));
    Ok(records)
}

/// One partition's requested move (AlterPartitionReassignments): its new
/// replicas, or None to cancel the move in progress.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct MoveRequest {
    pub topic: String,
    pub partition: i32,
    pub replicas: Option<Vec<i32>>,
}

/// AlterPartitionReassignments, with KRaft's semantics (KIP-455). A move
/// to `target` registers the replicas `target` followed by the original
/// ones it drops, so the new replicas copy the log as followers while the
/// old ones keep serving; the leader stays. Once every replica of `target`
/// is in the ISR (the leader asks AlterPartition as each catches up), the
/// move completes in the same batch: the replicas become `target`, the ISR
/// loses the others, and a leader that is not in `target` hands over to
/// the first of `target` in sync. A new move of a moving partition
/// replaces the old (from the same original replicas); None cancels,
/// back to the original replicas. One item per move, named
/// `topic-partition`.
pub fn alter_reassignments(image: &ClusterImage, moves: &[MoveRequest]) -> Decision {
    let mut working = image.clone();
    let mut decision = Decision::default();
    for wanted in moves {
        let name = format!("{}-{}", wanted.topic, wanted.partition);
        match reassign(&working, wanted) {
            Ok(records) => {
                working = replayed(&working, &records);
                decision.records.extend(records);
                decision.items.push(ItemResult { name, error: ErrorCode::None, message: None });
            }
            Err((error, message)) => decision.items.push(ItemResult { name, error, message: Some(message) }),
        }
    }
    decision
}

fn reassign(image: &ClusterImage, wanted: &MoveRequest) -> Result<Vec<MetadataRecord>, (ErrorCode, String)> {
    let unknown =
        || (ErrorCode::UnknownTopicOrPartition, format!("no partition {}-{}", wanted.topic, wanted.partition));
    let topic = image.topic(&wanted.topic).ok_or_else(unknown)?;
    let partition = usize::try_from(wanted.partition).ok().and_then(|i| topic.partitions.get(i)).ok_or_else(unknown)?;
    let key = (topic.id, wanted.partition);
    let ongoing = image.reassignments.get(&key);
    let Some(target) = &wanted.replicas else {
        let Some(ongoing) = ongoing else {
            return Err((
                ErrorCode::NoReassignmentInProgress,
                format!("{}-{} is not moving", wanted.topic, wanted.partition),
            ));
        };
        let original = ongoing.original.clone();
        let isr: Vec<i32> = partition.isr.iter().copied().filter(|n| original.contains(n)).collect();
        if isr.is_empty() {
            return Err((
                ErrorCode::InvalidReplicaAssignment,
                "no replica of the original assignment is in sync: let the move finish".into(),
            ));
        }
        let leader = keep_or_elect(image, partition.leader, &original, &isr);
        return Ok(vec![
            MetadataRecord::PartitionChange(PartitionChange {
                topic_id: topic.id,
                partition: wanted.partition,
                leader: (leader != partition.leader).then_some(leader),
                isr: Some(isr),
                replicas: Some(original),
            }),
            MetadataRecord::Reassignment { topic_id: topic.id, partition: wanted.partition, moving: None },
        ]);
    };
    check_assignments(image, std::slice::from_ref(target))?;
    let original = ongoing.map_or_else(|| partition.replicas.clone(), |o| o.original.clone());
    if ongoing.is_none() && *target == partition.replicas {
        return Ok(Vec::new());
    }
    let mut replicas = target.clone();
    replicas.extend(original.iter().copied().filter(|n| !target.contains(n)));
    let mut machines = BTreeSet::new();
    if replicas.iter().any(|n| !machines.insert(image.nodes[&NodeId(*n)].machine)) {
        return Err((
            ErrorCode::InvalidReplicaAssignment,
            format!(
                "moving {}-{} to {target:?} puts two replicas on one machine while it moves (its cores share \
                 one data directory): move to another machine",
                wanted.topic, wanted.partition
            ),
        ));
    }
    let isr: Vec<i32> = partition.isr.iter().copied().filter(|n| replicas.contains(n)).collect();
    if isr.is_empty() {
        return Err((
            ErrorCode::InvalidReplicaAssignment,
            "no replica in sync would remain: include one of the in-sync replicas".into(),
        ));
    }
    let leader = keep_or_elect(image, partition.leader, &replicas, &isr);
    let mut records = vec![
        MetadataRecord::Reassignment {
            topic_id: topic.id,
            partition: wanted.partition,
            moving: Some(Reassignment { target: target.clone(), original }),
        },
        MetadataRecord::PartitionChange(PartitionChange {
            topic_id: topic.id,
            partition: wanted.partition,
            leader: (leader != partition.leader).then_some(leader),
            isr: (isr != partition.isr).then_some(isr),
            replicas: Some(replicas),
        }),
    ];
    let after = replayed(image, &records);
    records.extend(complete_reassignment(&after, topic.id, wanted.partition));
    Ok(records)
}

/// The leader a partition keeps when its replicas become `replicas`: the
/// current one if it stays, else the first of `replicas` in `isr` on a
/// serving machine (-1: none).
fn keep_or_elect(image: &ClusterImage, leader: i32, replicas: &[i32], isr: &[i32]) -> i32 {
    if leader >= 0 && replicas.contains(&leader) && isr.contains(&leader) {
        return leader;
    }
    replicas.iter().copied().find(|n| isr.contains(n) && serving(image, *n)).unwrap_or(-1)
}

/// The records that finish `topic_id`/`partition`'s move once every
/// replica it asked for is in the ISR; none otherwise.
fn complete_reassignment(image: &ClusterImage, topic_id: TopicId, partition: i32) -> Vec<MetadataRecord> {
    let Some(moving) = image.reassignments.get(&(topic_id, partition)) else { return Vec::new() };
    let Some(registered) = image.topics.get(&topic_id).and_then(|t| t.partitions.get(usize::try_from(partition).ok()?))
    else {
        return Vec::new();
    };
    if !moving.target.iter().all(|n| registered.isr.contains(n)) {
        return Vec::new();
    }
    let isr: Vec<i32> = registered.isr.iter().copied().filter(|n| moving.target.contains(n)).collect();
    let leader = keep_or_elect(image, registered.leader, &moving.target, &isr);
    vec![
        MetadataRecord::PartitionChange(PartitionChange {
            topic_id,
            partition,
            leader: (leader != registered.leader).then_some(leader),
            isr: Some(isr),
            replicas: Some(moving.target.clone()),
        }),
        MetadataRecord::Reassignment { topic_id, partition, moving: None },
    ]
}

/// The partition changes that take the nodes `down` out of every ISR and
/// leadership: each ISR loses them (keeping its last member), and each
/// partition they led gets the first replica in assignment order that is
/// in the new ISR and serving, or no leader.
fn leave(image: &ClusterImage, down: &BTreeSet<i32>) -> Vec<MetadataRecord> {
    let mut records = Vec::new();
    for topic in image.topics.values() {
        for (index, partition) in topic.partitions.iter().enumerate() {
            let affected = down.contains(&partition.leader) || partition.isr.iter().any(|n| down.contains(n));
            if !affected {
                continue;
            }
            let isr: Vec<i32> = partition.isr.iter().copied().filter(|n| !down.contains(n)).collect();
            if isr.is_empty() {
                // Every in-sync replica is going. Unless the topic allows
                // an unclean election, none other may lead, so the
                // registration stays as it is: its leader is unavailable
                // while fenced and leads again, in the same epoch, once
                // heard (a restart of a machine alone changes nothing).
                let unclean = unclean_allowed(image, &topic.name)
                    .then(|| partition.replicas.iter().copied().find(|n| !down.contains(n) && serving(image, *n)));
                if let Some(Some(leader)) = unclean {
                    records.push(MetadataRecord::PartitionChange(PartitionChange {
                        topic_id: topic.id,
                        partition: index as i32,
                        leader: Some(leader),
                        isr: Some(vec![leader]),
                        replicas: None,
                    }));
                }
                continue;
            }
            let leader = if down.contains(&partition.leader) || partition.leader < 0 {
                let eligible = |n: &&i32| isr.contains(n) && !down.contains(n) && serving(image, **n);
                partition.replicas.iter().find(eligible).copied().unwrap_or(-1)
            } else {
                partition.leader
            };
            if leader == partition.leader && isr == partition.isr {
                continue;
            }
            records.push(MetadataRecord::PartitionChange(PartitionChange {
                topic_id: topic.id,
                partition: index as i32,
                leader: (leader != partition.leader).then_some(leader),
                isr: (isr != partition.isr).then_some(isr),
                replicas: None,
            }));
        }
    }
    records
}

/// Whether `topic` sets `unclean.leader.election.enable=true`: then a
/// replica outside the ISR may lead when no in-sync one can, losing the
/// writes only the ISR held.
fn unclean_allowed(image: &ClusterImage, topic: &str) -> bool {
    image.configs.topics.get(topic).and_then(|c| c.get(UNCLEAN_CONFIG)).is_some_and(|v| v == "true")
}

/// The topic config that allows unclean elections (off by default).
pub const UNCLEAN_CONFIG: &str = "unclean.leader.election.enable";

/// One partition's election answer: topic, partition, error, message.
pub type Election = (String, i32, ErrorCode, Option<String>);

/// ElectLeaders (KIP-460): for each partition named (every partition when
/// `wanted` is None), a preferred election moves leadership to the first
/// replica when it is in the ISR and serving; an unclean one gives a
/// partition without a serving leader the first in-sync serving replica,
/// or else the first serving one (its ISR then that replica alone).
/// Answers per partition: ELECTION_NOT_NEEDED when it already has the
/// leader asked for, PREFERRED_LEADER_NOT_AVAILABLE or
/// ELIGIBLE_LEADERS_NOT_AVAILABLE when no replica qualifies.
pub fn elect_leaders(
    image: &ClusterImage,
    unclean: bool,
    wanted: Option<&[(String, Vec<i32>)]>,
) -> (Vec<MetadataRecord>, Vec<Election>) {
    let named: Vec<(String, Vec<i32>)> = match wanted {
        Some(wanted) => wanted.to_vec(),
        None => image.topics.values().map(|t| (t.name.clone(), (0..t.partitions.len() as i32).collect())).collect(),
    };
    let mut records = Vec::new();
    let mut answers = Vec::new();
    for (name, indexes) in named {
        for index in indexes {
            let found = image.topic(&name).and_then(|t| Some((t.id, t.partitions.get(usize::try_from(index).ok()?)?)));
            let Some((topic_id, partition)) = found else {
                answers.push((
                    name.clone(),
                    index,
                    ErrorCode::UnknownTopicOrPartition,
                    Some("no such partition".into()),
                ));
                continue;
            };
            let change = |leader: i32, isr: Option<Vec<i32>>| {
                MetadataRecord::PartitionChange(PartitionChange {
                    topic_id,
                    partition: index,
                    leader: Some(leader),
                    isr,
                    replicas: None,
                })
            };
            let (error, message) = if !unclean {
                let preferred = partition.replicas[0];
                if partition.leader == preferred {
                    (ErrorCode::ElectionNotNeeded, Some(format!("replica {preferred} already leads")))
                } else if partition.isr.contains(&preferred) && serving(image, preferred) {
                    records.push(change(preferred, None));
                    (ErrorCode::None, None)
                } else {
                    let why = format!("preferred replica {preferred} is not in the ISR or its machine is fenced");
                    (ErrorCode::PreferredLeaderNotAvailable, Some(why))
                }
            } else if partition.leader >= 0 && serving(image, partition.leader) {
                (ErrorCode::ElectionNotNeeded, Some(format!("replica {} leads", partition.leader)))
            } else if let Some(clean) =
                partition.replicas.iter().find(|n| partition.isr.contains(n) && serving(image, **n))
            {
                records.push(change(*clean, None));
                (ErrorCode::None, None)
            } else if let Some(any) = partition.replicas.iter().find(|n| serving(image, **n)) {
                records.push(change(*any, Some(vec![*any])));
                (ErrorCode::None, None)
            } else {
                (ErrorCode::EligibleLeadersNotAvailable, Some("no replica's machine is serving".into()))
            };
            answers.push((name.clone(), index, error, message));
        }
    }
    (records, answers)
}

/// The leader balancer: preferred elections for at most `max` partitions
/// whose preferred replica is in the ISR and serving but does not lead
/// (Kafka's auto.leader.rebalance). After a machine returns, its
/// partitions go back to it once it has caught up.
pub fn balance_leaders(image: &ClusterImage, max: usize) -> Vec<MetadataRecord> {
    let mut records = Vec::new();
    for topic in image.topics.values() {
        for (index, partition) in topic.partitions.iter().enumerate() {
            if records.len() >= max {
                return records;
            }
            let preferred = partition.replicas[0];
            if partition.leader != preferred && partition.isr.contains(&preferred) && serving(image, preferred) {
                records.push(MetadataRecord::PartitionChange(PartitionChange {
                    topic_id: topic.id,
                    partition: index as i32,
                    leader: Some(preferred),
                    isr: None,
                    replicas: None,
                }));
            }
        }
    }
    records
}

/// Whether `node`'s machine is registered and not fenced.
fn serving(image: &ClusterImage, node: i32) -> bool {
    image
        .nodes
        .get(&NodeId(node))
        .and_then(|p| image.machines.iter().find(|(id, _)| id.get() == p.machine))
        .is_some_and(|(_, m)| !m.fenced)
}

/// `image` with `records` replayed (a decision made of several steps).
fn replayed(image: &ClusterImage, records: &[MetadataRecord]) -> ClusterImage {
    let mut delta = super::image::MetadataDelta::new(image);
    for record in records {
        delta.replay(image.provenance, record).expect("a decision replays on the image it was made on");
    }
    delta.finish().0
}

/// Removes a machine stopped for good (an admin command). Refused while any
/// of its nodes holds a replica (a fenced machine leads nothing, but it may
/// be the last in-sync replica): move or delete those first.
pub fn unregister_machine(image: &ClusterImage, machine: u64) -> Result<Vec<MetadataRecord>, (ErrorCode, String)> {
    let Some((_, registered)) = image.machines.iter().find(|(id, _)| id.get() == machine) else {
        return Err((ErrorCode::BrokerIdNotRegistered, format!("machine {machine} is not registered")));
    };
    for topic in image.topics.values() {
        let holds =
            |p: &std::sync::Arc<super::image::PartitionImage>| p.replicas.iter().any(|n| registered.nodes.contains(n));
        if let Some(index) = topic.partitions.iter().position(holds) {
            return Err((
                ErrorCode::InvalidRequest,
                format!("machine {machine} still holds a replica of partition {index} of topic {}", topic.name),
            ));
        }
    }
    Ok(vec![MetadataRecord::UnregisterMachine { machine, machine_epoch: registered.epoch }])
}

/// One user's SCRAM changes: credentials to set and mechanism types to
/// delete (validated by the caller: known types, iterations in range, no
/// type twice).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ScramChange {
    pub user: String,
    pub set: Vec<(i8, StoredScram)>,
    pub delete: Vec<i8>,
}

/// AlterUserScramCredentials and `--bootstrap-user` (see
/// `bridge::Request::AlterScram`): one answer per user, in order. A user
/// whose deletion names a credential it does not have gets
/// RESOURCE_NOT_FOUND and none of its changes, as Kafka answers;
/// `only_if_absent` leaves a user that has any credential as it is.
pub fn alter_scram(image: &ClusterImage, changes: &[ScramChange], only_if_absent: bool) -> Decision {
    let mut decision = Decision::default();
    for change in changes {
        let user = &change.user;
        let answer = |error, message: Option<&str>| ItemResult {
            name: user.clone(),
            error,
            message: message.map(str::to_string),
        };
        if only_if_absent && image.scram.keys().any(|(name, _)| name == user) {
            decision.items.push(answer(ErrorCode::None, None));
            continue;
        }
        if change.delete.iter().any(|kind| !image.scram.contains_key(&(user.clone(), *kind))) {
            let message = "Attempt to delete a user credential that does not exist";
            decision.items.push(answer(ErrorCode::ResourceNotFound, Some(message)));
            continue;
        }
        for (kind, credential) in &change.set {
            decision.records.push(MetadataRecord::ScramCredential {
                user: user.clone(),
                mechanism: *kind,
                credential: Some(Box::new(credential.clone())),
            });
        }
        for kind in &change.delete {
            decision.records.push(MetadataRecord::ScramCredential {
                user: user.clone(),
                mechanism: *kind,
                credential: None,
            });
        }
        decision.items.push(answer(ErrorCode::None, None));
    }
    decision
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

fn new_partition(topic_id: TopicId, partition: i32, replicas: Vec<i32>) -> MetadataRecord {
    MetadataRecord::Partition(PartitionRecord {
        topic_id,
        partition,
        leader: replicas[0],
        isr: replicas.clone(),
        replicas,
        leader_epoch: 0,
        partition_epoch: 0,
    })
}

/// Moves a partition's replica from a removed core's node `from` to
/// another node `to` of the same machine (they share its data directory).
fn rehome_replica(
    topic_id: TopicId,
    partition: i32,
    registered: &super::image::PartitionImage,
    from: i32,
    to: i32,
) -> MetadataRecord {
    let swap = |nodes: &[i32]| nodes.iter().map(|n| if *n == from { to } else { *n }).collect::<Vec<i32>>();
    MetadataRecord::PartitionChange(PartitionChange {
        topic_id,
        partition,
        leader: (registered.leader == from).then_some(to),
        isr: Some(swap(&registered.isr)),
        replicas: Some(swap(&registered.replicas)),
    })
}

/// Explicit replica lists, checked as Kafka checks assignments, and on
/// distinct machines.
fn check_assignments(image: &ClusterImage, assignments: &[Vec<i32>]) -> Result<(), (ErrorCode, String)> {
    let invalid = |reason: String| Err((ErrorCode::InvalidReplicaAssignment, reason));
    let width = assignments.first().map_or(0, Vec::len);
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
        let mut machines = BTreeSet::new();
        if replicas.iter().any(|n| !machines.insert(image.nodes[&NodeId(*n)].machine)) {
            return invalid(format!("replicas {replicas:?} share a machine: each must be on its own"));
        }
    }
    Ok(())
}

/// Partitions led and replicas held per node, for placement.
struct Load {
    leaders: BTreeMap<i32, usize>,
    replicas: BTreeMap<i32, usize>,
}

impl Load {
    fn of(image: &ClusterImage) -> Self {
        let mut load = Self { leaders: BTreeMap::new(), replicas: BTreeMap::new() };
        for topic in image.topics.values() {
            for partition in &topic.partitions {
                *load.leaders.entry(partition.leader).or_default() += 1;
                for replica in &partition.replicas {
                    *load.replicas.entry(*replica).or_default() += 1;
                }
            }
        }
        load
    }

    fn count(&mut self, placed: &[Vec<i32>]) {
        for replicas in placed {
            if let Some(leader) = replicas.first() {
                *self.leaders.entry(*leader).or_default() += 1;
            }
            for replica in replicas {
                *self.replicas.entry(*replica).or_default() += 1;
            }
        }
    }

    /// Replica lists, leader first, for `count` new partitions of one topic
    /// with `factor` replicas each. The leader is an unfenced node that
    /// leads the fewest partitions; among those, in the rack and then on
    /// the machine with the fewest of this topic's new partitions. Each
    /// follower is on another machine, in a rack the partition does not
    /// use yet where there is one, on the node with the fewest replicas.
    fn place(&mut self, image: &ClusterImage, count: usize, factor: i16) -> Result<Vec<Vec<i32>>, (ErrorCode, String)> {
        let live: Vec<(i32, u64, Option<&str>)> = image
            .nodes
            .iter()
            .filter_map(|(node, placement)| {
                let machine = image.machines.iter().find(|(id, _)| id.get() == placement.machine)?.1;
                (!machine.fenced).then_some((node.0, placement.machine, machine.rack.as_deref()))
            })
            .collect();
        let machines: BTreeSet<u64> = live.iter().map(|(_, machine, _)| *machine).collect();
        if factor < 1 {
            return Err((ErrorCode::InvalidReplicationFactor, "Replication factor must be larger than 0.".into()));
        }
        if live.is_empty() || usize::from(factor as u16) > machines.len() {
            return Err((
                ErrorCode::InvalidReplicationFactor,
                format!("Replication factor: {factor} larger than available brokers: {}.", machines.len()),
            ));
        }
        let mut per_machine: BTreeMap<u64, usize> = BTreeMap::new();
        let mut per_rack: BTreeMap<Option<&str>, usize> = BTreeMap::new();
        let mut placed = Vec::with_capacity(count);
        for _ in 0..count {
            let &(leader, machine, rack) = live
                .iter()
                .min_by_key(|(node, machine, rack)| {
                    (
                        self.leaders.get(node).copied().unwrap_or(0),
                        per_rack.get(rack).copied().unwrap_or(0),
                        per_machine.get(machine).copied().unwrap_or(0),
                        *node,
                    )
                })
                .expect("live is not empty");
            *per_rack.entry(rack).or_default() += 1;
            *per_machine.entry(machine).or_default() += 1;
            *self.leaders.entry(leader).or_default() += 1;
            *self.replicas.entry(leader).or_default() += 1;
            let mut replicas = vec![leader];
            let mut used_machines = vec![machine];
            let mut used_racks = vec![rack];
            while replicas.len() < factor as usize {
                let &(node, machine, rack) = live
                    .iter()
                    .filter(|(_, machine, _)| !used_machines.contains(machine))
                    .min_by_key(|(node, _, rack)| {
                        (used_racks.contains(rack), self.replicas.get(node).copied().unwrap_or(0), *node)
                    })
                    .expect("enough machines, checked above");
                *self.replicas.entry(node).or_default() += 1;
                replicas.push(node);
                used_machines.push(machine);
                used_racks.push(rack);
            }
            placed.push(replicas);
        }
        Ok(placed)
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
        ControlContext {
            default_partitions: 1,
            default_replication_factor: 1,
            check_topic_configs: &check_nothing,
            salt: 7,
        }
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
        assert!(partitions.iter().all(|p| p.replicas == [2] && p.isr == [2]), "machine 2 keeps only node 2");
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
        assert!(refused.1.contains("still holds a replica of partition 0 of topic t"), "{refused:?}");
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

    fn partition(image: &ClusterImage, name: &str, index: usize) -> super::super::image::PartitionImage {
        (*image.topic(name).unwrap().partitions[index]).clone()
    }

    fn epoch_of(image: &ClusterImage, machine: u64) -> u64 {
        image.machines.iter().find(|(id, _)| id.get() == machine).unwrap().1.epoch
    }

    #[test]
    fn replicas_go_to_distinct_machines_and_to_each_rack() {
        let image = cluster();
        let request = TopicRequest { replication_factor: 2, ..topic("t", 6) };
        let image = commit(&image, &create_topics(&image, &[request], &context()).records);
        for p in &image.topic("t").unwrap().partitions {
            assert_eq!(p.replicas.len(), 2);
            assert_eq!(p.isr, p.replicas, "a new partition's ISR is all of its replicas");
            assert_eq!(p.leader, p.replicas[0]);
            let machines: BTreeSet<u64> = p.replicas.iter().map(|n| machine_of(&image, *n)).collect();
            assert_eq!(machines.len(), 2, "{p:?}");
            assert!(machines.contains(&3), "racks a and b both hold a replica (b is machine 3 alone): {p:?}");
        }
        let too_many = create_topics(&image, &[TopicRequest { replication_factor: 4, ..topic("u", 1) }], &context());
        assert_eq!(too_many.items[0].error, ErrorCode::InvalidReplicationFactor);
        assert!(too_many.records.is_empty());
        let same_machine = TopicRequest { partitions: -1, assignments: vec![(0, vec![0, 1])], ..topic("v", -1) };
        let refused = create_topics(&image, &[same_machine], &context());
        assert_eq!(refused.items[0].error, ErrorCode::InvalidReplicaAssignment, "nodes 0 and 1 are one machine's");
    }

    #[test]
    fn fencing_a_leader_elects_the_next_in_sync_replica_and_the_last_one_waits_for_its_return() {
        let image = cluster();
        let request = TopicRequest { partitions: -1, assignments: vec![(0, vec![0, 2, 4])], ..topic("t", -1) };
        let image = commit(&image, &create_topics(&image, &[request], &context()).records);
        let image = commit(&image, &fence_machine(&image, 1));
        let p = partition(&image, "t", 0);
        assert_eq!((p.leader, p.isr.clone(), p.leader_epoch), (2, vec![2, 4], 1), "the next in assignment order");
        let image = commit(&image, &fence_machine(&image, 2));
        let p = partition(&image, "t", 0);
        assert_eq!((p.leader, p.isr.clone(), p.leader_epoch), (4, vec![4], 2));
        let image = commit(&image, &fence_machine(&image, 3));
        let p = partition(&image, "t", 0);
        assert_eq!((p.leader, p.isr.clone(), p.leader_epoch), (4, vec![4], 2), "no clean leader: kept as it is");
        let image = commit(&image, &unfence_machine(&image, 1));
        assert_eq!(partition(&image, "t", 0).leader, 4, "node 0 is not in the ISR: never an unclean election");
        let image = commit(&image, &unfence_machine(&image, 3));
        let p = partition(&image, "t", 0);
        assert_eq!((p.leader, p.leader_epoch), (4, 2), "the last in-sync replica serves again, in its epoch");
    }

    #[test]
    fn preferred_elections_and_the_balancer_move_leadership_back_once_the_preferred_replica_is_in_sync() {
        let image = cluster();
        let request = TopicRequest { partitions: -1, assignments: vec![(0, vec![0, 2])], ..topic("t", -1) };
        let image = commit(&image, &create_topics(&image, &[request], &context()).records);
        let wanted = [("t".to_string(), vec![0, 5])];
        let (records, answers) = elect_leaders(&image, false, Some(&wanted));
        assert!(records.is_empty());
        assert_eq!(answers[0].2, ErrorCode::ElectionNotNeeded);
        assert_eq!(answers[1].2, ErrorCode::UnknownTopicOrPartition);
        let image = commit(&image, &fence_machine(&image, 1));
        assert_eq!(partition(&image, "t", 0).leader, 2);
        let (_, answers) = elect_leaders(&image, false, None);
        assert_eq!(answers[0].2, ErrorCode::PreferredLeaderNotAvailable, "node 0 is fenced and out of the ISR");
        assert!(balance_leaders(&image, 10).is_empty());
        let image = commit(&image, &unfence_machine(&image, 1));
        assert!(balance_leaders(&image, 10).is_empty(), "back, but not in the ISR yet");
        let id = image.topic_ids["t"];
        let p = partition(&image, "t", 0);
        let grow = IsrChange {
            topic_id: id,
            partition: 0,
            leader: 2,
            machine_epoch: epoch_of(&image, 2),
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            isr: vec![2, 0],
        };
        let image = commit(&image, &alter_isr(&image, &grow).unwrap());
        let (records, answers) = elect_leaders(&image, false, None);
        assert_eq!(answers[0].2, ErrorCode::None);
        assert_eq!(records, balance_leaders(&image, 10), "the balancer does what the election does");
        let image = commit(&image, &records);
        assert_eq!(partition(&image, "t", 0).leader, 0);
    }

    #[test]
    fn an_unclean_election_happens_only_where_the_topic_allows_it() {
        let image = cluster();
        for (name, unclean) in [("clean", "false"), ("unclean", "true")] {
            let configs = [(UNCLEAN_CONFIG.to_string(), unclean.to_string())].into();
            let request =
                TopicRequest { partitions: -1, configs, assignments: vec![(0, vec![0, 2])], ..topic(name, -1) };
            let decision = create_topics(&image, &[request], &context());
            assert!(decision.items[0].error.is_ok());
            let image2 = commit(&image, &decision.records);
            // Node 2 falls out of the ISR; then node 0's machine dies.
            let id = image2.topic_ids[name];
            let p = partition(&image2, name, 0);
            let shrink = IsrChange {
                topic_id: id,
                partition: 0,
                leader: 0,
                machine_epoch: epoch_of(&image2, 1),
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                isr: vec![0],
            };
            let image2 = commit(&image2, &alter_isr(&image2, &shrink).unwrap());
            let image2 = commit(&image2, &fence_machine(&image2, 1));
            let p = partition(&image2, name, 0);
            if unclean == "true" {
                assert_eq!((p.leader, p.isr.clone()), (2, vec![2]), "{name}: the out-of-sync replica leads");
            } else {
                assert_eq!((p.leader, p.isr.clone()), (0, vec![0]), "{name}: kept for its in-sync replica");
                let (records, answers) = elect_leaders(&image2, true, None);
                assert_eq!(answers.iter().find(|a| a.0 == name).unwrap().2, ErrorCode::None, "an admin may force it");
                let forced = commit(&image2, &records);
                assert_eq!(partition(&forced, name, 0).isr, vec![2]);
            }
        }
    }

    #[test]
    fn a_restarted_machine_leaves_the_isrs_and_leaderships_it_had() {
        let image = cluster();
        let request = TopicRequest { partitions: -1, assignments: vec![(0, vec![0, 2])], ..topic("t", -1) };
        let image = commit(&image, &create_topics(&image, &[request], &context()).records);
        let again = register_machine(&image, 1, 2, Some("a".into()), &endpoints(1, 2), None).unwrap();
        let image = commit(&image, &again);
        let p = partition(&image, "t", 0);
        assert_eq!((p.leader, p.isr.clone()), (2, vec![2]), "what it held before the restart is not vouched for");
    }

    #[test]
    fn an_isr_change_needs_the_current_leader_epochs_and_serving_replicas() {
        let image = cluster();
        let request = TopicRequest { partitions: -1, assignments: vec![(0, vec![0, 2, 4])], ..topic("t", -1) };
        let image = commit(&image, &create_topics(&image, &[request], &context()).records);
        let id = image.topic_ids["t"];
        let change = IsrChange {
            topic_id: id,
            partition: 0,
            leader: 0,
            machine_epoch: epoch_of(&image, 1),
            leader_epoch: 0,
            partition_epoch: 0,
            isr: vec![0, 2],
        };
        let shrunk = commit(&image, &alter_isr(&image, &change).unwrap());
        assert_eq!(partition(&shrunk, "t", 0).isr, vec![0, 2]);
        assert_eq!(alter_isr(&shrunk, &change).unwrap_err().0, ErrorCode::InvalidUpdateVersion, "made on epoch 0");
        let stale_leader = IsrChange { leader_epoch: 7, ..change.clone() };
        assert_eq!(alter_isr(&image, &stale_leader).unwrap_err().0, ErrorCode::FencedLeaderEpoch);
        let restarted = IsrChange { machine_epoch: 999, ..change.clone() };
        assert_eq!(alter_isr(&image, &restarted).unwrap_err().0, ErrorCode::StaleBrokerEpoch);
        let without_leader = IsrChange { isr: vec![2, 4], ..change.clone() };
        assert_eq!(alter_isr(&image, &without_leader).unwrap_err().0, ErrorCode::InvalidRequest);
        // Machine 3 fenced: node 4 cannot join again (KIP-841).
        let fenced =
            commit(&shrunk, &[MetadataRecord::FenceMachine { machine: 3, machine_epoch: epoch_of(&shrunk, 3) }]);
        let grow = IsrChange { partition_epoch: 1, isr: vec![0, 2, 4], ..change };
        assert_eq!(alter_isr(&fenced, &grow).unwrap_err().0, ErrorCode::IneligibleReplica);
        assert!(alter_isr(&shrunk, &grow).is_ok());
    }

    fn moving(topic: &str, partition: i32, replicas: Option<Vec<i32>>) -> MoveRequest {
        MoveRequest { topic: topic.into(), partition, replicas }
    }

    /// Topic "t", one partition on nodes 0 and 2 (machines 1 and 2).
    fn two_replicas() -> ClusterImage {
        let image = cluster();
        let request = TopicRequest { partitions: -1, assignments: vec![(0, vec![0, 2])], ..topic("t", -1) };
        commit(&image, &create_topics(&image, &[request], &context()).records)
    }

    fn leader_grows_isr(image: &ClusterImage, isr: Vec<i32>) -> ClusterImage {
        let registered = partition(image, "t", 0);
        let change = IsrChange {
            topic_id: image.topic_ids["t"],
            partition: 0,
            leader: registered.leader,
            machine_epoch: epoch_of(image, machine_of(image, registered.leader)),
            leader_epoch: registered.leader_epoch,
            partition_epoch: registered.partition_epoch,
            isr,
        };
        commit(image, &alter_isr(image, &change).unwrap())
    }

    #[test]
    fn a_move_adds_the_new_replicas_as_followers_and_completes_once_they_are_in_sync() {
        let image = two_replicas();
        let id = image.topic_ids["t"];
        let decision = alter_reassignments(&image, &[moving("t", 0, Some(vec![2, 4]))]);
        assert_eq!(decision.items[0].error, ErrorCode::None, "{:?}", decision.items);
        let started = commit(&image, &decision.records);
        let p = partition(&started, "t", 0);
        assert_eq!(p.replicas, vec![2, 4, 0], "the target, then the replicas it drops");
        assert_eq!((p.leader, p.isr.clone()), (0, vec![0, 2]), "the leader stays while the new replica copies");
        assert_eq!(started.reassignments[&(id, 0)], Reassignment { target: vec![2, 4], original: vec![0, 2] });
        // Node 4 catches up: the leader's AlterPartition completes the move.
        let done = leader_grows_isr(&started, vec![0, 2, 4]);
        let p = partition(&done, "t", 0);
        assert_eq!(p.replicas, vec![2, 4]);
        assert_eq!(p.isr, vec![2, 4]);
        assert_eq!(p.leader, 2, "a removed leader hands over to the first target replica in sync");
        assert!(p.leader_epoch > 0);
        assert!(done.reassignments.is_empty());
    }

    #[test]
    fn a_move_to_fewer_replicas_that_are_in_sync_completes_at_once() {
        let image = two_replicas();
        let done = commit(&image, &alter_reassignments(&image, &[moving("t", 0, Some(vec![2]))]).records);
        let p = partition(&done, "t", 0);
        assert_eq!((p.replicas.clone(), p.isr.clone(), p.leader), (vec![2], vec![2], 2));
        assert!(done.reassignments.is_empty());
    }

    #[test]
    fn a_cancelled_move_returns_to_the_original_replicas() {
        let image = two_replicas();
        let started = commit(&image, &alter_reassignments(&image, &[moving("t", 0, Some(vec![4, 2]))]).records);
        assert_eq!(partition(&started, "t", 0).replicas, vec![4, 2, 0]);
        let cancelled = commit(&started, &alter_reassignments(&started, &[moving("t", 0, None)]).records);
        let p = partition(&cancelled, "t", 0);
        assert_eq!((p.replicas.clone(), p.isr.clone(), p.leader), (vec![0, 2], vec![0, 2], 0));
        assert!(cancelled.reassignments.is_empty());
        let again = alter_reassignments(&cancelled, &[moving("t", 0, None)]);
        assert_eq!(again.items[0].error, ErrorCode::NoReassignmentInProgress);
        assert!(again.records.is_empty());
    }

    #[test]
    fn a_new_move_of_a_moving_partition_starts_from_its_original_replicas() {
        let image = two_replicas();
        let first = commit(&image, &alter_reassignments(&image, &[moving("t", 0, Some(vec![0, 4]))]).records);
        assert_eq!(partition(&first, "t", 0).replicas, vec![0, 4, 2]);
        let second = commit(&first, &alter_reassignments(&first, &[moving("t", 0, Some(vec![0, 5]))]).records);
        let id = second.topic_ids["t"];
        assert_eq!(partition(&second, "t", 0).replicas, vec![0, 5, 2], "node 4 of the replaced move is dropped");
        assert_eq!(second.reassignments[&(id, 0)].original, vec![0, 2]);
    }

    #[test]
    fn moves_that_cannot_be_placed_are_refused_and_change_nothing() {
        let image = two_replicas();
        let refused = [
            (moving("t", 0, Some(vec![0, 99])), ErrorCode::InvalidReplicaAssignment, "an unknown node"),
            (moving("t", 0, Some(vec![4, 5])), ErrorCode::InvalidReplicaAssignment, "two cores of one machine"),
            (moving("t", 0, Some(vec![0, 1])), ErrorCode::InvalidReplicaAssignment, "node 1 shares node 0's machine"),
            (moving("t", 0, Some(vec![])), ErrorCode::InvalidReplicaAssignment, "no replicas"),
            (moving("t", 7, Some(vec![0])), ErrorCode::UnknownTopicOrPartition, "no partition 7"),
            (moving("nope", 0, Some(vec![0])), ErrorCode::UnknownTopicOrPartition, "no topic"),
        ];
        for (request, error, why) in refused {
            let decision = alter_reassignments(&image, &[request]);
            assert_eq!(decision.items[0].error, error, "{why}: {:?}", decision.items);
            assert!(decision.records.is_empty(), "{why}");
        }
    }
}
