//! The copy path: per worker, a fetcher thread that reads its share of
//! source partitions (read_committed, from each partition's leader) and a
//! producer thread that writes them to the target with an idempotent
//! producer, joined by a bounded channel, so fetching the next records
//! overlaps producing the last.
//!
//! Each partition has its own producer id and up to `PIPELINE_DEPTH`
//! batches in flight, in pipelined requests; after a failed one, the
//! partition sends again from it with the same sequence numbers, so the
//! target drops a batch whose first try had landed (NOT_LEADER, timeouts, lost
//! connections, NOT_ENOUGH_REPLICAS_AFTER_APPEND: no duplicates, no gaps).
//! Where the target no longer knows the producer (OUT_OF_ORDER_SEQUENCE,
//! UNKNOWN_PRODUCER_ID after its own failover lost the state), the
//! partition goes back to the control thread, which works out from the
//! target's data where to go on (`resume`) and hands it out again with a
//! new generation; whatever the old generation had queued is dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flume::{Receiver, RecvTimeoutError, Sender};

use super::batches::{prepare, select, Prepared};
use super::link::{now_ms, Link};
use super::mapping::{Copied, Mapping};
use super::membership::GroupState;
use crate::protocol::record_batch::ProducerFields;
use crate::protocol::ErrorCode;

/// A source partition: (topic, partition).
pub type Key = (String, i32);

/// Bytes one fetch asks of each partition.
const PARTITION_FETCH_BYTES: i32 = 1 << 20;
/// Prepared bytes a producer holds before it stops taking chunks.
const QUEUED_BYTES_MAX: usize = 64 << 20;
const METADATA_REFRESH: Duration = Duration::from_secs(10);
/// Produce requests in flight per target node in a round, so batches per
/// partition at once: an idempotent producer may have up to 5.
const PIPELINE_DEPTH: usize = 4;

#[derive(Debug, Clone)]
pub struct Assignment {
    pub key: Key,
    pub target_topic: String,
    /// The first source offset to copy.
    pub start: i64,
    pub generation: u64,
}

pub enum ToFetcher {
    Assign(Assignment),
    /// Stop fetching the partition (it was dealt to another member).
    Revoke(Key),
}

pub struct Chunk {
    key: Key,
    target_topic: String,
    generation: u64,
    batches: Vec<Prepared>,
}

/// What workers tell the control thread.
#[derive(Debug)]
pub enum ToControl {
    /// The target lost this partition's producer state: work out where to
    /// go on and assign it again.
    Resync { key: Key, generation: u64, reason: String },
    /// The source no longer has the offset the mirror needs (retention ran
    /// ahead of it).
    OutOfRange { key: Key, generation: u64 },
}

/// One partition as the control thread and `mirror status` see it.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    pub target_topic: String,
    pub generation: u64,
    pub mapping: Mapping,
    /// The source's high watermark at the last fetch.
    pub source_end: i64,
    pub records: u64,
    pub bytes: u64,
    pub error: Option<String>,
}

impl Progress {
    /// Records of the source not yet on the target.
    pub fn lag(&self) -> i64 {
        match self.mapping.frontier() {
            Some((next, _)) if self.source_end >= 0 => (self.source_end - next).max(0),
            _ => -1,
        }
    }
}

/// What every thread of the mirror shares.
pub struct Shared {
    pub progress: Mutex<HashMap<Key, Progress>>,
    /// Source append (the batch's newest record time) to target
    /// acknowledgement, in microseconds.
    pub latency: Mutex<hdrhistogram::Histogram<u64>>,
    /// The same, in the broker's fixed buckets (for Prometheus).
    pub latency_buckets: Mutex<crate::metrics::Histogram>,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    pub stop: AtomicBool,
    /// This process's standing in its mirror group (`membership`).
    pub group: Mutex<GroupState>,
    /// Producers may start requests (false while the control thread takes
    /// partitions back for a rebalance).
    pub writing: AtomicBool,
    /// Produce requests under way, all producers together.
    pub in_flight: AtomicUsize,
}

