//! Partition work on the core that owns the partition: routing from the
//! core a request arrived on, produce (validation, idempotence, append),
//! fetch, list offsets, and the answers each gives.

use std::rc::Rc;

use bytes::BytesMut;

use super::partition::{Partition, SequenceCheck};
use super::{fetch_sessions, report};
use super::{PartitionOp, PartitionReply, Shard, ShardId, ShardMessage};
use crate::cluster::metadata;
use crate::log::LogError;
use crate::protocol::fetch::FetchPartitionResponse;
use crate::protocol::list_offsets::{self, ListOffsetsPartitionResponse};
use crate::protocol::produce::ProducePartitionResponse;
use crate::protocol::record_batch::{self, BatchError};
use crate::protocol::ErrorCode;

impl Shard {
    /// Runs `op` on the partition's owner: here, or on another core.
    pub async fn partition_op(self: &Rc<Self>, topic: &str, partition: i32, op: PartitionOp) -> PartitionReply {
        let reply = self.route_partition_op(topic, partition, op).await;
        report::partition_reply(&reply);
        reply
    }

    async fn route_partition_op(self: &Rc<Self>, topic: &str, partition: i32, op: PartitionOp) -> PartitionReply {
        // Reads go to this machine's replica, leader or follower (KIP-392:
        // a follower serves up to its high watermark); the rest to the leader.
        let reads = matches!(op, PartitionOp::Fetch { .. });
        let owner = self.image().partition(topic, partition).map(|p| if reads { p.replica } else { p.shard });
        match owner {
            Some(shard) if shard == self.id => self.run_partition_op(topic, partition, op).await,
            Some(shard) => {
                // Made before `op` moves: cloning it would copy a produce's records.
                let unreachable = error_reply(&op, partition, ErrorCode::NotLeaderOrFollower);
                let (reply, receive) = flume::bounded(1);
                let message = ShardMessage::Partition { topic: topic.to_string(), partition, op, reply };
                match self.send(shard, message).await {
                    Ok(()) => receive.recv_async().await.unwrap_or(unreachable),
                    Err(()) => unreachable,
                }
            }
            None => error_reply(&op, partition, ErrorCode::UnknownTopicOrPartition),
        }
    }

