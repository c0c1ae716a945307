//! The broker as a real process, spoken to over real sockets with the
//! crate's own client: protocol traps, durability across restarts and
//! crashes, idempotence, long polls, and both listener modes.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use shardlog::protocol::api_versions::ApiVersionsRequest;
use shardlog::protocol::init_producer_id::{InitProducerIdRequest, InitProducerIdResponse};
use shardlog::protocol::list_offsets::{
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsResponse, ListOffsetsTopic,
};
use shardlog::protocol::metadata::{MetadataRequest, MetadataResponse};
use shardlog::protocol::record_batch::{self, encode_batch, ProducerFields};
use shardlog::protocol::{ApiKey, ErrorCode, Reader, Writer};

fn read_batches(conn: &mut shardlog::client::Connection, topic: &str, partition: i32) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let response = fetch(conn, topic, partition, offset, 0, 1);
        let p = &response.topics[0].partitions[0];
        assert_eq!(p.error, ErrorCode::None);
        if p.records.is_empty() {
            return out;
        }
        for batch in &p.records {
            let header = record_batch::validate(batch, 1 << 20).expect("valid batch");
            offset = header.last_offset() + 1;
            out.push(batch.clone());
        }
    }
}

fn values(batches: &[Bytes]) -> Vec<Bytes> {
    batches
        .iter()
        .flat_map(|b| record_batch::decode_records(b).expect("records"))
        .map(|r| r.value.expect("value"))
        .collect()
}

#[test]
fn api_versions_unsupported_version_gets_error_35_in_v0_layout() {
    let broker = Broker::start(1, &[]);
    let mut conn = broker.connect();
    let mut w = Writer::new();
    w.i16(ApiKey::ApiVersions as i16);
    w.i16(99);
    w.i32(42);
    w.nullable_string(Some("test"));
    conn.send_frame(w.into_bytes()).unwrap();
    let mut r = Reader::new(conn.read_frame().unwrap());
    assert_eq!(r.i32().unwrap(), 42);
    assert_eq!(r.i16().unwrap(), ErrorCode::UnsupportedVersion.code());
    let count = r.array_len(6).unwrap();
    assert!(count >= 5, "the key list comes with the error");
    let mut keys = Vec::new();
    for _ in 0..count {
        keys.push((r.i16().unwrap(), r.i16().unwrap(), r.i16().unwrap()));
    }
    assert!(keys.contains(&(ApiKey::ApiVersions as i16, 0, 3)));
    assert_eq!(r.remaining(), 0, "v0 layout: no throttle time");
}

#[test]
fn api_versions_v3_response_header_is_v0() {
    let broker = Broker::start(1, &[]);
    let mut conn = broker.connect();
    let mut w = Writer::new();
    w.i16(ApiKey::ApiVersions as i16);
    w.i16(3);
    w.i32(7);
    w.nullable_string(Some("test"));
    w.tagged_fields_v(true);
    w.compact_nullable_string(Some("shardlog-test"));
    w.compact_nullable_string(Some("1.0"));
    w.tagged_fields_v(true);
    conn.send_frame(w.into_bytes()).unwrap();
    let mut r = Reader::new(conn.read_frame().unwrap());
    assert_eq!(r.i32().unwrap(), 7);
    // Straight into the body: error code, no tagged fields in the header.
    assert_eq!(r.i16().unwrap(), 0);
    let count = r.compact_array_len(7).unwrap();
    assert!(count >= 14);
    let _ = ApiVersionsRequest::default();
}

#[test]
fn responses_come_back_in_request_order_and_acks_zero_gets_none() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "order", 1, &[]);
    let mut conn = broker.connect();
    // 1: a long poll that waits 400 ms; 2: acks=0 produce; 3: ApiVersions.
    let fetch_body = |w: &mut Writer| {
        shardlog::protocol::fetch::FetchRequest {
            replica_id: -1,
            max_wait_ms: 400,
            min_bytes: 1 << 20,
            max_bytes: 1 << 20,
            isolation_level: 0,
            session_id: 0,
            session_epoch: -1,
            topics: vec![shardlog::protocol::fetch::FetchTopic {
                name: "order".into(),
                partitions: vec![shardlog::protocol::fetch::FetchPartition {
                    index: 0,
                    current_leader_epoch: -1,
                    fetch_offset: 0,
                    log_start_offset: -1,
                    partition_max_bytes: 1 << 20,
                }],
            }],
            forgotten: Vec::new(),
            rack_id: String::new(),
        }
        .encode(w, 11)
    };
    let frame = |api: ApiKey, version: i16, correlation: i32, body: &dyn Fn(&mut Writer)| {
        let mut w = Writer::new();
        w.i16(api as i16);
        w.i16(version);
        w.i32(correlation);
        w.nullable_string(None);
        body(&mut w);
        w.into_bytes()
    };
    let started = Instant::now();
    conn.send_frame(frame(ApiKey::Fetch, 11, 1, &fetch_body)).unwrap();
    let produce_body = |w: &mut Writer| produce_request("order", 0, batch("z", 3), 0).encode(w);
    conn.send_frame(frame(ApiKey::Produce, 8, 2, &produce_body)).unwrap();
    conn.send_frame(frame(ApiKey::ApiVersions, 2, 3, &|_| {})).unwrap();
    let first = Reader::new(conn.read_frame().unwrap()).i32().unwrap();
    let second = Reader::new(conn.read_frame().unwrap()).i32().unwrap();
    assert_eq!((first, second), (1, 3), "in request order, nothing for acks=0");
    assert!(started.elapsed() >= Duration::from_millis(350), "the fetch long-polled");
    let stored = read_batches(&mut conn, "order", 0);
    assert_eq!(values(&stored).len(), 3, "the acks=0 records were appended");
}

