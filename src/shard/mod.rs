//! The per-core owner. A `Shard` lives on exactly one core and owns the
//! partitions placed there, its copy of the metadata image and its inbox.
//! Other cores reach its partitions only by sending owned messages to that
//! inbox (bounded flume channels); replies come back on one-shot channels.
//!
//! Core 0 also drives the controller service: it turns admin requests into
//! requests to the controller and hands each committed image to every core
//! before answering.
//!
//! - `messages`: what cores send each other.
//! - `ops`: partition work (routing, produce, fetch, list offsets).
//! - `admin`: the controller driver on core 0.
//! - `group_ops`: the group service and routing to a group's coordinator.
//! - `maintenance`: fsync intervals, retention, reopening failed logs, shutdown.
//! - `report`: what the shard reports into `metrics`.

mod admin;
mod events;
pub mod fetch_sessions;
mod group_ops;
pub mod groups;
mod maintenance;
mod messages;
mod ops;
pub mod partition;
pub(crate) mod replication;
pub mod report;
mod table;

pub use messages::{AdminOp, AdminReply, PartitionOp, PartitionReply, ShardMessage};
pub use ops::{fetch_answer, log_error_code};

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use event_listener::Event;
use futures::StreamExt;
use glommio::sync::Semaphore;

pub use crate::cluster::metadata::ShardId;
use crate::cluster::metadata::{self, MetadataImage};
use crate::cluster::service::ControllerHandle;
use crate::cluster::MachineId;
use crate::config::ServeConfig;
use crate::log::{Log, LogError};
use partition::Partition;

