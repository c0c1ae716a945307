//! The coordinator driven by events, as a broker would: each test feeds
//! requests and ticks and checks the commands that come out. The harness
//! fails a test on any reply to a request that is not waiting (a second
//! reply, or one nobody asked for).

use std::collections::{BTreeSet, HashMap};

use bytes::Bytes;

use super::*;
use crate::protocol::delete_groups::DeleteGroupsRequest;
use crate::protocol::describe_groups::DescribeGroupsRequest;
use crate::protocol::join_group::JoinGroupProtocol;
use crate::protocol::leave_group::LeavingMember;
use crate::protocol::offset_commit::{OffsetCommitPartition, OffsetCommitTopic};
use crate::protocol::offset_fetch::{OffsetFetchRequest, OffsetFetchTopic};
use crate::protocol::sync_group::SyncGroupAssignment;

const GROUP: &str = "orders";
const SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 30_000;

fn config() -> GroupConfig {
    GroupConfig { initial_rebalance_delay_ms: 0, member_id_seed: 0xab, ..GroupConfig::default() }
}

struct Harness {
    coordinator: GroupCoordinator,
    now_ms: u64,
    next_token: u64,
    waiting: BTreeSet<ReplyTo>,
    replies: HashMap<ReplyTo, GroupResponse>,
    writes: Vec<(PersistId, Vec<OffsetRecord>)>,
}

impl Harness {
    fn new() -> Self {
        Self::with(config())
    }

    fn with(config: GroupConfig) -> Self {
        Self {
            coordinator: GroupCoordinator::new(config).unwrap(),
            now_ms: 1_000_000,
            next_token: 0,
            waiting: BTreeSet::new(),
            replies: HashMap::new(),
            writes: Vec::new(),
        }
    }

    fn token(&mut self) -> ReplyTo {
        let token = ReplyTo(self.next_token);
        self.next_token += 1;
        self.waiting.insert(token);
        token
    }

    fn step(&mut self, event: GroupEvent) {
        for command in self.coordinator.step(self.now_ms, event) {
            match command {
                GroupCommand::Reply { to, response } => {
                    assert!(self.waiting.remove(&to), "reply to {to:?}, which is not waiting: {response:?}");
                    self.replies.insert(to, response);
                }
                GroupCommand::PersistOffsets { persist_id, records } => self.writes.push((persist_id, records)),
            }
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        self.step(GroupEvent::Tick);
    }

    fn is_held(&self, to: ReplyTo) -> bool {
        self.waiting.contains(&to)
    }

    fn join(&mut self, request: JoinGroupRequest, api_version: i16) -> ReplyTo {
        let reply_to = self.token();
        let client = ClientInfo { client_id: "client".into(), client_host: "/127.0.0.1".into() };
        self.step(GroupEvent::Join { reply_to, api_version, client, request });
        reply_to
    }

    fn sync(&mut self, member_id: &str, generation_id: i32, assignments: &[(&str, &[u8])]) -> ReplyTo {
        let reply_to = self.token();
        let request = SyncGroupRequest {
            group_id: GROUP.into(),
            generation_id,
            member_id: member_id.into(),
            group_instance_id: None,
            assignments: assignments
                .iter()
                .map(|(id, bytes)| SyncGroupAssignment {
                    member_id: (*id).into(),
                    assignment: Bytes::copy_from_slice(bytes),
                })
                .collect(),
        };
        self.step(GroupEvent::Sync { reply_to, request });
        reply_to
    }

    fn heartbeat_as(&mut self, member_id: &str, instance_id: Option<&str>, generation_id: i32) -> ErrorCode {
        let reply_to = self.token();
        let request = HeartbeatRequest {
            group_id: GROUP.into(),
            generation_id,
            member_id: member_id.into(),
            group_instance_id: instance_id.map(str::to_owned),
        };
        self.step(GroupEvent::Heartbeat { reply_to, request });
        match self.replies.remove(&reply_to) {
            Some(GroupResponse::Heartbeat(response)) => response.error,
            other => panic!("expected a Heartbeat reply, got {other:?}"),
        }
    }

    fn heartbeat(&mut self, member_id: &str, generation_id: i32) -> ErrorCode {
        self.heartbeat_as(member_id, None, generation_id)
    }

    fn leave(&mut self, api_version: i16, request: LeaveGroupRequest) -> LeaveGroupResponse {
        let reply_to = self.token();
        self.step(GroupEvent::Leave { reply_to, api_version, request });
        match self.replies.remove(&reply_to) {
            Some(GroupResponse::Leave(response)) => response,
            other => panic!("expected a LeaveGroup reply, got {other:?}"),
        }
    }

    fn commit(&mut self, request: OffsetCommitRequest) -> ReplyTo {
        let reply_to = self.token();
        self.step(GroupEvent::OffsetCommit { reply_to, request });
        reply_to
    }

    fn delete(&mut self, groups: &[&str]) -> ReplyTo {
        let reply_to = self.token();
        let request = DeleteGroupsRequest { groups_names: groups.iter().map(|g| (*g).to_owned()).collect() };
        self.step(GroupEvent::DeleteGroups { reply_to, request });
        reply_to
    }

    fn persisted(&mut self, persist_id: PersistId, result: Result<(), ErrorCode>) {
        self.step(GroupEvent::OffsetsPersisted { persist_id, result });
    }

    fn last_write(&self) -> (PersistId, Vec<OffsetRecord>) {
        self.writes.last().cloned().expect("a PersistOffsets command")
    }

    fn joined(&mut self, to: ReplyTo) -> JoinGroupResponse {
        match self.replies.remove(&to) {
            Some(GroupResponse::Join(response)) => response,
            other => panic!("expected a JoinGroup reply for {to:?}, got {other:?}"),
        }
    }

    fn synced(&mut self, to: ReplyTo) -> SyncGroupResponse {
        match self.replies.remove(&to) {
            Some(GroupResponse::Sync(response)) => response,
            other => panic!("expected a SyncGroup reply for {to:?}, got {other:?}"),
        }
    }

    fn committed(&mut self, to: ReplyTo) -> OffsetCommitResponse {
        match self.replies.remove(&to) {
            Some(GroupResponse::OffsetCommit(response)) => response,
            other => panic!("expected an OffsetCommit reply for {to:?}, got {other:?}"),
        }
    }

    fn deleted(&mut self, to: ReplyTo) -> DeleteGroupsResponse {
        match self.replies.remove(&to) {
            Some(GroupResponse::DeleteGroups(response)) => response,
            other => panic!("expected a DeleteGroups reply for {to:?}, got {other:?}"),
        }
    }

    fn state(&self) -> GroupState {
        self.coordinator.group_state(GROUP)
    }

    fn fetch(&self, topic: &str, partitions: &[i32]) -> Vec<(i32, i64, Option<String>)> {
        let request = OffsetFetchRequest {
            group_id: GROUP.into(),
            topics: Some(vec![OffsetFetchTopic { name: topic.into(), partition_indexes: partitions.to_vec() }]),
        };
        let response = self.coordinator.fetch_offsets(&request);
        response.topics[0]
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.committed_offset, p.metadata.clone()))
            .collect()
    }
}

