//! The per-core owner. A `Shard` lives on exactly one core and owns the
//! partitions placed there, its copy of the metadata image and its inbox.
//! Other cores reach its partitions only by sending owned messages to that
//! inbox (bounded flume channels); replies come back on one-shot channels.
//!
//! Core 0 also hosts the controller: it serializes metadata changes, persists
//! them and hands the new image to every core before answering.

mod events;
pub mod fetch_sessions;
pub mod groups;
pub mod partition;
pub mod report;
mod table;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use event_listener::Event;
use futures::StreamExt;
use glommio::sync::Semaphore;

use crate::cluster::bridge;
use crate::cluster::controller::{self, ItemResult, NewTopic};
pub use crate::cluster::metadata::ShardId;
use crate::cluster::metadata::{self, MetadataImage};
use crate::cluster::records::ConfigResource;
use crate::cluster::service::ControllerHandle;
use crate::cluster::MachineId;
use crate::config::ServeConfig;
use crate::constants;
use crate::log::{Log, LogError};
use crate::protocol::fetch::FetchPartitionResponse;
use crate::protocol::list_offsets::{self, ListOffsetsPartitionResponse};
use crate::protocol::produce::ProducePartitionResponse;
use crate::protocol::record_batch::{self, BatchError};
use crate::protocol::ErrorCode;
use partition::{Partition, SequenceCheck};

/// Work for a partition, run on the core that owns it. A produce's records
/// are a uniquely owned slice of a request of `request_bytes`; not `Clone`,
/// since a clone would copy them.
#[derive(Debug)]
pub enum PartitionOp {
    Produce { records: Option<BytesMut>, acks: i16, request_bytes: usize },
    Fetch { offset: i64, max_bytes: usize },
    ListOffsets { timestamp: i64 },
    DeleteRecords { offset: i64 },
    OffsetForLeaderEpoch { leader_epoch: i32 },
}

#[derive(Debug, Clone)]
pub enum PartitionReply {
    Produce(ProducePartitionResponse),
    Fetch(FetchPartitionResponse),
    ListOffsets(ListOffsetsPartitionResponse),
    DeleteRecords { low_watermark: i64, error: ErrorCode },
    OffsetForLeaderEpoch { leader_epoch: i32, end_offset: i64, error: ErrorCode },
}

/// A metadata change, run by the controller.
#[derive(Debug, Clone)]
pub enum AdminOp {
    CreateTopics {
        topics: Vec<NewTopic>,
        validate_only: bool,
    },
    DeleteTopics {
        names: Vec<String>,
    },
    CreatePartitions {
        topics: Vec<controller::PartitionGrowth>,
        validate_only: bool,
    },
    /// Set (`Some`) or delete (`None`) dynamic broker configs of the cluster
    /// or of one node; `replace` drops the rest.
    AlterBrokerConfigs {
        resource: controller::BrokerResource,
        changes: Vec<(String, Option<String>)>,
        replace: bool,
        validate_only: bool,
    },
    /// Set (`Some`) or delete (`None`) topic configs; `replace` drops the rest.
    AlterTopicConfigs {
        name: String,
        changes: Vec<(String, Option<String>)>,
        replace: bool,
        validate_only: bool,
    },
    AllocateProducerId,
}

#[derive(Debug, Clone)]
pub enum AdminReply {
    Items(Vec<ItemResult>),
    ProducerId(Result<i64, ErrorCode>),
}