    /// For each of `reads`: its answer when this core owns the partition
    /// and the log can answer without waiting (nothing new, or batches in
    /// its tail cache; at most `max_bytes(read)`), None when it needs the
    /// disk, another core or is unknown; and the other core that owns it.
    /// Most fetches of a consumer that keeps up touch many partitions with
    /// nothing new: this spares each of them a future, a routing step and a
    /// cross-core hop. The topic is looked up once for each run of reads of
    /// the same topic.
    pub fn fetch_now_each(
        &self,
        reads: &[fetch_sessions::Read],
        max_bytes: impl Fn(&fetch_sessions::Read) -> usize,
    ) -> Vec<(Option<FetchPartitionResponse>, Option<ShardId>)> {
        let image = self.image();
        let table = self.partitions.borrow();
        type Run<'a> = (&'a Rc<str>, Option<&'a metadata::TopicInfo>, Option<&'a [Option<Rc<Partition>>]>);
        let mut run: Option<Run> = None;
        let mut found: Vec<(Option<&Rc<Partition>>, Option<ShardId>)> = Vec::with_capacity(reads.len());
        for read in reads {
            let name = &read.wanted.topic;
            let (info, local) = match run {
                Some((last, info, local)) if Rc::ptr_eq(last, name) || **last == **name => (info, local),
                _ => {
                    let found = (image.topic(name), table.topic(name));
                    run = Some((name, found.0, found.1));
                    found
                }
            };
            let slot = usize::try_from(read.wanted.partition.index).ok();
            let owner = slot.and_then(|at| info?.partitions.get(at)).map(|p| p.replica);
            let remote = owner.filter(|owner| *owner != self.id);
            let partition = slot.and_then(|at| local?.get(at)?.as_ref()).filter(|_| owner == Some(self.id));
            found.push((partition, remote));
        }
        // Each partition's log state is a cache miss: touched first in a
        // loop of independent loads, the misses overlap instead of coming
        // one at a time inside each read.
        for (partition, _) in &found {
            if let Some(partition) = partition {
                std::hint::black_box(partition.log.high_watermark());
            }
        }
        reads
            .iter()
            .zip(found)
            .map(|(read, (partition, remote))| {
                let answer = partition.and_then(|partition| {
                    let read_now = partition.log.read_now(read.wanted.partition.fetch_offset, max_bytes(read))?;
                    let answer = fetch_answer(partition, read_now);
                    crate::metrics::record_error(crate::protocol::ApiKey::Fetch, answer.error);
                    Some(answer)
                });
                (answer, remote)
            })
            .collect()
    }

    /// Runs a partition operation on this core (the owner).
    pub async fn run_partition_op(&self, topic: &str, index: i32, op: PartitionOp) -> PartitionReply {
        let Some(partition) = self.local_partition(topic, index) else {
            let code = if self.image().partition(topic, index).is_some() {
                ErrorCode::NotLeaderOrFollower
            } else {
                ErrorCode::UnknownTopicOrPartition
            };
            return error_reply(&op, index, code);
        };
        match op {
            PartitionOp::Produce { records, acks, timeout_ms, request_bytes } => {
                let wait = Durability { acks, timeout_ms };
                PartitionReply::Produce(self.produce(&partition, records, request_bytes, wait).await)
            }
            PartitionOp::Fetch { offset, max_bytes } => {
                PartitionReply::Fetch(fetch(&partition, offset, max_bytes).await)
            }
            PartitionOp::ListOffsets { timestamp } => {
                PartitionReply::ListOffsets(list_offsets(&partition, timestamp).await)
            }
            PartitionOp::DeleteRecords { offset } => match partition.log.delete_records(offset).await {
                Ok(low_watermark) => {
                    self.readable_changed(&partition);
                    PartitionReply::DeleteRecords { low_watermark, error: ErrorCode::None }
                }
                Err(err) => PartitionReply::DeleteRecords { low_watermark: -1, error: log_error_code(&err) },
            },
            PartitionOp::OffsetForLeaderEpoch { current_leader_epoch, leader_epoch } => {
                offset_for_leader_epoch(&partition, current_leader_epoch, leader_epoch)
            }
        }
    }

    /// Validates, de-duplicates and appends one partition's record set. The
    /// appends happen before the first await, so requests keep their order.
    async fn produce(
        &self,
        partition: &Partition,
        records: Option<BytesMut>,
        request_bytes: usize,
        wait: Durability,
    ) -> ProducePartitionResponse {
        let index = partition.index;
        let Some(records) = records else {
            return ProducePartitionResponse::error(index, ErrorCode::CorruptMessage);
        };
        let log = &partition.log;
        if !partition.replica.leads() {
            return ProducePartitionResponse::error(index, ErrorCode::NotLeaderOrFollower);
        }
        // One copy of the config per request, not one per setting read.
        let (min_insync_replicas, batch_bytes_max) = {
            let config = log.config();
            (config.min_insync_replicas, config.batch_bytes_max)
        };
        let min_insync = min_insync_replicas.max(1) as usize;
        if wait.acks == -1 && !partition.replica.enough_in_sync(min_insync) {
            return ProducePartitionResponse::error(index, ErrorCode::NotEnoughReplicas);
        }
        let batches = match split_and_validate(records, batch_bytes_max) {
            Ok(batches) => batches,
            Err(code) => return ProducePartitionResponse::error(index, code),
        };
        let mut first_offset = None;
        let header_is_idempotent = batches.iter().any(|(_, header)| header.producer_id >= 0);
        // The last offset the answer waits for: of the batches appended
        // here, and of those this request repeats.
        let mut last_appended = None;
        for (data, header) in batches {
            match partition.check_sequence(&header) {
                Ok(SequenceCheck::Duplicate { base_offset }) => {
                    // A retry is answered as its first attempt would have
                    // been: once that batch is done under the flush policy.
                    // Answering at once acknowledged batches whose first
                    // attempt was still waiting for the disk, or had failed
                    // with the log (full disk), and were then lost.
                    first_offset.get_or_insert(base_offset);
                    let last = base_offset + i64::from(header.last_offset_delta);
                    last_appended = last_appended.max(Some(last));
                }
                Ok(SequenceCheck::Append) => match log.append(owned_for_cache(data, request_bytes), &header) {
                    Ok(appended) => {
                        crate::metrics::record_produced(&partition.topic, header.size_bytes, header.record_count);
                        partition.record_sequence(&header, appended.base_offset);
                        first_offset.get_or_insert(appended.base_offset);
                        last_appended = Some(appended.last_offset);
                    }
                    Err(err) => return ProducePartitionResponse::error(index, log_error_code(&err)),
                },
                Err(code) => return ProducePartitionResponse::error(index, code),
            }
        }
        if let Some(last) = last_appended {
            if first_offset.is_some() && header_is_idempotent {
                if let Err(err) = partition.snapshot_producers_if_none().await {
                    tracing::warn!(topic = %partition.topic, partition = index, error = %err, "writing the first producer snapshot failed");
                    return ProducePartitionResponse::error(index, ErrorCode::KafkaStorageError);
                }
            }
            if let Err(err) = log.wait_done(last).await {
                return ProducePartitionResponse::error(index, log_error_code(&err));
            }
            self.leader_log_moved(partition);
            self.readable_changed(partition);
            if wait.acks == -1 {
                let replicated = self.wait_replicated(partition, last, wait.timeout_ms).await;
                if !replicated.is_ok() {
                    return ProducePartitionResponse::error(index, replicated);
                }
            }
        }
        ProducePartitionResponse {
            index,
            error: ErrorCode::None,
            base_offset: first_offset.unwrap_or(-1),
            log_append_time_ms: -1,
            log_start_offset: log.log_start_offset(),
            error_message: None,
        }
    }
}

