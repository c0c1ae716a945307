//! Identities shared by the cluster modules. A leaf: imports nothing from
//! the rest of the crate, so gossip, the quorum and the image can all use it.

use std::fmt;
use std::num::NonZeroU64;

/// A machine's id: persisted in its data directory, unique in the cluster,
/// never reused. Zero is not an id (raft-rs reserves 0 for "nobody"), so the
/// type cannot hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MachineId(NonZeroU64);

impl MachineId {
    /// `None` for 0, which names no machine.
    pub const fn new(id: u64) -> Option<Self> {
        match NonZeroU64::new(id) {
            Some(id) => Some(Self(id)),
            None => None,
        }
    }

    pub const fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for MachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
