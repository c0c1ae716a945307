//! The per-core group coordinator: routes events to the groups it owns,
//! keeps committed offsets, and holds OffsetCommit and DeleteGroups replies
//! until their records are durable.

use std::collections::HashMap;

use super::config::{GroupConfig, GroupConfigError, RECORD_STRING_BYTES_MAX};
use super::offsets::{CommittedOffset, OffsetKey, OffsetRecord};
use super::state::{Ctx, Group, GroupState, JoinParams};
use super::{ClientInfo, GroupCommand, GroupEvent, GroupResponse, PersistId, ReplyTo};
use crate::protocol::delete_groups::{DeleteGroupsRequest, DeleteGroupsResponse, DeletedGroup};
use crate::protocol::describe_groups::{
    DescribeGroupsRequest, DescribeGroupsResponse, DescribedGroup, AUTHORIZED_OPERATIONS_OMITTED,
};
use crate::protocol::heartbeat::{HeartbeatRequest, HeartbeatResponse};
use crate::protocol::join_group::{JoinGroupRequest, JoinGroupResponse};
use crate::protocol::leave_group::{
    LeaveGroupRequest, LeaveGroupResponse, LeavingMember, LeftMember, BATCH_VERSION_MIN,
};
use crate::protocol::list_groups::{ListGroupsResponse, ListedGroup};
use crate::protocol::offset_commit::{OffsetCommitRequest, OffsetCommitResponse};
use crate::protocol::offset_fetch::{
    OffsetFetchPartitionResponse, OffsetFetchRequest, OffsetFetchResponse, OffsetFetchTopicResponse,
};
use crate::protocol::sync_group::{SyncGroupRequest, SyncGroupResponse};
use crate::protocol::ErrorCode;

/// What DescribeGroups reports as allowed on a group when asked: READ (3),
/// DELETE (6) and DESCRIBE (8), Kafka's ACL operation codes as bits. There is
/// no authorizer yet, so everything a group supports is allowed.
const GROUP_OPERATIONS_ALLOWED: i32 = (1 << 3) | (1 << 6) | (1 << 8);

/// Owns the groups hashed to one core. See the module docs for how the
/// broker drives it.
#[derive(Debug)]
pub struct GroupCoordinator {
    config: GroupConfig,
    groups: HashMap<String, Group>,
    /// Writes the broker has not reported back yet; each holds one reply.
    /// Bounded by the requests in flight on this core's connections.
    pending_writes: HashMap<PersistId, PendingWrite>,
    next_persist_id: u64,
    next_incarnation: u64,
    member_numbers: u64,
    /// The latest clock seen; time never runs backwards in here.
    now_ms: u64,
}

#[derive(Debug)]
enum PendingWrite {
    Commit {
        reply_to: ReplyTo,
        group_id: String,
        incarnation: u64,
        response: OffsetCommitResponse,
        records: Vec<OffsetRecord>,
        /// (topic, partition) positions in `response` that were written.
        written: Vec<(usize, usize)>,
    },
    Delete {
        reply_to: ReplyTo,
        response: DeleteGroupsResponse,
        /// Positions in `response.results` whose tombstones were written.
        written: Vec<usize>,
    },
}

