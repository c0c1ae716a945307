//! The controller quorum's Raft engine: a sans-IO state machine around
//! raft-rs's `RawNode`. The shell (`service`: a thread on each voter and
//! learner machine, issue 29) feeds it [`Event`]s and carries out the [`Command`]s it
//! returns: sending messages, persisting the log, applying committed metadata
//! records. No sockets, files, clocks or threads in here, so tests and the
//! simulation (`tests/raft_sim.rs`) drive it deterministically.
//!
//! # Membership and timing
//!
//! The voters are a static list, like KRaft's `controller.quorum.voters`
//! (1, 3 or 5 machines); learners follow the log without voting. Both come
//! from [`QuorumConfig`] and must be the same on every machine; there are no
//! membership changes yet. Pre-vote and check-quorum are always on: a leader
//! cut off from a majority steps down after an election timeout, and a machine
//! that rejoins after a partition cannot force an election with its inflated
//! term. The shell ticks every [`TICK_MS`]; followers campaign after
//! `[election_ticks, 2 * election_ticks)` ticks without hearing a leader. The
//! defaults (heartbeat every 2 ticks, election after 12..24 ticks: 0.6–1.2 s) aim
//! at a controller failover p99 under 2 s, leaving room for one split vote.
//! `tests/raft_sim.rs` measures it: from a leader's crash to a new leader's
//! first commit, p50 0.72 s, p99 1.13 s, max 1.91 s over 3,000 simulated
//! crashes (virtual time; 3 and 5 voters, LAN delays and fsyncs under 5 ms).
//!
//! # Durability: what the shell must fsync
//!
//! Each [`Persist`] names a Ready of raft-rs. The shell carries them out in
//! order and reports [`Event::PersistDone`] once every Persist up to that
//! number is durable:
//! 1. `snapshot`: store it (index, term, voters, data) and discard the whole
//!    stored log, then
//! 2. `entries`: drop stored entries at and after the first one's index
//!    (a new leader overwrote them), append these, then
//! 3. `hard_state`: store term, vote and commit index.
//!
//! `must_sync` is false when only the commit index moved: such a Persist may
//! be left unsynced (a lost commit index is learned again from the leader).
//! The engine holds back every message that depends on a Persist (votes,
//! append acknowledgements) until it is reported done, so the shell may send
//! every `Send` as soon as it sees it. After a crash the shell reads back what
//! it stored as [`Durable`] and calls [`QuorumEngine::open`]: Raft is safe
//! only if nothing acknowledged is lost. [`QuorumEngine::compact`] returns a
//! snapshot the shell stores the same way, except that it keeps the entries
//! after the snapshot's index.
//!
//! # Dependency: raft-rs 0.7 with `prost-codec`
//!
//! raft-rs's default `protobuf-codec` parses peer messages with rust-protobuf
//! 2.28, whose parser recurses without a bound on nested unknown groups
//! (RUSTSEC-2024-0437): one crafted frame to the controller port overflows
//! the stack of the core that runs the quorum. With `prost-codec` the message
//! types are prost types and [`decode_message`] parses with prost, which caps
//! nesting at 100. rust-protobuf 2.28 is still compiled in (raft-rs and
//! raft-proto depend on it unconditionally for trait glue), so `cargo audit`
//! still lists the advisory, but its parser is never reached: in prost mode
//! raft-proto's `merge_from(CodedInputStream)` is `unimplemented!()` (in
//! raft-proto, not here). The cost is `protoc` at build time: a protoc on
//! PATH, or the one the `protoc-bin-vendored-linux-*` crate ships
//! (`.cargo/protoc`, named by `.cargo/config.toml`). raft-rs's default slog logger is off too: its records
//! are forwarded to `tracing` (`log.rs`).
//!
//! Lives on the controller service's loop thread of its machine (`service`);
//! only that thread calls it.

mod codec;
mod engine;
mod log;
mod storage;
#[cfg(test)]
mod tests;

pub use codec::{decode_message, encode_message};
pub use engine::QuorumEngine;
pub use raft::eraftpb::{Entry, HardState, Message, Snapshot};

pub use super::ids::MachineId;