fn protocol(name: &str, metadata: &[u8]) -> JoinGroupProtocol {
    JoinGroupProtocol { name: name.into(), metadata: Bytes::copy_from_slice(metadata) }
}

fn join_request(member_id: &str) -> JoinGroupRequest {
    JoinGroupRequest {
        group_id: GROUP.into(),
        session_timeout_ms: SESSION_MS,
        rebalance_timeout_ms: REBALANCE_MS,
        member_id: member_id.into(),
        group_instance_id: None,
        protocol_type: "consumer".into(),
        protocols: vec![protocol("range", b"meta-range"), protocol("roundrobin", b"meta-rr")],
    }
}

fn static_join_request(member_id: &str, instance_id: &str) -> JoinGroupRequest {
    JoinGroupRequest { group_instance_id: Some(instance_id.into()), ..join_request(member_id) }
}

fn commit_request(generation_id: i32, member_id: &str, offsets: &[(i32, i64)]) -> OffsetCommitRequest {
    OffsetCommitRequest {
        group_id: GROUP.into(),
        generation_id,
        member_id: member_id.into(),
        group_instance_id: None,
        retention_time_ms: -1,
        topics: vec![OffsetCommitTopic {
            name: "payments".into(),
            partitions: offsets
                .iter()
                .map(|&(partition_index, committed_offset)| OffsetCommitPartition {
                    partition_index,
                    committed_offset,
                    committed_leader_epoch: 4,
                    committed_metadata: Some(format!("at-{committed_offset}")),
                })
                .collect(),
        }],
    }
}

fn errors(response: &OffsetCommitResponse) -> Vec<ErrorCode> {
    response.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error)).collect()
}

/// A group after one completed rebalance: who is in it, in join order.
struct Formed {
    generation: i32,
    leader: String,
    members: Vec<String>,
}

/// Joins `requests` one by one the way clients do with no initial delay:
/// each newcomer starts a rebalance that the earlier members rejoin.
fn form_group_of(h: &mut Harness, requests: Vec<JoinGroupRequest>) -> Formed {
    let mut members: Vec<String> = Vec::new();
    let mut last = None;
    for request in requests {
        let rejoin_template = request.clone();
        let mut newcomer = h.join(request.clone(), 5);
        if let Some(GroupResponse::Join(first)) = h.replies.get(&newcomer) {
            if first.error == ErrorCode::MemberIdRequired {
                let member_id = h.joined(newcomer).member_id;
                newcomer = h.join(JoinGroupRequest { member_id, ..request }, 5);
            }
        }
        let rejoins: Vec<ReplyTo> = members
            .iter()
            .map(|id| {
                let mut again = rejoin_template.clone();
                again.member_id = id.clone();
                again.group_instance_id = None;
                h.join(again, 5)
            })
            .collect();
        let response = h.joined(newcomer);
        assert_eq!(response.error, ErrorCode::None);
        for to in rejoins {
            assert_eq!(h.joined(to).generation_id, response.generation_id);
        }
        members.push(response.member_id.clone());
        last = Some(response);
    }
    let last = last.expect("at least one member");
    Formed { generation: last.generation_id, leader: last.leader, members }
}

/// A Stable group of `count` dynamic members; the leader assigned each
/// member the bytes "assignment-<index>".
fn stable_group(h: &mut Harness, count: usize) -> Formed {
    let formed = form_group_of(h, (0..count).map(|_| join_request("")).collect());
    sync_everyone(h, &formed);
    formed
}

fn sync_everyone(h: &mut Harness, formed: &Formed) {
    let labels: Vec<String> = (0..formed.members.len()).map(|i| format!("assignment-{i}")).collect();
    let assignments: Vec<(&str, &[u8])> =
        formed.members.iter().zip(&labels).map(|(id, label)| (id.as_str(), label.as_bytes())).collect();
    let mut tokens = Vec::new();
    for id in formed.members.iter().filter(|id| **id != formed.leader) {
        tokens.push(h.sync(id, formed.generation, &[]));
    }
    tokens.push(h.sync(&formed.leader, formed.generation, &assignments));
    for to in tokens {
        assert_eq!(h.synced(to).error, ErrorCode::None);
    }
    assert_eq!(h.state(), GroupState::Stable);
}

// ---- JoinGroup -------------------------------------------------------------

#[test]
fn first_join_with_no_initial_delay_completes_at_once_and_the_joiner_leads() {
    let mut h = Harness::new();
    let to = h.join(join_request(""), 3);
    let response = h.joined(to);
    assert_eq!(response.error, ErrorCode::None);
    assert_eq!(response.generation_id, 1);
    assert_eq!(response.leader, response.member_id);
    assert_eq!(response.protocol_name, "range");
    assert!(response.member_id.starts_with("client-ab-"));
    assert_eq!(response.members.len(), 1);
    assert_eq!(response.members[0].metadata, Bytes::from_static(b"meta-range"));
    assert_eq!(h.state(), GroupState::CompletingRebalance);
}

#[test]
fn join_v4_without_member_id_gets_member_id_required_then_rejoins_with_it() {
    let mut h = Harness::new();
    let first = h.join(join_request(""), 4);
    let response = h.joined(first);
    assert_eq!(response.error, ErrorCode::MemberIdRequired);
    assert_eq!(response.generation_id, -1);
    assert!(!response.member_id.is_empty());
    assert_eq!(h.state(), GroupState::Empty);

    let again = h.join(join_request(&response.member_id), 4);
    let joined = h.joined(again);
    assert_eq!(joined.error, ErrorCode::None);
    assert_eq!(joined.member_id, response.member_id);
    assert_eq!(joined.leader, response.member_id);
    assert_eq!(joined.generation_id, 1);
}

#[test]
fn member_id_required_member_that_never_rejoins_expires_with_its_session() {
    let mut h = Harness::new();
    let first = h.join(join_request(""), 4);
    let member_id = h.joined(first).member_id;
    h.advance(SESSION_MS as u64);
    let again = h.join(join_request(&member_id), 4);
    assert_eq!(h.joined(again).error, ErrorCode::UnknownMemberId);
}

#[test]
fn join_is_held_until_every_known_member_rejoins() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let (leader, follower) = (&formed.members[0], &formed.members[1]);

    // The leader rejoining starts a rebalance and waits for the follower.
    let leader_join = h.join(join_request(leader), 5);
    assert!(h.is_held(leader_join));
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    assert_eq!(h.heartbeat(follower, formed.generation), ErrorCode::RebalanceInProgress);
    h.advance(5_000);
    assert!(h.is_held(leader_join));

    let follower_join = h.join(join_request(follower), 5);
    let leader_response = h.joined(leader_join);
    let follower_response = h.joined(follower_join);
    assert_eq!(leader_response.generation_id, formed.generation + 1);
    assert_eq!(follower_response.generation_id, formed.generation + 1);
    assert_eq!(follower_response.leader, *leader);
    let listed: Vec<&str> = leader_response.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!(listed, [leader.as_str(), follower.as_str()]);
    assert!(follower_response.members.is_empty());
    assert_eq!(h.state(), GroupState::CompletingRebalance);
}

