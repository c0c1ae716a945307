//! Operating a broker: the Prometheus metrics agree with what clients sent
//! and received, readiness follows recovery and shutdown, the HTTP endpoint
//! stays within its bounds, `shardlog cluster status` shows the nodes,
//! notable events are logged once at info, and the shipped systemd unit
//! passes `systemd-analyze verify`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use shardlog::client::groups::{GroupAdmin, ResetTarget};
use shardlog::client::status::http_get;
use shardlog::protocol::join_group::{JoinGroupProtocol, JoinGroupRequest, JoinGroupResponse};
use shardlog::protocol::record_batch::{encode_batch, BatchHeader, ProducerFields, Record};
use shardlog::protocol::{ApiKey, ErrorCode};

/// Samples of one scrape: series (`name{labels}`) to value.
struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn take(metrics_port: u16) -> Scrape {
        let (code, body) = get(metrics_port, "/metrics").expect("scrape");
        assert_eq!(code, 200, "{body}");
        let mut samples = BTreeMap::new();
        for line in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let (series, value) = line.rsplit_once(' ').expect("sample line");
            samples.insert(series.to_string(), value.parse::<f64>().expect("sample value"));
        }
        Scrape(samples)
    }

    /// The sum of every sample of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(series, _)| {
                let (series_name, series_labels) = series.split_once('{').unwrap_or((series.as_str(), ""));
                series_name == name && labels.iter().all(|(k, v)| series_labels.contains(&format!("{k}=\"{v}\"")))
            })
            .map(|(_, value)| value)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.0.keys().any(|series| series.split('{').next() == Some(name))
    }
}

fn get(port: u16, path: &str) -> Result<(u16, String), String> {
    http_get(&format!("127.0.0.1:{port}"), path, Duration::from_secs(10))
}

fn record_count(batch: &Bytes) -> u64 {
    BatchHeader::parse(batch, usize::MAX).expect("batch header").record_count as u64
}