impl GroupCoordinator {
    pub fn new(config: GroupConfig) -> Result<Self, GroupConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            groups: HashMap::new(),
            pending_writes: HashMap::new(),
            next_persist_id: 0,
            next_incarnation: 0,
            member_numbers: 0,
            now_ms: 0,
        })
    }

    /// Applies one event at `now_ms` and returns what the broker must do, in
    /// order.
    pub fn step(&mut self, now_ms: u64, event: GroupEvent) -> Vec<GroupCommand> {
        self.now_ms = self.now_ms.max(now_ms);
        let mut out = Vec::new();
        match event {
            GroupEvent::Join { reply_to, api_version, client, request } => {
                self.on_join(&mut out, reply_to, api_version, client, request)
            }
            GroupEvent::Sync { reply_to, request } => self.on_sync(&mut out, reply_to, request),
            GroupEvent::Heartbeat { reply_to, request } => self.on_heartbeat(&mut out, reply_to, request),
            GroupEvent::Leave { reply_to, api_version, request } => {
                self.on_leave(&mut out, reply_to, api_version, request)
            }
            GroupEvent::OffsetCommit { reply_to, request } => self.on_offset_commit(&mut out, reply_to, request),
            GroupEvent::DeleteGroups { reply_to, request } => self.on_delete_groups(&mut out, reply_to, request),
            GroupEvent::OffsetsPersisted { persist_id, result } => {
                self.on_offsets_persisted(&mut out, persist_id, result)
            }
            GroupEvent::Tick => self.on_tick(&mut out),
        }
        out
    }

    /// The earliest time at which a [`GroupEvent::Tick`] would change
    /// something, if any. Linear in the members held: call it after a batch
    /// of events, or tick at a fixed interval instead.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.groups.values().filter_map(|g| g.next_deadline_ms(&self.config)).min()
    }

    /// Rebuilds committed offsets from the offsets log, record by record in
    /// log order, before any request is served. The log is the truth, so the
    /// group limit does not apply here.
    pub fn replay(&mut self, record: OffsetRecord) {
        let OffsetRecord { key, value } = record;
        match value {
            Some(value) => {
                let group = self.group_or_create(key.group_id);
                group.offsets.insert((key.topic, key.partition), value);
            }
            None => {
                let Some(group) = self.groups.get_mut(&key.group_id) else {
                    return;
                };
                group.offsets.remove(&(key.topic, key.partition));
                if group.is_disposable() {
                    self.groups.remove(&key.group_id);
                }
            }
        }
    }

    /// OffsetFetch: a partition (or group) without a commit answers -1.
    pub fn fetch_offsets(&self, request: &OffsetFetchRequest) -> OffsetFetchResponse {
        let group = self.groups.get(&request.group_id);
        let topics = match &request.topics {
            Some(topics) => topics
                .iter()
                .map(|topic| OffsetFetchTopicResponse {
                    name: topic.name.clone(),
                    partitions: topic
                        .partition_indexes
                        .iter()
                        .map(|&partition| {
                            let committed = group.and_then(|g| g.offsets.get(&(topic.name.clone(), partition)));
                            fetched(partition, committed)
                        })
                        .collect(),
                })
                .collect(),
            None => group.map(all_committed).unwrap_or_default(),
        };
        OffsetFetchResponse { throttle_time_ms: 0, topics, error: ErrorCode::None }
    }

    /// DescribeGroups: a group this coordinator does not hold reads as Dead.
    /// Like the other accessors it shows the state as of the last step:
    /// timers that are due fire on the next event or tick.
    pub fn describe_groups(&self, request: &DescribeGroupsRequest) -> DescribeGroupsResponse {
        let operations = if request.include_authorized_operations {
            GROUP_OPERATIONS_ALLOWED
        } else {
            AUTHORIZED_OPERATIONS_OMITTED
        };
        let groups = request
            .groups
            .iter()
            .map(|group_id| match self.groups.get(group_id) {
                Some(group) => group.describe(operations),
                None => DescribedGroup {
                    error: ErrorCode::None,
                    group_id: group_id.clone(),
                    group_state: GroupState::Dead.as_str().to_owned(),
                    protocol_type: String::new(),
                    protocol_data: String::new(),
                    members: Vec::new(),
                    authorized_operations: operations,
                },
            })
            .collect();
        DescribeGroupsResponse { throttle_time_ms: 0, groups }
    }

    /// ListGroups: every group held, in id order.
    pub fn list_groups(&self) -> ListGroupsResponse {
        let mut groups: Vec<ListedGroup> = self
            .groups
            .values()
            .map(|g| ListedGroup {
                group_id: g.group_id.clone(),
                protocol_type: g.protocol_type.clone().unwrap_or_default(),
            })
            .collect();
        groups.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        ListGroupsResponse { throttle_time_ms: 0, error: ErrorCode::None, groups }
    }

    /// Dead for a group this coordinator does not hold.
    pub fn group_state(&self, group_id: &str) -> GroupState {
        self.groups.get(group_id).map_or(GroupState::Dead, |g| g.state)
    }

    pub fn committed_offset(&self, group_id: &str, topic: &str, partition: i32) -> Option<&CommittedOffset> {
        self.groups.get(group_id)?.offsets.get(&(topic.to_owned(), partition))
    }

    /// Every committed offset as records that rebuild the state on their own,
    /// including commits appended to the log but not yet reported durable
    /// (they precede the snapshot in the log, so it must not undo them).
    /// None while a group deletion is being written: try again later.
    pub fn snapshot_offsets(&self) -> Option<Vec<OffsetRecord>> {
        let mut offsets: std::collections::BTreeMap<OffsetKey, CommittedOffset> = std::collections::BTreeMap::new();
        for group in self.groups.values() {
            for ((topic, partition), value) in &group.offsets {
                let key = OffsetKey { group_id: group.group_id.clone(), topic: topic.clone(), partition: *partition };
                offsets.insert(key, value.clone());
            }
        }
        let mut pending: Vec<(&PersistId, &PendingWrite)> = self.pending_writes.iter().collect();
        pending.sort_by_key(|(id, _)| id.0);
        for (_, write) in pending {
            match write {
                PendingWrite::Commit { records, .. } => {
                    for record in records {
                        match &record.value {
                            Some(value) => offsets.insert(record.key.clone(), value.clone()),
                            None => offsets.remove(&record.key),
                        };
                    }
                }
                PendingWrite::Delete { .. } => return None,
            }
        }
        Some(offsets.into_iter().map(|(key, value)| OffsetRecord { key, value: Some(value) }).collect())
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    // ---- Events ----------------------------------------------------------

    fn on_join(
        &mut self,
        out: &mut Vec<GroupCommand>,
        reply_to: ReplyTo,
        api_version: i16,
        client: ClientInfo,
        request: JoinGroupRequest,
    ) {
        if let Err(error) = self.check_join(&request) {
            reply(out, reply_to, GroupResponse::Join(JoinGroupResponse::error(request.member_id, error)));
            return;
        }
        if !self.groups.contains_key(&request.group_id) {
            // Only a member without an id may create a group.
            let error = if !request.member_id.is_empty() {
                ErrorCode::UnknownMemberId
            } else if self.groups.len() >= self.config.groups_max {
                ErrorCode::CoordinatorNotAvailable
            } else {
                ErrorCode::None
            };
            if error != ErrorCode::None {
                reply(out, reply_to, GroupResponse::Join(JoinGroupResponse::error(request.member_id, error)));
                return;
            }
            self.group_or_create(request.group_id.clone());
        }
        let group_id = request.group_id.clone();
        let join = JoinParams::new(client, request);
        self.with_group(out, &group_id, |group, ctx| group.join(ctx, reply_to, api_version, join));
    }

    fn check_join(&self, request: &JoinGroupRequest) -> Result<(), ErrorCode> {
        if request.group_id.is_empty() || request.group_id.len() > RECORD_STRING_BYTES_MAX {
            return Err(ErrorCode::InvalidGroupId);
        }
        let session_timeout_ms = request.session_timeout_ms;
        if session_timeout_ms < self.config.session_timeout_ms_min
            || session_timeout_ms > self.config.session_timeout_ms_max
        {
            return Err(ErrorCode::InvalidSessionTimeout);
        }
        let metadata_bytes: usize = request.protocols.iter().map(|p| p.metadata.len()).sum();
        if request.protocols.len() > self.config.protocols_per_member_max
            || metadata_bytes > self.config.member_metadata_bytes_max
        {
            return Err(ErrorCode::InvalidRequest);
        }
        Ok(())
    }

    fn on_sync(&mut self, out: &mut Vec<GroupCommand>, reply_to: ReplyTo, request: SyncGroupRequest) {
        let error = if request.group_id.is_empty() {
            ErrorCode::InvalidGroupId
        } else if !self.groups.contains_key(&request.group_id) {
            ErrorCode::UnknownMemberId
        } else {
            let group_id = request.group_id.clone();
            self.with_group(out, &group_id, |group, ctx| group.sync(ctx, reply_to, request));
            return;
        };
        reply(out, reply_to, GroupResponse::Sync(SyncGroupResponse::error(error)));
    }

    fn on_heartbeat(&mut self, out: &mut Vec<GroupCommand>, reply_to: ReplyTo, request: HeartbeatRequest) {
        let error = if request.group_id.is_empty() {
            ErrorCode::InvalidGroupId
        } else if !self.groups.contains_key(&request.group_id) {
            ErrorCode::UnknownMemberId
        } else {
            let group_id = request.group_id.clone();
            self.with_group(out, &group_id, |group, ctx| group.heartbeat(ctx, reply_to, request));
            return;
        };
        reply(out, reply_to, GroupResponse::Heartbeat(HeartbeatResponse::new(error)));
    }

    fn on_leave(
        &mut self,
        out: &mut Vec<GroupCommand>,
        reply_to: ReplyTo,
        api_version: i16,
        request: LeaveGroupRequest,
    ) {
        let batch = api_version >= BATCH_VERSION_MIN;
        let leaving = if batch {
            request.members
        } else {
            vec![LeavingMember { member_id: request.member_id, group_instance_id: None }]
        };
        let (error, errors) = if request.group_id.is_empty() {
            (ErrorCode::InvalidGroupId, Vec::new())
        } else if !self.groups.contains_key(&request.group_id) {
            (ErrorCode::None, vec![ErrorCode::UnknownMemberId; leaving.len()])
        } else {
            let errors = self.with_group(out, &request.group_id, |group, ctx| {
                leaving.iter().map(|member| group.leave(ctx, member)).collect()
            });
            (ErrorCode::None, errors.unwrap_or_default())
        };
        let members: Vec<LeftMember> = leaving
            .into_iter()
            .zip(errors)
            .map(|(m, error)| LeftMember { member_id: m.member_id, group_instance_id: m.group_instance_id, error })
            .collect();
        let response = if batch {
            LeaveGroupResponse { throttle_time_ms: 0, error, members }
        } else {
            // v0–2 carry the one member's error at the top.
            let member_error = members.first().map_or(ErrorCode::None, |m| m.error);
            let error = if error == ErrorCode::None { member_error } else { error };
            LeaveGroupResponse { throttle_time_ms: 0, error, members: Vec::new() }
        };
        reply(out, reply_to, GroupResponse::Leave(response));
    }

    fn on_offset_commit(&mut self, out: &mut Vec<GroupCommand>, reply_to: ReplyTo, request: OffsetCommitRequest) {
        if let Err(error) = self.admit_commit(out, &request) {
            reply(out, reply_to, GroupResponse::OffsetCommit(OffsetCommitResponse::all(&request, error)));
            return;
        }
        let mut response = OffsetCommitResponse::all(&request, ErrorCode::None);
        let mut records = Vec::new();
        let mut written = Vec::new();
        let commit_timestamp_ms = i64::try_from(self.now_ms).unwrap_or(i64::MAX);
        for (topic_index, topic) in request.topics.iter().enumerate() {
            for (partition_index, partition) in topic.partitions.iter().enumerate() {
                let metadata = partition.committed_metadata.clone().unwrap_or_default();
                let error = if metadata.len() > self.config.offset_metadata_bytes_max {
                    ErrorCode::OffsetMetadataTooLarge
                } else if topic.name.len() > RECORD_STRING_BYTES_MAX {
                    ErrorCode::InvalidTopicException
                } else {
                    ErrorCode::None
                };
                if error != ErrorCode::None {
                    response.topics[topic_index].partitions[partition_index].error = error;
                    continue;
                }
                let key = OffsetKey {
                    group_id: request.group_id.clone(),
                    topic: topic.name.clone(),
                    partition: partition.partition_index,
                };
                let value = CommittedOffset {
                    offset: partition.committed_offset,
                    leader_epoch: partition.committed_leader_epoch,
                    metadata,
                    commit_timestamp_ms,
                };
                records.push(OffsetRecord { key, value: Some(value) });
                written.push((topic_index, partition_index));
            }
        }
        if records.is_empty() {
            reply(out, reply_to, GroupResponse::OffsetCommit(response));
            return;
        }
        let Some(group) = self.groups.get_mut(&request.group_id) else {
            // admit_commit created or found it; answer rather than drop the reply.
            let response = OffsetCommitResponse::all(&request, ErrorCode::CoordinatorNotAvailable);
            reply(out, reply_to, GroupResponse::OffsetCommit(response));
            return;
        };
        group.commits_in_flight += 1;
        let incarnation = group.incarnation;
        let pending = PendingWrite::Commit {
            reply_to,
            group_id: request.group_id,
            incarnation,
            response,
            records: records.clone(),
            written,
        };
        self.persist(out, records, pending);
    }

    /// Kafka's commit rules: a consumer without group management (generation
    /// -1, no member id) may commit to an Empty or unknown group; members
    /// must name their current generation; none may commit while the group
    /// waits for the leader's assignment.
    fn admit_commit(&mut self, out: &mut Vec<GroupCommand>, request: &OffsetCommitRequest) -> Result<(), ErrorCode> {
        if request.group_id.len() > RECORD_STRING_BYTES_MAX {
            return Err(ErrorCode::InvalidGroupId);
        }
        if !self.groups.contains_key(&request.group_id) {
            if request.generation_id >= 0 {
                return Err(ErrorCode::IllegalGeneration);
            }
            if self.groups.len() >= self.config.groups_max {
                return Err(ErrorCode::CoordinatorNotAvailable);
            }
            self.group_or_create(request.group_id.clone());
        }
        self.with_group(out, &request.group_id, |group, ctx| {
            group.admit_commit(
                ctx.now_ms,
                request.generation_id,
                &request.member_id,
                request.group_instance_id.as_deref(),
            )
        })
        .unwrap_or(Err(ErrorCode::CoordinatorNotAvailable))
    }

    fn on_delete_groups(&mut self, out: &mut Vec<GroupCommand>, reply_to: ReplyTo, request: DeleteGroupsRequest) {
        let mut response = DeleteGroupsResponse::default();
        let mut tombstones = Vec::new();
        let mut written = Vec::new();
        for group_id in request.groups_names {
            let state = self.with_group(out, &group_id, |group, _| group.state);
            let error = match state {
                None | Some(GroupState::Dead) => ErrorCode::GroupIdNotFound,
                Some(GroupState::Empty) => ErrorCode::None,
                Some(_) => ErrorCode::NonEmptyGroup,
            };
            if error == ErrorCode::None {
                if let Some(group) = self.groups.remove(&group_id) {
                    let before = tombstones.len();
                    tombstones.extend(group.offsets.into_keys().map(|(topic, partition)| OffsetRecord {
                        key: OffsetKey { group_id: group_id.clone(), topic, partition },
                        value: None,
                    }));
                    if tombstones.len() > before {
                        written.push(response.results.len());
                    }
                }
            }
            response.results.push(DeletedGroup { group_id, error });
        }
        if tombstones.is_empty() {
            reply(out, reply_to, GroupResponse::DeleteGroups(response));
            return;
        }
        self.persist(out, tombstones, PendingWrite::Delete { reply_to, response, written });
    }

    fn on_offsets_persisted(
        &mut self,
        out: &mut Vec<GroupCommand>,
        persist_id: PersistId,
        result: Result<(), ErrorCode>,
    ) {
        // An id we never handed out, or one already reported: nothing waits.
        let Some(pending) = self.pending_writes.remove(&persist_id) else {
            return;
        };
        match pending {
            PendingWrite::Commit { reply_to, group_id, incarnation, mut response, records, written } => {
                let group = self.groups.get_mut(&group_id).filter(|g| g.incarnation == incarnation);
                if let Some(group) = group {
                    group.commits_in_flight = group.commits_in_flight.saturating_sub(1);
                    if result.is_ok() {
                        for record in records {
                            if let Some(value) = record.value {
                                group.offsets.insert((record.key.topic, record.key.partition), value);
                            }
                        }
                    }
                }
                if let Err(error) = result {
                    for (topic_index, partition_index) in written {
                        response.topics[topic_index].partitions[partition_index].error = error;
                    }
                }
                reply(out, reply_to, GroupResponse::OffsetCommit(response));
            }
            PendingWrite::Delete { reply_to, mut response, written } => {
                if let Err(error) = result {
                    for index in written {
                        response.results[index].error = error;
                    }
                }
                reply(out, reply_to, GroupResponse::DeleteGroups(response));
            }
        }
    }

    fn on_tick(&mut self, out: &mut Vec<GroupCommand>) {
        let mut ctx = Ctx { now_ms: self.now_ms, config: &self.config, out, member_numbers: &mut self.member_numbers };
        for group in self.groups.values_mut() {
            group.advance(&mut ctx);
        }
        self.groups.retain(|_, group| !group.is_disposable());
    }

    // ---- Helpers ---------------------------------------------------------

    /// Runs `handle` on a group after firing its due timers, then lets a
    /// rebalance that `handle` made ready complete.
    fn with_group<R>(
        &mut self,
        out: &mut Vec<GroupCommand>,
        group_id: &str,
        handle: impl FnOnce(&mut Group, &mut Ctx) -> R,
    ) -> Option<R> {
        let group = self.groups.get_mut(group_id)?;
        let mut ctx = Ctx { now_ms: self.now_ms, config: &self.config, out, member_numbers: &mut self.member_numbers };
        group.advance(&mut ctx);
        let result = handle(group, &mut ctx);
        group.try_complete_join(&mut ctx);
        Some(result)
    }

    fn group_or_create(&mut self, group_id: String) -> &mut Group {
        let next_incarnation = &mut self.next_incarnation;
        self.groups.entry(group_id).or_insert_with_key(|id| {
            let incarnation = *next_incarnation;
            *next_incarnation += 1;
            Group::new(id.clone(), incarnation)
        })
    }

    fn persist(&mut self, out: &mut Vec<GroupCommand>, records: Vec<OffsetRecord>, pending: PendingWrite) {
        let persist_id = PersistId(self.next_persist_id);
        self.next_persist_id += 1;
        self.pending_writes.insert(persist_id, pending);
        out.push(GroupCommand::PersistOffsets { persist_id, records });
    }
}

fn reply(out: &mut Vec<GroupCommand>, to: ReplyTo, response: GroupResponse) {
    out.push(GroupCommand::Reply { to, response });
}

fn fetched(partition_index: i32, committed: Option<&CommittedOffset>) -> OffsetFetchPartitionResponse {
    match committed {
        Some(c) => OffsetFetchPartitionResponse {
            partition_index,
            committed_offset: c.offset,
            committed_leader_epoch: c.leader_epoch,
            metadata: Some(c.metadata.clone()),
            error: ErrorCode::None,
        },
        None => OffsetFetchPartitionResponse::none(partition_index),
    }
}

/// Every committed partition of a group, topics in name order.
fn all_committed(group: &Group) -> Vec<OffsetFetchTopicResponse> {
    let mut topics: Vec<OffsetFetchTopicResponse> = Vec::new();
    for ((topic, partition), committed) in &group.offsets {
        let entry = fetched(*partition, Some(committed));
        match topics.last_mut() {
            Some(last) if &last.name == topic => last.partitions.push(entry),
            _ => topics.push(OffsetFetchTopicResponse { name: topic.clone(), partitions: vec![entry] }),
        }
    }
    topics
}
