//! One consumer client on one core. It reads its partitions by offset (no
//! consumer group: the bench assigns partitions itself), one fetch loop per
//! leader node, and for each record of this run: counts it, times it end to
//! end from the send time in its value, and with `--verify` checks its
//! sequence number.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::core::{ConsumeUntil, ConsumerSpec, Outcome, PartitionRead, RunShared, Stats};
use super::payload::ValueHeader;
use super::verify::{SequenceCheck, StreamId};
use crate::client::pipelined::{ConnectionOptions, Nodes};
use crate::protocol::fetch::{FetchPartition, FetchRequest, FetchResponse, FetchTopic, ForgottenTopic};
use crate::protocol::record_batch::{record_views, BatchHeader};
use crate::protocol::ApiKey;
use crate::protocol::ErrorCode;

/// Long-poll time of a fetch; also how late a consumer may notice the end.
const FETCH_WAIT_MS: i32 = 200;
const FETCH_BYTES_MAX: i32 = 64 * 1024 * 1024;
const PARTITION_FETCH_BYTES_MAX: i32 = 4 * 1024 * 1024;
/// End-to-end times further off than this are not ours to trust (records
/// of some other producer, or clocks far apart).
const E2E_PLAUSIBLE_US: u64 = 3_600 * 1_000_000;

pub async fn run(spec: ConsumerSpec, shared: Arc<RunShared>, stats: Stats, outcome: Outcome) -> Result<(), String> {
    let options = ConnectionOptions { in_flight: 1, ..ConnectionOptions::default() };
    let nodes = Rc::new(Nodes::new(shared.topology.nodes.clone(), options));
    let mut by_node: BTreeMap<i32, Vec<PartitionRead>> = BTreeMap::new();
    for read in spec.partitions {
        let leader =
            shared.topology.leader(read.index).ok_or_else(|| format!("partition {} has no leader", read.index))?;
        by_node.entry(leader).or_default().push(read);
    }
    let loops: Vec<_> = by_node
        .into_iter()
        .map(|(node, reads)| {
            glommio::spawn_local(fetch_loop(node, reads, nodes.clone(), shared.clone(), stats.clone(), outcome.clone()))
        })
        .collect();
    let mut result = Ok(());
    for task in loops {
        match task.await {
            Ok(seen) => outcome.borrow_mut().seen.push(seen),
            Err(error) => result = Err(error),
        }
    }
    result
}