#[test]
fn metrics_match_the_bytes_records_and_requests_clients_sent_and_received() {
    let metrics_port = free_ports(1);
    let broker = Broker::start(2, &["--metrics-port", &metrics_port.to_string(), "--metrics-per-partition", "true"]);
    create_topic(&broker, "ops", 2, &[]);
    let (mut sent_bytes, mut sent_records, mut produce_requests) = (0u64, 0u64, 0u64);
    // Under flush=always (the default) each of these, sent after the
    // previous answer, waited for an fdatasync of its own.
    let mut acknowledged_produces = 0u64;
    let mut per_partition = [0u64; 2];
    for partition in 0..2 {
        let mut conn = broker.connect_port(leader_port(&broker, "ops", partition));
        for round in 0..5 {
            let count = 3 + round;
            let data = batch(&format!("p{partition}-r{round}"), count);
            sent_bytes += data.len() as u64;
            sent_records += count as u64;
            per_partition[partition as usize] += count as u64;
            let answer = produce(&mut conn, "ops", partition, data, 1);
            assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
            produce_requests += 1;
            acknowledged_produces += 1;
        }
        // A scrape in the middle of the run sees what was produced so far.
        let scrape = Scrape::take(metrics_port);
        assert_eq!(scrape.sum("shardlog_topic_produced_records_total", &[("topic", "ops")]), sent_records as f64);
    }
    let mut conn = broker.connect();
    let refused = produce(&mut conn, "ops", 7, batch("nowhere", 1), 1);
    assert_eq!(refused.topics[0].partitions[0].error, ErrorCode::UnknownTopicOrPartition);
    produce_requests += 1;

    let (mut received_bytes, mut received_records, mut fetch_requests) = (0u64, 0u64, 0u64);
    for partition in 0..2 {
        let mut conn = broker.connect_port(leader_port(&broker, "ops", partition));
        let mut offset = 0;
        loop {
            let answer = fetch(&mut conn, "ops", partition, offset, 0, 1);
            fetch_requests += 1;
            let batches = &answer.topics[0].partitions[0].records;
            let Some(last) = batches.last() else { break };
            received_bytes += batches.iter().map(|b| b.len() as u64).sum::<u64>();
            received_records += batches.iter().map(record_count).sum::<u64>();
            offset = BatchHeader::parse(last, usize::MAX).unwrap().last_offset() + 1;
        }
    }
    assert_eq!((received_bytes, received_records), (sent_bytes, sent_records), "the client read back everything");
    let mut groups = GroupAdmin::connect(&broker.bootstrap()).expect("group admin");
    groups.reset_offsets("lagging", "ops", ResetTarget::Offset(2)).expect("commit offsets");
    // Let the task-queue probe tick and keep one client connection open.
    std::thread::sleep(Duration::from_millis(100));
    let _held = broker.connect();

    let m = Scrape::take(metrics_port);
    let ops = [("topic", "ops")];
    assert_eq!(m.sum("shardlog_topic_produced_bytes_total", &ops), sent_bytes as f64);
    assert_eq!(m.sum("shardlog_topic_produced_records_total", &ops), sent_records as f64);
    assert_eq!(m.sum("shardlog_topic_fetched_bytes_total", &ops), received_bytes as f64);
    assert_eq!(m.sum("shardlog_topic_fetched_records_total", &ops), received_records as f64);
    assert_eq!(m.sum("shardlog_produced_bytes_total", &[]), sent_bytes as f64, "per-core counters add up");
    assert_eq!(m.sum("shardlog_fetched_records_total", &[]), received_records as f64);
    assert_eq!(m.sum("shardlog_requests_total", &[("api", "Produce")]), produce_requests as f64);
    assert_eq!(m.sum("shardlog_requests_total", &[("api", "Fetch")]), fetch_requests as f64);
    assert_eq!(m.sum("shardlog_request_duration_seconds_count", &[("api", "Produce")]), produce_requests as f64);
    assert_eq!(
        m.sum("shardlog_request_errors_total", &[("api", "Produce"), ("error", "UnknownTopicOrPartition")]),
        1.0
    );
    assert_eq!(m.sum("shardlog_requests_in_flight", &[("api", "Produce")]), 0.0);
    // The topic's 2 and __consumer_offsets' (created by the first group).
    let offsets_partitions = f64::from(shardlog::constants::OFFSETS_TOPIC_PARTITIONS_DEFAULT);
    assert_eq!(m.sum("shardlog_partitions", &[]), 2.0 + offsets_partitions);
    assert_eq!(m.sum("shardlog_partition_leaders", &[]), 2.0 + offsets_partitions);
    assert_eq!(m.sum("shardlog_topic_size_bytes", &ops), sent_bytes as f64, "the log holds the batches as sent");
    assert_eq!(m.sum("shardlog_partition_log_end_offset", &[("topic", "ops"), ("partition", "0")]), 25.0);
    assert_eq!(m.sum("shardlog_partition_high_watermark", &[("topic", "ops"), ("partition", "1")]), 25.0);
    let lagging = [("group", "lagging"), ("topic", "ops")];
    assert_eq!(m.sum("shardlog_group_lag_records", &lagging), (sent_records - 4) as f64);
    assert_eq!(m.sum("shardlog_group_committed_offset", &[("group", "lagging"), ("partition", "1")]), 2.0);
    assert_eq!(
        m.sum("shardlog_group_partition_lag_records", &[("group", "lagging"), ("partition", "0")]),
        (per_partition[0] - 2) as f64
    );
    assert_eq!(m.sum("shardlog_groups", &[]), 1.0);
    assert!(m.sum("shardlog_connections", &[]) >= 1.0);
    assert!(
        m.sum("shardlog_fsync_duration_seconds_count", &[]) >= acknowledged_produces as f64,
        "flush=always: an fsync for each of the {acknowledged_produces} acknowledged produces"
    );
    assert!(m.sum("shardlog_task_queue_delay_seconds_count", &[("core", "1")]) >= 1.0);
    assert_eq!(m.sum("shardlog_ready", &[]), 1.0);
    assert_eq!(m.sum("shardlog_metrics_cores_answered", &[]), 2.0);
    assert!(m.sum("shardlog_disk_free_bytes", &[]) > 0.0);
    assert!(m.has("shardlog_inbox_depth") && m.has("shardlog_in_flight_request_bytes"));
}