#[test]
fn rebalance_timeout_removes_members_that_did_not_rejoin() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let (leader, follower) = (&formed.members[0], &formed.members[1]);
    let leader_join = h.join(join_request(leader), 5);

    // The follower keeps its session alive but never rejoins.
    for _ in 0..9 {
        h.advance(3_000);
        assert_eq!(h.heartbeat(follower, formed.generation), ErrorCode::RebalanceInProgress);
        assert!(h.is_held(leader_join));
    }
    h.advance(3_000);
    let response = h.joined(leader_join);
    assert_eq!(response.error, ErrorCode::None);
    assert_eq!(response.generation_id, formed.generation + 1);
    assert_eq!(response.members.len(), 1);
    assert_eq!(h.heartbeat(follower, response.generation_id), ErrorCode::UnknownMemberId);
}

#[test]
fn initial_rebalance_delay_collects_joins_and_extends_while_members_arrive() {
    let mut h = Harness::with(GroupConfig { initial_rebalance_delay_ms: 3_000, ..config() });
    let first = h.join(join_request(""), 3);
    h.advance(1_000);
    let second = h.join(join_request(""), 3);
    h.advance(1_999);
    assert!(h.is_held(first) && h.is_held(second));
    // The delay ran out, but a member arrived during it: wait once more.
    h.advance(1);
    assert!(h.is_held(first) && h.is_held(second));
    h.advance(2_999);
    assert!(h.is_held(first));
    h.advance(1);
    let first = h.joined(first);
    let second = h.joined(second);
    assert_eq!((first.generation_id, second.generation_id), (1, 1));
    assert_eq!(first.members.len(), 2);
    assert_eq!(second.leader, first.member_id);
}

#[test]
fn initial_rebalance_delay_ends_on_time_when_nobody_else_arrives() {
    let mut h = Harness::with(GroupConfig { initial_rebalance_delay_ms: 3_000, ..config() });
    let only = h.join(join_request(""), 3);
    h.advance(2_999);
    assert!(h.is_held(only));
    h.advance(1);
    assert_eq!(h.joined(only).generation_id, 1);
}

#[test]
fn protocol_selection_takes_a_common_protocol_in_the_members_preference_order() {
    let cases: [(&[&str], &[&str], &str); 4] = [
        (&["roundrobin", "range"], &["roundrobin", "range"], "roundrobin"),
        (&["sticky", "range"], &["range", "roundrobin"], "range"),
        (&["roundrobin", "range"], &["range", "roundrobin"], "roundrobin"),
        (&["range", "roundrobin"], &["roundrobin", "range"], "range"),
    ];
    for (first, second, expected) in cases {
        let mut h = Harness::with(GroupConfig { initial_rebalance_delay_ms: 100, ..config() });
        let tokens: Vec<ReplyTo> = [first, second]
            .iter()
            .enumerate()
            .map(|(index, names)| {
                let protocols =
                    names.iter().map(|name| protocol(name, format!("m{index}-{name}").as_bytes())).collect();
                h.join(JoinGroupRequest { protocols, ..join_request("") }, 3)
            })
            .collect();
        h.advance(200);
        let leader = h.joined(tokens[0]);
        h.joined(tokens[1]);
        assert_eq!(leader.protocol_name, expected, "{first:?} / {second:?}");
        let metadata: Vec<Bytes> = leader.members.iter().map(|m| m.metadata.clone()).collect();
        let wanted: Vec<Bytes> = (0..2).map(|i| Bytes::from(format!("m{i}-{expected}"))).collect();
        assert_eq!(metadata, wanted);
    }
}

#[test]
fn join_with_another_protocol_type_is_inconsistent_group_protocol() {
    let mut h = Harness::new();
    h.join(join_request(""), 3);
    let to = h.join(JoinGroupRequest { protocol_type: "connect".into(), ..join_request("") }, 3);
    let response = h.joined(to);
    assert_eq!(response.error, ErrorCode::InconsistentGroupProtocol);
    assert_eq!(response.member_id, "");
}

#[test]
fn join_with_no_protocol_in_common_is_inconsistent_group_protocol() {
    let mut h = Harness::new();
    h.join(join_request(""), 3);
    let to = h.join(JoinGroupRequest { protocols: vec![protocol("sticky", b"")], ..join_request("") }, 3);
    assert_eq!(h.joined(to).error, ErrorCode::InconsistentGroupProtocol);
    let to = h.join(JoinGroupRequest { protocols: Vec::new(), group_id: "fresh".into(), ..join_request("") }, 3);
    assert_eq!(h.joined(to).error, ErrorCode::InconsistentGroupProtocol);
}

#[test]
fn session_timeout_outside_the_configured_bounds_is_invalid_session_timeout() {
    let mut h = Harness::new();
    for session_timeout_ms in [5_999, 1_800_001, -1] {
        let to = h.join(JoinGroupRequest { session_timeout_ms, ..join_request("") }, 3);
        assert_eq!(h.joined(to).error, ErrorCode::InvalidSessionTimeout, "{session_timeout_ms}");
    }
    let to = h.join(JoinGroupRequest { session_timeout_ms: 6_000, ..join_request("") }, 3);
    assert_eq!(h.joined(to).error, ErrorCode::None);
}

#[test]
fn join_with_an_unknown_member_id_is_unknown_member_id() {
    let mut h = Harness::new();
    let to = h.join(join_request("nobody"), 3);
    assert_eq!(h.joined(to).error, ErrorCode::UnknownMemberId);
    assert_eq!(h.state(), GroupState::Dead);
    h.join(join_request(""), 3);
    let to = h.join(join_request("nobody"), 3);
    assert_eq!(h.joined(to).error, ErrorCode::UnknownMemberId);
}

#[test]
fn empty_group_id_is_invalid_group_id_for_membership_requests() {
    let mut h = Harness::new();
    let to = h.join(JoinGroupRequest { group_id: String::new(), ..join_request("") }, 3);
    assert_eq!(h.joined(to).error, ErrorCode::InvalidGroupId);
    let reply_to = h.token();
    let request =
        HeartbeatRequest { group_id: String::new(), generation_id: 1, member_id: "m".into(), group_instance_id: None };
    h.step(GroupEvent::Heartbeat { reply_to, request });
    assert_eq!(
        h.replies.remove(&reply_to),
        Some(GroupResponse::Heartbeat(HeartbeatResponse::new(ErrorCode::InvalidGroupId)))
    );
    let response =
        h.leave(0, LeaveGroupRequest { group_id: String::new(), member_id: "m".into(), members: Vec::new() });
    assert_eq!(response.error, ErrorCode::InvalidGroupId);
}