/// Reads `reads` from their leader `node` until the run says stop.
async fn fetch_loop(
    node: i32,
    mut reads: Vec<PartitionRead>,
    nodes: Rc<Nodes>,
    shared: Arc<RunShared>,
    stats: Stats,
    outcome: Outcome,
) -> Result<HashMap<StreamId, SequenceCheck>, String> {
    let connection = nodes.node(node).await.map_err(|e| e.to_string())?;
    let version = shared.versions.fetch;
    let mut seen: HashMap<StreamId, SequenceCheck> = HashMap::new();
    let mut session = FetchSession { sessionless: !shared.workload.fetch_sessions, ..FetchSession::default() };
    // Response partitions by position in `reads` (a linear search per
    // partition made each fetch quadratic: 10,000 partitions, 50M
    // comparisons), and the positions whose offset moved since the last
    // request (a session lists only those; comparing all 10,000 each
    // fetch kept the generator's core busy).
    let positions = |reads: &[PartitionRead]| -> HashMap<i32, usize> {
        reads.iter().enumerate().map(|(at, r)| (r.index, at)).collect()
    };
    let mut position = positions(&reads);
    let mut moved: Option<Vec<usize>> = None;
    loop {
        let before = reads.len();
        reads.retain(|r| r.until.is_none_or(|until| r.offset < until));
        if reads.is_empty() || should_stop(&shared) {
            return Ok(seen);
        }
        if reads.len() != before {
            position = positions(&reads);
            moved = None;
        }
        let NextFetch { session_id, session_epoch, partitions, forgotten } = session.next(&reads, moved.as_deref());
        moved = Some(Vec::new());
        let request = FetchRequest {
            replica_id: -1,
            max_wait_ms: FETCH_WAIT_MS,
            min_bytes: 1,
            max_bytes: FETCH_BYTES_MAX,
            isolation_level: 0,
            session_id,
            session_epoch,
            topics: vec![FetchTopic { name: shared.workload.topic.clone(), partitions }],
            forgotten: if forgotten.is_empty() {
                Vec::new()
            } else {
                vec![ForgottenTopic { name: shared.workload.topic.clone(), partitions: forgotten }]
            },
            rack_id: String::new(),
        };
        let sent = Instant::now();
        let response = connection
            .call(ApiKey::Fetch, version, |w| request.encode(w, version), FetchResponse::decode)
            .await
            .map_err(|e| e.to_string())?;
        let received = Instant::now();
        session.answered(response.error, response.session_id);
        {
            let mut stats = stats.borrow_mut();
            stats.fetches += 1;
            if sent >= shared.clock.measure_from {
                stats.latencies.fetch.record(received.duration_since(sent).as_micros() as u64);
            }
        }
        let receipt_us = shared.clock.wall_us(received);
        for partition in response.topics.iter().flat_map(|t| &t.partitions) {
            if !partition.error.is_ok() {
                return Err(format!("fetch {}/{}: {:?}", shared.workload.topic, partition.index, partition.error));
            }
            let Some(&at) = position.get(&partition.index) else {
                continue;
            };
            let read = &mut reads[at];
            let offset_before = read.offset;
            let mut got_any = false;
            for batch in &partition.records {
                let header = BatchHeader::parse(batch, usize::MAX).map_err(|e| format!("fetched batch: {e}"))?;
                if header.last_offset() < read.offset {
                    continue;
                }
                if header.compression() != 0 {
                    return Err("fetched a compressed batch; the bench reads uncompressed batches only".into());
                }
                if header.is_control() {
                    read.offset = header.last_offset() + 1;
                    continue;
                }
                let records = record_views(batch).map_err(|e| format!("fetched batch: {e}"))?;
                let mut tally = Tally::default();
                for record in records {
                    let record = record.map_err(|e| format!("fetched batch: {e}"))?;
                    let offset = header.base_offset + i64::from(record.offset_delta);
                    if offset < read.offset {
                        continue;
                    }
                    let value = record.value.unwrap_or_default();
                    let bytes = (value.len() + record.key.map_or(0, <[u8]>::len)) as u64;
                    tally.observe(&shared, &mut seen, read.index, value, bytes, receipt_us);
                }
                tally.apply(&shared, &mut stats.borrow_mut());
                read.offset = header.last_offset() + 1;
                got_any = true;
            }
            if read.offset != offset_before {
                if let Some(moved) = moved.as_mut() {
                    moved.push(at);
                }
            }
            if got_any {
                let mut outcome = outcome.borrow_mut();
                outcome.last_receipt = outcome.last_receipt.max(Some(received));
                if outcome.first_receipt.is_none() {
                    outcome.first_receipt = Some(received);
                }
            }
        }
        glommio::yield_if_needed().await;
    }
}

/// What the next Fetch request says of its session.
struct NextFetch {
    session_id: i32,
    session_epoch: i32,
    /// Partitions new to the session or whose offset moved (all, when full).
    partitions: Vec<FetchPartition>,
    /// Partitions no longer read.
    forgotten: Vec<i32>,
}

/// The client side of a fetch session (KIP-227), as Kafka's Java client
/// keeps one per node: the first request lists every partition and opens
/// the session; later ones list only partitions whose fetch offset moved
/// and those no longer read. A refused session starts over in full.
#[derive(Default)]
struct FetchSession {
    /// Every request lists every partition (epoch -1), as before KIP-227.
    sessionless: bool,
    id: i32,
    /// The epoch of the next request: 0 opens a session.
    epoch: i32,
    /// Fetch offsets the session holds, by partition.
    offsets: HashMap<i32, i64>,
    /// Offsets of the request in flight, the session's once it is answered.
    pending: Vec<(i32, i64)>,
    dropped: Vec<i32>,
}