/// How often the shell sends [`Event::Tick`]. 50 ms rather than 100: the
/// election timeout is drawn in whole ticks, and with 6 possible values two
/// survivors of a 3-voter quorum drew the same one often enough to split
/// votes past 2 s (tests/controller_quorum.rs: 2.6 s in 40 failovers).
pub const TICK_MS: u64 = 50;

/// Followers campaign after this many to twice this many ticks without a
/// leader: 0.6–1.2 s at [`TICK_MS`].
pub const ELECTION_TICKS_DEFAULT: u32 = 12;

/// A leader sends heartbeats this often (ticks): every 100 ms. check-quorum
/// needs several per election timeout to tell a slow follower from a lost
/// one.
pub const HEARTBEAT_TICKS_DEFAULT: u32 = 2;

/// Proposals awaiting commit on the leader; more are refused as `Busy`.
pub const PROPOSALS_PENDING_MAX_DEFAULT: usize = 4096;

/// One metadata record batch (a Raft entry's data).
pub const ENTRY_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

/// Entries per append message are cut at this many bytes.
pub const APPEND_BYTES_MAX_DEFAULT: u64 = 1024 * 1024;

/// Append messages in flight to one follower.
pub const APPENDS_INFLIGHT_MAX_DEFAULT: usize = 256;

/// Bytes of proposed but uncommitted entries; past it raft-rs drops proposals.
pub const UNCOMMITTED_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

const _: () = assert!(HEARTBEAT_TICKS_DEFAULT < ELECTION_TICKS_DEFAULT);
const _: () = assert!(ENTRY_BYTES_MAX_DEFAULT as u64 <= UNCOMMITTED_BYTES_MAX_DEFAULT);
const _: () = assert!(APPEND_BYTES_MAX_DEFAULT <= UNCOMMITTED_BYTES_MAX_DEFAULT);

/// The quorum as this machine sees it, the same lists on every machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumConfig {
    /// This machine: one of `voters` or `learners`.
    pub machine: MachineId,
    pub voters: Vec<MachineId>,
    pub learners: Vec<MachineId>,
    pub election_ticks: u32,
    pub heartbeat_ticks: u32,
    pub proposals_pending_max: usize,
    pub entry_bytes_max: usize,
    pub append_bytes_max: u64,
    pub appends_inflight_max: usize,
    pub uncommitted_bytes_max: u64,
    /// Seeds the election timeouts' jitter. raft-rs draws them from
    /// `thread_rng`, which would make a simulation unrepeatable; the engine
    /// draws them itself. The shell passes something that differs between
    /// machines and starts (the clock), the simulation its seed.
    pub election_seed: u64,
}

impl QuorumConfig {
    /// The defaults above for `machine` in a quorum of `voters` and `learners`.
    pub fn new(machine: MachineId, voters: Vec<MachineId>, learners: Vec<MachineId>) -> Self {
        Self {
            machine,
            voters,
            learners,
            election_ticks: ELECTION_TICKS_DEFAULT,
            heartbeat_ticks: HEARTBEAT_TICKS_DEFAULT,
            proposals_pending_max: PROPOSALS_PENDING_MAX_DEFAULT,
            entry_bytes_max: ENTRY_BYTES_MAX_DEFAULT,
            append_bytes_max: APPEND_BYTES_MAX_DEFAULT,
            appends_inflight_max: APPENDS_INFLIGHT_MAX_DEFAULT,
            uncommitted_bytes_max: UNCOMMITTED_BYTES_MAX_DEFAULT,
            election_seed: machine.get(),
        }
    }
}

/// What the shell stored and read back at start: empty on first start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Durable {
    pub hard_state: HardState,
    pub snapshot: Option<Snapshot>,
    /// The entries after the snapshot's index, in order.
    pub entries: Vec<Entry>,
}

/// The shell's name for a proposal, echoed in its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProposalToken(pub u64);

/// What happened to the shell, in the order it happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// One tick of the shell's clock, every [`TICK_MS`].
    Tick,
    /// A Raft message from a peer, as [`decode_message`] read it off the
    /// connection from `from` (boxed: it is ten times any other event).
    Message { from: MachineId, message: Box<Message> },
    /// Append `data` (a batch of metadata records) to the log. Answered by
    /// [`Command::ProposalCommitted`] or [`Command::ProposalFailed`].
    Propose { token: ProposalToken, data: Vec<u8> },
    /// Every [`Persist`] numbered up to `number` is durable.
    PersistDone { number: u64 },
    /// The transport lost its connection to `to`: the leader stops streaming
    /// appends to it and probes instead.
    Unreachable { to: MachineId },
}

