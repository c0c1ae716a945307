//! The consumer-group service of one core: drives the pure coordinator state
//! machine (`group`) for the groups hashed to this core, holds the replies it
//! owes, and keeps committed offsets durable in this core's internal offsets
//! log (`data/__groups/core-<n>/`, outside the topic namespace).
//!
//! Group placement: `MetadataImage::group_coordinator` (a machine by
//! rendezvous hash, then its core `crc32(group_id) % cores`). CRC-32 is
//! stable across runs and machines (unlike std's SipHash with random keys),
//! cheap, and spreads short ids well enough for a handful of cores.
//!
//! The offsets log is compacted by snapshot: when it holds many more records
//! than live offsets, the current offsets are appended again and the log
//! start moves to the first of them, so whole old segments are deleted.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::channel::oneshot;

use crate::group::GroupConfig;
use crate::group::OffsetRecord;
use crate::group::{ClientInfo, GroupCommand, GroupCoordinator, GroupEvent, GroupResponse, PersistId, ReplyTo};
use crate::log::{FlushPolicy, Log, LogConfig, LogError};
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

#[derive(Debug, Clone)]
pub enum GroupAnswer {
    Response(GroupResponse),
    OffsetFetch(OffsetFetchResponse),
    Describe(DescribeGroupsResponse),
    List(ListGroupsResponse),
    /// The service stopped before answering.
    Unavailable,
}

/// Offsets log segments are small so that compaction frees space soon.
const OFFSETS_SEGMENT_BYTES: u64 = 16 << 20;
/// Compact when the log holds this many more records than live offsets.
const COMPACT_SLACK_RECORDS: i64 = 50_000;
const TICK_INTERVAL: Duration = Duration::from_millis(100);

pub struct GroupService {
    coordinator: RefCell<GroupCoordinator>,
    log: Log,
    waiting: RefCell<HashMap<u64, oneshot::Sender<GroupResponse>>>,
    next_reply: Cell<u64>,
    compacting: Cell<bool>,
}

#[derive(Debug, thiserror::Error)]
pub enum GroupServiceError {
    /// Names the file; `CoreStartError::Groups` says it is the offsets log.
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("group config: {0}")]
    Config(#[from] crate::group::GroupConfigError),
    #[error("offsets log record does not decode: {0}")]
    Record(String),
}

impl GroupService {
    /// Opens this core's offsets log and replays it into a new coordinator.
    pub async fn open(dir: &Path, config: GroupConfig) -> Result<Rc<Self>, GroupServiceError> {
        let log_config = LogConfig {
            flush: FlushPolicy::Always,
            segment_bytes: OFFSETS_SEGMENT_BYTES,
            retention_ms: -1,
            retention_bytes: -1,
            batch_bytes_max: 8 << 20,
            ..LogConfig::default()
        };
        let (log, _) = Log::open(dir, log_config).await?;
        let mut coordinator = GroupCoordinator::new(config)?;
        let mut offset = log.log_start_offset();
        while offset < log.high_watermark() {
            let read = log.read(offset, 1 << 20).await?;
            let Some(last) = read.batches.last() else { break };
            offset = record_batch::BatchHeader::parse(last, usize::MAX).map_err(LogError::from)?.last_offset() + 1;
            for batch in &read.batches {
                let records =
                    record_batch::decode_records(batch).map_err(|e| GroupServiceError::Record(e.to_string()))?;
                for record in records {
                    let key = record.key.unwrap_or_default();
                    let decoded = OffsetRecord::decode(key, record.value)
                        .map_err(|e| GroupServiceError::Record(e.to_string()))?;
                    coordinator.replay(decoded);
                }
            }
        }
        Ok(Rc::new(Self {
            coordinator: RefCell::new(coordinator),
            log,
            waiting: RefCell::new(HashMap::new()),
            next_reply: Cell::new(1),
            compacting: Cell::new(false),
        }))
    }

