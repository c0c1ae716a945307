//! Consumer-group coordination (Kafka's classic protocol) and committed
//! offsets, as a pure state machine: no I/O, no clock, no async.
//!
//! Ownership: every core runs one [`GroupCoordinator`], which owns the groups
//! whose ids hash to that core (FindCoordinator points clients at that core's
//! node). Nothing here is shared between cores and only the owning core's
//! broker task calls it. The broker drives it:
//!
//! ```text
//!   request (decoded) ──► GroupEvent ──► step(now_ms, event) ──► Vec<GroupCommand>
//!                                                                 │
//!        Reply { to, response } ◄─────────────────────────────────┤  encode + send on the
//!                                                                 │  connection `to` names
//!        PersistOffsets { persist_id, records } ◄─────────────────┘  append to the internal
//!                                                                    offsets log, then feed
//!                      GroupEvent::OffsetsPersisted { persist_id, result } back in
//! ```
//!
//! Time only moves through `now_ms`: the broker passes its clock with every
//! event and sends [`GroupEvent::Tick`] periodically (or at
//! [`GroupCoordinator::next_deadline_ms`]) so that session, rebalance and
//! sync timeouts fire. Held requests (a JoinGroup long poll, a follower's
//! SyncGroup waiting for the leader, an OffsetCommit waiting for its write)
//! are answered by a later step; every [`ReplyTo`] is answered exactly once.
//!
//! Read-only requests (OffsetFetch, DescribeGroups, ListGroups) are answered
//! directly by accessors; they change nothing.
//!
//! On start the broker reads the offsets log and calls
//! [`GroupCoordinator::replay`] for each record before serving requests.
//! Group membership is not persisted: after a restart members rejoin.

mod config;
mod coordinator;
mod offsets;
mod state;

#[cfg(test)]
mod tests;

pub use config::{GroupConfig, GroupConfigError};
pub use coordinator::GroupCoordinator;
pub use offsets::{CommittedOffset, EncodedOffsetRecord, OffsetKey, OffsetRecord, OffsetRecordError};
pub use state::GroupState;

use crate::protocol::delete_groups::{DeleteGroupsRequest, DeleteGroupsResponse};
use crate::protocol::heartbeat::{HeartbeatRequest, HeartbeatResponse};
use crate::protocol::join_group::{JoinGroupRequest, JoinGroupResponse};
use crate::protocol::leave_group::{LeaveGroupRequest, LeaveGroupResponse};
use crate::protocol::offset_commit::{OffsetCommitRequest, OffsetCommitResponse};
use crate::protocol::sync_group::{SyncGroupRequest, SyncGroupResponse};
use crate::protocol::ErrorCode;

/// Names the held request a reply belongs to. Opaque to the coordinator: the
/// broker picks it (say, connection id and correlation id packed together)
/// and gets it back in [`GroupCommand::Reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplyTo(pub u64);

/// Names one [`GroupCommand::PersistOffsets`] write, so that its outcome can
/// be reported back with [`GroupEvent::OffsetsPersisted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PersistId(pub u64);

/// Who sent a JoinGroup: kept for DescribeGroups and used as the prefix of
/// generated member ids, as Kafka does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientInfo {
    /// The request header's client id ("" when null).
    pub client_id: String,
    /// The peer address as Kafka shows it, e.g. "/10.0.0.7".
    pub client_host: String,
}

/// Something that happened: a request arrived, a write finished, or time
/// passed.
#[derive(Debug, Clone)]
pub enum GroupEvent {
    Join {
        reply_to: ReplyTo,
        /// The request's version: v4+ makes a new dynamic member fetch its
        /// id first (MEMBER_ID_REQUIRED).
        api_version: i16,
        client: ClientInfo,
        request: JoinGroupRequest,
    },
    Sync {
        reply_to: ReplyTo,
        request: SyncGroupRequest,
    },
    Heartbeat {
        reply_to: ReplyTo,
        request: HeartbeatRequest,
    },
    Leave {
        reply_to: ReplyTo,
        /// The request's version: v0–2 name one member and answer with a
        /// single error, v3 names a batch.
        api_version: i16,
        request: LeaveGroupRequest,
    },
    /// The broker has already dropped partitions of topics it does not host
    /// (answering UNKNOWN_TOPIC_OR_PARTITION itself), as Kafka does.
    OffsetCommit {
        reply_to: ReplyTo,
        request: OffsetCommitRequest,
    },
    DeleteGroups {
        reply_to: ReplyTo,
        request: DeleteGroupsRequest,
    },
    /// The outcome of a [`GroupCommand::PersistOffsets`]: `Ok` once the
    /// records are durable, or the error code to answer the waiting
    /// requests with (e.g. KAFKA_STORAGE_ERROR).
    OffsetsPersisted {
        persist_id: PersistId,
        result: Result<(), ErrorCode>,
    },
    /// Time passed: expire sessions, finish delayed rebalances.
    Tick,
}

/// Something the broker must do.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupCommand {
    /// Send `response` as the answer to the request `to` names.
    Reply { to: ReplyTo, response: GroupResponse },
    /// Append `records` to the internal offsets log in this order, after
    /// every earlier `PersistOffsets` (their order is what replay relies
    /// on), then report with [`GroupEvent::OffsetsPersisted`].
    PersistOffsets { persist_id: PersistId, records: Vec<OffsetRecord> },
}

/// The answer to one held or immediate request.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupResponse {
    Join(JoinGroupResponse),
    Sync(SyncGroupResponse),
    Heartbeat(HeartbeatResponse),
    Leave(LeaveGroupResponse),
    OffsetCommit(OffsetCommitResponse),
    DeleteGroups(DeleteGroupsResponse),
}
