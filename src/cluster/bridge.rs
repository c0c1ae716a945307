//! Between the cluster's metadata log and the cores (issue 29): the cores
//! still read a `MetadataImage` (nodes, topics with each partition's core);
//! this builds it from the committed `ClusterImage` for one machine, and
//! turns an admin request into a decision the controller service commits.
//! It also starts a machine's metadata: the first records of a new cluster,
//! the migration of a `metadata.rkyv` written by an older shardlog, and the
//! machine's registration at every start.
//!
//! Runs on core 0 (decisions) and on the start-up thread (bootstrap).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::control::{self, ControlContext, Decision, TopicRequest};
use super::controller::{ItemResult, NewTopic, PartitionGrowth};
use super::ids::MachineId;
use super::image::ClusterImage;
use super::metadata::{MetadataImage, NodeId, NodeInfo, PartitionInfo, PersistedMetadata, ShardId, TopicInfo};
use super::records::{ConfigResource, MetadataRecord, PartitionRecord, StoredScram};
use super::service::{ControllerHandle, SubmitError};
use crate::config::ServeConfig;
use crate::protocol::ErrorCode;

/// The core a partition's leader runs on when that is not this machine:
/// no core of it, so Metadata reports LEADER_NOT_AVAILABLE.
pub const NOT_LOCAL: ShardId = ShardId(u32::MAX);

/// The cores' view of `cluster` on `machine`, every topic converted.
pub fn local_image(cluster: &Arc<ClusterImage>, machine: MachineId) -> MetadataImage {
    build_local_image(None, cluster, machine)
}

/// The cores' view of `cluster` on `machine`, reusing from `previous` (the
/// view of an earlier image on this machine) every topic the commits since
/// did not touch: copy on write keeps an untouched topic's `Arc` in the
/// cluster image, so a topic whose `Arc`, configs and the nodes are the
/// same converts to what it converted to before. A commit that changes one
/// topic converts one topic (`cargo bench --bench metadata`).
pub fn local_image_since(previous: &MetadataImage, cluster: &Arc<ClusterImage>, machine: MachineId) -> MetadataImage {
    build_local_image(Some(previous), cluster, machine)
}

fn build_local_image(
    previous: Option<&MetadataImage>,
    cluster: &Arc<ClusterImage>,
    machine: MachineId,
) -> MetadataImage {
    let mut nodes: Vec<NodeInfo> = cluster
        .nodes
        .iter()
        .filter(|(_, placement)| placement.machine == machine.get())
        .map(|(id, placement)| NodeInfo {
            node_id: *id,
            host: placement.host.clone(),
            port: placement.port,
            shard: ShardId(placement.core),
        })
        .collect();
    nodes.sort_by_key(|node| node.shard);
    let core_of = |node: i32| -> ShardId {
        match cluster.nodes.get(&NodeId(node)) {
            Some(placement) if placement.machine == machine.get() => ShardId(placement.core),
            _ => NOT_LOCAL,
        }
    };
    // What an earlier conversion can be reused for: the same machine, and
    // nodes placed where they were (a partition's core comes from them).
    let reusable = previous.filter(|p| p.machine == machine && p.cluster.nodes == cluster.nodes);
    let topics = cluster
        .topics
        .iter()
        .map(|(id, topic)| {
            let configs = cluster.configs.topics.get(&topic.name);
            let unchanged = reusable.and_then(|p| {
                let before = p.cluster.topics.get(id)?;
                let same = Arc::ptr_eq(before, topic) && p.cluster.configs.topics.get(&topic.name) == configs;
                same.then(|| p.durable.topics.get(&topic.name)).flatten()
            });
            let info = match unchanged {
                Some(info) => info.clone(),
                None => TopicInfo {
                    name: topic.name.clone(),
                    topic_id: topic.id,
                    partitions: topic
                        .partitions
                        .iter()
                        .map(|p| PartitionInfo {
                            shard: core_of(p.leader),
                            leader_epoch: p.leader_epoch,
                            replica: p
                                .replicas
                                .iter()
                                .map(|n| core_of(*n))
                                .find(|c| *c != NOT_LOCAL)
                                .unwrap_or(NOT_LOCAL),
                        })
                        .collect(),
                    configs: configs.cloned().unwrap_or_default(),
                },
            };
            (topic.name.clone(), info)
        })
        .collect();
    let controller = nodes.first().map_or(NodeId(0), |n| n.node_id);
    MetadataImage {
        version: cluster.provenance.offset,
        nodes,
        controller,
        durable: PersistedMetadata {
            cluster_id: cluster.cluster_id.clone(),
            topics,
            producer_id_next: cluster.producer_id_next,
            broker_configs: cluster.configs.cluster.clone(),
            node_configs: cluster.configs.nodes.clone(),
        },
        machine,
        cluster: Arc::clone(cluster),
    }
}

