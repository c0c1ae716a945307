//! Consumer groups through a real broker process: coordinator placement,
//! committed offsets that survive restarts, the offsets log staying bounded,
//! and the group admin commands.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use shardlog::client::groups::{GroupAdmin, ResetTarget};
use shardlog::client::Connection;
use shardlog::protocol::find_coordinator::{FindCoordinatorRequest, FindCoordinatorResponse};
use shardlog::protocol::heartbeat::{HeartbeatRequest, HeartbeatResponse};
use shardlog::protocol::list_groups::{ListGroupsRequest, ListGroupsResponse};
use shardlog::protocol::{ApiKey, ErrorCode};

fn coordinator(broker: &Broker, group: &str) -> FindCoordinatorResponse {
    let mut conn = broker.connect();
    let request = FindCoordinatorRequest { key: group.into(), key_type: 0 };
    let reader = conn.request(ApiKey::FindCoordinator, 2, |w| request.encode(w, 2)).unwrap();
    shardlog::client::decode(reader, 2, FindCoordinatorResponse::decode).unwrap()
}

fn committed(conn: &mut Connection, group: &str, topic: &str, partitions: &[i32]) -> Vec<i64> {
    let (error, offsets) = fetch_committed(conn, group, topic, partitions);
    assert_eq!(error, ErrorCode::None);
    offsets
}

/// The group ids one node answers ListGroups with.
fn listed_groups(conn: &mut Connection) -> BTreeSet<String> {
    let reader = conn.request(ApiKey::ListGroups, 2, |w| ListGroupsRequest {}.encode(w, 2)).unwrap();
    let answer = shardlog::client::decode(reader, 2, ListGroupsResponse::decode).unwrap();
    assert_eq!(answer.error, ErrorCode::None);
    answer.groups.into_iter().map(|g| g.group_id).collect()
}

/// Eight groups with committed offsets, each committed through its
/// coordinator; the groups by the port of the node that coordinates them.
fn groups_by_coordinator_port(broker: &Broker, topic: &str) -> BTreeMap<u16, BTreeSet<String>> {
    let mut by_port: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    for i in 0..8 {
        let group = format!("listed-{i}");
        let port = coordinator(broker, &group).port as u16;
        let answer = commit(&mut broker.connect_port(port), &group, topic, &[(0, 1)]);
        assert_eq!(answer.topics[0].partitions[0].error, ErrorCode::None);
        by_port.entry(port).or_default().insert(group);
    }
    by_port
}

#[test]
fn each_node_lists_only_the_groups_it_coordinates_and_group_list_shows_each_once() {
    let broker = Broker::start(2, &[]);
    create_topic(&broker, "tracked", 1, &[]);
    let by_port = groups_by_coordinator_port(&broker, "tracked");
    assert_eq!(by_port.len(), 2, "groups spread over both cores: {by_port:?}");
    let (mut listed_count, mut every) = (0, BTreeSet::new());
    for core in 0..2u16 {
        let port = broker.port + core;
        let listed = listed_groups(&mut broker.connect_port(port));
        assert_eq!(listed, by_port[&port], "the node of core {core} lists the groups it coordinates");
        listed_count += listed.len();
        every.extend(listed);
    }
    assert_eq!((listed_count, every.len()), (8, 8), "each group listed by exactly one node");
    let mut admin = GroupAdmin::connect(&broker.bootstrap()).unwrap();
    let shown: Vec<String> = admin.list().unwrap().into_iter().map(|g| g.group_id).collect();
    assert_eq!(shown, every.into_iter().collect::<Vec<_>>(), "group list asks every node");
}

#[test]
fn in_shared_port_mode_the_one_node_lists_every_group() {
    let broker = Broker::start(2, &["--listener", "shared"]);
    create_topic(&broker, "tracked", 1, &[]);
    let by_port = groups_by_coordinator_port(&broker, "tracked");
    let every: BTreeSet<String> = by_port.into_values().flatten().collect();
    assert_eq!(every.len(), 8);
    assert_eq!(listed_groups(&mut broker.connect()), every);
    let mut admin = GroupAdmin::connect(&broker.bootstrap()).unwrap();
    let shown: Vec<String> = admin.list().unwrap().into_iter().map(|g| g.group_id).collect();
    assert_eq!(shown.len(), every.len(), "each group once: {shown:?}");
    assert_eq!(shown.into_iter().collect::<BTreeSet<_>>(), every);
}

