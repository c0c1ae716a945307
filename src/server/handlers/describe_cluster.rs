//! DescribeCluster: the cluster id, the controller and every node. Brokers
//! answer for the broker endpoints only (endpoint type 1), as Kafka's do.

use std::rc::Rc;

use crate::cluster::metadata::MetadataImage;

use super::{respond, response, Outcome};
use crate::protocol::describe_cluster::{
    DescribeClusterBroker, DescribeClusterRequest, DescribeClusterResponse, AUTHORIZED_OPERATIONS_OMITTED,
    ENDPOINT_TYPE_BROKERS,
};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::Shard;

/// Kafka's AclOperation codes a principal may use on the cluster resource
/// (CREATE 5, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10,
/// ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12), as a bit set. Without an
/// authorizer every client may use all of them.
const CLUSTER_OPERATIONS_ALL: i32 = (1 << 5) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12);

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = DescribeClusterRequest::decode(reader, version)?;
    let image = shard.image();
    let mut answer = DescribeClusterResponse {
        throttle_time_ms: 0,
        error: ErrorCode::None,
        error_message: None,
        endpoint_type: body.endpoint_type,
        cluster_id: image.durable.cluster_id.clone(),
        controller_id: super::metadata::controller_node(shard, &image).0,
        // Every registered node; a fenced machine's nodes say so (v2).
        brokers: image
            .serving_nodes()
            .into_iter()
            .map(|node| DescribeClusterBroker {
                broker_id: node.node_id.0,
                host: node.host,
                port: node.port,
                rack: node.rack,
                is_fenced: false,
            })
            .chain(fenced_nodes(&image))
            .collect(),
        cluster_authorized_operations: if body.include_cluster_authorized_operations {
            CLUSTER_OPERATIONS_ALL
        } else {
            AUTHORIZED_OPERATIONS_OMITTED
        },
    };
    if body.endpoint_type != ENDPOINT_TYPE_BROKERS {
        answer.error = ErrorCode::MismatchedEndpointType;
        answer.error_message =
            Some(format!("endpoint type {} asked of a broker: brokers describe endpoint type 1", body.endpoint_type));
        answer.brokers.clear();
        answer.controller_id = -1;
    }
    let mut w = response(request);
    answer.encode(&mut w, version);
    Ok(respond(w))
}

/// The nodes of fenced machines, which Metadata leaves out.
fn fenced_nodes(image: &MetadataImage) -> Vec<DescribeClusterBroker> {
    let serving: std::collections::BTreeSet<i32> = image.serving_nodes().iter().map(|n| n.node_id.0).collect();
    image
        .cluster
        .nodes
        .iter()
        .filter(|(id, _)| !serving.contains(&id.0))
        .map(|(id, placed)| DescribeClusterBroker {
            broker_id: id.0,
            host: placed.host.clone(),
            port: placed.port,
            rack: crate::cluster::MachineId::new(placed.machine)
                .and_then(|m| image.cluster.machines.get(&m)?.rack.clone()),
            is_fenced: true,
        })
        .collect()
}
