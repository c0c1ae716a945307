//! One producer client on one core. It makes messages (as fast as the
//! in-flight limit allows, or on a fixed-rate schedule), batches them per
//! partition up to `--batch-bytes` or `--linger-ms`, and sends the closed
//! batches to their partitions' leaders over each node's pipelined
//! connection. One task per connection reads the acknowledgements in order
//! and times every message from its (intended) send time.
//!
//! Like the Kafka producers (the Java client's accumulator and sender,
//! librdkafka's per-broker queue), making messages never waits for a
//! request slot while there is room in the accumulator: closed batches
//! queue per node, and each free slot takes every queued batch, up to
//! `REQUEST_BYTES_MAX`, in one request. After a stall (a slow response, a
//! descheduled core) the backlog then drains in a few large requests, as it
//! does for real clients, instead of one batch per round trip at a pace the
//! schedule never catches up with.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes};
use glommio::channels::local_channel::{self, LocalSender};
use glommio::Task;

use super::args::Keys;
use super::core::{Outcome, ProducerSpec, RunShared, Stats};
use super::payload::{self, Rng, ValueHeader};
use super::rate::Schedule;
use super::verify::{SentStream, StreamId};
use crate::client::pipelined::{Connection, ConnectionOptions, Nodes, PendingResponse};
use crate::client::ClientError;
use crate::protocol::produce::{ProducePartition, ProduceRequest, ProduceResponse, ProduceTopic};
use crate::protocol::record_batch::{BatchBuilder, ProducerFields};
use crate::protocol::ApiKey;

/// Messages made between two looks at the clock and the linger queue.
const MESSAGES_PER_STEP: usize = 64;
/// Bytes a record adds to a batch beyond its key and value (attributes,
/// varints, header count), as an upper bound.
const RECORD_OVERHEAD_BYTES: usize = 24;
/// Produce request timeout given to the broker.
const PRODUCE_TIMEOUT_MS: i32 = 30_000;
/// Fixed-rate producers sleep at least this long (timer granularity).
const SLEEP_MIN: Duration = Duration::from_micros(50);
/// Batches one produce request carries at most, in bytes (the Java
/// producer's `max.request.size`); a lone larger batch still goes alone.
const REQUEST_BYTES_MAX: usize = 1 << 20;
/// Closed batches that may wait for a request slot, in bytes, before making
/// messages waits too (the accumulator's bound, like `buffer.memory`).
const QUEUED_BYTES_MAX: usize = REQUEST_BYTES_MAX;

pub async fn run(spec: ProducerSpec, shared: Arc<RunShared>, stats: Stats, outcome: Outcome) -> Result<(), String> {
    let mut producer = Producer::new(spec, shared, stats, outcome);
    let result = producer.produce().await;
    let finished = producer.finish().await;
    result.and(finished).map_err(|e| e.to_string())
}

/// A batch being filled for one partition.
struct OpenBatch {
    /// Records are encoded into the batch as they are added.
    records: BatchBuilder,
    /// (intended send time, payload bytes) of each record.
    meta: Vec<(Instant, u32)>,
    first_sequence: u64,
    opened_at: Instant,
}

/// A batch on the wire, waiting for its acknowledgement.
struct SentBatch {
    partition: i32,
    first_sequence: u64,
    meta: Vec<(Instant, u32)>,
}

struct InFlight {
    response: PendingResponse,
    batches: Vec<SentBatch>,
}

struct Producer {
    id: u32,
    shared: Arc<RunShared>,
    stats: Stats,
    outcome: Outcome,
    nodes: Nodes,
    own: Vec<i32>,
    cursor: usize,
    open: HashMap<i32, OpenBatch>,
    /// Partitions in the order their open batch was started (linger order).
    lingering: VecDeque<(Instant, i32)>,
    /// Closed batches waiting for a request slot, per leader node, in order.
    queued: BTreeMap<i32, VecDeque<(i32, OpenBatch)>>,
    queued_bytes: usize,
    sequences: HashMap<i32, u64>,
    schedule: Option<Schedule>,
    /// Messages still to make after the warmup (with --messages).
    quota: Option<u64>,
    rng: Rng,
    acks: HashMap<i32, LocalSender<InFlight>>,
    ack_tasks: Vec<Task<()>>,
    sent: Rc<std::cell::RefCell<HashMap<i32, SentStream>>>,
}