impl FetchSession {
    /// The next request's session id, epoch, partitions and forgotten ones;
    /// `moved` are the positions in `reads` whose offset may have changed
    /// since the last request (None: any may have, or `reads` changed).
    fn next(&mut self, reads: &[PartitionRead], moved: Option<&[usize]>) -> NextFetch {
        let full = self.epoch == 0 || self.sessionless;
        if full {
            self.offsets.clear();
        }
        let changed_read = |read: &PartitionRead| FetchPartition {
            index: read.index,
            current_leader_epoch: -1,
            fetch_offset: read.offset,
            log_start_offset: -1,
            partition_max_bytes: PARTITION_FETCH_BYTES_MAX,
        };
        let mut held = 0;
        let mut changed = Vec::new();
        match moved {
            Some(moved) if !full => {
                for read in moved.iter().filter_map(|&at| reads.get(at)) {
                    if self.offsets.get(&read.index) != Some(&read.offset) {
                        changed.push(changed_read(read));
                    }
                }
                held = self.offsets.len();
            }
            _ => {
                for read in reads {
                    let offset = self.offsets.get(&read.index);
                    held += usize::from(offset.is_some());
                    if offset != Some(&read.offset) {
                        changed.push(changed_read(read));
                    }
                }
            }
        }
        self.pending = changed.iter().map(|p| (p.index, p.fetch_offset)).collect();
        self.dropped.clear();
        if held < self.offsets.len() {
            let reading: std::collections::HashSet<i32> = reads.iter().map(|r| r.index).collect();
            self.dropped.extend(self.offsets.keys().filter(|index| !reading.contains(index)));
        }
        if self.sessionless {
            return NextFetch { session_id: 0, session_epoch: -1, partitions: changed, forgotten: Vec::new() };
        }
        NextFetch {
            session_id: self.id,
            session_epoch: self.epoch,
            partitions: changed,
            forgotten: self.dropped.clone(),
        }
    }

    fn answered(&mut self, error: Option<ErrorCode>, session_id: i32) {
        if self.sessionless {
            return;
        }
        let error = error.unwrap_or(ErrorCode::None);
        if !error.is_ok() || session_id == 0 || (self.epoch != 0 && session_id != self.id) {
            // Refused (evicted, wrong epoch) or not kept: start over.
            *self = Self::default();
            return;
        }
        for index in self.dropped.drain(..) {
            self.offsets.remove(&index);
        }
        self.offsets.extend(self.pending.drain(..));
        self.id = session_id;
        self.epoch = if self.epoch == i32::MAX { 1 } else { self.epoch + 1 };
    }
}

/// The counts of one batch, applied to the core's stats in one go.
#[derive(Default)]
struct Tally {
    all: (u64, u64),
    measured: (u64, u64),
    ours: u64,
    e2e_us: Vec<u64>,
}

impl Tally {
    fn observe(
        &mut self,
        shared: &RunShared,
        seen: &mut HashMap<StreamId, SequenceCheck>,
        partition: i32,
        value: &[u8],
        bytes: u64,
        receipt_us: u64,
    ) {
        self.all.0 += 1;
        self.all.1 += bytes;
        let header = ValueHeader::read(value);
        let ours = header.is_some_and(|h| h.run_id == shared.run_id);
        if shared.only_this_run && !ours {
            return;
        }
        let measured = match header {
            Some(h) if shared.time_e2e => h.sent_us >= shared.clock.measure_from_wall_us(),
            _ => true,
        };
        if measured {
            self.measured.0 += 1;
            self.measured.1 += bytes;
        }
        let Some(header) = header else { return };
        if ours {
            self.ours += 1;
            if shared.workload.verify {
                seen.entry(StreamId { producer: header.producer, partition }).or_default().observe(header.sequence);
            }
        }
        if shared.time_e2e && measured && receipt_us.abs_diff(header.sent_us) < E2E_PLAUSIBLE_US {
            self.e2e_us.push(receipt_us.saturating_sub(header.sent_us));
        }
    }

    fn apply(self, shared: &RunShared, stats: &mut super::core::Tick) {
        stats.consumed.add(self.all.0, self.all.1);
        stats.consumed_measured.add(self.measured.0, self.measured.1);
        for micros in self.e2e_us {
            stats.latencies.e2e.record(micros);
        }
        shared.control.consumed.fetch_add(self.ours, Ordering::Relaxed);
    }
}