/// Produce requests of 1 byte to 100 KiB of records, pipelined on one
/// connection and written in pieces that split size prefixes and bodies at
/// every kind of boundary (a prefix in parts, a body in parts, several
/// frames in one piece), are all answered in order and stored byte for
/// byte.
#[test]
fn pipelined_requests_split_at_odd_boundaries_arrive_whole() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "pipe", 1, &[]);
    let mut conn = broker.connect();
    let value_sizes = [1usize, 20 << 10, 32 << 10, 33 << 10, 100 << 10, 7, 32_700, 64 << 10];
    let requests = 48;
    let mut sent_values = Vec::new();
    let mut stream = Vec::new();
    for correlation in 1..=requests {
        let size = value_sizes[correlation as usize % value_sizes.len()];
        let value = Bytes::from((0..size).map(|i| (i * 7 + correlation as usize) as u8).collect::<Vec<u8>>());
        sent_values.push(value.clone());
        let record = shardlog::protocol::record_batch::Record { value: Some(value), ..Default::default() };
        let request = produce_request("pipe", 0, encode_batch(&[record], 1, ProducerFields::NONE), 1);
        stream.extend(request_frame(ApiKey::Produce as i16, 8, correlation, |w| request.encode(w)));
    }
    let pieces = [1usize, 2, 3, 4093, 32 << 10, 70_000, 5, 40_000];
    let mut at = 0;
    for (i, piece) in pieces.iter().cycle().enumerate() {
        if at == stream.len() {
            break;
        }
        let end = (at + piece).min(stream.len());
        conn.send_raw(&stream[at..end]).unwrap();
        at = end;
        if i % 3 == 0 {
            // Let the broker read what is there, so the next piece starts a new read.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    for correlation in 1..=requests {
        let mut reader = read_answer(&mut conn, correlation);
        let response = shardlog::protocol::produce::ProduceResponse::decode(&mut reader, 8).unwrap();
        let partition = &response.topics[0].partitions[0];
        assert_eq!(partition.error, ErrorCode::None, "request {correlation}");
        assert_eq!(partition.base_offset, correlation as i64 - 1, "request {correlation}");
    }
    assert!(values(&read_batches(&mut conn, "pipe", 0)) == sent_values, "every value stored byte for byte");
}

/// Fetch answers of hundreds of batches each, pipelined on one connection
/// and read only once the whole pipeline is sent (so the broker's sends
/// fill the socket and wait for room), arrive whole and in request order;
/// the frame behind them that the broker cannot parse closes the
/// connection only after every answer before it is out.
#[test]
fn pipelined_large_answers_arrive_whole_before_a_bad_frame_closes() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "gather", 1, &[]);
    let mut conn = broker.connect();
    for i in 0..400usize {
        let value = Bytes::from((0..4096).map(|j| (i * 13 + j) as u8).collect::<Vec<u8>>());
        let record = shardlog::protocol::record_batch::Record { value: Some(value), ..Default::default() };
        let response = produce(&mut conn, "gather", 0, encode_batch(&[record], 1, ProducerFields::NONE), 1);
        assert_eq!(response.topics[0].partitions[0].error, ErrorCode::None);
    }
    let stored = read_batches(&mut conn, "gather", 0);
    assert_eq!(stored.len(), 400);
    let fetches = 30i32;
    let mut stream = Vec::new();
    for correlation in 1..=fetches {
        let request = fetch_request("gather", 0, i64::from(correlation) * 10, 0, 1);
        stream.extend(request_frame(ApiKey::Fetch as i16, 11, correlation, |w| request.encode(w, 11)));
    }
    // An API key no Kafka has: the broker closes the connection.
    stream.extend(request_frame(999, 0, fetches + 1, |_| {}));
    conn.send_raw(&stream).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for correlation in 1..=fetches {
        let mut reader = read_answer(&mut conn, correlation);
        let response = shardlog::protocol::fetch::FetchResponse::decode(&mut reader, 11).unwrap();
        let partition = &response.topics[0].partitions[0];
        assert_eq!(partition.error, ErrorCode::None, "fetch {correlation}");
        let from = correlation as usize * 10;
        assert_eq!(partition.records.len(), 400 - from, "fetch {correlation} has every batch from its offset");
        assert!(partition.records == stored[from..], "fetch {correlation} byte for byte");
    }
    assert!(conn.read_frame().is_err(), "the connection closes after the bad frame");
}

#[test]
fn metadata_lists_one_node_per_core_and_a_live_controller() {
    let broker = Broker::start(2, &[]);
    create_topic(&broker, "spread", 4, &[]);
    let mut conn = broker.connect();
    let request = MetadataRequest { topics: Some(vec!["spread".into()]), allow_auto_topic_creation: false };
    let reader = conn.request(ApiKey::Metadata, 8, |w| request.encode(w, 8)).unwrap();
    let metadata = shardlog::client::decode(reader, 8, MetadataResponse::decode).unwrap();
    assert_eq!(metadata.brokers.len(), 2);
    assert!(metadata.brokers.iter().any(|b| b.node_id == metadata.controller_id));
    let leaders: std::collections::BTreeSet<i32> = metadata.topics[0].partitions.iter().map(|p| p.leader_id).collect();
    assert_eq!(leaders.len(), 2, "partitions spread over both cores");
}

#[test]
fn requests_queued_behind_a_bad_one_do_not_hold_up_shutdown() {
    use std::io::Write;
    let mut broker = Broker::start(1, &[]);
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
    // v0 request headers with no body: an unknown API (the broker closes
    // the connection), then 30 ApiVersions v0 read behind it.
    let frame = |api_key: i16, correlation_id: i32| {
        let mut header = Vec::new();
        header.extend_from_slice(&api_key.to_be_bytes());
        header.extend_from_slice(&0i16.to_be_bytes());
        header.extend_from_slice(&correlation_id.to_be_bytes());
        header.extend_from_slice(&(-1i16).to_be_bytes());
        let mut frame = (header.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(&header);
        frame
    };
    let mut data = frame(999, 1);
    for i in 0..30 {
        data.extend(frame(ApiKey::ApiVersions as i16, 2 + i));
    }
    conn.write_all(&data).unwrap();
    let mut answer = Vec::new();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    conn.read_to_end(&mut answer).unwrap();
    assert!(answer.is_empty(), "the bad request closes the connection before any answer");
    // The client keeps its end open: the broker's reader still waits on it.
    let started = Instant::now();
    assert_eq!(broker.stop(), 0);
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "shutdown waited {took:?} for requests that will never be answered");
    drop(conn);
}

