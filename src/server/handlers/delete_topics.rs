//! DeleteTopics: applied by the controller; every core closes and removes the
//! partitions it owned before the answer goes out.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::protocol::delete_topics::{DeletableTopicResult, DeleteTopicsRequest, DeleteTopicsResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{AdminOp, AdminReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DeleteTopicsRequest::decode(reader, version)?;
    let names = body.topic_names;
    let responses = match shard.admin(AdminOp::DeleteTopics { names: names.clone() }).await {
        AdminReply::Items(items) if items.len() == names.len() => {
            items.into_iter().map(|item| DeletableTopicResult { name: item.name, error: item.error }).collect()
        }
        _ => names.into_iter().map(|name| DeletableTopicResult { name, error: ErrorCode::RequestTimedOut }).collect(),
    };
    let mut w = response(request);
    DeleteTopicsResponse { throttle_time_ms: 0, responses }.encode(&mut w, version);
    Ok(respond(w))
}
