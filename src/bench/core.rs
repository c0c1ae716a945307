//! One load-generator core: a glommio executor running its share of the
//! producers and consumers, each with its own connections. What cores share
//! is read-only (`RunShared`: the workload, the topology, the clock) or
//! atomic (`Control`: counts that decide when consumers may stop). Every
//! second the core sends what it measured (`Tick`) to the main thread, which
//! merges the histograms and prints the progress line; at the end it sends
//! what verification needs (`CoreResult`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::args::Workload;
use super::histogram::Latencies;
use super::rate::Schedule;
use super::verify::{SentStream, SequenceCheck, StreamId};
use super::{consumer, producer};
use crate::client::pipelined::{Topology, Versions};

/// How often a core reports to the main thread.
pub const TICK_INTERVAL: Duration = Duration::from_secs(1);

/// The run's time base, shared by every core. Produce latency uses the
/// monotonic clock; end-to-end latency compares wall-clock microseconds
/// written into the record with the consumer's, so it also works when the
/// consumer is another process on the same machine.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub start: Instant,
    pub wall_start_us: u64,
    /// Records intended before this are warmup: neither counted nor timed.
    pub measure_from: Instant,
    /// Producers stop taking messages due at or after this.
    pub deadline: Option<Instant>,
}

impl Clock {
    pub fn new(warmup: Duration, measure: Option<Duration>) -> Self {
        let start = Instant::now();
        let wall_start_us =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
        let measure_from = start + warmup;
        Self { start, wall_start_us, measure_from, deadline: measure.map(|d| measure_from + d) }
    }

    /// Wall-clock microseconds of a monotonic instant.
    pub fn wall_us(&self, at: Instant) -> u64 {
        match at.checked_duration_since(self.start) {
            Some(after) => self.wall_start_us + after.as_micros() as u64,
            None => self.wall_start_us.saturating_sub((self.start - at).as_micros() as u64),
        }
    }

    pub fn measure_from_wall_us(&self) -> u64 {
        self.wall_us(self.measure_from)
    }
}

/// Counts that all cores update and read.
#[derive(Debug, Default)]
pub struct Control {
    pub producers_running: AtomicUsize,
    /// Milliseconds after the clock's start when the last producer finished.
    pub producers_done_ms: AtomicU64,
    /// Records the broker acknowledged (with acks=0: records written).
    pub acked: AtomicU64,
    /// Records of this run that consumers received.
    pub consumed: AtomicU64,
    /// A fatal error or Ctrl-C: everyone stops.
    pub abort: AtomicBool,
}

impl Control {
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    pub fn producer_finished(&self, clock: &Clock) {
        if self.producers_running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.producers_done_ms.store(clock.start.elapsed().as_millis() as u64 + 1, Ordering::Release);
        }
    }

    /// When the last producer finished, if all have.
    pub fn producers_done_at(&self, clock: &Clock) -> Option<Instant> {
        match self.producers_done_ms.load(Ordering::Acquire) {
            0 => None,
            ms => Some(clock.start + Duration::from_millis(ms - 1)),
        }
    }
}

/// When consumers stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeUntil {
    /// After the producers of this run finished and everything they had
    /// acknowledged arrived (or `drain` passed without it).
    ProducersDone { drain: Duration },
    /// At a fixed time (tail reads of what others produce).
    Deadline(Instant),
    /// At each partition's `until` offset (catch-up reads).
    EndOffsets,
}

/// Everything a core needs that is the same for all cores.
pub struct RunShared {
    pub workload: Workload,
    pub topology: Topology,
    pub versions: Versions,
    pub clock: Clock,
    pub control: Control,
    pub run_id: u32,
    pub filler: Vec<u8>,
    pub consume_until: ConsumeUntil,
    /// Time end-to-end latency (off for catch-up reads of old records).
    pub time_e2e: bool,
    /// Only records of this run count (off for tail reads of another run).
    pub only_this_run: bool,
}

/// One producer client's share of the work.
#[derive(Debug, Clone)]
pub struct ProducerSpec {
    pub id: u32,
    /// Partitions for key-less messages.
    pub partitions: Vec<i32>,
    /// Messages to send after the warmup (with --messages).
    pub quota: Option<u64>,
    pub schedule: Option<Schedule>,
}

/// One partition a consumer reads.
#[derive(Debug, Clone, Copy)]
pub struct PartitionRead {
    pub index: i32,
    pub offset: i64,
    /// Stop before this offset (catch-up reads).
    pub until: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub partitions: Vec<PartitionRead>,
}

