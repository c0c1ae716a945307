//! The cluster: machines, their nodes (one per core) and the metadata they
//! share (issue 29).
//!
//! - `records` and `image`: the metadata log's typed records (KRaft's
//!   shapes) and the image they build by deltas, with (offset, epoch).
//! - `control`: the controller's decisions as records (pure functions).
//! - `quorum`: the sans-IO Raft engine of the controller quorum (raft-rs);
//!   `raft_log` its state on disk; `service` the shell that drives it on
//!   a voter (threads, TCP), with machine leases; `observer` a machine that
//!   follows the committed log without voting; `wire` their frames.
//! - `gossip`: SWIM membership through foca, a fast hint for the controller.
//! - `bridge`: between the cluster image and the cores' `MetadataImage`, and
//!   the requests a machine sends the controller.
//! - `metadata` and `controller`: the cores' image types; `ids` the
//!   identities these modules share.

pub mod bridge;
pub mod control;
pub mod controller;
pub mod gossip;
pub mod ids;
pub mod image;
pub mod metadata;
pub mod observer;
pub mod quorum;
pub mod raft_log;
pub mod records;
pub mod service;
pub mod wire;

pub use ids::MachineId;
pub use metadata::{MetadataImage, NodeId, PartitionInfo, ShardId, TopicInfo};
