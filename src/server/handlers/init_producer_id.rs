//! InitProducerId: hands out a producer id for idempotent producers. Ids come
//! from the controller in persisted blocks, so they never repeat across
//! restarts. Transactions are not supported: a transactional id is refused
//! with the fatal error FindCoordinator gives it.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::protocol::init_producer_id::{InitProducerIdRequest, InitProducerIdResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{AdminOp, AdminReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = InitProducerIdRequest::decode(reader, version)?;
    let answer = if body.transactional_id.is_some() {
        InitProducerIdResponse::error(super::find_coordinator::TRANSACTIONS_UNSUPPORTED)
    } else {
        match shard.admin(AdminOp::AllocateProducerId).await {
            AdminReply::ProducerId(Ok(producer_id)) => {
                InitProducerIdResponse { throttle_time_ms: 0, error: ErrorCode::None, producer_id, producer_epoch: 0 }
            }
            AdminReply::ProducerId(Err(code)) => InitProducerIdResponse::error(code),
            _ => InitProducerIdResponse::error(ErrorCode::UnknownServerError),
        }
    };
    let mut w = response(request);
    answer.encode(&mut w, version);
    Ok(respond(w))
}