#[test]
fn restart_keeps_every_acknowledged_record() {
    let mut broker = Broker::start(2, &[]);
    create_topic(&broker, "durable", 4, &[]);
    let mut sent = vec![Vec::new(); 4];
    for partition in 0..4 {
        let mut conn = broker.connect_port(leader_port(&broker, "durable", partition));
        for round in 0..20 {
            let data = batch(&format!("p{partition}-r{round}"), 5);
            let answer = produce(&mut conn, "durable", partition, data, -1);
            assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
            sent[partition as usize].extend(values(&[batch(&format!("p{partition}-r{round}"), 5)]));
        }
    }
    broker.restart();
    for partition in 0..4 {
        let mut conn = broker.connect_port(leader_port(&broker, "durable", partition));
        assert_eq!(values(&read_batches(&mut conn, "durable", partition)), sent[partition as usize]);
    }
}

/// Bytes the process (and its io_uring workers) had the block layer read.
fn storage_read_bytes(broker: &Broker) -> u64 {
    let pid = broker.child.as_ref().expect("broker running").id();
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("/proc/PID/io");
    io.lines().find_map(|line| line.strip_prefix("read_bytes: ")).expect("read_bytes").trim().parse().unwrap()
}

#[test]
fn a_clean_restart_reads_no_log_data_and_a_crash_restart_scans_the_active_segment() {
    let mut broker = Broker::start(1, &[]);
    create_topic(&broker, "quiet", 1, &[]);
    let mut conn = broker.connect();
    for round in 0..80 {
        let answer = produce(&mut conn, "quiet", 0, batch(&format!("round-{round}"), 1000), -1);
        assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
    }
    let segment_bytes: u64 = std::fs::read_dir(broker.data_dir().join("quiet-0"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some("log".as_ref()))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(segment_bytes > 2 << 20, "{segment_bytes} bytes written");
    // The clean stop recorded where the segment ends and the producer state
    // (none): the start reads at most the last page and the index.
    broker.restart();
    let clean = storage_read_bytes(&broker);
    assert!(clean < 64 << 10, "a clean restart read {clean} bytes");
    // After a kill -9 the active segment is scanned and replayed.
    broker.kill();
    broker.spawn();
    let crashed = storage_read_bytes(&broker);
    assert!(crashed > segment_bytes, "a crash restart read {crashed} of {segment_bytes} bytes");
    let mut conn = broker.connect();
    assert_eq!(values(&read_batches(&mut conn, "quiet", 0)).len(), 80_000);
}

#[test]
fn kill_nine_keeps_records_acknowledged_under_flush_always() {
    let mut broker = Broker::start(1, &[]);
    create_topic(&broker, "crash", 1, &[]);
    let mut conn = broker.connect();
    let mut acknowledged = Vec::new();
    for round in 0..50 {
        let data = batch(&format!("r{round}"), 4);
        let answer = produce(&mut conn, "crash", 0, data.clone(), -1);
        assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
        acknowledged.extend(values(&[data]));
    }
    broker.kill();
    broker.spawn();
    let mut conn = broker.connect();
    assert_eq!(values(&read_batches(&mut conn, "crash", 0)), acknowledged);
}

#[test]
fn fetch_returns_whole_batch_above_max_bytes() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "big", 1, &[]);
    let mut conn = broker.connect();
    let data = batch("big", 2000);
    assert!(data.len() > 30_000);
    produce(&mut conn, "big", 0, data.clone(), 1);
    let request = shardlog::protocol::fetch::FetchRequest {
        replica_id: -1,
        max_wait_ms: 0,
        min_bytes: 1,
        max_bytes: 100,
        isolation_level: 0,
        session_id: 0,
        session_epoch: -1,
        topics: vec![shardlog::protocol::fetch::FetchTopic {
            name: "big".into(),
            partitions: vec![shardlog::protocol::fetch::FetchPartition {
                index: 0,
                current_leader_epoch: -1,
                fetch_offset: 0,
                log_start_offset: -1,
                partition_max_bytes: 100,
            }],
        }],
        forgotten: Vec::new(),
        rack_id: String::new(),
    };
    let reader = conn.request(ApiKey::Fetch, 11, |w| request.encode(w, 11)).unwrap();
    let response = shardlog::client::decode(reader, 11, shardlog::protocol::fetch::FetchResponse::decode).unwrap();
    let records = &response.topics[0].partitions[0].records;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].len(), data.len());
}

/// One Fetch v11 on a session: `changed` partitions at their offsets, and
/// `forgotten` ones, of topic `topic`.
fn session_fetch(
    conn: &mut shardlog::client::Connection,
    session: (i32, i32),
    topic: &str,
    changed: &[(i32, i64)],
    forgotten: &[i32],
    max_wait_ms: i32,
) -> shardlog::protocol::fetch::FetchResponse {
    use shardlog::protocol::fetch::{FetchPartition, FetchRequest, FetchResponse, FetchTopic, ForgottenTopic};
    let request = FetchRequest {
        replica_id: -1,
        max_wait_ms,
        min_bytes: 1,
        max_bytes: 50 << 20,
        isolation_level: 0,
        session_id: session.0,
        session_epoch: session.1,
        topics: vec![FetchTopic {
            name: topic.into(),
            partitions: changed
                .iter()
                .map(|&(index, fetch_offset)| FetchPartition {
                    index,
                    current_leader_epoch: -1,
                    fetch_offset,
                    log_start_offset: -1,
                    partition_max_bytes: 1 << 20,
                })
                .collect(),
        }],
        forgotten: vec![ForgottenTopic { name: topic.into(), partitions: forgotten.to_vec() }],
        rack_id: String::new(),
    };
    let reader = conn.request(ApiKey::Fetch, 11, |w| request.encode(w, 11)).expect("fetch");
    shardlog::client::decode(reader, 11, FetchResponse::decode).expect("decode fetch")
}

/// (partition, record batches, high watermark) of each partition answered.
fn answered(response: &shardlog::protocol::fetch::FetchResponse) -> Vec<(i32, usize, i64)> {
    response.topics.iter().flat_map(|t| &t.partitions).map(|p| (p.index, p.records.len(), p.high_watermark)).collect()
}

