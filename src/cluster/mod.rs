//! Cluster metadata: the immutable image every core holds a copy of, and the
//! controller logic that produces the next image. On a single node the
//! controller runs on core 0; the image types already carry node ids and
//! shard placement so that several machines can share them.

pub mod controller;
pub mod metadata;

pub use metadata::{MetadataImage, NodeId, PartitionInfo, ShardId, TopicInfo};
