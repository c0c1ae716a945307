//! What a shard reports into `metrics`, which knows nothing of shards: the
//! error of each partition and admin answer under the API that asked, how a
//! fetch used sessions, and a core's snapshot for a scrape. `metrics` is a
//! leaf; the shard describes itself to it.

use super::fetch_sessions::FetchContext;
use super::{AdminOp, AdminReply, PartitionReply, Shard};
use crate::metrics::{self, CoreSnapshot, FetchKind, FetchSessionsSnapshot, PartitionSnapshot};
use crate::protocol::ApiKey;

pub fn fetch_context(context: &FetchContext) {
    metrics::record_fetch(match context {
        FetchContext::Sessionless => FetchKind::Sessionless,
        FetchContext::Full { .. } => FetchKind::Full,
        FetchContext::Incremental { .. } => FetchKind::Incremental,
    });
}

/// The error of one partition's answer, under the API that asked.
pub fn partition_reply(reply: &PartitionReply) {
    let (api, error) = match reply {
        PartitionReply::Produce(answer) => (ApiKey::Produce, answer.error),
        PartitionReply::Fetch(answer) => (ApiKey::Fetch, answer.error),
        PartitionReply::ListOffsets(answer) => (ApiKey::ListOffsets, answer.error),
        PartitionReply::DeleteRecords { error, .. } => (ApiKey::DeleteRecords, *error),
        PartitionReply::OffsetForLeaderEpoch { error, .. } => (ApiKey::OffsetForLeaderEpoch, *error),
    };
    metrics::record_error(api, error);
}

/// The API a metadata change comes from.
pub fn admin_api(op: &AdminOp) -> ApiKey {
    match op {
        AdminOp::CreateTopics { .. } => ApiKey::CreateTopics,
        AdminOp::DeleteTopics { .. } => ApiKey::DeleteTopics,
        AdminOp::CreatePartitions { .. } => ApiKey::CreatePartitions,
        AdminOp::AlterTopicConfigs { .. } | AdminOp::AlterBrokerConfigs { .. } => ApiKey::AlterConfigs,
        AdminOp::AllocateProducerId => ApiKey::InitProducerId,
    }
}

pub fn admin_reply(api: ApiKey, reply: &AdminReply) {
    match reply {
        AdminReply::Items(items) => items.iter().for_each(|item| metrics::record_error(api, item.error)),
        AdminReply::ProducerId(Err(error)) => metrics::record_error(api, *error),
        AdminReply::ProducerId(Ok(_)) => {}
    }
}

/// This core's snapshot; runs on the core that owns `shard`.
pub fn snapshot(shard: &Shard) -> CoreSnapshot {
    let image = shard.image();
    let partitions_assigned = image
        .durable
        .topics
        .values()
        .flat_map(|topic| &topic.partitions)
        .filter(|partition| partition.shard == shard.id)
        .count();
    let node_id = image.nodes.iter().find(|node| node.shard == shard.id).map_or(-1, |node| node.node_id.0);
    let partitions = shard
        .local_partitions()
        .iter()
        .map(|partition| {
            let log = &partition.log;
            let role = partition.replica.role.borrow();
            let (under_replicated, under_min_isr, follower_lag_records) = match &*role {
                crate::replica::Role::Leader(state) => {
                    let end = log.log_end_offset();
                    let lag = state.follower_ends().map(|(_, at)| if at < 0 { end } else { end - at }).max();
                    (state.isr().len() < state.replicas().len(), !state.enough_in_sync(), lag.unwrap_or(0).max(0))
                }
                _ => (false, false, 0),
            };
            PartitionSnapshot {
                leader: role.leads(),
                under_replicated,
                under_min_isr,
                follower_lag_records,
                topic: partition.topic.to_string(),
                partition: partition.index,
                log_start_offset: log.log_start_offset(),
                log_end_offset: log.log_end_offset(),
                high_watermark: log.high_watermark(),
                size_bytes: log.size_bytes(),
                segments: log.segment_count(),
                failed: log.is_failed(),
            }
        })
        .collect();
    // Deleted topics stop being reported (a recreated one starts from 0).
    metrics::keep_topics(|name| image.durable.topics.contains_key(name));
    let budget = shard.config.in_flight_bytes_max as u64;
    CoreSnapshot {
        core: shard.id.0,
        node_id,
        counters: metrics::counters(),
        partitions_assigned,
        partitions,
        in_flight_request_bytes: budget.saturating_sub(shard.in_flight_budget.available()),
        inbox_depth: shard.inbox_depth(),
        groups: shard.group_service().map(|service| service.snapshot()).unwrap_or_default(),
        fetch_sessions: {
            let sessions = shard.fetch_sessions.borrow();
            FetchSessionsSnapshot { sessions: sessions.len(), partitions: sessions.partitions() }
        },
    }
}
