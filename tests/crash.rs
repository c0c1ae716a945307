//! Crash safety: SIGKILL a 2-core broker at random moments while idempotent
//! producers write with acks=all under flush=always to four partitions with
//! 64 KiB segments and 1 MiB retention, 50 times, so that kills land on
//! segment rolls, index writes, producer snapshots, retention and group
//! commits. Only the kill may end a producer's connection, and the broker
//! must die of it. After every restart each producer retries its unanswered
//! batch with the same sequence number, and every partition is read back:
//! every acknowledged record that retention has kept is there exactly once,
//! at its acknowledged offset, offsets are dense, and nothing unacknowledged
//! is stored.

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use shardlog::client::Connection;
use shardlog::protocol::init_producer_id::{InitProducerIdRequest, InitProducerIdResponse};
use shardlog::protocol::produce::ProduceResponse;
use shardlog::protocol::record_batch::{self, encode_batch, ProducerFields, Record};
use shardlog::protocol::{ApiKey, ErrorCode};

const RECORDS_PER_BATCH: i32 = 4;

fn batch_for(producer_id: i64, sequence: i32) -> Bytes {
    let records: Vec<Record> = (0..RECORDS_PER_BATCH)
        .map(|i| Record {
            value: Some(Bytes::from(format!("seq-{}", sequence + i))),
            offset_delta: i,
            timestamp_delta: i64::from(i),
            ..Record::default()
        })
        .collect();
    encode_batch(&records, 1_000, ProducerFields { producer_id, producer_epoch: 0, base_sequence: sequence })
}

/// Partitions of the kill test, spread over the broker's two cores.
const KILL_PARTITIONS: i32 = 4;
/// Idempotent producers per partition: two writers of one log share its
/// fdatasyncs (group commit).
const PRODUCERS_PER_PARTITION: usize = 2;
const KILL_ROUNDS: u64 = 50;
/// Value bytes of each record: a batch is about 4 KiB, so a 64 KiB segment
/// rolls every 16 or so batches and kills land on rolls, index writes,
/// producer snapshots and the retention that recycles old segments.
const RECORD_VALUE_BYTES: usize = 1_000;
const SEGMENT_BYTES: &str = "65536";
/// About 16 segments per partition, a round's writes (older segments are
/// deleted or recycled), so that the check after each restart reads back
/// the round's records.
const RETENTION_BYTES: &str = "1048576";

/// A batch of `RECORDS_PER_BATCH` records keyed `{producer_id}:{sequence}`,
/// each with a `RECORD_VALUE_BYTES` value.
fn keyed_batch(producer_id: i64, sequence: i32) -> Bytes {
    let records: Vec<Record> = (0..RECORDS_PER_BATCH)
        .map(|i| Record {
            key: Some(Bytes::from(record_key(producer_id, sequence + i))),
            value: Some(Bytes::from(vec![b'v'; RECORD_VALUE_BYTES])),
            offset_delta: i,
            timestamp_delta: i64::from(i),
            ..Record::default()
        })
        .collect();
    // Stamped now: retention by time (7 days) deletes nothing; only the
    // size limit moves the log start.
    let now_ms = shardlog::log::now_ms() as i64;
    encode_batch(&records, now_ms, ProducerFields { producer_id, producer_epoch: 0, base_sequence: sequence })
}

fn record_key(producer_id: i64, sequence: i32) -> String {
    format!("{producer_id}:{sequence}")
}

/// One idempotent producer of the kill test: one batch at a time, each
/// sent after the previous answer.
struct KilledProducer {
    partition: i32,
    port: u16,
    producer_id: i64,
    next_sequence: i32,
    /// (first sequence, base offset) of the batches acknowledged since the
    /// test last took them.
    acknowledged: Vec<(i32, i64)>,
}

impl KilledProducer {
    /// Sends the batch of `next_sequence`. An answer that does not decode is
    /// an `Err` that is not a lost connection.
    fn send(&self, conn: &mut Connection) -> Result<(ErrorCode, i64), shardlog::client::ClientError> {
        let request = produce_request("crash", self.partition, keyed_batch(self.producer_id, self.next_sequence), -1);
        let reader = conn.request(ApiKey::Produce, 8, |w| request.encode(w))?;
        let answer = shardlog::client::decode(reader, 8, ProduceResponse::decode)?;
        let p = &answer.topics[0].partitions[0];
        Ok((p.error, p.base_offset))
    }

