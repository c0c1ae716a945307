//! Every limit in one place, tied together by compile-time asserts.

/// Largest request frame accepted (`socket.request.max.bytes`).
pub const REQUEST_BYTES_MAX_DEFAULT: usize = 100 * 1024 * 1024;
/// Bytes of requests in flight per core (read, being served, or waiting to
/// be answered); at least one largest request must fit.
pub const IN_FLIGHT_BYTES_MAX_DEFAULT: usize = 256 * 1024 * 1024;
/// Client connections per node, and per client IP.
pub const CONNECTIONS_MAX_DEFAULT: usize = 50_000;
pub const CONNECTIONS_PER_IP_MAX_DEFAULT: usize = 10_000;
/// Requests read ahead on one connection while earlier ones are in flight.
pub const CONNECTION_IN_FLIGHT_MAX: usize = 64;
/// Cross-core inbox depth per core.
pub const INBOX_DEPTH: usize = 4096;
/// Partitions a single CreateTopics / CreatePartitions may ask for.
pub const TOPIC_PARTITIONS_MAX: i32 = 100_000;
/// Longest topic name Kafka accepts.
pub const TOPIC_NAME_BYTES_MAX: usize = 249;
/// Longest long-poll a Fetch may ask for.
pub const FETCH_WAIT_MS_MAX: i32 = 60_000;
/// A follower not caught up with its leader for this long leaves the ISR
/// (`replica.lag.time.max.ms`; Kafka's default is 30 s, which is how long
/// acks=all writes stall on a dead follower that is not yet fenced). Five
/// follower long polls, and above the controller's machine lease, so a
/// machine that dies is fenced (and leaves every ISR at once) before its
/// followers are dropped one partition at a time.
pub const REPLICA_LAG_TIME_MS_MAX_DEFAULT: u64 = 5 * REPLICA_FETCH_WAIT_MS as u64;
/// Kafka's internal topic of committed consumer-group offsets.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// `offsets.topic.num.partitions`: Kafka's is 50; 16 (Redpanda's) keeps
/// a small machine's open logs and follower traffic down, and spreads
/// groups over 16 coordinators, more than a cluster has cores for a while.
pub const OFFSETS_TOPIC_PARTITIONS_DEFAULT: i32 = 16;
/// `offsets.topic.replication.factor`, as Kafka's.
pub const OFFSETS_TOPIC_REPLICATION_FACTOR_DEFAULT: i16 = 3;
/// Segments of `__consumer_offsets`: small, so the snapshot compaction
/// (`shard::groups`) frees space soon.
pub const OFFSETS_TOPIC_SEGMENT_BYTES: u64 = 16 << 20;
/// How long a group's offset commit waits for the in-sync replicas.
pub const OFFSETS_COMMIT_TIMEOUT_MS: i32 = 5_000;
/// How long a follower's fetch waits at the leader for new data.
pub const REPLICA_FETCH_WAIT_MS: i32 = 500;
/// Bytes a follower asks for per partition and per fetch.
pub const REPLICA_FETCH_PARTITION_BYTES_MAX: i32 = 1 << 20;
/// Bytes a follower asks for per fetch.
pub const REPLICA_FETCH_BYTES_MAX: i32 = 16 << 20;
const _: () = assert!(REPLICA_FETCH_WAIT_MS < FETCH_WAIT_MS_MAX);
const _: () = assert!(REPLICA_FETCH_PARTITION_BYTES_MAX as usize >= BATCH_BYTES_MAX_LIMIT / 64);
/// How long a SIGTERM waits for the controller to move leadership away
/// (controlled shutdown) before the machine stops anyway.
pub const CONTROLLED_SHUTDOWN_WAIT_MS: u64 = 5_000;
/// Fetch sessions per core (Kafka's `max.incremental.fetch.session.cache.slots`
/// is 1,000 per broker).
pub const FETCH_SESSIONS_MAX: usize = 1_000;
/// Partitions cached over all fetch sessions of a core, ~120 bytes each.
pub const FETCH_SESSION_PARTITIONS_MAX: usize = 250_000;
/// Partition changes a core remembers for its fetch sessions (~24 bytes
/// each); a session that looks less often than this many changes reads all
/// of its partitions.
pub const FETCH_SESSION_CHANGES_MAX: usize = 65_536;
/// A fetch session unused this long may be evicted for a new one
/// (Kafka's `min.incremental.fetch.session.eviction.ms`).
pub const FETCH_SESSION_EVICTABLE_IDLE_MS: u64 = 120_000;
/// The largest `max.message.bytes` a topic may set. Recovery checks stored
/// batches against this, not against the topic's current setting: a topic
/// whose limit was lowered still holds the larger batches it took before.
pub const BATCH_BYTES_MAX_LIMIT: usize = 64 << 20;
/// Sequence ranges remembered per producer and partition (Kafka keeps 5).
pub const PRODUCER_BATCHES_REMEMBERED: usize = 5;
/// Producer ids handed out per persisted block.
pub const PRODUCER_ID_BLOCK: i64 = 1000;
/// glommio's registered I/O memory per executor. RLIMIT_MEMLOCK is often
/// 8 MiB for the whole process, so keep this small.
pub const IO_MEMORY_BYTES_DEFAULT: usize = 512 * 1024;
/// Cores a node may run.
pub const CORES_MAX: usize = 256;
/// Default port of the metrics and health endpoint (`--metrics-port`).
pub const METRICS_PORT_DEFAULT: u16 = 9644;
/// Largest HTTP request head the metrics endpoint reads.
pub const HTTP_REQUEST_BYTES_MAX: usize = 8 * 1024;
/// HTTP connections the metrics endpoint serves at once; more are closed.
pub const HTTP_CONNECTIONS_MAX: usize = 32;
/// A metrics client must send its whole request within this long.
pub const HTTP_READ_TIMEOUT_MS: u64 = 5_000;
/// How long a scrape waits for each core's snapshot (a core still recovering
/// or already stopped is left out).
pub const METRICS_CORE_WAIT_MS: u64 = 2_000;
/// How long a core retries a listening port in use before its start fails
/// (after a kill -9 the old process's socket outlives it for a moment).
pub const BIND_RETRY_MS: u64 = 10_000;
/// How long shutdown waits for each core to close its logs.
pub const SHUTDOWN_CORE_WAIT_MS: u64 = 30_000;