#[test]
fn group_at_its_size_limit_refuses_new_members() {
    let mut h = Harness::with(GroupConfig { members_per_group_max: 2, initial_rebalance_delay_ms: 100, ..config() });
    let first = h.join(join_request(""), 3);
    let second = h.join(join_request(""), 3);
    let third = h.join(join_request(""), 3);
    assert_eq!(h.joined(third).error, ErrorCode::GroupMaxSizeReached);
    h.advance(200);
    assert_eq!(h.joined(first).members.len(), 2);
    h.joined(second);
}

#[test]
fn oversized_member_metadata_is_refused() {
    let mut h = Harness::with(GroupConfig { member_metadata_bytes_max: 16, ..config() });
    let big = JoinGroupRequest { protocols: vec![protocol("range", &[7u8; 17])], ..join_request("") };
    let to = h.join(big, 3);
    assert_eq!(h.joined(to).error, ErrorCode::InvalidRequest);
}

#[test]
fn follower_rejoin_with_unchanged_metadata_in_stable_gets_the_current_generation() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let to = h.join(join_request(&formed.members[1]), 5);
    let response = h.joined(to);
    assert_eq!(response.generation_id, formed.generation);
    assert_eq!(response.leader, formed.leader);
    assert!(response.members.is_empty());
    assert_eq!(h.state(), GroupState::Stable);
}

#[test]
fn follower_rejoin_with_changed_metadata_starts_a_rebalance() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let changed =
        JoinGroupRequest { protocols: vec![protocol("range", b"new-topics")], ..join_request(&formed.members[1]) };
    let to = h.join(changed, 5);
    assert!(h.is_held(to));
    assert_eq!(h.state(), GroupState::PreparingRebalance);
}

#[test]
fn a_second_join_from_the_same_member_supersedes_the_held_one() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let first = h.join(join_request(&formed.members[0]), 5);
    let second = h.join(join_request(&formed.members[0]), 5);
    assert_eq!(h.joined(first).error, ErrorCode::RebalanceInProgress);
    assert!(h.is_held(second));
}

// ---- SyncGroup -------------------------------------------------------------

#[test]
fn follower_sync_waits_for_the_leader_and_assignments_are_relayed_unread() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request(""), join_request("")]);
    let (leader, follower) = (formed.members[0].clone(), formed.members[1].clone());
    let follower_sync = h.sync(&follower, formed.generation, &[]);
    assert!(h.is_held(follower_sync));
    h.advance(1_000);
    assert!(h.is_held(follower_sync));

    let opaque: &[u8] = &[0, 255, 1, 254, b'x'];
    let leader_sync = h.sync(&leader, formed.generation, &[(follower.as_str(), opaque), (leader.as_str(), b"mine")]);
    assert_eq!(h.synced(follower_sync).assignment, Bytes::from_static(opaque));
    assert_eq!(h.synced(leader_sync).assignment, Bytes::from_static(b"mine"));
    assert_eq!(h.state(), GroupState::Stable);
}

#[test]
fn member_left_out_of_the_leader_assignment_gets_an_empty_one() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request(""), join_request("")]);
    let follower_sync = h.sync(&formed.members[1], formed.generation, &[]);
    h.sync(&formed.leader, formed.generation, &[(formed.leader.as_str(), b"all")]);
    let response = h.synced(follower_sync);
    assert_eq!(response.error, ErrorCode::None);
    assert!(response.assignment.is_empty());
}

#[test]
fn sync_with_a_wrong_generation_is_illegal_generation() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request("")]);
    let to = h.sync(&formed.leader, formed.generation + 1, &[]);
    assert_eq!(h.synced(to).error, ErrorCode::IllegalGeneration);
}

#[test]
fn sync_from_an_unknown_member_is_unknown_member_id() {
    let mut h = Harness::new();
    let to = h.sync("ghost", 1, &[]);
    assert_eq!(h.synced(to).error, ErrorCode::UnknownMemberId);
    let formed = form_group_of(&mut h, vec![join_request("")]);
    let to = h.sync("ghost", formed.generation, &[]);
    assert_eq!(h.synced(to).error, ErrorCode::UnknownMemberId);
}

#[test]
fn sync_during_preparing_rebalance_is_rebalance_in_progress() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    h.join(join_request(&formed.members[0]), 5);
    let to = h.sync(&formed.members[1], formed.generation, &[]);
    assert_eq!(h.synced(to).error, ErrorCode::RebalanceInProgress);
}

#[test]
fn held_sync_is_answered_rebalance_in_progress_when_a_new_member_joins() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request(""), join_request("")]);
    let follower_sync = h.sync(&formed.members[1], formed.generation, &[]);
    let newcomer = h.join(join_request(""), 3);
    assert_eq!(h.synced(follower_sync).error, ErrorCode::RebalanceInProgress);
    assert!(h.is_held(newcomer));
    assert_eq!(h.state(), GroupState::PreparingRebalance);
}

#[test]
fn leader_that_never_syncs_is_removed_after_the_rebalance_timeout() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request(""), join_request("")]);
    let (leader, follower) = (formed.members[0].clone(), formed.members[1].clone());
    let follower_sync = h.sync(&follower, formed.generation, &[]);
    // The leader heartbeats (a live process) but never sends its SyncGroup.
    for _ in 0..9 {
        h.advance(3_000);
        assert_eq!(h.heartbeat(&leader, formed.generation), ErrorCode::None);
    }
    assert!(h.is_held(follower_sync));
    h.advance(3_000);
    assert_eq!(h.synced(follower_sync).error, ErrorCode::RebalanceInProgress);
    assert_eq!(h.heartbeat(&leader, formed.generation), ErrorCode::UnknownMemberId);
    let rejoin = h.join(join_request(&follower), 5);
    let response = h.joined(rejoin);
    assert_eq!(response.leader, follower);
    assert_eq!(response.generation_id, formed.generation + 1);
}

#[test]
fn sync_in_stable_returns_the_stored_assignment() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let to = h.sync(&formed.members[1], formed.generation, &[]);
    assert_eq!(h.synced(to).assignment, Bytes::from_static(b"assignment-1"));
}

// ---- Heartbeat -------------------------------------------------------------

#[test]
fn heartbeat_with_a_wrong_generation_is_illegal_generation() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 1);
    assert_eq!(h.heartbeat(&formed.leader, formed.generation - 1), ErrorCode::IllegalGeneration);
    assert_eq!(h.heartbeat(&formed.leader, formed.generation), ErrorCode::None);
}

#[test]
fn heartbeat_from_an_unknown_member_is_unknown_member_id() {
    let mut h = Harness::new();
    assert_eq!(h.heartbeat("ghost", 1), ErrorCode::UnknownMemberId);
    let formed = stable_group(&mut h, 1);
    assert_eq!(h.heartbeat("ghost", formed.generation), ErrorCode::UnknownMemberId);
}

