//! One consumer group under Kafka's classic protocol: its members, its
//! generation and the rebalance state machine, following Kafka's
//! `GroupCoordinator`/`GroupMetadata` (3.x) closely.
//!
//! - Empty → PreparingRebalance: a member joins.
//! - PreparingRebalance → CompletingRebalance: every member has rejoined, or
//!   the rebalance timeout passed (dynamic members that did not rejoin are
//!   removed); → Empty when no member is left.
//! - CompletingRebalance → Stable: the leader's SyncGroup brings the
//!   assignment, which goes out to every member.
//! - CompletingRebalance or Stable → PreparingRebalance: a new member, the
//!   leader, or a member with changed metadata joins; a member leaves, its
//!   session expires, or it does not send SyncGroup in time.
//!
//! Dead is what the coordinator reports for a group it does not hold
//! (deleted, or never seen). Held requests live on the member that sent
//! them (`awaiting_join`, `awaiting_sync`) and are answered exactly once:
//! by the transition they wait for, or with an error when the member is
//! removed or sends a newer request of the same kind.
//!
//! Members are a `Vec` in join order (the first member leads). Lookups are
//! linear: a group holds at most `members_per_group_max` members, and the
//! order is the point.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;

use super::config::GroupConfig;
use super::offsets::CommittedOffset;
use super::{ClientInfo, GroupCommand, GroupResponse, ReplyTo};
use crate::protocol::describe_groups::{DescribedGroup, DescribedMember};
use crate::protocol::heartbeat::{HeartbeatRequest, HeartbeatResponse};
use crate::protocol::join_group::{JoinGroupMember, JoinGroupProtocol, JoinGroupRequest, JoinGroupResponse};
use crate::protocol::leave_group::LeavingMember;
use crate::protocol::sync_group::{SyncGroupAssignment, SyncGroupRequest, SyncGroupResponse};
use crate::protocol::ErrorCode;

/// Kafka's group states, spelled as DescribeGroups reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// First JoinGroup version whose new dynamic members must fetch an id first.
const MEMBER_ID_REQUIRED_VERSION_MIN: i16 = 4;

/// What a handler needs besides the group: the clock, the limits, where
/// commands go, and the counter behind generated member ids.
pub(crate) struct Ctx<'a> {
    pub(crate) now_ms: u64,
    pub(crate) config: &'a GroupConfig,
    pub(crate) out: &'a mut Vec<GroupCommand>,
    pub(crate) member_numbers: &'a mut u64,
}

impl Ctx<'_> {
    pub(crate) fn reply(&mut self, to: ReplyTo, response: GroupResponse) {
        self.out.push(GroupCommand::Reply { to, response });
    }

    fn reply_join(&mut self, to: ReplyTo, response: JoinGroupResponse) {
        self.reply(to, GroupResponse::Join(response));
    }

    fn reply_sync(&mut self, to: ReplyTo, response: SyncGroupResponse) {
        self.reply(to, GroupResponse::Sync(response));
    }

    /// Kafka's form, `<client id or instance id>-<unique>`; the seed keeps
    /// ids from different coordinators and broker runs apart.
    fn new_member_id(&mut self, prefix: &str) -> String {
        let number = *self.member_numbers;
        *self.member_numbers += 1;
        format!("{prefix}-{:x}-{number}", self.config.member_id_seed)
    }

    fn after(&self, delay_ms: u64) -> u64 {
        self.now_ms.saturating_add(delay_ms)
    }
}

#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) member_id: String,
    pub(crate) group_instance_id: Option<String>,
    pub(crate) client: ClientInfo,
    session_timeout_ms: u64,
    rebalance_timeout_ms: u64,
    /// In the member's order of preference.
    protocols: Vec<JoinGroupProtocol>,
    /// Opaque bytes from the leader, relayed unread.
    pub(crate) assignment: Bytes,
    awaiting_join: Option<ReplyTo>,
    awaiting_sync: Option<ReplyTo>,
    /// Joined but has not yet been part of a completed rebalance.
    is_new: bool,
    last_heartbeat_ms: u64,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|p| p.name == protocol).map(|p| p.metadata.clone()).unwrap_or_default()
    }

    fn supports(&self, protocol: &str) -> bool {
        self.protocols.iter().any(|p| p.name == protocol)
    }

    fn matches(&self, protocols: &[JoinGroupProtocol]) -> bool {
        self.protocols == protocols
    }

    /// Kafka's `shouldKeepAlive`, negated. A member in a rebalance is not
    /// expected to heartbeat: the rebalance timeout governs it, except that a
    /// brand-new member may not wait forever.
    fn expired(&self, now_ms: u64, config: &GroupConfig) -> bool {
        self.expiry_ms(config).is_some_and(|at| now_ms >= at)
    }

    fn expiry_ms(&self, config: &GroupConfig) -> Option<u64> {
        if self.awaiting_join.is_some() {
            return self.is_new.then(|| self.last_heartbeat_ms.saturating_add(config.new_member_join_timeout_ms));
        }
        if self.awaiting_sync.is_some() {
            return None;
        }
        Some(self.last_heartbeat_ms.saturating_add(self.session_timeout_ms))
    }
}

