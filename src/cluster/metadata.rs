//! The metadata image: nodes, topics, partition placement. Immutable once
//! built; a change produces a new image (see `controller`), which core 0
//! persists and sends to every core. Persisted with rkyv.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::ids::MachineId;
use super::image::ClusterImage;
use crate::constants::OFFSETS_TOPIC;

use rkyv::{Archive, Deserialize, Serialize};

/// A Kafka node id. Each core of each machine is its own node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Archive, Serialize, Deserialize)]
pub struct NodeId(pub i32);

/// A core's index within its machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Archive, Serialize, Deserialize)]
pub struct ShardId(pub u32);

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node_id: NodeId,
    pub host: String,
    pub port: i32,
    pub shard: ShardId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// The core that owns (leads) the partition; `bridge::NOT_LOCAL` when
    /// its leader is on another machine.
    pub shard: ShardId,
    pub leader_epoch: i32,
    /// The core that holds this machine's replica, leader or follower
    /// (a machine holds at most one); `NOT_LOCAL` when it holds none.
    /// Reads may be served there (KIP-392).
    pub replica: ShardId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub topic_id: [u8; 16],
    pub partitions: Vec<PartitionInfo>,
    /// Topic-level config overrides (Kafka names).
    pub configs: BTreeMap<String, String>,
}

/// The durable part of the image (what `metadata.rkyv` held before the
/// metadata log; `Stored*` below are that file's layout).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PersistedMetadata {
    pub cluster_id: String,
    pub topics: BTreeMap<String, TopicInfo>,
    /// First producer id of the next block to hand out.
    pub producer_id_next: i64,
    /// Dynamic broker configs set for the whole cluster (Kafka's broker
    /// resource with the empty name), by Kafka name.
    pub broker_configs: BTreeMap<String, String>,
    /// Dynamic broker configs set for one node (the broker resource named by
    /// its node id); they win over `broker_configs`.
    pub node_configs: BTreeMap<i32, BTreeMap<String, String>>,
}

/// `metadata.rkyv` as `SLMETA02` files hold it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
struct StoredMetadata {
    cluster_id: String,
    topics: BTreeMap<String, StoredTopic>,
    producer_id_next: i64,
    broker_configs: BTreeMap<String, String>,
    node_configs: BTreeMap<i32, BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
struct StoredTopic {
    name: String,
    topic_id: [u8; 16],
    partitions: Vec<StoredPartition>,
    configs: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
struct StoredPartition {
    shard: ShardId,
    leader_epoch: i32,
}

/// The format `SLMETA01` files hold (before dynamic broker configs); read
/// once at start and migrated.
#[derive(Debug, Clone, PartialEq, Eq, Default, Archive, Serialize, Deserialize)]
struct StoredMetadataV1 {
    cluster_id: String,
    topics: BTreeMap<String, StoredTopic>,
    producer_id_next: i64,
}

impl From<StoredMetadataV1> for StoredMetadata {
    fn from(old: StoredMetadataV1) -> Self {
        Self {
            cluster_id: old.cluster_id,
            topics: old.topics,
            producer_id_next: old.producer_id_next,
            ..Default::default()
        }
    }
}

impl From<StoredMetadata> for PersistedMetadata {
    fn from(stored: StoredMetadata) -> Self {
        let topics = stored
            .topics
            .into_iter()
            .map(|(name, topic)| {
                let partitions = topic
                    .partitions
                    .into_iter()
                    .map(|p| PartitionInfo { shard: p.shard, leader_epoch: p.leader_epoch, replica: p.shard })
                    .collect();
                (name, TopicInfo { name: topic.name, topic_id: topic.topic_id, partitions, configs: topic.configs })
            })
            .collect();
        Self {
            cluster_id: stored.cluster_id,
            topics,
            producer_id_next: stored.producer_id_next,
            broker_configs: stored.broker_configs,
            node_configs: stored.node_configs,
        }
    }
}

impl From<&PersistedMetadata> for StoredMetadata {
    fn from(metadata: &PersistedMetadata) -> Self {
        let topics = metadata
            .topics
            .iter()
            .map(|(name, topic)| {
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|p| StoredPartition { shard: p.shard, leader_epoch: p.leader_epoch })
                    .collect();
                let stored = StoredTopic {
                    name: topic.name.clone(),
                    topic_id: topic.topic_id,
                    partitions,
                    configs: topic.configs.clone(),
                };
                (name.clone(), stored)
            })
            .collect();
        Self {
            cluster_id: metadata.cluster_id.clone(),
            topics,
            producer_id_next: metadata.producer_id_next,
            broker_configs: metadata.broker_configs.clone(),
            node_configs: metadata.node_configs.clone(),
        }
    }
}

/// A consistent view of the cluster, shared read-only by the cores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataImage {
    pub version: u64,
    /// This machine's nodes, one per core, in core order.
    pub nodes: Vec<NodeInfo>,
    /// This machine's first node (the one a shared listener advertises).
    pub controller: NodeId,
    pub durable: PersistedMetadata,
    /// This machine.
    pub machine: MachineId,
    /// The whole cluster as committed: every machine's nodes and every
    /// partition's leader (copy on write, shared by the cores).
    pub cluster: Arc<ClusterImage>,
}

