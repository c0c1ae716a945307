//! Operational metrics: counters each core keeps for itself, merged on scrape.
//!
//! Recording happens on every core, on the data path, without locks or
//! atomics: each core (one glommio executor thread) owns one [`CoreCounters`]
//! in a thread-local and adds to plain integers in it. Code that has no
//! `Shard` at hand (the log's fsync, a connection) records through the same
//! thread-local, so a counter increment is one call at the spot it counts.
//!
//! Scraping happens on core 0 (`server::http`): it asks every core over its
//! inbox (`ShardMessage::Metrics`) for a [`CoreSnapshot`], a copy of its
//! counters plus what its shard owns (partitions, log sizes, committed
//! offsets), and [`encode`] merges them into the Prometheus text format with
//! the `prometheus-client` crate. The same snapshots answer `/v1/status`
//! ([`status`]), which `shardlog cluster status` reads.
//!
//! A leaf: it knows no shard, server or cluster type. Shards report into it
//! (`shard::report` maps their answers to API and error code and builds
//! their snapshots).
//!
//! Label cardinality is bounded: series are per core, API, error code, topic,
//! and group and topic; per-partition series (log offsets and sizes, group lag
//! per partition) only with `--metrics-per-partition`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::group::GroupResponse;
use crate::protocol::record_batch;
use crate::protocol::{ApiKey, ErrorCode};

/// Upper bounds of every histogram's buckets, in microseconds: 10 µs to 60 s
/// (a Fetch long poll may last up to `FETCH_WAIT_MS_MAX`).
pub const BUCKET_BOUNDS_US: [u64; 21] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];
/// How often the task-queue probe wakes up to measure its own lateness.
pub const TASK_DELAY_PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// Slots for request counters, indexed by API key.
const API_SLOTS: usize = 72;

const _: () =
    assert!(BUCKET_BOUNDS_US[BUCKET_BOUNDS_US.len() - 1] >= crate::constants::FETCH_WAIT_MS_MAX as u64 * 1000);
// Every API shardlog serves has a slot.
const _: () = {
    let apis = crate::protocol::SUPPORTED_APIS;
    let mut at = 0;
    while at < apis.len() {
        assert!((apis[at].key as usize) < API_SLOTS);
        at += 1;
    }
};

/// A fixed-bucket latency histogram; buckets hold counts per bucket (not
/// cumulative), the last one everything above the largest bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    buckets: [u64; BUCKET_BOUNDS_US.len() + 1],
    sum_us: u64,
    count: u64,
}

impl Histogram {
    pub fn record(&mut self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = BUCKET_BOUNDS_US.partition_point(|bound| *bound < us);
        self.buckets[bucket] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.count += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *mine += theirs;
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
        self.count += other.count;
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// One API's requests on one core.
#[derive(Debug, Clone, Default)]
pub struct ApiCounters {
    /// Requests received (counted when they start).
    pub requests: u64,
    /// Requests being handled now (the produce and fetch queue depths).
    pub in_flight: u64,
    /// Time from a parsed request to its response, ready to be written.
    pub latency: Histogram,
}

/// Data through one topic on one core.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicCounters {
    /// Batch bytes appended (as the producer sent them).
    pub produced_bytes: u64,
    pub produced_records: u64,
    /// Batch bytes returned by Fetch.
    pub fetched_bytes: u64,
    pub fetched_records: u64,
}

/// Everything one core counts. Lives in a thread-local on that core.
#[derive(Debug, Clone)]
pub struct CoreCounters {
    pub apis: Vec<ApiCounters>,
    /// Answers with an error, by (API key, error code).
    pub errors: BTreeMap<(i16, i16), u64>,
    /// Every topic together; unlike `topics` never pruned, so it never goes
    /// down when a topic is deleted.
    pub total: TopicCounters,
    /// Topics that exist (deleted ones are dropped at the next snapshot).
    pub topics: BTreeMap<String, TopicCounters>,
    pub connections_open: u64,
    pub connections_accepted: u64,
    /// Connections closed at once by a limit, by reason.
    pub connections_refused: BTreeMap<&'static str, u64>,
    pub fsync: Histogram,
    pub task_delay: Histogram,
    /// Group generations completed by this core's coordinator.
    pub rebalances: u64,
    pub fetches: FetchKinds,
    /// ISR changes this core's leaders had committed.
    pub isr_changes: u64,
    /// Bytes this core's followers copied from their leaders.
    pub follower_fetched_bytes: u64,
    /// SASL logins that succeeded.
    pub sasl_authenticated: u64,
    /// SASL handshakes and logins refused, by reason (`handshake`: a
    /// mechanism not enabled or out of turn; `failed`: bad credentials or
    /// messages; `throttled`: the address failed too often; `timeout`: no
    /// login in time).
    pub sasl_refused: BTreeMap<&'static str, u64>,
}

/// Fetch requests by how they used fetch sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchKinds {
    pub sessionless: u64,
    /// Full requests that open a session.
    pub full: u64,
    pub incremental: u64,
}

/// A core's fetch sessions, and the partitions they cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchSessionsSnapshot {
    pub sessions: usize,
    pub partitions: usize,
}