/// Whether consumers are done, by the run's rule.
fn should_stop(shared: &RunShared) -> bool {
    let control = &shared.control;
    if control.aborted() {
        return true;
    }
    match shared.consume_until {
        ConsumeUntil::EndOffsets => false,
        ConsumeUntil::Deadline(at) => Instant::now() >= at,
        ConsumeUntil::ProducersDone { drain } => match control.producers_done_at(&shared.clock) {
            None => false,
            Some(done_at) => {
                control.consumed.load(Ordering::Relaxed) >= control.acked.load(Ordering::Relaxed)
                    || Instant::now() >= done_at + drain
            }
        },
    }
}

/// How long consumers keep reading after the producers finished, waiting
/// for records that were acknowledged but have not arrived.
pub const DRAIN: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(offsets: &[(i32, i64)]) -> Vec<PartitionRead> {
        offsets.iter().map(|&(index, offset)| PartitionRead { index, offset, until: None }).collect()
    }

    impl FetchSession {
        fn next_all(&mut self, reads: &[PartitionRead]) -> NextFetch {
            self.next(reads, None)
        }
    }

    fn listed(partitions: &[FetchPartition]) -> Vec<(i32, i64)> {
        partitions.iter().map(|p| (p.index, p.fetch_offset)).collect()
    }

    #[test]
    fn a_session_sends_everything_once_then_only_moved_and_dropped_partitions() {
        let mut session = FetchSession::default();
        let NextFetch { session_id: id, session_epoch: epoch, partitions, forgotten } =
            session.next_all(&reads(&[(0, 0), (1, 0), (2, 0)]));
        assert_eq!((id, epoch, listed(&partitions), forgotten), (0, 0, vec![(0, 0), (1, 0), (2, 0)], vec![]));
        session.answered(Some(ErrorCode::None), 77);
        let NextFetch { session_id: id, session_epoch: epoch, partitions, .. } =
            session.next_all(&reads(&[(0, 0), (1, 0), (2, 0)]));
        assert_eq!((id, epoch, listed(&partitions)), (77, 1, vec![]));
        session.answered(Some(ErrorCode::None), 77);
        let NextFetch { session_epoch: epoch, partitions, forgotten, .. } = session.next_all(&reads(&[(0, 5), (2, 0)]));
        assert_eq!((epoch, listed(&partitions), forgotten), (2, vec![(0, 5)], vec![1]));
        session.answered(Some(ErrorCode::None), 77);
        let NextFetch { session_epoch: epoch, partitions, forgotten, .. } = session.next_all(&reads(&[(0, 5), (2, 0)]));
        assert_eq!((epoch, listed(&partitions), forgotten), (3, vec![], vec![]));
        session.answered(Some(ErrorCode::None), 77);
        // Only the positions said to have moved are compared.
        let NextFetch { partitions, .. } = session.next(&reads(&[(0, 5), (2, 8)]), Some(&[1]));
        assert_eq!(listed(&partitions), vec![(2, 8)]);
    }

    #[test]
    fn a_refused_or_unkept_session_starts_over_in_full() {
        let mut session = FetchSession::default();
        session.next_all(&reads(&[(0, 0)]));
        session.answered(Some(ErrorCode::None), 9);
        session.next_all(&reads(&[(0, 3)]));
        session.answered(Some(ErrorCode::FetchSessionIdNotFound), 0);
        let NextFetch { session_id: id, session_epoch: epoch, partitions, .. } = session.next_all(&reads(&[(0, 3)]));
        assert_eq!((id, epoch, listed(&partitions)), (0, 0, vec![(0, 3)]));
        // A broker without sessions answers id 0: every request stays full.
        session.answered(Some(ErrorCode::None), 0);
        let NextFetch { session_id: id, session_epoch: epoch, partitions, .. } = session.next_all(&reads(&[(0, 3)]));
        assert_eq!((id, epoch, listed(&partitions)), (0, 0, vec![(0, 3)]));
    }
}
