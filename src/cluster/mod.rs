//! Cluster metadata: the immutable image every core holds a copy of, and the
//! controller logic that produces the next image. On a single node the
//! controller runs on core 0; the image types already carry node ids and
//! shard placement so that several machines can share them. `quorum` is
//! the Raft engine of the controller quorum among machines (issue 29), not
//! wired to a shell yet; `ids` holds the identities the cluster modules share.

pub mod controller;
pub mod ids;
pub mod metadata;
pub mod quorum;

pub use ids::MachineId;
pub use metadata::{MetadataImage, NodeId, PartitionInfo, ShardId, TopicInfo};
