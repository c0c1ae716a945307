//! OffsetForLeaderEpoch: the end offset of a leader epoch (clients use it to
//! detect log truncation after a leader change).

use std::rc::Rc;

use futures::future::join_all;

use super::{respond, response, Outcome};
use crate::protocol::offset_for_leader_epoch::{
    EpochEndOffset, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, OffsetForLeaderTopicResult,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{PartitionOp, PartitionReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = OffsetForLeaderEpochRequest::decode(reader, version)?;
    let mut work = Vec::new();
    for topic in &body.topics {
        for partition in &topic.partitions {
            let shard = shard.clone();
            let (name, index) = (topic.topic.clone(), partition.partition);
            let (current_leader_epoch, leader_epoch) = (partition.current_leader_epoch, partition.leader_epoch);
            let op = PartitionOp::OffsetForLeaderEpoch { current_leader_epoch, leader_epoch };
            work.push(async move {
                match shard.partition_op(&name, index, op).await {
                    PartitionReply::OffsetForLeaderEpoch { leader_epoch, end_offset, error } => {
                        EpochEndOffset { error, partition: index, leader_epoch, end_offset }
                    }
                    _ => EpochEndOffset {
                        error: ErrorCode::UnknownServerError,
                        partition: index,
                        leader_epoch: -1,
                        end_offset: -1,
                    },
                }
            });
        }
    }
    let mut answers = join_all(work).await.into_iter();
    let topics = body
        .topics
        .iter()
        .map(|topic| OffsetForLeaderTopicResult {
            topic: topic.topic.clone(),
            partitions: topic.partitions.iter().filter_map(|_| answers.next()).collect(),
        })
        .collect();
    let mut w = response(request);
    OffsetForLeaderEpochResponse { throttle_time_ms: 0, topics }.encode(&mut w, version);
    Ok(respond(w))
}
