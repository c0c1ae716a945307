//! The controller quorum's shell on real sockets and files (issue 29):
//! three machines' `ControllerService`s in one process, each with its own
//! controller port on 127.0.0.1 and its own data directory. They elect a
//! controller, commit metadata decided on it, refuse decisions on the
//! others, elect a new controller when it stops, and the stopped machine
//! catches up when it returns. (Whole processes, namespaces and nftables
//! come with the wiring of the service into `shardlog serve`.)

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_lite::future::block_on;
use shardlog::cluster::control::{self, ControlContext, TopicRequest};
use shardlog::cluster::image::ClusterImage;
use shardlog::cluster::quorum::ProposalError;
use shardlog::cluster::raft_log::RaftLog;
use shardlog::cluster::records::MetadataRecord;
use shardlog::cluster::service::{ControllerHandle, ControllerService, Decider, ServiceConfig, SubmitError};
use shardlog::cluster::MachineId;

fn machine(id: u64) -> MachineId {
    MachineId::new(id).expect("non-zero")
}

/// A port for a voter to listen on later, below the kernel's ephemeral
/// range (`common::free_ports`): a port the kernel picked (bind to 0) and
/// the test released was once taken, before the voter listened, as the
/// local port of one of the tests' own outgoing connections (AddrInUse in CI).
fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], common::free_ports(1)))
}

struct Cluster {
    snapshot_entries: u64,
    dirs: Vec<tempfile::TempDir>,
    voters: Vec<(MachineId, SocketAddr)>,
    services: BTreeMap<u64, ControllerService>,
}

impl Cluster {
    fn start(size: u64) -> Self {
        let voters: Vec<(MachineId, SocketAddr)> = (1..=size).map(|id| (machine(id), free_addr())).collect();
        let dirs = (1..=size).map(|_| tempfile::tempdir().expect("a temp dir")).collect();
        let mut cluster = Self { snapshot_entries: 4096, dirs, voters, services: BTreeMap::new() };
        for id in 1..=size {
            cluster.start_machine(id);
        }
        cluster
    }

    fn start_machine(&mut self, id: u64) {
        let listen = self.voters[(id - 1) as usize].1;
        let config = ServiceConfig {
            machine: machine(id),
            voters: self.voters.clone(),
            learners: Vec::new(),
            listen: Some(listen),
            dir: self.dirs[(id - 1) as usize].path().join("__cluster"),
            snapshot_entries: self.snapshot_entries,
        };
        let service = ControllerService::start(config, Some(topic_decider())).expect("the controller service starts");
        self.services.insert(id, service);
    }

    fn handle(&self, id: u64) -> ControllerHandle {
        self.services[&id].handle()
    }