#[test]
fn fetch_sessions_answer_only_changed_partitions_and_refuse_stale_epochs() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "sessions", 3, &[]);
    let mut conn = broker.connect();
    let all = [(0, 0), (1, 0), (2, 0)];
    let full = session_fetch(&mut conn, (0, 0), "sessions", &all, &[], 0);
    assert_eq!(full.error, Some(ErrorCode::None));
    let id = full.session_id;
    assert_ne!(id, 0, "a full fetch at epoch 0 opens a session");
    assert_eq!(answered(&full), vec![(0, 0, 0), (1, 0, 0), (2, 0, 0)]);

    let quiet = session_fetch(&mut conn, (id, 1), "sessions", &[], &[], 0);
    assert_eq!((quiet.error, quiet.session_id), (Some(ErrorCode::None), id));
    assert_eq!(answered(&quiet), vec![], "nothing changed, nothing listed");

    produce(&mut conn, "sessions", 1, batch("s", 3), 1);
    let news = session_fetch(&mut conn, (id, 2), "sessions", &[], &[], 5_000);
    assert_eq!(answered(&news), vec![(1, 1, 3)], "only the partition with new records");

    // The client moves partition 1 on and forgets partition 2.
    let moved = session_fetch(&mut conn, (id, 3), "sessions", &[(1, 3)], &[2], 0);
    assert_eq!(answered(&moved), vec![], "partition 1 at its end, with the high watermark already sent");
    produce(&mut conn, "sessions", 2, batch("f", 2), 1);
    let forgotten = session_fetch(&mut conn, (id, 4), "sessions", &[], &[], 0);
    assert_eq!(answered(&forgotten), vec![], "a forgotten partition is no longer read");
    produce(&mut conn, "sessions", 0, batch("z", 4), 1);
    let zero = session_fetch(&mut conn, (id, 5), "sessions", &[], &[], 5_000);
    assert_eq!(answered(&zero), vec![(0, 1, 4)]);

    let stale = session_fetch(&mut conn, (id, 5), "sessions", &[], &[], 0);
    assert_eq!((stale.error, stale.session_id), (Some(ErrorCode::InvalidFetchSessionEpoch), 0));
    assert!(stale.topics.is_empty());
    let other = if id == i32::MAX { 1 } else { id + 1 };
    let unknown = session_fetch(&mut conn, (other, 1), "sessions", &[], &[], 0);
    assert_eq!(unknown.error, Some(ErrorCode::FetchSessionIdNotFound));

    // Epoch -1 closes the session and answers in full, without one.
    let closing = session_fetch(&mut conn, (id, -1), "sessions", &[(2, 0)], &[], 0);
    assert_eq!((closing.error, closing.session_id), (Some(ErrorCode::None), 0));
    assert_eq!(answered(&closing), vec![(2, 1, 2)]);
    let closed = session_fetch(&mut conn, (id, 6), "sessions", &[], &[], 0);
    assert_eq!(closed.error, Some(ErrorCode::FetchSessionIdNotFound));
}

#[test]
fn an_incremental_fetch_long_polls_for_new_records_and_reports_a_moved_log_start() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "session-poll", 2, &[]);
    let mut conn = broker.connect();
    let full = session_fetch(&mut conn, (0, 0), "session-poll", &[(0, 0), (1, 0)], &[], 0);
    let id = full.session_id;
    assert_ne!(id, 0);
    let port = broker.port;
    let producer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut conn = shardlog::client::Connection::connect(("127.0.0.1", port), Duration::from_secs(5)).unwrap();
        produce(&mut conn, "session-poll", 1, batch("late", 5), 1);
    });
    let started = Instant::now();
    let waited_for = session_fetch(&mut conn, (id, 1), "session-poll", &[], &[], 10_000);
    let waited = started.elapsed();
    producer.join().unwrap();
    assert_eq!(answered(&waited_for), vec![(1, 1, 5)]);
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "waited {waited:?}");

    let caught_up = session_fetch(&mut conn, (id, 2), "session-poll", &[(1, 5)], &[], 0);
    assert_eq!(answered(&caught_up), vec![]);
    // DeleteRecords moves partition 1's log start up to the client's
    // offset: no records, the same high watermark, and still news.
    assert_eq!(delete_records(&mut broker.connect(), "session-poll", 1, 5), 5);
    let moved = session_fetch(&mut conn, (id, 3), "session-poll", &[], &[], 0);
    let partitions: Vec<_> = moved.topics.iter().flat_map(|t| &t.partitions).collect();
    assert_eq!(partitions.len(), 1, "{moved:?}");
    let p = partitions[0];
    assert_eq!((p.index, p.error, p.log_start_offset, p.high_watermark), (1, ErrorCode::None, 5, 5));
}

#[test]
fn fetch_long_poll_returns_as_soon_as_data_arrives() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "poll", 1, &[]);
    let port = broker.port;
    let producer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut conn = shardlog::client::Connection::connect(("127.0.0.1", port), Duration::from_secs(5)).unwrap();
        produce(&mut conn, "poll", 0, batch("late", 1), 1);
    });
    let mut conn = broker.connect();
    let started = Instant::now();
    let response = fetch(&mut conn, "poll", 0, 0, 10_000, 1);
    let waited = started.elapsed();
    producer.join().unwrap();
    assert_eq!(response.topics[0].partitions[0].records.len(), 1);
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "waited {waited:?}");
}

#[test]
fn a_sessionless_long_poll_over_many_partitions_answers_all_of_them_when_one_gets_data() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "poll-many", 50, &[]);
    let mut conn = broker.connect();
    produce(&mut conn, "poll-many", 7, batch("early", 2), 1);
    let port = broker.port;
    let producer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut conn = shardlog::client::Connection::connect(("127.0.0.1", port), Duration::from_secs(5)).unwrap();
        produce(&mut conn, "poll-many", 31, batch("late", 3), 1);
    });
    // Every partition from its end (7 at 2), so only the late batch is new.
    let all: Vec<(i32, i64)> = (0..50).map(|p| (p, if p == 7 { 2 } else { 0 })).collect();
    let started = Instant::now();
    let response = session_fetch(&mut conn, (0, -1), "poll-many", &all, &[], 10_000);
    let waited = started.elapsed();
    producer.join().unwrap();
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "waited {waited:?}");
    assert_eq!(response.session_id, 0);
    let got = answered(&response);
    assert_eq!(got.len(), 50, "a sessionless answer lists every partition");
    for (index, batches, high_watermark) in got {
        let expected = match index {
            31 => (1, 3),
            7 => (0, 2),
            _ => (0, 0),
        };
        assert_eq!((batches, high_watermark), expected, "partition {index}");
    }
}