/// Where something (a partition's leader, a group's coordinator) lives,
/// seen from this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A core of this machine.
    Local(ShardId, NodeId),
    /// A node of another machine that is serving.
    Remote(NodeId),
    /// Nowhere now: no leader, or its machine is fenced or gone.
    Unavailable,
}

/// A node as clients see it in Metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingNode {
    pub node_id: NodeId,
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
}

impl MetadataImage {
    pub fn topic(&self, name: &str) -> Option<&TopicInfo> {
        self.durable.topics.get(name)
    }

    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionInfo> {
        let index = usize::try_from(partition).ok()?;
        self.topic(topic)?.partitions.get(index)
    }

    /// The node with this id, if it is one of the cluster's.
    pub fn node(&self, node_id: NodeId) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.node_id == node_id)
    }

    /// The dynamic broker configs that apply to `node`: its own over the
    /// cluster-wide ones.
    pub fn dynamic_broker_configs(&self, node: NodeId) -> crate::config::broker::DynamicConfigs<'_> {
        crate::config::broker::DynamicConfigs {
            cluster: &self.durable.broker_configs,
            node: self.durable.node_configs.get(&node.0),
        }
    }

    /// Where `node` runs, and whether it serves: a fenced machine's nodes
    /// do not.
    pub fn placement_of(&self, node: NodeId) -> Placement {
        let Some(placed) = self.cluster.nodes.get(&node) else {
            // An image built without the cluster (tests): local nodes only.
            return self
                .nodes
                .iter()
                .find(|n| n.node_id == node)
                .map_or(Placement::Unavailable, |n| Placement::Local(n.shard, n.node_id));
        };
        if placed.machine == self.machine.get() {
            return match self.nodes.iter().find(|n| n.node_id == node) {
                Some(local) => Placement::Local(local.shard, node),
                None => Placement::Unavailable,
            };
        }
        let serving =
            MachineId::new(placed.machine).and_then(|m| self.cluster.machines.get(&m)).is_some_and(|m| !m.fenced);
        if serving {
            Placement::Remote(node)
        } else {
            Placement::Unavailable
        }
    }

    /// Where each partition's leader of `topic` is, with its leader epoch,
    /// in partition order; empty for a topic that does not exist. The topic
    /// is looked up once and each leader node placed once, however many
    /// partitions it leads (Metadata asks this for every topic).
    pub fn leaders_of(&self, topic: &str) -> Vec<(Placement, i32)> {
        let Some(local) = self.topic(topic) else { return Vec::new() };
        let registered = self.cluster.topic_ids.get(topic).and_then(|id| self.cluster.topics.get(id));
        let mut placed: Vec<(i32, Placement)> = Vec::new();
        let mut place = |node: i32| -> Placement {
            if node < 0 {
                return Placement::Unavailable;
            }
            if let Some((_, placement)) = placed.iter().find(|(n, _)| *n == node) {
                return *placement;
            }
            let placement = self.placement_of(NodeId(node));
            placed.push((node, placement));
            placement
        };
        local
            .partitions
            .iter()
            .enumerate()
            .map(|(index, p)| match registered.and_then(|t| t.partitions.get(index)) {
                Some(registered) => (place(registered.leader), registered.leader_epoch),
                // No cluster image (tests): the local placement.
                None => {
                    let node = self.node_of_shard(p.shard);
                    (node.map_or(Placement::Unavailable, |n| Placement::Local(p.shard, n)), p.leader_epoch)
                }
            })
            .collect()
    }

    /// A partition's registered replicas and in-sync replicas (empty
    /// without a cluster image).
    pub fn replicas_of(&self, topic: &str, partition: i32) -> (Vec<i32>, Vec<i32>) {
        self.cluster
            .topic_ids
            .get(topic)
            .and_then(|id| self.cluster.topics.get(id))
            .and_then(|t| t.partitions.get(usize::try_from(partition).ok()?))
            .map_or((Vec::new(), Vec::new()), |p| (p.replicas.clone(), p.isr.clone()))
    }

    /// KIP-392: the in-sync follower in `rack` a consumer there should read
    /// `topic`/`partition` from instead of its leader; None when the leader
    /// is in that rack, no follower is, or the leader is not on this
    /// machine (the consumer asked a follower already).
    pub fn preferred_read_replica(&self, topic: &str, partition: i32, rack: &str) -> Option<NodeId> {
        let registered = self
            .cluster
            .topic_ids
            .get(topic)
            .and_then(|id| self.cluster.topics.get(id))
            .and_then(|t| t.partitions.get(usize::try_from(partition).ok()?))?;
        let machine_of = |node: i32| self.cluster.nodes.get(&NodeId(node)).map(|p| p.machine);
        let rack_of = |node: i32| {
            let machine = MachineId::new(machine_of(node)?)?;
            self.cluster.machines.get(&machine)?.rack.clone()
        };
        if machine_of(registered.leader) != Some(self.machine.get())
            || rack_of(registered.leader).as_deref() == Some(rack)
        {
            return None;
        }
        registered
            .isr
            .iter()
            .copied()
            .filter(|node| *node != registered.leader)
            .find(|node| {
                rack_of(*node).as_deref() == Some(rack)
                    && matches!(self.placement_of(NodeId(*node)), Placement::Remote(_))
            })
            .map(NodeId)
    }

    /// The nodes clients may use: every node of every machine that is not
    /// fenced (this machine's always), in node id order.
    pub fn serving_nodes(&self) -> Vec<ServingNode> {
        if self.cluster.nodes.is_empty() {
            return self
                .nodes
                .iter()
                .map(|n| ServingNode { node_id: n.node_id, host: n.host.clone(), port: n.port, rack: None })
                .collect();
        }
        self.cluster
            .nodes
            .iter()
            .filter(|(id, _)| !matches!(self.placement_of(**id), Placement::Unavailable))
            .map(|(id, placed)| ServingNode {
                node_id: *id,
                host: placed.host.clone(),
                port: placed.port,
                rack: MachineId::new(placed.machine).and_then(|m| self.cluster.machines.get(&m)?.rack.clone()),
            })
            .collect()
    }

    /// The node a shared listener advertises for `node`: its machine's
    /// first core's node.
    pub fn machine_front(&self, node: NodeId) -> Option<NodeId> {
        let Some(placed) = self.cluster.nodes.get(&node) else { return Some(self.controller) };
        self.cluster
            .nodes
            .iter()
            .filter(|(_, p)| p.machine == placed.machine)
            .min_by_key(|(_, p)| p.core)
            .map(|(id, _)| *id)
    }

    /// The coordinator of `group`, as Kafka places it: the leader of
    /// `__consumer_offsets` partition `offsets_partition(group, n)`, with
    /// that partition. None before the cluster has created that topic.
    pub fn group_coordinator(&self, group: &str) -> Option<(i32, Placement)> {
        let topic = self.cluster.topic_ids.get(OFFSETS_TOPIC).and_then(|id| self.cluster.topics.get(id))?;
        let partition = offsets_partition(group, topic.partitions.len());
        let leader = topic.partitions.get(usize::try_from(partition).ok()?)?.leader;
        let placement = if leader < 0 { Placement::Unavailable } else { self.placement_of(NodeId(leader)) };
        Some((partition, placement))
    }

    /// The partitions of `__consumer_offsets` (0 before it exists).
    pub fn offsets_partitions(&self) -> usize {
        self.cluster
            .topic_ids
            .get(OFFSETS_TOPIC)
            .and_then(|id| self.cluster.topics.get(id))
            .map_or(0, |t| t.partitions.len())
    }

    /// The node a core serves as; `None` for a core this machine does not
    /// run (a partition placed there has no leader: see
    /// `controller::rehome_partitions`, which keeps that from happening).
    pub fn node_of_shard(&self, shard: ShardId) -> Option<NodeId> {
        self.nodes.iter().find(|n| n.shard == shard).map(|n| n.node_id)
    }

    pub fn shard_count(&self) -> usize {
        self.nodes.len()
    }

    /// Partitions owned by each shard (for balancing new ones).
    pub fn partitions_per_shard(&self) -> Vec<usize> {
        let mut counts = vec![0usize; self.nodes.len().max(1)];
        for topic in self.durable.topics.values() {
            for p in &topic.partitions {
                if let Some(count) = counts.get_mut(p.shard.0 as usize) {
                    *count += 1;
                }
            }
        }
        counts
    }
}