    fn acknowledged_at(&mut self, base_offset: i64) {
        self.acknowledged.push((self.next_sequence, base_offset));
        self.next_sequence += RECORDS_PER_BATCH;
    }

    /// Produces until the connection is lost, which must be the kill's doing:
    /// a connection lost before `killed` was set, an answer that does not
    /// decode, or any error answer fails the test. The batch unanswered at
    /// the kill stays `next_sequence`.
    fn run_until_killed(&mut self, conn: &mut Connection, killed: &AtomicBool, round: u64) {
        loop {
            match self.send(conn) {
                Ok((ErrorCode::None, base_offset)) => self.acknowledged_at(base_offset),
                Ok((error, _)) => panic!("round {round}: partition {}: produce failed with {error:?}", self.partition),
                Err(shardlog::client::ClientError::Io(e)) if connection_lost(&e) => {
                    assert!(
                        killed.load(Ordering::SeqCst),
                        "round {round}: partition {}: connection lost before the kill: {e}",
                        self.partition
                    );
                    return;
                }
                Err(e) => panic!("round {round}: partition {}: {e}", self.partition),
            }
        }
    }
}

/// An I/O error a client sees when its broker dies: end of stream, reset,
/// broken pipe. Not a timeout.
fn connection_lost(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted)
}

/// The records of `partition` from its log start to its high watermark, as
/// (offset, key), and the log start. Offsets are dense from the log start.
/// A read that retention overtakes (its next offset deleted under it)
/// starts over from the new log start.
fn retained_records(conn: &mut Connection, partition: i32) -> (i64, Vec<(i64, String)>) {
    'pass: for _ in 0..20 {
        let first = fetch(conn, "crash", partition, 0, 0, 1);
        let log_start = first.topics[0].partitions[0].log_start_offset;
        assert!(log_start >= 0, "partition {partition}: a log start offset");
        let mut offset = log_start;
        let mut stored = Vec::new();
        loop {
            let response = fetch(conn, "crash", partition, offset, 0, 1);
            let p = &response.topics[0].partitions[0];
            if p.error == ErrorCode::OffsetOutOfRange && p.log_start_offset > offset {
                continue 'pass;
            }
            assert_eq!(p.error, ErrorCode::None, "partition {partition}: fetch at {offset}");
            if p.records.is_empty() {
                assert_eq!(offset, p.high_watermark, "partition {partition}: read up to the high watermark");
                return (log_start, stored);
            }
            for batch in &p.records {
                let header = record_batch::validate(batch, 1 << 20).unwrap();
                assert_eq!(header.base_offset, offset, "partition {partition}: offsets are dense");
                for (i, record) in record_batch::decode_records(batch).unwrap().into_iter().enumerate() {
                    let key = String::from_utf8(record.key.unwrap().to_vec()).unwrap();
                    stored.push((header.base_offset + i as i64, key));
                }
                offset = header.last_offset() + 1;
            }
        }
    }
    panic!("partition {partition}: retention overtook every read");
}

/// After a restart: every record the partition holds, from its log start to
/// its high watermark, was acknowledged at that offset (nothing duplicated,
/// nothing unacknowledged), and every acknowledged record at or past the
/// log start is there (nothing lost; retention deletes only from the front).
/// Returns the log start.
fn check_partition(conn: &mut Connection, partition: i32, acknowledged: &BTreeMap<i64, String>, round: u64) -> i64 {
    let (log_start, stored) = retained_records(conn, partition);
    for (offset, key) in &stored {
        if acknowledged.get(offset) != Some(key) {
            let acknowledged_at: Vec<i64> = acknowledged.iter().filter(|(_, k)| *k == key).map(|(o, _)| *o).collect();
            panic!(
                "round {round}: partition {partition}: record {key} is stored at offset {offset} but acknowledged at {acknowledged_at:?}"
            );
        }
    }
    let expected: Vec<(i64, String)> = acknowledged.range(log_start..).map(|(o, k)| (*o, k.clone())).collect();
    if stored != expected {
        let missing: Vec<_> = expected.iter().filter(|e| !stored.contains(e)).take(5).collect();
        panic!(
            "round {round}: partition {partition}: {} acknowledged records from log start {log_start}, {} stored; missing {missing:?}",
            expected.len(),
            stored.len()
        );
    }
    log_start
}

