//! The cluster image built from the metadata log (issue 29): machines and
//! their nodes, topics and partition registrations, dynamic configs and the
//! producer-id watermark, with the (offset, epoch) of the last record
//! applied. Like KRaft's MetadataLoader, a machine replays committed records
//! into a `MetadataDelta` and publishes the delta's image to its cores; the
//! delta also says what changed, so a core opens and closes only the
//! partitions that moved.
//!
//! Copy on write: topics and partitions sit behind `Arc`s, so a delta
//! copies only the maps and the topics it touches, never every partition.
//! Snapshots (`encode_snapshot`) are rkyv, for Raft log compaction and
//! followers that fall behind.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rkyv::{Archive, Deserialize, Serialize};

use super::ids::MachineId;
use super::metadata::NodeId;
use super::records::{
    ConfigResource, MachineRegistration, MetadataRecord, PartitionChange, PartitionRecord, Reassignment, StoredScram,
};

pub type TopicId = [u8; 16];

/// The log position of the last record an image holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Archive, Serialize, Deserialize)]
pub struct Provenance {
    /// Raft log index.
    pub offset: u64,
    /// Raft term of that entry.
    pub epoch: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterImage {
    pub provenance: Provenance,
    pub cluster_id: String,
    pub machines: BTreeMap<MachineId, Arc<MachineImage>>,
    pub nodes: BTreeMap<NodeId, NodePlacement>,
    pub topics: BTreeMap<TopicId, Arc<TopicImage>>,
    pub topic_ids: BTreeMap<String, TopicId>,
    pub configs: ConfigsImage,
    /// The first producer id not yet handed out.
    pub producer_id_next: i64,
    /// Above every node id ever registered: ids are never reused.
    pub node_id_next: i32,
    /// Partitions moving to other replicas (KIP-455), by topic and index.
    pub reassignments: BTreeMap<(TopicId, i32), Reassignment>,
    /// SCRAM credentials by user and Kafka mechanism type (1 SHA-256,
    /// 2 SHA-512).
    pub scram: BTreeMap<(String, i8), StoredScram>,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct MachineImage {
    /// The offset of its RegisterMachine record.
    pub epoch: u64,
    pub incarnation: u64,
    pub rack: Option<String>,
    pub fenced: bool,
    pub nodes: Vec<i32>,
}

/// Where a node runs: placement is (machine, core).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct NodePlacement {
    pub machine: u64,
    pub core: u32,
    pub host: String,
    pub port: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicImage {
    pub name: String,
    pub id: TopicId,
    /// Indexed by partition id.
    pub partitions: Vec<Arc<PartitionImage>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct PartitionImage {
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// -1: no leader.
    pub leader: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct ConfigsImage {
    /// Cluster-wide dynamic broker configs.
    pub cluster: BTreeMap<String, String>,
    pub nodes: BTreeMap<i32, BTreeMap<String, String>>,
    pub topics: BTreeMap<String, BTreeMap<String, String>>,
}

/// What a delta changed, for the cores to act on without diffing images.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Partitions created or whose registration changed.
    pub partitions: BTreeSet<(TopicId, i32)>,
    /// Topics removed, with their names.
    pub removed_topics: BTreeMap<TopicId, String>,
    /// Topics whose configs changed.
    pub topic_configs: BTreeSet<String>,
    /// Dynamic broker configs changed (cluster-wide or for some node).
    pub broker_configs: bool,
    pub machines: BTreeSet<MachineId>,
}

/// `image` with one committed record batch (a Raft entry's bytes) replayed
/// at `at`, and what changed; why not when the batch does not decode or a
/// record does not fit. Voters and observers apply entries the same way.
pub fn replay_batch(image: &ClusterImage, at: Provenance, data: &[u8]) -> Result<(ClusterImage, Changes), String> {
    let records = super::records::decode_batch(data).map_err(|e| e.to_string())?;
    let mut delta = MetadataDelta::new(image);
    for record in &records {
        delta.replay(at, record).map_err(|e| e.to_string())?;
    }
    Ok(delta.finish())
}

impl Changes {
    /// Adds what a later delta changed.
    pub fn merge(&mut self, later: Changes) {
        self.partitions.extend(later.partitions);
        self.removed_topics.extend(later.removed_topics);
        self.topic_configs.extend(later.topic_configs);
        self.broker_configs |= later.broker_configs;
        self.machines.extend(later.machines);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    #[error("record at {at:?} does not follow the last one at {last:?}")]
    OutOfOrder { last: Provenance, at: Provenance },
    #[error("machine id 0 names no machine")]
    ZeroMachine,
    #[error("machine {0} is not registered")]
    UnknownMachine(u64),
    #[error("machine {machine} epoch {given} is stale (registered at {current})")]
    StaleMachineEpoch { machine: u64, given: u64, current: u64 },
    #[error("machine {machine} holds a replica of partition {partition} of topic {topic} and cannot leave")]
    MachineStillLeads { machine: u64, topic: String, partition: i32 },
    #[error("node {node} is already registered by machine {owner}")]
    NodeTaken { node: i32, owner: u64 },
    #[error("topic {0} already exists")]
    TopicExists(String),
    #[error("no topic with id {0:02x?}")]
    UnknownTopic(TopicId),
    #[error("partition {partition} is out of sequence for a topic of {count}")]
    PartitionOutOfSequence { partition: i32, count: usize },
    #[error("partition {1} of topic {0:02x?} does not exist")]
    UnknownPartition(TopicId, i32),
}

/// Records replayed on top of a base image.
#[derive(Debug)]
pub struct MetadataDelta {
    next: ClusterImage,
    changes: Changes,
}

impl MetadataDelta {
    pub fn new(base: &ClusterImage) -> Self {
        Self { next: base.clone(), changes: Changes::default() }
    }

    /// Replays one committed record at `at`. Positions only increase
    /// (several records of one batch share a position). A refused record
    /// leaves the delta as it was.
    pub fn replay(&mut self, at: Provenance, record: &MetadataRecord) -> Result<(), ReplayError> {
        if at < self.next.provenance {
            return Err(ReplayError::OutOfOrder { last: self.next.provenance, at });
        }
        match record {
            MetadataRecord::ClusterCreated { cluster_id } => self.next.cluster_id = cluster_id.clone(),
            MetadataRecord::RegisterMachine(registration) => self.register(at, registration)?,
            MetadataRecord::FenceMachine { machine, machine_epoch } => {
                self.machine_mut(*machine, *machine_epoch)?.fenced = true
            }
            MetadataRecord::UnfenceMachine { machine, machine_epoch } => {
                self.machine_mut(*machine, *machine_epoch)?.fenced = false
            }
            MetadataRecord::UnregisterMachine { machine, machine_epoch } => {
                self.unregister(*machine, *machine_epoch)?
            }
            MetadataRecord::Topic { name, topic_id } => self.add_topic(name, *topic_id)?,
            MetadataRecord::Partition(partition) => self.add_partition(partition)?,
            MetadataRecord::PartitionChange(change) => self.change_partition(change)?,
            MetadataRecord::RemoveTopic { topic_id } => self.remove_topic(*topic_id)?,
            MetadataRecord::Config { resource, name, value } => self.set_config(resource, name, value.as_deref()),
            MetadataRecord::ProducerIds { machine, machine_epoch, next_producer_id } => {
                self.machine_mut(*machine, *machine_epoch)?;
                self.next.producer_id_next = self.next.producer_id_next.max(*next_producer_id);
            }
            MetadataRecord::Reassignment { topic_id, partition, moving } => {
                let exists = self
                    .next
                    .topics
                    .get(topic_id)
                    .is_some_and(|t| usize::try_from(*partition).is_ok_and(|i| i < t.partitions.len()));
                if !exists {
                    return Err(ReplayError::UnknownPartition(*topic_id, *partition));
                }
                match moving {
                    Some(moving) => self.next.reassignments.insert((*topic_id, *partition), moving.clone()),
                    None => self.next.reassignments.remove(&(*topic_id, *partition)),
                };
                self.changes.partitions.insert((*topic_id, *partition));
            }
            MetadataRecord::ScramCredential { user, mechanism, credential } => match credential {
                Some(credential) => {
                    self.next.scram.insert((user.clone(), *mechanism), (**credential).clone());
                }
                None => {
                    self.next.scram.remove(&(user.clone(), *mechanism));
                }
            },
        }
        self.next.provenance = at;
        Ok(())
    }

    /// The image with every replayed record, and what changed.
    pub fn finish(self) -> (ClusterImage, Changes) {
        (self.next, self.changes)
    }

    fn register(&mut self, at: Provenance, registration: &MachineRegistration) -> Result<(), ReplayError> {
        let id = MachineId::new(registration.machine).ok_or(ReplayError::ZeroMachine)?;
        for node in &registration.nodes {
            if let Some(owner) = self.next.nodes.get(&NodeId(node.node_id)) {
                if owner.machine != registration.machine {
                    return Err(ReplayError::NodeTaken { node: node.node_id, owner: owner.machine });
                }
            }
        }
        if let Some(old) = self.next.machines.get(&id) {
            for node in &old.nodes {
                self.next.nodes.remove(&NodeId(*node));
            }
        }
        for node in &registration.nodes {
            self.next.node_id_next = self.next.node_id_next.max(node.node_id.saturating_add(1));
            let placement = NodePlacement {
                machine: registration.machine,
                core: node.core,
                host: node.host.clone(),
                port: node.port,
            };
            self.next.nodes.insert(NodeId(node.node_id), placement);
        }
        let machine = MachineImage {
            epoch: at.offset,
            incarnation: registration.incarnation,
            rack: registration.rack.clone(),
            // A machine serves once the controller unfences it (KIP-631).
            fenced: true,
            nodes: registration.nodes.iter().map(|n| n.node_id).collect(),
        };
        self.next.machines.insert(id, Arc::new(machine));
        self.changes.machines.insert(id);
        Ok(())
    }

    fn machine_mut(&mut self, machine: u64, machine_epoch: u64) -> Result<&mut MachineImage, ReplayError> {
        let id = MachineId::new(machine).ok_or(ReplayError::ZeroMachine)?;
        let entry = self.next.machines.get_mut(&id).ok_or(ReplayError::UnknownMachine(machine))?;
        if entry.epoch != machine_epoch {
            return Err(ReplayError::StaleMachineEpoch { machine, given: machine_epoch, current: entry.epoch });
        }
        self.changes.machines.insert(id);
        Ok(Arc::make_mut(entry))
    }

    fn unregister(&mut self, machine: u64, machine_epoch: u64) -> Result<(), ReplayError> {
        let nodes = self.machine_mut(machine, machine_epoch)?.nodes.clone();
        for topic in self.next.topics.values() {
            for (index, partition) in topic.partitions.iter().enumerate() {
                if partition.leader >= 0 && nodes.contains(&partition.leader)
                    || partition.replicas.iter().any(|n| nodes.contains(n))
                {
                    return Err(ReplayError::MachineStillLeads {
                        machine,
                        topic: topic.name.clone(),
                        partition: index as i32,
                    });
                }
            }
        }
        for node in nodes {
            self.next.nodes.remove(&NodeId(node));
        }
        let id = MachineId::new(machine).expect("checked by machine_mut");
        self.next.machines.remove(&id);
        Ok(())
    }

    fn add_topic(&mut self, name: &str, topic_id: TopicId) -> Result<(), ReplayError> {
        if self.next.topic_ids.contains_key(name) || self.next.topics.contains_key(&topic_id) {
            return Err(ReplayError::TopicExists(name.into()));
        }
        let topic = TopicImage { name: name.into(), id: topic_id, partitions: Vec::new() };
        self.next.topics.insert(topic_id, Arc::new(topic));
        self.next.topic_ids.insert(name.into(), topic_id);
        self.changes.removed_topics.remove(&topic_id);
        Ok(())
    }

    fn add_partition(&mut self, record: &PartitionRecord) -> Result<(), ReplayError> {
        let topic = self.next.topics.get_mut(&record.topic_id).ok_or(ReplayError::UnknownTopic(record.topic_id))?;
        let count = topic.partitions.len();
        if usize::try_from(record.partition).ok() != Some(count) {
            return Err(ReplayError::PartitionOutOfSequence { partition: record.partition, count });
        }
        Arc::make_mut(topic).partitions.push(Arc::new(PartitionImage {
            replicas: record.replicas.clone(),
            isr: record.isr.clone(),
            leader: record.leader,
            leader_epoch: record.leader_epoch,
            partition_epoch: record.partition_epoch,
        }));
        self.changes.partitions.insert((record.topic_id, record.partition));
        Ok(())
    }

    fn change_partition(&mut self, change: &PartitionChange) -> Result<(), ReplayError> {
        let topic = self.next.topics.get_mut(&change.topic_id).ok_or(ReplayError::UnknownTopic(change.topic_id))?;
        let index = usize::try_from(change.partition)
            .ok()
            .filter(|i| *i < topic.partitions.len())
            .ok_or(ReplayError::UnknownPartition(change.topic_id, change.partition))?;
        let partition = Arc::make_mut(&mut Arc::make_mut(topic).partitions[index]);
        if let Some(leader) = change.leader {
            if leader != partition.leader {
                partition.leader = leader;
                partition.leader_epoch += 1;
            }
        }
        if let Some(isr) = &change.isr {
            partition.isr = isr.clone();
        }
        if let Some(replicas) = &change.replicas {
            partition.replicas = replicas.clone();
        }
        partition.partition_epoch += 1;
        self.changes.partitions.insert((change.topic_id, change.partition));
        Ok(())
    }

    fn remove_topic(&mut self, topic_id: TopicId) -> Result<(), ReplayError> {
        let topic = self.next.topics.remove(&topic_id).ok_or(ReplayError::UnknownTopic(topic_id))?;
        self.next.topic_ids.remove(&topic.name);
        self.next.configs.topics.remove(&topic.name);
        self.next.reassignments.retain(|(id, _), _| *id != topic_id);
        self.changes.partitions.retain(|(id, _)| *id != topic_id);
        self.changes.removed_topics.insert(topic_id, topic.name.clone());
        Ok(())
    }

    fn set_config(&mut self, resource: &ConfigResource, name: &str, value: Option<&str>) {
        let configs = &mut self.next.configs;
        let map = match resource {
            ConfigResource::Topic(topic) => {
                self.changes.topic_configs.insert(topic.clone());
                configs.topics.entry(topic.clone()).or_default()
            }
            ConfigResource::Broker(None) => {
                self.changes.broker_configs = true;
                &mut configs.cluster
            }
            ConfigResource::Broker(Some(node)) => {
                self.changes.broker_configs = true;
                configs.nodes.entry(*node).or_default()
            }
        };
        match value {
            Some(value) => map.insert(name.into(), value.into()),
            None => map.remove(name),
        };
        configs.topics.retain(|_, m| !m.is_empty());
        configs.nodes.retain(|_, m| !m.is_empty());
    }
}

impl ClusterImage {
    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topic_ids.get(name).and_then(|id| self.topics.get(id)).map(Arc::as_ref)
    }

    pub fn partition_count(&self) -> usize {
        self.topics.values().map(|t| t.partitions.len()).sum()
    }
}

/// The persisted form of an image: plain vectors, no `Arc`s.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
struct Snapshot {
    provenance: Provenance,
    cluster_id: String,
    machines: Vec<(u64, MachineImage)>,
    nodes: Vec<(i32, NodePlacement)>,
    topics: Vec<SnapshotTopic>,
    configs: ConfigsImage,
    producer_id_next: i64,
    node_id_next: i32,
}

/// `Snapshot` with the moves in progress (format 2).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
struct SnapshotV2 {
    base: Snapshot,
    reassignments: Vec<(TopicId, i32, Reassignment)>,
}

/// `SnapshotV2` with the SCRAM credentials (format 3).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
struct SnapshotV3 {
    v2: SnapshotV2,
    scram: Vec<(String, i8, StoredScram)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
struct SnapshotTopic {
    name: String,
    id: TopicId,
    partitions: Vec<PartitionImage>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("metadata snapshot: {0}")]
    Damaged(&'static str),
    #[error("metadata snapshot does not decode: {0}")]
    Decode(String),
    #[error("metadata snapshot names machine 0")]
    ZeroMachine,
}

/// Formats 1 (`Snapshot`) and 2 (`SnapshotV2`) are still read; format 3
/// (`SnapshotV3`) is written.
const SNAPSHOT_MAGIC_V1: &[u8; 8] = b"SLSNAP01";
const SNAPSHOT_MAGIC_V2: &[u8; 8] = b"SLSNAP02";
const SNAPSHOT_MAGIC: &[u8; 8] = b"SLSNAP03";

/// `SNAPSHOT_MAGIC | crc32c (of payload) | rkyv payload`.
pub fn encode_snapshot(image: &ClusterImage) -> Vec<u8> {
    let snapshot = SnapshotV3 {
        v2: SnapshotV2 {
            base: Snapshot::of(image),
            reassignments: image.reassignments.iter().map(|((id, p), moving)| (*id, *p, moving.clone())).collect(),
        },
        scram: image.scram.iter().map(|((user, kind), c)| (user.clone(), *kind, c.clone())).collect(),
    };
    let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&snapshot).expect("an image always serializes");
    let mut out = Vec::with_capacity(SNAPSHOT_MAGIC.len() + 4 + payload.len());
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

impl Snapshot {
    /// Everything of `image` but the moves in progress.
    fn of(image: &ClusterImage) -> Self {
        Snapshot {
            provenance: image.provenance,
            cluster_id: image.cluster_id.clone(),
            machines: image.machines.iter().map(|(id, m)| (id.get(), (**m).clone())).collect(),
            nodes: image.nodes.iter().map(|(id, p)| (id.0, p.clone())).collect(),
            topics: image
                .topics
                .values()
                .map(|t| SnapshotTopic {
                    name: t.name.clone(),
                    id: t.id,
                    partitions: t.partitions.iter().map(|p| (**p).clone()).collect(),
                })
                .collect(),
            configs: image.configs.clone(),
            producer_id_next: image.producer_id_next,
            node_id_next: image.node_id_next,
        }
    }
}

pub fn decode_snapshot(bytes: &[u8]) -> Result<ClusterImage, SnapshotError> {
    let header = SNAPSHOT_MAGIC.len() + 4;
    let magic = bytes.get(..SNAPSHOT_MAGIC.len());
    let format = [SNAPSHOT_MAGIC_V1, SNAPSHOT_MAGIC_V2, SNAPSHOT_MAGIC]
        .iter()
        .position(|m| magic == Some(m.as_slice()))
        .map(|i| i + 1);
    let Some(format) = format.filter(|_| bytes.len() >= header) else {
        return Err(SnapshotError::Damaged("bad header"));
    };
    let at = SNAPSHOT_MAGIC.len();
    let crc = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let payload = &bytes[header..];
    if crc32c::crc32c(payload) != crc {
        return Err(SnapshotError::Damaged("checksum mismatch"));
    }
    let mut aligned = rkyv::util::AlignedVec::<16>::new();
    aligned.extend_from_slice(payload);
    let decode_error = |e: rkyv::rancor::Error| SnapshotError::Decode(e.to_string());
    let (snapshot, reassignments, scram) = match format {
        1 => {
            (rkyv::from_bytes::<Snapshot, rkyv::rancor::Error>(&aligned).map_err(decode_error)?, Vec::new(), Vec::new())
        }
        2 => {
            let v2 = rkyv::from_bytes::<SnapshotV2, rkyv::rancor::Error>(&aligned).map_err(decode_error)?;
            (v2.base, v2.reassignments, Vec::new())
        }
        _ => {
            let v3 = rkyv::from_bytes::<SnapshotV3, rkyv::rancor::Error>(&aligned).map_err(decode_error)?;
            (v3.v2.base, v3.v2.reassignments, v3.scram)
        }
    };
    let mut machines = BTreeMap::new();
    for (id, machine) in snapshot.machines {
        machines.insert(MachineId::new(id).ok_or(SnapshotError::ZeroMachine)?, Arc::new(machine));
    }
    let topic_ids = snapshot.topics.iter().map(|t| (t.name.clone(), t.id)).collect();
    let topics = snapshot
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t.partitions.into_iter().map(Arc::new).collect();
            (t.id, Arc::new(TopicImage { name: t.name, id: t.id, partitions }))
        })
        .collect();
    Ok(ClusterImage {
        provenance: snapshot.provenance,
        cluster_id: snapshot.cluster_id,
        machines,
        nodes: snapshot.nodes.into_iter().map(|(id, p)| (NodeId(id), p)).collect(),
        topics,
        topic_ids,
        configs: snapshot.configs,
        producer_id_next: snapshot.producer_id_next,
        node_id_next: snapshot.node_id_next,
        reassignments: reassignments.into_iter().map(|(id, p, moving)| ((id, p), moving)).collect(),
        scram: scram.into_iter().map(|(user, kind, c)| ((user, kind), c)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::records::NodeRegistration;
    use super::*;

    fn at(offset: u64) -> Provenance {
        Provenance { offset, epoch: 1 }
    }

    fn register(machine: u64, first_node: i32, cores: u32) -> MetadataRecord {
        MetadataRecord::RegisterMachine(MachineRegistration {
            machine,
            incarnation: 1,
            rack: None,
            nodes: (0..cores)
                .map(|core| NodeRegistration {
                    node_id: first_node + core as i32,
                    core,
                    host: format!("10.0.0.{machine}"),
                    port: 9092 + core as i32,
                })
                .collect(),
        })
    }

    fn partition(topic_id: TopicId, partition: i32, leader: i32) -> MetadataRecord {
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

    fn replay_all(base: &ClusterImage, records: &[(u64, MetadataRecord)]) -> (ClusterImage, Changes) {
        let mut delta = MetadataDelta::new(base);
        for (offset, record) in records {
            delta.replay(at(*offset), record).unwrap_or_else(|e| panic!("{record:?}: {e}"));
        }
        delta.finish()
    }

    fn two_machines_one_topic() -> ClusterImage {
        replay_all(
            &ClusterImage::default(),
            &[
                (1, MetadataRecord::ClusterCreated { cluster_id: "c".into() }),
                (2, register(1, 0, 2)),
                (3, register(2, 2, 2)),
                (4, MetadataRecord::UnfenceMachine { machine: 1, machine_epoch: 2 }),
                (5, MetadataRecord::Topic { name: "t".into(), topic_id: [1; 16] }),
                (5, partition([1; 16], 0, 0)),
                (5, partition([1; 16], 1, 3)),
            ],
        )
        .0
    }

    #[test]
    fn replayed_records_build_machines_nodes_and_topics() {
        let image = two_machines_one_topic();
        assert_eq!(image.provenance, at(5));
        assert_eq!(image.cluster_id, "c");
        assert_eq!(image.nodes.len(), 4);
        assert_eq!(image.nodes[&NodeId(3)].machine, 2);
        let one = &image.machines[&MachineId::new(1).unwrap()];
        assert_eq!((one.epoch, one.fenced), (2, false));
        assert!(image.machines[&MachineId::new(2).unwrap()].fenced, "registered machines start fenced");
        let topic = image.topic("t").unwrap();
        assert_eq!(topic.partitions.iter().map(|p| p.leader).collect::<Vec<_>>(), vec![0, 3]);
    }

    #[test]
    fn a_leader_change_bumps_the_leader_epoch_and_an_isr_change_only_the_partition_epoch() {
        let base = two_machines_one_topic();
        let change = |leader: Option<i32>, isr: Option<Vec<i32>>| {
            MetadataRecord::PartitionChange(PartitionChange {
                topic_id: [1; 16],
                partition: 1,
                leader,
                isr,
                replicas: None,
            })
        };
        let (image, changes) = replay_all(&base, &[(6, change(None, Some(vec![]))), (7, change(Some(-1), None))]);
        let p = &image.topic("t").unwrap().partitions[1];
        assert_eq!((p.leader, p.leader_epoch, p.partition_epoch), (-1, 1, 2));
        assert!(p.isr.is_empty());
        assert_eq!(changes.partitions, BTreeSet::from([([1; 16], 1)]));
        // The base is untouched and shares the partition nobody changed.
        assert_eq!(base.topic("t").unwrap().partitions[1].leader, 3);
        assert!(Arc::ptr_eq(&base.topic("t").unwrap().partitions[0], &image.topic("t").unwrap().partitions[0]));
    }

    #[test]
    fn records_that_do_not_fit_the_image_are_refused_and_change_nothing() {
        let base = two_machines_one_topic();
        let refused = [
            (register(3, 1, 1), "node 1 belongs to machine 1"),
            (MetadataRecord::FenceMachine { machine: 1, machine_epoch: 1 }, "a stale machine epoch"),
            (MetadataRecord::FenceMachine { machine: 9, machine_epoch: 1 }, "an unknown machine"),
            (MetadataRecord::UnregisterMachine { machine: 1, machine_epoch: 2 }, "machine 1 leads partition 0"),
            (MetadataRecord::Topic { name: "t".into(), topic_id: [2; 16] }, "a second topic t"),
            (partition([1; 16], 5, 0), "partition 5 after 2 partitions"),
            (partition([9; 16], 0, 0), "an unknown topic"),
            (MetadataRecord::RemoveTopic { topic_id: [9; 16] }, "an unknown topic"),
            (MetadataRecord::ProducerIds { machine: 0, machine_epoch: 0, next_producer_id: 1 }, "machine 0"),
        ];
        for (record, why) in refused {
            let mut delta = MetadataDelta::new(&base);
            assert!(delta.replay(at(9), &record).is_err(), "{why}: {record:?}");
            let (image, _) = delta.finish();
            assert_eq!(image, base, "{why}");
        }
        let mut delta = MetadataDelta::new(&base);
        let earlier = MetadataRecord::ClusterCreated { cluster_id: "other".into() };
        assert!(matches!(delta.replay(at(4), &earlier), Err(ReplayError::OutOfOrder { .. })));
    }

    #[test]
    fn removing_a_topic_reports_it_and_drops_its_configs() {
        let base = replay_all(
            &two_machines_one_topic(),
            &[(
                6,
                MetadataRecord::Config {
                    resource: ConfigResource::Topic("t".into()),
                    name: "retention.ms".into(),
                    value: Some("1".into()),
                },
            )],
        )
        .0;
        assert_eq!(base.configs.topics["t"]["retention.ms"], "1");
        let (image, changes) = replay_all(&base, &[(7, MetadataRecord::RemoveTopic { topic_id: [1; 16] })]);
        assert!(image.topic("t").is_none() && image.configs.topics.is_empty());
        assert_eq!(changes.removed_topics, BTreeMap::from([([1; 16], "t".to_string())]));
    }

    #[test]
    fn a_machine_that_leads_nothing_can_leave_and_its_nodes_go_with_it() {
        let (image, _) = replay_all(&two_machines_one_topic(), &[(6, partition([1; 16], 2, 0))]);
        let mut delta = MetadataDelta::new(&image);
        let moved = MetadataRecord::PartitionChange(PartitionChange {
            topic_id: [1; 16],
            partition: 1,
            leader: Some(0),
            isr: Some(vec![0]),
            replicas: Some(vec![0]),
        });
        delta.replay(at(7), &moved).unwrap();
        delta.replay(at(8), &MetadataRecord::UnregisterMachine { machine: 2, machine_epoch: 3 }).unwrap();
        let (image, _) = delta.finish();
        assert_eq!(image.machines.len(), 1);
        assert_eq!(image.nodes.keys().copied().collect::<Vec<_>>(), vec![NodeId(0), NodeId(1)]);
    }

    #[test]
    fn configs_and_producer_ids_follow_their_records() {
        let config = |resource, value: Option<&str>| MetadataRecord::Config {
            resource,
            name: "log.retention.ms".into(),
            value: value.map(Into::into),
        };
        let (image, changes) = replay_all(
            &two_machines_one_topic(),
            &[
                (6, config(ConfigResource::Broker(None), Some("5"))),
                (7, config(ConfigResource::Broker(Some(1)), Some("6"))),
                (8, config(ConfigResource::Broker(Some(1)), None)),
                (9, MetadataRecord::ProducerIds { machine: 1, machine_epoch: 2, next_producer_id: 3000 }),
                (10, MetadataRecord::ProducerIds { machine: 1, machine_epoch: 2, next_producer_id: 2000 }),
            ],
        );
        assert_eq!(image.configs.cluster["log.retention.ms"], "5");
        assert!(image.configs.nodes.is_empty());
        assert!(changes.broker_configs);
        assert_eq!(image.producer_id_next, 3000, "the watermark never goes back");
    }

    #[test]
    fn a_snapshot_round_trips_and_a_damaged_one_is_refused() {
        let mut image = two_machines_one_topic();
        image.reassignments.insert(([1; 16], 0), Reassignment { target: vec![2, 3], original: vec![0] });
        let credential =
            StoredScram { salt: vec![1; 32], iterations: 4096, stored_key: vec![2; 32], server_key: vec![3; 32] };
        image.scram.insert(("alice".into(), 1), credential);
        let bytes = encode_snapshot(&image);
        assert_eq!(decode_snapshot(&bytes).unwrap(), image);
        for at in [0, 9, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(decode_snapshot(&bad).is_err(), "a flipped bit at byte {at} went unnoticed");
        }
    }

    #[test]
    fn a_snapshot_of_the_first_format_still_decodes() {
        let image = two_machines_one_topic();
        let v1 = Snapshot::of(&image);
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&v1).unwrap();
        let mut bytes = SNAPSHOT_MAGIC_V1.to_vec();
        bytes.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        assert_eq!(decode_snapshot(&bytes).unwrap(), image);
    }

    #[test]
    fn a_snapshot_of_the_second_format_still_decodes() {
        let mut image = two_machines_one_topic();
        image.reassignments.insert(([1; 16], 0), Reassignment { target: vec![2, 3], original: vec![0] });
        let v2 = SnapshotV2 {
            base: Snapshot::of(&image),
            reassignments: vec![([1; 16], 0, Reassignment { target: vec![2, 3], original: vec![0] })],
        };
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&v2).unwrap();
        let mut bytes = SNAPSHOT_MAGIC_V2.to_vec();
        bytes.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        assert_eq!(decode_snapshot(&bytes).unwrap(), image);
    }

    #[test]
    fn scram_credential_records_set_and_delete_a_users_credential() {
        let mut image = two_machines_one_topic();
        let credential =
            StoredScram { salt: vec![1; 32], iterations: 4096, stored_key: vec![2; 64], server_key: vec![3; 64] };
        let set = MetadataRecord::ScramCredential {
            user: "alice".into(),
            mechanism: 2,
            credential: Some(Box::new(credential.clone())),
        };
        image = replay_all(&image, &[(90, set)]).0;
        assert_eq!(image.scram.get(&("alice".to_string(), 2)), Some(&credential));
        assert_eq!(image.scram.get(&("alice".to_string(), 1)), None);
        let delete = MetadataRecord::ScramCredential { user: "alice".into(), mechanism: 2, credential: None };
        image = replay_all(&image, &[(91, delete)]).0;
        assert!(image.scram.is_empty());
    }
}
