//! Crash safety: SIGKILL the broker at random moments while an idempotent
//! producer writes with acks=all under flush=always, 50 times. After every
//! restart the producer retries its unanswered batch with the same
//! sequence number. At the end: every acknowledged record is there exactly
//! once, offsets are dense, and nothing is duplicated.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use shardlog::client::Connection;
use shardlog::protocol::init_producer_id::{InitProducerIdRequest, InitProducerIdResponse};
use shardlog::protocol::produce::ProduceResponse;
use shardlog::protocol::record_batch::{self, encode_batch, ProducerFields, Record};
use shardlog::protocol::{ApiKey, ErrorCode};

struct Producer {
    producer_id: i64,
    next_sequence: i32,
    /// sequence -> base offset, for every acknowledged batch.
    acknowledged: BTreeMap<i32, i64>,
}

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

/// Sends one batch; `None` when the connection died before an answer.
fn send(conn: &mut Connection, producer: &Producer, sequence: i32) -> Option<(ErrorCode, i64)> {
    let request = shardlog::protocol::produce::ProduceRequest {
        transactional_id: None,
        acks: -1,
        timeout_ms: 10_000,
        topics: vec![shardlog::protocol::produce::ProduceTopic {
            name: "crash".into(),
            partitions: vec![shardlog::protocol::produce::ProducePartition {
                index: 0,
                records: Some(batch_for(producer.producer_id, sequence)),
            }],
        }],
    };
    let reader = conn.request(ApiKey::Produce, 8, |w| request.encode(w)).ok()?;
    let answer = shardlog::client::decode(reader, 8, shardlog::protocol::produce::ProduceResponse::decode).ok()?;
    let p = &answer.topics[0].partitions[0];
    Some((p.error, p.base_offset))
}

#[test]
fn fifty_kills_during_acks_all_produce_lose_and_duplicate_nothing() {
    let mut broker = Broker::start(1, &["--flush", "always"]);
    create_topic(&broker, "crash", 1, &[]);
    let mut conn = broker.connect();
    let request = InitProducerIdRequest { transactional_id: None, transaction_timeout_ms: 60_000 };
    let reader = conn.request(ApiKey::InitProducerId, 1, |w| request.encode(w, 1)).unwrap();
    let producer_id = shardlog::client::decode(reader, 1, InitProducerIdResponse::decode).unwrap().producer_id;
    let mut producer = Producer { producer_id, next_sequence: 0, acknowledged: BTreeMap::new() };
    let mut seed = 7u64;
    for round in 0..50 {
        // Retry whatever was unanswered when the broker died.
        let mut conn = broker.connect();
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let kill_after = Duration::from_millis(20 + (seed >> 33) % 150);
        let pid = broker.child.as_ref().unwrap().id() as i32;
        let killer = std::thread::spawn(move || {
            std::thread::sleep(kill_after);
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        loop {
            let sequence = producer.next_sequence;
            match send(&mut conn, &producer, sequence) {
                Some((ErrorCode::None, base_offset)) => {
                    producer.acknowledged.insert(sequence, base_offset);
                    producer.next_sequence += RECORDS_PER_BATCH;
                }
                Some((error, _)) => panic!("round {round}: produce failed with {error:?}"),
                None => break,
            }
        }
        killer.join().unwrap();
        broker.kill();
        broker.spawn();
        // The unanswered batch: retried with its sequence, it is appended now
        // or recognised as a duplicate of what the broker kept.
        let mut conn = broker.connect();
        let sequence = producer.next_sequence;
        let (error, base_offset) = send(&mut conn, &producer, sequence).expect("broker answers after restart");
        assert_eq!(error, ErrorCode::None, "round {round}");
        producer.acknowledged.insert(sequence, base_offset);
        producer.next_sequence += RECORDS_PER_BATCH;
    }
    // Read back everything.
    let mut conn = broker.connect();
    let mut offset = 0i64;
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    loop {
        let response = fetch(&mut conn, "crash", 0, offset, 0, 1);
        let p = &response.topics[0].partitions[0];
        assert_eq!(p.error, ErrorCode::None);
        if p.records.is_empty() {
            break;
        }
        for batch in &p.records {
            let header = record_batch::validate(batch, 1 << 20).unwrap();
            assert_eq!(header.base_offset, offset, "offsets are dense");
            for (i, record) in record_batch::decode_records(batch).unwrap().into_iter().enumerate() {
                let value = String::from_utf8(record.value.unwrap().to_vec()).unwrap();
                let previous = seen.insert(value.clone(), header.base_offset + i as i64);
                assert!(previous.is_none(), "{value} stored twice");
            }
            offset = header.last_offset() + 1;
        }
    }
    for (sequence, base_offset) in &producer.acknowledged {
        for i in 0..RECORDS_PER_BATCH {
            let value = format!("seq-{}", sequence + i);
            assert_eq!(seen.get(&value), Some(&(base_offset + i64::from(i))), "acknowledged {value} at its offset");
        }
    }
    assert_eq!(seen.len(), producer.acknowledged.len() * RECORDS_PER_BATCH as usize, "nothing unacknowledged either");
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