/// How often `bootstrap` says it still waits for the controller.
const WAITING_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
const RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// Who this machine is, for its registration.
#[derive(Debug, Clone)]
pub struct Registration {
    pub machine: MachineId,
    /// One (host, port) per core.
    pub endpoints: Vec<(String, i32)>,
    pub first_node_id: i32,
    pub rack: Option<String>,
    /// `--bootstrap-user`: made if the cluster has no user of that name.
    pub bootstrap_user: Option<(String, String)>,
}

/// Starts this machine's metadata, on the start-up thread: creates the
/// cluster on first start (migrating `legacy`, a `metadata.rkyv` from
/// before the metadata log, which needs a quorum of this machine alone),
/// registers the machine with one endpoint per core, unfences it, and
/// waits until this machine's own image shows it. Returns the machine's
/// incarnation. Waits as long as the controller quorum has no controller,
/// saying so every few seconds.
pub fn bootstrap(
    handle: &ControllerHandle,
    registration: Registration,
    legacy: Option<PersistedMetadata>,
) -> Result<u64, SubmitError> {
    let started = std::time::Instant::now();
    let mut said = started;
    let mut retry = |err: SubmitError| -> Result<(), SubmitError> {
        if !err.is_retriable() {
            return Err(err);
        }
        if said.elapsed() >= WAITING_LOG_EVERY {
            said = std::time::Instant::now();
            let status = handle.status();
            tracing::info!(
                waited_s = started.elapsed().as_secs(),
                voters = ?status.voters.iter().map(|v| v.get()).collect::<Vec<_>>(),
                error = %err,
                "waiting for the controller quorum to elect a controller"
            );
        }
        std::thread::sleep(RETRY_DELAY);
        Ok(())
    };
    let fresh = handle.image().cluster_id.is_empty();
    let cluster_id = legacy
        .as_ref()
        .map(|l| l.cluster_id.clone())
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| format!("shardlog-{:016x}", crate::log::now_ms() ^ u64::from(std::process::id())));
    let incarnation = crate::log::now_ms() ^ (u64::from(std::process::id()) << 40);
    let machine = registration.machine;
    let id = machine.get();
    let bootstrap_user = registration.bootstrap_user.map(|(user, password)| {
        let credentials = [crate::security::scram::Hash::Sha256, crate::security::scram::Hash::Sha512]
            .map(|hash| (hash.kafka_type(), stored_scram(hash, &password)))
            .to_vec();
        let change = control::ScramChange { user, set: credentials, delete: Vec::new() };
        Request::AlterScram { changes: vec![change], only_if_absent: true }
    });
    let steps = [
        Some(Request::CreateCluster { cluster_id }),
        bootstrap_user,
        Some(Request::RegisterMachine {
            machine: id,
            incarnation,
            rack: registration.rack,
            endpoints: registration.endpoints,
            first_node_id: registration.first_node_id,
        }),
        Some(Request::UnfenceMachine { machine: id }),
    ];
    for step in steps.into_iter().flatten() {
        loop {
            match futures_lite::future::block_on(request(handle, &step)) {
                Ok(Answer::Refused(_, reason)) => return Err(SubmitError::Remote(reason)),
                Ok(_) => break,
                Err(err) => retry(err)?,
            }
        }
        if matches!(step, Request::RegisterMachine { .. }) {
            // Heartbeat from the registration on: a machine fenced while it
            // starts (its lease, or a probe of its port before it listens)
            // is unfenced by its next heartbeat, and the wait below ends.
            handle.live(incarnation);
        }
    }
    if let Some(legacy) = legacy.filter(|_| fresh) {
        loop {
            let legacy = legacy.clone();
            let migrate = Box::new(move |image: &ClusterImage| (migration(image, machine, &legacy), ()));
            match futures_lite::future::block_on(handle.submit(migrate)) {
                Ok(()) => break,
                Err(err) => retry(err)?,
            }
        }
    }
    // The answers came after the controller committed; this machine's own
    // copy of the log may still be behind.
    loop {
        let image = handle.image();
        if image.machines.get(&machine).is_some_and(|m| m.incarnation == incarnation && !m.fenced) {
            break;
        }
        retry(SubmitError::TimedOut)?;
    }
    Ok(incarnation)
}

