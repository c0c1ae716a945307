//! `QuorumEngine`: turns events into raft-rs calls and raft-rs Readies into
//! commands. Persistence is asynchronous (raft-rs's `advance_append_async`):
//! a Ready's state goes out as a `Persist`, the messages that depend on it
//! wait in `persisting` until the shell reports it durable.

use std::collections::{BTreeMap, VecDeque};

use raft::eraftpb::{ConfState, EntryType, MessageType};
use raft::{RawNode, SnapshotStatus, StateRole};

use super::log::raft_logger;
use super::storage::{index_term, QuorumStorage};
use super::{
    Applied, Command, Durable, Entry, Event, MachineId, Message, Persist, ProposalError, ProposalToken, QuorumConfig,
    QuorumError, Snapshot,
};

/// The message types a peer may send. The rest are either local (ticks,
/// proposals, snapshot reports) or features this quorum does not use
/// (forwarded proposals, read index, leader transfer): a peer sending them
/// could append entries or force elections behind the engine's back.
const PEER_MESSAGE_TYPES: [MessageType; 9] = [
    MessageType::MsgAppend,
    MessageType::MsgAppendResponse,
    MessageType::MsgRequestPreVote,
    MessageType::MsgRequestPreVoteResponse,
    MessageType::MsgRequestVote,
    MessageType::MsgRequestVoteResponse,
    MessageType::MsgSnapshot,
    MessageType::MsgHeartbeat,
    MessageType::MsgHeartbeatResponse,
];

pub struct QuorumEngine {
    machine: MachineId,
    config: QuorumConfig,
    raw: RawNode<QuorumStorage>,
    /// Readies handed out, oldest first, each with the messages that may
    /// leave only once it and all before it are durable.
    persisting: VecDeque<PersistWait>,
    /// The leader's proposals by log index, until they commit or it steps down.
    pending: BTreeMap<u64, PendingProposal>,
    /// The last (term, leader) reported in `LeaderChanged`.
    reported: (u64, Option<MachineId>),
    was_leader: bool,
    /// The last index given to the state machine (entry or snapshot).
    applied_index: u64,
    /// Role and term when the election timeout was last drawn.
    timeout_drawn_at: (StateRole, u64),
    jitter: SplitMix64,
}

struct PersistWait {
    number: u64,
    /// Whether the shell was given a Persist for it; false for a Ready that
    /// only carried messages and commits.
    durable_pending: bool,
    messages: Vec<Message>,
    /// The index of the snapshot it installs; 0 for none.
    snapshot_index: u64,
}

struct PendingProposal {
    term: u64,
    token: ProposalToken,
}

impl QuorumEngine {
    /// Starts the engine on what the shell stored (empty on first start).
    /// Returns the commands to carry out before the first event: the stored
    /// snapshot and committed entries to apply, and, for a quorum of one,
    /// its election.
    pub fn open(config: QuorumConfig, durable: Durable) -> Result<(Self, Vec<Command>), QuorumError> {
        let raft_config = validate(&config)?;
        let conf_state = ConfState::from((ids(&config.voters), ids(&config.learners)));
        if let Some(snapshot) = &durable.snapshot {
            check_membership(snapshot, &conf_state)?;
        }
        let storage = QuorumStorage::recover(conf_state, durable.hard_state, durable.snapshot, durable.entries)?;
        let mut commands = Vec::new();
        let mut applied_index = 0;
        if let Some(snapshot) = storage.snapshot() {
            let (index, term) = index_term(snapshot);
            applied_index = index;
            commands.push(Command::Apply(Applied::Snapshot { index, term, data: snapshot.data.clone() }));
        }
        let logger = raft_logger(config.machine.get());
        let election_seed = config.election_seed;
        let raw = RawNode::new(&raft_config, storage, &logger).map_err(QuorumError::Limits)?;
        let mut engine = Self {
            machine: config.machine,
            config,
            raw,
            persisting: VecDeque::new(),
            pending: BTreeMap::new(),
            reported: (0, None),
            was_leader: false,
            applied_index,
            timeout_drawn_at: (StateRole::Follower, u64::MAX),
            jitter: SplitMix64(election_seed),
        };
        if engine.config.voters == [engine.machine] {
            // Alone, there is nobody to wait for: lead now, not after a timeout.
            engine.raw.campaign().expect("a sole voter can always campaign");
        }
        engine.drain(&mut commands);
        Ok((engine, commands))
    }

