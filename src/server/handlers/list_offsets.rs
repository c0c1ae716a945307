//! ListOffsets: earliest, latest, or by timestamp, on each owning core.

use std::rc::Rc;

use futures::future::join_all;

use super::{respond, response, Outcome};
use crate::protocol::list_offsets::{
    ListOffsetsPartitionResponse, ListOffsetsRequest, ListOffsetsResponse, ListOffsetsTopicResponse,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{PartitionOp, PartitionReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = ListOffsetsRequest::decode(reader, version)?;
    let mut lookups = Vec::new();
    for topic in &body.topics {
        for partition in &topic.partitions {
            let shard = shard.clone();
            let (name, index, timestamp) = (topic.name.clone(), partition.index, partition.timestamp);
            lookups.push(async move {
                match shard.partition_op(&name, index, PartitionOp::ListOffsets { timestamp }).await {
                    PartitionReply::ListOffsets(answer) => answer,
                    _ => ListOffsetsPartitionResponse::error(index, ErrorCode::UnknownServerError),
                }
            });
        }
    }
    let mut answers = join_all(lookups).await.into_iter();
    let topics = body
        .topics
        .iter()
        .map(|topic| ListOffsetsTopicResponse {
            name: topic.name.clone(),
            partitions: topic.partitions.iter().filter_map(|_| answers.next()).collect(),
        })
        .collect();
    let mut w = response(request);
    ListOffsetsResponse { throttle_time_ms: 0, topics }.encode(&mut w, version);
    Ok(respond(w))
}