/// The records that rebuild a `metadata.rkyv`'s topics, configs and
/// producer ids on `machine`, whose core `c` is its `c`-th node.
pub fn migration(image: &ClusterImage, machine: MachineId, legacy: &PersistedMetadata) -> Vec<MetadataRecord> {
    let node_of_core = |core: u32| -> i32 {
        image
            .nodes
            .iter()
            .find(|(_, p)| p.machine == machine.get() && p.core == core)
            .or_else(|| image.nodes.iter().find(|(_, p)| p.machine == machine.get()))
            .map_or(-1, |(id, _)| id.0)
    };
    let mut records = Vec::new();
    for topic in legacy.topics.values() {
        records.push(MetadataRecord::Topic { name: topic.name.clone(), topic_id: topic.topic_id });
        for (index, p) in topic.partitions.iter().enumerate() {
            let leader = node_of_core(p.shard.0);
            records.push(MetadataRecord::Partition(PartitionRecord {
                topic_id: topic.topic_id,
                partition: index as i32,
                replicas: vec![leader],
                isr: vec![leader],
                leader,
                leader_epoch: p.leader_epoch,
                partition_epoch: 0,
            }));
        }
        for (name, value) in &topic.configs {
            records.push(config(ConfigResource::Topic(topic.name.clone()), name, value));
        }
    }
    for (name, value) in &legacy.broker_configs {
        records.push(config(ConfigResource::Broker(None), name, value));
    }
    for (node, configs) in &legacy.node_configs {
        for (name, value) in configs {
            records.push(config(ConfigResource::Broker(Some(*node)), name, value));
        }
    }
    if legacy.producer_id_next > 0 {
        let epoch = image.machines.get(&machine).map_or(0, |m| m.epoch);
        records.push(MetadataRecord::ProducerIds {
            machine: machine.get(),
            machine_epoch: epoch,
            next_producer_id: legacy.producer_id_next,
        });
    }
    records
}

fn config(resource: ConfigResource, name: &str, value: &str) -> MetadataRecord {
    MetadataRecord::Config { resource, name: name.into(), value: Some(value.into()) }
}

/// What an admin request asks of the controller.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum AdminRequest {
    CreateTopics {
        topics: Vec<NewTopic>,
        validate_only: bool,
    },
    DeleteTopics {
        names: Vec<String>,
    },
    CreatePartitions {
        topics: Vec<PartitionGrowth>,
        validate_only: bool,
    },
    AlterConfigs {
        resource: ConfigResource,
        changes: Vec<(String, Option<String>)>,
        replace: bool,
        validate_only: bool,
    },
}

/// What a machine asks of the controller: owned, and rkyv so that a
/// machine that is not the controller forwards it there.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Request {
    Admin(AdminRequest),
    /// The first record of a new cluster; nothing when it exists.
    CreateCluster {
        cluster_id: String,
    },
    /// A machine (re)registers with one endpoint per core.
    RegisterMachine {
        machine: u64,
        incarnation: u64,
        rack: Option<String>,
        endpoints: Vec<(String, i32)>,
        first_node_id: i32,
    },
    /// A registered machine is ready to serve.
    UnfenceMachine {
        machine: u64,
    },
    /// A block of producer ids for a machine.
    ProducerIds {
        machine: u64,
    },
    /// An administrator removes a fenced machine that holds no replica.
    UnregisterMachine {
        machine: u64,
    },
    /// A machine shuts down (SIGTERM): it is fenced now, so its partitions
    /// get other leaders and its replicas leave the ISRs before it stops
    /// (KRaft's controlled shutdown).
    ControlledShutdown {
        machine: u64,
    },
    /// ElectLeaders: preferred (or unclean) elections for the partitions
    /// named, every partition when None.
    ElectLeaders {
        unclean: bool,
        partitions: Option<Vec<(String, Vec<i32>)>>,
    },
    /// AlterPartitionReassignments: moves (or cancels the moves of)
    /// partitions, answered per move as `topic/partition`.
    AlterReassignments {
        moves: Vec<control::MoveRequest>,
    },
    /// Sets and deletes users' SCRAM credentials; `only_if_absent` changes
    /// only users with no credential at all (`--bootstrap-user`).
    /// Answered per user.
    AlterScram {
        changes: Vec<control::ScramChange>,
        only_if_absent: bool,
    },
    /// A partition's leader changes its ISR (Kafka's AlterPartition).
    AlterIsr {
        topic_id: [u8; 16],
        partition: i32,
        leader: i32,
        machine_epoch: u64,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<i32>,
    },
}

