//! AlterPartitionReassignments and ListPartitionReassignments (KIP-455):
//! moves are decided by the controller (`cluster::control::
//! alter_reassignments`) and answered per partition once committed; the
//! list comes from this machine's image of the cluster.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::cluster::bridge::{self, Answer};
use crate::cluster::control::MoveRequest;
use crate::protocol::partition_reassignments::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse, OngoingReassignment, ReassignmentResult,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

pub async fn alter(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = AlterPartitionReassignmentsRequest::decode(reader, version)?;
    let moves: Vec<MoveRequest> = body
        .topics
        .iter()
        .flat_map(|(topic, partitions)| {
            partitions.iter().map(move |p| MoveRequest {
                topic: topic.clone(),
                partition: p.partition,
                replicas: p.replicas.clone(),
            })
        })
        .collect();
    let answered = match shard.controller() {
        Some((handle, _)) => bridge::request(handle, &bridge::Request::AlterReassignments { moves: moves.clone() })
            .await
            .map_err(|err| bridge::failed_items(&[String::new()], &err)[0].error),
        None => Err(ErrorCode::NotController),
    };
    let (error, items) = match answered {
        Ok(Answer::Items(items)) => (ErrorCode::None, items),
        Ok(Answer::Refused(code, _)) => (crate::protocol::error::from_code(code), Vec::new()),
        Ok(_) => (ErrorCode::UnknownServerError, Vec::new()),
        Err(code) => (code, Vec::new()),
    };
    let mut responses: BTreeMap<String, Vec<ReassignmentResult>> = BTreeMap::new();
    for (at, wanted) in moves.iter().enumerate() {
        let (error, message) = match items.get(at) {
            Some((_, code, message)) => (crate::protocol::error::from_code(*code), message.clone()),
            // The whole request failed: every partition says why.
            None => (if error.is_ok() { ErrorCode::UnknownServerError } else { error }, None),
        };
        responses.entry(wanted.topic.clone()).or_default().push(ReassignmentResult {
            partition: wanted.partition,
            error,
            message,
        });
    }
    let answer = AlterPartitionReassignmentsResponse {
        throttle_time_ms: 0,
        error,
        message: None,
        responses: responses.into_iter().collect(),
    };
    let mut w = response(request);
    answer.encode(&mut w, version);
    Ok(respond(w))
}

pub fn list(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = ListPartitionReassignmentsRequest::decode(reader, version)?;
    let image = shard.image();
    let cluster = &image.cluster;
    let mut topics: BTreeMap<String, Vec<OngoingReassignment>> = BTreeMap::new();
    for ((topic_id, partition), moving) in &cluster.reassignments {
        let Some(topic) = cluster.topics.get(topic_id) else { continue };
        let wanted = match &body.topics {
            None => true,
            Some(asked) => asked.iter().any(|(name, partitions)| *name == topic.name && partitions.contains(partition)),
        };
        let Some(registered) = topic.partitions.get(usize::try_from(*partition).unwrap_or(usize::MAX)) else {
            continue;
        };
        if !wanted {
            continue;
        }
        topics.entry(topic.name.clone()).or_default().push(OngoingReassignment {
            partition: *partition,
            replicas: registered.replicas.clone(),
            adding: moving.target.iter().copied().filter(|n| !moving.original.contains(n)).collect(),
            removing: moving.original.iter().copied().filter(|n| !moving.target.contains(n)).collect(),
        });
    }
    let answer = ListPartitionReassignmentsResponse {
        throttle_time_ms: 0,
        error: ErrorCode::None,
        message: None,
        topics: topics.into_iter().collect(),
    };
    let mut w = response(request);
    answer.encode(&mut w, version);
    Ok(respond(w))
}