#[test]
fn per_partition_series_are_off_by_default() {
    let metrics_port = free_ports(1);
    let broker = Broker::start(1, &["--metrics-port", &metrics_port.to_string()]);
    create_topic(&broker, "quiet", 3, &[]);
    let m = Scrape::take(metrics_port);
    assert_eq!(m.sum("shardlog_topic_partitions", &[("topic", "quiet")]), 3.0);
    assert!(!m.has("shardlog_partition_log_end_offset"));
    assert!(!m.has("shardlog_group_partition_lag_records"));
}

#[test]
fn deleting_a_topic_drops_its_series_but_not_the_core_totals() {
    let metrics_port = free_ports(1);
    let broker = Broker::start(1, &["--metrics-port", &metrics_port.to_string()]);
    create_topic(&broker, "gone", 1, &[]);
    let data = batch("g", 4);
    let mut conn = broker.connect();
    assert_eq!(produce(&mut conn, "gone", 0, data.clone(), 1).topics[0].partitions[0].error, ErrorCode::None);
    let before = Scrape::take(metrics_port);
    assert_eq!(before.sum("shardlog_topic_produced_bytes_total", &[("topic", "gone")]), data.len() as f64);
    let mut admin = shardlog::client::admin::Admin::connect(&broker.bootstrap()).unwrap();
    assert!(admin.delete_topic("gone").unwrap().error.is_ok());
    let after = Scrape::take(metrics_port);
    assert!(!after.0.keys().any(|series| series.contains("topic=\"gone\"")), "{:?}", after.0);
    assert_eq!(after.sum("shardlog_produced_bytes_total", &[]), data.len() as f64, "counters never go down");
}

