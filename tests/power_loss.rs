//! Power loss, simulated: the storage engine and the idempotent producer
//! state beside it run on `sim_disk`, which keeps only what fdatasync and
//! journal commits made durable, keeps or loses each unsynced write at
//! random and tears the last kept one at a page boundary. Each seed runs a
//! few lives of one partition (appends from an idempotent producer that
//! retries what was not acknowledged, segment rolls, retention, segment
//! recycling, index writes, producer snapshots, clean shutdowns), each
//! ended by a crash at a random operation or by a clean close, and after
//! every crash checks what recovery kept:
//!
//! - every batch acknowledged under flush=always is there, byte for byte,
//!   at its acknowledged offset (unless retention has since deleted it);
//! - the log reads as a valid prefix: dense offsets, whole batches with
//!   valid CRCs;
//! - the producer's retries are recognised as duplicates at the offsets
//!   where they are (no offset is renumbered, nothing stored twice), and
//!   its next batch is taken.
//!
//! SHARDLOG_SIM_SEEDS sets how many seeds run (default 2,000);
//! SHARDLOG_SIM_SEED runs one seed, to replay a failure.

use std::collections::BTreeMap;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use shardlog::log::sim_disk::{Lcg, SimDisk};
use shardlog::log::{Disk, FlushPolicy, Log, LogConfig};
use shardlog::protocol::record_batch::{self, encode_batch, BatchHeader, ProducerFields, Record};
use shardlog::shard::partition::{Partition, SequenceCheck};

const PRODUCER_ID: i64 = 4242;
const LIVES: usize = 4;

#[test]
fn every_acknowledged_batch_survives_power_loss_at_any_operation() {
    let seeds: Vec<u64> = match std::env::var("SHARDLOG_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("SHARDLOG_SIM_SEED is a number")],
        Err(_) => {
            let count = std::env::var("SHARDLOG_SIM_SEEDS").ok().and_then(|n| n.parse().ok()).unwrap_or(2_000);
            (0..count).collect()
        }
    };
    let crashes = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(move || async move {
            let mut crashes = 0;
            for seed in seeds {
                crashes += run_seed(seed).await;
            }
            crashes
        })
        .expect("executor starts")
        .join()
        .unwrap_or_else(|_| panic!("a seed failed: see the message above (replay with SHARDLOG_SIM_SEED)"));
    assert!(crashes > 0, "the runs crashed somewhere");
}

/// One batch the producer sent, with its sequence and content.
#[derive(Clone)]
struct Sent {
    sequence: i32,
    data: Bytes,
    records: i32,
}

struct Producer {
    /// Sent and not acknowledged, oldest first (retried in order).
    unacknowledged: Vec<Sent>,
    next_sequence: i32,
    /// Base offset -> the batch acknowledged there.
    acknowledged: BTreeMap<i64, Sent>,
}

impl Producer {
    fn new_batch(&mut self, rng: &mut Lcg) -> Sent {
        let records = 1 + (rng.draw() % 4) as i32;
        let value_bytes = 20 + (rng.draw() % 3_000) as usize;
        let sequence = self.next_sequence;
        let data = encode_batch(
            &(0..records)
                .map(|i| Record {
                    value: Some(Bytes::from(format!("{sequence}-{i}-{}", "v".repeat(value_bytes)))),
                    offset_delta: i,
                    ..Record::default()
                })
                .collect::<Vec<_>>(),
            1_000 + i64::from(sequence),
            ProducerFields { producer_id: PRODUCER_ID, producer_epoch: 0, base_sequence: sequence },
        );
        self.next_sequence += records;
        Sent { sequence, data, records }
    }
}

fn config(rng: &mut Lcg) -> LogConfig {
    LogConfig {
        segment_bytes: [16 << 10, 48 << 10, 1 << 20][(rng.draw() % 3) as usize],
        retention_bytes: [-1, 96 << 10][(rng.draw() % 2) as usize],
        retention_ms: -1,
        flush: FlushPolicy::Always,
        recycle_segments: rng.draw().is_multiple_of(2),
        cache_bytes_max: 8 << 10,
        ..LogConfig::default()
    }
}

/// Runs one seed; returns how many of its lives ended in a crash.
async fn run_seed(seed: u64) -> usize {
    let mut rng = Lcg(seed);
    let config = config(&mut rng);
    let mut disk = SimDisk::new();
    let dir = std::path::PathBuf::from("/sim/topic-0");
    let mut producer = Producer { unacknowledged: Vec::new(), next_sequence: 0, acknowledged: BTreeMap::new() };
    let mut crashes = 0;
    for life in 0..LIVES {
        let context = format!("seed {seed} life {life}");
        let (log, report) = Log::open_on(Disk::Sim(disk.clone()), &dir, config.clone())
            .await
            .unwrap_or_else(|e| panic!("{context}: the log does not open after the crash: {e}"));
        let partition = Partition::new("topic".into(), 0, log.clone());
        partition
            .restore_producers(report.clean_shutdown)
            .await
            .unwrap_or_else(|e| panic!("{context}: producer state does not restore: {e}"));
        check_recovered(&context, &log, &producer).await;
        // This life dies at a random operation, or closes cleanly.
        let clean_end = rng.draw().is_multiple_of(4);
        if !clean_end {
            disk.crash_after(1 + rng.draw() % 400);
        }
        let crashed = live(&context, &mut rng, &disk, &partition, &mut producer).await;
        let crashed = crashed || {
            // A clean shutdown, in the shard's order (or a crash in it).
            let closed = async {
                log.close_unmarked().await.ok()?;
                partition.snapshot_producers().await.ok()?;
                log.mark_clean().ok()
            };
            closed.await.is_none()
        };
        if crashed {
            assert!(disk.crashed(), "{context}: an operation failed with no crash");
            crashes += 1;
        }
        drop(partition);
        drop(log);
        disk = disk.image(seed.wrapping_mul(31).wrapping_add(life as u64));
    }
    crashes
}