/// The `__consumer_offsets` partition of `group` among `partitions`:
/// Kafka's `Utils.abs(groupId.hashCode()) % partitions`, with Java's
/// String hash over UTF-16 code units, so a group lives in the partition
/// a Kafka cluster with as many partitions would put it in.
pub fn offsets_partition(group: &str, partitions: usize) -> i32 {
    let hash = group.encode_utf16().fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(i32::from(unit)));
    // Kafka's Utils.abs: i32::MIN maps to 0.
    let positive = if hash == i32::MIN { 0 } else { hash.abs() };
    (positive as i64 % partitions.max(1) as i64) as i32
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata file {path}: {message}")]
    Io { path: String, message: String },
    #[error("metadata file {path} does not decode: {message}")]
    Decode { path: String, message: String },
}

const FILE_NAME: &str = "metadata.rkyv";
const MAGIC: &[u8; 8] = b"SLMETA02";
/// The format before dynamic broker configs (`PersistedMetadataV1`).
const MAGIC_V1: &[u8; 8] = b"SLMETA01";

/// Loads the persisted metadata from `dir`, if any. The file is
/// `MAGIC | crc32 (of payload) | payload`; a `MAGIC_V1` file is read in the
/// old layout.
pub fn load(dir: &Path) -> Result<Option<PersistedMetadata>, MetadataError> {
    let path = dir.join(FILE_NAME);
    let raw = match std::fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(MetadataError::Io { path: path.display().to_string(), message: e.to_string() }),
    };
    let decode_error =
        |message: &str| MetadataError::Decode { path: path.display().to_string(), message: message.into() };
    if raw.len() < 12 || (&raw[..8] != MAGIC && &raw[..8] != MAGIC_V1) {
        return Err(decode_error("bad header"));
    }
    let crc = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
    let payload = &raw[12..];
    if crc32fast::hash(payload) != crc {
        return Err(decode_error("checksum mismatch"));
    }
    let mut aligned = rkyv::util::AlignedVec::<16>::new();
    aligned.extend_from_slice(payload);
    if &raw[..8] == MAGIC_V1 {
        return rkyv::from_bytes::<StoredMetadataV1, rkyv::rancor::Error>(&aligned)
            .map(|old| Some(StoredMetadata::from(old).into()))
            .map_err(|e| decode_error(&e.to_string()));
    }
    rkyv::from_bytes::<StoredMetadata, rkyv::rancor::Error>(&aligned)
        .map(|stored| Some(stored.into()))
        .map_err(|e| decode_error(&e.to_string()))
}