/// The controller's answer to a `Request`, given once its records commit.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Answer {
    /// Per item: name, Kafka error code, message.
    Items(Vec<(String, i16, Option<String>)>),
    /// The first id of a producer-id block.
    ProducerIds(i64),
    Done,
    /// Refused before any record: Kafka's error code and why.
    Refused(i16, String),
}

/// The `Decider` of this machine's controller service: decodes a
/// `Request`, decides it with this machine's config checks and encodes
/// the `Answer`.
pub fn decider(config: Arc<ServeConfig>) -> super::service::Decider {
    Arc::new(move |image: &ClusterImage, body: &[u8]| {
        let mut aligned = rkyv::util::AlignedVec::<16>::new();
        aligned.extend_from_slice(body);
        let (records, answer) = match rkyv::from_bytes::<Request, rkyv::rancor::Error>(&aligned) {
            Ok(request) => decide_request(image, &config, &request),
            Err(err) => (
                Vec::new(),
                Answer::Refused(ErrorCode::InvalidRequest.code(), format!("a request that does not decode: {err}")),
            ),
        };
        (records, rkyv::to_bytes::<rkyv::rancor::Error>(&answer).expect("an answer serializes").to_vec())
    })
}

fn decide_request(image: &ClusterImage, config: &ServeConfig, request: &Request) -> (Vec<MetadataRecord>, Answer) {
    match request {
        Request::CreateCluster { cluster_id } if image.cluster_id.is_empty() => {
            (vec![MetadataRecord::ClusterCreated { cluster_id: cluster_id.clone() }], Answer::Done)
        }
        Request::CreateCluster { .. } => (Vec::new(), Answer::Done),
        Request::RegisterMachine { machine, incarnation, rack, endpoints, first_node_id } => {
            match control::register_machine(
                image,
                *machine,
                *incarnation,
                rack.clone(),
                endpoints,
                Some(*first_node_id),
            ) {
                Ok(records) => (records, Answer::Done),
                Err((error, reason)) => (Vec::new(), Answer::Refused(error.code(), reason)),
            }
        }
        Request::UnfenceMachine { machine } => match control::unfence_machine(image, *machine) {
            records if !records.is_empty() => (records, Answer::Done),
            _ => (
                Vec::new(),
                Answer::Refused(
                    ErrorCode::BrokerIdNotRegistered.code(),
                    format!("machine {machine} is not registered"),
                ),
            ),
        },
        Request::ProducerIds { machine } => match control::allocate_producer_ids(image, *machine) {
            Ok((start, records)) => (records, Answer::ProducerIds(start)),
            Err(error) => {
                (Vec::new(), Answer::Refused(error.code(), format!("no producer ids for machine {machine}: {error:?}")))
            }
        },
        Request::UnregisterMachine { machine } => {
            let serving = image.machines.iter().any(|(id, m)| id.get() == *machine && !m.fenced);
            if serving {
                let reason = format!("machine {machine} is serving: stop it first (it is fenced once silent)");
                return (Vec::new(), Answer::Refused(ErrorCode::InvalidRequest.code(), reason));
            }
            match control::unregister_machine(image, *machine) {
                Ok(records) => (records, Answer::Done),
                Err((error, reason)) => (Vec::new(), Answer::Refused(error.code(), reason)),
            }
        }
        Request::ElectLeaders { unclean, partitions } => {
            let (records, answers) = control::elect_leaders(image, *unclean, partitions.as_deref());
            let items = answers
                .into_iter()
                .map(|(topic, partition, error, message)| (format!("{topic}/{partition}"), error.code(), message))
                .collect();
            (records, Answer::Items(items))
        }
        Request::ControlledShutdown { machine } => (control::fence_machine(image, *machine), Answer::Done),
        Request::AlterReassignments { moves } => {
            let decision = control::alter_reassignments(image, moves);
            let items = moves
                .iter()
                .zip(decision.items)
                .map(|(m, item)| (format!("{}/{}", m.topic, m.partition), item.error.code(), item.message))
                .collect();
            (decision.records, Answer::Items(items))
        }
        Request::AlterIsr { topic_id, partition, leader, machine_epoch, leader_epoch, partition_epoch, isr } => {
            let change = control::IsrChange {
                topic_id: *topic_id,
                partition: *partition,
                leader: *leader,
                machine_epoch: *machine_epoch,
                leader_epoch: *leader_epoch,
                partition_epoch: *partition_epoch,
                isr: isr.clone(),
            };
            match control::alter_isr(image, &change) {
                Ok(records) => (records, Answer::Done),
                Err((error, reason)) => (Vec::new(), Answer::Refused(error.code(), reason)),
            }
        }
        Request::AlterScram { changes, only_if_absent } => {
            let decision = control::alter_scram(image, changes, *only_if_absent);
            let items = decision.items.into_iter().map(|i| (i.name, i.error.code(), i.message)).collect();
            (decision.records, Answer::Items(items))
        }
        Request::Admin(admin) => {
            let decision = decide(image, config, admin, crate::log::now_ms() ^ image.provenance.offset);
            let items = decision.items.into_iter().map(|i| (i.name, i.error.code(), i.message)).collect();
            (decision.records, Answer::Items(items))
        }
    }
}