#[test]
fn list_offsets_earliest_latest_and_by_time_and_delete_records() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "times", 1, &[]);
    let mut conn = broker.connect();
    let base = 1_700_000_000_000i64;
    for i in 0..10 {
        let data = encode_batch(&records(&format!("t{i}"), 2), base + 1000 * i, ProducerFields::NONE);
        produce(&mut conn, "times", 0, data, 1);
    }
    let mut list = |timestamp: i64| {
        let request = ListOffsetsRequest {
            replica_id: -1,
            isolation_level: 0,
            topics: vec![ListOffsetsTopic {
                name: "times".into(),
                partitions: vec![ListOffsetsPartition { index: 0, current_leader_epoch: -1, timestamp }],
            }],
        };
        let reader = conn.request(ApiKey::ListOffsets, 5, |w| request.encode(w, 5)).unwrap();
        let answer = shardlog::client::decode(reader, 5, ListOffsetsResponse::decode).unwrap();
        answer.topics[0].partitions[0]
    };
    assert_eq!(list(-2).offset, 0);
    assert_eq!(list(-1).offset, 20);
    let found = list(base + 3000);
    assert_eq!((found.offset, found.timestamp), (6, base + 3000));
    assert_eq!(list(base + 3001).offset, 7);
    assert_eq!(list(base + 99_000).offset, -1);
    let mut conn = broker.connect();
    assert_eq!(delete_records(&mut conn, "times", 0, 5), 5);
    let response = fetch(&mut conn, "times", 0, 0, 0, 1);
    assert_eq!(response.topics[0].partitions[0].error, ErrorCode::OffsetOutOfRange);
}

#[test]
fn list_offsets_for_a_partition_or_topic_that_does_not_exist_is_unknown_topic_or_partition_in_every_version() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "one", 1, &[]);
    let mut conn = broker.connect();
    for version in 1..=5 {
        for (topic, index) in [("one", 5), ("one", -1), ("never-created", 0)] {
            let request = ListOffsetsRequest {
                replica_id: -1,
                isolation_level: 0,
                topics: vec![ListOffsetsTopic {
                    name: topic.into(),
                    partitions: vec![ListOffsetsPartition { index, current_leader_epoch: -1, timestamp: -1 }],
                }],
            };
            let reader = conn.request(ApiKey::ListOffsets, version, |w| request.encode(w, version)).unwrap();
            let answer = shardlog::client::decode(reader, version, ListOffsetsResponse::decode).unwrap();
            let partition = &answer.topics[0].partitions[0];
            // Kafka's retriable answer: clients refresh metadata and retry
            // until their own timeout.
            assert_eq!(
                (partition.index, partition.error),
                (index, ErrorCode::UnknownTopicOrPartition),
                "v{version} {topic}-{index}"
            );
        }
    }
}

/// DeleteRecords v1 up to `offset` on one partition; the new low watermark.
fn delete_records(conn: &mut shardlog::client::Connection, topic: &str, partition: i32, offset: i64) -> i64 {
    use shardlog::protocol::delete_records::{
        DeleteRecordsPartition, DeleteRecordsRequest, DeleteRecordsResponse, DeleteRecordsTopic,
    };
    let request = DeleteRecordsRequest {
        topics: vec![DeleteRecordsTopic {
            name: topic.into(),
            partitions: vec![DeleteRecordsPartition { partition_index: partition, offset }],
        }],
        timeout_ms: 1000,
    };
    let reader = conn.request(ApiKey::DeleteRecords, 1, |w| request.encode(w, 1)).unwrap();
    let answer = shardlog::client::decode(reader, 1, DeleteRecordsResponse::decode).unwrap();
    answer.topics[0].partitions[0].low_watermark
}

fn init_producer_id(conn: &mut shardlog::client::Connection) -> i64 {
    let request = InitProducerIdRequest { transactional_id: None, transaction_timeout_ms: 60_000 };
    let reader = conn.request(ApiKey::InitProducerId, 1, |w| request.encode(w, 1)).unwrap();
    let answer = shardlog::client::decode(reader, 1, InitProducerIdResponse::decode).unwrap();
    assert_eq!(answer.error, ErrorCode::None);
    answer.producer_id
}

#[test]
fn idempotent_producer_duplicates_are_not_appended_twice_and_gaps_are_refused() {
    let mut broker = Broker::start(1, &[]);
    create_topic(&broker, "idem", 1, &[]);
    let mut conn = broker.connect();
    let producer_id = init_producer_id(&mut conn);
    assert!(producer_id > 0);
    assert_ne!(init_producer_id(&mut conn), producer_id, "ids are unique");
    let idempotent = |sequence: i32, count: usize| {
        encode_batch(
            &records(&format!("s{sequence}"), count),
            1_000,
            ProducerFields { producer_id, producer_epoch: 0, base_sequence: sequence },
        )
    };
    let first = produce(&mut conn, "idem", 0, idempotent(0, 3), -1);
    assert_eq!(first.topics[0].partitions[0].base_offset, 0);
    let second = produce(&mut conn, "idem", 0, idempotent(3, 2), -1);
    assert_eq!(second.topics[0].partitions[0].base_offset, 3);
    let retry = produce(&mut conn, "idem", 0, idempotent(3, 2), -1);
    assert_eq!(retry.topics[0].partitions[0].error, ErrorCode::None);
    assert_eq!(retry.topics[0].partitions[0].base_offset, 3, "a retry gets the original offset");
    let gap = produce(&mut conn, "idem", 0, idempotent(9, 1), -1);
    assert_eq!(gap.topics[0].partitions[0].error, ErrorCode::OutOfOrderSequenceNumber);
    assert_eq!(values(&read_batches(&mut conn, "idem", 0)).len(), 5);
    // Producer state and ids survive a clean restart and a kill -9.
    broker.restart();
    let snapshot = broker.data_dir().join("idem-0").join("producers");
    assert!(std::fs::metadata(&snapshot).is_ok_and(|m| m.len() > 0), "a clean stop writes {}", snapshot.display());
    let mut conn = broker.connect();
    let retry = produce(&mut conn, "idem", 0, idempotent(3, 2), -1);
    assert_eq!(retry.topics[0].partitions[0].base_offset, 3, "duplicate detected after restart");
    let next = produce(&mut conn, "idem", 0, idempotent(5, 1), -1);
    assert_eq!(next.topics[0].partitions[0].base_offset, 5);
    broker.kill();
    broker.spawn();
    let mut conn = broker.connect();
    let retry = produce(&mut conn, "idem", 0, idempotent(5, 1), -1);
    assert_eq!(retry.topics[0].partitions[0].base_offset, 5, "duplicate detected after kill -9");
    assert_eq!(values(&read_batches(&mut conn, "idem", 0)).len(), 6);
    assert!(init_producer_id(&mut conn) > producer_id);
}

