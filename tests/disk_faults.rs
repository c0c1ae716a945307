//! A full disk: produces fail with a Kafka error (not a crash), nothing that
//! was acknowledged is lost, and the broker takes writes again once space
//! returns. Runs on a small loop-mounted ext4 filesystem (needs root, as CI
//! and the development machines have).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use shardlog::protocol::record_batch::{self, encode_batch, ProducerFields, Record};
use shardlog::protocol::ErrorCode;

struct LoopMount {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopMount {
    fn new(megabytes: u64) -> LoopMount {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        std::fs::File::create(&image).unwrap().set_len(megabytes << 20).unwrap();
        run("mkfs.ext4", &["-q", image.to_str().unwrap()]);
        run("mount", &["-o", "loop", image.to_str().unwrap(), mount.to_str().unwrap()]);
        LoopMount { mount, _dir: dir }
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed (this test needs root and loop devices)");
}

fn big_batch(tag: usize) -> Bytes {
    let records: Vec<Record> = (0..64)
        .map(|i| Record {
            value: Some(Bytes::from(vec![(tag % 251) as u8; 8 << 10])),
            offset_delta: i,
            ..Record::default()
        })
        .collect();
    encode_batch(&records, 1_000 + tag as i64, ProducerFields::NONE)
}

fn stored_tags(broker: &Broker) -> Vec<u8> {
    let mut conn = broker.connect();
    let mut tags = Vec::new();
    let mut offset = 0;
    loop {
        let response = fetch(&mut conn, "fill", 0, offset, 0, 1);
        let p = &response.topics[0].partitions[0];
        assert_eq!(p.error, ErrorCode::None);
        if p.records.is_empty() {
            return tags;
        }
        for batch in &p.records {
            let header = record_batch::validate(batch, 2 << 20).unwrap();
            offset = header.last_offset() + 1;
            tags.push(record_batch::decode_records(batch).unwrap()[0].value.as_ref().unwrap()[0]);
        }
    }
}

fn filler(dir: &Path, megabytes: usize) -> PathBuf {
    let path = dir.join("filler");
    std::fs::write(&path, vec![1u8; megabytes << 20]).unwrap();
    path
}

#[test]
fn full_disk_fails_produces_cleanly_and_recovers_when_space_returns() {
    let disk = LoopMount::new(48);
    let filler = filler(&disk.mount, 12);
    let mut broker = Broker::start(1, &["--data", disk.mount.join("data").to_str().unwrap()]);
    create_topic(&broker, "fill", 1, &[]);
    let mut conn = broker.connect();
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for tag in 0..200 {
        let answer = produce(&mut conn, "fill", 0, big_batch(tag), -1);
        match answer.topics[0].partitions[0].error {
            ErrorCode::None => acknowledged.push((tag % 251) as u8),
            ErrorCode::KafkaStorageError => {
                refused += 1;
                if refused >= 3 {
                    break;
                }
            }
            other => panic!("unexpected error {other:?}"),
        }
    }
    assert!(refused >= 3, "the disk filled up ({} batches acknowledged)", acknowledged.len());
    assert!(broker.alive(), "a full disk does not crash the broker");
    assert_eq!(stored_tags(&broker), acknowledged, "every acknowledged batch is readable");
    // Space returns: writes resume without a restart.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = produce(&mut conn, "fill", 0, big_batch(250), -1);
        if answer.topics[0].partitions[0].error == ErrorCode::None {
            acknowledged.push(250);
            break;
        }
        assert!(Instant::now() < deadline, "writes did not resume after space returned");
        std::thread::sleep(Duration::from_millis(200));
    }
    broker.restart();
    assert_eq!(stored_tags(&broker), acknowledged, "nothing acknowledged is lost across a restart");
    assert_eq!(broker.stop(), 0);
}

/// The values of the records `batch(prefix, count)` holds.
fn values(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-value-{i}")).collect()
}

/// Every record value of `topic`/`partition` up to its high watermark, in
/// offset order, checked to start at offset 0 with dense offsets.
fn stored_values(conn: &mut shardlog::client::Connection, topic: &str, partition: i32) -> Vec<String> {
    let mut stored = Vec::new();
    let mut offset = 0;
    loop {
        let response = fetch(conn, topic, partition, offset, 0, 1);
        let p = &response.topics[0].partitions[0];
        assert_eq!(p.error, ErrorCode::None, "{topic}/{partition} reads");
        if p.records.is_empty() {
            assert_eq!(offset, p.high_watermark, "{topic}/{partition}: read up to the high watermark");
            return stored;
        }
        for batch in &p.records {
            let header = record_batch::validate(batch, 1 << 20).unwrap();
            assert_eq!(header.base_offset, offset, "{topic}/{partition}: dense offsets");
            for record in record_batch::decode_records(batch).unwrap() {
                stored.push(String::from_utf8(record.value.unwrap().to_vec()).unwrap());
            }
            offset = header.last_offset() + 1;
        }
    }
}

/// Produces `batch(prefix, 3)` to `eio`/`partition` with acks=all; an
/// acknowledged batch's values join that partition's `acknowledged`.
fn send(
    conn: &mut shardlog::client::Connection,
    acknowledged: &mut [Vec<String>; 2],
    partition: i32,
    prefix: &str,
) -> ErrorCode {
    let answer = produce(conn, "eio", partition, batch(prefix, 3), -1);
    let error = answer.topics[0].partitions[0].error;
    if error == ErrorCode::None {
        acknowledged[partition as usize].extend(values(prefix, 3));
    }
    error
}

#[test]
fn eio_on_fdatasync_stops_that_partition_until_restart_and_loses_nothing_acknowledged() {
    let metrics_port = free_ports(1).to_string();
    // The storage layer's fault hook: partition 0's fourth fdatasync fails
    // with EIO. Each produce below waits for its answer before the next, so
    // each is synced on its own: three are acknowledged before the fault.
    let mut broker =
        Broker::start_with_env(1, &["--metrics-port", &metrics_port], &[("SHARDLOG_INJECT_FAULT", "eio/0=sync-eio@4")]);
    let metrics_port: u16 = metrics_port.parse().unwrap();
    create_topic(&broker, "eio", 2, &[("flush", "always")]);
    let mut conn = broker.connect();
    let mut acknowledged: [Vec<String>; 2] = Default::default();
    for round in 0..3 {
        for partition in 0..2 {
            let prefix = format!("p{partition}-before-{round}");
            assert_eq!(
                send(&mut conn, &mut acknowledged, partition, &prefix),
                ErrorCode::None,
                "{prefix} is acknowledged"
            );
        }
    }
    assert_eq!(
        send(&mut conn, &mut acknowledged, 0, "p0-failed"),
        ErrorCode::KafkaStorageError,
        "the fourth fdatasync fails"
    );
    // Past the broker's 1 s reopen interval: an EIO is not retried in place.
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(send(&mut conn, &mut acknowledged, 0, "p0-again"), ErrorCode::KafkaStorageError, "appends stay stopped");
    assert_eq!(metric(metrics_port, "shardlog_failed_logs"), 1.0, "the failed log is reported");
    // The other partition keeps taking writes, and the failed one is read
    // back: every acknowledged record, and nothing unacknowledged.
    assert_eq!(send(&mut conn, &mut acknowledged, 1, "p1-during"), ErrorCode::None);
    assert_eq!(
        stored_values(&mut conn, "eio", 0),
        acknowledged[0],
        "the failed partition reads back what it acknowledged"
    );
    assert_eq!(
        stored_values(&mut conn, "eio", 1),
        acknowledged[1],
        "the healthy partition reads back what it acknowledged"
    );
    assert!(broker.alive());
    // An operator restart (the disk replaced; the hook gone) brings it back.
    broker.env.clear();
    assert_eq!(broker.stop(), 0, "a failed log does not stop a clean shutdown");
    broker.spawn();
    let mut conn = broker.connect();
    // The failed batch's write reached the file before its fdatasync failed:
    // recovery may find it, which Kafka semantics allow (it was never
    // acknowledged, nor refused as never written). Nothing else may appear.
    let failed_found = [acknowledged[0].clone(), values("p0-failed", 3)].concat();
    let after_restart = stored_values(&mut conn, "eio", 0);
    assert!(
        after_restart == acknowledged[0] || after_restart == failed_found,
        "after the restart partition 0 holds what it acknowledged (and at most the failed batch): {after_restart:?}"
    );
    assert_eq!(
        send(&mut conn, &mut acknowledged, 0, "p0-resumed"),
        ErrorCode::None,
        "appends resume after the restart"
    );
    assert_eq!(metric(metrics_port, "shardlog_failed_logs"), 0.0);
    assert_eq!(stored_values(&mut conn, "eio", 0), [after_restart, values("p0-resumed", 3)].concat());
    assert_eq!(stored_values(&mut conn, "eio", 1), acknowledged[1], "the healthy partition kept its records");
}

fn idempotent_batch(producer_id: i64, base_sequence: i32, prefix: &str) -> Bytes {
    let records: Vec<Record> = (0..3)
        .map(|i| Record { value: Some(Bytes::from(format!("{prefix}-{i}"))), offset_delta: i, ..Record::default() })
        .collect();
    encode_batch(&records, 1_000, ProducerFields { producer_id, producer_epoch: 0, base_sequence })
}

#[test]
fn a_retry_of_an_idempotent_batch_whose_write_failed_is_not_acknowledged() {
    use shardlog::protocol::init_producer_id::{InitProducerIdRequest, InitProducerIdResponse};
    use shardlog::protocol::ApiKey;
    let mut broker = Broker::start_with_env(1, &[], &[("SHARDLOG_INJECT_FAULT", "retry/0=sync-eio")]);
    create_topic(&broker, "retry", 1, &[("flush", "always")]);
    let mut conn = broker.connect();
    let request = InitProducerIdRequest { transactional_id: None, transaction_timeout_ms: 60_000 };
    let reader = conn.request(ApiKey::InitProducerId, 1, |w| request.encode(w, 1)).unwrap();
    let producer_id = shardlog::client::decode(reader, 1, InitProducerIdResponse::decode).unwrap().producer_id;
    let first = produce(&mut conn, "retry", 0, idempotent_batch(producer_id, 0, "first"), -1);
    assert_eq!(first.topics[0].partitions[0].error, ErrorCode::KafkaStorageError);
    // The producer retries the same batch, as librdkafka does after a
    // storage error. It was never made durable: no success may answer it.
    let retry = produce(&mut conn, "retry", 0, idempotent_batch(producer_id, 0, "first"), -1);
    assert_eq!(
        retry.topics[0].partitions[0].error,
        ErrorCode::KafkaStorageError,
        "a retry is acknowledged only once its first attempt is durable"
    );
    // After a restart (the disk healthy) the retry is stored exactly once:
    // appended now, or found on disk where the failed sync's write landed.
    broker.env.clear();
    broker.restart();
    let mut conn = broker.connect();
    let after = produce(&mut conn, "retry", 0, idempotent_batch(producer_id, 0, "first"), -1);
    let p = &after.topics[0].partitions[0];
    assert_eq!(p.error, ErrorCode::None);
    let next = produce(&mut conn, "retry", 0, idempotent_batch(producer_id, 3, "second"), -1);
    assert_eq!(next.topics[0].partitions[0].error, ErrorCode::None, "the producer's next sequence follows");
    let read = fetch(&mut conn, "retry", 0, 0, 0, 1);
    let stored: Vec<String> = read.topics[0].partitions[0]
        .records
        .iter()
        .flat_map(|batch| record_batch::decode_records(batch).unwrap())
        .map(|record| String::from_utf8(record.value.unwrap().to_vec()).unwrap())
        .collect();
    assert_eq!(stored, ["first-0", "first-1", "first-2", "second-0", "second-1", "second-2"]);
    assert_eq!(p.base_offset, 0);
}