/// A member that was handed an id with MEMBER_ID_REQUIRED and has not yet
/// rejoined with it.
#[derive(Debug)]
struct PendingMember {
    member_id: String,
    deadline_ms: u64,
}

/// When the PreparingRebalance phase ends at the latest.
#[derive(Debug, Clone, Copy)]
struct JoinTimer {
    deadline_ms: u64,
    /// For the first rebalance out of Empty: what is left of the rebalance
    /// timeout for further extensions while new members keep arriving.
    initial_delay_left_ms: Option<u64>,
}

/// The parts of a JoinGroup the group keeps.
#[derive(Debug)]
pub(crate) struct JoinParams {
    pub(crate) member_id: String,
    pub(crate) group_instance_id: Option<String>,
    pub(crate) client: ClientInfo,
    pub(crate) session_timeout_ms: u64,
    pub(crate) rebalance_timeout_ms: u64,
    pub(crate) protocol_type: String,
    pub(crate) protocols: Vec<JoinGroupProtocol>,
}

impl JoinParams {
    /// The session timeout must already be validated as positive.
    pub(crate) fn new(client: ClientInfo, request: JoinGroupRequest) -> Self {
        let session_timeout_ms = u64::try_from(request.session_timeout_ms).unwrap_or(0);
        // v0 has no rebalance timeout (it reads as -1): the session timeout
        // stands in, as in Kafka.
        let rebalance_timeout_ms = u64::try_from(request.rebalance_timeout_ms).unwrap_or(session_timeout_ms);
        Self {
            member_id: request.member_id,
            group_instance_id: request.group_instance_id,
            client,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type: request.protocol_type,
            protocols: request.protocols,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) group_id: String,
    /// Tells a group apart from an earlier one of the same id that was
    /// deleted, so that a late write result is not applied to the new one.
    pub(crate) incarnation: u64,
    pub(crate) state: GroupState,
    pub(crate) generation_id: i32,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol_name: Option<String>,
    pub(crate) leader_id: Option<String>,
    pub(crate) members: Vec<Member>,
    pending_members: Vec<PendingMember>,
    /// Members that have not sent SyncGroup for this generation yet.
    pending_sync: BTreeSet<String>,
    join_timer: Option<JoinTimer>,
    /// A new member arrived during the initial delay: extend it once more.
    new_member_added: bool,
    sync_deadline_ms: Option<u64>,
    pub(crate) offsets: BTreeMap<(String, i32), CommittedOffset>,
    /// PersistOffsets writes for this group not yet reported back.
    pub(crate) commits_in_flight: u32,
}

impl Group {
    pub(crate) fn new(group_id: String, incarnation: u64) -> Self {
        Self {
            group_id,
            incarnation,
            state: GroupState::Empty,
            generation_id: 0,
            protocol_type: None,
            protocol_name: None,
            leader_id: None,
            members: Vec::new(),
            pending_members: Vec::new(),
            pending_sync: BTreeSet::new(),
            join_timer: None,
            new_member_added: false,
            sync_deadline_ms: None,
            offsets: BTreeMap::new(),
            commits_in_flight: 0,
        }
    }

    /// An Empty group with nothing to remember can be forgotten.
    pub(crate) fn is_disposable(&self) -> bool {
        self.state == GroupState::Empty
            && self.members.is_empty()
            && self.pending_members.is_empty()
            && self.offsets.is_empty()
            && self.commits_in_flight == 0
    }

    // ---- JoinGroup -------------------------------------------------------

    pub(crate) fn join(&mut self, ctx: &mut Ctx, reply_to: ReplyTo, api_version: i16, join: JoinParams) {
        if !self.accepts_joining_member(&join.member_id, ctx.config) {
            ctx.reply_join(reply_to, JoinGroupResponse::error(String::new(), ErrorCode::GroupMaxSizeReached));
            return;
        }
        if join.member_id.is_empty() {
            self.join_new_member(ctx, reply_to, api_version, join);
        } else {
            self.join_known_member(ctx, reply_to, join);
        }
    }

    /// Known and pending members are always let back in; new ones only while
    /// the group (pending members included) is below its size limit.
    fn accepts_joining_member(&self, member_id: &str, config: &GroupConfig) -> bool {
        if !member_id.is_empty() && (self.has_member(member_id) || self.is_pending(member_id)) {
            return true;
        }
        self.members.len() + self.pending_members.len() < config.members_per_group_max
    }