#[test]
fn producer_snapshots_follow_segment_rolls_and_carry_the_state_across_a_kill_nine() {
    let mut broker = Broker::start(1, &[]);
    create_topic(&broker, "rolls", 1, &[("segment.bytes", "65536")]);
    let dir = broker.data_dir().join("rolls-0");
    let snapshot = dir.join("producers");
    let mut conn = broker.connect();
    let producer_id = init_producer_id(&mut conn);
    let idempotent = |sequence: i32, count: usize| {
        encode_batch(
            &records(&format!("r{sequence}"), count),
            1_000,
            ProducerFields { producer_id, producer_epoch: 0, base_sequence: sequence },
        )
    };
    let send = |conn: &mut shardlog::client::Connection, sequence: i32, count: usize| {
        let answer = produce(conn, "rolls", 0, idempotent(sequence, count), -1);
        assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
        answer.topics[0].partitions[0].base_offset
    };
    assert_eq!(send(&mut conn, 0, 20), 0);
    // The first idempotent batch leaves a snapshot (the point a restore
    // replays from, across segments); within one segment it is not
    // rewritten, however long the state waits (maintenance runs every 5 s).
    let first = std::fs::read(&snapshot).expect("a snapshot before the first idempotent batch is answered");
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(std::fs::read(&snapshot).unwrap(), first, "no new snapshot before a roll");
    let segments = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
            .count()
    };
    let (mut sequence, mut last_before_roll) = (20, (0, 0));
    while segments() < 2 {
        assert!(sequence < 20_000, "64 KiB segments roll");
        last_before_roll = (sequence, send(&mut conn, sequence, 20));
        sequence += 20;
    }
    let first_after_roll = send(&mut conn, sequence, 20);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read(&snapshot).unwrap() == first && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(std::fs::read(&snapshot).unwrap(), first, "a roll leads to a new snapshot within a maintenance pass");
    // The last batch before the roll lives in the old segment, which a
    // restore does not replay: only the snapshot knows it.
    broker.kill();
    broker.spawn();
    let mut conn = broker.connect();
    let retry = produce(&mut conn, "rolls", 0, idempotent(last_before_roll.0, 20), -1);
    assert_eq!(retry.topics[0].partitions[0].error, ErrorCode::None);
    assert_eq!(retry.topics[0].partitions[0].base_offset, last_before_roll.1, "duplicate detected after kill -9");
    let retry = produce(&mut conn, "rolls", 0, idempotent(sequence, 20), -1);
    assert_eq!(retry.topics[0].partitions[0].base_offset, first_after_roll, "and in the active segment");
}

#[test]
fn shared_listener_serves_partitions_of_every_core_on_one_port() {
    let broker = Broker::start(2, &["--listener", "shared"]);
    create_topic(&broker, "shared", 4, &[]);
    let mut admin = shardlog::client::admin::Admin::connect(&broker.bootstrap()).unwrap();
    let metadata = admin.metadata(Some(vec!["shared".into()])).unwrap();
    assert_eq!(metadata.brokers.len(), 1, "one node in shared mode");
    for round in 0..3 {
        // New connections land on either core; each must reach every partition.
        let mut conn = broker.connect();
        for partition in 0..4 {
            let answer = produce(&mut conn, "shared", partition, batch(&format!("r{round}p{partition}"), 2), 1);
            assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
        }
    }
    let mut conn = broker.connect();
    for partition in 0..4 {
        assert_eq!(values(&read_batches(&mut conn, "shared", partition)).len(), 6);
    }
}

#[test]
fn topic_configs_alter_and_partitions_grow_and_delete_removes_data() {
    let broker = Broker::start(2, &[]);
    create_topic(&broker, "cfg", 2, &[("retention.ms", "3600000")]);
    let mut admin = shardlog::client::admin::Admin::connect(&broker.bootstrap()).unwrap();
    let configs = admin.describe_topic_configs("cfg").unwrap();
    assert!(configs.contains(&("retention.ms".into(), "3600000".into(), true)));
    let altered = admin.alter_topic_configs("cfg", &[("flush".into(), Some("never".into()))]).unwrap();
    assert_eq!(altered.error, ErrorCode::None);
    let bad = admin.alter_topic_configs("cfg", &[("segment.bytes".into(), Some("1".into()))]).unwrap();
    assert_eq!(bad.error, ErrorCode::InvalidConfig);
    assert!(admin.describe_topic_configs("cfg").unwrap().contains(&("flush".into(), "never".into(), true)));
    assert_eq!(admin.create_partitions("cfg", 5).unwrap().error, ErrorCode::None);
    assert_eq!(admin.create_partitions("cfg", 3).unwrap().error, ErrorCode::InvalidPartitions);
    let metadata = admin.metadata(Some(vec!["cfg".into()])).unwrap();
    assert_eq!(metadata.topics[0].partitions.len(), 5);
    let duplicate = admin.create_topic("cfg", 1, &Default::default()).unwrap();
    assert_eq!(duplicate.error, ErrorCode::TopicAlreadyExists);
    assert!(broker.data_dir().join("cfg-4").exists());
    assert_eq!(admin.delete_topic("cfg").unwrap().error, ErrorCode::None);
    assert!(!broker.data_dir().join("cfg-0").exists());
    assert!(!broker.data_dir().join("cfg-4").exists());
    assert_eq!(admin.delete_topic("cfg").unwrap().error, ErrorCode::UnknownTopicOrPartition);
}