/// Polls `/v1/ready` as fast as it answers; the distinct statuses in the
/// order seen (0: connection refused), until 200 or the deadline.
fn watch_ready(port: u16, until_ok: bool, limit: Duration) -> Vec<u16> {
    let deadline = Instant::now() + limit;
    let mut seen: Vec<u16> = Vec::new();
    while Instant::now() < deadline {
        let status = get(port, "/v1/ready").map_or(0, |(code, _)| code);
        if seen.last() != Some(&status) {
            seen.push(status);
        }
        if (until_ok && status == 200) || (!until_ok && status == 0 && seen.len() > 1) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    seen
}

#[test]
fn ready_is_503_while_partitions_recover_200_once_listening_and_never_again_after_sigterm() {
    let metrics_port = free_ports(1);
    let mut broker = Broker::start(1, &["--metrics-port", &metrics_port.to_string()]);
    create_topic(&broker, "many", 1000, &[]);
    assert_eq!(broker.stop(), 0);
    let watcher = std::thread::spawn(move || watch_ready(metrics_port, true, Duration::from_secs(60)));
    broker.spawn();
    let seen = watcher.join().unwrap();
    let ready_at = seen.iter().position(|s| *s == 200).unwrap_or_else(|| panic!("never ready: {seen:?}"));
    assert!(seen[..ready_at].contains(&503), "503 while recovering 1000 partitions, then 200: {seen:?}");
    assert_eq!(get(metrics_port, "/v1/health").map(|(code, _)| code), Ok(200));

    let pid = broker.child.as_ref().expect("running").id() as i32;
    // SAFETY: signals a child process this test started.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let seen = watch_ready(metrics_port, false, Duration::from_secs(30));
    let stopping_at = seen.iter().position(|s| *s != 200).unwrap_or_else(|| panic!("still ready: {seen:?}"));
    assert!(
        seen[stopping_at..].iter().all(|s| *s == 503 || *s == 0),
        "503 or refused once shutdown begins, never 200 again: {seen:?}"
    );
    assert_eq!(broker.stop(), 0, "clean exit");
}

fn raw_http(port: u16, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = stream.write_all(request);
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

#[test]
fn metrics_endpoint_answers_get_only_and_bounds_the_request() {
    let metrics_port = free_ports(1);
    let _broker = Broker::start(1, &["--metrics-port", &metrics_port.to_string()]);
    assert!(raw_http(metrics_port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 200 "));
    assert!(raw_http(metrics_port, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    let post = raw_http(metrics_port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405 ") && post.contains("Allow: GET"), "{post}");
    assert!(raw_http(metrics_port, b"GARBAGE\r\n\r\n").starts_with("HTTP/1.1 400 "));
    let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
    huge.extend(std::iter::repeat_n(b'x', 16 * 1024));
    assert!(raw_http(metrics_port, &huge).starts_with("HTTP/1.1 431 "));
    let (code, body) = get(metrics_port, "/metrics?format=text").expect("scrape");
    assert_eq!(code, 200);
    assert!(body.contains("# TYPE shardlog_requests_total counter"), "{body}");
}

#[test]
fn metrics_port_that_collides_with_a_kafka_port_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["serve", "--port", "20000", "--cores", "2", "--metrics-port", "20001", "--data", "/nonexistent-x"])
        .output()
        .expect("run shardlog");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("metrics-port"));
}

/// Runs `shardlog serve ARGS`, which must end by itself within `limit`:
/// its exit status and what it wrote to stderr. One still running at
/// `limit` is killed and fails the test.
fn serve_until_exit(args: &[&str], limit: Duration) -> (std::process::ExitStatus, String) {
    serve_in_until_exit(Path::new("."), args, limit)
}

/// `serve_until_exit` with `cwd` as the working directory.
fn serve_in_until_exit(cwd: &Path, args: &[&str], limit: Duration) -> (std::process::ExitStatus, String) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .arg("serve")
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start shardlog");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return (status, reader.join().expect("stderr reader"));
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let text = reader.join().expect("stderr reader");
            panic!("`shardlog serve {}` still running after {limit:?}; it wrote:\n{text}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_broker_on_the_same_data_directory_is_refused_and_the_first_keeps_serving() {
    let broker = Broker::start(1, &[]);
    let data = broker.data_dir().display().to_string();
    let other_port = free_ports(1).to_string();
    let (status, stderr) = serve_until_exit(
        &["--data", &data, "--port", &other_port, "--cores", "1", "--metrics-port", "0"],
        Duration::from_secs(5),
    );
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains(&format!("data directory {data} is in use by another shardlog process")), "{stderr}");
    assert!(stderr.contains(&format!("{data}/.lock")), "{stderr}");

    create_topic(&broker, "still-served", 1, &[]);
    let mut conn = broker.connect();
    let produced = produce(&mut conn, "still-served", 0, batch("kept", 3), 1);
    assert_eq!(produced.topics[0].partitions[0].error, ErrorCode::None);
    let fetched = fetch(&mut conn, "still-served", 0, 0, 0, 1);
    assert_eq!(fetched.topics[0].partitions[0].records.len(), 1, "the first broker still serves its data");
}

#[test]
fn a_taken_kafka_port_ends_start_with_an_error_naming_the_core_once_and_the_port() {
    for core in 0..2u16 {
        let port = free_ports(2);
        let _held = std::net::TcpListener::bind(("127.0.0.1", port + core)).expect("hold a port");
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().display().to_string();
        let (status, stderr) = serve_until_exit(
            &["--data", &data, "--port", &port.to_string(), "--cores", "2", "--metrics-port", "0"],
            Duration::from_secs(15),
        );
        assert!(!status.success(), "{stderr}");
        let taken = port + core;
        assert!(stderr.contains(&format!("address in use; retrying address=127.0.0.1:{taken}")), "{stderr}");
        let error =
            stderr.lines().find(|l| l.starts_with("shardlog: ")).unwrap_or_else(|| panic!("no error: {stderr}"));
        assert!(error.starts_with(&format!("shardlog: core {core}: cannot listen on 127.0.0.1:{taken}: ")), "{error}");
        assert_eq!(error.matches("core ").count(), 1, "names the core once: {error}");
    }
}

#[test]
fn unreadable_old_offsets_logs_end_start_with_an_error_naming_the_absolute_path() {
    // A relative --data: the error names the path it resolved to.
    let dir = tempfile::tempdir().expect("tempdir");
    let cwd = dir.path().canonicalize().expect("canonical tempdir");
    std::fs::create_dir_all(cwd.join("rel")).expect("mkdir");
    std::fs::write(cwd.join("rel/__groups"), b"not a directory").expect("block the old offsets logs");
    let port = free_ports(2).to_string();
    let (status, stderr) = serve_in_until_exit(
        &cwd,
        &["--data", "rel", "--port", &port, "--cores", "2", "--metrics-port", "0"],
        Duration::from_secs(15),
    );
    assert!(!status.success(), "{stderr}");
    let error = stderr.lines().find(|l| l.starts_with("shardlog: ")).unwrap_or_else(|| panic!("no error: {stderr}"));
    let path = cwd.join("rel/__groups").display().to_string();
    assert_eq!(error, format!("shardlog: reading the old group offsets logs in {path}: Not a directory (os error 20)"));
}

#[test]
fn a_taken_metrics_port_ends_start_with_an_error_naming_the_port() {
    let metrics_port = free_ports(1);
    let _held = std::net::TcpListener::bind(("127.0.0.1", metrics_port)).expect("hold a port");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().display().to_string();
    let port = free_ports(2).to_string();
    let (status, stderr) = serve_until_exit(
        &["--data", &data, "--port", &port, "--cores", "2", "--metrics-port", &metrics_port.to_string()],
        Duration::from_secs(15),
    );
    assert!(!status.success(), "{stderr}");
    // The retry is said, not silent, and the error ends the process.
    assert!(stderr.contains(&format!("address in use; retrying address=127.0.0.1:{metrics_port}")), "{stderr}");
    assert!(stderr.contains(&format!("cannot listen for metrics on 127.0.0.1:{metrics_port}")), "{stderr}");
}

/// Whether the process may use transparent huge pages (its PR_SET_THP_DISABLE flag).
fn thp_enabled(broker: &Broker) -> bool {
    status_field(broker.child.as_ref().expect("running").id(), "THP_enabled:") == "1"
}

#[test]
fn a_broker_uses_huge_pages_only_when_asked() {
    let plain = Broker::start(1, &[]);
    let flag = Broker::start(1, &["--huge-pages", "true"]);
    let env = Broker::start_with_env(1, &[], &[("SHARDLOG_HUGE_PAGES", "true")]);
    assert!(!thp_enabled(&plain), "huge pages are off by default");
    assert!(thp_enabled(&flag), "--huge-pages true turns them on");
    assert!(thp_enabled(&env), "so does SHARDLOG_HUGE_PAGES, which a broker spawned by bench inherits");
    // Each still serves.
    for broker in [&plain, &flag, &env] {
        create_topic(broker, "t", 1, &[]);
        let mut conn = broker.connect();
        let response = produce(&mut conn, "t", 0, batch("m", 10), 1);
        assert_eq!(response.topics[0].partitions[0].error, ErrorCode::None);
    }
}

#[test]
fn cluster_status_shows_nodes_cores_partitions_and_disk_use() {
    let metrics_port = free_ports(1);
    let broker = Broker::start(2, &["--metrics-port", &metrics_port.to_string()]);
    create_topic(&broker, "spread", 4, &[]);
    let mut conn = broker.connect_port(leader_port(&broker, "spread", 0));
    produce(&mut conn, "spread", 0, batch("s", 10), 1);
    let output = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["cluster", "status", "--brokers", &broker.bootstrap(), "--metrics-port", &metrics_port.to_string()])
        .output()
        .expect("run shardlog");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("4 partitions"), "{text}");
    for core in 0..2u16 {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("127.0.0.1:{}", broker.port + core)))
            .unwrap_or_else(|| panic!("node of core {core}: {text}"));
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(columns[2], core.to_string(), "core column: {line}");
        assert_eq!(columns[3], "2", "partitions per core: {line}");
    }
    assert!(text.contains("broker ready, 2 cores") && text.contains("free of"), "{text}");
    let machine = std::fs::read_to_string(broker.data_dir().join("machine.id")).expect("machine.id");
    let quorum = text.lines().find(|l| l.starts_with("controller quorum:")).unwrap_or_else(|| panic!("{text}"));
    assert!(quorum.contains(&format!("controller machine {}", machine.trim())), "{quorum}");
    assert!(quorum.contains(&format!("voters {} (log end", machine.trim())), "{quorum}");

    // Without the endpoint the Metadata part still comes.
    let unreachable = free_ports(1);
    let output = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["cluster", "status", "--brokers", &broker.bootstrap(), "--metrics-port", &unreachable.to_string()])
        .output()
        .expect("run shardlog");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && text.contains("unavailable") && text.contains("4 partitions"), "{text}");
}