#[test]
fn each_group_has_one_coordinator_core_and_others_answer_not_coordinator() {
    let broker = Broker::start(2, &[]);
    let mut seen_ports = std::collections::BTreeSet::new();
    for i in 0..16 {
        let group = format!("group-{i}");
        let found = coordinator(&broker, &group);
        assert_eq!(found.error, ErrorCode::None);
        seen_ports.insert(found.port);
        let wrong_port = if found.port as u16 == broker.port { broker.port + 1 } else { broker.port };
        let mut wrong = broker.connect_port(wrong_port);
        let request = HeartbeatRequest {
            group_id: group.clone(),
            generation_id: 1,
            member_id: "m".into(),
            group_instance_id: None,
        };
        let reader = wrong.request(ApiKey::Heartbeat, 3, |w| request.encode(w, 3)).unwrap();
        let answer = shardlog::client::decode(reader, 3, HeartbeatResponse::decode).unwrap();
        assert_eq!(answer.error, ErrorCode::NotCoordinator);
    }
    assert_eq!(seen_ports.len(), 2, "groups spread over both cores");
}

#[test]
fn committed_offsets_survive_clean_restart_and_kill_nine() {
    let mut broker = Broker::start(2, &[]);
    create_topic(&broker, "orders", 3, &[]);
    let found = coordinator(&broker, "billing");
    let mut conn = broker.connect_port(found.port as u16);
    let answer = commit(&mut conn, "billing", "orders", &[(0, 5), (1, 7), (2, 9)]);
    assert!(answer.topics[0].partitions.iter().all(|p| p.error == ErrorCode::None));
    let unknown = commit(&mut conn, "billing", "no-such-topic", &[(0, 1)]);
    assert_eq!(unknown.topics[0].partitions[0].error, ErrorCode::UnknownTopicOrPartition);
    assert_eq!(committed(&mut conn, "billing", "orders", &[0, 1, 2, 3]), vec![5, 7, 9, -1]);
    broker.restart();
    let mut conn = broker.connect_port(found.port as u16);
    assert_eq!(committed(&mut conn, "billing", "orders", &[0, 1, 2]), vec![5, 7, 9]);
    commit(&mut conn, "billing", "orders", &[(0, 6)]);
    broker.kill();
    broker.spawn();
    let mut conn = broker.connect_port(found.port as u16);
    assert_eq!(committed(&mut conn, "billing", "orders", &[0, 1, 2]), vec![6, 7, 9]);
    let mut nobody = broker.connect_port(coordinator(&broker, "nobody").port as u16);
    assert_eq!(committed(&mut nobody, "nobody", "orders", &[0]), vec![-1], "unknown group answers -1");
}

#[test]
fn offsets_log_is_compacted_and_stays_bounded() {
    let mut broker = Broker::start(1, &[]);
    create_topic(&broker, "busy", 1, &[]);
    let mut conn = broker.connect();
    // 60,000 commits of the same partition: far past the compaction slack.
    for round in 0..600 {
        let offsets: Vec<(i32, i64)> = (0..100).map(|i| (0, (round * 100 + i) as i64)).collect();
        commit(&mut conn, "churn", "busy", &offsets);
    }
    std::thread::sleep(Duration::from_millis(500));
    let partitions = shardlog::constants::OFFSETS_TOPIC_PARTITIONS_DEFAULT as usize;
    let partition = shardlog::cluster::metadata::offsets_partition("churn", partitions);
    let dir = broker.data_dir().join(format!("__consumer_offsets-{partition}"));
    let start: i64 =
        std::fs::read_to_string(dir.join("log-start")).expect("compaction moved the log start").trim().parse().unwrap();
    assert!(start > 0);
    broker.restart();
    let mut conn = broker.connect();
    assert_eq!(committed(&mut conn, "churn", "busy", &[0]), vec![59_999]);
}

#[test]
fn group_admin_resets_and_deletes_an_empty_group() {
    let broker = Broker::start(2, &[]);
    create_topic(&broker, "events", 2, &[]);
    let mut producer = broker.connect();
    for partition in 0..2 {
        for _ in 0..3 {
            produce(&mut producer, "events", partition, batch("e", 2), 1);
        }
    }
    let found = coordinator(&broker, "readers");
    let mut conn = broker.connect_port(found.port as u16);
    commit(&mut conn, "readers", "events", &[(0, 2), (1, 4)]);
    let mut admin = GroupAdmin::connect(&broker.bootstrap()).unwrap();
    assert!(admin.list().unwrap().iter().any(|g| g.group_id == "readers"));
    let (group, lags) = admin.describe("readers").unwrap();
    assert_eq!(group.group_state, "Empty");
    let lag: Vec<Option<i64>> = lags.iter().map(|l| l.lag()).collect();
    assert_eq!(lag, vec![Some(4), Some(2)]);
    assert_eq!(admin.reset_offsets("readers", "events", ResetTarget::Latest).unwrap(), vec![(0, 6), (1, 6)]);
    assert_eq!(admin.reset_offsets("readers", "events", ResetTarget::Earliest).unwrap(), vec![(0, 0), (1, 0)]);
    assert_eq!(committed(&mut conn, "readers", "events", &[0, 1]), vec![0, 0]);
    admin.delete("readers").unwrap();
    assert!(!admin.list().unwrap().iter().any(|g| g.group_id == "readers"));
    assert_eq!(committed(&mut conn, "readers", "events", &[0]), vec![-1]);
}