/// One core's state. Shared by the tasks of that core through `Rc`.
pub struct Shard {
    pub id: ShardId,
    pub config: Arc<ServeConfig>,
    image: RefCell<Arc<MetadataImage>>,
    partitions: RefCell<table::PartitionTable>,
    inboxes: Vec<flume::Sender<ShardMessage>>,
    /// Notified whenever new data becomes readable on this core (long polls).
    pub data_event: Event,
    /// Serializes metadata changes (controller core only).
    controller_lock: Semaphore,
    /// Producer ids left in the current block (controller core only).
    producer_ids: Cell<(i64, i64)>,
    pub shutting_down: Cell<bool>,
    pub shutdown_event: Event,
    pub in_flight_requests: Cell<usize>,
    /// Bytes of requests in flight on this core's connections.
    pub in_flight_budget: Rc<Semaphore>,
    /// The groups of the `__consumer_offsets` partitions this core leads
    /// (the service is set once at start).
    groups: RefCell<Option<Rc<groups::GroupService>>>,
    /// The controller service and this machine's id (core 0 decides
    /// through it; every core may read its status).
    controller: Option<(ControllerHandle, MachineId)>,
    /// Fetch sessions opened on this core's connections.
    pub fetch_sessions: RefCell<fetch_sessions::FetchSessions>,
    /// The partitions this core follows, by leader (`replication`).
    pub(crate) followed: RefCell<replication::Followed>,
    /// Held while partitions open, close or are cut and reopened: an image
    /// applied and a follower's truncation never interleave.
    restructure: Semaphore,
}

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("log {topic}-{partition}: {source}")]
    Log { topic: String, partition: i32, source: LogError },
    #[error("metadata: {0}")]
    Metadata(#[from] metadata::MetadataError),
    #[error("config: {0}")]
    Config(#[from] crate::config::ConfigError),
}

impl Shard {
    pub fn new(
        id: ShardId,
        config: Arc<ServeConfig>,
        image: Arc<MetadataImage>,
        inboxes: Vec<flume::Sender<ShardMessage>>,
        controller: Option<(ControllerHandle, MachineId)>,
    ) -> Rc<Self> {
        let in_flight_bytes = config.in_flight_bytes_max as u64;
        Rc::new(Self {
            id,
            config,
            image: RefCell::new(image),
            partitions: RefCell::new(table::PartitionTable::default()),
            inboxes,
            data_event: Event::new(),
            controller_lock: Semaphore::new(1),
            producer_ids: Cell::new((0, 0)),
            shutting_down: Cell::new(false),
            shutdown_event: Event::new(),
            in_flight_requests: Cell::new(0),
            in_flight_budget: Rc::new(Semaphore::new(in_flight_bytes)),
            groups: RefCell::new(None),
            controller,
            fetch_sessions: RefCell::new(fetch_sessions::FetchSessions::default()),
            followed: RefCell::new(replication::Followed::default()),
            restructure: Semaphore::new(1),
        })
    }

    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    pub fn is_controller(&self) -> bool {
        self.id == ShardId(0)
    }

    pub fn shard_count(&self) -> usize {
        self.inboxes.len()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.config.data.clone()
    }

    pub fn partition_dir(&self, topic: &str, partition: i32) -> PathBuf {
        self.config.data.join(format!("{topic}-{partition}"))
    }

    pub fn local_partition(&self, topic: &str, partition: i32) -> Option<Rc<Partition>> {
        self.partitions.borrow().get(topic, partition).cloned()
    }

    pub fn local_partition_count(&self) -> usize {
        self.partitions.borrow().len()
    }

    pub fn local_partitions(&self) -> Vec<Rc<Partition>> {
        self.partitions.borrow().values().cloned().collect()
    }

    /// Messages waiting in this core's inbox.
    pub fn inbox_depth(&self) -> usize {
        self.inboxes.get(self.id.0 as usize).map_or(0, flume::Sender::len)
    }

    /// The controller service and this machine's id.
    pub fn controller(&self) -> Option<&(ControllerHandle, MachineId)> {
        self.controller.as_ref()
    }

    pub fn group_service(&self) -> Option<Rc<groups::GroupService>> {
        self.groups.borrow().clone()
    }

    /// Opens the partitions with a replica on this core in `image`, closes
    /// the ones without (deleted topics, replicas moved away: their files
    /// are removed), and gives each the role the image says (leader, sole
    /// replica, follower).
    pub async fn apply_image(self: &Rc<Self>, image: Arc<MetadataImage>) -> Result<(), ShardError> {
        let _restructure = self.restructure.acquire_permit(1).await.expect("never closed");
        let current = self.image.borrow().version;
        assert!(image.version >= current, "metadata image versions only increase: {} after {current}", image.version);
        *self.image.borrow_mut() = image.clone();
        let node = image.node_of_shard(self.id).expect("a running core is a node of the image");
        let dynamic = image.dynamic_broker_configs(node);
        let desired = self.desired_replicas(&image);
        let mut configs: BTreeMap<&str, crate::log::LogConfig> = BTreeMap::new();
        let mut wanted: BTreeMap<(String, i32), crate::log::LogConfig> = BTreeMap::new();
        for ((topic, index), replica) in &desired {
            let base = match configs.get(topic.as_str()) {
                Some(config) => config.clone(),
                None => {
                    let overrides = image.topic(topic).map(|t| t.configs.clone()).unwrap_or_default();
                    let config = self.config.effective_topic_log_config(dynamic, &overrides)?;
                    configs.insert(topic, config.clone());
                    config
                }
            };
            let log_config = crate::log::LogConfig { leader_epoch: replica.registration.leader_epoch, ..base };
            wanted.insert((topic.clone(), *index), log_config);
        }
        let gone: Vec<(String, i32)> = self
            .partitions
            .borrow()
            .values()
            .map(|p| (p.topic.to_string(), p.index))
            .filter(|key| !wanted.contains_key(key))
            .collect();
        for key in gone {
            let removed = self.partitions.borrow_mut().remove(&key.0, key.1);
            if let Some(partition) = removed {
                self.forget_replica(&partition);
                let log = &partition.log;
                let closed = log.close().await;
                if let Err(source) = closed.and_then(|_| log.remove_files()) {
                    tracing::error!(topic = %key.0, partition = key.1, error = %source, "removing deleted partition failed");
                }
            }
        }
        let mut to_open = Vec::new();
        for ((topic, index), log_config) in wanted {
            match self.local_partition(&topic, index) {
                Some(partition) => {
                    if partition.log.config() != log_config {
                        partition.log.set_config(log_config);
                    }
                }
                None => to_open.push((topic, index, log_config)),
            }
        }
        // Opening a log is a chain of small file operations, each a trip
        // through io_uring: many at once keep the disk and the kernel busy
        // instead of waiting on one after another (startup with thousands of
        // partitions).
        let mut failed = None;
        let opening = futures::stream::iter(to_open)
            .map(|(topic, index, log_config)| self.open_partition(topic, index, log_config))
            .buffer_unordered(PARTITION_OPEN_CONCURRENCY);
        futures::pin_mut!(opening);
        while let Some(opened) = opening.next().await {
            // One partition that cannot open (a full disk) does not keep
            // the others from their roles; the next image tries it again.
            let partition = match opened {
                Ok(partition) => partition,
                Err(err) => {
                    tracing::error!(error = %err, "opening a partition failed");
                    failed.get_or_insert(err);
                    continue;
                }
            };
            let replicated = desired
                .get(&(partition.topic.to_string(), partition.index))
                .is_some_and(|d| d.registration.replicas.len() > 1);
            if replicated {
                // Nothing is known committed until a leader says so.
                partition.log.set_high_watermark_limit(partition.log.log_start_offset());
                *partition.replica.role.borrow_mut() = crate::replica::Role::Follower { leader: -1, leader_epoch: -1 };
            }
            self.partitions.borrow_mut().insert(partition);
        }
        for ((topic, index), replica) in &desired {
            if let Some(partition) = self.local_partition(topic, *index) {
                self.take_role(&partition, replica).await?;
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Opens (recovering if needed) one partition's log and producer state.
    async fn open_partition(
        &self,
        topic: String,
        index: i32,
        log_config: crate::log::LogConfig,
    ) -> Result<Rc<Partition>, ShardError> {
        let dir = self.partition_dir(&topic, index);
        let (log, report) = Log::open(dir, log_config).await.map_err(|source| ShardError::Log {
            topic: topic.clone(),
            partition: index,
            source,
        })?;
        if !report.clean_shutdown {
            tracing::info!(%topic, partition = index, scanned_bytes = report.scanned_bytes, truncated_bytes = report.truncated_bytes, "recovered after an unclean shutdown");
        }
        if let Some((fault, nth)) = injected_fault(&topic, index) {
            tracing::warn!(%topic, partition = index, ?fault, nth, "fault injection armed ({FAULT_ENV})");
            log.inject_fault_nth(fault, nth);
        }
        let partition = Rc::new(Partition::new(topic.clone(), index, log));
        partition.load_epochs().await;
        partition.restore_producers(report.clean_shutdown).await.map_err(|source| ShardError::Log {
            topic,
            partition: index,
            source,
        })?;
        Ok(partition)
    }

    /// Tells long polls and fetch sessions that `partition` has something
    /// new to read: records, a high watermark, a log start offset.
    pub(crate) fn readable_changed(&self, partition: &Partition) {
        self.fetch_sessions.borrow_mut().note_change(&partition.topic, partition.index);
        self.data_event.notify(usize::MAX);
    }

    /// Waits until data arrives on this core, shutdown begins, or `deadline`.
    pub async fn await_data(&self, deadline: std::time::Instant) {
        let listener = self.data_event.listen();
        let shutdown = self.shutdown_event.listen();
        if self.shutting_down.get() {
            return;
        }
        let wait = deadline.saturating_duration_since(std::time::Instant::now());
        futures_lite::future::or(futures_lite::future::or(listener, shutdown), async {
            glommio::timer::sleep(wait).await;
        })
        .await;
    }

    /// Asks `shard` to answer once it has new data (or at `deadline`).
    pub async fn await_remote_data(&self, shard: ShardId, deadline: std::time::Instant) {
        let (reply, receive) = flume::bounded(1);
        if self.send(shard, ShardMessage::AwaitData { deadline, reply }).await.is_ok() {
            let _ = receive.recv_async().await;
        }
    }

    pub(crate) async fn send(&self, shard: ShardId, message: ShardMessage) -> Result<(), ()> {
        let inbox = self.inboxes.get(shard.0 as usize).ok_or(())?;
        inbox.send_async(message).await.map_err(|_| ())
    }

    /// Serves this core's inbox until shutdown has finished. The inbox keeps
    /// being served while this core shuts down, so that other cores' requests
    /// in flight get answers instead of waiting on a core that stopped
    /// listening.
    pub async fn run_inbox(self: Rc<Self>, inbox: flume::Receiver<ShardMessage>) {
        let stopped = Rc::new(Event::new());
        let finished = Rc::new(Cell::new(false));
        loop {
            let stop = stopped.listen();
            if finished.get() {
                break;
            }
            let next = futures_lite::future::or(async { inbox.recv_async().await.ok() }, async {
                stop.await;
                None
            })
            .await;
            let Some(message) = next else { break };
            match message {
                ShardMessage::Partition { topic, partition, op, reply } => {
                    let shard = self.clone();
                    glommio::spawn_local(async move {
                        let answer = shard.run_partition_op(&topic, partition, op).await;
                        let _ = reply.send_async(answer).await;
                    })
                    .detach();
                }
                ShardMessage::Admin { op, reply } => {
                    let shard = self.clone();
                    glommio::spawn_local(async move {
                        let answer = shard.run_admin(op).await;
                        let _ = reply.send_async(answer).await;
                    })
                    .detach();
                }
                ShardMessage::Group { request, reply } => {
                    let shard = self.clone();
                    glommio::spawn_local(async move {
                        let answer = shard.run_group_op(request).await;
                        let _ = reply.send_async(answer).await;
                    })
                    .detach();
                }
                ShardMessage::ApplyImage { image, done } => {
                    if let Err(err) = self.apply_image(image).await {
                        tracing::error!(shard = self.id.0, error = %err, "applying metadata failed");
                    }
                    let _ = done.send_async(()).await;
                }
                ShardMessage::Shutdown { done } => {
                    let (shard, stopped, finished) = (self.clone(), stopped.clone(), finished.clone());
                    glommio::spawn_local(async move {
                        shard.shutdown().await;
                        finished.set(true);
                        stopped.notify(usize::MAX);
                        let _ = done.send_async(()).await;
                    })
                    .detach();
                }
                ShardMessage::ImageVersion { reply } => {
                    let _ = reply.try_send(self.image().version);
                }
                ShardMessage::Metrics { reply } => {
                    let _ = reply.try_send(report::snapshot(&self));
                }
                ShardMessage::AwaitData { deadline, reply } => {
                    let shard = self.clone();
                    glommio::spawn_local(async move {
                        shard.await_data(deadline).await;
                        let _ = reply.send_async(()).await;
                    })
                    .detach();
                }
            }
        }
    }
}

/// Partitions a core opens (or closes) at once: at startup, when topics
/// appear, at shutdown.
pub(super) const PARTITION_OPEN_CONCURRENCY: usize = 64;

/// Test hook of the disk-fault tests: `topic/partition=sync-eio` (or
/// `write-eio`), comma separated, makes the first write or fdatasync of those
/// partitions' logs fail with EIO once they are opened; `sync-eio@N` the Nth
/// instead. Unset in production.
const FAULT_ENV: &str = "SHARDLOG_INJECT_FAULT";

fn injected_fault(topic: &str, index: i32) -> Option<(crate::log::InjectedFault, u32)> {
    let spec = std::env::var(FAULT_ENV).ok()?;
    spec.split(',').find_map(|item| {
        let (target, fault) = item.trim().split_once('=')?;
        let (t, p) = target.rsplit_once('/')?;
        (t == topic && p.parse() == Ok(index)).then(|| crate::log::InjectedFault::parse(fault)).flatten()
    })
}