#[test]
fn notable_events_are_logged_once_at_info_without_per_request_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("broker.log");
    let port = free_ports(1);
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["serve", "--data", &dir.path().join("data").display().to_string(), "--port", &port.to_string()])
        .args(["--cores", "1", "--metrics-port", "0", "--log-level", "info", "--log-format", "json"])
        .args(["--segment-bytes", "65536", "--group-initial-rebalance-delay-ms", "0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("start shardlog");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut conn = loop {
        if let Ok(conn) = shardlog::client::Connection::connect(("127.0.0.1", port), Duration::from_secs(2)) {
            break conn;
        }
        assert!(Instant::now() < deadline, "broker did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut admin = shardlog::client::admin::Admin::connect(&format!("127.0.0.1:{port}")).unwrap();
    assert!(admin.create_topic("events", 1, &BTreeMap::new()).unwrap().error.is_ok());
    for round in 0..4 {
        let record = Record { value: Some(Bytes::from(vec![round as u8; 30_000])), ..Record::default() };
        let data = encode_batch(&[record], 1, ProducerFields::NONE);
        assert_eq!(produce(&mut conn, "events", 0, data, 1).topics[0].partitions[0].error, ErrorCode::None);
    }
    let join = JoinGroupRequest {
        group_id: "watchers".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 10_000,
        member_id: String::new(),
        group_instance_id: None,
        protocol_type: "consumer".into(),
        protocols: vec![JoinGroupProtocol { name: "range".into(), metadata: Bytes::new() }],
    };
    let reader = conn.request(ApiKey::JoinGroup, 1, |w| join.encode(w, 1)).unwrap();
    let joined = shardlog::client::decode(reader, 1, JoinGroupResponse::decode).unwrap();
    assert_eq!((joined.error, &joined.leader), (ErrorCode::None, &joined.member_id));
    assert!(admin.delete_topic("events").unwrap().error.is_ok());
    // SAFETY: signals a child process this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert!(child.wait().unwrap().success());

    let log = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<serde_json::Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let messages: Vec<&str> = lines.iter().filter_map(|l| l["fields"]["message"].as_str()).collect();
    let count = |message: &str| messages.iter().filter(|m| **m == message).count();
    assert_eq!(count("shardlog serving"), 1, "{log}");
    let created: BTreeSet<&str> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "topic created")
        .filter_map(|l| l["fields"]["topic"].as_str())
        .collect();
    assert_eq!(count("topic created"), 2, "{log}");
    assert_eq!(created, BTreeSet::from(["events", "__consumer_offsets"]), "the first group creates the offsets topic");
    assert!(count("rolled segment") >= 1, "{log}");
    assert_eq!(count("group rebalanced"), 1, "{log}");
    assert_eq!(count("topic deleted"), 1, "{log}");
    assert_eq!(count("stopped"), 1, "{log}");
    assert!(lines.iter().all(|l| l["level"] != "DEBUG" && l["level"] != "TRACE"));
    assert!(messages.len() < 15, "no per-request lines at info: {log}");
    let rebalanced = lines.iter().find(|l| l["fields"]["message"] == "group rebalanced").unwrap();
    assert_eq!(rebalanced["fields"]["group"], "watchers");
    assert_eq!(rebalanced["fields"]["generation"], 1);
}

/// `systemd-analyze verify` checks that ExecStart's binary exists, so it
/// runs against a scratch root that holds the unit exactly as shipped, the
/// built binary where the unit expects it, and the system's own units (for
/// the targets the unit orders itself after). The test fails, not skips,
/// when systemd-analyze is missing: tests/setup.sh (run by tests/run-all.sh) installs it.
#[test]
fn shipped_systemd_unit_passes_systemd_analyze_verify() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/shardlog.service");
    let text = std::fs::read_to_string(&unit).expect("docs/shardlog.service");
    let exec = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .and_then(|command| command.split_whitespace().next())
        .expect("ExecStart with an absolute path");
    assert!(exec.starts_with('/'), "{exec}");
    let root = tempfile::tempdir().unwrap();
    let unit_dir = root.path().join("etc/systemd/system");
    std::fs::create_dir_all(&unit_dir).unwrap();
    std::fs::copy(&unit, unit_dir.join("shardlog.service")).unwrap();
    let binary = root.path().join(exec.trim_start_matches('/'));
    std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_shardlog"), &binary).unwrap();
    std::fs::create_dir_all(root.path().join("usr/lib/systemd")).unwrap();
    std::os::unix::fs::symlink("/usr/lib/systemd/system", root.path().join("usr/lib/systemd/system")).unwrap();
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .arg(unit_dir.join("shardlog.service"))
        .output()
        .expect("systemd-analyze must be installed (apt-get install systemd; tests/setup.sh does)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let complaints: Vec<&str> =
        stderr.lines().filter(|l| l.contains("shardlog") && !l.starts_with("Failed to resolve symlink")).collect();
    assert!(output.status.success() && complaints.is_empty(), "systemd-analyze verify: {stderr}");
}

/// Metric names (as `# TYPE` declares them) a broker with per-partition
/// series exports.
fn exported_metric_names() -> std::collections::BTreeSet<String> {
    let metrics_port = free_ports(1);
    let _broker = Broker::start(1, &["--metrics-port", &metrics_port.to_string(), "--metrics-per-partition", "true"]);
    let (_, body) = get(metrics_port, "/metrics").expect("scrape");
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(String::from)
        .collect()
}

/// Every `shardlog_*` name in `text`, without a histogram's series suffix.
fn mentioned_metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for (at, _) in text.match_indices("shardlog_") {
        let name: String =
            text[at..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit()).collect();
        let name = ["_bucket", "_count", "_sum"]
            .iter()
            .fold(name, |n, suffix| n.strip_suffix(suffix).map_or(n.clone(), String::from));
        names.insert(name);
    }
    names
}