#[test]
fn a_restart_with_another_core_count_keeps_committed_offsets() {
    // Offsets live in __consumer_offsets, whose partitions move to the
    // cores that still run, not in a log of the core a group hashed to.
    let mut broker = Broker::start(2, &[]);
    create_topic(&broker, "orders", 2, &[]);
    let found = coordinator(&broker, "billing");
    let mut conn = broker.connect_port(found.port as u16);
    commit(&mut conn, "billing", "orders", &[(0, 5), (1, 7)]);
    drop(conn);
    assert_eq!(broker.stop(), 0);
    broker.cores = 1;
    broker.spawn();
    let found = coordinator(&broker, "billing");
    assert_eq!(found.port, i32::from(broker.port), "one core coordinates every group");
    let mut conn = broker.connect_port(found.port as u16);
    assert_eq!(committed(&mut conn, "billing", "orders", &[0, 1]), vec![5, 7]);
}

/// One batch of old-format offsets log records (key and value as
/// `group::offsets` encodes them), as a pre-`__consumer_offsets` shardlog
/// wrote them to `__groups/core-<n>/`.
fn legacy_offsets_batch(commits: &[(&str, &str, i32, i64)]) -> Vec<u8> {
    use shardlog::group::{CommittedOffset, OffsetKey, OffsetRecord};
    use shardlog::protocol::record_batch::{encode_batch, ProducerFields, Record};
    let records: Vec<Record> = commits
        .iter()
        .enumerate()
        .map(|(i, (group, topic, partition, offset))| {
            let record = OffsetRecord {
                key: OffsetKey { group_id: group.to_string(), topic: topic.to_string(), partition: *partition },
                value: Some(CommittedOffset {
                    offset: *offset,
                    leader_epoch: -1,
                    metadata: "kept".into(),
                    commit_timestamp_ms: 1,
                }),
            };
            let encoded = record.encode().unwrap();
            Record {
                key: Some(encoded.key),
                value: encoded.value,
                headers: Vec::new(),
                timestamp_delta: 0,
                offset_delta: i as i32,
            }
        })
        .collect();
    encode_batch(&records, 1, ProducerFields::NONE).to_vec()
}

#[test]
fn offsets_in_the_old_per_core_logs_are_imported_into_consumer_offsets_once() {
    let mut broker = Broker::start(1, &[]);
    create_topic(&broker, "orders", 2, &[]);
    assert_eq!(broker.stop(), 0);
    // Two cores' logs of an older shardlog; the later commit of a key wins.
    let old = broker.data_dir().join("__groups");
    for (core, commits) in [
        (0, vec![("billing", "orders", 0, 3), ("billing", "orders", 0, 5)]),
        (1, vec![("billing", "orders", 1, 7), ("audit", "orders", 0, 2)]),
    ] {
        let dir = old.join(format!("core-{core}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut segment = legacy_offsets_batch(&commits);
        segment.resize(segment.len() + 4096, 0);
        std::fs::write(dir.join("00000000000000000000.log"), segment).unwrap();
    }
    broker.spawn();
    let imported = broker.data_dir().join("__groups.imported");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !imported.exists() {
        assert!(std::time::Instant::now() < deadline, "the old logs were not imported");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!old.exists(), "the old directory is renamed once imported");
    let mut conn = broker.connect_port(coordinator(&broker, "billing").port as u16);
    assert_eq!(committed(&mut conn, "billing", "orders", &[0, 1]), vec![5, 7]);
    let mut conn = broker.connect_port(coordinator(&broker, "audit").port as u16);
    assert_eq!(committed(&mut conn, "audit", "orders", &[0, 1]), vec![2, -1]);
    // The import does not run again: a newer commit stays.
    commit(&mut conn, "audit", "orders", &[(0, 9)]);
    broker.restart();
    let mut conn = broker.connect_port(coordinator(&broker, "audit").port as u16);
    assert_eq!(committed(&mut conn, "audit", "orders", &[0]), vec![9]);
}
