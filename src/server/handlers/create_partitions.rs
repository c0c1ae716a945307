//! CreatePartitions: grows topics; new partitions go to the least-loaded cores.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::protocol::create_partitions::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreatePartitionsTopicResult,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{AdminOp, AdminReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = CreatePartitionsRequest::decode(reader, version)?;
    let mut refused = Vec::new();
    let mut topics = Vec::new();
    for topic in body.topics {
        if topic.assignments.is_some() {
            refused.push(CreatePartitionsTopicResult {
                name: topic.name,
                error: ErrorCode::InvalidReplicaAssignment,
                error_message: Some("manual replica assignment is not supported".into()),
            });
        } else {
            topics.push((topic.name, topic.count));
        }
    }
    let names: Vec<String> = topics.iter().map(|t| t.0.clone()).collect();
    let mut results: Vec<CreatePartitionsTopicResult> = match shard
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
    results.extend(refused);
    let mut w = response(request);
    CreatePartitionsResponse { throttle_time_ms: 0, results }.encode(&mut w, version);
    Ok(respond(w))
}
