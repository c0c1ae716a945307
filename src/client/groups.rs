//! Consumer-group administration over the Kafka protocol (what
//! `kafka-consumer-groups` does): list, describe with lag, delete, and reset
//! committed offsets of an empty group.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{decode, ClientError, Connection};
use crate::protocol::delete_groups::{DeleteGroupsRequest, DeleteGroupsResponse};
use crate::protocol::describe_groups::{DescribeGroupsRequest, DescribeGroupsResponse, DescribedGroup};
use crate::protocol::find_coordinator::{FindCoordinatorRequest, FindCoordinatorResponse};
use crate::protocol::list_groups::{ListGroupsRequest, ListGroupsResponse, ListedGroup};
use crate::protocol::list_offsets::{ListOffsetsPartition, ListOffsetsRequest, ListOffsetsResponse, ListOffsetsTopic};
use crate::protocol::metadata::{MetadataRequest, MetadataResponse};
use crate::protocol::offset_commit::{
    OffsetCommitPartition, OffsetCommitRequest, OffsetCommitResponse, OffsetCommitTopic,
};
use crate::protocol::offset_fetch::{OffsetFetchRequest, OffsetFetchResponse};
use crate::protocol::{ApiKey, ErrorCode};

/// One partition of a group's view: committed offset, end offset, lag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    pub committed: i64,
    pub end: i64,
}

impl PartitionLag {
    pub fn lag(&self) -> Option<i64> {
        (self.committed >= 0).then(|| (self.end - self.committed).max(0))
    }
}

/// A committed offset: (topic, partition, offset, metadata).
pub type Committed = (String, i32, i64, String);

/// Where `reset-offsets` moves a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    Earliest,
    Latest,
    Offset(i64),
    /// The first offset at or after this time (ms since the epoch).
    Timestamp(i64),
}

pub struct GroupAdmin {
    bootstrap: Connection,
    address: String,
}

#[derive(Debug, thiserror::Error)]
pub enum GroupAdminError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("{what}: {code:?}")]
    Kafka { what: String, code: ErrorCode },
}

fn check(what: impl Into<String>, code: ErrorCode) -> Result<(), GroupAdminError> {
    if code.is_ok() {
        Ok(())
    } else {
        Err(GroupAdminError::Kafka { what: what.into(), code })
    }
}

impl GroupAdmin {
    pub fn connect(bootstrap: &str) -> Result<Self, GroupAdminError> {
        Ok(Self { bootstrap: Connection::connect(bootstrap, Duration::from_secs(10))?, address: bootstrap.into() })
    }

    /// Every group of the cluster, once each, by group id. A node lists only
    /// the groups it coordinates, so this asks every node Metadata names.
    pub fn list(&mut self) -> Result<Vec<ListedGroup>, GroupAdminError> {
        let request = MetadataRequest { topics: Some(Vec::new()), allow_auto_topic_creation: false };
        let reader = self.bootstrap.request(ApiKey::Metadata, 8, |w| request.encode(w, 8))?;
        let metadata = decode(reader, 8, MetadataResponse::decode)?;
        // Keyed by id: a group listed by two nodes (a broker that lists every
        // core's groups on every node) still shows once.
        let mut groups = BTreeMap::new();
        for node in &metadata.brokers {
            let mut connection = self.connect_node(&node.host, node.port)?;
            let reader = connection.request(ApiKey::ListGroups, 2, |w| ListGroupsRequest {}.encode(w, 2))?;
            let answer = decode(reader, 2, ListGroupsResponse::decode)?;
            check(format!("list groups of node {}", node.node_id), answer.error)?;
            groups.extend(answer.groups.into_iter().map(|group| (group.group_id.clone(), group)));
        }
        Ok(groups.into_values().collect())
    }

    /// A connection to the group's coordinator node.
    fn coordinator(&mut self, group_id: &str) -> Result<Connection, GroupAdminError> {
        let request = FindCoordinatorRequest { key: group_id.into(), key_type: 0 };
        let reader = self.bootstrap.request(ApiKey::FindCoordinator, 2, |w| request.encode(w, 2))?;
        let answer = decode(reader, 2, FindCoordinatorResponse::decode)?;
        check(format!("find coordinator of {group_id}"), answer.error)?;
        self.connect_node(&answer.host, answer.port)
    }

