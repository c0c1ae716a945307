//! Resource bounds through a real broker: connection limits, idle and
//! slow-request timeouts, and the per-core in-flight byte budget that makes
//! producers wait instead of exhausting memory.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
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

#[test]
fn concurrent_large_produces_wait_for_the_in_flight_budget_and_all_succeed() {
    let broker = Broker::start(
        1,
        &["--in-flight-bytes-max", "8388608", "--request-bytes-max", "4194304", "--max-message-bytes", "4194304"],
    );
    create_topic(&broker, "large", 1, &[]);
    let records: Vec<Record> = (0..3)
        .map(|i| Record { value: Some(Bytes::from(vec![i as u8; 1 << 20])), offset_delta: i, ..Record::default() })
        .collect();
    let data = encode_batch(&records, 1, ProducerFields::NONE);
    let port = broker.port;
    let producers: Vec<_> = (0..12)
        .map(|_| {
            let data = data.clone();
            std::thread::spawn(move || {
                let mut conn =
                    shardlog::client::Connection::connect(("127.0.0.1", port), Duration::from_secs(30)).unwrap();
                produce(&mut conn, "large", 0, data, 1).topics[0].partitions[0].error
            })
        })
        .collect();
    for producer in producers {
        assert_eq!(producer.join().unwrap(), ErrorCode::None);
    }
    let mut conn = broker.connect();
    let answer = fetch(&mut conn, "large", 0, 33, 0, 1);
    assert_eq!(answer.topics[0].partitions[0].high_watermark, 36, "12 batches of 3 records");
}