#[test]
fn grafana_dashboard_and_deployment_guide_name_only_exported_metrics() {
    let exported = exported_metric_names();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard = std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| p.len() > 10));
    let guide = std::fs::read_to_string(root.join("docs/deployment.md")).unwrap();
    for (file, text) in [("grafana-dashboard.json", &dashboard), ("deployment.md", &guide)] {
        let unknown: Vec<String> = mentioned_metric_names(text).difference(&exported).cloned().collect();
        assert!(unknown.is_empty(), "{file} names metrics the broker does not export: {unknown:?}");
    }
}

/// Under flush=always every acknowledged produce is covered by an
/// fdatasync that completed before its answer. The fsync count is recorded
/// when an fdatasync completes, and each produce here is sent after the
/// previous answer, so no fdatasync can cover two of them: when the nth
/// answer arrives the count has grown by at least n. (A kill -9 cannot tell
/// a missing fdatasync: the kernel keeps what it accepted; this can.) Under
/// flush=never the same produces cause none.
#[test]
fn flush_always_answers_each_produce_after_an_fsync_of_its_own() {
    const PRODUCES: usize = 20;
    let metrics_port = free_ports(1);
    let broker = Broker::start(1, &["--metrics-port", &metrics_port.to_string()]);
    create_topic(&broker, "synced", 1, &[("flush", "always")]);
    create_topic(&broker, "unsynced", 1, &[("flush", "never")]);
    let fsyncs = || Scrape::take(metrics_port).sum("shardlog_fsync_duration_seconds_count", &[]);
    let mut conn = broker.connect();
    let before = fsyncs();
    for (n, acks) in [1, -1].into_iter().cycle().take(PRODUCES).enumerate() {
        let answer = produce(&mut conn, "synced", 0, batch(&format!("synced-{n}"), 3), acks);
        assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
        let now = fsyncs();
        assert!(
            now - before > n as f64,
            "produce {} (acks={acks}) was answered with {} fsyncs completed since the first was sent",
            n + 1,
            now - before
        );
    }
    let before = fsyncs();
    for n in 0..PRODUCES {
        let answer = produce(&mut conn, "unsynced", 0, batch(&format!("unsynced-{n}"), 3), 1);
        assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(fsyncs(), before, "flush=never: no fsync for {PRODUCES} produces");
}

/// Polls the core's fsync count until it reaches `at_least` or `limit` passes.
fn wait_for_fsyncs(metrics_port: u16, at_least: f64, limit: Duration) -> f64 {
    let deadline = Instant::now() + limit;
    loop {
        let count = Scrape::take(metrics_port).sum("shardlog_fsync_duration_seconds_count", &[]);
        if count >= at_least || Instant::now() >= deadline {
            return count;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn interval_flush_syncs_its_logs_and_flush_never_syncs_none() {
    let metrics_port = free_ports(1);
    let broker = Broker::start(1, &["--flush", "never", "--metrics-port", &metrics_port.to_string()]);
    create_topic(&broker, "lazy", 1, &[]);
    create_topic(&broker, "timed", 1, &[("flush", "100")]);
    let mut conn = broker.connect();
    let mut send = |topic: &str| {
        assert_eq!(produce(&mut conn, topic, 0, batch(topic, 3), 1).topics[0].partitions[0].error, ErrorCode::None);
    };
    send("timed");
    let first = wait_for_fsyncs(metrics_port, 1.0, Duration::from_secs(5));
    assert!(first >= 1.0, "a log with a 100 ms flush interval is synced");
    send("lazy");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(wait_for_fsyncs(metrics_port, f64::MAX, Duration::ZERO), first, "flush never: no fsync");
    send("timed");
    assert!(wait_for_fsyncs(metrics_port, first + 1.0, Duration::from_secs(5)) > first, "new data is synced again");
    // A topic switched to an interval is picked up without a restart.
    let mut admin = shardlog::client::admin::Admin::connect(&broker.bootstrap()).unwrap();
    let altered = admin.alter_topic_configs("lazy", &[("flush".into(), Some("100".into()))]).unwrap();
    assert_eq!(altered.error, ErrorCode::None);
    let before = wait_for_fsyncs(metrics_port, f64::MAX, Duration::ZERO);
    send("lazy");
    assert!(wait_for_fsyncs(metrics_port, before + 1.0, Duration::from_secs(5)) > before, "altered topic is synced");
}