/// Messages between cores.
pub enum ShardMessage {
    Partition {
        topic: String,
        partition: i32,
        op: PartitionOp,
        reply: flume::Sender<PartitionReply>,
    },
    Admin {
        op: AdminOp,
        reply: flume::Sender<AdminReply>,
    },
    ApplyImage {
        image: Arc<MetadataImage>,
        done: flume::Sender<()>,
    },
    Group {
        request: groups::GroupRequest,
        reply: flume::Sender<groups::GroupAnswer>,
    },
    /// Answer when new data is readable on this core, or at the deadline
    /// (long-polling Fetch on another core).
    AwaitData {
        deadline: std::time::Instant,
        reply: flume::Sender<()>,
    },
    Shutdown {
        done: flume::Sender<()>,
    },
    /// Report this core's counters and state to a scrape (`metrics`).
    Metrics {
        reply: flume::Sender<crate::metrics::CoreSnapshot>,
    },
}

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
    /// The consumer groups hashed to this core (set once at start).
    groups: RefCell<Option<Rc<groups::GroupService>>>,
    /// The controller service and this machine's id (core 0 decides
    /// through it; every core may read its status).
    controller: Option<(ControllerHandle, MachineId)>,
    /// Fetch sessions opened on this core's connections.
    pub fetch_sessions: RefCell<fetch_sessions::FetchSessions>,
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

    /// Opens the partitions this core owns in `image` and closes the ones it
    /// no longer owns (deleted topics: their files are removed).
    pub async fn apply_image(&self, image: Arc<MetadataImage>) -> Result<(), ShardError> {
        let current = self.image.borrow().version;
        assert!(image.version >= current, "metadata image versions only increase: {} after {current}", image.version);
        *self.image.borrow_mut() = image.clone();
        let mut wanted: BTreeMap<(String, i32), crate::log::LogConfig> = BTreeMap::new();
        let node = image.node_of_shard(self.id).expect("a running core is a node of the image");
        let dynamic = image.dynamic_broker_configs(node);
        for topic in image.durable.topics.values() {
            let mut log_config = self.config.effective_topic_log_config(dynamic, &topic.configs)?;
            for (index, p) in topic.partitions.iter().enumerate() {
                if p.shard == self.id {
                    log_config.leader_epoch = p.leader_epoch;
                    wanted.insert((topic.name.clone(), index as i32), log_config.clone());
                }
            }
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
        let opening = futures::stream::iter(to_open)
            .map(|(topic, index, log_config)| self.open_partition(topic, index, log_config))
            .buffer_unordered(PARTITION_OPEN_CONCURRENCY);
        futures::pin_mut!(opening);
        while let Some(opened) = opening.next().await {
            let partition = opened?;
            self.partitions.borrow_mut().insert(partition);
        }
        Ok(())
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
        partition.restore_producers(report.clean_shutdown).await.map_err(|source| ShardError::Log {
            topic,
            partition: index,
            source,
        })?;
        Ok(partition)
    }

    /// Tells long polls and fetch sessions that `partition` has something
    /// new to read: records, a high watermark, a log start offset.
    fn readable_changed(&self, partition: &Partition) {
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

    /// Runs `op` on the partition's owner: here, or on another core.
    pub async fn partition_op(self: &Rc<Self>, topic: &str, partition: i32, op: PartitionOp) -> PartitionReply {
        let reply = self.route_partition_op(topic, partition, op).await;
        report::partition_reply(&reply);
        reply
    }

    async fn route_partition_op(self: &Rc<Self>, topic: &str, partition: i32, op: PartitionOp) -> PartitionReply {
        let owner = self.image().partition(topic, partition).map(|p| p.shard);
        match owner {
            Some(shard) if shard == self.id => self.run_partition_op(topic, partition, op).await,
            Some(shard) => {
                // Made before `op` moves: cloning it would copy a produce's records.
                let unreachable = error_reply(&op, partition, ErrorCode::NotLeaderOrFollower);
                let (reply, receive) = flume::bounded(1);
                let message = ShardMessage::Partition { topic: topic.to_string(), partition, op, reply };
                match self.send(shard, message).await {
                    Ok(()) => receive.recv_async().await.unwrap_or(unreachable),
                    Err(()) => unreachable,
                }
            }
            None => error_reply(&op, partition, ErrorCode::UnknownTopicOrPartition),
        }
    }

    pub(crate) async fn send(&self, shard: ShardId, message: ShardMessage) -> Result<(), ()> {
        let inbox = self.inboxes.get(shard.0 as usize).ok_or(())?;
        inbox.send_async(message).await.map_err(|_| ())
    }

    /// For each of `reads`: its answer when this core owns the partition
    /// and the log can answer without waiting (nothing new, or batches in
    /// its tail cache; at most `max_bytes(read)`), None when it needs the
    /// disk, another core or is unknown; and the other core that owns it.
    /// Most fetches of a consumer that keeps up touch many partitions with
    /// nothing new: this spares each of them a future, a routing step and a
    /// cross-core hop. The topic is looked up once for each run of reads of
    /// the same topic.
    pub fn fetch_now_each(
        &self,
        reads: &[fetch_sessions::Read],
        max_bytes: impl Fn(&fetch_sessions::Read) -> usize,
    ) -> Vec<(Option<FetchPartitionResponse>, Option<ShardId>)> {
        let image = self.image();
        let table = self.partitions.borrow();
        type Run<'a> = (&'a Rc<str>, Option<&'a metadata::TopicInfo>, Option<&'a [Option<Rc<Partition>>]>);
        let mut run: Option<Run> = None;
        let mut found: Vec<(Option<&Rc<Partition>>, Option<ShardId>)> = Vec::with_capacity(reads.len());
        for read in reads {
            let name = &read.wanted.topic;
            let (info, local) = match run {
                Some((last, info, local)) if Rc::ptr_eq(last, name) || **last == **name => (info, local),
                _ => {
                    let found = (image.topic(name), table.topic(name));
                    run = Some((name, found.0, found.1));
                    found
                }
            };
            let slot = usize::try_from(read.wanted.partition.index).ok();
            let owner = slot.and_then(|at| info?.partitions.get(at)).map(|p| p.shard);
            let remote = owner.filter(|owner| *owner != self.id);
            let partition = slot.and_then(|at| local?.get(at)?.as_ref()).filter(|_| owner == Some(self.id));
            found.push((partition, remote));
        }
        // Each partition's log state is a cache miss: touched first in a
        // loop of independent loads, the misses overlap instead of coming
        // one at a time inside each read.
        for (partition, _) in &found {
            if let Some(partition) = partition {
                std::hint::black_box(partition.log.high_watermark());
            }
        }
        reads
            .iter()
            .zip(found)
            .map(|(read, (partition, remote))| {
                let answer = partition.and_then(|partition| {
                    let read_now = partition.log.read_now(read.wanted.partition.fetch_offset, max_bytes(read))?;
                    let answer = fetch_answer(partition, read_now);
                    crate::metrics::record_error(crate::protocol::ApiKey::Fetch, answer.error);
                    Some(answer)
                });
                (answer, remote)
            })
            .collect()
    }

    /// Runs a partition operation on this core (the owner).
    pub async fn run_partition_op(&self, topic: &str, index: i32, op: PartitionOp) -> PartitionReply {
        let Some(partition) = self.local_partition(topic, index) else {
            let code = if self.image().partition(topic, index).is_some() {
                ErrorCode::NotLeaderOrFollower
            } else {
                ErrorCode::UnknownTopicOrPartition
            };
            return error_reply(&op, index, code);
        };
        match op {
            PartitionOp::Produce { records, request_bytes, .. } => {
                PartitionReply::Produce(self.produce(&partition, records, request_bytes).await)
            }
            PartitionOp::Fetch { offset, max_bytes } => {
                PartitionReply::Fetch(fetch(&partition, offset, max_bytes).await)
            }
            PartitionOp::ListOffsets { timestamp } => {
                PartitionReply::ListOffsets(list_offsets(&partition, timestamp).await)
            }
            PartitionOp::DeleteRecords { offset } => match partition.log.delete_records(offset).await {
                Ok(low_watermark) => {
                    self.readable_changed(&partition);
                    PartitionReply::DeleteRecords { low_watermark, error: ErrorCode::None }
                }
                Err(err) => PartitionReply::DeleteRecords { low_watermark: -1, error: log_error_code(&err) },
            },
            PartitionOp::OffsetForLeaderEpoch { leader_epoch } => {
                let current = partition.log.config().leader_epoch;
                if leader_epoch > current {
                    PartitionReply::OffsetForLeaderEpoch { leader_epoch: -1, end_offset: -1, error: ErrorCode::None }
                } else {
                    // One epoch per partition on a single node: its end is the log end.
                    PartitionReply::OffsetForLeaderEpoch {
                        leader_epoch: current,
                        end_offset: partition.log.log_end_offset(),
                        error: ErrorCode::None,
                    }
                }
            }
        }
    }

    /// Validates, de-duplicates and appends one partition's record set. The
    /// appends happen before the first await, so requests keep their order.
    async fn produce(
        &self,
        partition: &Partition,
        records: Option<BytesMut>,
        request_bytes: usize,
    ) -> ProducePartitionResponse {
        let index = partition.index;
        let Some(records) = records else {
            return ProducePartitionResponse::error(index, ErrorCode::CorruptMessage);
        };
        let log = &partition.log;
        let batch_bytes_max = log.config().batch_bytes_max;
        let batches = match split_and_validate(records, batch_bytes_max) {
            Ok(batches) => batches,
            Err(code) => return ProducePartitionResponse::error(index, code),
        };
        let mut first_offset = None;
        let header_is_idempotent = batches.iter().any(|(_, header)| header.producer_id >= 0);
        // The last offset the answer waits for: of the batches appended
        // here, and of those this request repeats.
        let mut last_appended = None;
        for (data, header) in batches {
            match partition.check_sequence(&header) {
                Ok(SequenceCheck::Duplicate { base_offset }) => {
                    // A retry is answered as its first attempt would have
                    // been: once that batch is done under the flush policy.
                    // Answering at once acknowledged batches whose first
                    // attempt was still waiting for the disk, or had failed
                    // with the log (full disk), and were then lost.
                    first_offset.get_or_insert(base_offset);
                    let last = base_offset + i64::from(header.last_offset_delta);
                    last_appended = last_appended.max(Some(last));
                }
                Ok(SequenceCheck::Append) => match log.append(owned_for_cache(data, request_bytes), &header) {
                    Ok(appended) => {
                        crate::metrics::record_produced(&partition.topic, header.size_bytes, header.record_count);
                        partition.record_sequence(&header, appended.base_offset);
                        first_offset.get_or_insert(appended.base_offset);
                        last_appended = Some(appended.last_offset);
                    }
                    Err(err) => return ProducePartitionResponse::error(index, log_error_code(&err)),
                },
                Err(code) => return ProducePartitionResponse::error(index, code),
            }
        }
        if let Some(last) = last_appended {
            if first_offset.is_some() && header_is_idempotent {
                if let Err(err) = partition.snapshot_producers_if_none().await {
                    tracing::warn!(topic = %partition.topic, partition = index, error = %err, "writing the first producer snapshot failed");
                    return ProducePartitionResponse::error(index, ErrorCode::KafkaStorageError);
                }
            }
            if let Err(err) = log.wait_done(last).await {
                return ProducePartitionResponse::error(index, log_error_code(&err));
            }
            self.readable_changed(partition);
        }
        ProducePartitionResponse {
            index,
            error: ErrorCode::None,
            base_offset: first_offset.unwrap_or(-1),
            log_append_time_ms: -1,
            log_start_offset: log.log_start_offset(),
            error_message: None,
        }
    }

    /// Sends an admin operation to the controller (core 0) and waits.
    pub async fn admin(self: &Rc<Self>, op: AdminOp) -> AdminReply {
        let api = report::admin_api(&op);
        let reply = self.admin_on_controller(op).await;
        report::admin_reply(api, &reply);
        reply
    }

    async fn admin_on_controller(self: &Rc<Self>, op: AdminOp) -> AdminReply {
        if self.is_controller() {
            return self.run_admin(op).await;
        }
        let (reply, receive) = flume::bounded(1);
        let failed = || AdminReply::Items(Vec::new());
        if self.send(ShardId(0), ShardMessage::Admin { op, reply }).await.is_err() {
            return failed();
        }
        receive.recv_async().await.unwrap_or_else(|_| failed())
    }

    /// The broker's side of the controller: has the controller service
    /// decide and commit the change, then applies the committed image on
    /// every core, then answers.
    async fn run_admin(self: &Rc<Self>, op: AdminOp) -> AdminReply {
        assert!(self.is_controller());
        let Ok(_permit) = self.controller_lock.acquire_permit(1).await else {
            return AdminReply::Items(Vec::new());
        };
        let Some((handle, _)) = self.controller.clone() else {
            return AdminReply::Items(Vec::new());
        };
        let request = match op {
            AdminOp::CreateTopics { topics, validate_only } => {
                bridge::AdminRequest::CreateTopics { topics, validate_only }
            }
            AdminOp::DeleteTopics { names } => bridge::AdminRequest::DeleteTopics { names },
            AdminOp::CreatePartitions { topics, validate_only } => {
                bridge::AdminRequest::CreatePartitions { topics, validate_only }
            }
            AdminOp::AlterTopicConfigs { name, changes, replace, validate_only } => {
                bridge::AdminRequest::AlterConfigs {
                    resource: ConfigResource::Topic(name),
                    changes,
                    replace,
                    validate_only,
                }
            }
            AdminOp::AlterBrokerConfigs { resource, changes, replace, validate_only } => {
                let resource = match resource {
                    controller::BrokerResource::Cluster => ConfigResource::Broker(None),
                    controller::BrokerResource::Node(node) => ConfigResource::Broker(Some(node.0)),
                };
                bridge::AdminRequest::AlterConfigs { resource, changes, replace, validate_only }
            }
            AdminOp::AllocateProducerId => return AdminReply::ProducerId(self.allocate_producer_id().await),
        };
        let names = request_names(&request);
        let items = match bridge::submit(&handle, request).await {
            Ok(items) => items,
            Err(err) => return AdminReply::Items(bridge::failed_items(&names, &err)),
        };
        self.publish_committed().await;
        AdminReply::Items(items)
    }

    /// On core 0: applies every image the metadata log commits on every
    /// core (changes decided on this machine are applied by `run_admin`
    /// before it answers; this follows the rest). Runs until shutdown.
    pub async fn follow_controller(self: Rc<Self>) {
        let Some((handle, _)) = self.controller.clone().filter(|_| self.is_controller()) else { return };
        let committed = handle.subscribe(constants::INBOX_DEPTH);
        while !self.shutting_down.get() {
            let next = futures_lite::future::or(async { committed.recv_async().await.ok().map(|_| ()) }, async {
                glommio::timer::sleep(Duration::from_millis(100)).await;
                Some(())
            })
            .await;
            if next.is_none() {
                return;
            }
            let Ok(_permit) = self.controller_lock.acquire_permit(1).await else { return };
            self.publish_committed().await;
        }
    }

    /// Applies the controller's last committed image on every core, when
    /// it is newer than the one they have.
    async fn publish_committed(self: &Rc<Self>) {
        let Some((handle, machine)) = self.controller.clone() else { return };
        let committed = handle.image();
        let current = self.image();
        if committed.provenance.offset <= current.version {
            return;
        }
        let next = bridge::local_image(&committed, machine);
        events::log_topic_changes(&current.durable, &next.durable);
        self.broadcast_image(Arc::new(next)).await;
    }

    async fn allocate_producer_id(self: &Rc<Self>) -> Result<i64, ErrorCode> {
        let (next, end) = self.producer_ids.get();
        if next < end {
            self.producer_ids.set((next + 1, end));
            return Ok(next);
        }
        let Some((handle, machine)) = self.controller.clone() else { return Err(ErrorCode::NotController) };
        let start = bridge::allocate_producer_ids(&handle, machine).await.map_err(|err| {
            tracing::warn!(error = %err, "allocating a producer id block failed");
            ErrorCode::NotController
        })?;
        self.publish_committed().await;
        self.producer_ids.set((start + 1, start + constants::PRODUCER_ID_BLOCK));
        Ok(start)
    }

    async fn broadcast_image(self: &Rc<Self>, image: Arc<MetadataImage>) {
        let mut waits = Vec::new();
        for (index, inbox) in self.inboxes.iter().enumerate() {
            if index == self.id.0 as usize {
                continue;
            }
            let (done, wait) = flume::bounded(1);
            if inbox.send_async(ShardMessage::ApplyImage { image: image.clone(), done }).await.is_ok() {
                waits.push(wait);
            }
        }
        if let Err(err) = self.apply_image(image).await {
            tracing::error!(error = %err, "applying metadata on the controller core failed");
        }
        for wait in waits {
            let _ = wait.recv_async().await;
        }
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

    /// Stops accepting, lets in-flight requests finish (bounded), then
    /// closes every log cleanly.
    pub async fn shutdown(&self) {
        self.shutting_down.set(true);
        self.shutdown_event.notify(usize::MAX);
        for _ in 0..200 {
            if self.in_flight_requests.get() == 0 {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        let service = self.groups.borrow().clone();
        if let Some(service) = service {
            service.close().await;
        }
        let partitions: Vec<Rc<Partition>> = self.partitions.borrow().values().cloned().collect();
        // Closing is a write, a trim and an fdatasync per log: many at once.
        // The order makes the next start trust only what is whole: the log
        // is closed first (its last appends written and synced), then the
        // producer snapshot is saved as of its final end, and only then is
        // the log marked clean. A snapshot taken before the close missed
        // the batches still being written, and the clean start that
        // trusted it rejected the producer's next sequence.
        let closing = futures::stream::iter(partitions)
            .map(|partition| async move {
                let (topic, index) = (&partition.topic, partition.index);
                if let Err(err) = partition.log.close_unmarked().await {
                    tracing::error!(%topic, partition = index, error = %err, "closing log failed");
                    return;
                }
                if let Err(err) = partition.snapshot_producers().await {
                    tracing::error!(%topic, partition = index, error = %err, "writing producer snapshot failed; the next start replays the log");
                    return;
                }
                if let Err(err) = partition.log.mark_clean() {
                    tracing::error!(%topic, partition = index, error = %err, "marking the log clean failed; the next start scans it");
                }
            })
            .buffer_unordered(PARTITION_OPEN_CONCURRENCY);
        closing.collect::<()>().await;
    }

    /// Background upkeep: interval fsyncs, retention checks, reopening
    /// logs failed for a full disk.
    ///
    /// Walking every partition is the cost here: at ten thousand partitions
    /// a walk of all of them held the core for 1 ms (6 ms with retention),
    /// long enough to show in the produce p99, and glommio's preemption
    /// does not come within it. So the walk is spread out: each tick visits
    /// its share of the partitions, and a cycle of `TICKS_PER_CYCLE` ticks
    /// visits them all (failed logs, the set of logs with an interval
    /// flush); every `CYCLES_PER_RETENTION`th cycle also applies retention
    /// and writes the producer snapshots of logs that rolled. Each tick
    /// syncs the logs the last cycle found with an interval flush.
    pub async fn run_maintenance(self: Rc<Self>) {
        let mut cycle: u64 = 0;
        let mut visited = 0usize;
        let mut interval_flushed: Vec<Weak<Partition>> = Vec::new();
        let mut found: Vec<Weak<Partition>> = Vec::new();
        while !self.shutting_down.get() {
            glommio::timer::sleep(MAINTENANCE_TICK).await;
            let now = crate::log::now_ms();
            for partition in interval_flushed.iter().filter_map(Weak::upgrade) {
                if self.shutting_down.get() {
                    return;
                }
                sync_if_interval_due(&partition.log, now).await;
            }
            let (share, count) = {
                let partitions = self.partitions.borrow();
                let count = partitions.len();
                let share: Vec<Rc<Partition>> =
                    partitions.values().skip(visited).take(count.div_ceil(TICKS_PER_CYCLE)).cloned().collect();
                (share, count)
            };
            let retention = cycle.is_multiple_of(CYCLES_PER_RETENTION);
            visited += share.len();
            for partition in share {
                if self.shutting_down.get() {
                    return;
                }
                let log = &partition.log;
                if log.is_failed() {
                    // Only a full disk heals by itself; an EIO keeps the log
                    // stopped (reads still served) until an operator restarts.
                    if log.failed_for_space() {
                        self.reopen(&partition).await;
                    }
                    continue;
                }
                if sync_if_interval_due(log, now).await {
                    found.push(Rc::downgrade(&partition));
                }
                if retention {
                    let log_start = log.log_start_offset();
                    let _ = log.enforce_retention(now).await;
                    if log.log_start_offset() != log_start {
                        self.readable_changed(&partition);
                    }
                    let _ = partition.snapshot_producers_if_rolled().await;
                }
            }
            if visited >= count {
                visited = 0;
                cycle += 1;
                interval_flushed = std::mem::take(&mut found);
            }
        }
    }
}

/// How often the maintenance task wakes (the finest interval flush it
/// serves on time).
const MAINTENANCE_TICK: Duration = Duration::from_millis(50);
/// Ticks in which every partition is visited once: a log that failed for a
/// full disk is retried, and a partition whose flush policy became an
/// interval starts being synced, within a cycle (1 s).
const TICKS_PER_CYCLE: usize = 20;
/// Retention and producer snapshots every this many cycles (5 s).
const CYCLES_PER_RETENTION: u64 = 5;

/// Syncs `log` when its policy is an interval that is due at `now`; true
/// when its policy is an interval (due or not).
async fn sync_if_interval_due(log: &Log, now: u64) -> bool {
    let crate::log::FlushPolicy::IntervalMs(ms) = log.config().flush else { return false };
    if log.needs_sync() && now % ms.max(1) < MAINTENANCE_TICK.as_millis() as u64 {
        let _ = log.sync().await;
    }
    true
}

impl Shard {
    /// Opens this core's group service (replaying committed offsets) and
    /// starts its timer.
    pub async fn open_groups(self: &Rc<Self>) -> Result<(), groups::GroupServiceError> {
        let settings = &self.config.group;
        let config = crate::group::GroupConfig {
            initial_rebalance_delay_ms: settings.initial_rebalance_delay_ms,
            session_timeout_ms_min: settings.session_timeout_ms_min,
            session_timeout_ms_max: settings.session_timeout_ms_max,
            member_id_seed: (crate::log::now_ms() << 8)
                ^ u64::from(self.id.0)
                ^ ((self.config.node_id_base as u64) << 48),
            ..Default::default()
        };
        let dir = self.config.data.join("__groups").join(format!("core-{}", self.id.0));
        let service = groups::GroupService::open(&dir, config).await?;
        *self.groups.borrow_mut() = Some(service.clone());
        let stop = Rc::new(Cell::new(false));
        let shard = self.clone();
        let ticker_stop = stop.clone();
        glommio::spawn_local(async move {
            let watcher = async {
                while !shard.shutting_down.get() {
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                }
                ticker_stop.set(true);
            };
            futures_lite::future::zip(service.run_ticks(stop), watcher).await;
        })
        .detach();
        Ok(())
    }

    /// Where `group_id`'s coordinator is (see
    /// `MetadataImage::group_coordinator`).
    pub fn group_owner(&self, group_id: &str) -> metadata::Placement {
        self.image().group_coordinator(group_id)
    }

    /// Runs a group request on the group's core. In per-core mode a request
    /// that reached another core is answered NOT_COORDINATOR (the client
    /// asks FindCoordinator again); in shared-port mode it is forwarded.
    pub async fn group_op(
        self: &Rc<Self>,
        group_id: &str,
        request: groups::GroupRequest,
    ) -> Result<groups::GroupAnswer, ErrorCode> {
        let owner = match self.group_owner(group_id) {
            metadata::Placement::Local(owner, _) => owner,
            // Another machine's: the client asks FindCoordinator again.
            metadata::Placement::Remote(_) => return Err(ErrorCode::NotCoordinator),
            metadata::Placement::Unavailable => return Err(ErrorCode::CoordinatorNotAvailable),
        };
        if owner == self.id {
            return Ok(self.run_group_op(request).await);
        }
        if self.config.listener == crate::config::ListenerMode::PerCore {
            return Err(ErrorCode::NotCoordinator);
        }
        self.forward_group_op(owner, request).await
    }

    pub async fn forward_group_op(
        &self,
        owner: ShardId,
        request: groups::GroupRequest,
    ) -> Result<groups::GroupAnswer, ErrorCode> {
        let (reply, receive) = flume::bounded(1);
        self.send(owner, ShardMessage::Group { request, reply })
            .await
            .map_err(|_| ErrorCode::CoordinatorNotAvailable)?;
        receive.recv_async().await.map_err(|_| ErrorCode::CoordinatorNotAvailable)
    }

    pub async fn run_group_op(&self, request: groups::GroupRequest) -> groups::GroupAnswer {
        let service = self.groups.borrow().clone();
        match service {
            Some(service) => service.handle(request).await,
            None => groups::GroupAnswer::Unavailable,
        }
    }

    /// Every core's groups (ListGroups in shared-port mode, where one node
    /// stands for all cores).
    pub async fn list_all_groups(self: &Rc<Self>) -> Vec<groups::GroupAnswer> {
        let mut answers = Vec::new();
        for shard in 0..self.shard_count() as u32 {
            let answer = if ShardId(shard) == self.id {
                self.run_group_op(groups::GroupRequest::List).await
            } else {
                self.forward_group_op(ShardId(shard), groups::GroupRequest::List)
                    .await
                    .unwrap_or(groups::GroupAnswer::Unavailable)
            };
            answers.push(answer);
        }
        answers
    }

    /// Replaces a failed log by reopening it from disk (recovery keeps what
    /// was durably written; the failed appends were never acknowledged).
    async fn reopen(&self, failed: &Rc<Partition>) {
        let key = (failed.topic.to_string(), failed.index);
        let config = failed.log.config();
        // The failed log lets go of its files first: no write of its may
        // land after the new log's recovery has cut the file.
        if let Err(err) = failed.log.close_unmarked().await {
            tracing::debug!(topic = %key.0, partition = key.1, error = %err, "closing a failed log before reopening it");
        }
        match Log::open(failed.log.dir().to_path_buf(), config).await {
            Ok((log, report)) => {
                let partition = Rc::new(Partition::new(key.0.clone(), key.1, log));
                if let Err(err) = partition.restore_producers(report.clean_shutdown).await {
                    tracing::error!(topic = %key.0, partition = key.1, error = %err, "reopened log unreadable");
                    return;
                }
                tracing::warn!(topic = %key.0, partition = key.1, truncated_bytes = report.truncated_bytes, "reopened a failed log");
                let still_same = self.partitions.borrow().get(&key.0, key.1).is_some_and(|p| Rc::ptr_eq(p, failed));
                if still_same {
                    self.partitions.borrow_mut().insert(partition);
                }
            }
            Err(err) => {
                tracing::error!(topic = %key.0, partition = key.1, error = %err, "reopening a failed log failed")
            }
        }
    }
}

/// A batch the tail cache may keep: the request's slice itself when the
/// batch is at least half of the request, otherwise a copy, so that a small
/// batch in a long cache never keeps a large request's memory alive (what
/// the cache holds stays within twice what it counts).
/// The item names of an admin request, for answers when it fails whole.
fn request_names(request: &bridge::AdminRequest) -> Vec<String> {
    match request {
        bridge::AdminRequest::CreateTopics { topics, .. } => topics.iter().map(|t| t.name.clone()).collect(),
        bridge::AdminRequest::DeleteTopics { names } => names.clone(),
        bridge::AdminRequest::CreatePartitions { topics, .. } => topics.iter().map(|t| t.name.clone()).collect(),
        bridge::AdminRequest::AlterConfigs { resource, .. } => vec![match resource {
            ConfigResource::Topic(name) => name.clone(),
            ConfigResource::Broker(None) => String::new(),
            ConfigResource::Broker(Some(node)) => node.to_string(),
        }],
    }
}

fn owned_for_cache(batch: BytesMut, request_bytes: usize) -> BytesMut {
    if batch.len().saturating_mul(2) >= request_bytes {
        batch
    } else {
        BytesMut::from(&batch[..])
    }
}

fn split_and_validate(
    records: BytesMut,
    batch_bytes_max: usize,
) -> Result<Vec<(BytesMut, record_batch::BatchHeader)>, ErrorCode> {
    if records.len() > batch_bytes_max.saturating_mul(64) {
        return Err(ErrorCode::RecordListTooLarge);
    }
    let total = records.len();
    let batches = record_batch::split_batches_mut(records, usize::MAX).map_err(|e| e.error_code())?;
    let consumed: usize = batches.iter().map(BytesMut::len).sum();
    if consumed != total || batches.is_empty() {
        return Err(ErrorCode::CorruptMessage);
    }
    let mut out = Vec::with_capacity(batches.len());
    for data in batches {
        if data.len() > batch_bytes_max {
            return Err(ErrorCode::MessageTooLarge);
        }
        let header = record_batch::validate(&data, batch_bytes_max).map_err(|e: BatchError| e.error_code())?;
        if header.is_transactional() || header.is_control() {
            return Err(ErrorCode::InvalidRecord);
        }
        out.push((data, header));
    }
    Ok(out)
}

async fn fetch(partition: &Partition, offset: i64, max_bytes: usize) -> FetchPartitionResponse {
    fetch_answer(partition, partition.log.read(offset, max_bytes).await)
}

/// The answer for one partition's read, counted in the fetch metrics.
fn fetch_answer(partition: &Partition, read: Result<crate::log::ReadOutput, LogError>) -> FetchPartitionResponse {
    let log = &partition.log;
    let answer = match read {
        Ok(read) => FetchPartitionResponse {
            index: partition.index,
            error: ErrorCode::None,
            high_watermark: read.high_watermark,
            last_stable_offset: read.high_watermark,
            log_start_offset: read.log_start_offset,
            records: read.batches,
        },
        Err(err) => FetchPartitionResponse {
            index: partition.index,
            error: log_error_code(&err),
            high_watermark: log.high_watermark(),
            last_stable_offset: log.high_watermark(),
            log_start_offset: log.log_start_offset(),
            records: Vec::new(),
        },
    };
    crate::metrics::record_fetched(&partition.topic, &answer.records);
    answer
}

async fn list_offsets(partition: &Partition, timestamp: i64) -> ListOffsetsPartitionResponse {
    let log = &partition.log;
    let epoch = log.config().leader_epoch;
    let answer = |offset, timestamp| ListOffsetsPartitionResponse {
        index: partition.index,
        error: ErrorCode::None,
        timestamp,
        offset,
        leader_epoch: epoch,
    };
    match timestamp {
        list_offsets::LATEST_TIMESTAMP => answer(log.high_watermark(), -1),
        list_offsets::EARLIEST_TIMESTAMP => answer(log.log_start_offset(), -1),
        timestamp => match log.offset_for_timestamp(timestamp).await {
            Ok(Some((offset, found))) => answer(offset, found),
            Ok(None) => answer(-1, -1),
            Err(err) => ListOffsetsPartitionResponse::error(partition.index, log_error_code(&err)),
        },
    }
}

/// Partitions a core opens (or closes) at once: at startup, when topics
/// appear, at shutdown.
const PARTITION_OPEN_CONCURRENCY: usize = 64;

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

/// The Kafka error code of a storage error (the one place they are mapped).
pub fn log_error_code(err: &LogError) -> ErrorCode {
    match err {
        LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
        LogError::Batch(batch) => batch.error_code(),
        LogError::BatchTooLarge { .. } => ErrorCode::MessageTooLarge,
        // Closed for shutdown (or deletion): the partition is leaving this
        // node, and a client retries elsewhere or after the restart.
        LogError::Closed => ErrorCode::NotLeaderOrFollower,
        LogError::Io { .. } | LogError::Failed(_) | LogError::Corrupt { .. } => ErrorCode::KafkaStorageError,
    }
}

fn error_reply(op: &PartitionOp, index: i32, code: ErrorCode) -> PartitionReply {
    match op {
        PartitionOp::Produce { .. } => PartitionReply::Produce(ProducePartitionResponse::error(index, code)),
        PartitionOp::Fetch { .. } => PartitionReply::Fetch(FetchPartitionResponse::error(index, code)),
        PartitionOp::ListOffsets { .. } => {
            PartitionReply::ListOffsets(ListOffsetsPartitionResponse::error(index, code))
        }
        PartitionOp::DeleteRecords { .. } => PartitionReply::DeleteRecords { low_watermark: -1, error: code },
        PartitionOp::OffsetForLeaderEpoch { .. } => {
            PartitionReply::OffsetForLeaderEpoch { leader_epoch: -1, end_offset: -1, error: code }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_that_is_most_of_its_request_is_cached_in_place_a_small_one_is_copied() {
        let mut request = BytesMut::from(&[7u8; 1000][..]);
        let big = request.split_to(600);
        let small = request.split_to(100);
        let (big_at, small_at) = (big.as_ptr(), small.as_ptr());
        let big = owned_for_cache(big, 1000);
        let small = owned_for_cache(small, 1000);
        assert_eq!(big.as_ptr(), big_at, "half or more of the request: no copy");
        assert_ne!(small.as_ptr(), small_at, "a small share of the request: its own buffer");
        assert_eq!(&small[..], &[7u8; 100][..]);
        assert_eq!(small.capacity(), 100);
    }
}
