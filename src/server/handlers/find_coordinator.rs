//! FindCoordinator: the node of the core a group hashes to (in shared-port
//! mode, the single advertised node, which forwards).

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::protocol::find_coordinator::{FindCoordinatorRequest, FindCoordinatorResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

const KEY_TYPE_GROUP: i8 = 0;

pub fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = FindCoordinatorRequest::decode(reader, version)?;
    let answer = if body.key_type != KEY_TYPE_GROUP {
        let mut answer = FindCoordinatorResponse::error(ErrorCode::CoordinatorNotAvailable);
        answer.error_message = Some("transactions are not supported".into());
        answer
    } else {
        let image = shard.image();
        let node_id = super::metadata::advertised_node(shard, &image, shard.group_owner(&body.key));
        match image.nodes.iter().find(|n| n.node_id == node_id) {
            Some(node) => FindCoordinatorResponse {
                throttle_time_ms: 0,
                error: ErrorCode::None,
                error_message: None,
                node_id: node.node_id.0,
                host: node.host.clone(),
                port: node.port,
            },
            None => FindCoordinatorResponse::error(ErrorCode::CoordinatorNotAvailable),
        }
    };
    let mut w = response(request);
    answer.encode(&mut w, version);
    Ok(respond(w))
}