    /// Feeds one event; returns what the shell must do, in order.
    pub fn step(&mut self, event: Event) -> Vec<Command> {
        let mut commands = Vec::new();
        match event {
            Event::Tick => {
                self.raw.tick();
            }
            Event::Message { from, message } => self.receive(from, *message),
            Event::Propose { token, data } => self.propose(token, data, &mut commands),
            Event::PersistDone { number } => self.persisted(number, &mut commands),
            Event::Unreachable { to } => self.raw.report_unreachable(to.get()),
        }
        self.drain(&mut commands);
        commands
    }

    /// Makes `data`, the state machine as of the applied `index`, the log's
    /// snapshot, dropping the entries it covers; followers that need them get
    /// the snapshot instead. Returns the snapshot for the shell to store
    /// (module docs: "Durability").
    pub fn compact(&mut self, index: u64, data: Vec<u8>) -> Result<Snapshot, QuorumError> {
        if index > self.applied_index {
            return Err(QuorumError::CompactionNotApplied { index, applied_index: self.applied_index });
        }
        self.raw.mut_store().compact(index, data)
    }

    pub fn machine(&self) -> MachineId {
        self.machine
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// The controller, as far as this machine knows.
    pub fn leader(&self) -> Option<MachineId> {
        MachineId::new(self.raw.raft.leader_id)
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// How far each voter's and learner's log matches the leader's, as the
    /// leader tracks it; empty on a follower.
    pub fn progress(&self) -> Vec<(MachineId, u64)> {
        if !self.is_leader() {
            return Vec::new();
        }
        let mut progress: Vec<(MachineId, u64)> =
            self.raw.raft.prs().iter().filter_map(|(id, p)| Some((MachineId::new(*id)?, p.matched))).collect();
        progress.sort();
        progress
    }

    /// The index of the last entry in this machine's log: a leader appends
    /// its next proposal at `last_index() + 1`.
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    fn receive(&mut self, from: MachineId, message: Message) {
        let member = self.config.voters.contains(&from) || self.config.learners.contains(&from);
        if !member || message.from != from.get() || message.to != self.machine.get() {
            tracing::warn!(
                machine = %self.machine,
                %from,
                message_from = message.from,
                message_to = message.to,
                "dropping a raft message with the wrong sender or recipient"
            );
            return;
        }
        if !PEER_MESSAGE_TYPES.contains(&message.get_msg_type()) {
            tracing::warn!(machine = %self.machine, %from, kind = ?message.get_msg_type(),
                "dropping a raft message type peers may not send");
            return;
        }
        if let Err(error) = self.raw.step(message) {
            tracing::debug!(machine = %self.machine, %from, %error, "raft dropped a message");
        }
    }

    fn propose(&mut self, token: ProposalToken, data: Vec<u8>, commands: &mut Vec<Command>) {
        let refused = if !self.is_leader() {
            Some(ProposalError::NotController { leader: self.leader() })
        } else if data.len() > self.config.entry_bytes_max {
            Some(ProposalError::TooLarge { bytes: data.len(), bytes_max: self.config.entry_bytes_max })
        } else if self.pending.len() >= self.config.proposals_pending_max {
            Some(ProposalError::Busy)
        } else if self.raw.propose(Vec::new(), data).is_err() {
            // ProposalDropped: over the uncommitted-bytes bound.
            Some(ProposalError::Busy)
        } else {
            None
        };
        if let Some(error) = refused {
            commands.push(Command::ProposalFailed { token, error });
            return;
        }
        let index = self.raw.raft.raft_log.last_index();
        let term = self.raw.raft.term;
        let previous = self.pending.insert(index, PendingProposal { term, token });
        assert!(previous.is_none(), "two proposals at index {index}");
    }

    fn persisted(&mut self, number: u64, commands: &mut Vec<Command>) {
        let mut matched = false;
        for wait in self.persisting.iter_mut() {
            if wait.number > number {
                break;
            }
            matched |= wait.durable_pending;
            wait.durable_pending = false;
        }
        if !matched {
            // A report for a Persist from before a restart, or a repeat.
            tracing::debug!(machine = %self.machine, number, "persist report matches nothing");
        }
        self.release(commands);
    }

    /// Handles Readies until raft-rs has nothing more to say.
    fn drain(&mut self, commands: &mut Vec<Command>) {
        self.redraw_election_timeout();
        while self.raw.has_ready() {
            // First: a leader that stepped down fails its proposals before
            // the Ready can bring a snapshot or another leader's entries.
            self.report_leader(commands);
            let mut ready = self.raw.ready();
            let mut snapshots_sent = Vec::new();
            // A leader's appends may leave before its own write (Raft thesis
            // 10.2.1); it counts itself in the quorum only once durable.
            for message in ready.take_messages() {
                send(message, commands, &mut snapshots_sent);
            }
            let snapshot = (!ready.snapshot().is_empty()).then(|| ready.snapshot().clone());
            if let Some(snapshot) = &snapshot {
                self.raw.mut_store().install_snapshot(snapshot.clone());
            }
            let entries = ready.take_entries();
            self.raw.mut_store().append(&entries);
            let hard_state = ready.hs().cloned();
            if let Some(hard_state) = &hard_state {
                self.raw.mut_store().set_hard_state(hard_state.clone());
            }
            let committed = ready.take_committed_entries();
            let durable_pending = snapshot.is_some() || !entries.is_empty() || hard_state.is_some();
            self.persisting.push_back(PersistWait {
                number: ready.number(),
                durable_pending,
                messages: ready.take_persisted_messages(),
                snapshot_index: snapshot.as_ref().map_or(0, |snapshot| index_term(snapshot).0),
            });
            if durable_pending {
                commands.push(Command::Persist(Persist {
                    number: ready.number(),
                    snapshot: snapshot.clone(),
                    entries,
                    hard_state,
                    must_sync: ready.must_sync(),
                }));
            }
            self.raw.advance_append_async(ready);
            if let Some(snapshot) = snapshot {
                self.apply_snapshot(snapshot, commands);
            }
            self.apply_entries(committed, commands);
            for to in snapshots_sent {
                // Handed to the transport counts as sent: if it is lost, the
                // follower rejects the next append and gets it again.
                self.raw.report_snapshot(to, SnapshotStatus::Finish);
            }
            self.release(commands);
        }
        self.report_leader(commands);
    }

    /// raft-rs draws a new election timeout (with `thread_rng`) only in
    /// `Raft::reset`, which runs only when role or term changes; on every such
    /// change (a superset) this replaces the draw with one of ours, in the
    /// same `[election_ticks, 2 * election_ticks)`, through raft-rs's
    /// doc-hidden `set_randomized_election_timeout` (raft is pinned to 0.7).
    fn redraw_election_timeout(&mut self) {
        let now = (self.raw.raft.state, self.raw.raft.term);
        if now == self.timeout_drawn_at {
            return;
        }
        self.timeout_drawn_at = now;
        let base = u64::from(self.config.election_ticks);
        let ticks = base + self.jitter.next() % base;
        tracing::debug!(machine = %self.machine, ?now, ticks, "election timeout drawn");
        self.raw.raft.set_randomized_election_timeout(ticks as usize);
    }

    /// Sends the held-back messages of every Ready that is durable, and tells
    /// raft-rs how far the log is durable.
    fn release(&mut self, commands: &mut Vec<Command>) {
        let mut released = None;
        let mut snapshot_index = 0;
        while self.persisting.front().is_some_and(|wait| !wait.durable_pending) {
            let wait = self.persisting.pop_front().expect("front exists");
            snapshot_index = snapshot_index.max(wait.snapshot_index);
            let mut snapshots_sent = Vec::new();
            for message in wait.messages {
                send(message, commands, &mut snapshots_sent);
            }
            assert!(snapshots_sent.is_empty(), "only a leader sends snapshots, never held back");
            released = Some(wait.number);
        }
        if let Some(number) = released {
            self.raw.on_persist_ready(number);
        }
        if snapshot_index > self.raw.raft.raft_log.applied {
            // Only now, durable, may raft-rs count the snapshot applied. It
            // must: with the log below it gone, an election reads the entries
            // after raft-rs's applied index.
            self.raw.advance_apply_to(snapshot_index);
        }
    }

    fn apply_snapshot(&mut self, snapshot: Snapshot, commands: &mut Vec<Command>) {
        let (index, term) = index_term(&snapshot);
        assert!(index > self.applied_index, "snapshot {index} behind applied {}", self.applied_index);
        assert!(self.pending.is_empty(), "a leader never installs a snapshot");
        self.applied_index = index;
        commands.push(Command::Apply(Applied::Snapshot { index, term, data: snapshot.data }));
    }

    fn apply_entries(&mut self, committed: Vec<Entry>, commands: &mut Vec<Command>) {
        let Some(last) = committed.last().map(|entry| entry.index) else {
            return;
        };
        for entry in committed {
            assert_eq!(entry.index, self.applied_index + 1, "committed entries skip an index");
            self.applied_index = entry.index;
            let (index, term) = (entry.index, entry.term);
            let data = if entry.get_entry_type() == EntryType::EntryNormal {
                entry.data
            } else {
                // Nothing proposes membership changes; keep indexes contiguous.
                tracing::warn!(machine = %self.machine, index, "skipping a configuration change entry");
                Vec::new()
            };
            commands.push(Command::Apply(Applied::Entry { index, term, data }));
            if let Some(pending) = self.pending.remove(&index) {
                assert_eq!(pending.term, term, "the leader's entry {index} was replaced while it led");
                commands.push(Command::ProposalCommitted { token: pending.token, index });
            }
        }
        self.raw.advance_apply_to(last);
    }

    /// Reports a new term or leader; a leader that stepped down fails what it
    /// had not committed.
    fn report_leader(&mut self, commands: &mut Vec<Command>) {
        let leading = self.is_leader();
        if self.was_leader && !leading {
            let leader = self.leader();
            for (_, pending) in std::mem::take(&mut self.pending) {
                commands.push(Command::ProposalFailed {
                    token: pending.token,
                    error: ProposalError::LeaderLost { leader },
                });
            }
        }
        self.was_leader = leading;
        let now = (self.term(), self.leader());
        if now != self.reported {
            self.reported = now;
            commands.push(Command::LeaderChanged { term: now.0, leader: now.1 });
        }
    }
}

fn send(message: Message, commands: &mut Vec<Command>, snapshots_sent: &mut Vec<u64>) {
    if message.get_msg_type() == MessageType::MsgSnapshot {
        snapshots_sent.push(message.to);
    }
    let to = MachineId::new(message.to).expect("raft-rs never addresses machine 0");
    commands.push(Command::Send { to, message });
}

fn ids(machines: &[MachineId]) -> Vec<u64> {
    machines.iter().map(|machine| machine.get()).collect()
}

/// Checks the configuration and builds raft-rs's from it.
fn validate(config: &QuorumConfig) -> Result<raft::Config, QuorumError> {
    if config.voters.is_empty() {
        return Err(QuorumError::NoVoters);
    }
    let mut members: Vec<MachineId> = config.voters.iter().chain(&config.learners).copied().collect();
    members.sort();
    if let Some(pair) = members.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(QuorumError::ListedTwice { machine: pair[0] });
    }
    if !members.contains(&config.machine) {
        return Err(QuorumError::NotAMember { machine: config.machine });
    }
    if config.heartbeat_ticks == 0 || config.election_ticks <= config.heartbeat_ticks {
        return Err(QuorumError::Ticks {
            election_ticks: config.election_ticks,
            heartbeat_ticks: config.heartbeat_ticks,
        });
    }
    let raft_config = raft::Config {
        id: config.machine.get(),
        election_tick: config.election_ticks as usize,
        heartbeat_tick: config.heartbeat_ticks as usize,
        max_size_per_msg: config.append_bytes_max,
        max_inflight_msgs: config.appends_inflight_max,
        max_uncommitted_size: config.uncommitted_bytes_max,
        check_quorum: true,
        pre_vote: true,
        ..raft::Config::default()
    };
    raft_config.validate().map_err(QuorumError::Limits)?;
    Ok(raft_config)
}

fn check_membership(snapshot: &Snapshot, configured: &ConfState) -> Result<(), QuorumError> {
    let stored = snapshot.metadata.as_ref().and_then(|metadata| metadata.conf_state.clone()).unwrap_or_default();
    let sorted = |ids: &[u64]| {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids
    };
    if sorted(&stored.voters) == sorted(&configured.voters) && sorted(&stored.learners) == sorted(&configured.learners)
    {
        return Ok(());
    }
    Err(QuorumError::MembershipChanged {
        stored_voters: stored.voters,
        stored_learners: stored.learners,
        voters: configured.voters.clone(),
        learners: configured.learners.clone(),
    })
}

/// Sebastiano Vigna's splitmix64: small, seedable, good enough for jitter.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