impl Producer {
    fn new(spec: ProducerSpec, shared: Arc<RunShared>, stats: Stats, outcome: Outcome) -> Self {
        let options = ConnectionOptions { in_flight: shared.workload.in_flight, ..ConnectionOptions::default() };
        let nodes = Nodes::new(shared.topology.nodes.clone(), options);
        assert!(!spec.partitions.is_empty(), "every producer has a partition");
        Self {
            id: spec.id,
            rng: Rng::new(u64::from(shared.run_id) << 32 | u64::from(spec.id)),
            shared,
            stats,
            outcome,
            nodes,
            own: spec.partitions,
            cursor: 0,
            open: HashMap::new(),
            lingering: VecDeque::new(),
            queued: BTreeMap::new(),
            queued_bytes: 0,
            sequences: HashMap::new(),
            schedule: spec.schedule,
            quota: spec.quota,
            acks: HashMap::new(),
            ack_tasks: Vec::new(),
            sent: Rc::new(std::cell::RefCell::new(HashMap::new())),
        }
    }

    async fn produce(&mut self) -> Result<(), ClientError> {
        loop {
            if self.shared.control.aborted() {
                return Ok(());
            }
            let now = Instant::now();
            let step =
                if self.schedule.is_some() { self.step_at_rate(now).await? } else { self.step_flat_out(now).await? };
            match step {
                Step::Made => {}
                Step::Idle(until) => {
                    self.flush_lingering(Instant::now());
                    self.dispatch(false).await?;
                    let wake = self
                        .lingering
                        .front()
                        .map_or(until, |(opened, _)| until.min(*opened + self.shared.workload.linger));
                    let wait = wake.saturating_duration_since(Instant::now()).max(SLEEP_MIN);
                    // Queued batches go as soon as a slot frees, messages
                    // are made when due: whichever comes first.
                    match self.blocked_node().await? {
                        Some(connection) => {
                            futures_lite::future::or(connection.wait_room(), async {
                                glommio::timer::sleep(wait).await;
                                Ok(())
                            })
                            .await?
                        }
                        None => glommio::timer::sleep(wait).await,
                    }
                    continue;
                }
                Step::Finished => return Ok(()),
            }
            self.flush_lingering(Instant::now());
            self.dispatch(false).await?;
            glommio::yield_if_needed().await;
        }
    }

    /// Makes up to a step's worth of messages now.
    async fn step_flat_out(&mut self, now: Instant) -> Result<Step, ClientError> {
        if self.past_deadline(now) || self.quota == Some(0) {
            return Ok(Step::Finished);
        }
        for _ in 0..MESSAGES_PER_STEP {
            if self.quota == Some(0) {
                break;
            }
            self.add_message(now).await?;
        }
        Ok(Step::Made)
    }

    /// Makes the messages that are due by the schedule, each stamped with
    /// the time it was due.
    async fn step_at_rate(&mut self, now: Instant) -> Result<Step, ClientError> {
        let schedule = self.schedule.as_ref().expect("fixed-rate producer");
        if self.quota == Some(0) || self.past_deadline(schedule.next_due()) {
            return Ok(Step::Finished);
        }
        let due = schedule.due(now);
        if due == 0 {
            return Ok(Step::Idle(schedule.next_due()));
        }
        for _ in 0..due.min(MESSAGES_PER_STEP as u64) {
            let intended = self.schedule.as_mut().expect("fixed-rate producer").take();
            if self.past_deadline(intended) || self.quota == Some(0) {
                break;
            }
            self.add_message(intended).await?;
        }
        Ok(Step::Made)
    }

