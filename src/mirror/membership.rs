//! Several mirror processes with the same `--name` share the partitions as
//! a consumer group shares them: they are members of the group `--name` on
//! the target cluster (protocol type `shardlog-mirror`), its leader deals
//! the source partitions out round-robin, and a member that dies (its
//! session runs out) has its share dealt to the others, who go on from the
//! target's data (`resume`).
//!
//! Eager rebalancing: a member gives up every partition (its workers stop,
//! their last requests answered, its offset syncs written) before it joins
//! again, so two members never copy one partition at once. A member that
//! stops heartbeating (paused, cut off) stops producing once its lease,
//! half the session timeout after its last heartbeat, runs out: before the
//! coordinator deals its share to anyone else.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::copy::Key;
use crate::client::{decode, Connection};
use crate::protocol::find_coordinator::{FindCoordinatorRequest, FindCoordinatorResponse};
use crate::protocol::heartbeat::{HeartbeatRequest, HeartbeatResponse};
use crate::protocol::join_group::{JoinGroupProtocol, JoinGroupRequest, JoinGroupResponse};
use crate::protocol::leave_group::{LeaveGroupRequest, LeaveGroupResponse, LeavingMember};
use crate::protocol::sync_group::{SyncGroupAssignment, SyncGroupRequest, SyncGroupResponse};
use crate::protocol::{ApiKey, ErrorCode};

pub const PROTOCOL_TYPE: &str = "shardlog-mirror";
const PROTOCOL: &str = "round-robin";
/// Kafka's smallest default `group.min.session.timeout.ms`.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
const REBALANCE_TIMEOUT: Duration = Duration::from_secs(30);
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// What a member copies, and what the whole group copies (to tell when a
/// partition nobody copies has appeared).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    pub mine: BTreeSet<Key>,
    pub all: BTreeSet<Key>,
}

/// Deals `partitions` out to `members` (sorted by id) round-robin.
pub fn deal(members: &[String], partitions: &BTreeSet<Key>) -> Vec<(String, Assignment)> {
    let mut sorted: Vec<String> = members.to_vec();
    sorted.sort();
    let mut out: Vec<(String, Assignment)> =
        sorted.iter().map(|m| (m.clone(), Assignment { mine: BTreeSet::new(), all: partitions.clone() })).collect();
    if out.is_empty() {
        return out;
    }
    let count = out.len();
    for (i, key) in partitions.iter().enumerate() {
        out[i % count].1.mine.insert(key.clone());
    }
    out
}

fn put_keys(out: &mut BytesMut, keys: &BTreeSet<Key>) {
    out.put_i32(keys.len() as i32);
    for (topic, partition) in keys {
        out.put_i16(topic.len() as i16);
        out.put_slice(topic.as_bytes());
        out.put_i32(*partition);
    }
}

fn get_keys(data: &mut &[u8]) -> Option<BTreeSet<Key>> {
    if data.len() < 4 {
        return None;
    }
    let count = data.get_i32();
    let mut keys = BTreeSet::new();
    for _ in 0..count.max(0) {
        if data.len() < 2 {
            return None;
        }
        let len = data.get_i16();
        if len < 0 || data.len() < len as usize + 4 {
            return None;
        }
        let topic = String::from_utf8(data[..len as usize].to_vec()).ok()?;
        data.advance(len as usize);
        keys.insert((topic, data.get_i32()));
    }
    Some(keys)
}

fn encode_keys(keys: &BTreeSet<Key>) -> Bytes {
    let mut out = BytesMut::new();
    put_keys(&mut out, keys);
    out.freeze()
}

impl Assignment {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_i16(0);
        put_keys(&mut out, &self.mine);
        put_keys(&mut out, &self.all);
        out.freeze()
    }

    pub fn decode(mut data: &[u8]) -> Option<Self> {
        if data.len() < 2 || data.get_i16() != 0 {
            return None;
        }
        let mine = get_keys(&mut data)?;
        let all = get_keys(&mut data)?;
        Some(Self { mine, all })
    }
}

/// The member's standing, shared by the control thread (which joins), the
/// heartbeat thread and the producers (which write only under a lease).
#[derive(Debug, Default)]
pub struct GroupState {
    pub generation: i32,
    pub member_id: String,
    pub last_heartbeat: Option<Instant>,
    /// The group rebalances or forgot this member: give up and rejoin.
    pub rejoin: bool,
}

impl GroupState {
    /// Within half the session timeout of the last good heartbeat: the
    /// group cannot have dealt this member's share to anyone else yet.
    pub fn leased(&self) -> bool {
        self.last_heartbeat.is_some_and(|at| at.elapsed() < SESSION_TIMEOUT / 2)
    }
}

