//! The consumer-group service of one core: one coordinator state machine
//! (`group::GroupCoordinator`) per partition of `__consumer_offsets` this
//! core leads, the replies it owes, and the committed offsets written to
//! that partition, which replicates them like any partition (issue 30).
//!
//! Placement is Kafka's: group `g` lives in partition
//! `offsets_partition(g, n)` of `__consumer_offsets`, and its coordinator
//! is that partition's leader (`MetadataImage::group_coordinator`). When
//! this core becomes a partition's leader it loads the partition's groups
//! by replaying its log (requests meanwhile get
//! COORDINATOR_LOAD_IN_PROGRESS); when it stops leading, the groups are
//! dropped and requests get NOT_COORDINATOR, so clients ask
//! FindCoordinator again and find the new leader, which loads them in
//! turn. A commit is answered once the partition's in-sync replicas hold
//! it (acks=all), so a failover never loses an acknowledged commit.
//!
//! Only committed offsets are written, not group membership: after a
//! coordinator moves, members rejoin (a rebalance), and keep reading from
//! their committed offsets.
//!
//! Each partition's log is compacted by snapshot: when it holds many more
//! records than live offsets, the partition's current offsets are appended
//! again and the log start moves to the first of them (followers follow the
//! log start), so whole old segments are deleted.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::{Rc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::channel::oneshot;

use super::Shard;
use crate::cluster::metadata::offsets_partition;
use crate::constants::{OFFSETS_COMMIT_TIMEOUT_MS, OFFSETS_TOPIC};
use crate::group::GroupConfig;
use crate::group::OffsetRecord;
use crate::group::{ClientInfo, GroupCommand, GroupCoordinator, GroupEvent, GroupResponse, PersistId, ReplyTo};
use crate::log::{Log, LogError};
use crate::protocol::delete_groups::DeleteGroupsRequest;
use crate::protocol::describe_groups::{DescribeGroupsRequest, DescribeGroupsResponse};
use crate::protocol::heartbeat::HeartbeatRequest;
use crate::protocol::join_group::JoinGroupRequest;
use crate::protocol::leave_group::LeaveGroupRequest;
use crate::protocol::list_groups::ListGroupsResponse;
use crate::protocol::offset_commit::OffsetCommitRequest;
use crate::protocol::offset_fetch::{OffsetFetchRequest, OffsetFetchResponse};
use crate::protocol::record_batch::{self, encode_batch, ProducerFields, Record};
use crate::protocol::sync_group::SyncGroupRequest;
use crate::protocol::ErrorCode;
use crate::replica::Role;

/// A group request, routed to the core that owns the group.
#[derive(Debug, Clone)]
pub enum GroupRequest {
    Join { api_version: i16, client: ClientInfo, request: JoinGroupRequest },
    Sync { request: SyncGroupRequest },
    Heartbeat { request: HeartbeatRequest },
    Leave { api_version: i16, request: LeaveGroupRequest },
    OffsetCommit { request: OffsetCommitRequest },
    DeleteGroups { request: DeleteGroupsRequest },
    OffsetFetch { request: OffsetFetchRequest },
    Describe { request: DescribeGroupsRequest },
    List,
}

impl GroupRequest {
    /// The group the request is about (`None` for List; DeleteGroups and
    /// Describe are sent one group at a time).
    fn group_id(&self) -> Option<&str> {
        let id = match self {
            GroupRequest::Join { request, .. } => &request.group_id,
            GroupRequest::Sync { request } => &request.group_id,
            GroupRequest::Heartbeat { request } => &request.group_id,
            GroupRequest::Leave { request, .. } => &request.group_id,
            GroupRequest::OffsetCommit { request } => &request.group_id,
            GroupRequest::DeleteGroups { request } => request.groups_names.first()?,
            GroupRequest::OffsetFetch { request } => &request.group_id,
            GroupRequest::Describe { request } => request.groups.first()?,
            GroupRequest::List => return None,
        };
        Some(id)
    }
}

