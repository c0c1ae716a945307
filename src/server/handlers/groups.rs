//! The classic consumer-group APIs: JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups,
//! DeleteGroups. Each decodes, routes to the group's core, and encodes what
//! the coordinator answers. They share one file because they differ only in
//! which request and response they carry.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::config::ListenerMode;
use crate::group::{ClientInfo, GroupResponse};
use crate::protocol::delete_groups::{DeleteGroupsRequest, DeleteGroupsResponse, DeletedGroup};
use crate::protocol::describe_groups::{DescribeGroupsRequest, DescribeGroupsResponse, DescribedGroup};
use crate::protocol::heartbeat::{HeartbeatRequest, HeartbeatResponse};
use crate::protocol::join_group::{JoinGroupRequest, JoinGroupResponse};
use crate::protocol::leave_group::{LeaveGroupRequest, LeaveGroupResponse};
use crate::protocol::list_groups::ListGroupsResponse;
use crate::protocol::offset_commit::{
    OffsetCommitPartitionResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetCommitTopicResponse,
};
use crate::protocol::offset_fetch::{OffsetFetchRequest, OffsetFetchResponse};
use crate::protocol::sync_group::{SyncGroupRequest, SyncGroupResponse};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request, Writer};
use crate::shard::groups::{GroupAnswer, GroupRequest};
use crate::shard::Shard;

fn finish(request: &Request, encode: impl FnOnce(&mut Writer)) -> DecodeResult<Outcome> {
    let mut w = response(request);
    encode(&mut w);
    Ok(respond(w))
}

/// Routes a state-machine request; the error code when it could not run.
async fn route(shard: &Rc<Shard>, group_id: &str, request: GroupRequest) -> Result<GroupResponse, ErrorCode> {
    match shard.group_op(group_id, request).await? {
        GroupAnswer::Response(response) => Ok(response),
        _ => Err(ErrorCode::CoordinatorNotAvailable),
    }
}

pub async fn join(shard: &Rc<Shard>, request: &Request, reader: &mut Reader, peer: &str) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = JoinGroupRequest::decode(reader, version)?;
    let group_id = body.group_id.clone();
    let member_id = body.member_id.clone();
    let client =
        ClientInfo { client_id: request.header.client_id.clone().unwrap_or_default(), client_host: format!("/{peer}") };
    let answer = match route(shard, &group_id, GroupRequest::Join { api_version: version, client, request: body }).await
    {
        Ok(GroupResponse::Join(answer)) => answer,
        Ok(_) => JoinGroupResponse::error(member_id, ErrorCode::UnknownServerError),
        Err(code) => JoinGroupResponse::error(member_id, code),
    };
    finish(request, |w| answer.encode(w, version))
}

pub async fn sync(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = SyncGroupRequest::decode(reader, version)?;
    let group_id = body.group_id.clone();
    let answer = match route(shard, &group_id, GroupRequest::Sync { request: body }).await {
        Ok(GroupResponse::Sync(answer)) => answer,
        Ok(_) => SyncGroupResponse::error(ErrorCode::UnknownServerError),
        Err(code) => SyncGroupResponse::error(code),
    };
    finish(request, |w| answer.encode(w, version))
}

pub async fn heartbeat(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = HeartbeatRequest::decode(reader, version)?;
    let group_id = body.group_id.clone();
    let answer = match route(shard, &group_id, GroupRequest::Heartbeat { request: body }).await {
        Ok(GroupResponse::Heartbeat(answer)) => answer,
        Ok(_) => HeartbeatResponse { throttle_time_ms: 0, error: ErrorCode::UnknownServerError },
        Err(code) => HeartbeatResponse { throttle_time_ms: 0, error: code },
    };
    finish(request, |w| answer.encode(w, version))
}

pub async fn leave(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = LeaveGroupRequest::decode(reader, version)?;
    let group_id = body.group_id.clone();
    let answer = match route(shard, &group_id, GroupRequest::Leave { api_version: version, request: body }).await {
        Ok(GroupResponse::Leave(answer)) => answer,
        Ok(_) => LeaveGroupResponse { throttle_time_ms: 0, error: ErrorCode::UnknownServerError, members: Vec::new() },
        Err(code) => LeaveGroupResponse { throttle_time_ms: 0, error: code, members: Vec::new() },
    };
    finish(request, |w| answer.encode(w, version))
}