/// Sends a raw frame and reports whether the broker closed the connection.
fn closed_after(broker: &Broker, raw: &[u8]) -> bool {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    use std::io::Write;
    if conn.write_all(raw).is_err() {
        return true;
    }
    let mut buf = [0u8; 64];
    match conn.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        // A timeout means the connection stayed open.
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

fn frame(header_and_body: &[u8]) -> Vec<u8> {
    let mut out = (header_and_body.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(header_and_body);
    out
}

fn header(api: ApiKey, version: i16) -> Writer {
    let mut w = Writer::new();
    w.i16(api as i16);
    w.i16(version);
    w.i32(1);
    w.nullable_string(Some("abuse"));
    w
}

#[test]
fn malformed_frames_close_the_connection_and_leave_the_broker_serving() {
    let mut broker = Broker::start(1, &["--request-bytes-max", "1048576"]);
    create_topic(&broker, "safe", 1, &[]);
    // Frame sizes: above the cap, negative, zero, 2^31-1.
    for size in [2 << 20, -1, 0, i32::MAX] {
        assert!(closed_after(&broker, &size.to_be_bytes()), "size {size}");
    }
    // Unknown API key; unsupported Produce version.
    assert!(closed_after(&broker, &frame(&header_bytes(999, 0))));
    assert!(closed_after(&broker, &frame(&header_bytes(ApiKey::Produce as i16, 2))));
    // Produce whose topic array claims 2^31-1 elements.
    let mut w = header(ApiKey::Produce, 8);
    w.nullable_string(None);
    w.i16(1);
    w.i32(1000);
    w.i32(i32::MAX);
    assert!(closed_after(&broker, &frame(&w.into_bytes())));
    // A string longer than the frame.
    let mut w = header(ApiKey::Metadata, 8);
    w.i32(1);
    w.i16(30_000);
    assert!(closed_after(&broker, &frame(&w.into_bytes())));
    // A frame that promises more bytes than it sends, then hangs up.
    {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
        use std::io::Write;
        conn.write_all(&1000i32.to_be_bytes()).unwrap();
        conn.write_all(&[0u8; 10]).unwrap();
    }
    assert!(broker.alive());
    let mut conn = broker.connect();
    let answer = produce(&mut conn, "safe", 0, batch("ok", 1), 1);
    assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
}

fn header_bytes(api_key: i16, version: i16) -> Vec<u8> {
    let mut w = Writer::new();
    w.i16(api_key);
    w.i16(version);
    w.i32(1);
    w.nullable_string(None);
    w.into_bytes().to_vec()
}

#[test]
fn bad_batches_get_kafka_error_codes() {
    let broker = Broker::start(1, &[]);
    create_topic(&broker, "strict", 1, &[("max.message.bytes", "10000")]);
    let mut conn = broker.connect();
    let good = batch("g", 3).to_vec();
    let mut bad_crc = good.clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    let mut bad_magic = good.clone();
    bad_magic[record_batch::MAGIC_AT] = 1;
    let mut bad_count = good.clone();
    bad_count[record_batch::RECORD_COUNT_AT..record_batch::RECORD_COUNT_AT + 4].copy_from_slice(&5i32.to_be_bytes());
    bad_count[record_batch::LAST_OFFSET_DELTA_AT..record_batch::LAST_OFFSET_DELTA_AT + 4]
        .copy_from_slice(&4i32.to_be_bytes());
    let crc = crc32c::crc32c(&bad_count[record_batch::ATTRIBUTES_AT..]);
    bad_count[record_batch::CRC_AT..record_batch::CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    let truncated = good[..good.len() - 5].to_vec();
    let cases: Vec<(Vec<u8>, i16, ErrorCode)> = vec![
        (bad_crc, 1, ErrorCode::CorruptMessage),
        (bad_magic, 1, ErrorCode::CorruptMessage),
        (bad_count, 1, ErrorCode::InvalidRecord),
        (truncated, 1, ErrorCode::CorruptMessage),
        (batch("big", 2000).to_vec(), 1, ErrorCode::MessageTooLarge),
        (good.clone(), 5, ErrorCode::InvalidRequiredAcks),
    ];
    for (data, acks, expected) in cases {
        let answer = produce(&mut conn, "strict", 0, Bytes::from(data), acks);
        assert_eq!(answer.topics[0].partitions[0].error, expected);
    }
    let unknown = produce(&mut conn, "strict", 7, Bytes::from(good.clone()), 1);
    assert_eq!(unknown.topics[0].partitions[0].error, ErrorCode::UnknownTopicOrPartition);
    let answer = produce(&mut conn, "strict", 0, Bytes::from(good), 1);
    assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
    assert_eq!(answer.topics[0].partitions[0].base_offset, 0, "nothing bad was appended");
}

#[test]
fn bad_configuration_is_refused_at_start() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["serve", "--segment-bytes", "12", "--data", "/nonexistent-shardlog-test"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("segment.bytes"), "{stderr}");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["serve", "--flush", "sometimes"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("flush"));
}

/// The broker resource with the empty name holds the cluster-wide dynamic
/// defaults. librdkafka, kafka-python and kafkajs refuse to send that name
/// (the Java AdminClient sends it), so it is tested here on the wire.
#[test]
fn cluster_wide_dynamic_broker_configs_live_under_the_empty_broker_name() {
    use shardlog::protocol::describe_configs::{
        DescribeConfigsRequest, DescribeConfigsResource, DescribeConfigsResponse,
    };
    use shardlog::protocol::incremental_alter_configs::{
        IncrementalAlterConfigsRequest, IncrementalAlterConfigsResource, IncrementalAlterConfigsResponse,
        IncrementalAlterableConfig, CONFIG_OPERATION_SET,
    };
    const BROKER: i8 = 4;
    let broker = Broker::start(2, &[]);
    let mut conn = broker.connect();
    let mut alter = |name: &str, key: &str, value: &str| {
        let request = IncrementalAlterConfigsRequest {
            resources: vec![IncrementalAlterConfigsResource {
                resource_type: BROKER,
                resource_name: name.into(),
                configs: vec![IncrementalAlterableConfig {
                    name: key.into(),
                    config_operation: CONFIG_OPERATION_SET,
                    value: Some(value.into()),
                }],
            }],
            validate_only: false,
        };
        let reader = conn.request(ApiKey::IncrementalAlterConfigs, 1, |w| request.encode(w, 1)).unwrap();
        let answer = shardlog::client::decode(reader, 1, IncrementalAlterConfigsResponse::decode).unwrap();
        let response = &answer.responses[0];
        (response.error, response.error_message.clone().unwrap_or_default())
    };
    assert_eq!(alter("", "log.retention.ms", "7200000").0, ErrorCode::None);
    let (error, message) = alter("", "auto.create.topics.enable", "false");
    assert_eq!(error, ErrorCode::InvalidRequest);
    assert!(message.contains("Cannot update these configs dynamically"), "{message}");
    assert_eq!(alter("not-a-node", "log.retention.ms", "1").0, ErrorCode::InvalidRequest);
    assert_eq!(alter("9", "log.retention.ms", "1").0, ErrorCode::InvalidRequest, "node 9 does not exist");

    let mut conn = broker.connect();
    let mut describe = |name: &str| {
        let request = DescribeConfigsRequest {
            resources: vec![DescribeConfigsResource {
                resource_type: BROKER,
                resource_name: name.into(),
                configuration_keys: None,
            }],
            include_synonyms: true,
            include_documentation: false,
        };
        let reader = conn.request(ApiKey::DescribeConfigs, 3, |w| request.encode(w, 3)).unwrap();
        let answer = shardlog::client::decode(reader, 3, DescribeConfigsResponse::decode).unwrap();
        answer.results.into_iter().next().unwrap()
    };
    let defaults = describe("");
    assert_eq!(defaults.error, ErrorCode::None);
    let listed: Vec<(String, Option<String>, i8)> =
        defaults.configs.iter().map(|c| (c.name.clone(), c.value.clone(), c.config_source)).collect();
    assert_eq!(listed, vec![("log.retention.ms".to_string(), Some("7200000".to_string()), 3)]);
    for node in ["0", "1"] {
        let described = describe(node);
        let retention = described.configs.iter().find(|c| c.name == "log.retention.ms").unwrap();
        assert_eq!((retention.value.as_deref(), retention.config_source), (Some("7200000"), 3), "node {node}");
        let sources: Vec<i8> = retention.synonyms.iter().map(|s| s.source).collect();
        assert_eq!(sources, vec![3, 5], "node {node}");
    }
}

#[test]
fn a_restart_with_fewer_cores_moves_the_partitions_of_the_removed_cores_with_their_records() {
    let mut broker = Broker::start(2, &[]);
    create_topic(&broker, "moving", 2, &[]);
    let mut on_core_one = broker.connect_port(broker.port + 1);
    let answer = produce(&mut on_core_one, "moving", 1, batch("m", 10), 1);
    assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None, "partition 1 lives on core 1");
    drop(on_core_one);
    assert_eq!(broker.stop(), 0);

    broker.cores = 1;
    broker.spawn();
    let mut conn = broker.connect();
    let request = MetadataRequest { topics: Some(vec!["moving".into()]), allow_auto_topic_creation: false };
    let reader = conn.request(ApiKey::Metadata, 8, |w| request.encode(w, 8)).unwrap();
    let metadata = shardlog::client::decode(reader, 8, MetadataResponse::decode).unwrap();
    let partitions: Vec<(i32, ErrorCode, i32, i32)> =
        metadata.topics[0].partitions.iter().map(|p| (p.index, p.error, p.leader_id, p.leader_epoch)).collect();
    assert_eq!(partitions, vec![(0, ErrorCode::None, 0, 0), (1, ErrorCode::None, 0, 1)], "moved, with a new epoch");
    let fetched = fetch(&mut conn, "moving", 1, 0, 0, 1);
    let partition = &fetched.topics[0].partitions[0];
    assert_eq!((partition.error, partition.high_watermark), (ErrorCode::None, 10));
    assert!(!partition.records.is_empty());
    let more = produce(&mut conn, "moving", 1, batch("n", 5), 1);
    assert_eq!(more.topics[0].partitions[0].base_offset, 10);
}

/// A data directory from before the metadata log: `metadata.rkyv` is read
/// once into the log, kept aside as `metadata.rkyv.migrated`, and the
/// topics, configs and node ids it held survive every later start.
#[test]
fn a_metadata_file_from_before_the_metadata_log_is_migrated_once() {
    use shardlog::cluster::metadata::{self, PartitionInfo, PersistedMetadata, ShardId, TopicInfo};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut legacy = PersistedMetadata { cluster_id: "shardlog-legacy".into(), ..Default::default() };
    legacy.topics.insert(
        "kept".into(),
        TopicInfo {
            name: "kept".into(),
            topic_id: [5; 16],
            partitions: vec![
                PartitionInfo { shard: ShardId(1), leader_epoch: 3, replica: ShardId(1) },
                PartitionInfo { shard: ShardId(0), leader_epoch: 0, replica: ShardId(0) },
            ],
            configs: [("retention.ms".to_string(), "3600000".to_string())].into(),
        },
    );
    metadata::store(&data, &legacy).unwrap();
    let data_arg = data.display().to_string();
    let mut broker = Broker::start(2, &["--data", &data_arg, "--node-id-base", "10"]);
    assert!(data.join("metadata.rkyv.migrated").is_file() && !data.join("metadata.rkyv").exists());
    for round in 0..2 {
        let mut conn = broker.connect();
        let request = MetadataRequest { topics: Some(vec!["kept".into()]), allow_auto_topic_creation: false };
        let reader = conn.request(ApiKey::Metadata, 8, |w| request.encode(w, 8)).unwrap();
        let answer = shardlog::client::decode(reader, 8, MetadataResponse::decode).unwrap();
        assert_eq!(answer.cluster_id.as_deref(), Some("shardlog-legacy"), "round {round}");
        let brokers: Vec<i32> = answer.brokers.iter().map(|b| b.node_id).collect();
        assert_eq!(brokers, vec![10, 11], "round {round}: the node ids of --node-id-base");
        let leaders: Vec<(i32, i32, i32)> =
            answer.topics[0].partitions.iter().map(|p| (p.index, p.leader_id, p.leader_epoch)).collect();
        assert_eq!(leaders, vec![(0, 11, 3), (1, 10, 0)], "round {round}");
        let mut on_leader = broker.connect_port(broker.port + 1);
        let produced = produce(&mut on_leader, "kept", 0, batch("k", 3), 1);
        assert_eq!(produced.topics[0].partitions[0].error, ErrorCode::None, "round {round}");
        broker.restart();
    }
}