    fn past_deadline(&self, at: Instant) -> bool {
        self.shared.clock.deadline.is_some_and(|deadline| at >= deadline)
    }

    /// Makes one message intended at `intended` and adds it to its
    /// partition's batch, sending the batch when it is full.
    async fn add_message(&mut self, intended: Instant) -> Result<(), ClientError> {
        let shared = self.shared.clone();
        let workload = &shared.workload;
        let (partition, key) = self.pick_partition();
        let size = self.rng.between(workload.message_bytes.min, workload.message_bytes.max) as usize;
        let sequence = {
            let next = self.sequences.entry(partition).or_insert(0);
            *next += 1;
            *next - 1
        };
        if intended >= shared.clock.measure_from {
            if let Some(quota) = self.quota.as_mut() {
                *quota -= 1;
            }
        }
        let sent_us = shared.clock.wall_us(intended);
        let value_header = ValueHeader { run_id: shared.run_id, producer: self.id, sequence, sent_us };
        // Filler cut from a random place, copied once: into the batch.
        let filler_bytes = size - payload::HEADER_BYTES;
        let filler_at = self.rng.next_u64() as usize % (shared.filler.len() - filler_bytes + 1);
        let filler = &shared.filler[filler_at..filler_at + filler_bytes];
        let timestamp_ms = (sent_us / 1000) as i64;
        let payload_bytes = (size + key.as_ref().map_or(0, Bytes::len)) as u32;
        let record_bytes = payload_bytes as usize + RECORD_OVERHEAD_BYTES;
        let batch_bytes_max = workload.batch_bytes;
        let batch = match self.open.get_mut(&partition) {
            Some(batch) => batch,
            None => {
                let opened_at = Instant::now();
                self.lingering.push_back((opened_at, partition));
                self.open.entry(partition).or_insert(OpenBatch {
                    records: BatchBuilder::new(timestamp_ms, batch_bytes_max + record_bytes),
                    meta: Vec::new(),
                    first_sequence: sequence,
                    opened_at,
                })
            }
        };
        batch.records.push_with(
            timestamp_ms - batch.records.base_timestamp(),
            batch.records.records(),
            key.as_deref(),
            Some(size),
            &[],
            |out| {
                value_header.write(out);
                out.put_slice(filler);
            },
        );
        batch.meta.push((intended, payload_bytes));
        // Close when another record like this one would not fit.
        if batch.records.len() + record_bytes > batch_bytes_max {
            self.close(partition);
        }
        Ok(())
    }

    /// The partition (and key) of the next message.
    fn pick_partition(&mut self) -> (i32, Option<Bytes>) {
        match self.shared.workload.keys {
            // Sticky: stay on one partition until its batch goes out.
            Keys::None => (self.own[self.cursor % self.own.len()], None),
            Keys::RoundRobin => {
                self.cursor = (self.cursor + 1) % self.own.len();
                (self.own[self.cursor], None)
            }
            Keys::Random(count) => {
                let key = Bytes::from(format!("key-{}", self.rng.next_u64() % u64::from(count)));
                (payload::partition_for_key(&key, self.shared.workload.partitions), Some(key))
            }
        }
    }

    /// Closes the batches whose linger time is up.
    fn flush_lingering(&mut self, now: Instant) {
        let linger = self.shared.workload.linger;
        while let Some(&(opened_at, partition)) = self.lingering.front() {
            if opened_at + linger > now {
                break;
            }
            self.lingering.pop_front();
            if self.open.get(&partition).is_some_and(|b| b.opened_at == opened_at) {
                self.close(partition);
            }
        }
    }