    fn join_new_member(&mut self, ctx: &mut Ctx, reply_to: ReplyTo, api_version: i16, join: JoinParams) {
        if !self.supports_protocols(&join.protocol_type, &join.protocols) {
            ctx.reply_join(reply_to, JoinGroupResponse::error(String::new(), ErrorCode::InconsistentGroupProtocol));
            return;
        }
        let prefix = join.group_instance_id.as_deref().unwrap_or(&join.client.client_id);
        let new_member_id = ctx.new_member_id(prefix);
        if let Some(instance_id) = &join.group_instance_id {
            if let Some(old_member_id) = self.static_member_id(instance_id).map(str::to_owned) {
                self.replace_static_member(ctx, reply_to, &old_member_id, new_member_id, join);
                return;
            }
        } else if api_version >= MEMBER_ID_REQUIRED_VERSION_MIN {
            let deadline_ms = ctx.after(join.session_timeout_ms);
            self.pending_members.push(PendingMember { member_id: new_member_id.clone(), deadline_ms });
            ctx.reply_join(reply_to, JoinGroupResponse::error(new_member_id, ErrorCode::MemberIdRequired));
            return;
        }
        self.add_member_and_rebalance(ctx, reply_to, new_member_id, join);
    }

    fn join_known_member(&mut self, ctx: &mut Ctx, reply_to: ReplyTo, join: JoinParams) {
        let member_id = join.member_id.clone();
        if !self.supports_protocols(&join.protocol_type, &join.protocols) {
            ctx.reply_join(reply_to, JoinGroupResponse::error(member_id, ErrorCode::InconsistentGroupProtocol));
            return;
        }
        if join.group_instance_id.is_none() && self.is_pending(&member_id) {
            self.pending_members.retain(|p| p.member_id != member_id);
            self.add_member_and_rebalance(ctx, reply_to, member_id, join);
            return;
        }
        if let Err(error) = self.check_member(&member_id, join.group_instance_id.as_deref()) {
            ctx.reply_join(reply_to, JoinGroupResponse::error(member_id, error));
            return;
        }
        let is_leader = self.is_leader(&member_id);
        let unchanged = self.member(&member_id).is_some_and(|m| m.matches(&join.protocols));
        match self.state {
            GroupState::PreparingRebalance => self.update_member_and_rebalance(ctx, reply_to, join),
            // The member lost the JoinGroup response: hand it the generation again.
            GroupState::CompletingRebalance if unchanged => {
                self.touch(ctx.now_ms, &member_id);
                let response = self.join_response(&member_id, is_leader);
                ctx.reply_join(reply_to, response);
            }
            // A follower with nothing new learns the current generation; the
            // leader rejoining asks for a rebalance (e.g. topic metadata changed).
            GroupState::Stable if unchanged && !is_leader => {
                self.touch(ctx.now_ms, &member_id);
                let response = self.join_response(&member_id, false);
                ctx.reply_join(reply_to, response);
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.update_member_and_rebalance(ctx, reply_to, join)
            }
            GroupState::Empty | GroupState::Dead => {
                ctx.reply_join(reply_to, JoinGroupResponse::error(member_id, ErrorCode::UnknownMemberId));
            }
        }
    }

    fn add_member_and_rebalance(&mut self, ctx: &mut Ctx, reply_to: ReplyTo, member_id: String, join: JoinParams) {
        if self.state == GroupState::PreparingRebalance && self.generation_id == 0 {
            self.new_member_added = true;
        }
        if self.members.is_empty() {
            self.protocol_type = Some(join.protocol_type.clone());
        }
        if self.leader_id.is_none() {
            self.leader_id = Some(member_id.clone());
        }
        self.members.push(Member {
            member_id,
            group_instance_id: join.group_instance_id,
            client: join.client,
            session_timeout_ms: join.session_timeout_ms,
            rebalance_timeout_ms: join.rebalance_timeout_ms,
            protocols: join.protocols,
            assignment: Bytes::new(),
            awaiting_join: Some(reply_to),
            awaiting_sync: None,
            is_new: true,
            last_heartbeat_ms: ctx.now_ms,
        });
        self.maybe_prepare_rebalance(ctx);
    }

    fn update_member_and_rebalance(&mut self, ctx: &mut Ctx, reply_to: ReplyTo, join: JoinParams) {
        let now_ms = ctx.now_ms;
        let Some(member) = self.member_mut(&join.member_id) else {
            return;
        };
        member.protocols = join.protocols;
        member.session_timeout_ms = join.session_timeout_ms;
        member.rebalance_timeout_ms = join.rebalance_timeout_ms;
        member.last_heartbeat_ms = now_ms;
        // A second JoinGroup from the same member supersedes the first.
        if let Some(superseded) = member.awaiting_join.replace(reply_to) {
            let member_id = member.member_id.clone();
            ctx.reply_join(superseded, JoinGroupResponse::error(member_id, ErrorCode::RebalanceInProgress));
        }
        self.maybe_prepare_rebalance(ctx);
    }

