//! DeleteRecords: moves each partition's log start offset (-1: the high
//! watermark) on its owning core.

use std::rc::Rc;

use futures::future::join_all;

use super::{respond, response, Outcome};
use crate::protocol::delete_records::{
    DeleteRecordsPartitionResult, DeleteRecordsRequest, DeleteRecordsResponse, DeleteRecordsTopicResult,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{PartitionOp, PartitionReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DeleteRecordsRequest::decode(reader, version)?;
    let mut work = Vec::new();
    for topic in &body.topics {
        for partition in &topic.partitions {
            let shard = shard.clone();
            let (name, index, offset) = (topic.name.clone(), partition.partition_index, partition.offset);
            work.push(async move {
                let (low_watermark, error) =
                    match shard.partition_op(&name, index, PartitionOp::DeleteRecords { offset }).await {
                        PartitionReply::DeleteRecords { low_watermark, error } => (low_watermark, error),
                        _ => (-1, ErrorCode::UnknownServerError),
                    };
                DeleteRecordsPartitionResult { partition_index: index, low_watermark, error }
            });
        }
    }
    let mut answers = join_all(work).await.into_iter();
    let topics = body
        .topics
        .iter()
        .map(|topic| DeleteRecordsTopicResult {
            name: topic.name.clone(),
            partitions: topic.partitions.iter().filter_map(|_| answers.next()).collect(),
        })
        .collect();
    let mut w = response(request);
    DeleteRecordsResponse { throttle_time_ms: 0, topics }.encode(&mut w, version);
    Ok(respond(w))
}
