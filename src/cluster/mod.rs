//! Cluster metadata: the immutable image every core holds a copy of, and the
//! controller logic that produces the next image. On a single node the
//! controller runs on core 0; the image types already carry node ids and
//! shard placement so that several machines can share them.
//!
//! The cluster of machines (issue 29) is being built beside it, not wired to
//! the cores yet: `records` and `image` are the metadata log (typed records
//! and the image they build by deltas), `control` the controller's decisions
//! as records, `quorum` the Raft engine of the controller quorum, and `ids`
//! the identities these modules share.

pub mod bridge;
pub mod control;
pub mod gossip;
pub mod controller;
pub mod ids;
pub mod image;
pub mod metadata;
pub mod quorum;
pub mod raft_log;
pub mod records;
pub mod observer;
pub mod service;
pub mod wire;

pub use ids::MachineId;
pub use metadata::{MetadataImage, NodeId, PartitionInfo, ShardId, TopicInfo};
