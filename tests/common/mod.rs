//! Shared test harness: a real `shardlog serve` process on free ports in a
//! temporary data directory, and small helpers over the crate's own client.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use shardlog::client::Connection;
use shardlog::protocol::fetch::{FetchPartition, FetchRequest, FetchResponse, FetchTopic};
use shardlog::protocol::offset_commit::{
    OffsetCommitPartition, OffsetCommitRequest, OffsetCommitResponse, OffsetCommitTopic,
};
use shardlog::protocol::produce::{ProducePartition, ProduceRequest, ProduceResponse, ProduceTopic};
use shardlog::protocol::record_batch::{encode_batch, ProducerFields, Record};
use shardlog::protocol::{ApiKey, Reader, Writer};

pub struct Broker {
    pub child: Option<Child>,
    pub port: u16,
    pub cores: usize,
    pub data: PathBuf,
    pub args: Vec<String>,
    /// Extra environment of the broker process (fault-injection hooks).
    pub env: Vec<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

/// Finds `count` consecutive free ports, below Linux's ephemeral range
/// (32768 and up): a port the kernel hands to some client connection
/// meanwhile could otherwise be taken by the time the broker binds it.
pub fn free_ports(count: usize) -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 20);
    for _ in 0..500 {
        let draw = DRAWS.fetch_add(1, Ordering::Relaxed);
        let mut x = seed.wrapping_add(draw.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 29;
        let base = 12_000 + (x % (20_000 - count as u64)) as u16;
        if (0..count as u16).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no free ports");
}

impl Broker {
    pub fn start(cores: usize, extra: &[&str]) -> Broker {
        Broker::start_with_env(cores, extra, &[])
    }

    pub fn start_with_env(cores: usize, extra: &[&str], env: &[(&str, &str)]) -> Broker {
        let mut broker = Broker::prepare(cores, extra);
        broker.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        broker.spawn();
        broker
    }

    /// A broker on free ports in a new temporary directory, not started.
    pub fn prepare(cores: usize, extra: &[&str]) -> Broker {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        Broker {
            child: None,
            port: free_ports(cores),
            cores,
            data,
            args: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            _dir: Some(dir),
        }
    }

    pub fn spawn(&mut self) {
        self.launch();
        self.wait_ready();
    }

    /// Starts the process without waiting for it to serve (a machine of a
    /// cluster serves only once a quorum of voters runs).
    pub fn launch(&mut self) {
        let data_override = self.args.iter().any(|a| a == "--data");
        let child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
            .arg("serve")
            .args(if data_override { vec![] } else { vec!["--data".into(), self.data.display().to_string()] })
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--cores")
            .arg(self.cores.to_string())
            .args(if self.args.iter().any(|a| a == "--log-level") { vec![] } else { vec!["--log-level", "warn"] })
            .args(if self.args.iter().any(|a| a == "--metrics-port") { vec![] } else { vec!["--metrics-port", "0"] })
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shardlog");
        self.child = Some(child);
    }

    /// Waits until every core answers a request.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let ports = if self.args.iter().any(|a| a == "shared") { 1 } else { self.cores };
        for core in 0..ports {
            // A real request, not just a connect: after a kill -9 the old
            // listening socket lingers briefly while io_uring tears down.
            loop {
                let answered = Connection::connect(("127.0.0.1", self.port + core as u16), Duration::from_secs(2))
                    .and_then(|mut conn| conn.request(ApiKey::ApiVersions, 0, |_| {}).map(|_| ()));
                if answered.is_ok() {
                    break;
                }
                assert!(self.alive(), "broker exited during start");
                assert!(Instant::now() < deadline, "broker did not start listening");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn connect(&self) -> Connection {
        self.connect_port(self.port)
    }

    pub fn connect_port(&self, port: u16) -> Connection {
        Connection::connect(("127.0.0.1", port), Duration::from_secs(10)).expect("connect")
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop(&mut self) -> i32 {
        let Some(mut child) = self.child.take() else { return -1 };
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let status = child.wait().expect("wait");
        status.code().unwrap_or(-1)
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        assert_eq!(self.stop(), 0, "clean shutdown");
        self.spawn();
    }

    /// Is the process still running?
    pub fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(child) => child.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        match self.args.iter().position(|a| a == "--data") {
            Some(at) => PathBuf::from(&self.args[at + 1]),
            None => self.data.clone(),
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A connection to a Kafka port on 127.0.0.1.
pub fn connect(port: u16) -> Connection {
    Connection::connect(("127.0.0.1", port), Duration::from_secs(10)).expect("connect")
}

pub fn records(prefix: &str, count: usize) -> Vec<Record> {
    (0..count)
        .map(|i| Record {
            key: Some(Bytes::from(format!("{prefix}-key-{i}"))),
            value: Some(Bytes::from(format!("{prefix}-value-{i}"))),
            headers: vec![("h".into(), Some(Bytes::from(format!("{i}"))))],
            timestamp_delta: i as i64,
            offset_delta: i as i32,
        })
        .collect()
}

pub fn batch(prefix: &str, count: usize) -> Bytes {
    encode_batch(&records(prefix, count), shardlog::log::now_ms() as i64, ProducerFields::NONE)
}

/// A whole request frame (size prefix, v1 header without a client id, body)
/// of API key `api_key`, for tests that write raw bytes: pipelines, split
/// frames, keys no Kafka has.
pub fn request_frame(api_key: i16, version: i16, correlation: i32, body: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::new();
    w.i16(api_key);
    w.i16(version);
    w.i32(correlation);
    w.nullable_string(None);
    body(&mut w);
    let body = w.into_bytes();
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// The next response frame on `conn`, checked to answer `correlation`
/// (a connection's answers come in request order), past its header.
pub fn read_answer(conn: &mut Connection, correlation: i32) -> Reader {
    let mut reader = Reader::new(conn.read_frame().expect("a response frame"));
    assert_eq!(reader.i32().expect("a correlation id"), correlation, "answers in request order");
    reader
}

/// A Produce request of `records` for one partition.
pub fn produce_request(topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest {
        transactional_id: None,
        acks,
        timeout_ms: 10_000,
        topics: vec![ProduceTopic {
            name: topic.into(),
            partitions: vec![ProducePartition { index: partition, records: Some(records) }],
        }],
    }
}

pub fn produce(conn: &mut Connection, topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceResponse {
    let request = produce_request(topic, partition, records, acks);
    let reader = conn.request(ApiKey::Produce, 8, |w| request.encode(w)).expect("produce");
    shardlog::client::decode(reader, 8, ProduceResponse::decode).expect("decode produce")
}

/// A Fetch request for one partition from `offset`.
pub fn fetch_request(topic: &str, partition: i32, offset: i64, max_wait_ms: i32, min_bytes: i32) -> FetchRequest {
    FetchRequest {
        replica_id: -1,
        max_wait_ms,
        min_bytes,
        max_bytes: 50 << 20,
        isolation_level: 0,
        session_id: 0,
        session_epoch: -1,
        topics: vec![FetchTopic {
            name: topic.into(),
            partitions: vec![FetchPartition {
                index: partition,
                current_leader_epoch: -1,
                fetch_offset: offset,
                log_start_offset: -1,
                partition_max_bytes: 10 << 20,
            }],
        }],
        forgotten: Vec::new(),
        rack_id: String::new(),
    }
}

pub fn fetch(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
    min_bytes: i32,
) -> FetchResponse {
    let request = fetch_request(topic, partition, offset, max_wait_ms, min_bytes);
    let reader = conn.request(ApiKey::Fetch, 11, |w| request.encode(w, 11)).expect("fetch");
    shardlog::client::decode(reader, 11, FetchResponse::decode).expect("decode fetch")
}

pub fn create_topic(broker: &Broker, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut admin = shardlog::client::admin::Admin::connect(&broker.bootstrap()).expect("admin");
    let configs = configs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let result = admin.create_topic(name, partitions, &configs).expect("create topic");
    assert!(result.error.is_ok(), "create {name}: {result:?}");
}

/// Port of the core that leads `topic`/`partition` (per-core mode).
pub fn leader_port(broker: &Broker, topic: &str, partition: i32) -> u16 {
    let mut admin = shardlog::client::admin::Admin::connect(&broker.bootstrap()).expect("admin");
    let metadata = admin.metadata(Some(vec![topic.into()])).expect("metadata");
    let leader = metadata.topics[0].partitions.iter().find(|p| p.index == partition).expect("partition").leader_id;
    metadata.brokers.iter().find(|b| b.node_id == leader).expect("leader broker").port as u16
}

/// The first word of a field of /proc/PID/status (`VmRSS:`, `THP_enabled:`, ...).
pub fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status.lines().find(|l| l.starts_with(field)).expect("field in /proc/pid/status");
    line.split_whitespace().nth(1).expect("a value").to_string()
}

/// A size field of /proc/PID/status (`VmRSS:`, `VmHWM:`, ...), in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    status_field(pid, field).parse().expect("a number")
}

/// The sum of every sample of metric `name` (all its labels) in a scrape of
/// the broker's metrics endpoint on `port`.
pub fn metric(port: u16, name: &str) -> f64 {
    let (status, body) =
        shardlog::client::status::http_get(&format!("127.0.0.1:{port}"), "/metrics", Duration::from_secs(10))
            .expect("scrape");
    assert_eq!(status, 200);
    body.lines()
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An admin OffsetCommit (generation -1, no member) of `offsets` of
/// `topic` for `group`.
pub fn commit(conn: &mut Connection, group: &str, topic: &str, offsets: &[(i32, i64)]) -> OffsetCommitResponse {
    let request = OffsetCommitRequest {
        group_id: group.into(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
        retention_time_ms: -1,
        topics: vec![OffsetCommitTopic {
            name: topic.into(),
            partitions: offsets
                .iter()
                .map(|(p, o)| OffsetCommitPartition {
                    partition_index: *p,
                    committed_offset: *o,
                    committed_leader_epoch: -1,
                    committed_metadata: Some("m".into()),
                })
                .collect(),
        }],
    };
    let reader = conn.request(ApiKey::OffsetCommit, 7, |w| request.encode(w, 7)).unwrap();
    shardlog::client::decode(reader, 7, OffsetCommitResponse::decode).unwrap()
}

/// OffsetFetch of `partitions` of `topic`: the top-level error and each
/// committed offset (-1: none).
pub fn fetch_committed(
    conn: &mut Connection,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> (shardlog::protocol::ErrorCode, Vec<i64>) {
    use shardlog::protocol::offset_fetch::*;
    let request = OffsetFetchRequest {
        group_id: group.into(),
        topics: Some(vec![OffsetFetchTopic { name: topic.into(), partition_indexes: partitions.to_vec() }]),
    };
    let reader = conn.request(ApiKey::OffsetFetch, 5, |w| request.encode(w, 5)).unwrap();
    let answer = shardlog::client::decode(reader, 5, OffsetFetchResponse::decode).unwrap();
    let offsets =
        answer.topics.first().map_or(Vec::new(), |t| t.partitions.iter().map(|p| p.committed_offset).collect());
    (answer.error, offsets)
}
