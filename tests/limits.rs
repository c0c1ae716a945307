//! Resource bounds through a real broker: connection limits, idle and
//! slow-request timeouts, and the per-core in-flight byte budget that makes
//! producers wait instead of exhausting memory.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use shardlog::protocol::record_batch::{encode_batch, ProducerFields, Record};
use shardlog::protocol::ErrorCode;

fn is_closed(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 16];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe),
    }
}

#[test]
fn connections_past_the_per_ip_limit_are_refused() {
    let broker = Broker::start(1, &["--connections-per-ip-max", "3"]);
    // Let the harness's readiness probe connection finish first.
    std::thread::sleep(Duration::from_millis(300));
    let mut held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(("127.0.0.1", broker.port)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
    assert!(is_closed(&mut extra, Duration::from_secs(2)), "the fourth connection is closed");
    held.pop();
    std::thread::sleep(Duration::from_millis(200));
    let mut conn = broker.connect();
    conn.request(shardlog::protocol::ApiKey::ApiVersions, 0, |_| {}).expect("a freed slot is usable");
}

#[test]
fn idle_and_slow_drip_connections_are_closed() {
    let broker = Broker::start(1, &["--idle-timeout-ms", "500", "--request-read-timeout-ms", "500"]);
    let mut idle = TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
    let started = Instant::now();
    assert!(is_closed(&mut idle, Duration::from_secs(5)));
    assert!(started.elapsed() < Duration::from_secs(3));
    // A request that starts and then trickles in one byte at a time.
    let mut slow = TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
    slow.write_all(&100i32.to_be_bytes()).unwrap();
    let started = Instant::now();
    let mut closed = false;
    for _ in 0..40 {
        if slow.write_all(&[0]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed || is_closed(&mut slow, Duration::from_secs(2)), "slow-drip client closed");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The in-flight budget makes a producer wait, unread, instead of
/// growing the broker's memory. With an 8 MiB budget, two 4 MiB produces
/// whose bodies are still arriving hold all of it (a request takes its size
/// from the budget when its size prefix is read). A client then sends twelve
/// more 4 MiB produces without reading answers: the broker reads none of
/// them while the budget is spent, so the client's sends block once the
/// socket buffers are full, no answer comes, and the broker's peak memory
/// stays near the budget instead of growing by the 48 MiB sent. Once the
/// first two arrive whole, every request is read, answered and stored.
#[test]
fn produces_past_the_in_flight_budget_wait_unread_until_it_frees() {
    const FRAME_BYTES: usize = 4 << 20;
    const PUSHED: usize = 12;
    let metrics_port = free_ports(1);
    let broker = Broker::start(
        1,
        &[
            "--in-flight-bytes-max",
            &(2 * FRAME_BYTES).to_string(),
            "--request-bytes-max",
            &FRAME_BYTES.to_string(),
            "--max-message-bytes",
            &FRAME_BYTES.to_string(),
            "--metrics-port",
            &metrics_port.to_string(),
        ],
    );
    create_topic(&broker, "large", 1, &[]);
    let pid = broker.child.as_ref().unwrap().id();
    let rss_before = status_kib(pid, "VmRSS:");
    let overhead = produce_frame_prefix("large", 0).len() - 4;
    let batch = batch_of_len(FRAME_BYTES - overhead);
    let prefix = produce_frame_prefix("large", batch.len());
    assert_eq!(prefix.len() - 4 + batch.len(), FRAME_BYTES, "each request is exactly request-bytes-max");
    let frame = [&prefix[..], &batch[..]].concat();

    // Two requests hold the whole budget: their size prefixes and half
    // their bodies are sent, the rest later.
    let mut holders: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut holder = TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
            holder.write_all(&frame[..FRAME_BYTES / 2]).unwrap();
            holder
        })
        .collect();
    // Readiness only (the checks below are on behaviour): the broker has
    // read both size prefixes and taken their budget.
    let deadline = Instant::now() + Duration::from_secs(2);
    while metric(metrics_port, "shardlog_in_flight_request_bytes") < (2 * FRAME_BYTES) as f64
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }

    // A client that sends and does not read answers until it has sent all.
    let pusher = TcpStream::connect(("127.0.0.1", broker.port)).unwrap();
    // A small send buffer (no autotuning), so that a send blocks soon after
    // the broker stops reading.
    socket2::SockRef::from(&pusher).set_send_buffer_size(64 << 10).unwrap();
    let watcher = pusher.try_clone().unwrap();
    let sent_bytes = Arc::new(AtomicUsize::new(0));
    let push = {
        let (sent_bytes, frame) = (sent_bytes.clone(), frame.clone());
        let mut pusher = pusher;
        std::thread::spawn(move || -> Vec<ErrorCode> {
            for _ in 0..PUSHED {
                for chunk in frame.chunks(64 << 10) {
                    pusher.write_all(chunk).unwrap();
                    sent_bytes.fetch_add(chunk.len(), Ordering::SeqCst);
                }
            }
            pusher.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            (0..PUSHED).map(|_| produce_answer_error(&mut pusher)).collect()
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let sent_while_held = sent_bytes.load(Ordering::SeqCst);
    // Has any answer arrived? A peek that does not wait (the pusher's own
    // writes on the shared socket stay blocking).
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    let answered_while_held =
        match socket2::SockRef::from(&watcher).recv_with_flags(&mut probe, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
            Ok(0) => panic!("the broker closed the pusher's connection"),
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("the pusher's connection: {e}"),
        };
    let peak_while_held = status_kib(pid, "VmHWM:");
    eprintln!(
        "budget held: the pusher sent {sent_while_held} of {} bytes, answered {answered_while_held}; \
         broker RSS {rss_before} KiB before, peak {peak_while_held} KiB",
        PUSHED * frame.len()
    );
    assert!(!answered_while_held, "no request past the budget is answered while the budget is held");
    assert!(
        sent_while_held < FRAME_BYTES,
        "the broker stopped reading the pusher: its sends block ({sent_while_held} bytes sent, not even one request)"
    );
    assert!(
        peak_while_held < rss_before + (32 << 10),
        "peak RSS {peak_while_held} KiB: the broker holds the budget's 8 MiB, not the {} MiB sent",
        (PUSHED * FRAME_BYTES) >> 20
    );

    // The budget frees: everything is read, answered and stored.
    for holder in &mut holders {
        holder.write_all(&frame[FRAME_BYTES / 2..]).unwrap();
    }
    for holder in &mut holders {
        holder.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        assert_eq!(produce_answer_error(holder), ErrorCode::None, "a held request is stored once whole");
    }
    let pushed = push.join().unwrap();
    assert_eq!(pushed, vec![ErrorCode::None; PUSHED], "every pushed request is stored once read");
    let mut conn = broker.connect();
    let answer = fetch(&mut conn, "large", 0, 0, 0, 1);
    assert_eq!(answer.topics[0].partitions[0].high_watermark, (2 + PUSHED) as i64, "one record per request");
    eprintln!("after: broker peak RSS {} KiB", status_kib(pid, "VmHWM:"));
}

/// Reads one Produce v7 answer (correlation id 1, as `produce_frame_prefix`
/// sends) and returns its partition's error.
fn produce_answer_error(stream: &mut TcpStream) -> ErrorCode {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("an answer");
    let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut body).expect("a whole answer");
    let mut reader = shardlog::protocol::wire::Reader::new(Bytes::from(body));
    assert_eq!(reader.i32().unwrap(), 1, "correlation id");
    let response = shardlog::protocol::produce::ProduceResponse::decode(&mut reader, 7).expect("decodes");
    response.topics[0].partitions[0].error
}

/// A Produce v7 frame (size prefix included) for one partition, without
/// its records: the caller sends `records_len` bytes of records right after.
fn produce_frame_prefix(topic: &str, records_len: usize) -> Vec<u8> {
    use shardlog::protocol::produce::{ProducePartition, ProduceRequest, ProduceTopic};
    let request = ProduceRequest {
        transactional_id: None,
        acks: 1,
        timeout_ms: 120_000,
        topics: vec![ProduceTopic {
            name: topic.into(),
            partitions: vec![ProducePartition { index: 0, records: Some(Bytes::new()) }],
        }],
    };
    let mut w = shardlog::protocol::wire::Writer::new();
    w.i16(shardlog::protocol::ApiKey::Produce as i16);
    w.i16(7);
    w.i32(1);
    w.nullable_string(Some("limits-test"));
    request.encode(&mut w);
    let mut body = w.into_bytes().to_vec();
    // The records field is last: swap its empty length for the real one.
    body.truncate(body.len() - 4);
    body.extend_from_slice(&(records_len as i32).to_be_bytes());
    let mut frame = ((body.len() + records_len) as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// A batch of one record, exactly `len` bytes long.
fn batch_of_len(len: usize) -> Bytes {
    let encode = |value_len: usize| {
        let record = Record { value: Some(Bytes::from(vec![7u8; value_len])), ..Record::default() };
        encode_batch(&[record], 1, ProducerFields::NONE)
    };
    let guess = encode(len - 100);
    let exact = encode(len - 100 + len - guess.len());
    assert_eq!(exact.len(), len);
    exact
}

/// The bound: 100 concurrent produces of 100 MiB each (10 GiB in
/// all) against the default 256 MiB per-core budget. Readers wait for the
/// budget, so the broker's peak RSS stays near budget + one write in flight
/// instead of the 10 GiB an unbounded reader would hold, and every produce
/// is stored.
#[test]
fn a_hundred_concurrent_100_mib_produces_stay_within_the_memory_budget() {
    const PRODUCERS: usize = 100;
    const FRAME_BYTES: usize = 100 << 20;
    // The tail cache is bounded by its own budget; this test is about the
    // in-flight budget, so the cache gets 128 MiB.
    let broker = Broker::start(
        1,
        &["--max-message-bytes", &(64 << 20).to_string(), "--cache-bytes-max", &(128 << 20).to_string()],
    );
    create_topic(&broker, "huge", 1, &[]);
    let pid = broker.child.as_ref().unwrap().id();
    let rss_before = status_kib(pid, "VmRSS:");
    let overhead = produce_frame_prefix("huge", 0).len() - 4;
    let records_len = FRAME_BYTES - overhead;
    // Two batches (max.message.bytes is at most 64 MiB) that fill the request exactly.
    let first = batch_of_len(records_len / 2);
    let second = batch_of_len(records_len - first.len());
    let batch = Bytes::from([first, second].concat());
    assert_eq!(batch.len(), records_len, "the batches fill the 100 MiB request exactly");
    let prefix = produce_frame_prefix("huge", batch.len());
    assert_eq!(prefix.len() - 4 + batch.len(), FRAME_BYTES);
    let started = Instant::now();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            let (batch, prefix, port) = (batch.clone(), prefix.clone(), broker.port);
            std::thread::spawn(move || -> ErrorCode {
                let mut conn =
                    shardlog::client::Connection::connect(("127.0.0.1", port), Duration::from_secs(300)).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
                conn.send_raw(&prefix).unwrap();
                conn.send_raw(&batch).unwrap();
                let mut reader = shardlog::protocol::wire::Reader::new(conn.read_frame().unwrap());
                assert_eq!(reader.i32().unwrap(), 1, "correlation id");
                let response = shardlog::protocol::produce::ProduceResponse::decode(&mut reader, 7).unwrap();
                response.topics[0].partitions[0].error
            })
        })
        .collect();
    let errors: Vec<ErrorCode> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    let elapsed = started.elapsed();
    let peak = status_kib(pid, "VmHWM:");
    eprintln!(
        "{PRODUCERS} x 100 MiB produces in {elapsed:?} ({:.0} MB/s); broker RSS {rss_before} KiB before, peak {peak} KiB",
        (PRODUCERS * FRAME_BYTES) as f64 / elapsed.as_secs_f64() / 1e6
    );
    assert!(errors.iter().all(|e| *e == ErrorCode::None), "every produce stored: {errors:?}");
    let mut conn = broker.connect();
    let answer = fetch(&mut conn, "huge", 0, 0, 0, 1);
    assert_eq!(answer.topics[0].partitions[0].high_watermark, 2 * PRODUCERS as i64);
    // Measured about 600 MiB: 256 MiB of budget (two requests), the batches
    // waiting to be written or cached, and the aligned write buffers. The bound
    // is fixed, whatever the number of producers; unbounded reading would
    // hold all 10 GiB at once.
    assert!(peak < rss_before + 1024 * 1024, "peak RSS {peak} KiB: the in-flight budget bounds memory");
}

/// 10,000 idle client connections (each has made one request) cost the
/// broker at most 10 KiB of RSS apiece, and it keeps serving new clients.
#[test]
fn ten_thousand_idle_connections_cost_under_10_kib_each() {
    const CONNECTIONS: usize = 10_000;
    let broker = Broker::start(1, &["--connections-per-ip-max", "20000"]);
    let pid = broker.child.as_ref().unwrap().id();
    let port = broker.port;
    let open_one = || {
        let mut conn = shardlog::client::Connection::connect(("127.0.0.1", port), Duration::from_secs(10)).unwrap();
        conn.request(shardlog::protocol::ApiKey::ApiVersions, 0, |_| {}).expect("api versions");
        conn
    };
    // Warm up: the first connections size the allocator's arenas.
    let warm: Vec<_> = (0..100).map(|_| open_one()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let rss_before = status_kib(pid, "VmRSS:");
    let idle: Vec<_> = (0..CONNECTIONS).map(|_| open_one()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let rss_after = status_kib(pid, "VmRSS:");
    let per_connection = (rss_after.saturating_sub(rss_before)) as f64 * 1024.0 / CONNECTIONS as f64;
    eprintln!(
        "{CONNECTIONS} idle connections: broker RSS {rss_before} -> {rss_after} KiB, {per_connection:.0} bytes each"
    );
    let mut fresh = broker.connect();
    let answer = fetch(&mut fresh, "absent-topic", 0, 0, 0, 1);
    assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::UnknownTopicOrPartition, "still serving");
    assert!(per_connection <= 10.0 * 1024.0, "{per_connection:.0} bytes per idle connection");
    drop((warm, idle));
}

/// A request frame that arrives in parts (the first part, a pause, the rest)
/// is assembled whole: the broker receives what has arrived into the frame
/// and waits for the rest, and the data it stores is the data sent.
#[test]
fn a_frame_arriving_in_parts_is_stored_intact() {
    use shardlog::protocol::produce::ProduceResponse;
    use shardlog::protocol::ApiKey;

    let broker = Broker::start(1, &[]);
    create_topic(&broker, "parts", 1, &[]);
    let records: Vec<Record> = (0..4)
        .map(|i| Record {
            value: Some(Bytes::from((0..200_000).map(|b| (b * 7 + i) as u8).collect::<Vec<u8>>())),
            offset_delta: i,
            ..Record::default()
        })
        .collect();
    let data = encode_batch(&records, 1, ProducerFields::NONE);
    let request = produce_request("parts", 0, data.clone(), 1);
    let frame = request_frame(ApiKey::Produce as i16, 8, 42, |w| request.encode(w));

    let mut conn = broker.connect();
    for (i, part) in frame.chunks(frame.len() / 3 + 1).enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(150));
        }
        conn.send_raw(part).unwrap();
    }
    let mut reader = read_answer(&mut conn, 42);
    let response = ProduceResponse::decode(&mut reader, 8).expect("decodes");
    assert_eq!(response.topics[0].partitions[0].error, ErrorCode::None);

    let answer = fetch(&mut conn, "parts", 0, 0, 0, 1);
    let stored: Vec<u8> = answer.topics[0].partitions[0].records.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(stored.len(), data.len());
    // Bytes 12..16 are the partition leader epoch, which the broker sets.
    let differ: Vec<usize> = (0..data.len()).filter(|&i| !(12..16).contains(&i) && stored[i] != data[i]).collect();
    assert!(
        differ.is_empty(),
        "the stored batch is the batch sent; differing bytes at {:?}",
        &differ[..differ.len().min(20)]
    );
}