impl Default for CoreCounters {
    fn default() -> Self {
        Self {
            apis: vec![ApiCounters::default(); API_SLOTS],
            errors: BTreeMap::new(),
            total: TopicCounters::default(),
            topics: BTreeMap::new(),
            connections_open: 0,
            connections_accepted: 0,
            connections_refused: BTreeMap::new(),
            fsync: Histogram::default(),
            task_delay: Histogram::default(),
            rebalances: 0,
            fetches: FetchKinds::default(),
            isr_changes: 0,
            follower_fetched_bytes: 0,
            sasl_authenticated: 0,
            sasl_refused: BTreeMap::new(),
        }
    }
}

thread_local! {
    static CORE: RefCell<CoreCounters> = RefCell::new(CoreCounters::default());
}

fn with(update: impl FnOnce(&mut CoreCounters)) {
    CORE.with(|counters| update(&mut counters.borrow_mut()));
}

/// This core's counters as they are now.
pub fn counters() -> CoreCounters {
    CORE.with(|counters| counters.borrow().clone())
}

// ---- Recording ----------------------------------------------------------

/// Counts one request from start to finish. Dropping it without
/// [`RequestTimer::finish`] (a cancelled request) only ends its in-flight count.
pub struct RequestTimer {
    slot: usize,
    started: Instant,
}

impl RequestTimer {
    pub fn start(api: ApiKey) -> Self {
        let slot = api as usize;
        with(|c| {
            c.apis[slot].requests += 1;
            c.apis[slot].in_flight += 1;
        });
        Self { slot, started: Instant::now() }
    }

    /// Records the latency; a request that did not parse counts as an
    /// INVALID_REQUEST error (the connection is closed).
    pub fn finish(self, parsed: bool) {
        let elapsed = self.started.elapsed();
        let slot = self.slot;
        with(|c| {
            c.apis[slot].latency.record(elapsed);
            if !parsed {
                *c.errors.entry((slot as i16, ErrorCode::InvalidRequest.code())).or_default() += 1;
            }
        });
    }
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        let slot = self.slot;
        with(|c| c.apis[slot].in_flight = c.apis[slot].in_flight.saturating_sub(1));
    }
}

/// Held while a client connection is open.
pub struct ConnectionGauge(());

impl ConnectionGauge {
    pub fn open() -> Self {
        with(|c| {
            c.connections_open += 1;
            c.connections_accepted += 1;
        });
        Self(())
    }
}

impl Drop for ConnectionGauge {
    fn drop(&mut self) {
        with(|c| c.connections_open = c.connections_open.saturating_sub(1));
    }
}

/// A connection authenticated (SASL).
pub fn sasl_authenticated() {
    with(|c| c.sasl_authenticated += 1);
}

/// A SASL handshake or login refused (the connection closes), and why.
pub fn sasl_refused(reason: &'static str) {
    with(|c| *c.sasl_refused.entry(reason).or_default() += 1);
}

pub fn record_connection_refused(reason: &'static str) {
    with(|c| *c.connections_refused.entry(reason).or_default() += 1);
}

/// One batch appended to `topic`.
pub fn record_produced(topic: &str, batch_bytes: usize, records: i32) {
    let records = u64::try_from(records).unwrap_or(0);
    with(|c| {
        for counters in [&mut c.total, topic_counters(&mut c.topics, topic)] {
            counters.produced_bytes += batch_bytes as u64;
            counters.produced_records += records;
        }
    });
}

/// Batches a Fetch returns from `topic` (whole batches, as sent).
pub fn record_fetched(topic: &str, batches: &[Bytes]) {
    if batches.is_empty() {
        return;
    }
    let bytes: usize = batches.iter().map(Bytes::len).sum();
    let records: u64 = batches
        .iter()
        .filter(|batch| batch.len() >= record_batch::HEADER_BYTES)
        .map(|batch| u64::try_from(record_batch::read_i32(batch, record_batch::RECORD_COUNT_AT)).unwrap_or(0))
        .sum();
    with(|c| {
        for counters in [&mut c.total, topic_counters(&mut c.topics, topic)] {
            counters.fetched_bytes += bytes as u64;
            counters.fetched_records += records;
        }
    });
}

fn topic_counters<'c>(topics: &'c mut BTreeMap<String, TopicCounters>, topic: &str) -> &'c mut TopicCounters {
    if !topics.contains_key(topic) {
        topics.insert(topic.to_owned(), TopicCounters::default());
    }
    topics.get_mut(topic).expect("inserted above")
}

pub fn record_fsync(elapsed: Duration) {
    with(|c| c.fsync.record(elapsed));
}

/// How a fetch used fetch sessions (KIP-227).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchKind {
    Sessionless,
    Full,
    Incremental,
}

pub fn record_fetch(kind: FetchKind) {
    with(|c| match kind {
        FetchKind::Sessionless => c.fetches.sessionless += 1,
        FetchKind::Full => c.fetches.full += 1,
        FetchKind::Incremental => c.fetches.incremental += 1,
    });
}

pub fn record_isr_change() {
    with(|c| c.isr_changes += 1);
}

pub fn record_follower_fetched(bytes: usize) {
    with(|c| c.follower_fetched_bytes += bytes as u64);
}