/// The heartbeat thread: one heartbeat a second while a member; marks
/// `rejoin` when the group says so.
pub fn heartbeats(
    group: String,
    bootstrap: String,
    client_id: String,
    instance_id: Option<String>,
    shared: std::sync::Arc<super::copy::Shared>,
) {
    let mut link = Membership::new(&group, &bootstrap, &client_id, None);
    while !shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(HEARTBEAT_INTERVAL);
        let (generation, member_id) = {
            let state = shared.group.lock().expect("group");
            if state.rejoin || state.generation < 0 || state.member_id.is_empty() {
                continue;
            }
            (state.generation, state.member_id.clone())
        };
        let request = HeartbeatRequest {
            group_id: group.clone(),
            generation_id: generation,
            member_id,
            group_instance_id: instance_id.clone(),
        };
        let answer = link
            .coordinator()
            .and_then(|c| c.request(ApiKey::Heartbeat, 3, |w| request.encode(w, 3)).map_err(|e| e.to_string()))
            .and_then(|reader| decode(reader, 3, HeartbeatResponse::decode).map_err(|e| e.to_string()));
        let mut state = shared.group.lock().expect("group");
        if state.generation != generation {
            continue;
        }
        match answer {
            Ok(beat) if beat.error.is_ok() => state.last_heartbeat = Some(Instant::now()),
            Ok(beat) => {
                tracing::info!(error = ?beat.error, "mirror: the group rebalances");
                if matches!(beat.error, ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable) {
                    link.coordinator = None;
                }
                state.rejoin = true;
            }
            Err(_) => {
                // Unreachable or moved: the lease runs on; rejoin once out.
                link.coordinator = None;
                if !state.leased() {
                    state.rejoin = true;
                }
            }
        }
    }
}

pub struct Membership {
    group: String,
    bootstrap: String,
    client_id: String,
    coordinator: Option<Connection>,
    member_id: String,
    generation: i32,
    instance_id: Option<String>,
}

impl Membership {
    pub fn new(group: &str, bootstrap: &str, client_id: &str, instance_id: Option<String>) -> Self {
        Self {
            group: group.into(),
            bootstrap: bootstrap.split(',').next().unwrap_or(bootstrap).trim().into(),
            client_id: client_id.into(),
            coordinator: None,
            member_id: String::new(),
            generation: -1,
            instance_id,
        }
    }

    fn coordinator(&mut self) -> Result<&mut Connection, String> {
        if self.coordinator.is_none() {
            let mut bootstrap = Connection::connect(self.bootstrap.as_str(), Duration::from_secs(10))
                .map_err(|e| format!("{}: {e}", self.bootstrap))?;
            let request = FindCoordinatorRequest { key: self.group.clone(), key_type: 0 };
            let reader =
                bootstrap.request(ApiKey::FindCoordinator, 2, |w| request.encode(w, 2)).map_err(|e| e.to_string())?;
            let answer = decode(reader, 2, FindCoordinatorResponse::decode).map_err(|e| e.to_string())?;
            if !answer.error.is_ok() {
                return Err(format!("FindCoordinator {}: {:?}", self.group, answer.error));
            }
            let host = if answer.host.is_empty() { "127.0.0.1".to_string() } else { answer.host.clone() };
            let mut connection = Connection::connect((host.as_str(), answer.port as u16), Duration::from_secs(10))
                .map_err(|e| format!("coordinator {host}:{}: {e}", answer.port))?;
            connection.set_client_id(&self.client_id);
            connection.set_read_timeout(Some(REBALANCE_TIMEOUT + Duration::from_secs(5))).map_err(|e| e.to_string())?;
            self.coordinator = Some(connection);
        }
        Ok(self.coordinator.as_mut().expect("set above"))
    }

    /// Joins (or rejoins) the group and returns this member's share. The
    /// leader deals `partitions`, the mirrored partitions it knows of.
    /// Records the new generation in `state` (its heartbeats start).
    pub fn join(
        &mut self,
        partitions: &BTreeSet<Key>,
        state: &std::sync::Mutex<GroupState>,
    ) -> Result<Assignment, String> {
        let answer = self.try_join(partitions);
        if answer.is_err() {
            self.coordinator = None;
            return answer;
        }
        let mut state = state.lock().expect("group");
        state.generation = self.generation;
        state.member_id = self.member_id.clone();
        state.last_heartbeat = Some(Instant::now());
        state.rejoin = false;
        answer
    }

