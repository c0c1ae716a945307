//! FindCoordinator: the leader of the group's partition of
//! `__consumer_offsets`, on any machine (see
//! `MetadataImage::group_coordinator`; in shared-port mode, that machine's
//! advertised node, which forwards). The first lookup of a new cluster
//! creates that topic (`Shard::ensure_offsets_topic`). Transactional ids
//! have no coordinator: see `TRANSACTIONS_UNSUPPORTED`.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::cluster::metadata::Placement;
use crate::protocol::find_coordinator::{FindCoordinatorRequest, FindCoordinatorResponse, KEY_TYPE_GROUP};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

/// Why a transactional producer cannot start, in the answer's error message
/// (versions 1 and up; librdkafka and the Java client show it).
pub const TRANSACTIONS_UNSUPPORTED_MESSAGE: &str = "transactions are not supported by shardlog";

/// The answer to a transactional-id lookup (and to InitProducerId with a
/// transactional id) while shardlog has no transaction coordinator.
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED, because clients give up on it at
/// once: librdkafka (`rd_kafka_txn_handle_FindCoordinator`,
/// `rd_kafka_idemp_check_error`) fails `init_transactions` at once with it
/// (or with CLUSTER_AUTHORIZATION_FAILED), and retries any other code
/// (COORDINATOR_NOT_AVAILABLE, UNSUPPORTED_VERSION, INVALID_REQUEST, ...)
/// until the caller's timeout runs out; the Java client fails at once too.
pub const TRANSACTIONS_UNSUPPORTED: ErrorCode = ErrorCode::TransactionalIdAuthorizationFailed;

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = FindCoordinatorRequest::decode(reader, version)?;
    let answer = if body.key_type != KEY_TYPE_GROUP {
        let mut answer = FindCoordinatorResponse::error(TRANSACTIONS_UNSUPPORTED);
        answer.error_message = Some(TRANSACTIONS_UNSUPPORTED_MESSAGE.into());
        answer
    } else {
        if shard.group_owner(&body.key).is_none() {
            shard.ensure_offsets_topic().await;
        }
        let image = shard.image();
        let placement = image.group_coordinator(&body.key).map_or(Placement::Unavailable, |(_, p)| p);
        let node_id = super::metadata::advertised(shard, &image, placement);
        let serving = image.serving_nodes();
        match node_id.and_then(|id| serving.iter().find(|n| n.node_id == id)) {
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
