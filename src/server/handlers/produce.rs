//! Produce: validate and append each partition's batches on its owning core,
//! answer when every partition is done under its flush policy (acks 1/all),
//! or not at all (acks 0). `__consumer_offsets` is written by the group
//! coordinators only.

use std::rc::Rc;

use futures::future::join_all;

use super::{respond, response, Outcome};
use crate::protocol::produce::{ProducePartitionResponse, ProduceRequest, ProduceResponse, ProduceTopicResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{PartitionOp, PartitionReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let request_bytes = reader.remaining();
    let mut body = ProduceRequest::decode(reader, version)?;
    let acks = body.acks;
    let timeout_ms = body.timeout_ms;
    let image = shard.image();
    let missing: Vec<String> =
        body.topics.iter().filter(|t| image.topic(&t.name).is_none()).map(|t| t.name.clone()).collect();
    if !missing.is_empty() && shard.config.auto_create_topics {
        super::metadata::auto_create(shard, missing).await;
    }
    let valid_acks = matches!(acks, -1..=1);
    let mut pending = Vec::new();
    for topic in &mut body.topics {
        for partition in &mut topic.partitions {
            let shard = shard.clone();
            let (name, index, records) = (topic.name.clone(), partition.index, partition.records.take());
            pending.push(async move {
                if !valid_acks {
                    return ProducePartitionResponse::error(index, ErrorCode::InvalidRequiredAcks);
                }
                if name == crate::constants::OFFSETS_TOPIC {
                    // As Kafka: only the group coordinators write it.
                    return ProducePartitionResponse::error(index, ErrorCode::InvalidTopicException);
                }
                match shard
                    .partition_op(&name, index, PartitionOp::Produce { records, acks, timeout_ms, request_bytes })
                    .await
                {
                    PartitionReply::Produce(answer) => answer,
                    _ => ProducePartitionResponse::error(index, ErrorCode::UnknownServerError),
                }
            });
        }
    }
    // join_all polls in order: appends happen in request order.
    let mut answers = join_all(pending).await.into_iter();
    if acks == 0 {
        return Ok(Outcome::NoResponse);
    }
    let topics = body
        .topics
        .iter()
        .map(|topic| ProduceTopicResponse {
            name: topic.name.clone(),
            partitions: topic.partitions.iter().filter_map(|_| answers.next()).collect(),
        })
        .collect();
    let mut w = response(request);
    ProduceResponse { topics, throttle_time_ms: 0 }.encode(&mut w, version);
    Ok(respond(w))
}