    pub async fn handle(self: &Rc<Self>, request: GroupRequest) -> GroupAnswer {
        let now = crate::log::now_ms();
        let reply_to = ReplyTo(self.next_reply.get());
        self.next_reply.set(reply_to.0 + 1);
        let joining = match &request {
            GroupRequest::Join { request, .. } => Some(request.group_id.clone()),
            _ => None,
        };
        let event = match request {
            GroupRequest::Join { api_version, client, request } => {
                GroupEvent::Join { reply_to, api_version, client, request }
            }
            GroupRequest::Sync { request } => GroupEvent::Sync { reply_to, request },
            GroupRequest::Heartbeat { request } => GroupEvent::Heartbeat { reply_to, request },
            GroupRequest::Leave { api_version, request } => GroupEvent::Leave { reply_to, api_version, request },
            GroupRequest::OffsetCommit { request } => GroupEvent::OffsetCommit { reply_to, request },
            GroupRequest::DeleteGroups { request } => GroupEvent::DeleteGroups { reply_to, request },
            GroupRequest::OffsetFetch { request } => {
                return GroupAnswer::OffsetFetch(self.coordinator.borrow().fetch_offsets(&request))
            }
            GroupRequest::Describe { request } => {
                return GroupAnswer::Describe(self.coordinator.borrow().describe_groups(&request))
            }
            GroupRequest::List => return GroupAnswer::List(self.coordinator.borrow().list_groups()),
        };
        let (sender, receiver) = oneshot::channel();
        self.waiting.borrow_mut().insert(reply_to.0, sender);
        self.step(now, event);
        match receiver.await {
            Ok(response) => {
                crate::metrics::record_group_response(&response);
                if let (Some(group_id), GroupResponse::Join(join)) = (joining, &response) {
                    log_generation(&group_id, join);
                }
                GroupAnswer::Response(response)
            }
            Err(_) => GroupAnswer::Unavailable,
        }
    }

    /// What a scrape reports about this core's groups (`metrics`).
    pub fn snapshot(&self) -> crate::metrics::GroupsSnapshot {
        let coordinator = self.coordinator.borrow();
        let committed = coordinator.snapshot_offsets().unwrap_or_default();
        crate::metrics::GroupsSnapshot {
            groups: coordinator.group_count(),
            offsets_log_bytes: self.log.size_bytes(),
            committed: committed
                .into_iter()
                .filter_map(|record| {
                    let value = record.value?;
                    Some(crate::metrics::CommittedSnapshot {
                        group: record.key.group_id,
                        topic: record.key.topic,
                        partition: record.key.partition,
                        offset: value.offset,
                    })
                })
                .collect(),
        }
    }

    /// Feeds one event and carries out the commands it produces.
    fn step(self: &Rc<Self>, now_ms: u64, event: GroupEvent) {
        let commands = self.coordinator.borrow_mut().step(now_ms, event);
        for command in commands {
            match command {
                GroupCommand::Reply { to, response } => {
                    if let Some(sender) = self.waiting.borrow_mut().remove(&to.0) {
                        let _ = sender.send(response);
                    }
                }
                GroupCommand::PersistOffsets { persist_id, records } => self.persist(persist_id, &records),
            }
        }
    }

    /// Appends the records now (keeping their order) and reports back to the
    /// state machine once they are durable.
    fn persist(self: &Rc<Self>, persist_id: PersistId, records: &[OffsetRecord]) {
        let appended = append_records(&self.log, records);
        let service = self.clone();
        glommio::spawn_local(async move {
            let result = match appended {
                Ok(Some(last)) => service.log.wait_done(last).await.map_err(|e| crate::shard::log_error_code(&e)),
                Ok(None) => Ok(()),
                Err(code) => Err(code),
            };
            service.step(crate::log::now_ms(), GroupEvent::OffsetsPersisted { persist_id, result });
        })
        .detach();
    }

    /// Session expiry, delayed rebalances, and offsets log compaction.
    pub async fn run_ticks(self: Rc<Self>, stop: Rc<Cell<bool>>) {
        while !stop.get() {
            glommio::timer::sleep(TICK_INTERVAL).await;
            self.step(crate::log::now_ms(), GroupEvent::Tick);
            if let Err(err) = self.compact_if_due().await {
                tracing::warn!(error = %err, "offsets log compaction failed");
            }
        }
    }

    async fn compact_if_due(self: &Rc<Self>) -> Result<(), LogError> {
        if self.compacting.get() {
            return Ok(());
        }
        let Some(live) = self.coordinator.borrow().snapshot_offsets() else { return Ok(()) };
        let held = self.log.log_end_offset() - self.log.log_start_offset();
        if held < live.len() as i64 + COMPACT_SLACK_RECORDS {
            return Ok(());
        }
        self.compacting.set(true);
        let start = self.log.log_end_offset();
        let result = async {
            if let Ok(Some(last)) = append_records(&self.log, &live) {
                self.log.wait_done(last).await?;
            }
            self.log.delete_records(start).await.map(|_| ())
        }
        .await;
        self.compacting.set(false);
        tracing::info!(live = live.len(), dropped = held, "compacted the offsets log");
        result
    }

    pub async fn close(&self) {
        if let Err(err) = self.log.close().await {
            tracing::error!(error = %err, "closing the offsets log failed");
        }
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
