//! shardlog: a Kafka-compatible commit log, thread-per-core on io_uring.
//!
//! ```text
//!            core 0                    core 1                   core N-1
//!  ┌────────────────────────┐ ┌────────────────────────┐
//!  │ listener :9092         │ │ listener :9093         │   ... one port per core
//!  │ connections            │ │ connections            │
//!  │ shard: partitions it   │ │ shard: partitions it   │
//!  │   owns (log, segments) │ │   owns                 │
//!  │ metadata image (copy)  │ │ metadata image (copy)  │
//!  │ controller (core 0)    │ │                        │
//!  └───────────┬────────────┘ └───────────┬────────────┘
//!              └──── flume bounded inboxes (owned messages) ───┘
//! ```
//!
//! Each core runs one glommio executor that owns a shard of the partitions:
//! their logs (`log`), the connections it accepted (`server`), and a copy of
//! the cluster metadata (`cluster`). Clients learn from Metadata which core
//! (node) leads a partition and send its requests straight there. Anything a
//! core does not own travels as an owned message over a bounded flume channel
//! to the owning core's inbox (`shard`). Wire formats live in `protocol`,
//! decisions in `server::handlers`.

pub mod bench;
pub mod client;
pub mod cluster;
pub mod config;
pub mod constants;
pub mod group;
pub mod log;
pub mod metrics;
pub mod mirror;
pub mod net;
pub mod protocol;
pub mod replica;
pub mod security;
pub mod server;
pub mod shard;