/// When a produce counts as done: `acks` (0 and 1: the leader's own flush
/// policy; -1: every in-sync replica) within `timeout_ms`.
#[derive(Debug, Clone, Copy)]
struct Durability {
    acks: i16,
    timeout_ms: i32,
}

/// OffsetForLeaderEpoch on the leader: where `leader_epoch` ends in this
/// log, from the leader-epoch cache (KIP-101). A log with no cache (one
/// replica, written before there was one) answers as before: the current
/// epoch ends at the log end.
fn offset_for_leader_epoch(partition: &Partition, current_leader_epoch: i32, leader_epoch: i32) -> PartitionReply {
    let reply =
        |leader_epoch, end_offset, error| PartitionReply::OffsetForLeaderEpoch { leader_epoch, end_offset, error };
    let (leads, current) = {
        let role = partition.replica.role.borrow();
        (role.leads(), role.leader_epoch())
    };
    if !leads {
        return reply(-1, -1, ErrorCode::NotLeaderOrFollower);
    }
    if current_leader_epoch > current {
        return reply(-1, -1, ErrorCode::UnknownLeaderEpoch);
    }
    if current_leader_epoch >= 0 && current_leader_epoch < current {
        return reply(-1, -1, ErrorCode::FencedLeaderEpoch);
    }
    let log_end = partition.log.log_end_offset();
    let epochs = partition.replica.epochs.borrow();
    if epochs.latest().is_none() {
        return if leader_epoch > current {
            reply(-1, -1, ErrorCode::None)
        } else {
            reply(current, log_end, ErrorCode::None)
        };
    }
    let (epoch, end) = epochs.end_offset_for(leader_epoch, log_end);
    reply(epoch, end, ErrorCode::None)
}

/// A batch the tail cache may keep: the request's slice itself when the
/// batch is at least half of the request, otherwise a copy, so that a small
/// batch in a long cache never keeps a large request's memory alive (what
/// the cache holds stays within twice what it counts).
fn owned_for_cache(batch: BytesMut, request_bytes: usize) -> BytesMut {
    if batch.len().saturating_mul(2) >= request_bytes {
        batch
    } else {
        BytesMut::from(&batch[..])
    }
}

fn split_and_validate(
    records: BytesMut,
    batch_bytes_max: usize,
) -> Result<Vec<(BytesMut, record_batch::BatchHeader)>, ErrorCode> {
    if records.len() > batch_bytes_max.saturating_mul(64) {
        return Err(ErrorCode::RecordListTooLarge);
    }
    let total = records.len();
    let batches = record_batch::split_batches_mut(records, usize::MAX).map_err(|e| e.error_code())?;
    let consumed: usize = batches.iter().map(BytesMut::len).sum();
    if consumed != total || batches.is_empty() {
        return Err(ErrorCode::CorruptMessage);
    }
    let mut out = Vec::with_capacity(batches.len());
    for data in batches {
        if data.len() > batch_bytes_max {
            return Err(ErrorCode::MessageTooLarge);
        }
        let header = record_batch::validate(&data, batch_bytes_max).map_err(|e: BatchError| e.error_code())?;
        if header.is_transactional() || header.is_control() {
            return Err(ErrorCode::InvalidRecord);
        }
        out.push((data, header));
    }
    Ok(out)
}

