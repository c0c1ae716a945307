//! AlterConfigs (replace all of a resource's dynamic configs) and
//! IncrementalAlterConfigs (set or delete single keys), for topics and for
//! brokers (a node id, or the empty name for the cluster-wide defaults;
//! see `config::broker` for which broker configs may change). Applied by
//! the controller and pushed to the owning cores at once.

use std::rc::Rc;

use super::describe_configs::{RESOURCE_BROKER, RESOURCE_TOPIC};
use super::{respond, response, Outcome};
use crate::cluster::controller::BrokerResource;
use crate::cluster::metadata::NodeId;
use crate::protocol::alter_configs::{AlterConfigsRequest, AlterConfigsResourceResponse, AlterConfigsResponse};
use crate::protocol::incremental_alter_configs::{
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResourceResponse, IncrementalAlterConfigsResponse,
    CONFIG_OPERATION_DELETE, CONFIG_OPERATION_SET,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{AdminOp, AdminReply, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = AlterConfigsRequest::decode(reader, version)?;
    let mut responses = Vec::new();
    for resource in body.resources {
        let changes = resource.configs.into_iter().map(|c| (c.name, c.value)).collect();
        let (error, error_message) =
            alter(shard, resource.resource_type, &resource.resource_name, changes, true, body.validate_only).await;
        responses.push(AlterConfigsResourceResponse {
            error,
            error_message,
            resource_type: resource.resource_type,
            resource_name: resource.resource_name,
        });
    }
    let mut w = response(request);
    AlterConfigsResponse { throttle_time_ms: 0, responses }.encode(&mut w, version);
    Ok(respond(w))
}

pub async fn handle_incremental(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = IncrementalAlterConfigsRequest::decode(reader, version)?;
    let mut responses = Vec::new();
    for resource in body.resources {
        let mut changes = Vec::new();
        let mut unsupported = false;
        for config in resource.configs {
            match config.config_operation {
                CONFIG_OPERATION_SET => changes.push((config.name, config.value)),
                CONFIG_OPERATION_DELETE => changes.push((config.name, None)),
                _ => unsupported = true,
            }
        }
        let (error, error_message) = if unsupported {
            (
                ErrorCode::InvalidConfig,
                Some("APPEND and SUBTRACT apply to list configs, and none here may change".into()),
            )
        } else {
            alter(shard, resource.resource_type, &resource.resource_name, changes, false, body.validate_only).await
        };
        responses.push(IncrementalAlterConfigsResourceResponse {
            error,
            error_message,
            resource_type: resource.resource_type,
            resource_name: resource.resource_name,
        });
    }
    let mut w = response(request);
    IncrementalAlterConfigsResponse { throttle_time_ms: 0, responses }.encode(&mut w, version);
    Ok(respond(w))
}

async fn alter(
    shard: &Rc<Shard>,
    resource_type: i8,
    name: &str,
    changes: Vec<(String, Option<String>)>,
    replace: bool,
    validate_only: bool,
) -> (ErrorCode, Option<String>) {
    let op = match resource_type {
        RESOURCE_TOPIC => AdminOp::AlterTopicConfigs { name: name.into(), changes, replace, validate_only },
        RESOURCE_BROKER => match broker_resource(name) {
            Some(resource) => AdminOp::AlterBrokerConfigs { resource, changes, replace, validate_only },
            None => {
                return (ErrorCode::InvalidRequest, Some(format!("broker resource name '{name}' is not a node id")));
            }
        },
        _ => return (ErrorCode::InvalidRequest, Some("only topic and broker configs can be altered".into())),
    };
    match shard.admin(op).await {
        AdminReply::Items(items) => match items.into_iter().next() {
            Some(item) => (item.error, item.message),
            None => (ErrorCode::RequestTimedOut, None),
        },
        _ => (ErrorCode::UnknownServerError, None),
    }
}

/// A broker resource name: empty for the cluster-wide defaults, else a node id.
pub fn broker_resource(name: &str) -> Option<BrokerResource> {
    if name.is_empty() {
        return Some(BrokerResource::Cluster);
    }
    name.parse().ok().map(|id| BrokerResource::Node(NodeId(id)))
}
