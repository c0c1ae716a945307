//! shardlog: a Kafka-compatible commit log, thread-per-core on io_uring.

pub mod group;
pub mod protocol;
