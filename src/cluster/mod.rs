//! Cluster metadata: the immutable image every core holds a copy of, and the
//! controller logic that produces the next image. On a single node the
//! controller runs on core 0; the image types already carry node ids and
//! shard placement so that several machines can share them. `records` and
//! `image` are the metadata log of the cluster (issue 29): typed records and
//! the image they build by deltas; `ids` holds the identities the cluster
//! modules share. They are not wired to the cores yet.

pub mod control;
pub mod controller;
pub mod ids;
pub mod image;
pub mod metadata;
pub mod records;

pub use ids::MachineId;
pub use metadata::{MetadataImage, NodeId, PartitionInfo, ShardId, TopicInfo};