#[derive(Debug, Clone)]
pub enum GroupAnswer {
    Response(GroupResponse),
    OffsetFetch(OffsetFetchResponse),
    Describe(DescribeGroupsResponse),
    List(ListGroupsResponse),
    /// Not served here, with the code that tells the client what to do:
    /// NOT_COORDINATOR (ask FindCoordinator again),
    /// COORDINATOR_LOAD_IN_PROGRESS (retry), COORDINATOR_NOT_AVAILABLE.
    Refused(ErrorCode),
    /// The service stopped before answering.
    Unavailable,
}

/// Compact a partition when it holds this many more records than live
/// offsets.
const COMPACT_SLACK_RECORDS: i64 = 50_000;
const TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Bytes read per step while loading a partition's groups.
const LOAD_READ_BYTES: usize = 1 << 20;
/// How long a request waits for its partition's load.
const LOAD_WAIT: Duration = Duration::from_secs(2);
/// Wait before loading again after a read failed.
const LOAD_RETRY: Duration = Duration::from_millis(500);

pub struct GroupService {
    shard: Weak<Shard>,
    config: GroupConfig,
    /// The `__consumer_offsets` partitions this core leads, by index.
    slots: RefCell<BTreeMap<i32, Slot>>,
    /// Replies owed, with the partition whose coordinator owes them.
    waiting: RefCell<HashMap<u64, (i32, oneshot::Sender<GroupResponse>)>>,
    next_reply: Cell<u64>,
    /// Numbers each load, so work begun for one load never lands in the next.
    loads: Cell<u64>,
}

struct Slot {
    load: u64,
    leader_epoch: i32,
    state: SlotState,
}

enum SlotState {
    Loading,
    Loaded { coordinator: Box<GroupCoordinator>, compacting: bool },
}

#[derive(Debug, thiserror::Error)]
pub enum GroupServiceError {
    #[error("group config: {0}")]
    Config(#[from] crate::group::GroupConfigError),
}

/// What a load found.
#[derive(Debug, Default)]
struct Loaded {
    records: u64,
    undecodable: u64,
}

impl GroupService {
    pub fn new(shard: Weak<Shard>, config: GroupConfig) -> Result<Rc<Self>, GroupServiceError> {
        GroupCoordinator::new(config.clone())?;
        Ok(Rc::new(Self {
            shard,
            config,
            slots: RefCell::new(BTreeMap::new()),
            waiting: RefCell::new(HashMap::new()),
            next_reply: Cell::new(1),
            loads: Cell::new(0),
        }))
    }

    pub async fn handle(self: &Rc<Self>, request: GroupRequest) -> GroupAnswer {
        let Some(group_id) = request.group_id().map(str::to_owned) else {
            return GroupAnswer::List(self.list_groups());
        };
        let Some(shard) = self.shard.upgrade() else { return GroupAnswer::Unavailable };
        let partitions = shard.image().offsets_partitions();
        if partitions == 0 {
            return GroupAnswer::Refused(ErrorCode::CoordinatorNotAvailable);
        }
        let index = offsets_partition(&group_id, partitions);
        self.await_partition_loaded(index).await;
        let now = crate::log::now_ms();
        let reply_to = ReplyTo(self.next_reply.get());
        self.next_reply.set(reply_to.0 + 1);
        let joining = matches!(request, GroupRequest::Join { .. });
        let event = {
            let slots = self.slots.borrow();
            let coordinator = match slots.get(&index).map(|slot| &slot.state) {
                None => return GroupAnswer::Refused(ErrorCode::NotCoordinator),
                Some(SlotState::Loading) => return GroupAnswer::Refused(ErrorCode::CoordinatorLoadInProgress),
                Some(SlotState::Loaded { coordinator, .. }) => coordinator,
            };
            match request {
                GroupRequest::Join { api_version, client, request } => {
                    GroupEvent::Join { reply_to, api_version, client, request }
                }
                GroupRequest::Sync { request } => GroupEvent::Sync { reply_to, request },
                GroupRequest::Heartbeat { request } => GroupEvent::Heartbeat { reply_to, request },
                GroupRequest::Leave { api_version, request } => GroupEvent::Leave { reply_to, api_version, request },
                GroupRequest::OffsetCommit { request } => GroupEvent::OffsetCommit { reply_to, request },
                GroupRequest::DeleteGroups { request } => GroupEvent::DeleteGroups { reply_to, request },
                GroupRequest::OffsetFetch { request } => {
                    return GroupAnswer::OffsetFetch(coordinator.fetch_offsets(&request))
                }
                GroupRequest::Describe { request } => {
                    return GroupAnswer::Describe(coordinator.describe_groups(&request))
                }
                GroupRequest::List => return GroupAnswer::List(coordinator.list_groups()),
            }
        };
        let (sender, receiver) = oneshot::channel();
        self.waiting.borrow_mut().insert(reply_to.0, (index, sender));
        self.step(index, now, event);
        match receiver.await {
            Ok(response) => {
                crate::metrics::record_group_response(&response);
                if let (true, GroupResponse::Join(join)) = (joining, &response) {
                    log_generation(&group_id, join);
                }
                GroupAnswer::Response(response)
            }
            // The partition's groups were dropped: another replica leads it.
            Err(_) => GroupAnswer::Refused(ErrorCode::NotCoordinator),
        }
    }

