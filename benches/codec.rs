//! Codec throughput: decoding a Produce request and encoding a Fetch response
//! (the two hot-path messages).

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardlog::protocol::fetch::{FetchPartitionResponse, FetchResponse, FetchTopicResponse};
use shardlog::protocol::produce::{ProducePartition, ProduceRequest, ProduceTopic};
use shardlog::protocol::{ErrorCode, Reader, Writer};

fn produce_request(partitions: usize, batch_bytes: usize) -> Bytes {
    let request = ProduceRequest {
        transactional_id: None,
        acks: 1,
        timeout_ms: 1000,
        topics: vec![ProduceTopic {
            name: "bench".into(),
            partitions: (0..partitions)
                .map(|i| ProducePartition { index: i as i32, records: Some(Bytes::from(vec![1u8; batch_bytes])) })
                .collect(),
        }],
    };
    let mut w = Writer::new();
    request.encode(&mut w);
    w.into_bytes()
}

fn codecs(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec");
    let frame = produce_request(100, 16 << 10);
    group.throughput(Throughput::Bytes(frame.len() as u64));
    group.bench_function("produce-decode-100x16KiB", |b| {
        b.iter(|| ProduceRequest::decode(&mut Reader::new(frame.clone()), 8).expect("decodes"))
    });
    let response = FetchResponse {
        throttle_time_ms: 0,
        error: Some(ErrorCode::None),
        session_id: 0,
        topics: vec![FetchTopicResponse {
            name: "bench".into(),
            partitions: (0..100)
                .map(|i| FetchPartitionResponse {
                    index: i,
                    error: ErrorCode::None,
                    high_watermark: 1000,
                    last_stable_offset: 1000,
                    log_start_offset: 0,
                    records: vec![Bytes::from(vec![2u8; 16 << 10])],
                    aborted_transactions: Vec::new(),
                    preferred_read_replica: -1,
                })
                .collect(),
        }],
    };
    group.throughput(Throughput::Bytes(100 * (16 << 10)));
    group.bench_function("fetch-encode-100x16KiB", |b| {
        b.iter(|| {
            let mut w = Writer::new();
            response.encode(&mut w, 11);
            w.into_chunks()
        })
    });
    group.finish();
}

criterion_group!(benches, codecs);
criterion_main!(benches);