pub fn record_rebalance() {
    with(|c| c.rebalances += 1);
}

pub fn record_error(api: ApiKey, error: ErrorCode) {
    if error != ErrorCode::None {
        with(|c| *c.errors.entry((api as i16, error.code())).or_default() += 1);
    }
}

/// The errors of a group coordinator's answer (per partition for commits).
pub fn record_group_response(response: &GroupResponse) {
    match response {
        GroupResponse::Join(answer) => record_error(ApiKey::JoinGroup, answer.error),
        GroupResponse::Sync(answer) => record_error(ApiKey::SyncGroup, answer.error),
        GroupResponse::Heartbeat(answer) => record_error(ApiKey::Heartbeat, answer.error),
        GroupResponse::Leave(answer) => record_error(ApiKey::LeaveGroup, answer.error),
        GroupResponse::OffsetCommit(answer) => {
            for partition in answer.topics.iter().flat_map(|t| &t.partitions) {
                record_error(ApiKey::OffsetCommit, partition.error);
            }
        }
        GroupResponse::DeleteGroups(answer) => {
            for group in &answer.results {
                record_error(ApiKey::DeleteGroups, group.error);
            }
        }
    }
}

/// Measures how late this core's executor runs a timer task: a core whose
/// tasks hog it wakes the probe late. Runs until `stopping` says so.
pub async fn run_task_delay_probe(stopping: impl Fn() -> bool) {
    while !stopping() {
        let started = Instant::now();
        glommio::timer::sleep(TASK_DELAY_PROBE_INTERVAL).await;
        let late = started.elapsed().saturating_sub(TASK_DELAY_PROBE_INTERVAL);
        with(|c| c.task_delay.record(late));
    }
}

/// Stops reporting the topics `keep` does not name (deleted topics: a
/// recreated one starts from 0).
pub fn keep_topics(keep: impl Fn(&str) -> bool) {
    with(|c| c.topics.retain(|name, _| keep(name)));
}

// ---- Snapshots ----------------------------------------------------------

/// What one core reports to a scrape.
#[derive(Debug, Clone)]
pub struct CoreSnapshot {
    pub core: u32,
    pub node_id: i32,
    pub counters: CoreCounters,
    /// Partitions the metadata places on this core.
    pub partitions_assigned: usize,
    /// Partitions this core has open and leads.
    pub partitions: Vec<PartitionSnapshot>,
    pub in_flight_request_bytes: u64,
    pub inbox_depth: usize,
    pub groups: GroupsSnapshot,
    pub fetch_sessions: FetchSessionsSnapshot,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSnapshot {
    pub topic: String,
    pub partition: i32,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub high_watermark: i64,
    pub size_bytes: u64,
    pub segments: usize,
    /// The log stopped taking appends after a write or sync error.
    pub failed: bool,
    /// This core leads the partition (otherwise it follows).
    pub leader: bool,
    /// Led here with fewer in-sync replicas than replicas.
    pub under_replicated: bool,
    /// Led here with fewer in-sync replicas than `min.insync.replicas`.
    pub under_min_isr: bool,
    /// Led here: records the furthest follower is behind the leader's end.
    pub follower_lag_records: i64,
}

/// The consumer groups a core coordinates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupsSnapshot {
    pub groups: usize,
    pub offsets_log_bytes: u64,
    pub committed: Vec<CommittedSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedSnapshot {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

// ---- Exposition ---------------------------------------------------------

/// What a scrape knows besides the cores' snapshots.
#[derive(Debug, Clone)]
pub struct ScrapeContext {
    pub cores: usize,
    pub ready: bool,
    pub per_partition: bool,
    pub disk: Option<DiskSpace>,
}

/// Space on the data directory's filesystem (statvfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSpace {
    /// Bytes an unprivileged process may still write (`f_bavail`).
    pub free_bytes: u64,
    pub total_bytes: u64,
}

impl DiskSpace {
    pub fn of(path: &std::path::Path) -> std::io::Result<DiskSpace> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: statvfs only writes the struct we hand it; the path is a
        // NUL-terminated string that outlives the call.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let block = stat.f_frsize as u64;
        Ok(DiskSpace { free_bytes: stat.f_bavail as u64 * block, total_bytes: stat.f_blocks as u64 * block })
    }
}

/// The Prometheus text exposition (format 0.0.4) of the merged snapshots.
pub fn encode(snapshots: Vec<CoreSnapshot>, context: ScrapeContext) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Exposition { snapshots, context }));
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
    text
}

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