/// Moves the producers' new acknowledgements into `acknowledged`: per
/// partition, offset -> key of every acknowledged record.
fn take_acknowledged(producers: &mut [KilledProducer], acknowledged: &mut [BTreeMap<i64, String>]) {
    for producer in producers {
        for (sequence, base_offset) in producer.acknowledged.drain(..) {
            for i in 0..RECORDS_PER_BATCH {
                let key = record_key(producer.producer_id, sequence + i);
                let offset = base_offset + i64::from(i);
                let earlier = acknowledged[producer.partition as usize].insert(offset, key.clone());
                assert!(earlier.is_none(), "offset {offset} acknowledged for {key} and for {earlier:?}");
            }
        }
    }
}

#[test]
fn fifty_kills_during_acks_all_produce_lose_and_duplicate_nothing() {
    let started = std::time::Instant::now();
    let mut broker = Broker::start(
        2,
        &["--flush", "always", "--segment-bytes", SEGMENT_BYTES, "--retention-bytes", RETENTION_BYTES],
    );
    create_topic(&broker, "crash", KILL_PARTITIONS, &[]);
    let mut conn = broker.connect();
    let mut producers: Vec<KilledProducer> = (0..KILL_PARTITIONS as usize * PRODUCERS_PER_PARTITION)
        .map(|n| {
            let partition = (n % KILL_PARTITIONS as usize) as i32;
            let request = InitProducerIdRequest { transactional_id: None, transaction_timeout_ms: 60_000 };
            let reader = conn.request(ApiKey::InitProducerId, 1, |w| request.encode(w, 1)).unwrap();
            let producer_id = shardlog::client::decode(reader, 1, InitProducerIdResponse::decode).unwrap().producer_id;
            let port = leader_port(&broker, "crash", partition);
            KilledProducer { partition, port, producer_id, next_sequence: 0, acknowledged: Vec::new() }
        })
        .collect();
    let ports: std::collections::BTreeSet<u16> = producers.iter().map(|p| p.port).collect();
    assert_eq!(ports.len(), 2, "the partitions are led by both cores");
    // Per partition: offset -> key of every acknowledged record.
    let mut acknowledged: Vec<BTreeMap<i64, String>> = vec![BTreeMap::new(); KILL_PARTITIONS as usize];
    let mut seed = 7u64;
    let mut log_starts = vec![0i64; KILL_PARTITIONS as usize];
    let mut snapshots: Vec<Option<std::time::SystemTime>> = vec![None; KILL_PARTITIONS as usize];
    let mut snapshots_written = 0;
    for round in 0..KILL_ROUNDS {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let kill_after = Duration::from_millis(30 + (seed >> 33) % 770);
        let killed = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = producers
            .drain(..)
            .map(|mut producer| {
                let mut conn = broker.connect_port(producer.port);
                let killed = killed.clone();
                std::thread::spawn(move || {
                    producer.run_until_killed(&mut conn, &killed, round);
                    producer
                })
            })
            .collect();
        let mut child = broker.child.take().expect("a running broker");
        let killer = {
            let killed = killed.clone();
            std::thread::spawn(move || {
                std::thread::sleep(kill_after);
                let exited_before = child.try_wait().expect("try_wait");
                if exited_before.is_none() {
                    killed.store(true, Ordering::SeqCst);
                    child.kill().expect("SIGKILL");
                }
                (exited_before, child.wait().expect("wait"))
            })
        };
        let (exited_before, status) = killer.join().unwrap();
        assert_eq!(exited_before, None, "round {round}: the broker exited before the kill");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "round {round}: the broker died of the kill: {status}");
        producers = workers.into_iter().map(|w| w.join().unwrap()).collect();
        broker.spawn();
        // The batches unanswered at the kill, retried with their sequences:
        // appended now, or recognised as what the broker kept.
        for producer in &mut producers {
            let mut conn = broker.connect_port(producer.port);
            match producer.send(&mut conn) {
                Ok((ErrorCode::None, base_offset)) => producer.acknowledged_at(base_offset),
                other => {
                    panic!("round {round}: partition {}: the retry after the restart: {other:?}", producer.partition)
                }
            }
        }
        take_acknowledged(&mut producers, &mut acknowledged);
        for partition in 0..KILL_PARTITIONS {
            let port = producers.iter().find(|p| p.partition == partition).unwrap().port;
            let mut conn = broker.connect_port(port);
            log_starts[partition as usize] =
                check_partition(&mut conn, partition, &acknowledged[partition as usize], round);
            let snapshot = broker.data_dir().join(format!("crash-{partition}/producers"));
            let written = std::fs::metadata(snapshot).and_then(|m| m.modified()).ok();
            if written.is_some() && written != snapshots[partition as usize] {
                snapshots_written += 1;
                snapshots[partition as usize] = written;
            }
        }
    }
    let records: usize = acknowledged.iter().map(BTreeMap::len).sum();
    eprintln!(
        "{KILL_ROUNDS} kills in {:?}: {records} records acknowledged, log starts now {log_starts:?}, \
         {snapshots_written} producer snapshots written",
        started.elapsed()
    );
    // What the kills could land on: retention moved every log start, and
    // rolls were followed by producer snapshots.
    assert!(log_starts.iter().all(|start| *start > 0), "retention deleted segments: {log_starts:?}");
    assert!(snapshots_written > 0, "producer snapshots were written");
}

