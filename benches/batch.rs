//! Batch validation and CRC-32C throughput. Two CRC-32C crates are measured
//! side by side (`crc32c`: SSE4.2/ARMv8 instructions; `crc`: table-driven) to
//! justify the choice; `validate` is the broker's whole per-batch check.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use shardlog::protocol::record_batch::{encode_batch, validate, ProducerFields, Record};

fn batch_of(bytes_total: usize, record_bytes: usize) -> Bytes {
    let count = (bytes_total / (record_bytes + 8)).max(1);
    let records: Vec<Record> = (0..count)
        .map(|i| Record {
            value: Some(Bytes::from(vec![(i % 251) as u8; record_bytes])),
            offset_delta: i as i32,
            ..Record::default()
        })
        .collect();
    encode_batch(&records, 0, ProducerFields::NONE)
}

fn crc(c: &mut Criterion) {
    let table = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
    let mut group = c.benchmark_group("crc32c");
    for size in [16 << 10, 1 << 20] {
        let data = vec![0x5au8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("crc32c-crate", size), &data, |b, d| b.iter(|| crc32c::crc32c(d)));
        group.bench_with_input(BenchmarkId::new("crc-crate-table", size), &data, |b, d| b.iter(|| table.checksum(d)));
    }
    group.finish();
    assert_eq!(crc32c::crc32c(b"123456789"), table.checksum(b"123456789"));
}

fn validation(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate");
    for size in [16 << 10, 1 << 20] {
        let batch = batch_of(size, 1024);
        group.throughput(Throughput::Bytes(batch.len() as u64));
        group.bench_with_input(BenchmarkId::new("1KiB-records", size), &batch, |b, batch| {
            b.iter(|| validate(batch, 2 << 20).expect("valid"))
        });
    }
    group.finish();
}

criterion_group!(benches, crc, validation);
criterion_main!(benches);