/// Sends `request` to the controller (this machine's, or forwarded) and
/// waits for the answer given after commit.
pub async fn request(handle: &ControllerHandle, request: &Request) -> Result<Answer, SubmitError> {
    let body = rkyv::to_bytes::<rkyv::rancor::Error>(request).expect("a request serializes").to_vec();
    let bytes = handle.request(body).await?;
    let mut aligned = rkyv::util::AlignedVec::<16>::new();
    aligned.extend_from_slice(&bytes);
    rkyv::from_bytes::<Answer, rkyv::rancor::Error>(&aligned)
        .map_err(|err| SubmitError::Remote(format!("an answer that does not decode: {err}")))
}

/// A SCRAM credential for `password` with a fresh salt and Kafka's
/// default iterations.
pub fn stored_scram(hash: crate::security::scram::Hash, password: &str) -> StoredScram {
    crate::security::scram::Credential::new(hash, password, crate::security::scram::ITERATIONS_MIN).into()
}

/// A controlled shutdown (SIGTERM) of a machine of a cluster: stops its
/// heartbeats, asks the controller to fence it, which moves the leadership
/// of its partitions to other in-sync replicas, and waits (at most
/// `wait`) until that commits. Producers then find the new leaders before
/// this machine stops answering, so a rolling restart fails no produce. A
/// machine alone (no other serving machine) skips it: there is nowhere to
/// move leadership to.
pub fn controlled_shutdown(handle: &ControllerHandle, machine: MachineId, wait: std::time::Duration) {
    let image = handle.image();
    let others_serve = image.machines.iter().any(|(id, m)| *id != machine && !m.fenced);
    if !others_serve {
        return;
    }
    handle.quiet();
    let started = std::time::Instant::now();
    let (done, finished) = flume::bounded(1);
    let asking = handle.clone();
    let _ = std::thread::Builder::new().name("shardlog-controlled-shutdown".into()).spawn(move || {
        let request = Request::ControlledShutdown { machine: machine.get() };
        let answer = futures_lite::future::block_on(self::request(&asking, &request));
        let _ = done.send(answer.map(|_| ()));
    });
    match finished.recv_timeout(wait) {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "controlled shutdown refused; stopping anyway"),
        Err(_) => tracing::warn!(
            wait_ms = wait.as_millis() as u64,
            "controlled shutdown not committed in time; stopping anyway"
        ),
    }
    // The cores apply the committed image on their own (core 0 follows the
    // controller); give them until they hold it.
    while started.elapsed() < wait {
        let fenced = handle.image().machines.get(&machine).is_some_and(|m| m.fenced);
        if fenced {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "controlled shutdown: leadership moved away");
}