/// One idempotent producer on one partition, pipelining up to five batches
/// on its connection as librdkafka does; a batch unanswered when the
/// connection dies is sent again, with its sequence, after the restart.
struct PipelinedProducer {
    partition: i32,
    producer_id: i64,
    /// First sequence of the oldest batch not yet acknowledged.
    next_unacknowledged: i32,
}

impl PipelinedProducer {
    /// Produces until the connection dies or `rounds` batches are answered;
    /// returns how many were acknowledged. Any answer but success, or
    /// NOT_LEADER_OR_FOLLOWER from a partition closing for shutdown, fails.
    fn run(&mut self, conn: &mut Connection, rounds: usize) -> usize {
        use std::collections::VecDeque;
        let mut in_flight: VecDeque<(i32, i32)> = VecDeque::new();
        let mut next_sequence = self.next_unacknowledged;
        let mut correlation = 0;
        let mut acknowledged = 0;
        loop {
            // Up to five in flight, and a pause before each send once
            // answers come (as a producer's linger), so that the broker
            // sees idle moments between requests, as it does in life.
            if !in_flight.is_empty() {
                std::thread::sleep(Duration::from_millis(2));
            }
            while in_flight.len() < 5 && acknowledged + in_flight.len() < rounds {
                correlation += 1;
                let request = produce_request("term", self.partition, batch_for(self.producer_id, next_sequence), -1);
                let frame = request_frame(ApiKey::Produce as i16, 8, correlation, |w| request.encode(w));
                if conn.send_raw(&frame).is_err() {
                    return acknowledged;
                }
                in_flight.push_back((correlation, next_sequence));
                next_sequence += RECORDS_PER_BATCH;
            }
            let Some((expected, sequence)) = in_flight.pop_front() else { return acknowledged };
            let Ok(frame) = conn.read_frame() else { return acknowledged };
            let mut reader = shardlog::protocol::wire::Reader::new(frame);
            assert_eq!(reader.i32().unwrap(), expected, "answers in order");
            let answer = shardlog::client::decode(reader, 8, ProduceResponse::decode).unwrap();
            let p = &answer.topics[0].partitions[0];
            match p.error {
                ErrorCode::None => {
                    assert_eq!(sequence, self.next_unacknowledged, "acknowledged in sequence order");
                    self.next_unacknowledged += RECORDS_PER_BATCH;
                    acknowledged += 1;
                }
                // The partition closed for the shutdown: retried after it.
                ErrorCode::NotLeaderOrFollower => return acknowledged,
                other => panic!("partition {}: produce of sequence {sequence} failed with {other:?}", self.partition),
            }
        }
    }
}

/// The producer state a partition's snapshot holds, and what a replay of
/// the partition's whole log rebuilds, read from its directory.
fn snapshot_and_replay(dir: std::path::PathBuf) -> (Option<i64>, i64, ProducerState, ProducerState) {
    use shardlog::log::{Log, LogConfig};
    use shardlog::shard::partition::Partition;
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(move || async move {
            let (log, report) = Log::open(&dir, LogConfig::default()).await.unwrap();
            assert!(report.clean_shutdown, "{}: SIGTERM closes cleanly", dir.display());
            let partition = Partition::new("term".into(), 0, log.clone());
            let (offset, snapshot) =
                partition.read_snapshot().await.map_or((None, ProducerState::new()), |(o, s)| (Some(o), s));
            partition.replay_whole_log().await.unwrap();
            let end = log.log_end_offset();
            let replayed = partition.producer_state();
            log.close().await.unwrap();
            (offset, end, snapshot, replayed)
        })
        .unwrap()
        .join()
        .unwrap()
}