#[test]
fn heartbeat_while_waiting_for_the_leader_assignment_is_accepted() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request(""), join_request("")]);
    assert_eq!(h.state(), GroupState::CompletingRebalance);
    assert_eq!(h.heartbeat(&formed.members[1], formed.generation), ErrorCode::None);
}

#[test]
fn heartbeats_push_the_session_deadline_out() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 1);
    for _ in 0..10 {
        h.advance(9_000);
        assert_eq!(h.heartbeat(&formed.leader, formed.generation), ErrorCode::None);
    }
    h.advance(9_999);
    assert_eq!(h.state(), GroupState::Stable);
    h.advance(1);
    // Expired; with no offsets the Empty group is then forgotten.
    assert_eq!(h.state(), GroupState::Dead);
    assert_eq!(h.heartbeat(&formed.leader, formed.generation), ErrorCode::UnknownMemberId);
}

#[test]
fn missed_heartbeats_expire_the_member_and_rebalance_the_rest() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let (alive, silent) = (&formed.members[0], &formed.members[1]);
    for _ in 0..3 {
        h.advance(3_000);
        assert_eq!(h.heartbeat(alive, formed.generation), ErrorCode::None);
    }
    h.advance(1_000);
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    assert_eq!(h.heartbeat(alive, formed.generation), ErrorCode::RebalanceInProgress);
    let to = h.join(join_request(alive), 5);
    let response = h.joined(to);
    assert_eq!(response.members.len(), 1);
    assert_eq!(h.heartbeat(silent, formed.generation), ErrorCode::UnknownMemberId);
}

// ---- LeaveGroup ------------------------------------------------------------

#[test]
fn leave_v0_removes_the_member_and_rebalances_at_once() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let response = h.leave(
        0,
        LeaveGroupRequest { group_id: GROUP.into(), member_id: formed.members[1].clone(), members: Vec::new() },
    );
    assert_eq!(response.error, ErrorCode::None);
    assert!(response.members.is_empty());
    assert_eq!(h.heartbeat(&formed.members[0], formed.generation), ErrorCode::RebalanceInProgress);
}

#[test]
fn leave_v0_of_an_unknown_member_reports_the_error_at_the_top() {
    let mut h = Harness::new();
    stable_group(&mut h, 1);
    let request = LeaveGroupRequest { group_id: GROUP.into(), member_id: "ghost".into(), members: Vec::new() };
    assert_eq!(h.leave(2, request.clone()).error, ErrorCode::UnknownMemberId);
    let request = LeaveGroupRequest { group_id: "missing".into(), ..request };
    assert_eq!(h.leave(1, request).error, ErrorCode::UnknownMemberId);
}

#[test]
fn leave_v3_answers_per_member_and_removes_a_static_member_by_instance_id() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request(""), static_join_request("", "host-s")]);
    sync_everyone(&mut h, &formed);
    let request = LeaveGroupRequest {
        group_id: GROUP.into(),
        member_id: String::new(),
        members: vec![
            LeavingMember { member_id: String::new(), group_instance_id: Some("host-s".into()) },
            LeavingMember { member_id: "ghost".into(), group_instance_id: None },
        ],
    };
    let response = h.leave(3, request);
    assert_eq!(response.error, ErrorCode::None);
    let errors: Vec<ErrorCode> = response.members.iter().map(|m| m.error).collect();
    assert_eq!(errors, [ErrorCode::None, ErrorCode::UnknownMemberId]);
    assert_eq!(response.members[0].group_instance_id.as_deref(), Some("host-s"));
    assert_eq!(h.heartbeat(&formed.members[1], formed.generation), ErrorCode::UnknownMemberId);
    assert_eq!(h.state(), GroupState::PreparingRebalance);
}

#[test]
fn last_member_leaving_empties_the_group_with_a_new_generation() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 1);
    let request = LeaveGroupRequest { group_id: GROUP.into(), member_id: formed.leader.clone(), members: Vec::new() };
    assert_eq!(h.leave(0, request).error, ErrorCode::None);
    assert_eq!(h.state(), GroupState::Empty);
    let description = h
        .coordinator
        .describe_groups(&DescribeGroupsRequest { groups: vec![GROUP.into()], include_authorized_operations: false });
    assert!(description.groups[0].members.is_empty());
}

#[test]
fn leaving_member_with_a_held_join_gets_unknown_member_id() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let held = h.join(join_request(&formed.members[0]), 5);
    let request =
        LeaveGroupRequest { group_id: GROUP.into(), member_id: formed.members[0].clone(), members: Vec::new() };
    h.leave(0, request);
    assert_eq!(h.joined(held).error, ErrorCode::UnknownMemberId);
}

// ---- Static membership -----------------------------------------------------

#[test]
fn static_member_rejoin_in_stable_takes_a_new_member_id_without_a_rebalance() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![static_join_request("", "host-s"), join_request("")]);
    sync_everyone(&mut h, &formed);
    let old_id = formed.members[0].clone();

    // The process restarts and comes back with its instance id only.
    let to = h.join(static_join_request("", "host-s"), 5);
    let response = h.joined(to);
    assert_eq!(response.error, ErrorCode::None);
    assert_ne!(response.member_id, old_id);
    assert!(response.member_id.starts_with("host-s-"));
    assert_eq!(response.generation_id, formed.generation);
    // The old leader id goes back, so the new incarnation does not reassign.
    assert_eq!(response.leader, old_id);
    assert_eq!(h.state(), GroupState::Stable);
    assert_eq!(h.heartbeat(&formed.members[1], formed.generation), ErrorCode::None);

    let sync = h.sync(&response.member_id, formed.generation, &[]);
    assert_eq!(h.synced(sync).assignment, Bytes::from_static(b"assignment-0"));
    assert_eq!(h.heartbeat_as(&old_id, Some("host-s"), formed.generation), ErrorCode::FencedInstanceId);
}

#[test]
fn stale_member_id_with_a_known_instance_id_is_fenced_everywhere() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![static_join_request("", "host-s")]);
    sync_everyone(&mut h, &formed);
    let zombie = formed.members[0].clone();
    let to = h.join(static_join_request("", "host-s"), 5);
    h.joined(to);

    assert_eq!(h.heartbeat_as(&zombie, Some("host-s"), formed.generation), ErrorCode::FencedInstanceId);
    let to = h.join(static_join_request(&zombie, "host-s"), 5);
    assert_eq!(h.joined(to).error, ErrorCode::FencedInstanceId);
    let commit = OffsetCommitRequest {
        group_instance_id: Some("host-s".into()),
        ..commit_request(formed.generation, &zombie, &[(0, 5)])
    };
    let to = h.commit(commit);
    assert_eq!(errors(&h.committed(to)), [ErrorCode::FencedInstanceId]);
}