/// Asks the controller for a partition's new ISR; the Kafka error code
/// and why when it is refused or cannot be asked.
pub async fn alter_isr(handle: &ControllerHandle, change: control::IsrChange) -> Result<(), (ErrorCode, String)> {
    let control::IsrChange { topic_id, partition, leader, machine_epoch, leader_epoch, partition_epoch, isr } = change;
    let asked = Request::AlterIsr { topic_id, partition, leader, machine_epoch, leader_epoch, partition_epoch, isr };
    match request(handle, &asked).await {
        Ok(Answer::Refused(code, reason)) => Err((crate::protocol::error::from_code(code), reason)),
        Ok(_) => Ok(()),
        Err(err) => Err((ErrorCode::NotController, err.to_string())),
    }
}

/// Decides `request` on `image` with the broker's config checks; a
/// validate-only request proposes nothing.
pub fn decide(image: &ClusterImage, config: &ServeConfig, request: &AdminRequest, salt: u64) -> Decision {
    let check_topic =
        |configs: &BTreeMap<String, String>| config.topic_log_config(configs).map(|_| ()).map_err(|e| e.to_string());
    let (decision, validate_only) = match request {
        AdminRequest::CreateTopics { topics, validate_only } => {
            let requests: Vec<TopicRequest> = topics
                .iter()
                .map(|t| TopicRequest {
                    name: t.name.clone(),
                    partitions: t.partitions,
                    replication_factor: t.replication_factor,
                    configs: t.configs.clone(),
                    assignments: t.assignments.clone(),
                })
                .collect();
            let context = ControlContext {
                default_partitions: config.topic.partitions,
                default_replication_factor: config.topic.replication_factor,
                check_topic_configs: &check_topic,
                salt,
            };
            (control::create_topics(image, &requests, &context), *validate_only)
        }
        AdminRequest::DeleteTopics { names } => (control::delete_topics(image, names), false),
        AdminRequest::CreatePartitions { topics, validate_only } => {
            (control::create_partitions_many(image, topics), *validate_only)
        }
        AdminRequest::AlterConfigs { resource, changes, replace, validate_only } => {
            let decision = match resource {
                ConfigResource::Topic(_) => control::alter_configs(image, resource, changes, *replace, &check_topic),
                ConfigResource::Broker(_) => {
                    let check = |configs: &BTreeMap<String, String>| {
                        crate::config::broker::validate_dynamic(config, configs).map_err(|e| e.to_string())
                    };
                    control::alter_configs(image, resource, changes, *replace, &check)
                }
            };
            (decision, *validate_only)
        }
    };
    if validate_only {
        Decision { records: Vec::new(), items: decision.items }
    } else {
        decision
    }
}

/// The answer to every item of a request that did not commit.
pub fn failed_items(items: &[String], error: &SubmitError) -> Vec<ItemResult> {
    let code = match error {
        SubmitError::Proposal(super::quorum::ProposalError::NotController { .. })
        | SubmitError::Proposal(super::quorum::ProposalError::LeaderLost { .. }) => ErrorCode::NotController,
        SubmitError::Proposal(_) | SubmitError::TimedOut => ErrorCode::RequestTimedOut,
        SubmitError::NotApplied(_) | SubmitError::Stopped | SubmitError::Remote(_) => ErrorCode::UnknownServerError,
    };
    items.iter().map(|name| ItemResult { name: name.clone(), error: code, message: Some(error.to_string()) }).collect()
}

/// Runs an admin `request` through the controller and waits for its commit.
pub async fn submit(handle: &ControllerHandle, request: AdminRequest) -> Result<Vec<ItemResult>, SubmitError> {
    match self::request(handle, &Request::Admin(request)).await? {
        Answer::Items(items) => Ok(items
            .into_iter()
            .map(|(name, code, message)| ItemResult { name, error: crate::protocol::error::from_code(code), message })
            .collect()),
        Answer::Refused(_, reason) => Err(SubmitError::Remote(reason)),
        other => Err(SubmitError::Remote(format!("an admin request answered {other:?}"))),
    }
}