const _: () = assert!(CONNECTION_IN_FLIGHT_MAX >= 5, "idempotent producers pipeline 5 requests");
const _: () = assert!(PRODUCER_BATCHES_REMEMBERED == 5);
const _: () =
    assert!(FETCH_SESSION_PARTITIONS_MAX >= TOPIC_PARTITIONS_MAX as usize, "one session can hold a whole topic");
const _: () = assert!(IO_MEMORY_BYTES_DEFAULT * 8 <= 8 * 1024 * 1024, "8 cores fit in an 8 MiB memlock limit");
const _: () = assert!(REQUEST_BYTES_MAX_DEFAULT <= i32::MAX as usize);
const _: () = assert!(BATCH_BYTES_MAX_LIMIT <= REQUEST_BYTES_MAX_DEFAULT, "a largest batch fits in a request");
const _: () = assert!(IN_FLIGHT_BYTES_MAX_DEFAULT >= REQUEST_BYTES_MAX_DEFAULT);
const _: () = assert!(CONNECTIONS_PER_IP_MAX_DEFAULT <= CONNECTIONS_MAX_DEFAULT);
const _: () = assert!(METRICS_CORE_WAIT_MS < HTTP_READ_TIMEOUT_MS, "a scrape answers before clients give up");
const _: () = assert!(BIND_RETRY_MS < SHUTDOWN_CORE_WAIT_MS, "a core still binding when start fails stops in time");