#[test]
fn held_join_of_a_replaced_static_member_is_fenced() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![static_join_request("", "host-s"), join_request("")]);
    sync_everyone(&mut h, &formed);
    // The static leader rejoins (a rebalance starts), then a second process
    // with the same instance id shows up.
    let old = h.join(static_join_request(&formed.members[0], "host-s"), 5);
    assert!(h.is_held(old));
    let newer = h.join(static_join_request("", "host-s"), 5);
    assert_eq!(h.joined(old).error, ErrorCode::FencedInstanceId);
    assert!(h.is_held(newer));

    let dynamic = h.join(join_request(&formed.members[1]), 5);
    let response = h.joined(newer);
    assert_eq!(response.generation_id, formed.generation + 1);
    assert_ne!(response.member_id, formed.members[0]);
    assert_eq!(response.leader, response.member_id);
    assert_eq!(h.joined(dynamic).leader, response.member_id);
}

#[test]
fn static_member_replaced_while_completing_rebalance_forces_a_new_rebalance() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![static_join_request("", "host-s"), join_request("")]);
    sync_everyone(&mut h, &formed);
    let leader = h.join(static_join_request(&formed.members[0], "host-s"), 5);
    let follower = h.join(join_request(&formed.members[1]), 5);
    h.joined(leader);
    h.joined(follower);
    let follower_sync = h.sync(&formed.members[1], formed.generation + 1, &[]);

    // The leader may be computing assignments for the old id: start over.
    let newer = h.join(static_join_request("", "host-s"), 5);
    assert_eq!(h.synced(follower_sync).error, ErrorCode::RebalanceInProgress);
    assert!(h.is_held(newer));
    assert_eq!(h.state(), GroupState::PreparingRebalance);
}

#[test]
fn static_member_that_does_not_rejoin_stays_through_the_rebalance() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request(""), static_join_request("", "host-s")]);
    sync_everyone(&mut h, &formed);
    let (dynamic, fixed) = (formed.members[0].clone(), formed.members[1].clone());
    let to = h.join(join_request(&dynamic), 5);
    for _ in 0..10 {
        h.advance(3_000);
        h.heartbeat_as(&fixed, Some("host-s"), formed.generation);
    }
    let response = h.joined(to);
    assert_eq!(response.generation_id, formed.generation + 1);
    let listed: Vec<&str> = response.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!(listed, [dynamic.as_str(), fixed.as_str()]);
    assert_eq!(response.members[1].group_instance_id.as_deref(), Some("host-s"));
}

// ---- OffsetCommit / OffsetFetch --------------------------------------------

#[test]
fn simple_consumer_commit_creates_an_empty_group_and_replies_after_the_write() {
    let mut h = Harness::new();
    let to = h.commit(commit_request(-1, "", &[(0, 100), (3, 7)]));
    assert!(h.is_held(to));
    assert_eq!(h.state(), GroupState::Empty);
    assert_eq!(h.fetch("payments", &[0]), [(0, -1, Some(String::new()))]);

    let (persist_id, records) = h.last_write();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].key, OffsetKey { group_id: GROUP.into(), topic: "payments".into(), partition: 0 });
    let value = records[0].value.clone().unwrap();
    assert_eq!((value.offset, value.leader_epoch, value.metadata.as_str()), (100, 4, "at-100"));
    assert_eq!(value.commit_timestamp_ms, h.now_ms as i64);

    h.persisted(persist_id, Ok(()));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::None, ErrorCode::None]);
    assert_eq!(h.fetch("payments", &[0, 3]), [(0, 100, Some("at-100".into())), (3, 7, Some("at-7".into()))]);
}

#[test]
fn failed_write_answers_the_storage_error_and_keeps_the_old_offset() {
    let mut h = Harness::new();
    let to = h.commit(commit_request(-1, "", &[(0, 100)]));
    let (persist_id, _) = h.last_write();
    h.persisted(persist_id, Ok(()));
    h.committed(to);

    let to = h.commit(commit_request(-1, "", &[(0, 200)]));
    let (persist_id, _) = h.last_write();
    h.persisted(persist_id, Err(ErrorCode::KafkaStorageError));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::KafkaStorageError]);
    assert_eq!(h.fetch("payments", &[0])[0].1, 100);
}

#[test]
fn commit_with_a_generation_to_an_unknown_group_is_illegal_generation() {
    let mut h = Harness::new();
    let to = h.commit(commit_request(3, "m", &[(0, 1)]));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::IllegalGeneration]);
    assert_eq!(h.state(), GroupState::Dead);
}

#[test]
fn commit_without_a_member_to_a_group_with_members_is_unknown_member_id() {
    let mut h = Harness::new();
    stable_group(&mut h, 1);
    let to = h.commit(commit_request(-1, "", &[(0, 1)]));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::UnknownMemberId]);
}

#[test]
fn member_commit_with_an_old_generation_is_illegal_generation() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 1);
    let to = h.commit(commit_request(formed.generation - 1, &formed.leader, &[(0, 1)]));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::IllegalGeneration]);
    let to = h.commit(commit_request(formed.generation, "ghost", &[(0, 1)]));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::UnknownMemberId]);
}

#[test]
fn commit_while_waiting_for_the_leader_assignment_is_rebalance_in_progress() {
    let mut h = Harness::new();
    let formed = form_group_of(&mut h, vec![join_request("")]);
    let to = h.commit(commit_request(formed.generation, &formed.leader, &[(0, 1)]));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::RebalanceInProgress]);
}

#[test]
fn commit_during_preparing_rebalance_is_accepted() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    h.join(join_request(&formed.members[0]), 5);
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    let to = h.commit(commit_request(formed.generation, &formed.members[1], &[(0, 9)]));
    let (persist_id, _) = h.last_write();
    h.persisted(persist_id, Ok(()));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::None]);
}

#[test]
fn member_commit_in_stable_is_stored_and_pushes_the_session_out() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 1);
    h.advance(9_000);
    let to = h.commit(commit_request(formed.generation, &formed.leader, &[(1, 50)]));
    let (persist_id, _) = h.last_write();
    h.persisted(persist_id, Ok(()));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::None]);
    h.advance(9_000);
    assert_eq!(h.state(), GroupState::Stable);
}

#[test]
fn oversized_commit_metadata_fails_only_that_partition() {
    let mut h = Harness::with(GroupConfig { offset_metadata_bytes_max: 8, ..config() });
    let mut request = commit_request(-1, "", &[(0, 1), (1, 123_456_789)]);
    request.topics[0].partitions[0].committed_metadata = None;
    let to = h.commit(request);
    let (persist_id, records) = h.last_write();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value.as_ref().unwrap().metadata, "");
    h.persisted(persist_id, Ok(()));
    assert_eq!(errors(&h.committed(to)), [ErrorCode::None, ErrorCode::OffsetMetadataTooLarge]);
}

