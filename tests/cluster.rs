//! Several machines, each a real `shardlog serve` process with its own data
//! directory, Kafka ports and controller port on 127.0.0.1 (issue 29): a
//! topic spreads over every machine, every node names the same leaders, a
//! partition led elsewhere answers NOT_LEADER_OR_FOLLOWER, the controller's
//! machine dies by kill -9 and another takes over, a silent machine is
//! fenced, a fourth machine joins, and a machine that is gone for good is
//! unregistered. Network partitions (nftables in namespaces) are in
//! tests/cluster_partition.rs.

mod common;

use std::time::{Duration, Instant};

use common::{batch, connect, fetch, free_ports, produce, Broker};
use shardlog::client::admin::Admin;
use shardlog::protocol::metadata::MetadataResponse;
use shardlog::protocol::ErrorCode;

const CORES: usize = 2;

/// One cluster at a time: a killed machine's ports are free until it
/// restarts, and another test's cluster must not take them meanwhile.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Machines 1..=n; the first `voters` of them vote. Their ports are taken
/// from one block so that machines not started yet do not collide.
struct Cluster {
    machines: Vec<Broker>,
    voters: usize,
}

impl Cluster {
    fn new(voters: usize, machines: usize) -> Cluster {
        Cluster::build(voters, machines, false)
    }

    /// Every machine gossips on the UDP port numbered like its controller
    /// port. Machines past the voters get no voter list: only machine 1's
    /// gossip address as a seed.
    fn build(voters: usize, machines: usize, gossip: bool) -> Cluster {
        let per = CORES + 1;
        let base = free_ports(machines * per);
        let controller = |i: usize| base + (i * per + CORES) as u16;
        let list: Vec<String> = (0..voters).map(|i| format!("{}@127.0.0.1:{}", i + 1, controller(i))).collect();
        let list = list.join(",");
        let machines = (0..machines)
            .map(|i| {
                let id = (i + 1).to_string();
                let gossip_port = controller(i).to_string();
                let seed = format!("127.0.0.1:{}", controller(0));
                let mut args = vec!["--machine-id", &id];
                if !gossip || i < voters {
                    args.extend(["--controller-voters", &list]);
                }
                if gossip {
                    args.extend(["--gossip-port", &gossip_port, "--seeds", &seed]);
                }
                let mut broker = Broker::prepare(CORES, &args);
                broker.port = base + (i * per) as u16;
                broker
            })
            .collect();
        Cluster { machines, voters }
    }

    /// Starts the voters together (none serves before a quorum runs),
    /// then waits for each.
    fn start_voters(voters: usize, machines: usize) -> Cluster {
        Cluster::start(Cluster::new(voters, machines))
    }

    fn start(mut cluster: Cluster) -> Cluster {
        let voters = cluster.voters;
        for machine in &mut cluster.machines[..voters] {
            machine.launch();
        }
        for machine in &mut cluster.machines[..voters] {
            machine.wait_ready();
        }
        cluster
    }

    fn machine(&mut self, id: u64) -> &mut Broker {
        &mut self.machines[id as usize - 1]
    }

    fn admin(&self, id: u64) -> Admin {
        Admin::connect(&self.machines[id as usize - 1].bootstrap()).expect("admin")
    }

    fn metadata(&self, port: u16) -> MetadataResponse {
        let mut admin = Admin::connect(&format!("127.0.0.1:{port}")).expect("admin");
        admin.metadata(None).expect("metadata")
    }

    /// The machine whose Kafka ports include `port`.
    fn machine_of_port(&self, port: u16) -> u64 {
        let at = self.machines.iter().position(|m| (m.port..m.port + CORES as u16).contains(&port));
        at.expect("a port of some machine") as u64 + 1
    }