use shardlog::shard::partition::ProducerState;

#[test]
fn sigterm_under_load_leaves_a_producer_snapshot_as_whole_as_the_log() {
    let mut broker = Broker::start(1, &["--flush", "always"]);
    create_topic(&broker, "term", 3, &[]);
    let mut conn = broker.connect();
    // Several producers per partition: each connection may carry one last
    // request into the shutdown, and any of them landing after the
    // snapshot was taken, before the log closed, made it stale.
    let mut producers: Vec<PipelinedProducer> = (0..12)
        .map(|n| {
            let request = InitProducerIdRequest { transactional_id: None, transaction_timeout_ms: 60_000 };
            let reader = conn.request(ApiKey::InitProducerId, 1, |w| request.encode(w, 1)).unwrap();
            let producer_id = shardlog::client::decode(reader, 1, InitProducerIdResponse::decode).unwrap().producer_id;
            PipelinedProducer { partition: n % 3, producer_id, next_unacknowledged: 0 }
        })
        .collect();
    let mut seed = 11u64;
    for round in 0..10 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let stop_after = Duration::from_millis(150 + (seed >> 33) % 400);
        let pid = broker.child.as_ref().unwrap().id() as i32;
        let workers: Vec<_> = producers
            .drain(..)
            .map(|mut producer| {
                let mut conn = broker.connect();
                std::thread::spawn(move || {
                    producer.run(&mut conn, usize::MAX);
                    producer
                })
            })
            .collect();
        std::thread::sleep(stop_after);
        unsafe { libc::kill(pid, libc::SIGTERM) };
        producers = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let status = broker.child.take().unwrap().wait().unwrap();
        assert_eq!(status.code(), Some(0), "round {round}: a clean exit");
        for partition in 0..3 {
            let dir = broker.data_dir().join(format!("term-{partition}"));
            let (offset, end, snapshot, replayed) = snapshot_and_replay(dir);
            if !replayed.is_empty() {
                assert_eq!(offset, Some(end), "round {round}: the snapshot covers the whole log");
                assert_eq!(snapshot, replayed, "round {round}: the snapshot is what a replay rebuilds");
            }
        }
        broker.spawn();
        // The producers go on where they stopped, the unanswered batches
        // first, each acknowledged (appended now, or a duplicate).
        for producer in &mut producers {
            let mut conn = broker.connect();
            assert_eq!(producer.run(&mut conn, 20), 20, "round {round}: the producer goes on after the restart");
        }
    }
}

/// A producer whose answer was lost retries its batch after a kill -9 that
/// came just after a segment roll (before the next maintenance pass wrote a
/// producer snapshot): the retry must be recognised, not stored again. The
/// restart used to replay only the active segment, forget the batch left in
/// the rolled one and append the retry a second time; now the first
/// idempotent batch leaves a snapshot the replay starts from.
#[test]
fn a_retry_after_a_kill_just_past_a_roll_is_not_stored_twice() {
    let mut broker = Broker::start(1, &["--flush", "always", "--segment-bytes", SEGMENT_BYTES]);
    create_topic(&broker, "crash", 1, &[]);
    let port = broker.port;
    let mut conn = broker.connect();
    let mut new_producer = || {
        let request = InitProducerIdRequest { transactional_id: None, transaction_timeout_ms: 60_000 };
        let reader = conn.request(ApiKey::InitProducerId, 1, |w| request.encode(w, 1)).unwrap();
        let producer_id = shardlog::client::decode(reader, 1, InitProducerIdResponse::decode).unwrap().producer_id;
        KilledProducer { partition: 0, port, producer_id, next_sequence: 0, acknowledged: Vec::new() }
    };
    let (first, mut second) = (new_producer(), new_producer());
    let mut conn = broker.connect();
    // The first producer's batch is acknowledged; say its answer was lost.
    assert_eq!(first.send(&mut conn).unwrap(), (ErrorCode::None, 0));
    // The second fills the segment: the next roll leaves that batch behind.
    while second.acknowledged.last().is_none_or(|(_, base)| *base < 100) {
        let (error, base_offset) = second.send(&mut conn).unwrap();
        assert_eq!(error, ErrorCode::None);
        second.acknowledged_at(base_offset);
    }
    broker.kill();
    broker.spawn();
    let mut conn = broker.connect();
    assert_eq!(first.send(&mut conn).unwrap(), (ErrorCode::None, 0), "the retry is answered as the batch it repeats");
}