pub(crate) type Labels = Vec<(&'static str, String)>;

#[derive(Debug)]
struct Exposition {
    snapshots: Vec<CoreSnapshot>,
    context: ScrapeContext,
}

impl Collector for Exposition {
    fn encode(&self, mut out: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_broker(&mut out)?;
        self.encode_requests(&mut out)?;
        self.encode_cores(&mut out)?;
        self.encode_topics(&mut out)?;
        self.encode_groups(&mut out)?;
        if self.context.per_partition {
            self.encode_partitions(&mut out)?;
        }
        Ok(())
    }
}

impl Exposition {
    fn per_core<V>(&self, value: impl Fn(&CoreSnapshot) -> V) -> Vec<(Labels, V)> {
        self.snapshots.iter().map(|s| (vec![("core", s.core.to_string())], value(s))).collect()
    }

    fn encode_broker(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        let context = &self.context;
        gauge(
            out,
            "shardlog_build_info",
            "Version of the running broker.",
            [(vec![("version", env!("CARGO_PKG_VERSION").to_string())], 1)],
        )?;
        gauge(
            out,
            "shardlog_cores",
            "Cores (executors, Kafka nodes) the broker runs.",
            [(vec![], context.cores as i64)],
        )?;
        gauge(
            out,
            "shardlog_metrics_cores_answered",
            "Cores whose snapshot this scrape includes.",
            [(vec![], self.snapshots.len() as i64)],
        )?;
        gauge(
            out,
            "shardlog_ready",
            "1 once every core has recovered its partitions and listens; 0 while starting or stopping.",
            [(vec![], i64::from(context.ready))],
        )?;
        if let Some(disk) = context.disk {
            gauge(
                out,
                "shardlog_disk_free_bytes",
                "Free bytes on the data directory's filesystem (statvfs f_bavail).",
                [(vec![], disk.free_bytes as i64)],
            )?;
            gauge(
                out,
                "shardlog_disk_total_bytes",
                "Size of the data directory's filesystem.",
                [(vec![], disk.total_bytes as i64)],
            )?;
        }
        Ok(())
    }

    fn encode_requests(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut requests = Vec::new();
        let mut in_flight = Vec::new();
        let mut latency: BTreeMap<&'static str, Histogram> = BTreeMap::new();
        let mut errors: BTreeMap<(&'static str, String), u64> = BTreeMap::new();
        for snapshot in &self.snapshots {
            for (slot, api) in snapshot.counters.apis.iter().enumerate() {
                let Some(name) = api_name(slot) else { continue };
                if api.requests == 0 {
                    continue;
                }
                let labels = vec![("core", snapshot.core.to_string()), ("api", name.to_string())];
                requests.push((labels.clone(), api.requests));
                in_flight.push((labels, api.in_flight as i64));
                latency.entry(name).or_default().merge(&api.latency);
            }
            for ((api, code), count) in &snapshot.counters.errors {
                let Some(name) = api_name(*api as usize) else { continue };
                let error = format!("{:?}", crate::protocol::error::from_code(*code));
                *errors.entry((name, error)).or_default() += count;
            }
        }
        counter(out, "shardlog_requests", "Kafka requests received, by core and API.", requests)?;
        gauge(
            out,
            "shardlog_requests_in_flight",
            "Requests being handled now, by core and API (the produce and fetch queue depths).",
            in_flight,
        )?;
        counter(
            out,
            "shardlog_request_errors",
            "Answers carrying an error code, by API and Kafka error (per partition for Produce, Fetch, \
             ListOffsets, DeleteRecords, OffsetCommit; per topic for topic admin; INVALID_REQUEST for \
             requests that did not parse).",
            errors.into_iter().map(|((api, error), count)| (vec![("api", api.to_string()), ("error", error)], count)),
        )?;
        histogram(
            out,
            "shardlog_request_duration_seconds",
            "Time from a parsed request to its response being ready, by API (Fetch includes its long poll).",
            latency.iter().map(|(api, h)| (vec![("api", api.to_string())], h)),
        )
    }

    fn encode_cores(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        let core_labels = |s: &CoreSnapshot| vec![("core", s.core.to_string())];
        let per_core_total = |pick: fn(&TopicCounters) -> u64| -> Vec<(Labels, u64)> {
            self.snapshots.iter().map(|s| (core_labels(s), pick(&s.counters.total))).collect()
        };
        counter(
            out,
            "shardlog_produced_bytes",
            "Record batch bytes appended, by core.",
            per_core_total(|t| t.produced_bytes),
        )?;
        counter(
            out,
            "shardlog_produced_records",
            "Records appended, by core.",
            per_core_total(|t| t.produced_records),
        )?;
        counter(
            out,
            "shardlog_fetched_bytes",
            "Record batch bytes returned by Fetch, by core.",
            per_core_total(|t| t.fetched_bytes),
        )?;
        counter(
            out,
            "shardlog_fetched_records",
            "Records in the batches returned by Fetch, by core.",
            per_core_total(|t| t.fetched_records),
        )?;
        gauge(
            out,
            "shardlog_connections",
            "Open client connections, by core.",
            self.per_core(|s| s.counters.connections_open as i64),
        )?;
        counter(
            out,
            "shardlog_connections_accepted",
            "Client connections accepted, by core.",
            self.per_core(|s| s.counters.connections_accepted),
        )?;
        let refused = self.snapshots.iter().flat_map(|s| {
            s.counters
                .connections_refused
                .iter()
                .map(|(reason, count)| (vec![("core", s.core.to_string()), ("reason", reason.to_string())], *count))
        });
        counter(out, "shardlog_connections_refused", "Connections closed at once by a connection limit.", refused)?;
        let sasl = self.snapshots.iter().flat_map(|s| {
            let core = s.core.to_string();
            let refused = s.counters.sasl_refused.iter().map(|(reason, count)| (*reason, *count));
            std::iter::once(("ok", s.counters.sasl_authenticated))
                .chain(refused)
                .map(move |(result, count)| (vec![("core", core.clone()), ("result", result.to_string())], count))
        });
        counter(out, "shardlog_sasl_authentications", "SASL authentications, by core and result.", sasl)?;
        gauge(
            out,
            "shardlog_fetch_sessions",
            "Open fetch sessions (KIP-227), by core.",
            self.per_core(|s| s.fetch_sessions.sessions as i64),
        )?;
        gauge(
            out,
            "shardlog_fetch_session_partitions",
            "Partitions cached by the fetch sessions, by core.",
            self.per_core(|s| s.fetch_sessions.partitions as i64),
        )?;
        let contexts = self.snapshots.iter().flat_map(|s| {
            let kinds = s.counters.fetches;
            [("sessionless", kinds.sessionless), ("full", kinds.full), ("incremental", kinds.incremental)]
                .map(|(kind, count)| (vec![("core", s.core.to_string()), ("kind", kind.to_string())], count))
        });
        counter(
            out,
            "shardlog_fetch_requests_by_session",
            "Fetch requests by their use of fetch sessions: sessionless, full (opening one), incremental.",
            contexts,
        )?;
        gauge(
            out,
            "shardlog_partitions",
            "Partitions the metadata places on each core.",
            self.per_core(|s| s.partitions_assigned as i64),
        )?;
        gauge(
            out,
            "shardlog_partition_leaders",
            "Partitions each core has open and leads.",
            self.per_core(|s| s.partitions.iter().filter(|p| p.leader).count() as i64),
        )?;
        gauge(
            out,
            "shardlog_under_replicated_partitions",
            "Partitions each core leads with fewer in-sync replicas than replicas.",
            self.per_core(|s| s.partitions.iter().filter(|p| p.under_replicated).count() as i64),
        )?;
        gauge(
            out,
            "shardlog_under_min_isr_partitions",
            "Partitions each core leads with fewer in-sync replicas than min.insync.replicas (acks=all refused).",
            self.per_core(|s| s.partitions.iter().filter(|p| p.under_min_isr).count() as i64),
        )?;
        gauge(
            out,
            "shardlog_follower_lag_records_max",
            "Records the furthest follower of a partition each core leads is behind.",
            self.per_core(|s| s.partitions.iter().map(|p| p.follower_lag_records).max().unwrap_or(0)),
        )?;
        gauge(
            out,
            "shardlog_log_size_bytes",
            "Bytes of partition log segments on disk, by core.",
            self.per_core(|s| s.partitions.iter().map(|p| p.size_bytes).sum::<u64>() as i64),
        )?;
        gauge(
            out,
            "shardlog_log_segments",
            "Partition log segments, by core.",
            self.per_core(|s| s.partitions.iter().map(|p| p.segments).sum::<usize>() as i64),
        )?;
        gauge(
            out,
            "shardlog_offsets_log_size_bytes",
            "Bytes of the __consumer_offsets replicas (committed group offsets) on disk, by core.",
            self.per_core(|s| s.groups.offsets_log_bytes as i64),
        )?;
        gauge(
            out,
            "shardlog_in_flight_request_bytes",
            "Bytes of requests read and not yet answered, by core (bounded by --in-flight-bytes-max).",
            self.per_core(|s| s.in_flight_request_bytes as i64),
        )?;
        gauge(
            out,
            "shardlog_failed_logs",
            "Partition logs that stopped taking appends after a disk write or sync error, by core.",
            self.per_core(|s| s.partitions.iter().filter(|p| p.failed).count() as i64),
        )?;
        gauge(
            out,
            "shardlog_inbox_depth",
            "Messages waiting in each core's cross-core inbox.",
            self.per_core(|s| s.inbox_depth as i64),
        )?;
        histogram(
            out,
            "shardlog_fsync_duration_seconds",
            "fdatasync latency of partition and offsets logs, by core.",
            self.snapshots.iter().map(|s| (core_labels(s), &s.counters.fsync)),
        )?;
        histogram(
            out,
            "shardlog_task_queue_delay_seconds",
            "How late each core's executor runs a timer task (scheduling delay), by core.",
            self.snapshots.iter().map(|s| (core_labels(s), &s.counters.task_delay)),
        )
    }

    fn encode_topics(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        let mut topics: BTreeMap<&str, TopicCounters> = BTreeMap::new();
        for snapshot in &self.snapshots {
            for (name, counters) in &snapshot.counters.topics {
                let total = topics.entry(name).or_default();
                *total = sum_topics([&*total, counters]);
            }
        }
        let mut sizes: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for partition in self.snapshots.iter().flat_map(|s| &s.partitions) {
            let entry = sizes.entry(&partition.topic).or_default();
            entry.0 += partition.size_bytes as i64;
            entry.1 += 1;
        }
        let per_topic = |pick: fn(&TopicCounters) -> u64| -> Vec<(Labels, u64)> {
            topics.iter().map(|(name, t)| (vec![("topic", name.to_string())], pick(t))).collect()
        };
        counter(
            out,
            "shardlog_topic_produced_bytes",
            "Record batch bytes appended, by topic.",
            per_topic(|t| t.produced_bytes),
        )?;
        counter(
            out,
            "shardlog_topic_produced_records",
            "Records appended, by topic.",
            per_topic(|t| t.produced_records),
        )?;
        counter(
            out,
            "shardlog_topic_fetched_bytes",
            "Record batch bytes returned by Fetch, by topic.",
            per_topic(|t| t.fetched_bytes),
        )?;
        counter(
            out,
            "shardlog_topic_fetched_records",
            "Records in the batches returned by Fetch, by topic.",
            per_topic(|t| t.fetched_records),
        )?;
        gauge(
            out,
            "shardlog_topic_size_bytes",
            "Bytes of log segments on disk, by topic.",
            sizes.iter().map(|(name, (bytes, _))| (vec![("topic", name.to_string())], *bytes)),
        )?;
        gauge(
            out,
            "shardlog_topic_partitions",
            "Partitions open on this broker, by topic.",
            sizes.iter().map(|(name, (_, count))| (vec![("topic", name.to_string())], *count)),
        )
    }

    fn encode_groups(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        gauge(
            out,
            "shardlog_groups",
            "Consumer groups coordinated by each core.",
            self.per_core(|s| s.groups.groups as i64),
        )?;
        counter(
            out,
            "shardlog_group_rebalances",
            "Group generations completed (rebalances) by each core's coordinator.",
            self.per_core(|s| s.counters.rebalances),
        )?;
        counter(
            out,
            "shardlog_isr_changes",
            "ISR shrinks and expands committed for the partitions each core leads.",
            self.per_core(|s| s.counters.isr_changes),
        )?;
        counter(
            out,
            "shardlog_follower_fetched_bytes",
            "Bytes each core's followers copied from their leaders.",
            self.per_core(|s| s.counters.follower_fetched_bytes),
        )?;
        let lags = self.group_lags();
        let mut per_topic: BTreeMap<(&str, &str), i64> = BTreeMap::new();
        for (committed, lag) in &lags {
            *per_topic.entry((&committed.group, &committed.topic)).or_default() += lag;
        }
        gauge(
            out,
            "shardlog_group_lag_records",
            "Records between a group's committed offsets and the high watermarks, summed by group and topic.",
            per_topic
                .iter()
                .map(|((group, topic), lag)| (vec![("group", group.to_string()), ("topic", topic.to_string())], *lag)),
        )?;
        if !self.context.per_partition {
            return Ok(());
        }
        let partition_labels = |c: &CommittedSnapshot| {
            vec![("group", c.group.clone()), ("topic", c.topic.clone()), ("partition", c.partition.to_string())]
        };
        gauge(
            out,
            "shardlog_group_partition_lag_records",
            "Records between a group's committed offset and the high watermark, by partition.",
            lags.iter().map(|(c, lag)| (partition_labels(c), *lag)),
        )?;
        gauge(
            out,
            "shardlog_group_committed_offset",
            "A group's committed offset, by partition.",
            lags.iter().map(|(c, _)| (partition_labels(c), c.offset)),
        )
    }

    /// Lag of every committed offset whose partition is open on this broker.
    fn group_lags(&self) -> Vec<(&CommittedSnapshot, i64)> {
        let watermarks: BTreeMap<(&str, i32), i64> = self
            .snapshots
            .iter()
            .flat_map(|s| &s.partitions)
            .map(|p| ((p.topic.as_str(), p.partition), p.high_watermark))
            .collect();
        self.snapshots
            .iter()
            .flat_map(|s| &s.groups.committed)
            .filter_map(|c| {
                let high_watermark = watermarks.get(&(c.topic.as_str(), c.partition))?;
                Some((c, (high_watermark - c.offset).max(0)))
            })
            .collect()
    }

    fn encode_partitions(&self, out: &mut DescriptorEncoder) -> std::fmt::Result {
        let partitions: Vec<&PartitionSnapshot> = self.snapshots.iter().flat_map(|s| &s.partitions).collect();
        let labels = |p: &PartitionSnapshot| vec![("topic", p.topic.clone()), ("partition", p.partition.to_string())];
        let per_partition =
            |pick: fn(&PartitionSnapshot) -> i64| partitions.iter().map(|p| (labels(p), pick(p))).collect::<Vec<_>>();
        gauge(
            out,
            "shardlog_partition_log_start_offset",
            "First offset still in the log.",
            per_partition(|p| p.log_start_offset),
        )?;
        gauge(
            out,
            "shardlog_partition_log_end_offset",
            "Offset the next appended record gets.",
            per_partition(|p| p.log_end_offset),
        )?;
        gauge(
            out,
            "shardlog_partition_high_watermark",
            "Offset up to which consumers may read.",
            per_partition(|p| p.high_watermark),
        )?;
        gauge(
            out,
            "shardlog_partition_size_bytes",
            "Bytes of the partition's log segments.",
            per_partition(|p| p.size_bytes as i64),
        )
    }
}

fn sum_topics<'t>(counters: impl IntoIterator<Item = &'t TopicCounters>) -> TopicCounters {
    counters.into_iter().fold(TopicCounters::default(), |sum, t| TopicCounters {
        produced_bytes: sum.produced_bytes + t.produced_bytes,
        produced_records: sum.produced_records + t.produced_records,
        fetched_bytes: sum.fetched_bytes + t.fetched_bytes,
        fetched_records: sum.fetched_records + t.fetched_records,
    })
}

/// The Kafka name of the API in counter slot `slot`.
fn api_name(slot: usize) -> Option<&'static str> {
    let key = ApiKey::from_i16(i16::try_from(slot).ok()?)?;
    Some(match key {
        ApiKey::Produce => "Produce",
        ApiKey::Fetch => "Fetch",
        ApiKey::ListOffsets => "ListOffsets",
        ApiKey::Metadata => "Metadata",
        ApiKey::OffsetCommit => "OffsetCommit",
        ApiKey::OffsetFetch => "OffsetFetch",
        ApiKey::FindCoordinator => "FindCoordinator",
        ApiKey::JoinGroup => "JoinGroup",
        ApiKey::Heartbeat => "Heartbeat",
        ApiKey::LeaveGroup => "LeaveGroup",
        ApiKey::SyncGroup => "SyncGroup",
        ApiKey::DescribeGroups => "DescribeGroups",
        ApiKey::ListGroups => "ListGroups",
        ApiKey::ApiVersions => "ApiVersions",
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::DeleteTopics => "DeleteTopics",
        ApiKey::DeleteRecords => "DeleteRecords",
        ApiKey::InitProducerId => "InitProducerId",
        ApiKey::OffsetForLeaderEpoch => "OffsetForLeaderEpoch",
        ApiKey::DescribeConfigs => "DescribeConfigs",
        ApiKey::AlterConfigs => "AlterConfigs",
        ApiKey::CreatePartitions => "CreatePartitions",
        ApiKey::DeleteGroups => "DeleteGroups",
        ApiKey::ElectLeaders => "ElectLeaders",
        ApiKey::IncrementalAlterConfigs => "IncrementalAlterConfigs",
        ApiKey::AlterPartitionReassignments => "AlterPartitionReassignments",
        ApiKey::ListPartitionReassignments => "ListPartitionReassignments",
        ApiKey::AlterReplicaLogDirs => "AlterReplicaLogDirs",
        ApiKey::DescribeLogDirs => "DescribeLogDirs",
        ApiKey::DescribeCluster => "DescribeCluster",
        ApiKey::DescribeQuorum => "DescribeQuorum",
        ApiKey::UnregisterBroker => "UnregisterBroker",
        ApiKey::SaslHandshake => "SaslHandshake",
        ApiKey::SaslAuthenticate => "SaslAuthenticate",
        ApiKey::DescribeUserScramCredentials => "DescribeUserScramCredentials",
        ApiKey::AlterUserScramCredentials => "AlterUserScramCredentials",
    })
}