#[derive(Debug, Clone, Default)]
pub struct CoreSpec {
    pub core: usize,
    pub producers: Vec<ProducerSpec>,
    pub consumers: Vec<ConsumerSpec>,
}

/// Messages and their payload (key + value) bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub messages: u64,
    pub bytes: u64,
}

impl Count {
    pub fn add(&mut self, messages: u64, bytes: u64) {
        self.messages += messages;
        self.bytes += bytes;
    }

    pub fn merge(&mut self, other: &Count) {
        self.add(other.messages, other.bytes);
    }
}

/// What one core measured since its last tick.
#[derive(Debug, Clone, Default)]
pub struct Tick {
    pub latencies: Latencies,
    /// Acknowledged (acks=0: written), warmup included.
    pub produced: Count,
    /// Acknowledged and intended after the warmup.
    pub produced_measured: Count,
    pub consumed: Count,
    pub consumed_measured: Count,
    /// Records the broker refused.
    pub refused: u64,
    pub fetches: u64,
}

impl Tick {
    pub fn merge(&mut self, other: &Tick) {
        self.latencies.add(&other.latencies);
        self.produced.merge(&other.produced);
        self.produced_measured.merge(&other.produced_measured);
        self.consumed.merge(&other.consumed);
        self.consumed_measured.merge(&other.consumed_measured);
        self.refused += other.refused;
        self.fetches += other.fetches;
    }
}

/// What a core hands back at the end.
#[derive(Debug, Default)]
pub struct CoreResult {
    pub sent: HashMap<StreamId, SentStream>,
    pub seen: Vec<HashMap<StreamId, SequenceCheck>>,
    pub last_ack: Option<Instant>,
    pub first_receipt: Option<Instant>,
    pub last_receipt: Option<Instant>,
    /// Broker error codes seen, with how many records each refused.
    pub refusals: HashMap<String, u64>,
    pub errors: Vec<String>,
}

impl CoreResult {
    pub fn merge(&mut self, other: CoreResult) {
        self.sent.extend(other.sent);
        self.seen.extend(other.seen);
        self.last_ack = self.last_ack.max(other.last_ack);
        self.first_receipt = match (self.first_receipt, other.first_receipt) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_receipt = self.last_receipt.max(other.last_receipt);
        for (code, count) in other.refusals {
            *self.refusals.entry(code).or_default() += count;
        }
        self.errors.extend(other.errors);
    }
}

pub enum CoreMessage {
    Tick(Box<Tick>),
    Done(Box<CoreResult>),
}

/// What producers and consumers on one core record into.
pub type Stats = Rc<RefCell<Tick>>;
pub type Outcome = Rc<RefCell<CoreResult>>;

/// Runs one core's producers and consumers to the end.
pub async fn run(spec: CoreSpec, shared: Arc<RunShared>, out: flume::Sender<CoreMessage>) {
    let stats: Stats = Rc::new(RefCell::new(Tick::default()));
    let outcome: Outcome = Rc::new(RefCell::new(CoreResult::default()));
    let ticker = {
        let (stats, out) = (stats.clone(), out.clone());
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(TICK_INTERVAL).await;
                let tick = std::mem::take(&mut *stats.borrow_mut());
                if out.send(CoreMessage::Tick(Box::new(tick))).is_err() {
                    break;
                }
            }
        })
    };
    let producers: Vec<_> = spec
        .producers
        .into_iter()
        .map(|producer| glommio::spawn_local(producer::run(producer, shared.clone(), stats.clone(), outcome.clone())))
        .collect();
    let consumers: Vec<_> = spec
        .consumers
        .into_iter()
        .map(|consumer| glommio::spawn_local(consumer::run(consumer, shared.clone(), stats.clone(), outcome.clone())))
        .collect();
    for task in producers {
        if let Err(error) = task.await {
            fail(&shared, &outcome, format!("core {} producer: {error}", spec.core));
        }
        shared.control.producer_finished(&shared.clock);
    }
    for task in consumers {
        if let Err(error) = task.await {
            fail(&shared, &outcome, format!("core {} consumer: {error}", spec.core));
        }
    }
    drop(ticker);
    let tick = std::mem::take(&mut *stats.borrow_mut());
    let _ = out.send(CoreMessage::Tick(Box::new(tick)));
    let result = std::mem::take(&mut *outcome.borrow_mut());
    let _ = out.send(CoreMessage::Done(Box::new(result)));
}

/// Records a fatal error and stops the whole run.
pub fn fail(shared: &RunShared, outcome: &Outcome, message: String) {
    outcome.borrow_mut().errors.push(message);
    shared.control.abort.store(true, Ordering::Relaxed);
}
