//! The storage engine on real O_DIRECT files: append throughput for 16 KiB
//! and 1 MiB batches under flush `never` and `always`, index lookup, and
//! tail-cache reads. Runs inside a glommio executor (`iter_custom`).
//! SHARDLOG_BENCH_DIR picks the directory (default: the system temp dir).

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use glommio::{LocalExecutorBuilder, Placement};
use shardlog::log::index::{OffsetEntry, SegmentIndex, TimeEntry};
use shardlog::log::{FlushPolicy, Log, LogConfig};
use shardlog::protocol::record_batch::{encode_batch, validate, BatchHeader, ProducerFields, Record};

fn batch_of(bytes_total: usize) -> Bytes {
    let count = (bytes_total / 1032).max(1);
    let records: Vec<Record> = (0..count)
        .map(|i| Record {
            value: Some(Bytes::from(vec![(i % 251) as u8; 1024])),
            offset_delta: i as i32,
            ..Record::default()
        })
        .collect();
    encode_batch(&records, 0, ProducerFields::NONE)
}

fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("SHARDLOG_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).expect("bench dir"),
        None => tempfile::tempdir().expect("temp dir"),
    }
}

/// Appends `iterations` batches and waits until they are done under the
/// policy (for `never`: written), returning the elapsed time.
fn run_appends(batch: Bytes, flush: FlushPolicy, iterations: u64) -> Duration {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(move || async move {
            let dir = bench_dir();
            let config =
                LogConfig { flush, pending_bytes_max: 32 << 20, batch_bytes_max: 2 << 20, ..LogConfig::default() };
            let (log, _) = Log::open(dir.path().join("bench-0"), config).await.expect("open");
            let header = validate(&batch, 2 << 20).expect("valid");
            // Each batch arrives in a buffer of its own, as a produce request's
            // do; filling it (the socket read's copy) is not timed.
            let received: Vec<BytesMut> = (0..iterations).map(|_| BytesMut::from(&batch[..])).collect();
            let started = Instant::now();
            let mut pending = std::collections::VecDeque::new();
            for data in received {
                let appended = log.append(data, &header).expect("append");
                // Keep up to 64 appends in flight (a sliding window), as pipelined
                // producers do.
                let waiter = log.clone();
                pending.push_back(glommio::spawn_local(async move { waiter.wait_done(appended.last_offset).await }));
                if pending.len() >= 64 {
                    pending.pop_front().expect("in flight").await.expect("done");
                }
            }
            for task in pending {
                task.await.expect("done");
            }
            log.sync().await.expect("sync");
            let elapsed = started.elapsed();
            log.close().await.expect("close");
            elapsed
        })
        .expect("executor")
        .join()
        .expect("join")
}

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("append");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for size in [16 << 10, 1 << 20] {
        let batch = batch_of(size);
        group.throughput(Throughput::Bytes(batch.len() as u64));
        for (name, flush) in [("never", FlushPolicy::Never), ("always", FlushPolicy::Always)] {
            let b = batch.clone();
            group.bench_function(BenchmarkId::new(format!("flush-{name}"), size), move |bencher| {
                bencher.iter_custom(|iterations| run_appends(b.clone(), flush, iterations))
            });
        }
    }
    group.finish();
}

fn index_lookup(c: &mut Criterion) {
    let mut index = SegmentIndex::default();
    for i in 0..262_144u32 {
        index.push(
            OffsetEntry { relative_offset: i * 4, position: i * 4096 },
            TimeEntry { max_timestamp: i64::from(i), relative_offset: i * 4 },
        );
    }
    let mut probe = 0u32;
    c.bench_function("index-lookup-1GiB-segment", |b| {
        b.iter(|| {
            probe = probe.wrapping_mul(1_664_525).wrapping_add(1_013_904_223) % (262_144 * 4);
            index.position_for(probe)
        })
    });
}

fn tail_read(c: &mut Criterion) {
    let batch = batch_of(16 << 10);
    let header = BatchHeader::parse(&batch, 2 << 20).expect("header");
    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Bytes(batch.len() as u64));
    group.bench_function("tail-cache-16KiB", |bencher| {
        let batch = batch.clone();
        bencher.iter_custom(move |iterations| {
            let batch = batch.clone();
            LocalExecutorBuilder::new(Placement::Unbound)
                .io_memory(1 << 20)
                .spawn(move || async move {
                    let dir = bench_dir();
                    let config = LogConfig { flush: FlushPolicy::Never, ..LogConfig::default() };
                    let (log, _) = Log::open(dir.path().join("read-0"), config).await.expect("open");
                    for _ in 0..32 {
                        let appended = log.append(BytesMut::from(&batch[..]), &header).expect("append");
                        log.wait_done(appended.last_offset).await.expect("done");
                    }
                    let last = log.log_end_offset() - 1;
                    let started = Instant::now();
                    for _ in 0..iterations {
                        let read = log.read(last, 16 << 10).await.expect("read");
                        assert_eq!(read.batches.len(), 1);
                    }
                    let elapsed = started.elapsed();
                    log.close().await.expect("close");
                    elapsed
                })
                .expect("executor")
                .join()
                .expect("join")
        })
    });
    group.finish();
}

criterion_group!(benches, append, index_lookup, tail_read);
criterion_main!(benches);