/// Produces until the crash (true) or for a while (false): retries first,
/// then new batches, a few appended before each wait (a group commit),
/// with snapshots and retention as the shard's maintenance runs them.
async fn live(
    context: &str,
    rng: &mut Lcg,
    disk: &Rc<SimDisk>,
    partition: &Partition,
    producer: &mut Producer,
) -> bool {
    let log = &partition.log;
    for _ in 0..60 {
        let mut group = Vec::new();
        let mut wait_for = None;
        for _ in 0..1 + rng.draw() % 4 {
            let sent = match producer.unacknowledged.get(group.len()) {
                Some(retry) => retry.clone(),
                None => {
                    let sent = producer.new_batch(rng);
                    producer.unacknowledged.push(sent.clone());
                    sent
                }
            };
            let header = record_batch::validate(&sent.data, 1 << 20).expect("a valid batch");
            let base = match partition.check_sequence(&header) {
                Ok(SequenceCheck::Duplicate { base_offset }) => base_offset,
                Ok(SequenceCheck::Append) => match log.append(BytesMut::from(&sent.data[..]), &header) {
                    Ok(appended) => {
                        partition.record_sequence(&header, appended.base_offset);
                        appended.base_offset
                    }
                    Err(e) => {
                        assert!(disk.crashed(), "{context}: append failed with no crash: {e}");
                        return true;
                    }
                },
                Err(code) => panic!(
                    "{context}: sequence {} refused with {code:?}; producer state {:?}; log {}..{}, snapshot {:?}",
                    sent.sequence,
                    partition.producer_state(),
                    log.log_start_offset(),
                    log.log_end_offset(),
                    partition.read_snapshot().await.map(|(offset, _)| offset),
                ),
            };
            let last = base + i64::from(sent.records) - 1;
            wait_for = wait_for.max(Some(last));
            group.push(base);
        }
        // As the shard's produce does before it waits.
        if partition.snapshot_producers_if_none().await.is_err() {
            assert!(disk.crashed(), "{context}: the first snapshot failed with no crash");
            return true;
        }
        if let Err(e) = log.wait_done(wait_for.expect("a batch was sent")).await {
            assert!(disk.crashed(), "{context}: a sync failed with no crash: {e}");
            return true;
        }
        for base in group {
            let sent = producer.unacknowledged.remove(0);
            producer.acknowledged.insert(base, sent);
        }
        if rng.draw().is_multiple_of(3) && partition.snapshot_producers_if_rolled().await.is_err() {
            assert!(disk.crashed(), "{context}: a snapshot failed with no crash");
            return true;
        }
        if rng.draw().is_multiple_of(5) && log.enforce_retention(shardlog::log::now_ms()).await.is_err() {
            assert!(disk.crashed(), "{context}: retention failed with no crash");
            return true;
        }
        if disk.crashed() {
            return true;
        }
    }
    false
}

/// The checks after an open: acknowledged batches at their offsets, a
/// valid prefix, and producer state that knows the surviving batches.
async fn check_recovered(context: &str, log: &Log, producer: &Producer) {
    let start = log.log_start_offset();
    let end = log.log_end_offset();
    let mut offset = start;
    let mut stored: BTreeMap<i64, Bytes> = BTreeMap::new();
    while offset < end {
        let read = log.read(offset, 1 << 20).await.unwrap_or_else(|e| panic!("{context}: read at {offset}: {e}"));
        assert!(!read.batches.is_empty(), "{context}: nothing readable at {offset} below the end {end}");
        for batch in read.batches {
            let header = record_batch::validate(&batch, 1 << 20)
                .unwrap_or_else(|e| panic!("{context}: a stored batch at {offset} is invalid: {e}"));
            assert_eq!(header.base_offset, offset, "{context}: offsets are dense");
            offset = header.last_offset() + 1;
            stored.insert(header.base_offset, batch);
        }
    }
    for (base, sent) in &producer.acknowledged {
        let last = base + i64::from(sent.records) - 1;
        if last < start {
            continue; // retention took it
        }
        let batch = stored.get(base).unwrap_or_else(|| {
            panic!("{context}: acknowledged sequence {} at offset {base} is gone (log {start}..{end})", sent.sequence)
        });
        // Base offset (0..8) and leader epoch (12..16) are the broker's.
        assert!(
            batch[8..12] == sent.data[8..12] && batch[16..] == sent.data[16..],
            "{context}: offset {base} holds another batch than the one acknowledged there"
        );
    }
    // Nothing stored twice: each surviving sequence once.
    let mut sequences = BTreeMap::new();
    for (base, batch) in &stored {
        let header = BatchHeader::parse(batch, usize::MAX).expect("parsed above");
        if let Some(first) = sequences.insert(header.base_sequence, *base) {
            panic!("{context}: sequence {} stored at {first} and again at {base}", header.base_sequence);
        }
    }
}