    /// Closes the open batch of `partition`, if any, and queues it for the
    /// partition's leader.
    fn close(&mut self, partition: i32) {
        let Some(batch) = self.open.remove(&partition) else {
            return;
        };
        if self.shared.workload.keys == Keys::None && self.own[self.cursor % self.own.len()] == partition {
            self.cursor = (self.cursor + 1) % self.own.len();
        }
        let leader = self.shared.topology.leader(partition).expect("every partition has a leader");
        self.queued_bytes += batch.records.len();
        self.queued.entry(leader).or_default().push_back((partition, batch));
    }

    /// Sends the queued batches while their nodes have request slots free,
    /// each request taking all it can carry. Waits for slots when `all` is
    /// set, or while the queue is over its bound.
    async fn dispatch(&mut self, all: bool) -> Result<(), ClientError> {
        let nodes: Vec<i32> = self.queued.keys().copied().collect();
        for node in nodes {
            let connection = self.nodes.node(node).await?;
            while let Some(queue) = self.queued.get_mut(&node) {
                if queue.is_empty() {
                    self.queued.remove(&node);
                    break;
                }
                if !connection.has_room() {
                    if !all && self.queued_bytes <= QUEUED_BYTES_MAX {
                        break;
                    }
                    connection.wait_room().await?;
                    continue;
                }
                let mut batches = Vec::new();
                let mut bytes = 0;
                while let Some((_, batch)) = queue.front() {
                    let size = batch.records.len();
                    if !batches.is_empty() && bytes + size > REQUEST_BYTES_MAX {
                        break;
                    }
                    bytes += size;
                    batches.push(queue.pop_front().expect("front exists"));
                }
                self.queued_bytes -= bytes;
                self.send_to(node, batches).await?;
            }
        }
        Ok(())
    }

    /// A node whose queued batches wait for a request slot, if any.
    async fn blocked_node(&self) -> Result<Option<Rc<Connection>>, ClientError> {
        match self.queued.keys().next() {
            Some(&node) => Ok(Some(self.nodes.node(node).await?)),
            None => Ok(None),
        }
    }

    async fn send_to(&mut self, node: i32, batches: Vec<(i32, OpenBatch)>) -> Result<(), ClientError> {
        let shared = self.shared.clone();
        let workload = &shared.workload;
        let mut partitions = Vec::with_capacity(batches.len());
        let mut sent = Vec::with_capacity(batches.len());
        for (partition, batch) in batches {
            let records = batch.records.finish(ProducerFields::NONE);
            partitions.push(ProducePartition { index: partition, records: Some(records) });
            sent.push(SentBatch { partition, first_sequence: batch.first_sequence, meta: batch.meta });
        }
        let request = ProduceRequest {
            transactional_id: None,
            acks: workload.acks,
            timeout_ms: PRODUCE_TIMEOUT_MS,
            topics: vec![ProduceTopic { name: workload.topic.clone(), partitions }],
        };
        let version = self.shared.versions.produce;
        let connection = self.nodes.node(node).await?;
        if workload.acks == 0 {
            connection.send_only(ApiKey::Produce, version, |w| request.encode(w)).await?;
            let now = Instant::now();
            let mut stats = self.stats.borrow_mut();
            let mut outcome = self.outcome.borrow_mut();
            for batch in &sent {
                count_acknowledged(&self.shared, &mut stats, batch, now, false);
            }
            outcome.last_ack = outcome.last_ack.max(Some(now));
            return Ok(());
        }
        let response = connection.send(ApiKey::Produce, version, |w| request.encode(w)).await?;
        let queue = self.ack_queue(node);
        if queue.try_send(InFlight { response, batches: sent }).is_err() {
            return Err(ClientError::Closed("acknowledgement queue closed".into()));
        }
        Ok(())
    }

