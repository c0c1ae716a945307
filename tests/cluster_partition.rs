//! A real network partition (issue 29): three machines, each a `shardlog
//! serve` in its own network namespace with its own address on a bridge
//! (198.18.0.0/24, RFC 2544's test range, only inside namespaces this test
//! makes), and nftables inside the controller's namespace silently dropping
//! its traffic to and from the other two. The isolated side commits nothing;
//! the majority elects a controller and commits; after healing every
//! machine's committed metadata log is a prefix of the longest, and no term
//! had two controllers.
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables): tests/setup.sh installs
//! them. Namespaces, links and processes are removed when the test ends,
//! whether it passes or not.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardlog::client::admin::Admin;
use shardlog::cluster::raft_log::RaftLog;
use shardlog::protocol::ErrorCode;

const MACHINES: usize = 3;
const KAFKA_PORT: u16 = 9092;
const CONTROLLER_PORT: u16 = 9300;
const HOST_ADDRESS: &str = "198.18.0.254";

fn run(args: &[&str]) {
    let output = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

fn address(machine: usize) -> String {
    format!("198.18.0.{machine}")
}

/// One test at a time: every test's host link takes the same address.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The namespaces, links and broker processes of one test; all removed on
/// drop (before the lock that serializes the tests is released).
struct Net {
    prefix: String,
    brokers: BTreeMap<usize, Child>,
    dir: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Net {
    fn new() -> Net {
        let prefix = format!("sl{}", std::process::id() % 100_000);
        let serial = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let net = Net { prefix, brokers: BTreeMap::new(), dir: tempfile::tempdir().expect("tempdir"), _serial: serial };
        let hub = net.hub();
        run(&["ip", "netns", "add", &hub]);
        run(&["ip", "-n", &hub, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &hub, "link", "set", "br0", "up"]);
        for machine in 1..=MACHINES {
            let ns = net.ns(machine);
            let veth = format!("{}v{machine}", net.prefix);
            run(&["ip", "netns", "add", &ns]);
            run(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            run(&["ip", "link", "set", &veth, "netns", &hub]);
            run(&["ip", "-n", &hub, "link", "set", &veth, "master", "br0", "up"]);
            run(&["ip", "-n", &ns, "addr", "add", &format!("{}/24", address(machine)), "dev", "eth0"]);
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        // The test itself reaches the machines through a link of its own.
        let host = format!("{}h", net.prefix);
        let host_peer = format!("{}hb", net.prefix);
        run(&["ip", "link", "add", &host, "type", "veth", "peer", "name", &host_peer, "netns", &hub]);
        run(&["ip", "-n", &hub, "link", "set", &host_peer, "master", "br0", "up"]);
        run(&["ip", "addr", "add", &format!("{HOST_ADDRESS}/24"), "dev", &host]);
        run(&["ip", "link", "set", &host, "up"]);
        net
    }

    fn hub(&self) -> String {
        format!("{}hub", self.prefix)
    }

    fn ns(&self, machine: usize) -> String {
        format!("{}m{machine}", self.prefix)
    }

    fn data(&self, machine: usize) -> PathBuf {
        self.dir.path().join(format!("m{machine}"))
    }

    fn log_path(&self, machine: usize) -> PathBuf {
        self.dir.path().join(format!("m{machine}.log"))
    }

    fn start(&mut self, machine: usize) {
        let voters: Vec<String> = (1..=MACHINES).map(|m| format!("{m}@{}:{CONTROLLER_PORT}", address(m))).collect();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(machine)).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(machine), env!("CARGO_BIN_EXE_shardlog"), "serve"])
            .args(["--host", &address(machine), "--port", &KAFKA_PORT.to_string(), "--cores", "1"])
            .args(["--data", &self.data(machine).display().to_string(), "--metrics-port", "0"])
            .args(["--machine-id", &machine.to_string(), "--controller-voters", &voters.join(",")])
            .args(["--log-level", "info"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start shardlog in its namespace");
        self.brokers.insert(machine, child);
    }

    fn wait_ready(&self, machine: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Admin::connect(&self.bootstrap(machine)).and_then(|mut a| a.metadata(None)).is_err() {
            assert!(Instant::now() < deadline, "machine {machine} did not serve within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn bootstrap(&self, machine: usize) -> String {
        format!("{}:{KAFKA_PORT}", address(machine))
    }

    /// Drops everything between `machine` and the other machines, both
    /// ways, silently; the test's own address still reaches it.
    fn isolate(&self, machine: usize) {
        let ns = self.ns(machine);
        run(&["ip", "netns", "exec", &ns, "nft", "add", "table", "inet", "cut"]);
        for (chain, hook, field) in [("out", "output", "daddr"), ("in", "input", "saddr")] {
            let spec = format!("{{ type filter hook {hook} priority 0; }}");
            run(&["ip", "netns", "exec", &ns, "nft", "add", "chain", "inet", "cut", chain, &spec]);
            for other in (1..=MACHINES).filter(|m| *m != machine) {
                let rule = ["ip", "netns", "exec", &ns, "nft", "add", "rule", "inet", "cut", chain, "ip", field];
                let mut rule: Vec<&str> = rule.to_vec();
                let other = address(other);
                rule.extend([other.as_str(), "drop"]);
                run(&rule);
            }
        }
    }

    fn heal(&self, machine: usize) {
        run(&["ip", "netns", "exec", &self.ns(machine), "nft", "delete", "table", "inet", "cut"]);
    }

    fn stop_all(&mut self) {
        for (_, mut child) in std::mem::take(&mut self.brokers) {
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let status = child.wait().expect("wait");
            assert!(status.success(), "clean shutdown: {status:?}");
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for (_, child) in self.brokers.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip").args(["link", "del", &format!("{}h", self.prefix)]).status();
        for machine in 1..=MACHINES {
            let _ = Command::new("ip").args(["netns", "del", &self.ns(machine)]).status();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.hub()]).status();
    }
}

fn controller(net: &Net, machines: &[usize]) -> Option<usize> {
    for &machine in machines {
        let Ok(mut admin) = Admin::connect(&net.bootstrap(machine)) else { continue };
        let Ok(answer) = admin.describe_quorum() else { continue };
        let partition = &answer.topics[0].partitions[0];
        if partition.error.is_ok() {
            return Some(machine);
        }
    }
    None
}

fn create(net: &Net, machine: usize, topic: &str) -> ErrorCode {
    match Admin::connect(&net.bootstrap(machine)).and_then(|mut a| a.create_topic(topic, 1, &Default::default())) {
        Ok(result) => result.error,
        Err(_) => ErrorCode::RequestTimedOut,
    }
}

fn has_topic(net: &Net, machine: usize, topic: &str) -> bool {
    Admin::connect(&net.bootstrap(machine))
        .and_then(|mut a| a.metadata(None))
        .is_ok_and(|m| m.topics.iter().any(|t| t.name == topic))
}

/// Every committed entry of a machine's metadata log: index → (term, data).
fn committed_log(cluster_dir: &Path) -> BTreeMap<u64, (u64, Vec<u8>)> {
    let log = RaftLog::open(cluster_dir).expect("open the metadata log");
    let durable = log.durable();
    let commit = durable.hard_state.commit;
    durable.entries.iter().filter(|e| e.index <= commit).map(|e| (e.index, (e.term, e.data.to_vec()))).collect()
}

/// (term, controller) from every "controller elected" line of a log.
fn elections(log: &str) -> Vec<(u64, u64)> {
    let field = |line: &str, name: &str| -> Option<u64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    log.lines()
        .filter(|l| l.contains("controller elected"))
        .filter_map(|l| Some((field(l, "term")?, field(l, "controller")?)))
        .collect()
}

#[test]
fn an_isolated_controller_commits_nothing_while_the_majority_goes_on_and_the_logs_agree_after_healing() {
    let mut net = Net::new();
    for machine in 1..=MACHINES {
        net.start(machine);
    }
    let starting = Instant::now();
    for machine in 1..=MACHINES {
        net.wait_ready(machine);
    }
    eprintln!("three machines served {} ms after start", starting.elapsed().as_millis());
    assert_eq!(create(&net, 1, "before"), ErrorCode::None);
    let all: Vec<usize> = (1..=MACHINES).collect();
    let old = controller(&net, &all).expect("a controller");
    let majority: Vec<usize> = all.iter().copied().filter(|m| *m != old).collect();
    net.isolate(old);
    let cut = Instant::now();

    // The isolated machine, controller until it notices, commits nothing,
    // whatever it is asked: from the moment of the cut, for a while.
    let bootstrap = net.bootstrap(old);
    let minority = std::thread::spawn(move || {
        let mut attempts = 0;
        while cut.elapsed() < Duration::from_secs(5) {
            let created = Admin::connect(&bootstrap)
                .and_then(|mut a| a.create_topic(&format!("minority-{attempts}"), 1, &Default::default()));
            if let Ok(result) = created {
                assert_ne!(result.error, ErrorCode::None, "the minority committed minority-{attempts}");
            }
            attempts += 1;
        }
        attempts
    });

    // The majority elects a controller and commits.
    let mut committed_after = None;
    while committed_after.is_none() {
        if create(&net, majority[0], "majority") == ErrorCode::None {
            committed_after = Some(cut.elapsed());
        }
        assert!(cut.elapsed() < Duration::from_secs(20), "the majority did not commit within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("majority committed {} ms after the cut", committed_after.unwrap().as_millis());
    assert_eq!(controller(&net, &majority).map(|m| m != old), Some(true));
    let attempts = minority.join().expect("no minority commit");
    eprintln!("{attempts} requests to the minority, none committed, by {} ms after the cut", cut.elapsed().as_millis());
    assert!(attempts > 0);
    assert!(!has_topic(&net, old, "majority"), "the minority cannot have learned what the majority committed");

    net.heal(old);
    let healed = Instant::now();
    while !has_topic(&net, old, "majority") {
        assert!(healed.elapsed() < Duration::from_secs(20), "machine {old} did not catch up after healing");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("machine {old} caught up {} ms after healing", healed.elapsed().as_millis());
    for machine in &all {
        for attempt in 0..attempts {
            assert!(!has_topic(&net, *machine, &format!("minority-{attempt}")), "minority-{attempt} on {machine}");
        }
    }
    // One more commit, through the healed machine, reaches everybody. It
    // may take a retry, as for any client: a request forwarded over a
    // connection the cut broke times out (REQUEST_TIMED_OUT, retriable).
    let healed_at = Instant::now();
    loop {
        match create(&net, old, "healed") {
            ErrorCode::None | ErrorCode::TopicAlreadyExists => break,
            error => assert!(healed_at.elapsed() < Duration::from_secs(30), "healed not created: {error:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("a commit through the healed machine took {} ms", healed_at.elapsed().as_millis());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all.iter().all(|m| has_topic(&net, *m, "healed")) {
        assert!(Instant::now() < deadline, "healed not everywhere");
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopping = Instant::now();
    net.stop_all();
    eprintln!("clean shutdown of the three machines took {} ms", stopping.elapsed().as_millis());

    // Every committed log is a prefix of the longest.
    let logs: Vec<_> = all.iter().map(|m| committed_log(&net.data(*m).join("__cluster"))).collect();
    let longest = logs.iter().max_by_key(|l| l.len()).expect("logs");
    for (machine, log) in all.iter().zip(&logs) {
        assert!(!log.is_empty(), "machine {machine} committed nothing");
        for (index, entry) in log {
            // A compacted prefix is in the snapshot, not in `entries`.
            if let Some(theirs) = longest.get(index) {
                assert_eq!(entry, theirs, "machine {machine} differs at index {index}");
            }
        }
    }
    // No term had two controllers.
    let mut controllers: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for machine in &all {
        let log = std::fs::read_to_string(net.log_path(*machine)).expect("broker log");
        for (term, leader) in elections(&log) {
            controllers.entry(term).or_default().insert(leader);
        }
    }
    assert!(controllers.len() >= 2, "the cut made a new term: {controllers:?}");
    for (term, leaders) in &controllers {
        assert_eq!(leaders.len(), 1, "term {term} had controllers {leaders:?}");
    }
}

/// The batches of one replica's log on disk, from its segment files: (base
/// offset, bytes), in order, stopping at the first gap or damage.
fn replica_batches(data: &Path, topic: &str, partition: i32) -> Vec<(i64, Vec<u8>)> {
    let dir = data.join(format!("{topic}-{partition}"));
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("partition directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    let mut out: Vec<(i64, Vec<u8>)> = Vec::new();
    let mut next = None;
    for segment in segments {
        let raw = std::fs::read(&segment).expect("segment");
        let mut at = 0usize;
        while at + 61 <= raw.len() {
            let Ok(header) = shardlog::protocol::record_batch::BatchHeader::parse(&raw[at..], usize::MAX) else {
                break;
            };
            if at + header.size_bytes > raw.len() || next.is_some_and(|n| n != header.base_offset) {
                break;
            }
            out.push((header.base_offset, raw[at..at + header.size_bytes].to_vec()));
            next = Some(header.last_offset() + 1);
            at += header.size_bytes;
        }
    }
    out
}

fn produce_with(net: &Net, machine: usize, topic: &str, acks: i16, timeout_ms: i32, prefix: &str) -> (ErrorCode, i64) {
    let Ok(mut conn) = shardlog::client::Connection::connect(net.bootstrap(machine).as_str(), Duration::from_secs(5))
    else {
        return (ErrorCode::RequestTimedOut, -1);
    };
    let mut request = common::produce_request(topic, 0, common::batch(prefix, 5), acks);
    request.timeout_ms = timeout_ms;
    let Ok(reader) = conn.request(shardlog::protocol::ApiKey::Produce, 8, |w| request.encode(w)) else {
        return (ErrorCode::RequestTimedOut, -1);
    };
    match shardlog::client::decode(reader, 8, shardlog::protocol::produce::ProduceResponse::decode) {
        Ok(answer) => (answer.topics[0].partitions[0].error, answer.topics[0].partitions[0].base_offset),
        Err(_) => (ErrorCode::RequestTimedOut, -1),
    }
}

/// (leader node, ISR) of partition 0 of `topic` as `machine` answers.
fn registration(net: &Net, machine: usize, topic: &str) -> Option<(i32, Vec<i32>)> {
    let metadata =
        Admin::connect(&net.bootstrap(machine)).and_then(|mut a| a.metadata(Some(vec![topic.into()]))).ok()?;
    let p = metadata.topics.first()?.partitions.first()?;
    Some((p.leader_id, p.isr_nodes.clone()))
}

#[test]
fn an_isolated_partition_leader_acknowledges_no_acks_all_write_and_its_divergent_tail_is_cut_after_healing() {
    let mut net = Net::new();
    for machine in 1..=MACHINES {
        net.start(machine);
    }
    for machine in 1..=MACHINES {
        net.wait_ready(machine);
    }
    let configs = [("min.insync.replicas".to_string(), "2".to_string())].into();
    // A fresh host link may refuse the first connections for a moment
    // (EADDRNOTAVAIL seen once in CI): retry the connection, not the claim.
    let deadline = Instant::now() + Duration::from_secs(20);
    let created = loop {
        match Admin::connect(&net.bootstrap(1)).and_then(|mut a| a.create_topic_replicated("rep", 1, 3, &configs)) {
            Ok(created) => break created,
            Err(err) if Instant::now() < deadline => {
                eprintln!("create: {err}; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(err) => panic!("create: {err:?}"),
        }
    };
    assert!(created.error.is_ok(), "{created:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let (leader_node, _) = loop {
        if let Some((leader, isr)) = registration(&net, 1, "rep").filter(|(l, isr)| *l >= 0 && isr.len() == 3) {
            break (leader, isr);
        }
        assert!(Instant::now() < deadline, "a full ISR");
        std::thread::sleep(Duration::from_millis(50));
    };
    // One core per machine: node ids follow registration, so find the
    // leader's machine by asking each which node it is.
    let leader = (1..=MACHINES)
        .find(|m| {
            Admin::connect(&net.bootstrap(*m))
                .and_then(|mut a| a.describe_cluster())
                .map(|c| c.brokers.iter().any(|b| b.broker_id == leader_node && b.host == address(*m)))
                .unwrap_or(false)
        })
        .expect("the leader's machine");
    let mut acknowledged = Vec::new();
    for round in 0..10 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (error, offset) = produce_with(&net, leader, "rep", -1, 5000, &format!("before-{round}-"));
            if error.is_ok() {
                acknowledged.push(offset);
                break;
            }
            assert!(Instant::now() < deadline, "acks=all before the cut: {error:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    net.isolate(leader);
    // Cut off from its followers and the controller, the old leader takes
    // writes into its own log (acks=1), but acknowledges none with acks=all.
    let (error, _) = produce_with(&net, leader, "rep", 1, 2000, "divergent-");
    assert_eq!(error, ErrorCode::None, "acks=1 needs the leader alone");
    let (error, _) = produce_with(&net, leader, "rep", -1, 3000, "never-");
    assert_ne!(error, ErrorCode::None, "an isolated leader acknowledged an acks=all write");
    let others: Vec<usize> = (1..=MACHINES).filter(|m| *m != leader).collect();
    // The majority elects another leader, which takes acks=all writes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let new_leader = loop {
        let taken = others.iter().find_map(|m| {
            let (error, offset) = produce_with(&net, *m, "rep", -1, 3000, "after-");
            error.is_ok().then_some((*m, offset))
        });
        if let Some((machine, offset)) = taken {
            acknowledged.push(offset);
            break machine;
        }
        assert!(Instant::now() < deadline, "the majority's new leader takes acks=all writes within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("leader machine {leader} isolated; machine {new_leader} leads");

    net.heal(leader);
    let deadline = Instant::now() + Duration::from_secs(30);
    while registration(&net, new_leader, "rep").is_none_or(|(_, isr)| isr.len() != 3) {
        assert!(Instant::now() < deadline, "the old leader rejoins the ISR after healing");
        std::thread::sleep(Duration::from_millis(100));
    }
    net.stop_all();

    // The replicas' logs are the same bytes, and hold every acknowledged
    // write: the old leader cut the batch only it had.
    let logs: Vec<Vec<(i64, Vec<u8>)>> = (1..=MACHINES).map(|m| replica_batches(&net.data(m), "rep", 0)).collect();
    for (machine, log) in (1..=MACHINES).zip(&logs) {
        assert_eq!(log, &logs[new_leader - 1], "machine {machine}'s log differs from the new leader's");
    }
    let offsets: Vec<i64> = logs[0].iter().map(|(base, _)| *base).collect();
    for offset in acknowledged {
        assert!(offsets.contains(&offset), "acknowledged batch at {offset} is gone");
    }
    let divergent = logs[leader - 1].iter().any(|(_, bytes)| bytes.windows(10).any(|w| w == b"divergent-"));
    assert!(!divergent, "the old leader's unreplicated batch survived");
}