    /// A static member came back with no member id: it takes over its old
    /// entry under a new id, fencing whoever still uses the old one. A
    /// Stable group that would pick the same protocol does not rebalance.
    fn replace_static_member(
        &mut self,
        ctx: &mut Ctx,
        reply_to: ReplyTo,
        old_member_id: &str,
        new_member_id: String,
        join: JoinParams,
    ) {
        let current_leader = self.leader_id.clone();
        let now_ms = ctx.now_ms;
        let Some(member) = self.member_mut(old_member_id) else {
            return;
        };
        if let Some(fenced) = member.awaiting_join.take() {
            let response = JoinGroupResponse::error(old_member_id.to_owned(), ErrorCode::FencedInstanceId);
            ctx.reply_join(fenced, response);
        }
        if let Some(fenced) = member.awaiting_sync.take() {
            ctx.reply_sync(fenced, SyncGroupResponse::error(ErrorCode::FencedInstanceId));
        }
        member.member_id = new_member_id.clone();
        member.protocols = join.protocols;
        member.session_timeout_ms = join.session_timeout_ms;
        member.rebalance_timeout_ms = join.rebalance_timeout_ms;
        member.last_heartbeat_ms = now_ms;
        if self.leader_id.as_deref() == Some(old_member_id) {
            self.leader_id = Some(new_member_id.clone());
        }
        if self.pending_sync.remove(old_member_id) {
            self.pending_sync.insert(new_member_id.clone());
        }

        let next_protocol = self.select_protocol();
        let same_protocol = next_protocol.is_some() && next_protocol == self.protocol_name;
        if self.state == GroupState::Stable && same_protocol {
            // The old leader id goes back, so that the replaced member does not
            // compute an assignment a Stable group would never hand out.
            let mut response = self.join_response(&new_member_id, false);
            response.leader = current_leader.unwrap_or_default();
            ctx.reply_join(reply_to, response);
            return;
        }
        if let Some(member) = self.member_mut(&new_member_id) {
            member.awaiting_join = Some(reply_to);
        }
        match self.state {
            // The leader may already be assigning for the old id.
            GroupState::CompletingRebalance => self.prepare_rebalance(ctx),
            GroupState::PreparingRebalance => {}
            _ => self.maybe_prepare_rebalance(ctx),
        }
    }

    /// Whether a member with this protocol type and these protocols can be
    /// in the group: an empty group takes anything non-empty; otherwise the
    /// type must match and one protocol must be supported by every member.
    fn supports_protocols(&self, protocol_type: &str, protocols: &[JoinGroupProtocol]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|p| self.members.iter().all(|m| m.supports(&p.name)))
    }

