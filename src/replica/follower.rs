//! The follower fetcher: one task per (core, leader node) this core
//! follows partitions from, on the core that owns them. It talks to the
//! leader's own core (every core is a node with its own port), so neither
//! end makes a cross-core hop.
//!
//! Each round: for partitions whose leader epoch is new, ask the leader
//! with OffsetForLeaderEpoch where this follower's latest epoch ends and
//! cut the log there (KIP-101/279), repeating until the two agree; then
//! one Fetch (`replica_id` = this core's node) for every partition that is
//! ready, from each one's log end. Batches are validated (CRC) and
//! appended as they are; the high watermark from the response applies
//! only after the append (KAFKA-14704) and never above what is durable
//! here. The fetch offset of the next round tells the leader what this
//! follower holds: the leader's acks=all waits on it.

use std::rc::Rc;
use std::time::Duration;

use crate::client::pipelined::{Connection, ConnectionOptions};
use crate::constants::{
    BATCH_BYTES_MAX_LIMIT, REPLICA_FETCH_BYTES_MAX, REPLICA_FETCH_PARTITION_BYTES_MAX, REPLICA_FETCH_WAIT_MS,
};
use crate::protocol::fetch::{FetchPartition, FetchPartitionResponse, FetchRequest, FetchResponse, FetchTopic};
use crate::protocol::offset_for_leader_epoch::{
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use crate::protocol::record_batch;
use crate::protocol::{ApiKey, ErrorCode};
use crate::replica::epochs::{self, UNDEFINED_EPOCH};
use crate::replica::Role;
use crate::shard::Shard;

/// Wait before reconnecting to a leader, or asking again for partitions
/// whose leader does not know its epoch yet.
const RETRY_DELAY: Duration = Duration::from_millis(100);
/// Rounds of the leader-epoch exchange per partition and pass.
const TRUNCATION_ROUNDS_MAX: usize = 8;

/// Fetches from `leader` for as long as this core follows a partition of it.
pub async fn run(shard: Rc<Shard>, leader: i32) {
    let mut connection: Option<(String, Connection)> = None;
    loop {
        if shard.shutting_down.get() {
            break;
        }
        let targets = shard.followed.borrow().targets_of(leader);
        if targets.is_empty() {
            break;
        }
        let address = shard
            .image()
            .cluster
            .nodes
            .get(&crate::cluster::metadata::NodeId(leader))
            .map(|p| format!("{}:{}", p.host, p.port));
        let Some(address) = address else {
            glommio::timer::sleep(RETRY_DELAY).await;
            continue;
        };
        if connection.as_ref().is_none_or(|(at, _)| *at != address) {
            let options = ConnectionOptions {
                in_flight: 1,
                client_id: format!("shardlog-replica-{}", shard.node_id()),
                connect_timeout: Duration::from_secs(2),
                sasl: shard.config.inter_machine_login(),
            };
            match Connection::connect(&address, &options).await {
                Ok(opened) => connection = Some((address.clone(), opened)),
                Err(err) => {
                    tracing::debug!(leader, %address, error = %err, "connecting to the leader failed");
                    glommio::timer::sleep(RETRY_DELAY).await;
                    continue;
                }
            }
        }
        let conn = &connection.as_ref().expect("connected above").1;
        let round = async {
            let pending: Vec<_> = targets.iter().filter(|(_, _, t)| !t.truncated).cloned().collect();
            if !pending.is_empty() {
                exchange_epochs(&shard, conn, leader, &pending).await?;
            }
            let ready: Vec<_> =
                shard.followed.borrow().targets_of(leader).into_iter().filter(|(_, _, t)| t.truncated).collect();
            if ready.is_empty() {
                glommio::timer::sleep(RETRY_DELAY).await;
                return Ok(());
            }
            fetch_once(&shard, conn, leader, &ready).await
        };
        if let Err(err) = round.await {
            tracing::debug!(leader, error = %err, "replica fetch failed; reconnecting");
            connection = None;
            glommio::timer::sleep(RETRY_DELAY).await;
        }
    }
    shard.followed.borrow_mut().running.remove(&leader);
}

type Targets = [(Rc<str>, i32, crate::shard::replication::Target)];

/// The leader-epoch exchange and truncation for `pending` partitions.
async fn exchange_epochs(
    shard: &Rc<Shard>,
    conn: &Connection,
    leader: i32,
    pending: &Targets,
) -> Result<(), crate::client::ClientError> {
    for (topic, index, target) in pending {
        for _ in 0..TRUNCATION_ROUNDS_MAX {
            let Some(partition) = shard.local_partition(topic, *index) else { break };
            if !shard.followed.borrow().is_following(topic, *index, leader, target.leader_epoch) {
                break;
            }
            let latest = partition.replica.epochs.borrow().latest().map_or(UNDEFINED_EPOCH, |e| e.epoch);
            let request = OffsetForLeaderEpochRequest {
                replica_id: shard.node_id(),
                topics: vec![OffsetForLeaderTopic {
                    topic: topic.to_string(),
                    partitions: vec![OffsetForLeaderPartition {
                        partition: *index,
                        current_leader_epoch: target.leader_epoch,
                        leader_epoch: latest,
                    }],
                }],
            };
            let version = 3;
            let answer = conn
                .call(
                    ApiKey::OffsetForLeaderEpoch,
                    version,
                    |w| request.encode(w, version),
                    OffsetForLeaderEpochResponse::decode,
                )
                .await?;
            let Some(answer) = answer.topics.first().and_then(|t| t.partitions.first()).cloned() else { break };
            if answer.error != ErrorCode::None {
                // The leader does not know its epoch yet (or lost it): ask again later.
                tracing::debug!(%topic, partition = index, error = ?answer.error, "leader epoch exchange refused");
                break;
            }
            let log_end = partition.log.log_end_offset();
            let cut = {
                let cache = partition.replica.epochs.borrow();
                epochs::truncation_offset(&cache, log_end, answer.leader_epoch, answer.end_offset)
            };
            // Undefined (this replica has no epochs, or the leader none at
            // or below them): what this replica knew committed is shared.
            let cut = cut.unwrap_or_else(|| {
                if latest == UNDEFINED_EPOCH && log_end == partition.log.log_start_offset() {
                    log_end
                } else {
                    partition.log.high_watermark()
                }
            });
            if cut >= log_end {
                shard.followed.borrow_mut().mark_truncated(topic, *index, leader, target.leader_epoch);
                break;
            }
            tracing::info!(%topic, partition = index, log_end, cut, leader_epoch = answer.leader_epoch, "follower diverged from its leader; truncating");
            if let Err(err) = shard.truncate_partition(topic, *index, cut).await {
                tracing::error!(%topic, partition = index, error = %err, "truncating the follower's log failed");
                break;
            }
        }
    }
    Ok(())
}

/// One Fetch for every partition in `ready`, and what it brings applied.
async fn fetch_once(
    shard: &Rc<Shard>,
    conn: &Connection,
    leader: i32,
    ready: &Targets,
) -> Result<(), crate::client::ClientError> {
    let mut topics: Vec<FetchTopic> = Vec::new();
    let mut asked = Vec::new();
    for (topic, index, target) in ready {
        let Some(partition) = shard.local_partition(topic, *index) else { continue };
        let wanted = FetchPartition {
            index: *index,
            current_leader_epoch: target.leader_epoch,
            fetch_offset: partition.log.local_end_offset(),
            log_start_offset: partition.log.log_start_offset(),
            partition_max_bytes: REPLICA_FETCH_PARTITION_BYTES_MAX,
        };
        match topics.last_mut().filter(|t| *t.name == **topic) {
            Some(last) => last.partitions.push(wanted),
            None => topics.push(FetchTopic { name: topic.to_string(), partitions: vec![wanted] }),
        }
        asked.push((topic.clone(), *index, target.leader_epoch, wanted.fetch_offset));
    }
    if topics.is_empty() {
        return Ok(());
    }
    let request = FetchRequest {
        replica_id: shard.node_id(),
        max_wait_ms: REPLICA_FETCH_WAIT_MS,
        min_bytes: 1,
        max_bytes: REPLICA_FETCH_BYTES_MAX,
        isolation_level: 0,
        session_id: 0,
        session_epoch: crate::shard::fetch_sessions::FINAL_EPOCH,
        topics,
        forgotten: Vec::new(),
        rack_id: String::new(),
    };
    let version = 11;
    let response = conn.call(ApiKey::Fetch, version, |w| request.encode(w, version), FetchResponse::decode).await?;
    for topic in response.topics {
        let name: Rc<str> = topic.name.as_str().into();
        for answer in topic.partitions {
            let Some((_, _, leader_epoch, fetch_offset)) =
                asked.iter().find(|(t, i, _, _)| **t == *name && *i == answer.index)
            else {
                continue;
            };
            apply(shard, leader, &name, *leader_epoch, *fetch_offset, answer).await;
        }
    }
    Ok(())
}

/// Appends what the leader sent for one partition, then takes its high
/// watermark.
async fn apply(
    shard: &Rc<Shard>,
    leader: i32,
    topic: &Rc<str>,
    leader_epoch: i32,
    fetch_offset: i64,
    answer: FetchPartitionResponse,
) {
    let index = answer.index;
    let following = || shard.followed.borrow().is_following(topic, index, leader, leader_epoch);
    let Some(partition) = shard.local_partition(topic, index) else { return };
    let as_follower = matches!(&*partition.replica.role.borrow(), Role::Follower { leader: l, leader_epoch: e } if *l == leader && *e == leader_epoch);
    if !following() || !as_follower {
        return;
    }
    match answer.error {
        ErrorCode::None => {}
        ErrorCode::OffsetOutOfRange if fetch_offset < answer.log_start_offset => {
            // The leader no longer has what this replica lacks: start over
            // at its log start (Kafka's truncateFullyAndStartAt).
            tracing::warn!(%topic, partition = index, fetch_offset, leader_log_start = answer.log_start_offset, "the follower's log ends below its leader's log start; starting over there");
            if let Err(err) = shard.restart_partition_at(topic, index, answer.log_start_offset).await {
                tracing::error!(%topic, partition = index, error = %err, "emptying the follower's log failed");
            }
            return;
        }
        ErrorCode::OffsetOutOfRange => {
            tracing::warn!(%topic, partition = index, fetch_offset, leader_log_start = answer.log_start_offset, "fetch offset out of range at the leader; checking for divergence again");
            shard.followed.borrow_mut().mark_untruncated(topic, index, leader);
            return;
        }
        other => {
            tracing::debug!(%topic, partition = index, error = ?other, "replica fetch refused for a partition");
            return;
        }
    }
    let log = &partition.log;
    let mut last = None;
    for batch in answer.records {
        let header = match record_batch::validate(&batch, BATCH_BYTES_MAX_LIMIT) {
            Ok(header) => header,
            // A partial last batch (cut by max_bytes) or damage in transit.
            Err(_) => break,
        };
        if header.last_offset() < log.log_end_offset() {
            continue;
        }
        let newer = partition.replica.epochs.borrow().latest().is_none_or(|e| header.leader_epoch > e.epoch);
        if newer {
            if let Err(err) = partition.assign_epoch(header.leader_epoch, header.base_offset).await {
                tracing::error!(%topic, partition = index, error = %err, "persisting the leader-epoch cache failed");
                return;
            }
            if !following() {
                return;
            }
        }
        match log.append_copied(batch, &header) {
            Ok(appended) => {
                partition.record_sequence(&header, appended.base_offset);
                crate::metrics::record_follower_fetched(header.size_bytes);
                last = Some(appended.last_offset);
            }
            Err(err) => {
                tracing::warn!(%topic, partition = index, error = %err, "appending a copied batch failed");
                break;
            }
        }
    }
    if let Some(last) = last {
        if let Err(err) = log.wait_done(last).await {
            tracing::warn!(%topic, partition = index, error = %err, "a copied batch failed to be written");
            return;
        }
    }
    let high_watermark = answer.high_watermark.min(log.local_end_offset());
    let mut changed = last.is_some();
    if high_watermark > log.high_watermark() {
        log.set_high_watermark_limit(high_watermark);
        changed = true;
    }
    // The leader's log start (DeleteRecords, the compaction of
    // __consumer_offsets) moves here too, up to what is committed here.
    let log_start = answer.log_start_offset.min(log.high_watermark());
    if log_start > log.log_start_offset() {
        match log.delete_records(log_start).await {
            Ok(_) => changed = true,
            Err(err) => {
                tracing::warn!(%topic, partition = index, error = %err, "following the leader's log start failed")
            }
        }
    }
    if changed {
        shard.readable_changed(&partition);
    }
}
