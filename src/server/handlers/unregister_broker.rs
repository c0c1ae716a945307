//! UnregisterBroker: an administrator removes a machine that is gone for
//! good, named by any of its nodes. The controller refuses while the
//! machine serves (it must be stopped, and so fenced) or still holds a
//! replica; its node ids are never given out again.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::cluster::bridge::{self, Answer};
use crate::cluster::metadata::NodeId;
use crate::protocol::unregister_broker::{UnregisterBrokerRequest, UnregisterBrokerResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = UnregisterBrokerRequest::decode(reader, version)?;
    let answer = unregister(shard, body.broker_id).await;
    let (error, error_message) = match answer {
        Ok(()) => (ErrorCode::None, None),
        Err((error, message)) => (error, Some(message)),
    };
    let mut w = response(request);
    UnregisterBrokerResponse { throttle_time_ms: 0, error, error_message }.encode(&mut w, version);
    Ok(respond(w))
}

async fn unregister(shard: &Rc<Shard>, node: i32) -> Result<(), (ErrorCode, String)> {
    let image = shard.image();
    let Some(placed) = image.cluster.nodes.get(&NodeId(node)) else {
        return Err((ErrorCode::BrokerIdNotRegistered, format!("node {node} is not registered")));
    };
    let Some((handle, _)) = shard.controller() else {
        return Err((ErrorCode::NotController, "no controller service".into()));
    };
    let request = bridge::Request::UnregisterMachine { machine: placed.machine };
    match bridge::request(handle, &request).await {
        Ok(Answer::Refused(code, reason)) => Err((crate::protocol::error::from_code(code), reason)),
        Ok(_) => Ok(()),
        Err(err) => Err((bridge::failed_items(&[String::new()], &err)[0].error, err.to_string())),
    }
}