/// The answer for one partition's read (the fetch handler counts what it
/// sends in the fetch metrics).
pub fn fetch_answer(partition: &Partition, read: Result<crate::log::ReadOutput, LogError>) -> FetchPartitionResponse {
    let log = &partition.log;
    match read {
        Ok(read) => FetchPartitionResponse {
            index: partition.index,
            error: ErrorCode::None,
            high_watermark: read.high_watermark,
            last_stable_offset: read.high_watermark,
            log_start_offset: read.log_start_offset,
            records: read.batches,
            aborted_transactions: Vec::new(),
            preferred_read_replica: -1,
        },
        Err(err) => FetchPartitionResponse {
            index: partition.index,
            error: log_error_code(&err),
            high_watermark: log.high_watermark(),
            last_stable_offset: log.high_watermark(),
            log_start_offset: log.log_start_offset(),
            records: Vec::new(),
            aborted_transactions: Vec::new(),
            preferred_read_replica: -1,
        },
    }
}

/// The Kafka error code of a storage error (the one place they are mapped).
pub fn log_error_code(err: &LogError) -> ErrorCode {
    match err {
        LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
        LogError::Batch(batch) => batch.error_code(),
        LogError::BatchTooLarge { .. } => ErrorCode::MessageTooLarge,
        // Closed for shutdown (or deletion): the partition is leaving this
        // node, and a client retries elsewhere or after the restart.
        LogError::Closed => ErrorCode::NotLeaderOrFollower,
        LogError::NotContiguous { .. } => ErrorCode::UnknownServerError,
        LogError::Io { .. } | LogError::Failed(_) | LogError::Corrupt { .. } => ErrorCode::KafkaStorageError,
    }
}

fn error_reply(op: &PartitionOp, index: i32, code: ErrorCode) -> PartitionReply {
    match op {
        PartitionOp::Produce { .. } => PartitionReply::Produce(ProducePartitionResponse::error(index, code)),
        PartitionOp::Fetch { .. } => PartitionReply::Fetch(FetchPartitionResponse::error(index, code)),
        PartitionOp::ListOffsets { .. } => {
            PartitionReply::ListOffsets(ListOffsetsPartitionResponse::error(index, code))
        }
        PartitionOp::DeleteRecords { .. } => PartitionReply::DeleteRecords { low_watermark: -1, error: code },
        PartitionOp::OffsetForLeaderEpoch { .. } => {
            PartitionReply::OffsetForLeaderEpoch { leader_epoch: -1, end_offset: -1, error: code }
        }
    }
}

async fn fetch(partition: &Partition, offset: i64, max_bytes: usize) -> FetchPartitionResponse {
    fetch_answer(partition, partition.log.read(offset, max_bytes).await)
}

async fn list_offsets(partition: &Partition, timestamp: i64) -> ListOffsetsPartitionResponse {
    let log = &partition.log;
    let epoch = log.config().leader_epoch;
    let answer = |offset, timestamp| ListOffsetsPartitionResponse {
        index: partition.index,
        error: ErrorCode::None,
        timestamp,
        offset,
        leader_epoch: epoch,
    };
    match timestamp {
        list_offsets::LATEST_TIMESTAMP => answer(log.high_watermark(), -1),
        list_offsets::EARLIEST_TIMESTAMP => answer(log.log_start_offset(), -1),
        timestamp => match log.offset_for_timestamp(timestamp).await {
            Ok(Some((offset, found))) => answer(offset, found),
            Ok(None) => answer(-1, -1),
            Err(err) => ListOffsetsPartitionResponse::error(partition.index, log_error_code(&err)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_that_is_most_of_its_request_is_cached_in_place_a_small_one_is_copied() {
        let mut request = BytesMut::from(&[7u8; 1000][..]);
        let big = request.split_to(600);
        let small = request.split_to(100);
        let (big_at, small_at) = (big.as_ptr(), small.as_ptr());
        let big = owned_for_cache(big, 1000);
        let small = owned_for_cache(small, 1000);
        assert_eq!(big.as_ptr(), big_at, "half or more of the request: no copy");
        assert_ne!(small.as_ptr(), small_at, "a small share of the request: its own buffer");
        assert_eq!(&small[..], &[7u8; 100][..]);
        assert_eq!(small.capacity(), 100);
    }
}
