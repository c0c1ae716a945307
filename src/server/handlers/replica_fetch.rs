//! Fetch from a follower (`replica_id` >= 0), on the leader's core: each
//! partition's fetch offset is what that follower holds, so it goes to the
//! leader's state machine first (which may move the high watermark or ask
//! to grow the ISR); then the read, up to the leader's own end rather than
//! the high watermark. Long-polls like a consumer's fetch. Followers fetch
//! without sessions.

use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::constants::FETCH_WAIT_MS_MAX;
use crate::log::now_ms;
use crate::protocol::fetch::{FetchPartition, FetchPartitionResponse, FetchRequest, FetchResponse, FetchTopicResponse};
use crate::protocol::ErrorCode;
use crate::replica::Role;
use crate::shard::Shard;

pub async fn answer(shard: &Rc<Shard>, body: &FetchRequest) -> FetchResponse {
    let max_wait = Duration::from_millis(body.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let deadline = Instant::now() + max_wait;
    let now = now_ms();
    for topic in &body.topics {
        for wanted in &topic.partitions {
            note_fetch(shard, &topic.name, wanted, body.replica_id, now);
        }
    }
    // A follower learns the high watermark from these answers: one that
    // moves completes the long poll, as new data does.
    let mut high_watermarks: Vec<i64> = Vec::new();
    loop {
        let listener = shard.data_event.listen();
        let mut topics = Vec::with_capacity(body.topics.len());
        let mut bytes = 0usize;
        let mut erred = false;
        let mut moved = false;
        let mut seen = 0;
        for topic in &body.topics {
            let mut partitions = Vec::with_capacity(topic.partitions.len());
            for wanted in &topic.partitions {
                let answer = read(shard, &topic.name, wanted, body.replica_id).await;
                bytes += answer.records_bytes();
                erred |= !answer.error.is_ok();
                match high_watermarks.get(seen) {
                    Some(first) => moved |= *first != answer.high_watermark,
                    None => high_watermarks.push(answer.high_watermark),
                }
                seen += 1;
                partitions.push(answer);
            }
            topics.push(FetchTopicResponse { name: topic.name.clone(), partitions });
        }
        let ready = erred || moved || bytes >= body.min_bytes.max(1) as usize || shard.shutting_down.get();
        if ready || Instant::now() >= deadline {
            return FetchResponse { throttle_time_ms: 0, error: Some(ErrorCode::None), session_id: 0, topics };
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        futures_lite::future::or(listener, async {
            glommio::timer::sleep(wait).await;
        })
        .await;
    }
}

/// The follower's fetch offset is its log end: tell the leader.
fn note_fetch(shard: &Rc<Shard>, topic: &str, wanted: &FetchPartition, replica: i32, now: u64) {
    let Some(partition) = shard.local_partition(topic, wanted.index) else { return };
    let commands = match &mut *partition.replica.role.borrow_mut() {
        Role::Leader(state) if state.leader_epoch() == wanted.current_leader_epoch => {
            state.on_follower_fetch(replica, wanted.fetch_offset, partition.log.local_end_offset(), now)
        }
        _ => return,
    };
    if !commands.is_empty() {
        let topic_id = shard.image().topic(topic).map_or([0; 16], |t| t.topic_id);
        shard.carry_out(&partition, topic_id, commands);
    }
}

async fn read(shard: &Rc<Shard>, topic: &str, wanted: &FetchPartition, replica: i32) -> FetchPartitionResponse {
    let index = wanted.index;
    let Some(partition) = shard.local_partition(topic, index) else {
        let code = if shard.image().topic(topic).is_some() {
            ErrorCode::NotLeaderOrFollower
        } else {
            ErrorCode::UnknownTopicOrPartition
        };
        return FetchPartitionResponse::error(index, code);
    };
    let (leads, epoch, is_replica) = match &*partition.replica.role.borrow() {
        Role::Leader(state) => (true, state.leader_epoch(), state.replicas().contains(&replica)),
        role => (role.leads(), role.leader_epoch(), false),
    };
    let error = if !leads {
        Some(ErrorCode::NotLeaderOrFollower)
    } else if wanted.current_leader_epoch > epoch {
        Some(ErrorCode::UnknownLeaderEpoch)
    } else if wanted.current_leader_epoch >= 0 && wanted.current_leader_epoch < epoch {
        Some(ErrorCode::FencedLeaderEpoch)
    } else if !is_replica {
        Some(ErrorCode::NotLeaderOrFollower)
    } else {
        None
    };
    if let Some(error) = error {
        return FetchPartitionResponse::error(index, error);
    }
    let max_bytes = wanted.partition_max_bytes.max(0) as usize;
    crate::shard::fetch_answer(&partition, partition.log.read_for_replica(wanted.fetch_offset, max_bytes).await)
}