#[test]
fn fetch_of_an_unknown_group_or_partition_answers_offset_minus_one() {
    let mut h = Harness::new();
    assert_eq!(h.fetch("payments", &[0, 1]), [(0, -1, Some(String::new())), (1, -1, Some(String::new()))]);
    let to = h.commit(commit_request(-1, "", &[(0, 10)]));
    let (persist_id, _) = h.last_write();
    h.persisted(persist_id, Ok(()));
    h.committed(to);
    assert_eq!(h.fetch("payments", &[0, 1])[1], (1, -1, Some(String::new())));
}

#[test]
fn fetch_with_a_null_topic_list_returns_every_committed_partition() {
    let mut h = Harness::new();
    let mut request = commit_request(-1, "", &[(2, 20), (0, 10)]);
    request.topics.push(OffsetCommitTopic {
        name: "audit".into(),
        partitions: vec![OffsetCommitPartition {
            partition_index: 0,
            committed_offset: 5,
            committed_leader_epoch: -1,
            committed_metadata: None,
        }],
    });
    let to = h.commit(request);
    let (persist_id, _) = h.last_write();
    h.persisted(persist_id, Ok(()));
    h.committed(to);
    let response = h.coordinator.fetch_offsets(&OffsetFetchRequest { group_id: GROUP.into(), topics: None });
    let flat: Vec<(String, i32, i64)> = response
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.clone(), p.partition_index, p.committed_offset)))
        .collect();
    assert_eq!(flat, [("audit".into(), 0, 5), ("payments".into(), 0, 10), ("payments".into(), 2, 20)]);
}

// ---- Replay ----------------------------------------------------------------

#[test]
fn replaying_the_written_records_restores_the_same_offsets() {
    let mut h = Harness::new();
    for offsets in [&[(0, 10), (1, 11)][..], &[(0, 20)][..]] {
        let to = h.commit(commit_request(-1, "", offsets));
        let (persist_id, _) = h.last_write();
        h.persisted(persist_id, Ok(()));
        h.committed(to);
    }
    let mut restarted = GroupCoordinator::new(config()).unwrap();
    for (_, records) in &h.writes {
        for record in records {
            let encoded = record.encode().unwrap();
            restarted.replay(OffsetRecord::decode(encoded.key, encoded.value).unwrap());
        }
    }
    for partition in [0, 1] {
        assert_eq!(
            restarted.committed_offset(GROUP, "payments", partition),
            h.coordinator.committed_offset(GROUP, "payments", partition)
        );
    }
    assert_eq!(restarted.committed_offset(GROUP, "payments", 0).unwrap().offset, 20);
    assert_eq!(restarted.group_state(GROUP), GroupState::Empty);
}

#[test]
fn replayed_tombstones_forget_the_offset_and_then_the_empty_group() {
    let mut coordinator = GroupCoordinator::new(config()).unwrap();
    let key = |partition| OffsetKey { group_id: GROUP.into(), topic: "payments".into(), partition };
    let value = CommittedOffset { offset: 1, leader_epoch: -1, metadata: String::new(), commit_timestamp_ms: 0 };
    coordinator.replay(OffsetRecord { key: key(0), value: Some(value.clone()) });
    coordinator.replay(OffsetRecord { key: key(1), value: Some(value) });
    coordinator.replay(OffsetRecord { key: key(0), value: None });
    assert!(coordinator.committed_offset(GROUP, "payments", 0).is_none());
    assert_eq!(coordinator.group_count(), 1);
    coordinator.replay(OffsetRecord { key: key(1), value: None });
    assert_eq!(coordinator.group_count(), 0);
}

// ---- DescribeGroups / ListGroups / DeleteGroups ----------------------------

#[test]
fn describe_stable_group_shows_members_with_metadata_and_assignments() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 2);
    let request =
        DescribeGroupsRequest { groups: vec![GROUP.into(), "unknown".into()], include_authorized_operations: true };
    let response = h.coordinator.describe_groups(&request);
    let group = &response.groups[0];
    assert_eq!(
        (group.group_state.as_str(), group.protocol_type.as_str(), group.protocol_data.as_str()),
        ("Stable", "consumer", "range")
    );
    assert_eq!(group.members.len(), 2);
    assert_eq!(group.members[0].member_id, formed.members[0]);
    assert_eq!(group.members[0].client_host, "/127.0.0.1");
    assert_eq!(group.members[1].member_metadata, Bytes::from_static(b"meta-range"));
    assert_eq!(group.members[1].member_assignment, Bytes::from_static(b"assignment-1"));
    assert_eq!(group.authorized_operations, (1 << 3) | (1 << 6) | (1 << 8));

    let unknown = &response.groups[1];
    assert_eq!((unknown.error, unknown.group_state.as_str()), (ErrorCode::None, "Dead"));
}

#[test]
fn describe_rebalancing_group_hides_metadata_and_assignments() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 1);
    let rejoin = h.join(join_request(&formed.leader), 5);
    h.joined(rejoin);
    let response = h
        .coordinator
        .describe_groups(&DescribeGroupsRequest { groups: vec![GROUP.into()], include_authorized_operations: false });
    let group = &response.groups[0];
    assert_eq!(group.group_state, "CompletingRebalance");
    assert_eq!(group.protocol_data, "");
    assert!(group.members.iter().all(|m| m.member_metadata.is_empty() && m.member_assignment.is_empty()));
    assert_eq!(group.authorized_operations, i32::MIN);
}

#[test]
fn list_groups_shows_every_group_with_its_protocol_type() {
    let mut h = Harness::new();
    stable_group(&mut h, 1);
    let mut commit = commit_request(-1, "", &[(0, 1)]);
    commit.group_id = "offsets-only".into();
    h.commit(commit);
    let listed: Vec<(String, String)> =
        h.coordinator.list_groups().groups.into_iter().map(|g| (g.group_id, g.protocol_type)).collect();
    assert_eq!(listed, [("offsets-only".into(), String::new()), (GROUP.into(), "consumer".into())]);
}

#[test]
fn delete_refuses_groups_with_members_and_unknown_groups() {
    let mut h = Harness::new();
    stable_group(&mut h, 1);
    let to = h.delete(&[GROUP, "missing"]);
    let results: Vec<ErrorCode> = h.deleted(to).results.iter().map(|r| r.error).collect();
    assert_eq!(results, [ErrorCode::NonEmptyGroup, ErrorCode::GroupIdNotFound]);
    assert_eq!(h.state(), GroupState::Stable);
}

#[test]
fn delete_of_an_empty_group_writes_tombstones_and_replies_after_the_write() {
    let mut h = Harness::new();
    let to = h.commit(commit_request(-1, "", &[(0, 10), (1, 11)]));
    let (persist_id, _) = h.last_write();
    h.persisted(persist_id, Ok(()));
    h.committed(to);

    let to = h.delete(&[GROUP]);
    assert!(h.is_held(to));
    assert_eq!(h.state(), GroupState::Dead);
    let (persist_id, records) = h.last_write();
    assert!(records.iter().all(|r| r.value.is_none() && r.key.group_id == GROUP));
    assert_eq!(records.len(), 2);
    h.persisted(persist_id, Ok(()));
    assert_eq!(h.deleted(to).results[0].error, ErrorCode::None);
    assert_eq!(h.fetch("payments", &[0])[0].1, -1);
}