    /// The queue of the task that reads `node`'s acknowledgements.
    fn ack_queue(&mut self, node: i32) -> &LocalSender<InFlight> {
        if !self.acks.contains_key(&node) {
            // Bounded in effect: each entry holds one of the connection's
            // `--in-flight` permits until its response is read.
            let (sender, receiver) = local_channel::new_unbounded::<InFlight>();
            let task = glommio::spawn_local(acknowledge(
                receiver,
                self.shared.clone(),
                self.stats.clone(),
                self.outcome.clone(),
                self.sent.clone(),
            ));
            self.ack_tasks.push(task);
            self.acks.insert(node, sender);
        }
        &self.acks[&node]
    }

    /// Sends what is still open, waits for every acknowledgement, and
    /// hands the per-stream counts to the core's result.
    async fn finish(&mut self) -> Result<(), ClientError> {
        let mut result = Ok(());
        if !self.shared.control.aborted() {
            let open: Vec<i32> = self.open.keys().copied().collect();
            for partition in open {
                self.close(partition);
            }
            result = self.dispatch(true).await;
        }
        self.acks.clear();
        for task in self.ack_tasks.drain(..) {
            task.await;
        }
        // Requests without a response (acks=0) may still sit in a writer's
        // queue: wait until they are on the wire before the connections go.
        for connection in self.nodes.open() {
            if let Err(error) = connection.drain().await {
                result = result.and(Err(error));
            }
        }
        let mut sent = self.sent.borrow_mut();
        let mut outcome = self.outcome.borrow_mut();
        for (&partition, &count) in &self.sequences {
            let mut stream = sent.remove(&partition).unwrap_or_default();
            stream.sent = count;
            outcome.sent.insert(StreamId { producer: self.id, partition }, stream);
        }
        result
    }
}

enum Step {
    Made,
    /// Nothing due before this time.
    Idle(Instant),
    Finished,
}

/// Reads one connection's acknowledgements in order.
async fn acknowledge(
    queue: local_channel::LocalReceiver<InFlight>,
    shared: Arc<RunShared>,
    stats: Stats,
    outcome: Outcome,
    sent: Rc<std::cell::RefCell<HashMap<i32, SentStream>>>,
) {
    let version = shared.versions.produce;
    while let Some(in_flight) = queue.recv().await {
        let answer = in_flight.response.decode(version, ProduceResponse::decode).await;
        let now = Instant::now();
        let mut stats = stats.borrow_mut();
        let mut outcome = outcome.borrow_mut();
        for batch in &in_flight.batches {
            let refusal = match &answer {
                Err(error) => Some(format!("produce failed: {error}")),
                Ok(response) => {
                    match response.topics.iter().flat_map(|t| &t.partitions).find(|p| p.index == batch.partition) {
                        None => Some("partition missing from the produce response".to_string()),
                        Some(p) if !p.error.is_ok() => Some(format!("{:?}", p.error)),
                        Some(_) => None,
                    }
                }
            };
            match refusal {
                None => {
                    count_acknowledged(&shared, &mut stats, batch, now, true);
                    outcome.last_ack = outcome.last_ack.max(Some(now));
                }
                Some(reason) => {
                    let count = batch.meta.len() as u64;
                    stats.refused += count;
                    *outcome.refusals.entry(reason).or_default() += count;
                    let range = batch.first_sequence..batch.first_sequence + count;
                    sent.borrow_mut().entry(batch.partition).or_default().failed.push(range);
                }
            }
        }
    }
}

/// Counts an acknowledged batch, and times each message when asked.
fn count_acknowledged(shared: &RunShared, stats: &mut super::core::Tick, batch: &SentBatch, now: Instant, time: bool) {
    let measure_from = shared.clock.measure_from;
    for &(intended, bytes) in &batch.meta {
        stats.produced.add(1, u64::from(bytes));
        if intended >= measure_from {
            stats.produced_measured.add(1, u64::from(bytes));
            if time {
                stats.latencies.produce.record(now.saturating_duration_since(intended).as_micros() as u64);
            }
        }
    }
    shared.control.acked.fetch_add(batch.meta.len() as u64, Ordering::Relaxed);
}