    /// The controller's machine id, as the running voters see it.
    fn controller(&mut self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for id in 1..=self.voters as u64 {
                if !self.machine(id).alive() {
                    continue;
                }
                let answer = self.admin(id).describe_quorum().expect("describe quorum");
                let leader = answer.topics[0].partitions[0].leader_id;
                if leader > 0 && self.machine(leader as u64).alive() {
                    return leader as u64;
                }
            }
            assert!(Instant::now() < deadline, "no controller within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Creates `name` through machine `via`, retrying while there is no
    /// controller; how long it took to commit.
    fn create_topic_through(&self, via: u64, name: &str, partitions: i32) -> Duration {
        let started = Instant::now();
        loop {
            let created = Admin::connect(&self.machines[via as usize - 1].bootstrap())
                .and_then(|mut admin| admin.create_topic(name, partitions, &Default::default()));
            match created {
                Ok(result) if result.error.is_ok() || result.error == ErrorCode::TopicAlreadyExists => {
                    return started.elapsed()
                }
                Ok(result) => assert!(
                    matches!(result.error, ErrorCode::NotController | ErrorCode::RequestTimedOut),
                    "creating {name}: {result:?}"
                ),
                Err(_) => {}
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{name} not created within 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn leaders(metadata: &MetadataResponse, topic: &str) -> Vec<(i32, i32)> {
    let topic = metadata.topics.iter().find(|t| t.name == topic).expect("topic in metadata");
    let mut leaders: Vec<(i32, i32)> = topic.partitions.iter().map(|p| (p.index, p.leader_id)).collect();
    leaders.sort();
    leaders
}

fn port_of(metadata: &MetadataResponse, node: i32) -> u16 {
    metadata.brokers.iter().find(|b| b.node_id == node).expect("leader among the brokers").port as u16
}

#[test]
fn a_topic_created_through_any_machine_lands_on_every_machine_and_every_node_names_the_same_leaders() {
    let _serial = serial();
    let cluster = Cluster::start_voters(3, 3);
    cluster.create_topic_through(3, "spread", 12);
    let first = cluster.metadata(cluster.machines[0].port);
    assert_eq!(first.brokers.len(), 3 * CORES, "every node of every machine: {:?}", first.brokers);
    let placed = leaders(&first, "spread");
    for machine in &cluster.machines {
        for core in 0..CORES as u16 {
            let seen = cluster.metadata(machine.port + core);
            assert_eq!(leaders(&seen, "spread"), placed, "node at port {} disagrees", machine.port + core);
            assert_eq!(seen.brokers.len(), 3 * CORES);
        }
    }
    let mut per_machine = [0usize; 3];
    let mut per_node = std::collections::BTreeMap::new();
    for (_, leader) in &placed {
        assert!(*leader >= 0, "every partition has a leader: {placed:?}");
        per_machine[cluster.machine_of_port(port_of(&first, *leader)) as usize - 1] += 1;
        *per_node.entry(*leader).or_insert(0) += 1;
    }
    assert_eq!(per_machine, [4, 4, 4], "balanced over machines: {placed:?}");
    assert!(per_node.values().all(|count| *count == 2), "balanced over nodes: {per_node:?}");

    // Produce and Fetch go to the leader's node; another machine's node
    // says it is not the leader.
    for (partition, leader) in placed.iter().take(4) {
        let leader_port = port_of(&first, *leader);
        let leader_machine = cluster.machine_of_port(leader_port);
        let elsewhere = cluster.machines[leader_machine as usize % 3].port;
        let mut wrong = connect(elsewhere);
        let refused = produce(&mut wrong, "spread", *partition, batch("x", 1), 1);
        assert_eq!(refused.topics[0].partitions[0].error, ErrorCode::NotLeaderOrFollower);
        let mut right = connect(leader_port);
        let written = produce(&mut right, "spread", *partition, batch("p", 5), -1);
        assert_eq!(written.topics[0].partitions[0].error, ErrorCode::None);
        let read = fetch(&mut right, "spread", *partition, 0, 100, 1);
        assert_eq!(read.topics[0].partitions[0].high_watermark, 5);
        let fetched_elsewhere = fetch(&mut wrong, "spread", *partition, 0, 100, 1);
        assert_eq!(fetched_elsewhere.topics[0].partitions[0].error, ErrorCode::NotLeaderOrFollower);
    }
}

#[test]
fn killing_the_controllers_machine_elects_another_that_commits_and_the_old_one_rejoins_as_a_follower() {
    let _serial = serial();
    let trials: usize = std::env::var("SHARDLOG_FAILOVER_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let mut cluster = Cluster::start_voters(3, 3);
    cluster.create_topic_through(1, "before", 3);
    let mut times = Vec::new();
    for trial in 0..trials {
        let old = cluster.controller();
        cluster.machine(old).kill();
        let survivor = (1..=3).find(|id| *id != old).expect("a survivor");
        let took = cluster.create_topic_through(survivor, &format!("after-{trial}"), 1);
        let new = cluster.controller();
        assert_ne!(new, old, "a new controller");
        times.push(took);
        cluster.machine(old).spawn();
        // The old controller follows the log it missed.
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = cluster.machine(old).port;
        while !cluster.metadata(port).topics.iter().any(|t| t.name == format!("after-{trial}")) {
            assert!(Instant::now() < deadline, "machine {old} did not catch up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    times.sort();
    let ms = |d: &Duration| d.as_millis();
    let p = |q: f64| ms(&times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1]);
    eprintln!(
        "controller failover (kill -9 to the first commit through a survivor), {} trials: p50 {} ms, p99 {} ms, max {} ms",
        times.len(),
        p(0.5),
        p(0.99),
        ms(times.last().expect("a trial"))
    );
    assert!(*times.last().expect("a trial") < Duration::from_secs(10), "{times:?}");
}

#[test]
fn a_fourth_machine_joins_gets_partitions_is_fenced_while_silent_and_serves_again_when_back() {
    let _serial = serial();
    let mut cluster = Cluster::start_voters(3, 4);
    cluster.machine(4).spawn();
    let metadata = cluster.metadata(cluster.machines[0].port);
    assert_eq!(metadata.brokers.len(), 4 * CORES, "the observer's nodes are listed");
    cluster.create_topic_through(2, "four", 8);
    let metadata = cluster.metadata(cluster.machines[0].port);
    let on_fourth: Vec<i32> = leaders(&metadata, "four")
        .into_iter()
        .filter(|(_, leader)| cluster.machine_of_port(port_of(&metadata, *leader)) == 4)
        .map(|(partition, _)| partition)
        .collect();
    assert_eq!(on_fourth.len(), 2, "the new machine gets its share of a new topic");
    let fourth_port = cluster.machine(4).port;
    let mut conn = connect(port_of(&metadata, leaders(&metadata, "four")[on_fourth[0] as usize].1));
    // The new machine learns of the topic by fetching the metadata log: a
    // moment after the controller committed it.
    let asked = Instant::now();
    loop {
        let written = produce(&mut conn, "four", on_fourth[0], batch("kept", 7), -1);
        match written.topics[0].partitions[0].error {
            ErrorCode::None => break,
            ErrorCode::NotLeaderOrFollower if asked.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => panic!("produce on the fourth machine: {other:?}"),
        }
    }
    drop(conn);

    cluster.machine(4).kill();
    let killed = Instant::now();
    loop {
        let seen = cluster.metadata(cluster.machines[1].port);
        let topic = seen.topics.iter().find(|t| t.name == "four").expect("topic");
        let dark: Vec<_> = topic.partitions.iter().filter(|p| p.error == ErrorCode::LeaderNotAvailable).collect();
        if dark.len() == on_fourth.len() {
            assert!(dark.iter().all(|p| on_fourth.contains(&p.index) && p.leader_id == -1));
            assert_eq!(seen.brokers.len(), 3 * CORES, "a fenced machine's nodes are not offered");
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(10), "machine 4 not fenced within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("a silent machine was fenced after {} ms", killed.elapsed().as_millis());

    cluster.machine(4).spawn();
    let back = Instant::now();
    loop {
        let seen = cluster.metadata(cluster.machines[2].port);
        if leaders(&seen, "four").iter().all(|(_, leader)| *leader >= 0) {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(10), "machine 4 not unfenced within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = cluster.metadata(cluster.machines[2].port);
    let leader_port = port_of(&seen, leaders(&seen, "four")[on_fourth[0] as usize].1);
    assert_eq!(cluster.machine_of_port(leader_port), 4, "the partition stays on its machine");
    assert!((fourth_port..fourth_port + CORES as u16).contains(&leader_port));
    let mut conn = connect(leader_port);
    let read = fetch(&mut conn, "four", on_fourth[0], 0, 100, 1);
    let partition = &read.topics[0].partitions[0];
    assert_eq!(partition.error, ErrorCode::None);
    assert_eq!(partition.high_watermark, 7, "what the machine held before it died");
}

#[test]
fn a_machine_stopped_for_good_is_unregistered_by_an_admin_once_it_leads_nothing() {
    let _serial = serial();
    let mut cluster = Cluster::start_voters(3, 4);
    cluster.machine(4).spawn();
    cluster.create_topic_through(1, "on-four", 8);
    let metadata = cluster.metadata(cluster.machines[0].port);
    let fourth: Vec<i32> =
        metadata.brokers.iter().filter(|b| cluster.machine_of_port(b.port as u16) == 4).map(|b| b.node_id).collect();
    assert_eq!(fourth.len(), CORES);
    let mut admin = cluster.admin(2);
    let serving = admin.unregister_broker(fourth[1]).expect("unregister");
    assert_eq!(serving.error, ErrorCode::InvalidRequest, "a running machine stays: {serving:?}");
    assert!(serving.error_message.unwrap_or_default().contains("serving"));

    cluster.machine(4).kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.metadata(cluster.machines[0].port).brokers.len() != 3 * CORES {
        assert!(Instant::now() < deadline, "machine 4 not fenced");
        std::thread::sleep(Duration::from_millis(50));
    }
    let leading = admin.unregister_broker(fourth[0]).expect("unregister");
    assert_eq!(leading.error, ErrorCode::InvalidRequest, "it still holds replicas: {leading:?}");
    assert!(leading.error_message.unwrap_or_default().contains("still holds a replica"));

    assert!(admin.delete_topic("on-four").expect("delete").error.is_ok());
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["cluster", "unregister", &fourth[0].to_string(), "--brokers", &cluster.machines[2].bootstrap()])
        .output()
        .expect("run shardlog cluster unregister");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let unknown = admin.unregister_broker(fourth[0]).expect("unregister");
    assert_eq!(unknown.error, ErrorCode::BrokerIdNotRegistered, "gone: {unknown:?}");

    // Every machine forgets it, and new partitions never land there.
    let deadline = Instant::now() + Duration::from_secs(10);
    for machine in 1..=3u64 {
        let port = cluster.machine(machine).port;
        loop {
            let mut admin = Admin::connect(&format!("127.0.0.1:{port}")).expect("admin");
            let described = admin.describe_cluster().expect("describe cluster");
            if !described.brokers.iter().any(|b| fourth.contains(&b.broker_id)) {
                break;
            }
            assert!(Instant::now() < deadline, "machine {machine} still lists machine 4");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    cluster.create_topic_through(3, "after", 6);
    let metadata = cluster.metadata(cluster.machines[0].port);
    assert!(leaders(&metadata, "after").iter().all(|(_, leader)| !fourth.contains(leader) && *leader >= 0));
}

#[test]
fn a_machine_that_knows_only_one_gossip_seed_finds_the_voters_joins_and_is_fenced_when_it_dies() {
    let _serial = serial();
    let mut cluster = Cluster::start(Cluster::build(3, 4, true));
    // Machine 4 has no voter list: gossip names the voters.
    cluster.machine(4).spawn();
    let metadata = cluster.metadata(cluster.machines[3].port);
    assert_eq!(metadata.brokers.len(), 4 * CORES, "machine 4 follows the metadata log: {:?}", metadata.brokers);
    cluster.create_topic_through(4, "gossiped", 8);
    let metadata = cluster.metadata(cluster.machines[0].port);
    let on_fourth = leaders(&metadata, "gossiped")
        .into_iter()
        .filter(|(_, leader)| cluster.machine_of_port(port_of(&metadata, *leader)) == 4)
        .count();
    assert_eq!(on_fourth, 2, "machine 4 gets its share");

    cluster.machine(4).kill();
    let killed = Instant::now();
    while cluster.metadata(cluster.machines[1].port).brokers.len() != 3 * CORES {
        assert!(killed.elapsed() < Duration::from_secs(10), "machine 4 not fenced within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("with gossip, a killed machine was fenced after {} ms", killed.elapsed().as_millis());
    cluster.machine(4).spawn();
    let back = Instant::now();
    while cluster.metadata(cluster.machines[1].port).brokers.len() != 4 * CORES {
        assert!(back.elapsed() < Duration::from_secs(10), "machine 4 not back within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The records of `answer`'s first partition, as (offset, value prefix).
fn record_count(answer: &shardlog::protocol::fetch::FetchResponse) -> i64 {
    answer.topics[0].partitions[0]
        .records
        .iter()
        .map(|batch| {
            i64::from(shardlog::protocol::record_batch::BatchHeader::parse(batch, usize::MAX).unwrap().record_count)
        })
        .sum()
}

fn partition_of<'a>(
    metadata: &'a MetadataResponse,
    topic: &str,
    index: i32,
) -> &'a shardlog::protocol::metadata::MetadataPartition {
    let topic = metadata.topics.iter().find(|t| t.name == topic).expect("topic in metadata");
    topic.partitions.iter().find(|p| p.index == index).expect("partition in metadata")
}

/// Produces one batch, retrying while the node has not yet learned that
/// it leads (what clients do on NOT_LEADER_OR_FOLLOWER).
fn produce_to_leader(
    conn: &mut shardlog::client::Connection,
    topic: &str,
    partition: i32,
    records: bytes::Bytes,
    acks: i16,
) -> shardlog::protocol::produce::ProducePartitionResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = produce(conn, topic, partition, records.clone(), acks).topics[0].partitions[0].clone();
        if answer.error != ErrorCode::NotLeaderOrFollower || Instant::now() > deadline {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `ready` holds for the metadata a live machine answers.
fn await_metadata(
    cluster: &Cluster,
    via: usize,
    what: &str,
    ready: impl Fn(&MetadataResponse) -> bool,
) -> MetadataResponse {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metadata = cluster.metadata(cluster.machines[via].port);
        if ready(&metadata) {
            return metadata;
        }
        assert!(Instant::now() < deadline, "{what} within 20 s: {:?}", metadata.topics);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_write_acknowledged_by_all_replicas_survives_the_kill_of_its_leaders_machine() {
    let _serial = serial();
    let mut cluster = Cluster::start_voters(3, 3);
    let configs = [("min.insync.replicas".to_string(), "2".to_string())].into();
    let created = cluster.admin(1).create_topic_replicated("rep", 2, 3, &configs).expect("create");
    assert!(created.error.is_ok(), "{created:?}");
    let before = await_metadata(&cluster, 0, "a full ISR", |m| {
        m.topics.iter().any(|t| t.name == "rep" && t.partitions.iter().all(|p| p.isr_nodes.len() == 3))
    });
    let placed = partition_of(&before, "rep", 0).clone();
    let machines: std::collections::BTreeSet<u64> =
        placed.replica_nodes.iter().map(|n| cluster.machine_of_port(port_of(&before, *n))).collect();
    assert_eq!(machines.len(), 3, "three replicas on three machines: {placed:?}");

    let leader_port = port_of(&before, placed.leader_id);
    let mut conn = connect(leader_port);
    for round in 0..20 {
        let answer = &produce_to_leader(&mut conn, "rep", 0, batch(&format!("r{round}-"), 5), -1);
        assert_eq!(answer.error, ErrorCode::None, "acks=all with a full ISR: {answer:?}");
        assert_eq!(answer.base_offset, round * 5);
    }
    let dead = cluster.machine_of_port(leader_port);
    cluster.machine(dead).kill();
    let survivor = (0..3).find(|i| *i as u64 + 1 != dead).expect("a survivor");
    let after = await_metadata(&cluster, survivor, "a new leader", |m| {
        let p = partition_of(m, "rep", 0);
        p.leader_id >= 0 && p.leader_id != placed.leader_id
    });
    let moved = partition_of(&after, "rep", 0);
    assert!(moved.leader_epoch > placed.leader_epoch, "a new leader bumps the epoch: {placed:?} -> {moved:?}");
    assert!(!moved.isr_nodes.contains(&placed.leader_id), "the dead machine left the ISR: {moved:?}");
    let mut new_leader = connect(port_of(&after, moved.leader_id));
    let deadline = Instant::now() + Duration::from_secs(10);
    let read = loop {
        let read = fetch(&mut new_leader, "rep", 0, 0, 500, 1);
        if read.topics[0].partitions[0].high_watermark >= 100 {
            break read;
        }
        assert!(
            Instant::now() < deadline,
            "the new leader's high watermark reaches 100: {:?}",
            read.topics[0].partitions[0].high_watermark
        );
    };
    assert_eq!(read.topics[0].partitions[0].error, ErrorCode::None);
    let mut offset = 0;
    while offset < 100 {
        let read = fetch(&mut new_leader, "rep", 0, offset, 100, 1);
        let count = record_count(&read);
        assert!(count > 0, "records at {offset}");
        offset += count;
    }
    assert_eq!(offset, 100, "every acknowledged record, and nothing else");
    let more = produce_to_leader(&mut new_leader, "rep", 0, batch("after-", 5), -1);
    assert_eq!(more.error, ErrorCode::None, "two in-sync replicas meet min.insync.replicas=2");
    assert_eq!(more.base_offset, 100);

    // The dead machine returns, catches up and rejoins the ISR.
    cluster.machine(dead).spawn();
    await_metadata(&cluster, survivor, "the returning replica back in the ISR", |m| {
        partition_of(m, "rep", 0).isr_nodes.len() == 3
    });
}

#[test]
fn acks_all_is_refused_with_not_enough_replicas_once_the_isr_is_below_min_insync() {
    let _serial = serial();
    let mut cluster = Cluster::start_voters(3, 3);
    let configs = [("min.insync.replicas".to_string(), "3".to_string())].into();
    let created = cluster.admin(1).create_topic_replicated("strict", 1, 3, &configs).expect("create");
    assert!(created.error.is_ok(), "{created:?}");
    let before = await_metadata(&cluster, 0, "a full ISR", |m| {
        m.topics.iter().any(|t| t.name == "strict" && t.partitions.iter().all(|p| p.isr_nodes.len() == 3))
    });
    let placed = partition_of(&before, "strict", 0).clone();
    let leader_port = port_of(&before, placed.leader_id);
    let mut conn = connect(leader_port);
    let written = produce_to_leader(&mut conn, "strict", 0, batch("ok-", 3), -1);
    assert_eq!(written.error, ErrorCode::None);
    let leader_machine = cluster.machine_of_port(leader_port);
    let follower = placed
        .replica_nodes
        .iter()
        .copied()
        .find(|n| cluster.machine_of_port(port_of(&before, *n)) != leader_machine)
        .unwrap();
    let follower_machine = cluster.machine_of_port(port_of(&before, follower));
    cluster.machine(follower_machine).kill();
    let via = (leader_machine - 1) as usize;
    await_metadata(&cluster, via, "the ISR without the dead follower", |m| {
        partition_of(m, "strict", 0).isr_nodes.len() == 2
    });
    let refused = produce(&mut conn, "strict", 0, batch("no-", 3), -1);
    assert_eq!(refused.topics[0].partitions[0].error, ErrorCode::NotEnoughReplicas);
    let one = produce(&mut conn, "strict", 0, batch("one-", 3), 1);
    assert_eq!(one.topics[0].partitions[0].error, ErrorCode::None, "acks=1 needs only the leader");
}

#[test]
fn sigterm_moves_leadership_away_before_the_machine_stops() {
    let _serial = serial();
    let mut cluster = Cluster::start_voters(3, 3);
    let created = cluster.admin(1).create_topic_replicated("roll", 3, 3, &Default::default()).expect("create");
    assert!(created.error.is_ok(), "{created:?}");
    let before = await_metadata(&cluster, 0, "a full ISR", |m| {
        m.topics.iter().any(|t| t.name == "roll" && t.partitions.iter().all(|p| p.isr_nodes.len() == 3))
    });
    let leader = partition_of(&before, "roll", 0).leader_id;
    let stopping = cluster.machine_of_port(port_of(&before, leader));
    let nodes: Vec<i32> = before
        .brokers
        .iter()
        .filter(|b| cluster.machine_of_port(b.port as u16) == stopping)
        .map(|b| b.node_id)
        .collect();
    assert_eq!(cluster.machine(stopping).stop(), 0, "a clean exit");
    // At once, with no lease run out: the survivors already name others.
    let survivor = (0..3).find(|i| *i as u64 + 1 != stopping).expect("a survivor");
    let after = cluster.metadata(cluster.machines[survivor].port);
    for index in 0..3 {
        let p = partition_of(&after, "roll", index);
        assert!(p.leader_id >= 0 && !nodes.contains(&p.leader_id), "partition {index} led elsewhere: {p:?}");
        assert!(p.isr_nodes.iter().all(|n| !nodes.contains(n)), "the stopped machine left the ISR: {p:?}");
    }
    let moved = partition_of(&after, "roll", 0);
    let mut conn = connect(port_of(&after, moved.leader_id));
    let written = produce_to_leader(&mut conn, "roll", 0, batch("after-", 2), -1);
    assert_eq!(written.error, ErrorCode::None);
}

#[test]
fn a_consumer_in_a_followers_rack_is_sent_to_that_follower_which_serves_up_to_its_high_watermark() {
    let _serial = serial();
    let mut cluster = Cluster::new(3, 3);
    for (i, machine) in cluster.machines.iter_mut().enumerate() {
        machine.args.extend(["--rack".to_string(), format!("rack-{}", i + 1)]);
    }
    let cluster = Cluster::start(cluster);
    let created = cluster.admin(1).create_topic_replicated("racked", 1, 3, &Default::default()).expect("create");
    assert!(created.error.is_ok(), "{created:?}");
    let metadata = await_metadata(&cluster, 0, "a full ISR", |m| {
        m.topics.iter().any(|t| t.name == "racked" && t.partitions.iter().all(|p| p.isr_nodes.len() == 3))
    });
    let placed = partition_of(&metadata, "racked", 0).clone();
    let leader_machine = cluster.machine_of_port(port_of(&metadata, placed.leader_id));
    let mut leader = connect(port_of(&metadata, placed.leader_id));
    let written = produce_to_leader(&mut leader, "racked", 0, batch("r", 4), -1);
    assert_eq!(written.error, ErrorCode::None);
    let follower_machine = if leader_machine == 1 { 2 } else { 1 };
    let follower = placed
        .replica_nodes
        .iter()
        .copied()
        .find(|n| cluster.machine_of_port(port_of(&metadata, *n)) == follower_machine)
        .expect("a replica on the other machine");

    let fetch_in = |conn: &mut shardlog::client::Connection, rack: &str| {
        let mut request = common::fetch_request("racked", 0, 0, 100, 1);
        request.rack_id = rack.into();
        let reader = conn.request(shardlog::protocol::ApiKey::Fetch, 11, |w| request.encode(w, 11)).expect("fetch");
        shardlog::client::decode(reader, 11, shardlog::protocol::fetch::FetchResponse::decode).expect("decode")
    };
    let own_rack = format!("rack-{leader_machine}");
    let here = fetch_in(&mut leader, &own_rack);
    assert_eq!(here.topics[0].partitions[0].preferred_read_replica, -1, "the leader is in the consumer's rack");
    assert_eq!(record_count(&here), 4);
    let elsewhere = fetch_in(&mut leader, &format!("rack-{follower_machine}"));
    let redirected = &elsewhere.topics[0].partitions[0];
    assert_eq!(redirected.preferred_read_replica, follower, "the in-sync follower in the consumer's rack");
    assert!(redirected.records.is_empty());
    let no_rack = fetch(&mut leader, "racked", 0, 0, 100, 1);
    assert_eq!(no_rack.topics[0].partitions[0].preferred_read_replica, -1, "no rack: read from the leader");

    // The follower serves the records once its high watermark covers them.
    let mut at_follower = connect(port_of(&metadata, follower));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let read = fetch_in(&mut at_follower, &format!("rack-{follower_machine}"));
        let answer = &read.topics[0].partitions[0];
        assert_eq!(answer.error, ErrorCode::None, "a follower serves reads: {answer:?}");
        assert_eq!(answer.preferred_read_replica, -1);
        if record_count(&read) == 4 {
            assert_eq!(answer.high_watermark, 4);
            break;
        }
        assert!(Instant::now() < deadline, "the follower's high watermark reaches 4: {answer:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = produce(&mut at_follower, "racked", 0, batch("no", 1), 1);
    assert_eq!(refused.topics[0].partitions[0].error, ErrorCode::NotLeaderOrFollower, "followers take no writes");
}

/// FindCoordinator for `group` through the machine at `port`: the node
/// and its port, retrying while the cluster has none to name.
fn find_coordinator(port: u16, group: &str) -> Option<(i32, u16)> {
    use shardlog::protocol::find_coordinator::{FindCoordinatorRequest, FindCoordinatorResponse};
    let mut conn = shardlog::client::Connection::connect(("127.0.0.1", port), Duration::from_secs(5)).ok()?;
    let request = FindCoordinatorRequest { key: group.into(), key_type: 0 };
    let reader = conn.request(shardlog::protocol::ApiKey::FindCoordinator, 2, |w| request.encode(w, 2)).ok()?;
    let answer = shardlog::client::decode(reader, 2, FindCoordinatorResponse::decode).ok()?;
    (answer.error == ErrorCode::None).then_some((answer.node_id, answer.port as u16))
}

/// An admin OffsetCommit through the node at `port`; the first
/// partition's error.
fn commit_offsets(port: u16, group: &str, topic: &str, offsets: &[(i32, i64)]) -> ErrorCode {
    common::commit(&mut connect(port), group, topic, offsets).topics[0].partitions[0].error
}

/// OffsetFetch through the node at `port`: the top-level error and offsets.
fn fetch_offsets(port: u16, group: &str, topic: &str, partitions: &[i32]) -> (ErrorCode, Vec<i64>) {
    common::fetch_committed(&mut connect(port), group, topic, partitions)
}

#[test]
fn committed_offsets_live_in_a_replicated_consumer_offsets_and_survive_the_kill_of_the_coordinators_machine() {
    let _serial = serial();
    let mut cluster = Cluster::start_voters(3, 3);
    cluster.create_topic_through(1, "orders", 2);
    // The first lookup creates __consumer_offsets, three replicas each.
    let (node, port) = find_coordinator(cluster.machines[0].port, "billing").expect("a coordinator");
    let metadata = await_metadata(&cluster, 0, "__consumer_offsets fully in sync", |m| {
        m.topics.iter().any(|t| t.name == "__consumer_offsets" && t.partitions.iter().all(|p| p.isr_nodes.len() == 3))
    });
    let offsets_topic = metadata.topics.iter().find(|t| t.name == "__consumer_offsets").unwrap();
    assert!(offsets_topic.is_internal);
    assert_eq!(offsets_topic.partitions.len(), 16);
    let partition = shardlog::cluster::metadata::offsets_partition("billing", 16);
    assert_eq!(
        partition_of(&metadata, "__consumer_offsets", partition).leader_id,
        node,
        "the coordinator leads the group's partition"
    );

    let mut acknowledged = 0;
    for round in 1..=20 {
        assert_eq!(commit_offsets(port, "billing", "orders", &[(0, round), (1, 100 + round)]), ErrorCode::None);
        acknowledged = round;
    }
    let dead = cluster.machine_of_port(port);
    cluster.machine(dead).kill();
    let survivor = (0..3).find(|i| *i as u64 + 1 != dead).expect("a survivor");
    let deadline = Instant::now() + Duration::from_secs(20);
    let (offsets, new_node) = loop {
        if let Some((new_node, new_port)) = find_coordinator(cluster.machines[survivor].port, "billing") {
            if new_node != node {
                let (error, offsets) = fetch_offsets(new_port, "billing", "orders", &[0, 1]);
                if error == ErrorCode::None {
                    break (offsets, new_node);
                }
                assert!(matches!(error, ErrorCode::NotCoordinator | ErrorCode::CoordinatorLoadInProgress), "{error:?}");
            }
        }
        assert!(Instant::now() < deadline, "no new coordinator within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(new_node, node);
    assert_eq!(offsets, vec![acknowledged, 100 + acknowledged], "every acknowledged commit, after the failover");
    let new_port = find_coordinator(cluster.machines[survivor].port, "billing").unwrap().1;
    assert_eq!(
        commit_offsets(new_port, "billing", "orders", &[(0, 50)]),
        ErrorCode::None,
        "two of three replicas take commits"
    );

    // The dead machine comes back as a follower of the group's partition,
    // copies what it missed, and takes over again when it leads.
    cluster.machine(dead).spawn();
    await_metadata(&cluster, survivor, "the returning replica back in the ISR", |m| {
        partition_of(m, "__consumer_offsets", partition).isr_nodes.len() == 3
    });
    // A preferred-leader election (ElectLeaders, type 0) moves it back.
    let elect = shardlog::protocol::elect_leaders::ElectLeadersRequest {
        election_type: 0,
        topic_partitions: Some(vec![("__consumer_offsets".into(), vec![partition])]),
        timeout_ms: 10_000,
    };
    let mut conn = connect(cluster.machines[survivor].port);
    conn.request(shardlog::protocol::ApiKey::ElectLeaders, 2, |w| elect.encode(w, 2)).expect("elect leaders");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((back, back_port)) = find_coordinator(cluster.machines[survivor].port, "billing") {
            let (error, offsets) = fetch_offsets(back_port, "billing", "orders", &[0, 1]);
            if back == node && error == ErrorCode::None {
                assert_eq!(offsets, vec![50, 100 + acknowledged], "the old coordinator copied the commit it missed");
                break;
            }
        }
        assert!(Instant::now() < deadline, "the preferred leader did not coordinate again within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_partition_moved_to_another_machine_keeps_every_acknowledged_write_and_its_old_replica_is_removed() {
    let _serial = serial();
    let mut cluster = Cluster::start_voters(3, 3);
    let created = cluster.admin(1).create_topic_replicated("mv", 1, 2, &Default::default()).expect("create");
    assert!(created.error.is_ok(), "{created:?}");
    let before = await_metadata(&cluster, 0, "two replicas in sync", |m| {
        m.topics.iter().any(|t| t.name == "mv" && t.partitions.iter().all(|p| p.isr_nodes.len() == 2))
    });
    let placed = partition_of(&before, "mv", 0).clone();
    let mut conn = connect(port_of(&before, placed.leader_id));
    for round in 0..10 {
        let answer = produce_to_leader(&mut conn, "mv", 0, batch(&format!("a{round}-"), 5), -1);
        assert_eq!(answer.error, ErrorCode::None, "{answer:?}");
    }
    // Move the leader's replica to the machine that has none.
    let leader_machine = cluster.machine_of_port(port_of(&before, placed.leader_id));
    let used: std::collections::BTreeSet<u64> =
        placed.replica_nodes.iter().map(|n| cluster.machine_of_port(port_of(&before, *n))).collect();
    let free = (1..=3).find(|m| !used.contains(m)).expect("a machine without a replica");
    let new_node =
        before.brokers.iter().find(|b| cluster.machine_of_port(b.port as u16) == free).expect("a node").node_id;
    let kept = *placed.replica_nodes.iter().find(|n| **n != placed.leader_id).expect("a follower");
    let target = vec![new_node, kept];
    let moved = cluster.admin(2).alter_reassignments(&[("mv".into(), 0, Some(target.clone()))]).expect("alter");
    assert_eq!(moved[0].error, ErrorCode::None, "{moved:?}");
    let refused = cluster.admin(2).alter_reassignments(&[("mv".into(), 0, Some(vec![new_node, 999]))]).unwrap();
    assert_eq!(refused[0].error, ErrorCode::InvalidReplicaAssignment, "an unknown node: {refused:?}");
    let after = await_metadata(&cluster, 1, "the move done", |m| {
        let p = partition_of(m, "mv", 0);
        p.replica_nodes == target && p.isr_nodes.len() == 2
    });
    assert!(cluster.admin(3).list_reassignments().unwrap().is_empty(), "nothing moves any more");
    let now = partition_of(&after, "mv", 0);
    assert!(target.contains(&now.leader_id), "the removed leader handed over: {now:?}");
    assert!(now.leader_epoch > placed.leader_epoch);
    // Every acknowledged record is on the new leader, and it takes writes.
    let mut new_leader = connect(port_of(&after, now.leader_id));
    let mut offset = 0;
    while offset < 50 {
        let read = fetch(&mut new_leader, "mv", 0, offset, 500, 1);
        let count = record_count(&read);
        assert!(count > 0, "records at {offset}: {:?}", read.topics[0].partitions[0].error);
        offset += count;
    }
    assert_eq!(offset, 50);
    let more = produce_to_leader(&mut new_leader, "mv", 0, batch("b-", 5), -1);
    assert_eq!((more.error, more.base_offset), (ErrorCode::None, 50));
    // The old leader's machine no longer holds the partition's files.
    let old_dir = cluster.machine(leader_machine).data_dir().join("mv-0");
    let deadline = Instant::now() + Duration::from_secs(10);
    while old_dir.exists() {
        assert!(Instant::now() < deadline, "{} still exists", old_dir.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}