    /// ListGroups: the groups of every partition loaded here, in id order.
    fn list_groups(&self) -> ListGroupsResponse {
        let mut answer = ListGroupsResponse { throttle_time_ms: 0, error: ErrorCode::None, groups: Vec::new() };
        for slot in self.slots.borrow().values() {
            match &slot.state {
                SlotState::Loaded { coordinator, .. } => answer.groups.extend(coordinator.list_groups().groups),
                SlotState::Loading => answer.error = ErrorCode::CoordinatorLoadInProgress,
            }
        }
        answer.groups.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        answer
    }

    /// What a scrape reports about this core's groups (`metrics`).
    pub fn snapshot(&self) -> crate::metrics::GroupsSnapshot {
        let mut snapshot = crate::metrics::GroupsSnapshot::default();
        for slot in self.slots.borrow().values() {
            let SlotState::Loaded { coordinator, .. } = &slot.state else { continue };
            snapshot.groups += coordinator.group_count();
            let committed = coordinator.snapshot_offsets().unwrap_or_default();
            snapshot.committed.extend(committed.into_iter().filter_map(|record| {
                let value = record.value?;
                Some(crate::metrics::CommittedSnapshot {
                    group: record.key.group_id,
                    topic: record.key.topic,
                    partition: record.key.partition,
                    offset: value.offset,
                })
            }));
        }
        if let Some(shard) = self.shard.upgrade() {
            snapshot.offsets_log_bytes = shard
                .local_partitions()
                .iter()
                .filter(|p| &*p.topic == OFFSETS_TOPIC)
                .map(|p| p.log.size_bytes())
                .sum();
        }
        snapshot
    }

    /// The role of `__consumer_offsets` partition `index` on this core
    /// changed: `leading` with the leader epoch, or not (follower, or no
    /// longer here). A new leadership loads the partition's groups; a lost
    /// one drops them and the replies they owed (NOT_COORDINATOR).
    pub fn role_changed(self: &Rc<Self>, index: i32, leading: Option<i32>) {
        {
            let slots = self.slots.borrow();
            match (slots.get(&index), leading) {
                (Some(slot), Some(epoch)) if slot.leader_epoch == epoch => return,
                (None, None) => return,
                _ => {}
            }
        }
        if self.slots.borrow_mut().remove(&index).is_some() {
            self.waiting.borrow_mut().retain(|_, (partition, _)| *partition != index);
            tracing::info!(
                partition = index,
                "dropped the groups of a __consumer_offsets partition no longer led here"
            );
        }
        let Some(leader_epoch) = leading else { return };
        let load = self.loads.get() + 1;
        self.loads.set(load);
        self.slots.borrow_mut().insert(index, Slot { load, leader_epoch, state: SlotState::Loading });
        let service = self.clone();
        glommio::spawn_local(async move { service.load(index, load).await }).detach();
    }

