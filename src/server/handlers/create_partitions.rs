//! CreatePartitions: grows topics; new partitions go to the nodes an explicit
//! assignment names, or else to the least-loaded cores.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::cluster::controller::PartitionGrowth;
use crate::protocol::create_partitions::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreatePartitionsTopicResult,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{AdminOp, AdminReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = CreatePartitionsRequest::decode(reader, version)?;
    let topics: Vec<PartitionGrowth> = body
        .topics
        .into_iter()
        .map(|topic| PartitionGrowth {
            name: topic.name,
            count: topic.count,
            assignments: topic.assignments.map(|a| a.into_iter().map(|a| a.broker_ids).collect()),
        })
        .collect();
    let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
    let results: Vec<CreatePartitionsTopicResult> = match shard
        .admin(AdminOp::CreatePartitions { topics, validate_only: body.validate_only })
        .await
    {
        AdminReply::Items(items) if items.len() == names.len() => items
            .into_iter()
            .map(|item| CreatePartitionsTopicResult { name: item.name, error: item.error, error_message: item.message })
            .collect(),
        _ => names
            .into_iter()
            .map(|name| CreatePartitionsTopicResult { name, error: ErrorCode::RequestTimedOut, error_message: None })
            .collect(),
    };
    let mut w = response(request);
    CreatePartitionsResponse { throttle_time_ms: 0, results }.encode(&mut w, version);
    Ok(respond(w))
}