/// What the shell must do, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Send to a peer ([`encode_message`]); may be dropped, the engine retries.
    Send {
        to: MachineId,
        message: Message,
    },
    /// Make this durable, then report [`Event::PersistDone`].
    Persist(Persist),
    /// A committed record batch or a snapshot for the state machine (the
    /// metadata image), in log order.
    Apply(Applied),
    /// The proposal committed at `index` and was applied just before this.
    ProposalCommitted {
        token: ProposalToken,
        index: u64,
    },
    ProposalFailed {
        token: ProposalToken,
        error: ProposalError,
    },
    /// The term moved or the leader changed; `None` while an election runs.
    /// The leader is the controller.
    LeaderChanged {
        term: u64,
        leader: Option<MachineId>,
    },
}

/// One Ready's worth of state to make durable; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Persist {
    pub number: u64,
    pub snapshot: Option<Snapshot>,
    pub entries: Vec<Entry>,
    pub hard_state: Option<HardState>,
    pub must_sync: bool,
}

/// What the state machine applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The committed entry at `index`. Empty `data` is a new leader's
    /// marker entry; the shell skips it (but may record the index).
    Entry { index: u64, term: u64, data: Vec<u8> },
    /// Replace the state machine with this image, taken at `index`: the next
    /// entry applied is `index + 1`.
    Snapshot { index: u64, term: u64, data: Vec<u8> },
}

/// Why a proposal will not commit through this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProposalError {
    /// This machine is not the controller; `leader` is, if known. Nothing was
    /// appended: retrying there is safe.
    #[error("not the controller (leader: {leader:?})")]
    NotController { leader: Option<MachineId> },
    /// This machine stopped leading before the proposal committed. The entry
    /// may still commit under the next leader, or may be dropped: the outcome
    /// is unknown, as with KRaft's NotControllerException after resignation.
    #[error("leadership lost before commit (new leader: {leader:?})")]
    LeaderLost { leader: Option<MachineId> },
    /// Too many proposals or bytes waiting for commit.
    #[error("too many uncommitted proposals")]
    Busy,
    #[error("proposal of {bytes} bytes exceeds {bytes_max}")]
    TooLarge { bytes: usize, bytes_max: usize },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuorumError {
    #[error("machine {machine} is neither a voter nor a learner of the quorum")]
    NotAMember { machine: MachineId },
    #[error("the quorum has no voters")]
    NoVoters,
    #[error("machine {machine} is listed twice among voters and learners")]
    ListedTwice { machine: MachineId },
    #[error("election ticks ({election_ticks}) must exceed heartbeat ticks ({heartbeat_ticks}, > 0)")]
    Ticks { election_ticks: u32, heartbeat_ticks: u32 },
    #[error("a limit in the quorum configuration is zero or inconsistent: {0}")]
    Limits(raft::Error),
    #[error(
        "the stored snapshot names voters {stored_voters:?} and learners {stored_learners:?}, \
         the configuration {voters:?} and {learners:?}: membership changes are not supported"
    )]
    MembershipChanged { stored_voters: Vec<u64>, stored_learners: Vec<u64>, voters: Vec<u64>, learners: Vec<u64> },
    #[error("stored log entry {index} where {expected_index} was expected")]
    DurableLogBroken { index: u64, expected_index: u64 },
    #[error("stored commit index {commit} is past the stored log's end {last_index}")]
    DurableCommitBeyondLog { commit: u64, last_index: u64 },
    #[error("compaction to {index} is not past the snapshot at {snapshot_index}")]
    CompactionStale { index: u64, snapshot_index: u64 },
    #[error("compaction to {index} is past the applied index {applied_index}")]
    CompactionNotApplied { index: u64, applied_index: u64 },
    #[error("undecodable raft message: {0}")]
    Decode(#[from] prost::DecodeError),
}