    /// Waits until no partition is loading, or `within` has passed (a
    /// starting core serves its groups from its first request).
    pub async fn await_loaded(&self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline
            && self.slots.borrow().values().any(|slot| matches!(slot.state, SlotState::Loading))
        {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A request for a partition being loaded waits a little for the load
    /// (most take milliseconds) before it is refused with
    /// COORDINATOR_LOAD_IN_PROGRESS, which clients retry after a backoff.
    async fn await_partition_loaded(&self, index: i32) {
        let deadline = std::time::Instant::now() + LOAD_WAIT;
        while std::time::Instant::now() < deadline
            && self.slots.borrow().get(&index).is_some_and(|slot| matches!(slot.state, SlotState::Loading))
        {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }

    fn is_load(&self, index: i32, load: u64) -> bool {
        self.slots.borrow().get(&index).is_some_and(|slot| slot.load == load)
    }

    /// Replays partition `index` into a new coordinator, retrying reads
    /// that fail, until it is loaded or no longer wanted.
    async fn load(self: Rc<Self>, index: i32, load: u64) {
        let started = std::time::Instant::now();
        while self.is_load(index, load) {
            match self.read_partition(index, load).await {
                Ok((coordinator, found)) => {
                    let groups = coordinator.group_count();
                    let mut slots = self.slots.borrow_mut();
                    let Some(slot) = slots.get_mut(&index).filter(|slot| slot.load == load) else { return };
                    slot.state = SlotState::Loaded { coordinator: Box::new(coordinator), compacting: false };
                    let leader_epoch = slot.leader_epoch;
                    drop(slots);
                    if found.undecodable > 0 {
                        tracing::warn!(
                            partition = index,
                            undecodable = found.undecodable,
                            "records of __consumer_offsets that are not offset commits were skipped"
                        );
                    }
                    let ms = started.elapsed().as_millis() as u64;
                    if found.records > 0 {
                        tracing::info!(
                            partition = index,
                            leader_epoch,
                            groups,
                            records = found.records,
                            ms,
                            "loaded the groups of a __consumer_offsets partition"
                        );
                    } else {
                        tracing::debug!(
                            partition = index,
                            leader_epoch,
                            ms,
                            "leading an empty __consumer_offsets partition"
                        );
                    }
                    return;
                }
                Err(err) => {
                    tracing::warn!(partition = index, error = %err, "loading groups failed; retrying");
                    glommio::timer::sleep(LOAD_RETRY).await;
                }
            }
        }
    }

    /// Reads partition `index` from its log start to its end (past the high
    /// watermark: a leader's log is the truth it will commit).
    async fn read_partition(&self, index: i32, load: u64) -> Result<(GroupCoordinator, Loaded), LogError> {
        let shard = self.shard.upgrade().ok_or(LogError::Closed)?;
        let partition = shard.local_partition(OFFSETS_TOPIC, index).ok_or(LogError::Closed)?;
        let config = GroupConfig {
            member_id_seed: self.config.member_id_seed ^ load.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ..self.config.clone()
        };
        let mut coordinator = GroupCoordinator::new(config)
            .map_err(|e| LogError::io(partition.log.dir(), std::io::Error::other(e.to_string())))?;
        let mut found = Loaded::default();
        let log = &partition.log;
        let end = log.local_end_offset();
        let mut offset = log.log_start_offset();
        while offset < end {
            let read = log.read_for_replica(offset, LOAD_READ_BYTES).await?;
            let Some(last) = read.batches.last() else { break };
            offset = record_batch::BatchHeader::parse(last, usize::MAX).map_err(LogError::from)?.last_offset() + 1;
            for batch in &read.batches {
                let Ok(records) = record_batch::decode_records(batch) else {
                    found.undecodable += 1;
                    continue;
                };
                for record in records {
                    match OffsetRecord::decode(record.key.unwrap_or_default(), record.value) {
                        Ok(decoded) => {
                            coordinator.replay(decoded);
                            found.records += 1;
                        }
                        Err(_) => found.undecodable += 1,
                    }
                }
            }
        }
        Ok((coordinator, found))
    }

    /// Feeds one event to partition `index`'s coordinator and carries out
    /// the commands it produces.
    fn step(self: &Rc<Self>, index: i32, now_ms: u64, event: GroupEvent) {
        let (load, commands) = {
            let mut slots = self.slots.borrow_mut();
            let Some(slot) = slots.get_mut(&index) else { return };
            let SlotState::Loaded { coordinator, .. } = &mut slot.state else { return };
            (slot.load, coordinator.step(now_ms, event))
        };
        for command in commands {
            match command {
                GroupCommand::Reply { to, response } => {
                    if let Some((_, sender)) = self.waiting.borrow_mut().remove(&to.0) {
                        let _ = sender.send(response);
                    }
                }
                GroupCommand::PersistOffsets { persist_id, records } => self.persist(index, load, persist_id, &records),
            }
        }
    }

    /// Appends the records now (keeping their order) and reports back to the
    /// state machine once the partition's in-sync replicas hold them.
    fn persist(self: &Rc<Self>, index: i32, load: u64, persist_id: PersistId, records: &[OffsetRecord]) {
        let appended = self.append(index, records);
        let service = self.clone();
        glommio::spawn_local(async move {
            let result = match appended {
                Ok(Some((partition, last))) => service.replicated(&partition, last).await,
                Ok(None) => Ok(()),
                Err(code) => Err(code),
            };
            if service.is_load(index, load) {
                service.step(index, crate::log::now_ms(), GroupEvent::OffsetsPersisted { persist_id, result });
            }
        })
        .detach();
    }

    /// Appends `records` to partition `index` as its leader, before any
    /// await; returns the partition and the last offset written.
    fn append(
        &self,
        index: i32,
        records: &[OffsetRecord],
    ) -> Result<Option<(Rc<super::partition::Partition>, i64)>, ErrorCode> {
        let shard = self.shard.upgrade().ok_or(ErrorCode::CoordinatorNotAvailable)?;
        let partition = shard.local_partition(OFFSETS_TOPIC, index).ok_or(ErrorCode::NotCoordinator)?;
        if !partition.replica.leads() {
            return Err(ErrorCode::NotCoordinator);
        }
        let min_insync = partition.log.config().min_insync_replicas.max(1) as usize;
        if !partition.replica.enough_in_sync(min_insync) {
            return Err(commit_error(ErrorCode::NotEnoughReplicas));
        }
        let last = append_records(&partition.log, records).map_err(commit_error)?;
        Ok(last.map(|last| (partition, last)))
    }

    /// Waits until `last` is written here and held by the in-sync replicas
    /// (acks=all, as Kafka writes offset commits).
    async fn replicated(&self, partition: &super::partition::Partition, last: i64) -> Result<(), ErrorCode> {
        let shard = self.shard.upgrade().ok_or(ErrorCode::CoordinatorNotAvailable)?;
        partition.log.wait_done(last).await.map_err(|e| commit_error(crate::shard::log_error_code(&e)))?;
        shard.leader_log_moved(partition);
        shard.readable_changed(partition);
        match shard.wait_replicated(partition, last, OFFSETS_COMMIT_TIMEOUT_MS).await {
            ErrorCode::None => Ok(()),
            code => Err(commit_error(code)),
        }
    }

    /// Session expiry, delayed rebalances, and compaction, for every
    /// partition loaded here.
    pub async fn run_ticks(self: Rc<Self>, stop: Rc<Cell<bool>>) {
        while !stop.get() {
            glommio::timer::sleep(TICK_INTERVAL).await;
            let now = crate::log::now_ms();
            let loaded: Vec<i32> = self
                .slots
                .borrow()
                .iter()
                .filter(|(_, slot)| matches!(slot.state, SlotState::Loaded { .. }))
                .map(|(index, _)| *index)
                .collect();
            for index in loaded {
                self.step(index, now, GroupEvent::Tick);
                if let Err(err) = self.compact_if_due(index).await {
                    tracing::warn!(partition = index, error = ?err, "compacting a __consumer_offsets partition failed");
                }
            }
        }
    }

    fn set_compacting(&self, index: i32, load: u64, value: bool) {
        if let Some(slot) = self.slots.borrow_mut().get_mut(&index).filter(|slot| slot.load == load) {
            if let SlotState::Loaded { compacting, .. } = &mut slot.state {
                *compacting = value;
            }
        }
    }

    async fn compact_if_due(self: &Rc<Self>, index: i32) -> Result<(), ErrorCode> {
        let (load, live) = {
            let slots = self.slots.borrow();
            let Some(slot) = slots.get(&index) else { return Ok(()) };
            let SlotState::Loaded { coordinator, compacting: false } = &slot.state else { return Ok(()) };
            let Some(live) = coordinator.snapshot_offsets() else { return Ok(()) };
            (slot.load, live)
        };
        let Some(shard) = self.shard.upgrade() else { return Ok(()) };
        let Some(partition) = shard.local_partition(OFFSETS_TOPIC, index) else { return Ok(()) };
        let log = &partition.log;
        let held = log.log_end_offset() - log.log_start_offset();
        if held < live.len() as i64 + COMPACT_SLACK_RECORDS {
            return Ok(());
        }
        self.set_compacting(index, load, true);
        let start = log.log_end_offset();
        let result = async {
            if let Some((partition, last)) = self.append(index, &live)? {
                self.replicated(&partition, last).await?;
                partition.log.delete_records(start).await.map_err(|e| crate::shard::log_error_code(&e))?;
                shard.readable_changed(&partition);
            }
            Ok(())
        }
        .await;
        self.set_compacting(index, load, false);
        if result.is_ok() {
            tracing::info!(
                partition = index,
                live = live.len(),
                dropped = held,
                "compacted a __consumer_offsets partition"
            );
        }
        result
    }
}

/// What an offset commit answers when writing its records failed, as
/// Kafka's coordinator maps the write's error.
fn commit_error(code: ErrorCode) -> ErrorCode {
    match code {
        ErrorCode::UnknownTopicOrPartition
        | ErrorCode::NotEnoughReplicas
        | ErrorCode::NotEnoughReplicasAfterAppend
        | ErrorCode::RequestTimedOut => ErrorCode::CoordinatorNotAvailable,
        ErrorCode::NotLeaderOrFollower | ErrorCode::KafkaStorageError => ErrorCode::NotCoordinator,
        ErrorCode::MessageTooLarge | ErrorCode::RecordListTooLarge | ErrorCode::InvalidFetchSize => {
            ErrorCode::InvalidCommitOffsetSize
        }
        other => other,
    }
}

/// Whether `role` leads, and in which leader epoch.
pub fn leading_epoch(role: &Role) -> Option<i32> {
    match role {
        Role::Sole { leader_epoch } => Some(*leader_epoch),
        Role::Leader(state) => Some(state.leader_epoch()),
        Role::Follower { .. } => None,
    }
}

/// A generation is complete when its leader gets its JoinGroup answer:
/// exactly one such answer per generation, so one line per rebalance.
fn log_generation(group_id: &str, join: &crate::protocol::join_group::JoinGroupResponse) {
    if join.error == ErrorCode::None && !join.leader.is_empty() && join.leader == join.member_id {
        crate::metrics::record_rebalance();
        tracing::info!(
            group = %group_id,
            generation = join.generation_id,
            members = join.members.len(),
            protocol = %join.protocol_name,
            leader = %join.leader,
            "group rebalanced"
        );
    }
}

/// Appends offset records as batches; returns the last offset written.
fn append_records(log: &Log, records: &[OffsetRecord]) -> Result<Option<i64>, ErrorCode> {
    let mut last = None;
    for chunk in records.chunks(500) {
        let encoded: Vec<Record> = chunk
            .iter()
            .enumerate()
            .map(|(i, record)| {
                let encoded = record.encode().map_err(|_| ErrorCode::InvalidRequest)?;
                Ok(Record {
                    key: Some(encoded.key),
                    value: encoded.value,
                    headers: Vec::new(),
                    timestamp_delta: 0,
                    offset_delta: i as i32,
                })
            })
            .collect::<Result<_, ErrorCode>>()?;
        if encoded.is_empty() {
            continue;
        }
        let batch: Bytes = encode_batch(&encoded, crate::log::now_ms() as i64, ProducerFields::NONE);
        let header = record_batch::BatchHeader::parse(&batch, usize::MAX).map_err(|e| e.error_code())?;
        let appended = log.append(BytesMut::from(batch), &header).map_err(|e| crate::shard::log_error_code(&e))?;
        last = Some(appended.last_offset);
    }
    Ok(last)
}