#[test]
fn commit_still_in_flight_when_its_group_is_deleted_is_not_applied_to_a_new_group() {
    let mut h = Harness::new();
    let late = h.commit(commit_request(-1, "", &[(0, 10)]));
    let (late_write, _) = h.last_write();
    let delete = h.delete(&[GROUP]);
    assert_eq!(h.deleted(delete).results[0].error, ErrorCode::None);
    let fresh = h.commit(commit_request(-1, "", &[(1, 1)]));
    let (fresh_write, _) = h.last_write();

    h.persisted(late_write, Ok(()));
    h.persisted(fresh_write, Ok(()));
    h.committed(late);
    h.committed(fresh);
    assert_eq!(h.fetch("payments", &[0, 1]), [(0, -1, Some(String::new())), (1, 1, Some("at-1".into()))]);
}

// ---- Time ------------------------------------------------------------------

#[test]
fn next_deadline_names_the_earliest_timer() {
    let mut h = Harness::new();
    assert_eq!(h.coordinator.next_deadline_ms(), None);
    let formed = stable_group(&mut h, 1);
    assert_eq!(h.coordinator.next_deadline_ms(), Some(h.now_ms + SESSION_MS as u64));
    h.advance(4_000);
    h.heartbeat(&formed.leader, formed.generation);
    assert_eq!(h.coordinator.next_deadline_ms(), Some(h.now_ms + SESSION_MS as u64));
}

#[test]
fn clock_going_backwards_counts_as_no_time_passing() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 1);
    h.advance(9_000);
    h.now_ms -= 60_000;
    assert_eq!(h.heartbeat(&formed.leader, formed.generation), ErrorCode::None);
    h.now_ms += 60_000 + 9_999;
    h.step(GroupEvent::Tick);
    assert_eq!(h.state(), GroupState::Stable);
}

#[test]
fn empty_group_without_offsets_is_forgotten_on_tick() {
    let mut h = Harness::new();
    let formed = stable_group(&mut h, 1);
    h.leave(0, LeaveGroupRequest { group_id: GROUP.into(), member_id: formed.leader, members: Vec::new() });
    assert_eq!(h.state(), GroupState::Empty);
    h.advance(1);
    assert_eq!(h.state(), GroupState::Dead);
    assert_eq!(h.coordinator.group_count(), 0);
}

#[test]
fn unknown_persist_id_is_ignored() {
    let mut h = Harness::new();
    h.persisted(PersistId(999), Ok(()));
    assert!(h.replies.is_empty());
}

// ---- Every request is answered exactly once --------------------------------

/// A small deterministic generator, so that failures replay.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

#[derive(Default, Clone)]
struct SimMember {
    member_id: String,
    instance_id: Option<String>,
    generation_id: i32,
    is_leader: bool,
    peers: Vec<String>,
    join: Option<ReplyTo>,
}

#[test]
fn random_event_sequences_answer_every_request_exactly_once() {
    let mut states_seen = BTreeSet::new();
    for seed in 1..=16u64 {
        let mut rng = Lcg(seed);
        let mut h =
            Harness::with(GroupConfig { initial_rebalance_delay_ms: 500, members_per_group_max: 5, ..config() });
        let mut members: Vec<SimMember> = (0..6)
            .map(|i| SimMember { instance_id: (i % 3 == 0).then(|| format!("host-{i}")), ..SimMember::default() })
            .collect();
        for _ in 0..1_500 {
            let who = rng.below(members.len() as u64) as usize;
            let member = members[who].clone();
            match rng.below(10) {
                0 | 1 => {
                    let mut request = join_request(&member.member_id);
                    request.group_instance_id = member.instance_id.clone();
                    if rng.below(8) == 0 {
                        request.protocols.reverse();
                    }
                    members[who].join = Some(h.join(request, 3 + rng.below(3) as i16));
                }
                2 => {
                    let peers: Vec<(&str, &[u8])> = if member.is_leader {
                        member.peers.iter().map(|p| (p.as_str(), &b"work"[..])).collect()
                    } else {
                        Vec::new()
                    };
                    h.sync(&member.member_id, member.generation_id, &peers);
                }
                3 | 4 => {
                    h.heartbeat_as(&member.member_id, member.instance_id.as_deref(), member.generation_id);
                }
                5 => {
                    let request = LeaveGroupRequest {
                        group_id: GROUP.into(),
                        member_id: String::new(),
                        members: vec![LeavingMember {
                            member_id: member.member_id.clone(),
                            group_instance_id: member.instance_id.clone(),
                        }],
                    };
                    h.leave(3, request);
                }
                6 => {
                    h.commit(commit_request(member.generation_id, &member.member_id, &[(who as i32, 1)]));
                }
                7 => {
                    if let Some((persist_id, _)) = h.writes.first().cloned() {
                        h.writes.remove(0);
                        let result = if rng.below(4) == 0 { Err(ErrorCode::KafkaStorageError) } else { Ok(()) };
                        h.persisted(persist_id, result);
                    }
                }
                8 => h.advance(rng.below(8_000)),
                _ => {
                    h.delete(&[GROUP]);
                }
            }
            learn_from_join_replies(&mut h, &mut members);
            states_seen.insert(h.state().as_str());
        }
        // Everyone leaves, time passes, every write finishes: nothing may be left waiting.
        let leaving = members
            .iter()
            .map(|m| LeavingMember { member_id: m.member_id.clone(), group_instance_id: m.instance_id.clone() })
            .collect();
        h.leave(3, LeaveGroupRequest { group_id: GROUP.into(), member_id: String::new(), members: leaving });
        for _ in 0..20 {
            h.advance(60_000);
        }
        for (persist_id, _) in std::mem::take(&mut h.writes) {
            h.persisted(persist_id, Ok(()));
        }
        assert!(h.waiting.is_empty(), "seed {seed}: still waiting {:?}", h.waiting);
    }
    // The walk must reach every state, or it proves little.
    let all = ["CompletingRebalance", "Dead", "Empty", "PreparingRebalance", "Stable"];
    assert_eq!(states_seen.into_iter().collect::<Vec<_>>(), all);
}

fn learn_from_join_replies(h: &mut Harness, members: &mut [SimMember]) {
    for member in members.iter_mut() {
        let Some(to) = member.join else {
            continue;
        };
        let Some(GroupResponse::Join(response)) = h.replies.get(&to) else {
            continue;
        };
        member.join = None;
        if response.error == ErrorCode::None || response.error == ErrorCode::MemberIdRequired {
            member.member_id = response.member_id.clone();
            member.generation_id = response.generation_id;
            member.is_leader = response.leader == response.member_id;
            member.peers = response.members.iter().map(|m| m.member_id.clone()).collect();
        } else if response.error == ErrorCode::UnknownMemberId {
            member.member_id.clear();
        }
    }
    h.replies.clear();
}