    /// A connection to a node a broker named; an empty host is the bootstrap's.
    fn connect_node(&self, host: &str, port: i32) -> Result<Connection, GroupAdminError> {
        let host = if host.is_empty() { self.address.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h) } else { host };
        Ok(Connection::connect((host, port as u16), Duration::from_secs(10))?)
    }

    pub fn describe(&mut self, group_id: &str) -> Result<(DescribedGroup, Vec<PartitionLag>), GroupAdminError> {
        let mut coordinator = self.coordinator(group_id)?;
        let request = DescribeGroupsRequest { groups: vec![group_id.into()], include_authorized_operations: false };
        let reader = coordinator.request(ApiKey::DescribeGroups, 4, |w| request.encode(w, 4))?;
        let answer = decode(reader, 4, DescribeGroupsResponse::decode)?;
        let group = answer.groups.into_iter().next().ok_or(GroupAdminError::Kafka {
            what: format!("describe {group_id}"),
            code: ErrorCode::UnknownServerError,
        })?;
        check(format!("describe {group_id}"), group.error)?;
        let committed = self.committed(&mut coordinator, group_id)?;
        Ok((group, committed))
    }

    fn committed(
        &mut self,
        coordinator: &mut Connection,
        group_id: &str,
    ) -> Result<Vec<PartitionLag>, GroupAdminError> {
        let request = OffsetFetchRequest { group_id: group_id.into(), topics: None };
        let reader = coordinator.request(ApiKey::OffsetFetch, 5, |w| request.encode(w, 5))?;
        let answer = decode(reader, 5, OffsetFetchResponse::decode)?;
        check(format!("fetch offsets of {group_id}"), answer.error)?;
        let mut out = Vec::new();
        for topic in answer.topics {
            for p in topic.partitions {
                out.push(PartitionLag {
                    topic: topic.name.clone(),
                    partition: p.partition_index,
                    committed: p.committed_offset,
                    end: -1,
                });
            }
        }
        let ends = self.list_offsets(&out.iter().map(|p| (p.topic.clone(), p.partition)).collect::<Vec<_>>(), -1)?;
        for (lag, end) in out.iter_mut().zip(ends) {
            lag.end = end;
        }
        Ok(out)
    }

    /// ListOffsets for partitions, each asked of its leader (Metadata names
    /// it; a machine answers only for the partitions it leads); -1 where no
    /// leader answers.
    fn list_offsets(&mut self, partitions: &[(String, i32)], timestamp: i64) -> Result<Vec<i64>, GroupAdminError> {
        let mut topics: Vec<String> = partitions.iter().map(|(t, _)| t.clone()).collect();
        topics.sort();
        topics.dedup();
        let request = MetadataRequest { topics: Some(topics), allow_auto_topic_creation: false };
        let reader = self.bootstrap.request(ApiKey::Metadata, 8, |w| request.encode(w, 8))?;
        let metadata = decode(reader, 8, MetadataResponse::decode)?;
        let leader_of = |topic: &str, partition: i32| -> Option<i32> {
            let info = metadata.topics.iter().find(|t| t.name == topic)?;
            let p = info.partitions.iter().find(|p| p.index == partition)?;
            (p.leader_id >= 0).then_some(p.leader_id)
        };
        let mut by_leader: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (at, (topic, partition)) in partitions.iter().enumerate() {
            if let Some(leader) = leader_of(topic, *partition) {
                by_leader.entry(leader).or_default().push(at);
            }
        }
        let mut out = vec![-1; partitions.len()];
        for (leader, wanted) in by_leader {
            let Some(node) = metadata.brokers.iter().find(|b| b.node_id == leader) else { continue };
            let mut connection = self.connect_node(&node.host, node.port)?;
            let request = ListOffsetsRequest {
                replica_id: -1,
                isolation_level: 0,
                topics: wanted
                    .iter()
                    .map(|at| ListOffsetsTopic {
                        name: partitions[*at].0.clone(),
                        partitions: vec![ListOffsetsPartition {
                            index: partitions[*at].1,
                            current_leader_epoch: -1,
                            timestamp,
                        }],
                    })
                    .collect(),
            };
            let reader = connection.request(ApiKey::ListOffsets, 5, |w| request.encode(w, 5))?;
            let answer = decode(reader, 5, ListOffsetsResponse::decode)?;
            let offsets = answer.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.offset));
            for (at, offset) in wanted.iter().zip(offsets) {
                out[*at] = offset;
            }
        }
        Ok(out)
    }

    pub fn delete(&mut self, group_id: &str) -> Result<(), GroupAdminError> {
        let mut coordinator = self.coordinator(group_id)?;
        let request = DeleteGroupsRequest { groups_names: vec![group_id.into()] };
        let reader = coordinator.request(ApiKey::DeleteGroups, 1, |w| request.encode(w, 1))?;
        let answer = decode(reader, 1, DeleteGroupsResponse::decode)?;
        for result in answer.results {
            check(format!("delete {}", result.group_id), result.error)?;
        }
        Ok(())
    }

    /// Moves the committed offsets of every partition of `topic` (the group
    /// must have no active members: the commit uses generation -1).
    pub fn reset_offsets(
        &mut self,
        group_id: &str,
        topic: &str,
        target: ResetTarget,
    ) -> Result<Vec<(i32, i64)>, GroupAdminError> {
        let request = MetadataRequest { topics: Some(vec![topic.into()]), allow_auto_topic_creation: false };
        let reader = self.bootstrap.request(ApiKey::Metadata, 8, |w| request.encode(w, 8))?;
        let metadata = decode(reader, 8, MetadataResponse::decode)?;
        let info = metadata.topics.into_iter().next().ok_or(GroupAdminError::Kafka {
            what: format!("metadata of {topic}"),
            code: ErrorCode::UnknownTopicOrPartition,
        })?;
        check(format!("metadata of {topic}"), info.error)?;
        let partitions: Vec<(String, i32)> = info.partitions.iter().map(|p| (topic.to_string(), p.index)).collect();
        let offsets = match target {
            ResetTarget::Earliest => self.list_offsets(&partitions, -2)?,
            ResetTarget::Latest => self.list_offsets(&partitions, -1)?,
            ResetTarget::Offset(offset) => vec![offset; partitions.len()],
            ResetTarget::Timestamp(ms) => {
                let found = self.list_offsets(&partitions, ms)?;
                let latest = self.list_offsets(&partitions, -1)?;
                found.into_iter().zip(latest).map(|(f, l)| if f < 0 { l } else { f }).collect()
            }
        };
        let mut coordinator = self.coordinator(group_id)?;
        let commits = partitions
            .iter()
            .zip(&offsets)
            .map(|((_, partition), offset)| OffsetCommitPartition {
                partition_index: *partition,
                committed_offset: *offset,
                committed_leader_epoch: -1,
                committed_metadata: None,
            })
            .collect();
        admin_commit(&mut coordinator, group_id, BTreeMap::from([(topic, commits)]))?;
        Ok(partitions.into_iter().map(|(_, p)| p).zip(offsets).collect())
    }

    /// The group's state ("Empty", "Stable", ..., "Dead" when it does not
    /// exist) and its committed offsets: (topic, partition, offset, metadata).
    pub fn state_and_offsets(&mut self, group_id: &str) -> Result<(String, Vec<Committed>), GroupAdminError> {
        let mut coordinator = self.coordinator(group_id)?;
        let request = DescribeGroupsRequest { groups: vec![group_id.into()], include_authorized_operations: false };
        let reader = coordinator.request(ApiKey::DescribeGroups, 4, |w| request.encode(w, 4))?;
        let answer = decode(reader, 4, DescribeGroupsResponse::decode)?;
        let state = answer.groups.into_iter().next().map_or_else(|| "Dead".to_string(), |g| g.group_state);
        let request = OffsetFetchRequest { group_id: group_id.into(), topics: None };
        let reader = coordinator.request(ApiKey::OffsetFetch, 5, |w| request.encode(w, 5))?;
        let answer = decode(reader, 5, OffsetFetchResponse::decode)?;
        check(format!("fetch offsets of {group_id}"), answer.error)?;
        let mut offsets = Vec::new();
        for topic in answer.topics {
            for p in topic.partitions {
                if p.committed_offset >= 0 {
                    offsets.push((
                        topic.name.clone(),
                        p.partition_index,
                        p.committed_offset,
                        p.metadata.unwrap_or_default(),
                    ));
                }
            }
        }
        Ok((state, offsets))
    }

    /// Commits `offsets` (topic, partition, offset, metadata) as an admin
    /// (generation -1: refused while the group has active members).
    pub fn commit(&mut self, group_id: &str, offsets: &[Committed]) -> Result<(), GroupAdminError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut topics: BTreeMap<&str, Vec<OffsetCommitPartition>> = BTreeMap::new();
        for (topic, partition, offset, metadata) in offsets {
            topics.entry(topic).or_default().push(OffsetCommitPartition {
                partition_index: *partition,
                committed_offset: *offset,
                committed_leader_epoch: -1,
                committed_metadata: Some(metadata.clone()),
            });
        }
        let mut coordinator = self.coordinator(group_id)?;
        admin_commit(&mut coordinator, group_id, topics)
    }

    /// Commits `offsets` (topic, partition, offset, leader epoch, metadata)
    /// for `group_id` where the group has no commit yet, as an admin
    /// (generation -1: the group must have no active members). Returns how
    /// many were written.
    pub fn import_offsets(
        &mut self,
        group_id: &str,
        offsets: &[(String, i32, i64, i32, String)],
    ) -> Result<usize, GroupAdminError> {
        let mut coordinator = self.coordinator(group_id)?;
        let request = OffsetFetchRequest { group_id: group_id.into(), topics: None };
        let reader = coordinator.request(ApiKey::OffsetFetch, 5, |w| request.encode(w, 5))?;
        let answer = decode(reader, 5, OffsetFetchResponse::decode)?;
        check(format!("fetch offsets of {group_id}"), answer.error)?;
        let committed: std::collections::BTreeSet<(String, i32)> = answer
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().filter(|p| p.committed_offset >= 0).map(|p| (t.name.clone(), p.partition_index))
            })
            .collect();
        let mut topics: BTreeMap<&str, Vec<OffsetCommitPartition>> = BTreeMap::new();
        for (topic, partition, offset, leader_epoch, metadata) in offsets {
            if committed.contains(&(topic.clone(), *partition)) {
                continue;
            }
            topics.entry(topic).or_default().push(OffsetCommitPartition {
                partition_index: *partition,
                committed_offset: *offset,
                committed_leader_epoch: *leader_epoch,
                committed_metadata: Some(metadata.clone()),
            });
        }
        let count = topics.values().map(Vec::len).sum();
        if count == 0 {
            return Ok(0);
        }
        admin_commit(&mut coordinator, group_id, topics)?;
        Ok(count)
    }
}

/// OffsetCommit as an admin (generation -1, no member): refused while the
/// group has active members.
fn admin_commit(
    coordinator: &mut Connection,
    group_id: &str,
    topics: BTreeMap<&str, Vec<OffsetCommitPartition>>,
) -> Result<(), GroupAdminError> {
    let request = OffsetCommitRequest {
        group_id: group_id.into(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
        retention_time_ms: -1,
        topics: topics
            .into_iter()
            .map(|(name, partitions)| OffsetCommitTopic { name: name.into(), partitions })
            .collect(),
    };
    let reader = coordinator.request(ApiKey::OffsetCommit, 7, |w| request.encode(w, 7))?;
    let answer = decode(reader, 7, OffsetCommitResponse::decode)?;
    for topic in &answer.topics {
        for p in &topic.partitions {
            check(format!("commit {topic}-{}", p.partition_index, topic = topic.name), p.error)?;
        }
    }
    Ok(())
}