    /// The machine every running one names as leader, once they agree.
    fn leader(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let leaders: Vec<Option<MachineId>> = self.services.values().map(|s| s.handle().status().leader).collect();
            if let Some(Some(first)) = leaders.first() {
                let running = self.services.contains_key(&first.get());
                if running && leaders.iter().all(|l| *l == Some(*first)) {
                    return first.get();
                }
            }
            let statuses: Vec<_> = self.services.iter().map(|(id, s)| (*id, s.handle().status())).collect();
            assert!(Instant::now() < deadline, "no agreed leader within {within:?}: {statuses:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_for(&self, id: u64, what: &str, test: impl Fn(&ClusterImage) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !test(&self.handle(id).image()) {
            assert!(Instant::now() < deadline, "machine {id} never saw {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn check_nothing(_: &BTreeMap<String, String>) -> Result<(), String> {
    Ok(())
}

/// Requests in these tests are a topic name to create; the answer is the
/// item's error code, as text.
fn topic_decider() -> Decider {
    std::sync::Arc::new(|image: &ClusterImage, body: &[u8]| {
        let request = TopicRequest {
            name: String::from_utf8_lossy(body).into_owned(),
            partitions: 1,
            replication_factor: -1,
            configs: BTreeMap::new(),
            assignments: Vec::new(),
        };
        let context = ControlContext {
            default_partitions: 1,
            default_replication_factor: 1,
            check_topic_configs: &check_nothing,
            salt: 3,
        };
        let decision = control::create_topics(image, &[request], &context);
        (decision.records, format!("{:?}", decision.items[0].error).into_bytes())
    })
}

fn create_topic(handle: &ControllerHandle, name: &str) -> Result<u64, SubmitError> {
    let request = TopicRequest {
        name: name.into(),
        partitions: 1,
        replication_factor: -1,
        configs: BTreeMap::new(),
        assignments: Vec::new(),
    };
    block_on(handle.submit(Box::new(move |image: &ClusterImage| {
        let context = ControlContext {
            default_partitions: 1,
            default_replication_factor: 1,
            check_topic_configs: &check_nothing,
            salt: 1,
        };
        let decision = control::create_topics(image, &[request], &context);
        (decision.records, decision.items)
    })))
    .map(|items| {
        assert!(items.iter().all(|i| i.error.is_ok()), "{items:?}");
        items.len() as u64
    })
}

fn register(handle: &ControllerHandle, id: u64) {
    // A Kafka port that accepts for as long as the test runs: a new
    // controller probes each machine's, and fences one whose port refuses.
    let kafka = Box::leak(Box::new(std::net::TcpListener::bind("127.0.0.1:0").expect("bind")));
    let port = i32::from(kafka.local_addr().expect("bound").port());
    let records = block_on(handle.submit(Box::new(move |image: &ClusterImage| {
        let mut records =
            control::register_machine(image, id, 1, None, &[("127.0.0.1".into(), port)], None).expect("registers");
        // The registration's offset is its epoch; unfence in a later batch.
        records.truncate(1);
        (records, ())
    })));
    records.expect("registration commits");
    let epoch = handle.image().machines[&machine(id)].epoch;
    block_on(handle.submit(Box::new(move |_: &ClusterImage| {
        (vec![MetadataRecord::UnfenceMachine { machine: id, machine_epoch: epoch }], ())
    })))
    .expect("unfencing commits");
}

#[test]
fn three_machines_elect_a_controller_commit_on_it_and_fail_over_when_it_stops() {
    if let Ok(filter) = std::env::var("SHARDLOG_TEST_TRACE") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    }
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader(Duration::from_secs(5));
    register(&cluster.handle(leader), leader);
    create_topic(&cluster.handle(leader), "first").expect("a decision on the controller commits");
    for id in 1..=3 {
        cluster.wait_for(id, "topic first", |image| image.topic("first").is_some());
    }

    let follower = (1..=3).find(|id| *id != leader).unwrap();
    match create_topic(&cluster.handle(follower), "refused") {
        Err(SubmitError::Proposal(ProposalError::NotController { leader: named })) => {
            assert_eq!(named, Some(machine(leader)), "a follower names the controller")
        }
        other => panic!("a follower decided: {other:?}"),
    }

    let stopped_at = Instant::now();
    drop(cluster.services.remove(&leader));
    let next = cluster.leader(Duration::from_secs(5));
    assert_ne!(next, leader);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match create_topic(&cluster.handle(next), "second") {
            Ok(_) => break,
            Err(err) => {
                assert!(Instant::now() < deadline, "the new controller never committed: {err}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let failover = stopped_at.elapsed();
    eprintln!("controller failover: {failover:?} from stop to the first commit on the new controller");
    assert!(failover < Duration::from_secs(5), "{failover:?}");

    cluster.start_machine(leader);
    cluster.wait_for(leader, "topic second after rejoining", |image| {
        image.topic("first").is_some() && image.topic("second").is_some()
    });
    assert_eq!(cluster.leader(Duration::from_secs(5)), next, "the rejoining machine does not disrupt the leader");
    let images: Vec<_> = (1..=3).map(|id| cluster.handle(id).image()).collect();
    cluster.wait_for(leader, "the same image as the others", |image| image.topic_ids == images[0].topic_ids);
}

#[test]
fn a_quorum_of_one_elects_itself_and_its_log_survives_a_restart() {
    let mut cluster = Cluster::start(1);
    assert_eq!(cluster.leader(Duration::from_secs(5)), 1);
    register(&cluster.handle(1), 1);
    create_topic(&cluster.handle(1), "kept").expect("commits");
    let before = cluster.handle(1).image();
    drop(cluster.services.remove(&1));
    cluster.start_machine(1);
    cluster.wait_for(1, "the topic from before the restart", |image| image.topic("kept").is_some());
    let after = cluster.handle(1).image();
    assert_eq!(after.topic_ids, before.topic_ids);
    assert_eq!(after.provenance.offset, before.provenance.offset, "replayed to the same point");
}

#[test]
fn the_log_is_snapshotted_and_compacted_and_a_lagging_voter_and_a_restart_catch_up_past_the_compacted_entries() {
    let mut cluster = Cluster::start(3);
    cluster.leader(Duration::from_secs(5));
    // Restart every machine with snapshots every 5 entries.
    cluster.snapshot_entries = 5;
    cluster.services.clear();
    for id in 1..=3 {
        cluster.start_machine(id);
    }
    let leader = cluster.leader(Duration::from_secs(5));
    register(&cluster.handle(leader), leader);
    let lagging = (1..=3).find(|id| *id != leader).unwrap();
    drop(cluster.services.remove(&lagging));
    for n in 0..20 {
        create_topic(&cluster.handle(leader), &format!("t{n}")).expect("commits with one voter down");
    }
    let expected = cluster.handle(leader).image();
    // The lagging voter comes back; the leader's log no longer holds what it
    // missed, so it gets the snapshot.
    cluster.start_machine(lagging);
    cluster.wait_for(lagging, "every topic, through a snapshot", |image| image.topic_ids == expected.topic_ids);
    // And a restart rebuilds from its own snapshot plus the entries after it.
    drop(cluster.services.remove(&leader));
    cluster.start_machine(leader);
    cluster.wait_for(leader, "every topic after a restart", |image| image.topic_ids == expected.topic_ids);
    cluster.services.clear();
    for id in [leader, lagging] {
        let log = RaftLog::open(&cluster.dirs[(id - 1) as usize].path().join("__cluster")).expect("opens");
        let snapshot = log.durable().snapshot.as_ref().unwrap_or_else(|| panic!("machine {id} holds a snapshot"));
        assert!(snapshot.get_metadata().index >= 20, "machine {id}: snapshot at {}", snapshot.get_metadata().index);
        assert!(log.durable().entries.len() < 10, "machine {id}: compacted to {} entries", log.durable().entries.len());
    }
}

#[test]
fn a_request_to_a_follower_is_forwarded_to_the_controller_and_answered_after_commit() {
    let cluster = Cluster::start(3);
    let leader = cluster.leader(Duration::from_secs(5));
    register(&cluster.handle(leader), leader);
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let answer = block_on(cluster.handle(follower).request(b"via-follower".to_vec())).expect("forwarded and committed");
    assert_eq!(answer, b"None");
    for id in 1..=3 {
        cluster.wait_for(id, "the forwarded topic", |image| image.topic("via-follower").is_some());
    }
    // A refused item commits nothing and still gets its answer.
    let answer = block_on(cluster.handle(follower).request(b"bad name".to_vec())).expect("answered");
    assert_eq!(answer, b"InvalidTopicException");
    let answer = block_on(cluster.handle(leader).request(b"on-the-leader".to_vec())).expect("decided locally");
    assert_eq!(answer, b"None");
    assert!(cluster.handle(leader).image().topic("on-the-leader").is_some(), "answered after commit");
}