/// Renames a migrated `metadata.rkyv` to `metadata.rkyv.migrated`: its
/// content now lives in the metadata log (`cluster::bridge::migration`).
pub fn retire(dir: &Path) -> Result<(), MetadataError> {
    let path = dir.join(FILE_NAME);
    let io_error = |e: std::io::Error| MetadataError::Io { path: path.display().to_string(), message: e.to_string() };
    std::fs::rename(&path, dir.join(format!("{FILE_NAME}.migrated"))).map_err(io_error)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_error)
}

/// Persists atomically: write a temporary file, fsync, rename, fsync the dir.
pub fn store(dir: &Path, metadata: &PersistedMetadata) -> Result<(), MetadataError> {
    use std::io::Write;
    let path = dir.join(FILE_NAME);
    let io_error = |e: std::io::Error| MetadataError::Io { path: path.display().to_string(), message: e.to_string() };
    let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&StoredMetadata::from(metadata))
        .map_err(|e| MetadataError::Decode { path: path.display().to_string(), message: e.to_string() })?;
    std::fs::create_dir_all(dir).map_err(io_error)?;
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let mut file = std::fs::File::create(&tmp).map_err(io_error)?;
    file.write_all(MAGIC).map_err(io_error)?;
    file.write_all(&crc32fast::hash(&payload).to_le_bytes()).map_err(io_error)?;
    file.write_all(&payload).map_err(io_error)?;
    file.sync_all().map_err(io_error)?;
    std::fs::rename(&tmp, &path).map_err(io_error)?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_map_to_offsets_partitions_as_kafka_maps_them() {
        // Java: "hello".hashCode() == 99162322.
        assert_eq!(offsets_partition("hello", 50), 99_162_322 % 50);
        assert_eq!(offsets_partition("", 16), 0);
        // Java: "polygenelubricants".hashCode() == Integer.MIN_VALUE, which
        // Kafka's Utils.abs maps to 0.
        assert_eq!(offsets_partition("polygenelubricants", 7), 0);
        // Java hashes of long strings overflow to negative numbers; every
        // group still lands in range.
        for group in ["g", "group-1", "консьюмер", "AaAaAaAaAaAaAa"] {
            let p = offsets_partition(group, 16);
            assert!((0..16).contains(&p), "{group} -> {p}");
        }
    }

    #[test]
    fn persisted_metadata_round_trips_and_detects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let mut metadata = PersistedMetadata { cluster_id: "c".into(), producer_id_next: 2000, ..Default::default() };
        metadata.topics.insert(
            "t".into(),
            TopicInfo {
                name: "t".into(),
                topic_id: [7; 16],
                partitions: vec![PartitionInfo { shard: ShardId(1), leader_epoch: 0, replica: ShardId(1) }],
                configs: [("retention.ms".to_string(), "1000".to_string())].into(),
            },
        );
        metadata.broker_configs.insert("log.retention.ms".into(), "60000".into());
        metadata.node_configs.insert(3, [("log.segment.bytes".to_string(), "1048576".to_string())].into());
        store(dir.path(), &metadata).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(metadata));
        let path = dir.path().join(FILE_NAME);
        let mut raw = std::fs::read(&path).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        std::fs::write(&path, raw).unwrap();
        assert!(load(dir.path()).is_err());
    }

    #[test]
    fn a_metadata_file_in_the_first_format_loads_without_dynamic_configs() {
        let dir = tempfile::tempdir().unwrap();
        let old = StoredMetadataV1 {
            cluster_id: "c".into(),
            producer_id_next: 3000,
            topics: [(
                "t".to_string(),
                StoredTopic {
                    name: "t".into(),
                    topic_id: [9; 16],
                    partitions: vec![StoredPartition { shard: ShardId(0), leader_epoch: 2 }],
                    configs: BTreeMap::new(),
                },
            )]
            .into(),
        };
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&old).unwrap();
        let mut raw = MAGIC_V1.to_vec();
        raw.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        raw.extend_from_slice(&payload);
        std::fs::write(dir.path().join(FILE_NAME), raw).unwrap();
        let loaded = load(dir.path()).unwrap().expect("the old file loads");
        assert_eq!(loaded, PersistedMetadata::from(StoredMetadata::from(old)));
        assert_eq!(loaded.topics["t"].partitions[0].replica, ShardId(0));
        assert!(loaded.broker_configs.is_empty() && loaded.node_configs.is_empty());
    }
}