pub async fn offset_commit(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let mut body = OffsetCommitRequest::decode(reader, version)?;
    // Partitions of topics this node does not host are refused here, as Kafka does.
    let image = shard.image();
    let mut unknown = Vec::new();
    for topic in &mut body.topics {
        let name = topic.name.clone();
        topic.partitions.retain(|p| {
            let known = image.partition(&name, p.partition_index).is_some();
            if !known {
                unknown.push((name.clone(), p.partition_index));
            }
            known
        });
    }
    body.topics.retain(|t| !t.partitions.is_empty());
    let group_id = body.group_id.clone();
    let fallback = body.clone();
    let mut answer = if body.topics.is_empty() {
        OffsetCommitResponse { throttle_time_ms: 0, topics: Vec::new() }
    } else {
        match route(shard, &group_id, GroupRequest::OffsetCommit { request: body }).await {
            Ok(GroupResponse::OffsetCommit(answer)) => answer,
            Ok(_) => OffsetCommitResponse::all(&fallback, ErrorCode::UnknownServerError),
            Err(code) => OffsetCommitResponse::all(&fallback, code),
        }
    };
    for (name, partition_index) in unknown {
        let error = OffsetCommitPartitionResponse { partition_index, error: ErrorCode::UnknownTopicOrPartition };
        match answer.topics.iter_mut().find(|t| t.name == name) {
            Some(topic) => topic.partitions.push(error),
            None => answer.topics.push(OffsetCommitTopicResponse { name, partitions: vec![error] }),
        }
    }
    finish(request, |w| answer.encode(w, version))
}

pub async fn offset_fetch(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = OffsetFetchRequest::decode(reader, version)?;
    let group_id = body.group_id.clone();
    let answer = match shard.group_op(&group_id, GroupRequest::OffsetFetch { request: body }).await {
        Ok(GroupAnswer::OffsetFetch(answer)) => answer,
        Ok(_) => {
            OffsetFetchResponse { throttle_time_ms: 0, topics: Vec::new(), error: ErrorCode::CoordinatorNotAvailable }
        }
        Err(code) => OffsetFetchResponse { throttle_time_ms: 0, topics: Vec::new(), error: code },
    };
    finish(request, |w| answer.encode(w, version))
}

pub async fn describe(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DescribeGroupsRequest::decode(reader, version)?;
    let mut groups = Vec::with_capacity(body.groups.len());
    for group_id in &body.groups {
        let single = DescribeGroupsRequest {
            groups: vec![group_id.clone()],
            include_authorized_operations: body.include_authorized_operations,
        };
        match shard.group_op(group_id, GroupRequest::Describe { request: single }).await {
            Ok(GroupAnswer::Describe(answer)) => groups.extend(answer.groups),
            other => groups.push(DescribedGroup {
                error: other.err().unwrap_or(ErrorCode::CoordinatorNotAvailable),
                group_id: group_id.clone(),
                group_state: String::new(),
                protocol_type: String::new(),
                protocol_data: String::new(),
                members: Vec::new(),
                authorized_operations: i32::MIN,
            }),
        }
    }
    let answer = DescribeGroupsResponse { throttle_time_ms: 0, groups };
    finish(request, |w| answer.encode(w, version))
}

/// ListGroups answers the groups this node coordinates, as a Kafka broker
/// does; clients that want every group ask every node (kafkajs'
/// `listGroups`, `shardlog group list`). In per-core mode each core is its
/// own node and lists its own groups; in shared-port mode the one node
/// advertised stands for every core and lists them all.
pub async fn list(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    crate::protocol::list_groups::ListGroupsRequest::decode(reader, version)?;
    let parts = match shard.config.listener {
        ListenerMode::PerCore => vec![shard.run_group_op(GroupRequest::List).await],
        ListenerMode::Shared => shard.list_all_groups().await,
    };
    let mut answer = ListGroupsResponse { throttle_time_ms: 0, error: ErrorCode::None, groups: Vec::new() };
    for part in parts {
        match part {
            GroupAnswer::List(list) => answer.groups.extend(list.groups),
            _ => answer.error = ErrorCode::CoordinatorNotAvailable,
        }
    }
    finish(request, |w| answer.encode(w, version))
}

pub async fn delete(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DeleteGroupsRequest::decode(reader, version)?;
    let mut results = Vec::with_capacity(body.groups_names.len());
    for group_id in &body.groups_names {
        let single = DeleteGroupsRequest { groups_names: vec![group_id.clone()] };
        match route(shard, group_id, GroupRequest::DeleteGroups { request: single }).await {
            Ok(GroupResponse::DeleteGroups(answer)) => results.extend(answer.results),
            Ok(_) => results.push(DeletedGroup { group_id: group_id.clone(), error: ErrorCode::UnknownServerError }),
            Err(code) => results.push(DeletedGroup { group_id: group_id.clone(), error: code }),
        }
    }
    let answer = DeleteGroupsResponse { throttle_time_ms: 0, results };
    finish(request, |w| answer.encode(w, version))
}
