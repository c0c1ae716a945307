//! The metadata image at scale (issue 29): an image of 100,000 partitions
//! (1,000 topics of 100 on three machines of two cores), built from records.
//! Measures replaying 1,000 PartitionChange records into a delta and
//! finishing it (the per-commit cost every machine pays), encoding and
//! decoding the image's snapshot (prints its size), building the cores'
//! view of one machine (`bridge::local_image`, done once per commit), and
//! encoding a Metadata v8 response for 10,000 partitions.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardlog::cluster::image::{decode_snapshot, encode_snapshot, ClusterImage, MetadataDelta, Provenance};
use shardlog::cluster::records::{
    MachineRegistration, MetadataRecord, NodeRegistration, PartitionChange, PartitionRecord,
};

const TOPICS: usize = 1_000;
const PARTITIONS_PER_TOPIC: usize = 100;
const MACHINES: u64 = 3;
const CORES: u32 = 2;

fn topic_id(topic: usize) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&(topic as u64 + 1).to_be_bytes());
    id
}

fn large_image() -> ClusterImage {
    let mut delta = MetadataDelta::new(&ClusterImage::default());
    let mut offset = 0;
    let mut replay = |delta: &mut MetadataDelta, record: MetadataRecord| {
        offset += 1;
        delta.replay(Provenance { offset, epoch: 1 }, &record).expect("a valid record");
    };
    replay(&mut delta, MetadataRecord::ClusterCreated { cluster_id: "bench".into() });
    for machine in 1..=MACHINES {
        let nodes = (0..CORES)
            .map(|core| NodeRegistration {
                node_id: ((machine - 1) * u64::from(CORES) + u64::from(core)) as i32,
                core,
                host: format!("10.0.0.{machine}"),
                port: 9092 + core as i32,
            })
            .collect();
        replay(
            &mut delta,
            MetadataRecord::RegisterMachine(MachineRegistration { machine, incarnation: 1, rack: None, nodes }),
        );
    }
    let nodes = (MACHINES * u64::from(CORES)) as i32;
    for topic in 0..TOPICS {
        replay(&mut delta, MetadataRecord::Topic { name: format!("topic-{topic:04}"), topic_id: topic_id(topic) });
        for partition in 0..PARTITIONS_PER_TOPIC {
            let leader = ((topic * PARTITIONS_PER_TOPIC + partition) as i32) % nodes;
            let replicas = vec![leader, (leader + 2) % nodes, (leader + 4) % nodes];
            replay(
                &mut delta,
                MetadataRecord::Partition(PartitionRecord {
                    topic_id: topic_id(topic),
                    partition: partition as i32,
                    isr: replicas.clone(),
                    replicas,
                    leader,
                    leader_epoch: 0,
                    partition_epoch: 0,
                }),
            );
        }
    }
    delta.finish().0
}

fn apply(c: &mut Criterion) {
    let image = large_image();
    assert_eq!(image.partition_count(), TOPICS * PARTITIONS_PER_TOPIC);
    let base = image.provenance.offset;
    // 1,000 leader changes spread over every topic: the worst case for copy
    // on write, each touches another topic.
    let changes: Vec<MetadataRecord> = (0..1_000)
        .map(|i| {
            MetadataRecord::PartitionChange(PartitionChange {
                topic_id: topic_id(i % TOPICS),
                partition: (i / TOPICS) as i32,
                leader: Some(-1),
                isr: Some(Vec::new()),
                replicas: None,
            })
        })
        .collect();
    let mut group = c.benchmark_group("metadata-100k-partitions");
    group.throughput(Throughput::Elements(changes.len() as u64));
    group.bench_function("replay-1000-partition-changes", |b| {
        b.iter(|| {
            let mut delta = MetadataDelta::new(&image);
            for (i, record) in changes.iter().enumerate() {
                delta.replay(Provenance { offset: base + 1 + i as u64, epoch: 2 }, record).expect("valid");
            }
            delta.finish()
        })
    });
    group.finish();
}

fn snapshot(c: &mut Criterion) {
    let image = large_image();
    let bytes = encode_snapshot(&image);
    println!(
        "metadata snapshot of {} partitions: {} bytes ({:.1} bytes per partition)",
        image.partition_count(),
        bytes.len(),
        bytes.len() as f64 / image.partition_count() as f64
    );
    let mut group = c.benchmark_group("metadata-100k-partitions");
    group.sample_size(20);
    group.bench_function("snapshot-encode", |b| b.iter(|| encode_snapshot(&image)));
    group.bench_function("snapshot-decode", |b| b.iter(|| decode_snapshot(&bytes).expect("decodes")));
    group.finish();
}

/// `image` with partition 0 of topic 0 led by node 1 instead.
fn one_partition_moved(image: &ClusterImage) -> ClusterImage {
    let mut delta = MetadataDelta::new(image);
    let record = MetadataRecord::PartitionChange(PartitionChange {
        topic_id: topic_id(0),
        partition: 0,
        leader: Some(1),
        isr: Some(vec![1]),
        replicas: Some(vec![1]),
    });
    delta.replay(Provenance { offset: image.provenance.offset + 1, epoch: 2 }, &record).expect("valid");
    delta.finish().0
}

fn cores_and_metadata(c: &mut Criterion) {
    let image = large_image();
    let machine = shardlog::cluster::MachineId::new(1).expect("non-zero");
    let mut group = c.benchmark_group("metadata-100k-partitions");
    group.sample_size(20);
    let image = std::sync::Arc::new(image);
    group.bench_function("local-image-for-the-cores", |b| {
        b.iter(|| shardlog::cluster::bridge::local_image(&image, machine))
    });
    // What a commit of one PartitionChange costs the cores' view.
    let previous = shardlog::cluster::bridge::local_image(&image, machine);
    let changed = std::sync::Arc::new(one_partition_moved(&image));
    group.bench_function("local-image-since-one-partition-moved", |b| {
        b.iter(|| shardlog::cluster::bridge::local_image_since(&previous, &changed, machine))
    });
    group.finish();

    use shardlog::protocol::metadata::{MetadataBroker, MetadataPartition, MetadataResponse, MetadataTopic};
    use shardlog::protocol::{ErrorCode, Writer};
    let topics = (0..100)
        .map(|t| MetadataTopic {
            error: ErrorCode::None,
            name: format!("topic-{t:04}"),
            is_internal: false,
            partitions: (0..100)
                .map(|p| MetadataPartition {
                    error: ErrorCode::None,
                    index: p,
                    leader_id: p % 6,
                    leader_epoch: 0,
                    replica_nodes: vec![p % 6],
                    isr_nodes: vec![p % 6],
                })
                .collect(),
        })
        .collect();
    let brokers =
        (0..6).map(|n| MetadataBroker { node_id: n, host: "10.0.0.1".into(), port: 9092 + n, rack: None }).collect();
    let response =
        MetadataResponse { throttle_time_ms: 0, brokers, cluster_id: Some("bench".into()), controller_id: 0, topics };
    let mut group = c.benchmark_group("metadata-response");
    group.bench_function("encode-v8-10000-partitions", |b| {
        b.iter(|| {
            let mut w = Writer::new();
            response.encode(&mut w, 8);
            w.into_bytes()
        })
    });
    group.finish();
}

criterion_group!(benches, apply, snapshot, cores_and_metadata);
criterion_main!(benches);