pub(crate) fn counter(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    let mut metric = out.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in rows {
        metric.encode_family(&labels)?.encode_counter::<NoLabelSet, u64, u64>(&value, None)?;
    }
    Ok(())
}

pub(crate) fn gauge(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, i64)>,
) -> std::fmt::Result {
    let mut metric = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        metric.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

pub(crate) fn histogram<'h>(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, &'h Histogram)>,
) -> std::fmt::Result {
    let mut metric = out.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, histogram) in rows {
        let buckets: Vec<(f64, u64)> = BUCKET_BOUNDS_US
            .iter()
            .zip(&histogram.buckets)
            .map(|(bound_us, count)| (*bound_us as f64 / 1e6, *count))
            .collect();
        let sum_seconds = histogram.sum_us as f64 / 1e6;
        metric.encode_family(&labels)?.encode_histogram::<NoLabelSet>(sum_seconds, histogram.count, &buckets, None)?;
    }
    Ok(())
}

// ---- Status -------------------------------------------------------------

/// `/v1/status`: what `shardlog cluster status` shows besides Metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub ready: bool,
    pub cores: usize,
    pub data_dir: String,
    pub disk_free_bytes: Option<u64>,
    pub disk_total_bytes: Option<u64>,
    /// One entry per core that answered, in core order.
    pub nodes: Vec<CoreStatus>,
    /// Every machine of the cluster as this machine's metadata has it.
    #[serde(default)]
    pub machines: Vec<MachineStatus>,
}