    fn try_join(&mut self, partitions: &BTreeSet<Key>) -> Result<Assignment, String> {
        loop {
            let request = JoinGroupRequest {
                group_id: self.group.clone(),
                session_timeout_ms: SESSION_TIMEOUT.as_millis() as i32,
                rebalance_timeout_ms: REBALANCE_TIMEOUT.as_millis() as i32,
                member_id: self.member_id.clone(),
                group_instance_id: self.instance_id.clone(),
                protocol_type: PROTOCOL_TYPE.into(),
                // Each member says which partitions it found; the leader
                // deals them all.
                protocols: vec![JoinGroupProtocol { name: PROTOCOL.into(), metadata: encode_keys(partitions) }],
            };
            let reader = self
                .coordinator()?
                .request(ApiKey::JoinGroup, 5, |w| request.encode(w, 5))
                .map_err(|e| e.to_string())?;
            let joined = decode(reader, 5, JoinGroupResponse::decode).map_err(|e| e.to_string())?;
            match joined.error {
                ErrorCode::None => {}
                ErrorCode::MemberIdRequired => {
                    self.member_id = joined.member_id;
                    continue;
                }
                ErrorCode::UnknownMemberId => {
                    self.member_id.clear();
                    continue;
                }
                ErrorCode::RebalanceInProgress => continue,
                ErrorCode::FencedInstanceId => {
                    return Err(format!("JoinGroup {}: another mirror runs with this --instance-id", self.group))
                }
                code => return Err(format!("JoinGroup {}: {code:?}", self.group)),
            }
            self.member_id = joined.member_id.clone();
            self.generation = joined.generation_id;
            let assignments = if joined.leader == joined.member_id {
                let members: Vec<String> = joined.members.iter().map(|m| m.member_id.clone()).collect();
                let mut everything = partitions.clone();
                for member in &joined.members {
                    everything.extend(get_keys(&mut &member.metadata[..]).unwrap_or_default());
                }
                deal(&members, &everything)
                    .into_iter()
                    .map(|(member_id, assignment)| SyncGroupAssignment { member_id, assignment: assignment.encode() })
                    .collect()
            } else {
                Vec::new()
            };
            let request = SyncGroupRequest {
                group_id: self.group.clone(),
                generation_id: self.generation,
                member_id: self.member_id.clone(),
                group_instance_id: self.instance_id.clone(),
                assignments,
            };
            let reader = self
                .coordinator()?
                .request(ApiKey::SyncGroup, 3, |w| request.encode(w, 3))
                .map_err(|e| e.to_string())?;
            let synced = decode(reader, 3, SyncGroupResponse::decode).map_err(|e| e.to_string())?;
            match synced.error {
                ErrorCode::None => {}
                ErrorCode::RebalanceInProgress | ErrorCode::IllegalGeneration => continue,
                ErrorCode::UnknownMemberId => {
                    self.member_id.clear();
                    continue;
                }
                code => return Err(format!("SyncGroup {}: {code:?}", self.group)),
            }
            return Assignment::decode(&synced.assignment)
                .ok_or_else(|| format!("SyncGroup {}: an assignment this mirror cannot read", self.group));
        }
    }

    pub fn leave(&mut self) {
        if self.member_id.is_empty() {
            return;
        }
        let request = LeaveGroupRequest {
            group_id: self.group.clone(),
            member_id: self.member_id.clone(),
            members: vec![LeavingMember {
                member_id: self.member_id.clone(),
                group_instance_id: self.instance_id.clone(),
            }],
        };
        if let Ok(c) = self.coordinator() {
            let _ = c
                .request(ApiKey::LeaveGroup, 3, |w| request.encode(w, 3))
                .map(|r| decode(r, 3, LeaveGroupResponse::decode));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: i32) -> BTreeSet<Key> {
        (0..n).map(|p| ("t".to_string(), p)).collect()
    }

    #[test]
    fn every_partition_goes_to_exactly_one_member() {
        let members = vec!["b".to_string(), "a".to_string(), "c".to_string()];
        let dealt = deal(&members, &keys(8));
        let mut seen = BTreeSet::new();
        for (_, a) in &dealt {
            assert_eq!(a.all, keys(8));
            for key in &a.mine {
                assert!(seen.insert(key.clone()), "{key:?} dealt twice");
            }
        }
        assert_eq!(seen, keys(8));
        let sizes: Vec<usize> = dealt.iter().map(|(_, a)| a.mine.len()).collect();
        assert_eq!(sizes, vec![3, 3, 2]);
        assert_eq!(dealt[0].0, "a", "members in id order, so every leader deals alike");
    }

    #[test]
    fn assignments_round_trip_and_garbage_is_refused() {
        let a = Assignment { mine: keys(2), all: keys(5) };
        assert_eq!(Assignment::decode(&a.encode()), Some(a.clone()));
        assert_eq!(Assignment::decode(&a.encode()[..7]), None);
        assert_eq!(Assignment::decode(&[0, 1]), None);
    }
}
