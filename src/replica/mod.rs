//! One partition's replica (issue 30): Kafka's replication, on the core
//! that owns the partition.
//!
//! - `leader`: the leader side as a state machine (ISR, high watermark,
//!   when to ask the controller for an ISR change).
//! - `epochs`: the leader-epoch cache and where a returning follower cuts
//!   its log (KIP-101, KIP-279).
//! - `follower`: the fetcher each core runs per leader node it follows:
//!   Fetch with its `replica_id`, batches appended byte for byte,
//!   OffsetForLeaderEpoch and truncation after a leader change.
//!
//! The controller decides who leads and what the ISR is (`cluster::control`);
//! a replica learns it from the metadata image its core applies
//! (`shard::apply_image`), and the partition's state here follows: a
//! `Leader` counts its followers' fetches, a `Follower` copies. A
//! partition with one replica is `Sole`: no high watermark limit, no
//! bookkeeping on the produce path.

pub mod epochs;
pub mod follower;
pub mod leader;

use std::cell::RefCell;

use event_listener::Event;

use epochs::LeaderEpochCache;
use leader::LeaderState;

/// What this replica is now.
#[derive(Debug, Clone)]
pub enum Role {
    /// The only replica, and the leader.
    Sole {
        leader_epoch: i32,
    },
    Leader(Box<LeaderState>),
    /// Copies from `leader` (-1: no leader now) in `leader_epoch`.
    Follower {
        leader: i32,
        leader_epoch: i32,
    },
}

impl Role {
    pub fn leader_epoch(&self) -> i32 {
        match self {
            Role::Sole { leader_epoch } | Role::Follower { leader_epoch, .. } => *leader_epoch,
            Role::Leader(state) => state.leader_epoch(),
        }
    }

    pub fn leads(&self) -> bool {
        !matches!(self, Role::Follower { .. })
    }
}

/// A partition's replication state (inside `shard::partition::Partition`).
pub struct Replica {
    pub role: RefCell<Role>,
    pub epochs: RefCell<LeaderEpochCache>,
    /// Notified when the high watermark, the ISR or the role changes:
    /// acks=all produces wait on it.
    pub changed: Event,
}

impl Replica {
    pub fn new(epochs: LeaderEpochCache) -> Self {
        Self { role: RefCell::new(Role::Sole { leader_epoch: 0 }), epochs: RefCell::new(epochs), changed: Event::new() }
    }

    pub fn leader_epoch(&self) -> i32 {
        self.role.borrow().leader_epoch()
    }

    pub fn leads(&self) -> bool {
        self.role.borrow().leads()
    }

    /// Whether an acks=all produce may be taken: the ISR has at least
    /// `min_insync` members (a sole replica is its own ISR).
    pub fn enough_in_sync(&self, min_insync: usize) -> bool {
        match &*self.role.borrow() {
            Role::Sole { .. } => min_insync <= 1,
            Role::Leader(state) => state.enough_in_sync(),
            Role::Follower { .. } => false,
        }
    }
}