/// A machine of the cluster: its id, rack, whether the controller fenced
/// it, and its nodes in core order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineStatus {
    pub machine: u64,
    pub rack: Option<String>,
    pub fenced: bool,
    pub nodes: Vec<i32>,
    /// The machine that answered.
    pub this: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreStatus {
    pub core: u32,
    pub node_id: i32,
    pub partitions: usize,
    pub leaders: usize,
    pub log_size_bytes: u64,
    pub connections: u64,
    pub groups: usize,
}

pub fn status(snapshots: &[CoreSnapshot], context: &ScrapeContext, data_dir: &std::path::Path) -> Status {
    Status {
        ready: context.ready,
        cores: context.cores,
        data_dir: data_dir.display().to_string(),
        disk_free_bytes: context.disk.map(|d| d.free_bytes),
        disk_total_bytes: context.disk.map(|d| d.total_bytes),
        nodes: snapshots
            .iter()
            .map(|s| CoreStatus {
                core: s.core,
                node_id: s.node_id,
                partitions: s.partitions_assigned,
                leaders: s.partitions.iter().filter(|p| p.leader).count(),
                log_size_bytes: s.partitions.iter().map(|p| p.size_bytes).sum::<u64>(),
                connections: s.counters.connections_open,
                groups: s.groups.groups,
            })
            .collect(),
        machines: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(core: u32) -> CoreSnapshot {
        CoreSnapshot {
            core,
            node_id: core as i32,
            counters: CoreCounters::default(),
            partitions_assigned: 0,
            partitions: Vec::new(),
            in_flight_request_bytes: 0,
            inbox_depth: 0,
            groups: GroupsSnapshot::default(),
            fetch_sessions: FetchSessionsSnapshot::default(),
        }
    }

    fn context(per_partition: bool) -> ScrapeContext {
        ScrapeContext { cores: 2, ready: true, per_partition, disk: None }
    }

    #[test]
    fn histogram_puts_values_in_the_first_bucket_that_holds_them() {
        let mut histogram = Histogram::default();
        histogram.record(Duration::from_micros(10));
        histogram.record(Duration::from_micros(11));
        histogram.record(Duration::from_secs(3600));
        assert_eq!(histogram.buckets[0], 1);
        assert_eq!(histogram.buckets[1], 1);
        assert_eq!(histogram.buckets[BUCKET_BOUNDS_US.len()], 1, "above every bound");
        assert_eq!(histogram.count(), 3);
    }

    #[test]
    fn request_timer_counts_requests_in_flight_and_latency_on_this_thread() {
        std::thread::spawn(|| {
            let timer = RequestTimer::start(ApiKey::Produce);
            assert_eq!(counters().apis[0].in_flight, 1);
            timer.finish(false);
            let c = counters();
            assert_eq!((c.apis[0].requests, c.apis[0].in_flight, c.apis[0].latency.count()), (1, 0, 1));
            assert_eq!(c.errors.get(&(0, ErrorCode::InvalidRequest.code())), Some(&1));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn scrape_merges_cores_into_per_core_and_per_topic_series() {
        let mut cores = vec![snapshot(0), snapshot(1)];
        for (core, bytes) in cores.iter_mut().zip([100u64, 50]) {
            core.counters.apis[ApiKey::Produce as usize].requests = 2;
            let counters = TopicCounters { produced_bytes: bytes, produced_records: 3, ..Default::default() };
            core.counters.topics.insert("t".into(), counters.clone());
            core.counters.total = counters;
            core.counters.apis[ApiKey::Produce as usize].latency.record(Duration::from_millis(1));
        }
        let text = encode(cores, context(false));
        assert!(text.contains("shardlog_requests_total{core=\"0\",api=\"Produce\"} 2\n"), "{text}");
        assert!(text.contains("shardlog_topic_produced_bytes_total{topic=\"t\"} 150\n"), "{text}");
        assert!(text.contains("shardlog_topic_produced_records_total{topic=\"t\"} 6\n"), "{text}");
        assert!(text.contains("shardlog_produced_bytes_total{core=\"1\"} 50\n"), "{text}");
        assert!(text.contains("shardlog_request_duration_seconds_count{api=\"Produce\"} 2\n"), "{text}");
        assert!(
            text.contains("shardlog_request_duration_seconds_bucket{le=\"0.001\",api=\"Produce\"} 2\n")
                || text.contains("shardlog_request_duration_seconds_bucket{api=\"Produce\",le=\"0.001\"} 2\n")
        );
        assert!(!text.contains("shardlog_partition_log_end_offset"), "per-partition series are off");
    }

    #[test]
    fn group_lag_is_the_distance_from_the_committed_offset_to_the_high_watermark() {
        let mut owner = snapshot(0);
        owner.partitions = (0..2)
            .map(|partition| PartitionSnapshot {
                topic: "t".into(),
                partition,
                log_start_offset: 0,
                log_end_offset: 10,
                high_watermark: 10,
                size_bytes: 1,
                segments: 1,
                failed: false,
                leader: true,
                under_replicated: false,
                under_min_isr: false,
                follower_lag_records: 0,
            })
            .collect();
        let mut coordinator = snapshot(1);
        coordinator.groups.committed = vec![
            CommittedSnapshot { group: "g".into(), topic: "t".into(), partition: 0, offset: 4 },
            CommittedSnapshot { group: "g".into(), topic: "t".into(), partition: 1, offset: 12 },
            CommittedSnapshot { group: "g".into(), topic: "gone".into(), partition: 0, offset: 1 },
        ];
        let text = encode(vec![owner, coordinator], context(true));
        assert!(text.contains("shardlog_group_lag_records{group=\"g\",topic=\"t\"} 6\n"), "{text}");
        assert!(
            text.contains("shardlog_group_partition_lag_records{group=\"g\",topic=\"t\",partition=\"1\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("shardlog_partition_log_end_offset{topic=\"t\",partition=\"0\"} 10\n"), "{text}");
        assert!(!text.contains("topic=\"gone\""), "{text}");
    }
}