/// A block of producer ids for this machine.
pub async fn allocate_producer_ids(handle: &ControllerHandle, machine: MachineId) -> Result<i64, SubmitError> {
    match request(handle, &Request::ProducerIds { machine: machine.get() }).await? {
        Answer::ProducerIds(start) => Ok(start),
        Answer::Refused(_, reason) => Err(SubmitError::Remote(reason)),
        other => Err(SubmitError::Remote(format!("a producer-id request answered {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::image::{MetadataDelta, Provenance};
    use super::*;

    fn commit(image: &ClusterImage, records: &[MetadataRecord]) -> ClusterImage {
        let mut delta = MetadataDelta::new(image);
        let at = Provenance { offset: image.provenance.offset + 1, epoch: 1 };
        for record in records {
            delta.replay(at, record).unwrap_or_else(|e| panic!("{record:?}: {e}"));
        }
        delta.finish().0
    }

    #[test]
    fn a_legacy_metadata_file_migrates_to_the_same_local_image() {
        let machine = MachineId::new(42).unwrap();
        let mut legacy = PersistedMetadata { cluster_id: "old".into(), producer_id_next: 5000, ..Default::default() };
        legacy.topics.insert(
            "t".into(),
            TopicInfo {
                name: "t".into(),
                topic_id: [3; 16],
                partitions: vec![
                    PartitionInfo { shard: ShardId(1), leader_epoch: 4, replica: ShardId(1) },
                    PartitionInfo { shard: ShardId(0), leader_epoch: 0, replica: ShardId(0) },
                ],
                configs: [("retention.ms".to_string(), "1000".to_string())].into(),
            },
        );
        legacy.broker_configs.insert("log.retention.ms".into(), "7".into());
        legacy.node_configs.insert(11, [("log.segment.bytes".to_string(), "1048576".to_string())].into());

        let image = commit(&ClusterImage::default(), &[MetadataRecord::ClusterCreated { cluster_id: "old".into() }]);
        let endpoints = vec![("h".to_string(), 9092), ("h".to_string(), 9093)];
        let image = commit(&image, &control::register_machine(&image, 42, 1, None, &endpoints, Some(10)).unwrap());
        let image = commit(&image, &migration(&image, machine, &legacy));

        let local = local_image(&Arc::new(image), machine);
        assert_eq!(
            local.nodes.iter().map(|n| (n.node_id.0, n.shard.0, n.port)).collect::<Vec<_>>(),
            vec![(10, 0, 9092), (11, 1, 9093)]
        );
        assert_eq!(local.durable, legacy, "the cores see what the old file held");
    }

    #[test]
    fn a_partition_led_by_another_machine_has_no_local_core() {
        let image = commit(&ClusterImage::default(), &[MetadataRecord::ClusterCreated { cluster_id: "c".into() }]);
        let one = vec![("a".to_string(), 9092)];
        let image = commit(&image, &control::register_machine(&image, 1, 1, None, &one, None).unwrap());
        let image = commit(&image, &control::register_machine(&image, 2, 1, None, &one, None).unwrap());
        let records = vec![
            MetadataRecord::Topic { name: "t".into(), topic_id: [1; 16] },
            MetadataRecord::Partition(PartitionRecord {
                topic_id: [1; 16],
                partition: 0,
                replicas: vec![1],
                isr: vec![1],
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
            }),
        ];
        let image = Arc::new(commit(&image, &records));
        let on_one = local_image(&image, MachineId::new(1).unwrap());
        assert_eq!(on_one.topic("t").unwrap().partitions[0].shard, NOT_LOCAL);
        let on_two = local_image(&image, MachineId::new(2).unwrap());
        assert_eq!(on_two.topic("t").unwrap().partitions[0].shard, ShardId(0));
    }

    #[test]
    fn a_view_built_since_an_earlier_one_converts_only_what_changed_and_equals_a_full_conversion() {
        let image = commit(&ClusterImage::default(), &[MetadataRecord::ClusterCreated { cluster_id: "c".into() }]);
        let two = vec![("a".to_string(), 9092), ("a".to_string(), 9093)];
        let image = commit(&image, &control::register_machine(&image, 1, 1, None, &two, None).unwrap());
        let epoch = image.machines[&MachineId::new(1).unwrap()].epoch;
        let image = commit(&image, &[MetadataRecord::UnfenceMachine { machine: 1, machine_epoch: epoch }]);
        let check = |_: &BTreeMap<String, String>| -> Result<(), String> { Ok(()) };
        let context = ControlContext {
            default_partitions: 1,
            default_replication_factor: 1,
            check_topic_configs: &check,
            salt: 3,
        };
        let topics: Vec<TopicRequest> = ["a", "b"]
            .iter()
            .map(|name| TopicRequest {
                name: name.to_string(),
                partitions: 4,
                replication_factor: -1,
                configs: BTreeMap::new(),
                assignments: Vec::new(),
            })
            .collect();
        let decided = control::create_topics(&image, &topics, &context);
        let before = Arc::new(commit(&image, &decided.records));
        let machine = MachineId::new(1).unwrap();
        let first = local_image(&before, machine);
        // Partition 1 of "b" moves to the other core, and "a" gets a config.
        let b = before.topic_ids["b"];
        let moved = before.topics[&b].partitions[1].leader ^ 1;
        let changes = vec![
            MetadataRecord::PartitionChange(super::super::records::PartitionChange {
                topic_id: b,
                partition: 1,
                leader: Some(moved),
                isr: Some(vec![moved]),
                replicas: Some(vec![moved]),
            }),
            config(ConfigResource::Topic("a".into()), "retention.ms", "5"),
        ];
        let after = Arc::new(commit(&before, &changes));
        let since = local_image_since(&first, &after, machine);
        assert_eq!(since, local_image(&after, machine), "the same view as a full conversion");
        assert_ne!(since.topic("b").unwrap().partitions[1].shard, first.topic("b").unwrap().partitions[1].shard);
        assert_eq!(since.topic("a").unwrap().configs.get("retention.ms").map(String::as_str), Some("5"));
        // Untouched since: reused, not reconverted (the Arc is the same).
        let untouched = commit(&after, &[config(ConfigResource::Broker(None), "log.retention.ms", "9")]);
        assert!(Arc::ptr_eq(&after.topics[&b], &untouched.topics[&b]));
        let untouched = Arc::new(untouched);
        assert_eq!(local_image_since(&since, &untouched, machine), local_image(&untouched, machine));
    }

    #[test]
    fn a_validate_only_request_proposes_nothing_and_a_read_only_broker_config_is_refused_whole() {
        let image = commit(&ClusterImage::default(), &[MetadataRecord::ClusterCreated { cluster_id: "c".into() }]);
        let one = vec![("h".to_string(), 9092)];
        let image = commit(&image, &control::register_machine(&image, 1, 1, None, &one, None).unwrap());
        let epoch = image.machines.get(&MachineId::new(1).unwrap()).unwrap().epoch;
        let image = commit(&image, &[MetadataRecord::UnfenceMachine { machine: 1, machine_epoch: epoch }]);
        let config = ServeConfig::default();
        let topic = NewTopic {
            name: "t".into(),
            partitions: 2,
            replication_factor: -1,
            configs: BTreeMap::new(),
            assignments: Vec::new(),
        };
        let checked = decide(
            &image,
            &config,
            &AdminRequest::CreateTopics { topics: vec![topic.clone()], validate_only: true },
            1,
        );
        assert!(checked.records.is_empty());
        assert_eq!(checked.items[0].error, ErrorCode::None);
        let created =
            decide(&image, &config, &AdminRequest::CreateTopics { topics: vec![topic], validate_only: false }, 1);
        assert_eq!(created.records.len(), 3, "a topic and two partitions");

        let alter = |changes: Vec<(String, Option<String>)>| AdminRequest::AlterConfigs {
            resource: ConfigResource::Broker(None),
            changes,
            replace: false,
            validate_only: false,
        };
        let refused = decide(
            &image,
            &config,
            &alter(vec![("num.partitions".into(), Some("3".into())), ("log.retention.ms".into(), Some("1".into()))]),
            1,
        );
        assert!(refused.records.is_empty());
        assert_eq!(refused.items[0].error, ErrorCode::InvalidRequest);
        assert!(refused.items[0].message.as_deref().unwrap().contains("Cannot update these configs dynamically"));
        let accepted = decide(&image, &config, &alter(vec![("log.retention.ms".into(), Some("1".into()))]), 1);
        assert_eq!(accepted.records.len(), 1);
    }
}
