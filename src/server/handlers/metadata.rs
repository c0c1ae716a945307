//! Metadata: brokers (each core its own node, or one node in shared-port
//! mode), topics and partition leaders. Creates missing topics when allowed.

use std::rc::Rc;

use super::{respond, response, Outcome};
use crate::cluster::controller::NewTopic;
use crate::cluster::metadata::{MetadataImage, NodeId, Placement};
use crate::config::ListenerMode;
use crate::protocol::metadata::{MetadataBroker, MetadataPartition, MetadataRequest, MetadataResponse, MetadataTopic};
use crate::protocol::{DecodeResult, ErrorCode, Reader, Request};
use crate::shard::{AdminOp, Shard};

pub async fn handle(shard: &Rc<Shard>, request: &Request, reader: &mut Reader) -> DecodeResult<Outcome> {
    let version = request.header.api_version;
    let body = MetadataRequest::decode(reader, version)?;
    if let Some(names) = &body.topics {
        let image = shard.image();
        let missing: Vec<&String> = names.iter().filter(|n| image.topic(n).is_none()).collect();
        if !missing.is_empty() && body.allow_auto_topic_creation && shard.config.auto_create_topics {
            auto_create(shard, missing.into_iter().cloned().collect()).await;
        }
    }
    let image = shard.image();
    let answer = build(shard, &image, body.topics.as_deref());
    let mut w = response(request);
    answer.encode(&mut w, version);
    Ok(respond(w))
}

/// Creates topics with the broker defaults (auto-creation).
pub async fn auto_create(shard: &Rc<Shard>, names: Vec<String>) {
    if names.iter().any(|n| n == crate::constants::OFFSETS_TOPIC) {
        // With its own partition count, replicas and configs.
        shard.ensure_offsets_topic().await;
    }
    let topics = names
        .into_iter()
        .filter(|n| n != crate::constants::OFFSETS_TOPIC)
        .filter(|n| crate::cluster::controller::validate_topic_name(n).is_ok())
        .map(|name| NewTopic {
            name,
            partitions: -1,
            replication_factor: -1,
            configs: Default::default(),
            assignments: Vec::new(),
        })
        .collect::<Vec<_>>();
    if !topics.is_empty() {
        shard.admin(AdminOp::CreateTopics { topics, validate_only: false }).await;
    }
}

/// The node clients should use to reach `placement`: itself, or in
/// shared-port mode its machine's one advertised node.
pub fn advertised(shard: &Shard, image: &MetadataImage, placement: Placement) -> Option<NodeId> {
    let node = match placement {
        Placement::Local(_, node) | Placement::Remote(node) => node,
        Placement::Unavailable => return None,
    };
    match shard.config.listener {
        ListenerMode::PerCore => Some(node),
        ListenerMode::Shared => image.machine_front(node),
    }
}

/// Replica node ids as clients know the nodes: behind a shared listener,
/// each machine's front node.
fn as_advertised(shard: &Shard, image: &MetadataImage, nodes: Vec<i32>) -> Vec<i32> {
    match shard.config.listener {
        ListenerMode::PerCore => nodes,
        ListenerMode::Shared => nodes.into_iter().map(|n| image.machine_front(NodeId(n)).map_or(n, |f| f.0)).collect(),
    }
}

fn build(shard: &Shard, image: &MetadataImage, names: Option<&[String]>) -> MetadataResponse {
    let serving = image.serving_nodes();
    let brokers = serving
        .iter()
        .filter(|n| match shard.config.listener {
            ListenerMode::PerCore => true,
            ListenerMode::Shared => image.machine_front(n.node_id) == Some(n.node_id),
        })
        .map(|n| MetadataBroker { node_id: n.node_id.0, host: n.host.clone(), port: n.port, rack: n.rack.clone() })
        .collect();
    let topic_names: Vec<String> = match names {
        Some(names) => names.to_vec(),
        None => image.durable.topics.keys().cloned().collect(),
    };
    let topics = topic_names
        .into_iter()
        .map(|name| match image.topic(&name) {
            Some(topic) => MetadataTopic {
                error: ErrorCode::None,
                is_internal: name == crate::constants::OFFSETS_TOPIC,
                partitions: image
                    .leaders_of(&topic.name)
                    .into_iter()
                    .enumerate()
                    .map(|(index, (placement, epoch))| (index, epoch, advertised(shard, image, placement)))
                    .map(|(index, leader_epoch, leader)| match leader {
                        Some(leader) => {
                            let (replica_nodes, isr_nodes) = match image.replicas_of(&name, index as i32) {
                                (replicas, _) if replicas.is_empty() => (vec![leader.0], vec![leader.0]),
                                (replicas, isr) => {
                                    (as_advertised(shard, image, replicas), as_advertised(shard, image, isr))
                                }
                            };
                            MetadataPartition {
                                error: ErrorCode::None,
                                index: index as i32,
                                leader_id: leader.0,
                                leader_epoch,
                                replica_nodes,
                                isr_nodes,
                            }
                        }
                        // As Kafka does, the replicas are still named.
                        None => {
                            let (replica_nodes, isr_nodes) = image.replicas_of(&name, index as i32);
                            MetadataPartition {
                                error: ErrorCode::LeaderNotAvailable,
                                index: index as i32,
                                leader_id: -1,
                                leader_epoch,
                                replica_nodes,
                                isr_nodes,
                            }
                        }
                    })
                    .collect(),
                name,
            },
            None => MetadataTopic {
                error: if crate::cluster::controller::validate_topic_name(&name).is_ok() {
                    ErrorCode::UnknownTopicOrPartition
                } else {
                    ErrorCode::InvalidTopicException
                },
                name,
                is_internal: false,
                partitions: Vec::new(),
            },
        })
        .collect();
    MetadataResponse {
        throttle_time_ms: 0,
        brokers,
        cluster_id: Some(image.durable.cluster_id.clone()),
        controller_id: controller_node(shard, image).0,
        topics,
    }
}

/// The node named as controller: the controller machine's first node
/// (Kafka names a broker; the controller here is a machine), or this
/// machine's while none is known.
pub fn controller_node(shard: &Shard, image: &MetadataImage) -> NodeId {
    let leader = shard.controller().and_then(|(handle, _)| handle.status().leader);
    leader
        .and_then(|machine| {
            let machine = image.cluster.machines.get(&machine)?;
            machine.nodes.iter().map(|n| NodeId(*n)).find_map(|n| image.machine_front(n))
        })
        .filter(|node| !matches!(image.placement_of(*node), Placement::Unavailable))
        .unwrap_or(image.controller)
}
