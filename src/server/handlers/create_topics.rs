//! CreateTopics: validated and applied by the controller (core 0); answered
//! after every core has opened its new partitions. Explicit replica
//! assignments name nodes (each core is one).

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::cluster::controller::NewTopic;
use crate::protocol::create_topics::{CreatableTopicResult, CreateTopicsRequest, CreateTopicsResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{AdminOp, AdminReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = CreateTopicsRequest::decode(reader, version)?;
    let mut topics = Vec::new();
    for topic in body.topics {
        let configs = topic.configs.into_iter().filter_map(|c| c.value.map(|v| (c.name, v))).collect();
        let assignments = topic.assignments.into_iter().map(|a| (a.partition_index, a.broker_ids)).collect();
        topics.push(NewTopic {
            name: topic.name,
            partitions: topic.num_partitions,
            replication_factor: topic.replication_factor,
            configs,
            assignments,
        });
    }
    let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
    let results: Vec<CreatableTopicResult> =
        match shard.admin(AdminOp::CreateTopics { topics, validate_only: body.validate_only }).await {
            AdminReply::Items(items) if items.len() == names.len() => items
                .into_iter()
                .map(|item| CreatableTopicResult { name: item.name, error: item.error, error_message: item.message })
                .collect(),
            _ => names
                .into_iter()
                .map(|name| CreatableTopicResult { name, error: ErrorCode::RequestTimedOut, error_message: None })
                .collect(),
        };
    let mut w = response(request);
    CreateTopicsResponse { throttle_time_ms: 0, topics: results }.encode(&mut w, version);
    Ok(respond(w))
}
