//! The messages between cores: work for a partition, a metadata change for
//! the controller core, and the other requests a core sends another's inbox.

use std::sync::Arc;

use bytes::BytesMut;

use super::groups;
use crate::cluster::controller::{self, ItemResult, NewTopic};
use crate::cluster::metadata::MetadataImage;
use crate::protocol::fetch::FetchPartitionResponse;
use crate::protocol::list_offsets::ListOffsetsPartitionResponse;
use crate::protocol::produce::ProducePartitionResponse;
use crate::protocol::ErrorCode;

/// Work for a partition, run on the core that owns it. A produce's records
/// are a uniquely owned slice of a request of `request_bytes`; not `Clone`,
/// since a clone would copy them.
#[derive(Debug)]
pub enum PartitionOp {
    Produce { records: Option<BytesMut>, acks: i16, timeout_ms: i32, request_bytes: usize },
    Fetch { offset: i64, max_bytes: usize },
    ListOffsets { timestamp: i64 },
    DeleteRecords { offset: i64 },
    OffsetForLeaderEpoch { current_leader_epoch: i32, leader_epoch: i32 },
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
    /// The version of the image the core holds.
    ImageVersion {
        reply: flume::Sender<u64>,
    },
}