impl Shared {
    pub fn new() -> Self {
        Self {
            progress: Mutex::new(HashMap::new()),
            latency: Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("bounds")),
            latency_buckets: Mutex::new(crate::metrics::Histogram::default()),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            group: Mutex::new(GroupState::default()),
            writing: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}

struct Fetching {
    target_topic: String,
    next: i64,
    generation: u64,
}

/// The fetcher thread of one worker.
pub fn fetcher(
    mut source: Link,
    assignments: Receiver<ToFetcher>,
    chunks: Sender<Chunk>,
    control: Sender<ToControl>,
    shared: Arc<Shared>,
) {
    let mut assigned: BTreeMap<Key, Fetching> = BTreeMap::new();
    let mut refreshed: Option<Instant> = None;
    while !shared.stopped() {
        let first = if assigned.is_empty() {
            match assignments.recv_timeout(Duration::from_millis(200)) {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            None
        };
        for message in first.into_iter().chain(assignments.try_iter()) {
            match message {
                ToFetcher::Assign(a) => {
                    assigned.insert(
                        a.key,
                        Fetching { target_topic: a.target_topic, next: a.start, generation: a.generation },
                    );
                }
                ToFetcher::Revoke(key) => {
                    assigned.remove(&key);
                }
            }
        }
        if assigned.is_empty() {
            continue;
        }
        if refreshed.is_none_or(|at| at.elapsed() > METADATA_REFRESH) {
            let topics: Vec<String> = assigned
                .keys()
                .map(|(t, _)| t.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            if source.metadata(Some(topics)).is_ok() {
                refreshed = Some(Instant::now());
            } else {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        }
        let mut by_node: BTreeMap<i32, Vec<(String, i32, i64)>> = BTreeMap::new();
        for ((topic, partition), fetching) in &assigned {
            match source.leader(topic, *partition) {
                Some(node) => by_node.entry(node).or_default().push((topic.clone(), *partition, fetching.next)),
                None => refreshed = None,
            }
        }
        if by_node.is_empty() {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let max_wait = if by_node.len() > 1 { 50 } else { 250 };
        for (node, wanted) in by_node {
            let answer = match source.fetch(node, &wanted, max_wait, PARTITION_FETCH_BYTES) {
                Ok(answer) => answer,
                Err(err) => {
                    tracing::debug!(node, %err, "mirror: source fetch failed");
                    refreshed = None;
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            for topic in answer.topics {
                for p in topic.partitions {
                    let key = (topic.name.clone(), p.index);
                    let Some(fetching) = assigned.get_mut(&key) else { continue };
                    match p.error {
                        ErrorCode::None => {}
                        ErrorCode::OffsetOutOfRange => {
                            let generation = fetching.generation;
                            assigned.remove(&key);
                            let _ = control.send(ToControl::OutOfRange { key, generation });
                            continue;
                        }
                        _ => {
                            refreshed = None;
                            continue;
                        }
                    }
                    if let Some(progress) = shared.progress.lock().expect("progress").get_mut(&key) {
                        progress.source_end = p.high_watermark;
                    }
                    let (selected, next) = select(&p.records, fetching.next, &p.aborted_transactions);
                    if selected.is_empty() {
                        fetching.next = next;
                        continue;
                    }
                    match prepare(&selected) {
                        Ok(batches) => {
                            let chunk = Chunk {
                                key: key.clone(),
                                target_topic: fetching.target_topic.clone(),
                                generation: fetching.generation,
                                batches,
                            };
                            if chunks.send(chunk).is_err() {
                                return;
                            }
                            fetching.next = next;
                        }
                        Err(err) => {
                            // A batch that does not parse is never skipped:
                            // the partition stops, and says why.
                            tracing::error!(topic = %key.0, partition = key.1, %err, "mirror: source batch does not parse; partition stopped");
                            if let Some(progress) = shared.progress.lock().expect("progress").get_mut(&key) {
                                progress.error = Some(format!("source batch at {}: {err}", fetching.next));
                            }
                            assigned.remove(&key);
                        }
                    }
                }
            }
        }
    }
}

struct Producing {
    target_topic: String,
    generation: u64,
    /// Waiting for the control thread to assign it again.
    parked: bool,
    producer: Option<(i64, i16)>,
    next_sequence: i32,
    queue: VecDeque<Prepared>,
    retry_at: Option<Instant>,
    failures: u32,
}

impl Producing {
    /// A partition's first chunk of a generation: a new producer id comes
    /// with it (sequences start over).
    fn new(chunk: &Chunk) -> Self {
        Self {
            target_topic: chunk.target_topic.clone(),
            generation: chunk.generation,
            parked: false,
            producer: None,
            next_sequence: 0,
            queue: VecDeque::new(),
            retry_at: None,
            failures: 0,
        }
    }
}

/// The producer thread of one worker.
pub fn producer(mut target: Link, chunks: Receiver<Chunk>, control: Sender<ToControl>, shared: Arc<Shared>) {
    let mut partitions: HashMap<Key, Producing> = HashMap::new();
    let mut queued_bytes = 0usize;
    while !shared.stopped() {
        let idle = partitions.values().all(|p| p.queue.is_empty() || p.parked);
        let first = if idle {
            match chunks.recv_timeout(Duration::from_millis(100)) {
                Ok(chunk) => Some(chunk),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            None
        };
        let mut incoming: Vec<Chunk> = first.into_iter().collect();
        while queued_bytes < QUEUED_BYTES_MAX {
            match chunks.try_recv() {
                Ok(chunk) => {
                    queued_bytes += chunk.batches.iter().map(|b| b.bytes.len()).sum::<usize>();
                    incoming.push(chunk);
                }
                Err(_) => break,
            }
        }
        for chunk in incoming {
            let state = partitions.entry(chunk.key.clone()).or_insert_with(|| Producing::new(&chunk));
            if chunk.generation < state.generation || (chunk.generation == state.generation && state.parked) {
                continue;
            }
            if chunk.generation > state.generation {
                *state = Producing::new(&chunk);
            }
            state.queue.extend(chunk.batches);
        }
        queued_bytes = partitions.values().flat_map(|p| p.queue.iter()).map(|b| b.bytes.len()).sum();
        // Counted before the check, so the control thread, which clears
        // `writing` and then waits for none in flight, never misses one.
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let leased = shared.group.lock().expect("group").leased();
        if shared.writing.load(Ordering::SeqCst) && leased {
            drop_taken_back(&mut partitions, &shared);
            produce_round(&mut target, &mut partitions, &control, &shared);
            shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        } else {
            shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Forgets partitions the control thread took back or handed out again
/// (their progress entry is gone or has a newer generation).
fn drop_taken_back(partitions: &mut HashMap<Key, Producing>, shared: &Shared) {
    let progress = shared.progress.lock().expect("progress");
    partitions.retain(|key, state| progress.get(key).is_some_and(|p| p.generation == state.generation));
}

/// Sends the first batches of every ready partition, one set of pipelined
/// requests per target node (request i holds each partition's i-th
/// batch), and handles the answers in order.
fn produce_round(
    target: &mut Link,
    partitions: &mut HashMap<Key, Producing>,
    control: &Sender<ToControl>,
    shared: &Shared,
) {
    let now = Instant::now();
    let mut by_node: BTreeMap<i32, Vec<Key>> = BTreeMap::new();
    let mut waiting = false;
    for (key, state) in partitions.iter_mut() {
        if state.parked || state.queue.is_empty() {
            continue;
        }
        if state.retry_at.is_some_and(|at| at > now) {
            waiting = true;
            continue;
        }
        if state.producer.is_none() {
            match target.init_producer_id() {
                Ok(producer) => {
                    state.producer = Some(producer);
                    state.next_sequence = 0;
                }
                Err(err) => {
                    backoff(state, &format!("InitProducerId: {err}"));
                    continue;
                }
            }
        }
        match target.leader_or_refresh(&state.target_topic, key.1) {
            Ok(node) => by_node.entry(node).or_default().push(key.clone()),
            Err(err) => backoff(state, &format!("target leader: {err}")),
        }
    }
    if by_node.is_empty() {
        if waiting {
            std::thread::sleep(Duration::from_millis(20));
        }
        return;
    }
    for (node, keys) in by_node {
        // requests[i]: the i-th queued batch of each partition, stamped with
        // the sequence it has whatever happens to the ones before it.
        let mut requests: Vec<Vec<(String, i32, bytes::Bytes)>> = Vec::new();
        let mut sent: Vec<(Key, usize)> = Vec::with_capacity(keys.len());
        for key in &keys {
            let state = partitions.get_mut(key).expect("listed above");
            let (producer_id, producer_epoch) = state.producer.expect("set above");
            let mut sequence = state.next_sequence;
            let depth = state.queue.len().min(PIPELINE_DEPTH);
            for (i, batch) in state.queue.iter_mut().take(depth).enumerate() {
                let fields = ProducerFields { producer_id, producer_epoch, base_sequence: sequence };
                sequence = sequence.wrapping_add(batch.records);
                if requests.len() == i {
                    requests.push(Vec::new());
                }
                requests[i].push((state.target_topic.clone(), key.1, batch.stamped(fields)));
            }
            sent.push((key.clone(), depth));
        }
        let answers = target.produce_pipelined(node, requests);
        let mut results: Vec<HashMap<(String, i32), (ErrorCode, i64)>> = Vec::with_capacity(answers.len());
        let mut failure: Option<String> = None;
        for answer in answers {
            let mut found = HashMap::new();
            match answer {
                Ok(answer) => {
                    for topic in &answer.topics {
                        for p in &topic.partitions {
                            found.insert((topic.name.clone(), p.index), (p.error, p.base_offset));
                        }
                    }
                }
                Err(err) => failure = failure.or(Some(err.to_string())),
            }
            results.push(found);
        }
        for (key, depth) in sent {
            let state = partitions.get_mut(&key).expect("listed above");
            for found in results.iter().take(depth) {
                let answer = found.get(&(state.target_topic.clone(), key.1)).copied();
                match answer {
                    Some((ErrorCode::None, base_offset)) => acknowledged(&key, state, base_offset, shared),
                    Some((
                        code @ (ErrorCode::OutOfOrderSequenceNumber
                        | ErrorCode::UnknownProducerId
                        | ErrorCode::InvalidProducerEpoch
                        | ErrorCode::DuplicateSequenceNumber),
                        _,
                    )) => {
                        // Only the first unacknowledged batch of the round
                        // gets here: later ones stop at the first failure.
                        state.parked = true;
                        state.queue.clear();
                        let _ = control.send(ToControl::Resync {
                            key: key.clone(),
                            generation: state.generation,
                            reason: format!("target answered {code:?}"),
                        });
                        break;
                    }
                    Some((code, _)) => {
                        let topic = state.target_topic.clone();
                        target.forget(&topic);
                        backoff(state, &format!("produce to {topic}-{}: {code:?}", key.1));
                        break;
                    }
                    None => {
                        let topic = state.target_topic.clone();
                        target.forget(&topic);
                        let why = failure.clone().unwrap_or_else(|| "no answer for the partition".into());
                        backoff(state, &format!("produce: {why}"));
                        break;
                    }
                }
            }
        }
    }
}

fn acknowledged(key: &Key, state: &mut Producing, base_offset: i64, shared: &Shared) {
    let batch = state.queue.pop_front().expect("the head was sent");
    state.next_sequence = state.next_sequence.wrapping_add(batch.records);
    state.failures = 0;
    state.retry_at = None;
    let latency_us = (now_ms() - batch.max_timestamp).max(0) as u64 * 1000;
    let _ = shared.latency.lock().expect("latency").record(latency_us.max(1));
    shared.latency_buckets.lock().expect("latency").record(Duration::from_micros(latency_us));
    shared.records.fetch_add(batch.records as u64, Ordering::Relaxed);
    shared.bytes.fetch_add(batch.source_bytes as u64, Ordering::Relaxed);
    let mut progress = shared.progress.lock().expect("progress");
    let Some(entry) = progress.get_mut(key) else { return };
    if entry.generation != state.generation {
        return;
    }
    entry.records += batch.records as u64;
    entry.bytes += batch.source_bytes as u64;
    entry.error = None;
    let mut downstream = base_offset;
    for piece in &batch.pieces {
        entry.mapping.copied(Copied {
            upstream_first: piece.upstream_first,
            upstream_last: piece.upstream_last,
            downstream_first: downstream,
            records: piece.records,
            exact: piece.contiguous && batch.target_contiguous,
        });
        downstream += piece.records;
    }
}

fn backoff(state: &mut Producing, why: &str) {
    state.failures += 1;
    let delay = Duration::from_millis(50u64 << state.failures.min(5));
    state.retry_at = Some(Instant::now() + delay);
    if state.failures == 3 || state.failures.is_multiple_of(50) {
        tracing::warn!(topic = %state.target_topic, failures = state.failures, "mirror: retrying: {why}");
    }
}