    /// Among the protocols every member supports, each member votes for the
    /// one it prefers most; the most votes win, ties going to the protocol
    /// that got its first vote earliest in join order.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.first()?;
        let candidates: Vec<&str> = first
            .protocols
            .iter()
            .map(|p| p.name.as_str())
            .filter(|name| self.members.iter().all(|m| m.supports(name)))
            .collect();
        let mut votes: Vec<(&str, usize)> = Vec::new();
        for member in &self.members {
            let Some(choice) = member.protocols.iter().find(|p| candidates.contains(&p.name.as_str())) else {
                continue;
            };
            match votes.iter_mut().find(|(name, _)| *name == choice.name) {
                Some((_, count)) => *count += 1,
                None => votes.push((&choice.name, 1)),
            }
        }
        let mut winner: Option<(&str, usize)> = None;
        for (name, count) in votes {
            if winner.is_none_or(|(_, best)| count > best) {
                winner = Some((name, count));
            }
        }
        winner.map(|(name, _)| name.to_owned())
    }

    // ---- Rebalance -------------------------------------------------------

    fn maybe_prepare_rebalance(&mut self, ctx: &mut Ctx) {
        if matches!(self.state, GroupState::Stable | GroupState::CompletingRebalance | GroupState::Empty) {
            self.prepare_rebalance(ctx);
        }
    }

    fn prepare_rebalance(&mut self, ctx: &mut Ctx) {
        if self.state == GroupState::CompletingRebalance {
            self.reset_assignments(ctx, ErrorCode::RebalanceInProgress);
        }
        self.sync_deadline_ms = None;
        self.pending_sync.clear();
        let rebalance_timeout_ms = self.rebalance_timeout_ms();
        self.join_timer = Some(if self.state == GroupState::Empty {
            let delay_ms = ctx.config.initial_rebalance_delay_ms;
            JoinTimer {
                deadline_ms: ctx.after(delay_ms),
                initial_delay_left_ms: Some(rebalance_timeout_ms.saturating_sub(delay_ms)),
            }
        } else {
            JoinTimer { deadline_ms: ctx.after(rebalance_timeout_ms), initial_delay_left_ms: None }
        });
        self.state = GroupState::PreparingRebalance;
    }

    /// Ends PreparingRebalance when its time has come: at once when every
    /// member has rejoined (after the initial delay, only at its deadline).
    /// An extension of the initial delay counts from the deadline it extends,
    /// so a late tick does not stretch the delay.
    pub(crate) fn try_complete_join(&mut self, ctx: &mut Ctx) {
        while self.state == GroupState::PreparingRebalance {
            let Some(timer) = self.join_timer else {
                return;
            };
            let due = ctx.now_ms >= timer.deadline_ms;
            match timer.initial_delay_left_ms {
                Some(_) if !due => return,
                Some(left_ms) if self.new_member_added && left_ms > 0 => {
                    self.new_member_added = false;
                    let delay_ms = ctx.config.initial_rebalance_delay_ms.min(left_ms);
                    self.join_timer = Some(JoinTimer {
                        deadline_ms: timer.deadline_ms.saturating_add(delay_ms),
                        initial_delay_left_ms: Some(left_ms - delay_ms),
                    });
                }
                None if !due && !self.all_members_joined() => return,
                _ => {
                    self.complete_join(ctx);
                    return;
                }
            }
        }
    }

    fn all_members_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.iter().all(|m| m.awaiting_join.is_some())
    }

    fn complete_join(&mut self, ctx: &mut Ctx) {
        self.join_timer = None;
        self.new_member_added = false;
        // Dynamic members that did not rejoin are gone. Static ones stay: their
        // identity outlives a restart, and their session timeout removes them.
        let stale: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.awaiting_join.is_none() && m.group_instance_id.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for member_id in &stale {
            self.remove_member(ctx, member_id);
        }
        if !self.members.is_empty() && self.members.iter().all(|m| m.awaiting_join.is_none()) {
            // Only static members that have not rejoined remain: wait another round.
            let deadline_ms = ctx.after(self.rebalance_timeout_ms());
            self.join_timer = Some(JoinTimer { deadline_ms, initial_delay_left_ms: None });
            return;
        }
        let leader_rejoined =
            self.leader_id.as_deref().and_then(|id| self.member(id)).is_some_and(|m| m.awaiting_join.is_some());
        if !leader_rejoined {
            self.leader_id = self.members.iter().find(|m| m.awaiting_join.is_some()).map(|m| m.member_id.clone());
        }
        self.generation_id = self.generation_id.checked_add(1).unwrap_or(1);
        self.pending_sync.clear();
        if self.members.is_empty() {
            self.protocol_name = None;
            self.state = GroupState::Empty;
            return;
        }
        self.protocol_name = self.select_protocol();
        if self.protocol_name.is_none() {
            // Cannot happen while joins are checked against every member's
            // protocols; if it does, the joined members start over.
            self.fail_joined_members(ctx);
            return;
        }
        self.state = GroupState::CompletingRebalance;
        let leader_id = self.leader_id.clone().unwrap_or_default();
        for index in 0..self.members.len() {
            let member_id = self.members[index].member_id.clone();
            if let Some(to) = self.members[index].awaiting_join.take() {
                let response = self.join_response(&member_id, member_id == leader_id);
                ctx.reply_join(to, response);
            }
            let member = &mut self.members[index];
            member.last_heartbeat_ms = ctx.now_ms;
            member.is_new = false;
            self.pending_sync.insert(member_id);
        }
        self.sync_deadline_ms = Some(ctx.after(self.rebalance_timeout_ms()));
    }

    fn fail_joined_members(&mut self, ctx: &mut Ctx) {
        let joined: Vec<String> =
            self.members.iter().filter(|m| m.awaiting_join.is_some()).map(|m| m.member_id.clone()).collect();
        for member_id in &joined {
            if let Some(to) = self.member_mut(member_id).and_then(|m| m.awaiting_join.take()) {
                let response = JoinGroupResponse::error(member_id.clone(), ErrorCode::InconsistentGroupProtocol);
                ctx.reply_join(to, response);
            }
            self.remove_member(ctx, member_id);
        }
        self.state = if self.members.is_empty() { GroupState::Empty } else { GroupState::Stable };
        self.maybe_prepare_rebalance(ctx);
    }

    /// The JoinGroup answer for the current generation; the leader gets every
    /// member's metadata for the chosen protocol.
    fn join_response(&self, member_id: &str, with_members: bool) -> JoinGroupResponse {
        let protocol_name = self.protocol_name.clone().unwrap_or_default();
        let members = if with_members {
            self.members
                .iter()
                .map(|m| JoinGroupMember {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    metadata: m.metadata_for(&protocol_name),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinGroupResponse {
            throttle_time_ms: 0,
            error: ErrorCode::None,
            generation_id: self.generation_id,
            protocol_name,
            leader: self.leader_id.clone().unwrap_or_default(),
            member_id: member_id.to_owned(),
            members,
        }
    }

    /// The longest rebalance timeout among the members: how long a
    /// rebalance waits for everyone.
    fn rebalance_timeout_ms(&self) -> u64 {
        self.members.iter().map(|m| m.rebalance_timeout_ms).max().unwrap_or(0)
    }

    // ---- SyncGroup -------------------------------------------------------

    pub(crate) fn sync(&mut self, ctx: &mut Ctx, reply_to: ReplyTo, request: SyncGroupRequest) {
        let member_id = request.member_id.as_str();
        if let Err(error) = self.check_member(member_id, request.group_instance_id.as_deref()) {
            ctx.reply_sync(reply_to, SyncGroupResponse::error(error));
            return;
        }
        if request.generation_id != self.generation_id {
            ctx.reply_sync(reply_to, SyncGroupResponse::error(ErrorCode::IllegalGeneration));
            return;
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => {
                ctx.reply_sync(reply_to, SyncGroupResponse::error(ErrorCode::UnknownMemberId));
            }
            GroupState::PreparingRebalance => {
                ctx.reply_sync(reply_to, SyncGroupResponse::error(ErrorCode::RebalanceInProgress));
            }
            GroupState::CompletingRebalance => self.sync_completing(ctx, reply_to, request),
            GroupState::Stable => {
                self.pending_sync.remove(member_id);
                self.touch(ctx.now_ms, member_id);
                let assignment = self.member(member_id).map(|m| m.assignment.clone()).unwrap_or_default();
                let response = SyncGroupResponse { throttle_time_ms: 0, error: ErrorCode::None, assignment };
                ctx.reply_sync(reply_to, response);
                self.clear_sync_deadline_when_all_synced();
            }
        }
    }

    /// Followers wait for the leader; the leader's assignments go out to all.
    fn sync_completing(&mut self, ctx: &mut Ctx, reply_to: ReplyTo, request: SyncGroupRequest) {
        let member_id = request.member_id;
        let is_leader = self.is_leader(&member_id);
        if is_leader && !self.assignments_fit(&request.assignments, ctx.config) {
            ctx.reply_sync(reply_to, SyncGroupResponse::error(ErrorCode::InvalidRequest));
            return;
        }
        let now_ms = ctx.now_ms;
        let Some(member) = self.member_mut(&member_id) else {
            return;
        };
        member.last_heartbeat_ms = now_ms;
        if let Some(superseded) = member.awaiting_sync.replace(reply_to) {
            ctx.reply_sync(superseded, SyncGroupResponse::error(ErrorCode::RebalanceInProgress));
        }
        self.pending_sync.remove(&member_id);
        if is_leader {
            self.set_and_propagate_assignments(ctx, request.assignments);
            self.state = GroupState::Stable;
        }
        self.clear_sync_deadline_when_all_synced();
    }

    fn assignments_fit(&self, assignments: &[SyncGroupAssignment], config: &GroupConfig) -> bool {
        assignments.len() <= config.members_per_group_max
            && assignments.iter().all(|a| a.assignment.len() <= config.assignment_bytes_max)
    }

    fn set_and_propagate_assignments(&mut self, ctx: &mut Ctx, assignments: Vec<SyncGroupAssignment>) {
        let by_member: HashMap<String, Bytes> = assignments.into_iter().map(|a| (a.member_id, a.assignment)).collect();
        for member in &mut self.members {
            member.assignment = by_member.get(&member.member_id).cloned().unwrap_or_default();
            if let Some(to) = member.awaiting_sync.take() {
                member.last_heartbeat_ms = ctx.now_ms;
                let response = SyncGroupResponse {
                    throttle_time_ms: 0,
                    error: ErrorCode::None,
                    assignment: member.assignment.clone(),
                };
                ctx.reply_sync(to, response);
            }
        }
    }

    /// Answers held SyncGroups with `error`. Like a delivered assignment,
    /// this restarts the member's session: it was not expected to heartbeat
    /// while its SyncGroup was held.
    fn reset_assignments(&mut self, ctx: &mut Ctx, error: ErrorCode) {
        for member in &mut self.members {
            member.assignment = Bytes::new();
            if let Some(to) = member.awaiting_sync.take() {
                member.last_heartbeat_ms = ctx.now_ms;
                ctx.reply_sync(to, SyncGroupResponse::error(error));
            }
        }
    }

    fn clear_sync_deadline_when_all_synced(&mut self) {
        if self.pending_sync.is_empty() {
            self.sync_deadline_ms = None;
        }
    }

    // ---- Heartbeat -------------------------------------------------------

    pub(crate) fn heartbeat(&mut self, ctx: &mut Ctx, reply_to: ReplyTo, request: HeartbeatRequest) {
        let error = self.heartbeat_error(ctx.now_ms, &request);
        ctx.reply(reply_to, GroupResponse::Heartbeat(HeartbeatResponse::new(error)));
    }

    fn heartbeat_error(&mut self, now_ms: u64, request: &HeartbeatRequest) -> ErrorCode {
        let member_id = request.member_id.as_str();
        if let Err(error) = self.check_member(member_id, request.group_instance_id.as_deref()) {
            return error;
        }
        if request.generation_id != self.generation_id {
            return ErrorCode::IllegalGeneration;
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => ErrorCode::UnknownMemberId,
            // Members heartbeat while they wait for the leader's SyncGroup.
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.touch(now_ms, member_id);
                ErrorCode::None
            }
            // This is how members learn that they must rejoin.
            GroupState::PreparingRebalance => {
                self.touch(now_ms, member_id);
                ErrorCode::RebalanceInProgress
            }
        }
    }

    // ---- LeaveGroup ------------------------------------------------------

    /// Removes each named member (an operator may name a static member by
    /// instance id alone) and answers per member.
    pub(crate) fn leave(&mut self, ctx: &mut Ctx, leaving: &LeavingMember) -> ErrorCode {
        if leaving.member_id.is_empty() {
            let current =
                leaving.group_instance_id.as_deref().and_then(|i| self.static_member_id(i)).map(str::to_owned);
            let Some(member_id) = current else {
                return ErrorCode::UnknownMemberId;
            };
            self.remove_member_and_rebalance(ctx, &member_id);
            return ErrorCode::None;
        }
        if self.is_pending(&leaving.member_id) {
            self.pending_members.retain(|p| p.member_id != leaving.member_id);
            self.try_complete_join(ctx);
            return ErrorCode::None;
        }
        if let Err(error) = self.check_member(&leaving.member_id, leaving.group_instance_id.as_deref()) {
            return error;
        }
        self.remove_member_and_rebalance(ctx, &leaving.member_id);
        ErrorCode::None
    }

    // ---- OffsetCommit ----------------------------------------------------

    /// Kafka's `validateOffsetCommit` and the state check after it. A commit
    /// from a member also pushes its session deadline out.
    pub(crate) fn admit_commit(
        &mut self,
        now_ms: u64,
        generation_id: i32,
        member_id: &str,
        group_instance_id: Option<&str>,
    ) -> Result<(), ErrorCode> {
        if self.state == GroupState::Dead {
            return Err(ErrorCode::CoordinatorNotAvailable);
        }
        if generation_id < 0 && self.state == GroupState::Empty {
            return Ok(());
        }
        if generation_id >= 0 || !member_id.is_empty() || group_instance_id.is_some() {
            self.check_member(member_id, group_instance_id)?;
            if generation_id != self.generation_id {
                return Err(ErrorCode::IllegalGeneration);
            }
        } else if self.state != GroupState::Empty {
            // Once the group has members, only members may commit.
            return Err(ErrorCode::UnknownMemberId);
        }
        match self.state {
            GroupState::Empty => Ok(()),
            // A commit during PreparingRebalance is fine: the member learns of
            // the rebalance from its next heartbeat.
            GroupState::Stable | GroupState::PreparingRebalance => {
                self.touch(now_ms, member_id);
                Ok(())
            }
            // The member has its JoinGroup answer but not yet its assignment.
            GroupState::CompletingRebalance => Err(ErrorCode::RebalanceInProgress),
            GroupState::Dead => Err(ErrorCode::CoordinatorNotAvailable),
        }
    }

    // ---- Time ------------------------------------------------------------

    /// Fires every timer that is due: pending members and sessions that
    /// expired, a sync phase that ran out, a PreparingRebalance that ended.
    pub(crate) fn advance(&mut self, ctx: &mut Ctx) {
        let now_ms = ctx.now_ms;
        let before = self.pending_members.len();
        self.pending_members.retain(|p| p.deadline_ms > now_ms);
        if self.pending_members.len() != before {
            self.try_complete_join(ctx);
        }
        // One at a time: each removal can start or finish a rebalance, which
        // refreshes the others' deadlines.
        while let Some(member_id) =
            self.members.iter().find(|m| m.expired(now_ms, ctx.config)).map(|m| m.member_id.clone())
        {
            self.remove_member_and_rebalance(ctx, &member_id);
        }
        if self.sync_deadline_ms.is_some_and(|at| now_ms >= at) {
            self.expire_pending_sync(ctx);
        }
        self.try_complete_join(ctx);
    }

    /// Members that never sent SyncGroup in time (a leader that died after
    /// its JoinGroup, say) are removed and the group rebalances without them.
    fn expire_pending_sync(&mut self, ctx: &mut Ctx) {
        self.sync_deadline_ms = None;
        if !matches!(self.state, GroupState::CompletingRebalance | GroupState::Stable) {
            return;
        }
        let missing: Vec<String> = std::mem::take(&mut self.pending_sync).into_iter().collect();
        for member_id in &missing {
            self.remove_member(ctx, member_id);
        }
        self.prepare_rebalance(ctx);
        self.try_complete_join(ctx);
    }

    /// The earliest time at which `advance` would change something.
    pub(crate) fn next_deadline_ms(&self, config: &GroupConfig) -> Option<u64> {
        let join = match self.state {
            GroupState::PreparingRebalance => self.join_timer.map(|t| t.deadline_ms),
            _ => None,
        };
        let members = self.members.iter().filter_map(|m| m.expiry_ms(config));
        let pending = self.pending_members.iter().map(|p| p.deadline_ms);
        join.into_iter().chain(self.sync_deadline_ms).chain(members).chain(pending).min()
    }

    // ---- Members ---------------------------------------------------------

    fn remove_member_and_rebalance(&mut self, ctx: &mut Ctx, member_id: &str) {
        self.remove_member(ctx, member_id);
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => self.maybe_prepare_rebalance(ctx),
            GroupState::PreparingRebalance => self.try_complete_join(ctx),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Drops a member, answering whatever it still has held with
    /// UNKNOWN_MEMBER_ID, and passes leadership on to the next in join order.
    fn remove_member(&mut self, ctx: &mut Ctx, member_id: &str) {
        let Some(index) = self.members.iter().position(|m| m.member_id == member_id) else {
            return;
        };
        let member = self.members.remove(index);
        if let Some(to) = member.awaiting_join {
            ctx.reply_join(to, JoinGroupResponse::error(String::new(), ErrorCode::UnknownMemberId));
        }
        if let Some(to) = member.awaiting_sync {
            ctx.reply_sync(to, SyncGroupResponse::error(ErrorCode::UnknownMemberId));
        }
        self.pending_sync.remove(member_id);
        if self.leader_id.as_deref() == Some(member_id) {
            self.leader_id = self.members.first().map(|m| m.member_id.clone());
        }
    }

    /// Kafka's `validateCurrentMember`: a known instance id must map to this
    /// member id (else the caller is a fenced zombie), and the member must
    /// exist.
    pub(crate) fn check_member(&self, member_id: &str, group_instance_id: Option<&str>) -> Result<(), ErrorCode> {
        if let Some(instance_id) = group_instance_id {
            return match self.static_member_id(instance_id) {
                Some(current) if current != member_id => Err(ErrorCode::FencedInstanceId),
                Some(_) => Ok(()),
                None => Err(ErrorCode::UnknownMemberId),
            };
        }
        if !self.has_member(member_id) {
            return Err(ErrorCode::UnknownMemberId);
        }
        Ok(())
    }

    /// A heartbeat, join, sync or commit pushes the session deadline out.
    pub(crate) fn touch(&mut self, now_ms: u64, member_id: &str) {
        if let Some(member) = self.member_mut(member_id) {
            member.last_heartbeat_ms = now_ms;
        }
    }

    fn static_member_id(&self, instance_id: &str) -> Option<&str> {
        self.members.iter().find(|m| m.group_instance_id.as_deref() == Some(instance_id)).map(|m| m.member_id.as_str())
    }

    fn member(&self, member_id: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.member_id == member_id)
    }

    fn member_mut(&mut self, member_id: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.member_id == member_id)
    }

    fn has_member(&self, member_id: &str) -> bool {
        self.member(member_id).is_some()
    }

    fn is_pending(&self, member_id: &str) -> bool {
        self.pending_members.iter().any(|p| p.member_id == member_id)
    }

    fn is_leader(&self, member_id: &str) -> bool {
        self.leader_id.as_deref() == Some(member_id)
    }

    // ---- DescribeGroups --------------------------------------------------

    /// Kafka's group summary: metadata and assignments only while Stable.
    pub(crate) fn describe(&self, authorized_operations: i32) -> DescribedGroup {
        let stable_protocol = match self.state {
            GroupState::Stable => self.protocol_name.clone(),
            _ => None,
        };
        let members = self
            .members
            .iter()
            .map(|m| DescribedMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                client_id: m.client.client_id.clone(),
                client_host: m.client.client_host.clone(),
                member_metadata: stable_protocol.as_deref().map(|p| m.metadata_for(p)).unwrap_or_default(),
                member_assignment: if stable_protocol.is_some() { m.assignment.clone() } else { Bytes::new() },
            })
            .collect();
        DescribedGroup {
            error: ErrorCode::None,
            group_id: self.group_id.clone(),
            group_state: self.state.as_str().to_owned(),
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            protocol_data: stable_protocol.unwrap_or_default(),
            members,
            authorized_operations,
        }
    }
}
